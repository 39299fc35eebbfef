//! Traffic policy rules: load balancing, connection pools, outlier detection, client TLS and tunnels.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::config::api::destination_rule::{
    ClientTlsMode, ClientTlsSettings, ConnectionPoolSettings, ConsistentHashLb, HttpSettings, LoadBalancerSettings,
    LocalityDistribute, LocalityFailover, LocalityLbSetting, OutlierDetection, PortTrafficPolicy, TcpSettings,
    TrafficPolicy, WarmupConfiguration,
};

use super::addresses::is_ip;
use super::durations::{check_duration, check_duration_value, check_optional};
use super::field_errors::{
    check_non_negative, check_percent_range, duplicate, forbidden, invalid, required, unsupported, Errors,
};
use super::hosts::check_fqdn;
use super::ports::check_port;

/// Largest ring Envoy builds for ring hash load balancing.
const MAX_RING_SIZE: u64 = 8_388_608;

/// Maglev table sizes must be primes below this.
const MAX_MAGLEV_TABLE_SIZE: u64 = 5_000_011;

/// Values of `h2UpgradePolicy`.
const H2_UPGRADE_POLICIES: [&str; 3] = ["DEFAULT", "DO_NOT_UPGRADE", "UPGRADE"];

/// Checks a traffic policy at `path` (`spec.trafficPolicy`, `spec.subsets[i].trafficPolicy`).
pub(super) fn check_traffic_policy(errors: &mut Errors, path: &str, policy: &TrafficPolicy) {
    let empty = policy.load_balancer.is_none()
        && policy.connection_pool.is_none()
        && policy.outlier_detection.is_none()
        && policy.tls.is_none()
        && policy.port_level_settings.is_empty()
        && policy.tunnel.is_none()
        && policy.proxy_protocol.is_none()
        && policy.retry_budget.is_none();
    if empty {
        errors.add(path, required("traffic policy must have at least one field"));
        return;
    }
    if policy.tunnel.is_some() && policy.proxy_protocol.is_some() {
        errors.add(path, forbidden("tunnel and proxyProtocol must not be set together"));
    }
    check_policy_parts(errors, path, policy.into());
    check_port_level_settings(errors, &format!("{path}.portLevelSettings"), &policy.port_level_settings);
    if let Some(tunnel) = &policy.tunnel {
        check_tunnel(errors, &format!("{path}.tunnel"), tunnel);
    }
    if let Some(proxy_protocol) = &policy.proxy_protocol {
        check_proxy_protocol(errors, &format!("{path}.proxyProtocol"), proxy_protocol);
    }
    if let Some(budget) = &policy.retry_budget {
        check_retry_budget(errors, &format!("{path}.retryBudget"), budget);
    }
}

/// The parts a traffic policy shares with its per-port overrides.
struct PolicyParts<'a> {
    load_balancer: Option<&'a LoadBalancerSettings>,
    connection_pool: Option<&'a ConnectionPoolSettings>,
    outlier_detection: Option<&'a OutlierDetection>,
    tls: Option<&'a ClientTlsSettings>,
}

impl<'a> From<&'a TrafficPolicy> for PolicyParts<'a> {
    fn from(p: &'a TrafficPolicy) -> Self {
        PolicyParts {
            load_balancer: p.load_balancer.as_ref(),
            connection_pool: p.connection_pool.as_ref(),
            outlier_detection: p.outlier_detection.as_ref(),
            tls: p.tls.as_ref(),
        }
    }
}

impl<'a> From<&'a PortTrafficPolicy> for PolicyParts<'a> {
    fn from(p: &'a PortTrafficPolicy) -> Self {
        PolicyParts {
            load_balancer: p.load_balancer.as_ref(),
            connection_pool: p.connection_pool.as_ref(),
            outlier_detection: p.outlier_detection.as_ref(),
            tls: p.tls.as_ref(),
        }
    }
}

fn check_policy_parts(errors: &mut Errors, path: &str, parts: PolicyParts) {
    if let Some(lb) = parts.load_balancer {
        check_load_balancer(errors, &format!("{path}.loadBalancer"), lb);
    }
    if let Some(pool) = parts.connection_pool {
        check_connection_pool(errors, &format!("{path}.connectionPool"), pool);
    }
    if let Some(outlier) = parts.outlier_detection {
        check_outlier_detection(errors, &format!("{path}.outlierDetection"), outlier);
    }
    if let Some(tls) = parts.tls {
        check_client_tls(errors, &format!("{path}.tls"), tls);
    }
}

/// Checks per-port policies: each names a distinct port and sets something.
fn check_port_level_settings(errors: &mut Errors, path: &str, settings: &[PortTrafficPolicy]) {
    let mut ports = BTreeSet::new();
    for (i, setting) in settings.iter().enumerate() {
        let field = format!("{path}[{i}]");
        match setting.port {
            None => errors.add(format!("{field}.port"), required("portTrafficPolicy must have valid port")),
            Some(port) => {
                errors.check(format!("{field}.port.number"), check_port(port.number));
                if !ports.insert(port.number) {
                    let reason = duplicate(port.number, "port traffic policies must name distinct ports");
                    errors.add(format!("{field}.port.number"), reason);
                }
            }
        }
        let parts = PolicyParts::from(setting);
        let empty = parts.load_balancer.is_none()
            && parts.connection_pool.is_none()
            && parts.outlier_detection.is_none()
            && parts.tls.is_none();
        if empty {
            errors.add(field, required("port traffic policy must have at least one field"));
        } else {
            check_policy_parts(errors, &field, parts);
        }
    }
}

/// Checks load balancer settings at `path` (`...loadBalancer`).
fn check_load_balancer(errors: &mut Errors, path: &str, lb: &LoadBalancerSettings) {
    if lb.simple.is_some() && lb.consistent_hash.is_some() {
        errors.add(path, forbidden("only one of simple or consistentHash can be set"));
    }
    if let Some(hash) = &lb.consistent_hash {
        check_consistent_hash(errors, &format!("{path}.consistentHash"), hash);
    }
    if let Some(locality) = &lb.locality_lb_setting {
        check_locality_lb(errors, &format!("{path}.localityLbSetting"), locality);
    }
    if lb.warmup_duration_secs.is_some() && lb.warmup.is_some() {
        errors.add(path, forbidden("only one of warmupDurationSecs or warmup can be set"));
    }
    errors.check(format!("{path}.warmupDurationSecs"), check_optional(lb.warmup_duration_secs));
    if let Some(warmup) = &lb.warmup {
        check_warmup(errors, &format!("{path}.warmup"), warmup);
    }
}

/// Checks slow start settings at `path` (`...warmup`).
fn check_warmup(errors: &mut Errors, path: &str, warmup: &WarmupConfiguration) {
    match warmup.duration {
        None => errors.add(format!("{path}.duration"), required("warmup duration is required")),
        Some(d) => errors.check(format!("{path}.duration"), check_duration(d)),
    }
    check_percent_range(errors, format!("{path}.minimumPercent"), warmup.minimum_percent);
    if let Some(aggression) = warmup.aggression.filter(|a| *a < 0.0) {
        errors.add(format!("{path}.aggression"), invalid(aggression, "must be greater than or equal to 0"));
    }
}

/// Checks consistent hashing at `path` (`...consistentHash`).
fn check_consistent_hash(errors: &mut Errors, path: &str, hash: &ConsistentHashLb) {
    let keys = [
        hash.http_header_name.is_some(),
        hash.http_cookie.is_some(),
        hash.use_source_ip.is_some(),
        hash.http_query_parameter_name.is_some(),
    ];
    if keys.iter().filter(|set| **set).count() > 1 {
        let reason = "only one of httpHeaderName, httpCookie, useSourceIp or httpQueryParameterName can be set";
        errors.add(path, forbidden(reason));
    }
    if hash.http_header_name.as_deref() == Some("") {
        errors.add(format!("{path}.httpHeaderName"), invalid("", "header name cannot be empty"));
    }
    if hash.http_query_parameter_name.as_deref() == Some("") {
        errors.add(format!("{path}.httpQueryParameterName"), invalid("", "query parameter name cannot be empty"));
    }
    if hash.http_cookie.as_ref().is_some_and(|c| c.name.is_empty()) {
        errors.add(format!("{path}.httpCookie.name"), required("name required for HttpCookie"));
    }
    if hash.ring_hash.is_some() && hash.maglev.is_some() {
        errors.add(path, forbidden("only one of ringHash or maglev can be set"));
    }
    if hash.minimum_ring_size.is_some() && (hash.ring_hash.is_some() || hash.maglev.is_some()) {
        errors.add(path, forbidden("only one of MinimumRingSize or Maglev/Ringhash can be specified"));
    }
    let ring_sizes = [
        ("minimumRingSize", hash.minimum_ring_size),
        ("ringHash.minimumRingSize", hash.ring_hash.as_ref().and_then(|r| r.minimum_ring_size)),
    ];
    for (name, size) in ring_sizes {
        if let Some(size) = size.filter(|s| *s > MAX_RING_SIZE) {
            errors.add(format!("{path}.{name}"), invalid(size, format!("ring size must be at most {MAX_RING_SIZE}")));
        }
    }
    if let Some(maglev) = &hash.maglev {
        errors.check(format!("{path}.maglev.tableSize"), check_maglev_table_size(maglev.table_size.unwrap_or(0)));
    }
}

fn check_maglev_table_size(size: u64) -> Result<(), String> {
    if size == 0 {
        Err(required("tableSize must be set for maglev"))
    } else if size >= MAX_MAGLEV_TABLE_SIZE {
        Err(invalid(size, format!("tableSize must be less than {MAX_MAGLEV_TABLE_SIZE} for maglev")))
    } else if !is_prime(size) {
        Err(invalid(size, "tableSize must be a prime number for maglev"))
    } else {
        Ok(())
    }
}

fn is_prime(n: u64) -> bool {
    n >= 2 && (2..).take_while(|f| f * f <= n).all(|f| !n.is_multiple_of(f))
}

/// Checks locality load balancing at `path` (`...localityLbSetting`), as Istio does.
pub(super) fn check_locality_lb(errors: &mut Errors, path: &str, setting: &LocalityLbSetting) {
    if !setting.distribute.is_empty() && !setting.failover.is_empty() {
        errors.add(path, forbidden("can not simultaneously specify 'distribute' and 'failover'"));
        return;
    }
    if !setting.failover.is_empty() {
        let topology = ["topology.kubernetes.io/region", "topology.kubernetes.io/zone", "topology.istio.io/subzone"];
        for (i, label) in setting.failover_priority.iter().enumerate() {
            if topology.contains(&label.as_str()) {
                let reason = format!(
                    "can not simultaneously set 'failover' and topology label '{label}' in 'failover_priority'"
                );
                errors.add(format!("{path}.failoverPriority[{i}]"), forbidden(reason));
                return;
            }
        }
    }
    for (i, rule) in setting.distribute.iter().enumerate() {
        check_distribute(errors, &format!("{path}.distribute[{i}]"), rule);
    }
    for (i, LocalityFailover { from, to }) in setting.failover.iter().enumerate() {
        let field = format!("{path}.failover[{i}]");
        if from == to {
            errors.add(&field, invalid(from, "locality lb failover settings must specify different regions"));
        }
        if from.contains('/') || to.contains('/') {
            errors.add(&field, invalid(format!("{from} -> {to}"), "locality lb failover only specify region"));
        }
        if from.contains('*') || to.contains('*') {
            errors.add(
                &field,
                invalid(format!("{from} -> {to}"), "locality lb failover region should not contain '*' wildcard"),
            );
        }
    }
}

/// Checks one `distribute` rule: weights of 1–100 that add up to 100.
fn check_distribute(errors: &mut Errors, path: &str, rule: &LocalityDistribute) {
    let mut total = 0u64;
    for (locality, &weight) in &rule.to {
        if !(1..=100).contains(&weight) {
            errors.add(format!("{path}.to[{locality}]"), invalid(weight, "locality weight must be in range [1, 100]"));
            return;
        }
        total += u64::from(weight);
    }
    if total != 100 {
        errors.add(format!("{path}.to"), invalid(total, "total locality weight != 100"));
    }
}

/// Checks connection pool settings at `path` (`...connectionPool`, or a Sidecar's `inboundConnectionPool`).
pub(super) fn check_connection_pool(errors: &mut Errors, path: &str, pool: &ConnectionPoolSettings) {
    if pool.http.is_none() && pool.tcp.is_none() {
        errors.add(path, required("connection pool must have at least one field"));
        return;
    }
    if let Some(http) = &pool.http {
        check_http_pool(errors, &format!("{path}.http"), http);
    }
    if let Some(tcp) = &pool.tcp {
        check_tcp_pool(errors, &format!("{path}.tcp"), tcp);
    }
}

fn check_http_pool(errors: &mut Errors, path: &str, http: &HttpSettings) {
    let counts = [
        ("http1MaxPendingRequests", http.http1_max_pending_requests),
        ("http2MaxRequests", http.http2_max_requests),
        ("maxRequestsPerConnection", http.max_requests_per_connection),
        ("maxRetries", http.max_retries),
        ("maxConcurrentStreams", http.max_concurrent_streams),
    ];
    for (name, value) in counts {
        check_non_negative(errors, format!("{path}.{name}"), value);
    }
    errors.check(format!("{path}.idleTimeout"), check_optional(http.idle_timeout));
    if let Some(policy) = http.h2_upgrade_policy.as_deref() {
        if !H2_UPGRADE_POLICIES.contains(&policy) {
            errors.add(format!("{path}.h2UpgradePolicy"), unsupported(policy, &H2_UPGRADE_POLICIES));
        } else if policy == "UPGRADE" && http.use_client_protocol == Some(true) {
            let reason = forbidden("use client protocol must not be true when H2UpgradePolicy is UPGRADE");
            errors.add(format!("{path}.useClientProtocol"), reason);
        }
    }
    if let Some(keepalive) = &http.http2_keep_alive {
        for name in ["interval", "timeout"] {
            errors.check(format!("{path}.http2KeepAlive.{name}"), check_duration_value(keepalive.get(name)));
        }
    }
}

fn check_tcp_pool(errors: &mut Errors, path: &str, tcp: &TcpSettings) {
    check_non_negative(errors, format!("{path}.maxConnections"), tcp.max_connections);
    let durations = [
        ("connectTimeout", tcp.connect_timeout),
        ("maxConnectionDuration", tcp.max_connection_duration),
        ("idleTimeout", tcp.idle_timeout),
    ];
    for (name, duration) in durations {
        errors.check(format!("{path}.{name}"), check_optional(duration));
    }
    if let Some(keepalive) = &tcp.tcp_keepalive {
        for name in ["time", "interval"] {
            errors.check(format!("{path}.tcpKeepalive.{name}"), check_duration_value(keepalive.get(name)));
        }
        if let Some(probes) = keepalive.get("probes").filter(|p| p.as_u64().is_none()) {
            errors.add(format!("{path}.tcpKeepalive.probes"), invalid(probes, "must be a non-negative integer"));
        }
    }
}

/// Checks outlier detection at `path` (`...outlierDetection`).
fn check_outlier_detection(errors: &mut Errors, path: &str, outlier: &OutlierDetection) {
    errors.check(format!("{path}.baseEjectionTime"), check_optional(outlier.base_ejection_time));
    errors.check(format!("{path}.interval"), check_optional(outlier.interval));
    check_percent_range(errors, format!("{path}.maxEjectionPercent"), outlier.max_ejection_percent);
    check_percent_range(errors, format!("{path}.minHealthPercent"), outlier.min_health_percent);
    let split = outlier.split_external_local_origin_errors.unwrap_or(false);
    if !split && outlier.consecutive_local_origin_failures.unwrap_or(0) > 0 {
        let reason = "outlier detection consecutive local origin failures is specified, but split external local origin errors is set to false";
        errors.add(format!("{path}.consecutiveLocalOriginFailures"), forbidden(reason));
    }
}

/// Checks client TLS settings at `path` (`...tls`).
fn check_client_tls(errors: &mut Errors, path: &str, tls: &ClientTlsSettings) {
    let has_ca = !tls.ca_certificates.is_empty();
    let has_credential = !tls.credential_name.is_empty();
    let has_sans = !tls.subject_alt_names.is_empty();
    if tls.insecure_skip_verify == Some(true) {
        match tls.mode {
            Some(ClientTlsMode::Simple) if has_ca || has_credential || has_sans => errors.add(
                path,
                forbidden("cannot specify CaCertificates or CredentialName or SubjectAltNames when InsecureSkipVerify is set true"),
            ),
            Some(ClientTlsMode::Mutual) if has_ca || has_sans => errors.add(
                path,
                forbidden("cannot specify CaCertificates or SubjectAltNames when InsecureSkipVerify is set true"),
            ),
            _ => {}
        }
    }
    let files = [
        ("clientCertificate", &tls.client_certificate),
        ("privateKey", &tls.private_key),
        ("caCertificates", &tls.ca_certificates),
        ("caCrl", &tls.ca_crl),
    ];
    let has_files = files.iter().any(|(_, value)| !value.is_empty());
    match tls.mode {
        // Credentials fetched from a secret carry the certificate, key and CA themselves.
        Some(ClientTlsMode::Simple | ClientTlsMode::Mutual) if has_credential && has_files => {
            let reason = "cannot specify client certificates or CA certificate or CA CRL If credentialName is set";
            errors.add(path, forbidden(reason));
        }
        Some(ClientTlsMode::Simple | ClientTlsMode::Mutual) if has_credential => {}
        Some(ClientTlsMode::Mutual) => {
            if tls.client_certificate.is_empty() {
                errors.add(format!("{path}.clientCertificate"), required("client certificate required for mutual tls"));
            }
            if tls.private_key.is_empty() {
                errors.add(format!("{path}.privateKey"), required("private key required for mutual tls"));
            }
        }
        Some(ClientTlsMode::IstioMutual) => {
            let credential = ("credentialName", &tls.credential_name);
            for (name, _) in files.iter().take(3).chain([&credential]).filter(|(_, value)| !value.is_empty()) {
                let reason = format!("ISTIO_MUTUAL uses Istio's own certificates; {name} must not be set");
                errors.add(format!("{path}.{name}"), forbidden(reason));
            }
        }
        _ => {}
    }
}

/// Checks tunnel settings (loosely typed) at `path` (`...tunnel`).
fn check_tunnel(errors: &mut Errors, path: &str, tunnel: &Value) {
    if let Some(protocol) = tunnel.get("protocol").and_then(Value::as_str) {
        const PROTOCOLS: [&str; 3] = ["", "CONNECT", "POST"];
        if !PROTOCOLS.contains(&protocol) {
            errors.add(format!("{path}.protocol"), unsupported(protocol, &PROTOCOLS[1..]));
        }
    }
    match tunnel.get("targetHost").and_then(Value::as_str).unwrap_or_default() {
        "" => errors.add(format!("{path}.targetHost"), required("tunnel target host is required")),
        host if check_fqdn(host).is_err() && !is_ip(host) => {
            errors.add(
                format!("{path}.targetHost"),
                invalid(host, "tunnel target host must be valid FQDN or IP address"),
            );
        }
        _ => {}
    }
    match tunnel.get("targetPort") {
        None | Some(Value::Null) => {
            errors.add(format!("{path}.targetPort"), required("tunnel target port is required"))
        }
        Some(port) => {
            let number = port.as_u64().and_then(|p| u32::try_from(p).ok()).unwrap_or(0);
            errors.check(format!("{path}.targetPort"), check_port(number));
        }
    }
}

/// Checks PROXY protocol settings (loosely typed) at `path` (`...proxyProtocol`).
fn check_proxy_protocol(errors: &mut Errors, path: &str, proxy_protocol: &Value) {
    const VERSIONS: [&str; 2] = ["V1", "V2"];
    if let Some(version) = proxy_protocol.get("version").filter(|v| !v.is_null()) {
        if !version.as_str().is_some_and(|v| VERSIONS.contains(&v)) {
            errors.add(format!("{path}.version"), unsupported(version, &VERSIONS));
        }
    }
}

/// Checks a retry budget (loosely typed) at `path` (`...retryBudget`).
fn check_retry_budget(errors: &mut Errors, path: &str, budget: &Value) {
    if let Some(percent) = budget.get("percent").filter(|v| !v.is_null()) {
        match percent.as_f64() {
            Some(p) => check_percent_range(errors, format!("{path}.percent"), Some(p)),
            None => errors.add(format!("{path}.percent"), invalid(percent, "must be a number")),
        }
    }
    if let Some(min) = budget.get("minRetryConcurrency").filter(|v| !v.is_null() && v.as_u64().is_none()) {
        errors.add(format!("{path}.minRetryConcurrency"), invalid(min, "must be a non-negative integer"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::validation::testing::{assert_error, assert_valid};

    const DR: &str = "DestinationRule";

    fn policy(body: &str) -> String {
        format!("host: a\ntrafficPolicy: {body}")
    }

    fn err(body: &str, field: &str, reason: &str) {
        assert_error(DR, &policy(body), field, reason);
    }

    fn ok(body: &str) {
        assert_valid(DR, &policy(body));
    }

    #[test]
    fn a_full_policy_is_valid() {
        ok(r#"
  loadBalancer: {simple: ROUND_ROBIN, warmup: {duration: 60s, minimumPercent: 10, aggression: 0.5}}
  connectionPool:
    tcp: {maxConnections: 100, connectTimeout: 30ms, tcpKeepalive: {time: 7200s, interval: 75s, probes: 9}}
    http: {http1MaxPendingRequests: 10, maxRequestsPerConnection: 1, h2UpgradePolicy: UPGRADE, http2KeepAlive: {interval: 15s, timeout: 5s}}
  outlierDetection: {consecutive5xxErrors: 7, interval: 5m, baseEjectionTime: 15m, maxEjectionPercent: 100}
  tls: {mode: MUTUAL, clientCertificate: /c.pem, privateKey: /k.pem, caCertificates: /ca.pem}
  portLevelSettings:
  - port: {number: 80}
    loadBalancer: {consistentHash: {httpCookie: {name: user, ttl: 0s}, maglev: {tableSize: 65537}}}
  - port: {number: 443}
    tls: {mode: SIMPLE, credentialName: cert}
  proxyProtocol: {version: V2}
  retryBudget: {percent: 20, minRetryConcurrency: 3}"#);
        ok("{tunnel: {protocol: CONNECT, targetHost: egress.example.com, targetPort: 8443}}");
        ok("{loadBalancer: {localityLbSetting: {distribute: [{from: a/*, to: {\"b/*\": 80, \"c/*\": 20}}]}}}");
    }

    #[test]
    fn a_policy_sets_something() {
        err("{}", "spec.trafficPolicy", "traffic policy must have at least one field");
        err(
            "{tunnel: {targetHost: a.com, targetPort: 1}, proxyProtocol: {}}",
            "spec.trafficPolicy",
            "tunnel and proxyProtocol must not be set together",
        );
    }

    #[test]
    fn load_balancers_pick_one_algorithm() {
        err(
            "{loadBalancer: {simple: RANDOM, consistentHash: {useSourceIp: true}}}",
            "spec.trafficPolicy.loadBalancer",
            "only one of simple or consistentHash",
        );
        err(
            "{loadBalancer: {consistentHash: {useSourceIp: true, httpHeaderName: x}}}",
            "spec.trafficPolicy.loadBalancer.consistentHash",
            "only one of httpHeaderName",
        );
        err(
            "{loadBalancer: {consistentHash: {httpHeaderName: \"\"}}}",
            "spec.trafficPolicy.loadBalancer.consistentHash.httpHeaderName",
            "cannot be empty",
        );
        err(
            "{loadBalancer: {consistentHash: {httpQueryParameterName: \"\"}}}",
            "spec.trafficPolicy.loadBalancer.consistentHash.httpQueryParameterName",
            "cannot be empty",
        );
        err(
            "{loadBalancer: {consistentHash: {httpCookie: {ttl: 1s}}}}",
            "spec.trafficPolicy.loadBalancer.consistentHash.httpCookie.name",
            "Required value",
        );
    }

    #[test]
    fn ring_hash_and_maglev_sizes_are_bounded() {
        let hash = |h: &str| format!("{{loadBalancer: {{consistentHash: {{useSourceIp: true, {h}}}}}}}");
        let path = "spec.trafficPolicy.loadBalancer.consistentHash";
        err(&hash("ringHash: {}, maglev: {tableSize: 7}"), path, "only one of ringHash or maglev");
        err(&hash("minimumRingSize: 1024, ringHash: {}"), path, "only one of MinimumRingSize");
        err(
            &hash("ringHash: {minimumRingSize: 9000000}"),
            &format!("{path}.ringHash.minimumRingSize"),
            "at most 8388608",
        );
        err(&hash("minimumRingSize: 9000000"), &format!("{path}.minimumRingSize"), "at most 8388608");
        err(&hash("maglev: {}"), &format!("{path}.maglev.tableSize"), "tableSize must be set");
        err(&hash("maglev: {tableSize: 5000011}"), &format!("{path}.maglev.tableSize"), "less than 5000011");
        err(&hash("maglev: {tableSize: 1000}"), &format!("{path}.maglev.tableSize"), "prime");
        ok(&hash("ringHash: {minimumRingSize: 1024}"));
    }

    #[test]
    fn warmup_is_checked() {
        let path = "spec.trafficPolicy.loadBalancer";
        err("{loadBalancer: {warmup: {minimumPercent: 5}}}", &format!("{path}.warmup.duration"), "Required value");
        err("{loadBalancer: {warmup: {duration: 0s}}}", &format!("{path}.warmup.duration"), "greater than 1ms");
        err(
            "{loadBalancer: {warmup: {duration: 1s, minimumPercent: 150}}}",
            &format!("{path}.warmup.minimumPercent"),
            "Invalid value",
        );
        err(
            "{loadBalancer: {warmup: {duration: 1s, aggression: -0.1}}}",
            &format!("{path}.warmup.aggression"),
            "Invalid value",
        );
        err(
            "{loadBalancer: {warmupDurationSecs: 10s, warmup: {duration: 1s}}}",
            path,
            "only one of warmupDurationSecs or warmup",
        );
        err("{loadBalancer: {warmupDurationSecs: 0s}}", &format!("{path}.warmupDurationSecs"), "greater than 1ms");
    }

    #[test]
    fn locality_settings_are_checked() {
        let path = "spec.trafficPolicy.loadBalancer.localityLbSetting";
        let lb = |l: &str| format!("{{loadBalancer: {{localityLbSetting: {l}}}}}");
        err(&lb("{distribute: [{from: a, to: {b: 100}}], failover: [{from: a, to: b}]}"), path, "simultaneously");
        err(
            &lb("{distribute: [{from: a, to: {b: 0, c: 100}}]}"),
            &format!("{path}.distribute[0].to[b]"),
            "range [1, 100]",
        );
        err(&lb("{distribute: [{from: a, to: {b: 50}}]}"), &format!("{path}.distribute[0].to"), "!= 100");
        err(&lb("{failover: [{from: a, to: a}]}"), &format!("{path}.failover[0]"), "different regions");
        err(&lb("{failover: [{from: a/z, to: b}]}"), &format!("{path}.failover[0]"), "only specify region");
        err(&lb("{failover: [{from: a, to: \"*\"}]}"), &format!("{path}.failover[0]"), "wildcard");
        err(
            &lb("{failover: [{from: a, to: b}], failoverPriority: [topology.kubernetes.io/zone]}"),
            &format!("{path}.failoverPriority[0]"),
            "can not simultaneously set 'failover' and topology label",
        );
        ok(&lb("{failoverPriority: [topology.kubernetes.io/zone, \"version=v1\"], enabled: true}"));
    }

    #[test]
    fn connection_pools_are_checked() {
        let path = "spec.trafficPolicy.connectionPool";
        err("{connectionPool: {}}", path, "connection pool must have at least one field");
        err(
            "{connectionPool: {tcp: {maxConnections: -1}}}",
            &format!("{path}.tcp.maxConnections"),
            "greater than or equal to 0",
        );
        err("{connectionPool: {tcp: {connectTimeout: 0s}}}", &format!("{path}.tcp.connectTimeout"), "greater than 1ms");
        err(
            "{connectionPool: {tcp: {tcpKeepalive: {time: 0s}}}}",
            &format!("{path}.tcp.tcpKeepalive.time"),
            "greater than 1ms",
        );
        err(
            "{connectionPool: {tcp: {tcpKeepalive: {probes: -1}}}}",
            &format!("{path}.tcp.tcpKeepalive.probes"),
            "non-negative",
        );
        err(
            "{connectionPool: {http: {maxRetries: -2}}}",
            &format!("{path}.http.maxRetries"),
            "greater than or equal to 0",
        );
        err("{connectionPool: {http: {idleTimeout: 0.5ms}}}", &format!("{path}.http.idleTimeout"), "greater than 1ms");
        err(
            "{connectionPool: {http: {h2UpgradePolicy: MAYBE}}}",
            &format!("{path}.http.h2UpgradePolicy"),
            "Unsupported value",
        );
        err(
            "{connectionPool: {http: {h2UpgradePolicy: UPGRADE, useClientProtocol: true}}}",
            &format!("{path}.http.useClientProtocol"),
            "must not be true when H2UpgradePolicy is UPGRADE",
        );
        err(
            "{connectionPool: {http: {http2KeepAlive: {timeout: 0s}}}}",
            &format!("{path}.http.http2KeepAlive.timeout"),
            "1ms",
        );
    }

    #[test]
    fn outlier_detection_is_checked() {
        let path = "spec.trafficPolicy.outlierDetection";
        err("{outlierDetection: {interval: 0s}}", &format!("{path}.interval"), "greater than 1ms");
        err("{outlierDetection: {baseEjectionTime: 1us}}", &format!("{path}.baseEjectionTime"), "greater than 1ms");
        err(
            "{outlierDetection: {maxEjectionPercent: 101}}",
            &format!("{path}.maxEjectionPercent"),
            "Invalid value: 101",
        );
        err("{outlierDetection: {minHealthPercent: -1}}", &format!("{path}.minHealthPercent"), "between 0 and 100");
        err(
            "{outlierDetection: {consecutiveLocalOriginFailures: 3}}",
            &format!("{path}.consecutiveLocalOriginFailures"),
            "split external local origin errors is set to false",
        );
        ok("{outlierDetection: {consecutiveLocalOriginFailures: 3, splitExternalLocalOriginErrors: true}}");
    }

    #[test]
    fn client_tls_is_checked() {
        let path = "spec.trafficPolicy.tls";
        err(
            "{tls: {mode: MUTUAL, privateKey: /k}}",
            &format!("{path}.clientCertificate"),
            "client certificate required",
        );
        err("{tls: {mode: MUTUAL, clientCertificate: /c}}", &format!("{path}.privateKey"), "private key required");
        ok("{tls: {mode: MUTUAL, credentialName: secret}}");
        err("{tls: {mode: SIMPLE, credentialName: s, caCertificates: /ca}}", path, "If credentialName is set");
        err("{tls: {mode: SIMPLE, insecureSkipVerify: true, subjectAltNames: [a]}}", path, "InsecureSkipVerify");
        err(
            "{tls: {mode: MUTUAL, credentialName: s, insecureSkipVerify: true, caCertificates: /ca}}",
            path,
            "InsecureSkipVerify",
        );
        err("{tls: {mode: ISTIO_MUTUAL, clientCertificate: /c}}", &format!("{path}.clientCertificate"), "ISTIO_MUTUAL");
        err("{tls: {mode: ISTIO_MUTUAL, credentialName: c}}", &format!("{path}.credentialName"), "must not be set");
        ok("{tls: {mode: ISTIO_MUTUAL, sni: a.com}}");
    }

    #[test]
    fn port_level_settings_are_checked() {
        let path = "spec.trafficPolicy.portLevelSettings";
        err("{portLevelSettings: [{tls: {mode: DISABLE}}]}", &format!("{path}[0].port"), "must have valid port");
        err("{portLevelSettings: [{port: {number: 80}}]}", &format!("{path}[0]"), "at least one field");
        err(
            "{portLevelSettings: [{port: {number: 0}, tls: {mode: DISABLE}}]}",
            &format!("{path}[0].port.number"),
            "1-65535",
        );
        err(
            "{portLevelSettings: [{port: {number: 80}, tls: {mode: DISABLE}}, {port: {number: 80}, tls: {mode: SIMPLE}}]}",
            &format!("{path}[1].port.number"),
            "Duplicate value",
        );
        err(
            "{portLevelSettings: [{port: {number: 80}, connectionPool: {tcp: {maxConnections: -1}}}]}",
            &format!("{path}[0].connectionPool.tcp.maxConnections"),
            "greater than or equal to 0",
        );
    }

    #[test]
    fn tunnels_proxy_protocol_and_retry_budgets_are_checked() {
        let path = "spec.trafficPolicy";
        err("{tunnel: {targetPort: 80}}", &format!("{path}.tunnel.targetHost"), "Required value");
        err("{tunnel: {targetHost: \"a..b\", targetPort: 80}}", &format!("{path}.tunnel.targetHost"), "FQDN or IP");
        err("{tunnel: {targetHost: a.com}}", &format!("{path}.tunnel.targetPort"), "Required value");
        err("{tunnel: {targetHost: 1.2.3.4, targetPort: 0}}", &format!("{path}.tunnel.targetPort"), "1-65535");
        err(
            "{tunnel: {protocol: GET, targetHost: a.com, targetPort: 80}}",
            &format!("{path}.tunnel.protocol"),
            "Unsupported value",
        );
        err("{proxyProtocol: {version: V3}}", &format!("{path}.proxyProtocol.version"), "Unsupported value");
        err("{retryBudget: {percent: 120}}", &format!("{path}.retryBudget.percent"), "between 0 and 100");
        err(
            "{retryBudget: {minRetryConcurrency: -1}}",
            &format!("{path}.retryBudget.minRetryConcurrency"),
            "non-negative",
        );
    }

    #[test]
    fn primes_are_primes() {
        let primes: Vec<u64> = (0..20).filter(|n| is_prime(*n)).collect();
        assert_eq!(primes, [2, 3, 5, 7, 11, 13, 17, 19]);
    }
}
