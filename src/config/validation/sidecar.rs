//! Sidecar rules: egress and ingress listeners, their ports and binds, and the outbound traffic policy.

use std::collections::BTreeSet;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::config::api::destination_rule::ConnectionPoolSettings;
use crate::config::api::gateway::ServerTlsSettings;
use crate::config::api::sidecar::{CaptureMode, IstioEgressListener, OutboundMode, OutboundTrafficPolicy};
use crate::config::api::virtual_service::Destination;
use crate::config::api::{Port, Sidecar};
use crate::config::decode::{decode, unknown_field_reason};

use super::addresses::{check_ip, check_unix_address, UNIX_PREFIX};
use super::destination::check_destination;
use super::field_errors::{duplicate, forbidden, invalid, required, unsupported, Errors};
use super::gateway::check_server_tls;
use super::hosts::{check_namespaced_host, HostScope};
use super::labels::check_selector;
use super::ports::{check_port, check_port_name, check_protocol};
use super::traffic_policy::check_connection_pool;

/// Fields of an ingress listener.
const INGRESS_FIELDS: [&str; 6] = ["port", "bind", "captureMode", "defaultEndpoint", "tls", "connectionPool"];

/// Values of `captureMode`.
const CAPTURE_MODES: [&str; 3] = ["DEFAULT", "IPTABLES", "NONE"];

/// Hosts an ingress `defaultEndpoint` may forward to.
const DEFAULT_ENDPOINT_HOSTS: [&str; 5] = ["", "127.0.0.1", "0.0.0.0", "::1", "::"];

/// Checks a Sidecar.
pub(super) fn validate(sidecar: &Sidecar, errors: &mut Errors) {
    if let Some(selector) = &sidecar.workload_selector {
        check_selector(errors, "spec.workloadSelector.labels", &selector.match_labels);
    }
    let empty = sidecar.egress.is_empty()
        && sidecar.ingress.is_empty()
        && sidecar.outbound_traffic_policy.is_none()
        && sidecar.inbound_connection_pool.is_none();
    if empty {
        let reason = "sidecar: empty configuration provided (set egress, ingress, outboundTrafficPolicy or inboundConnectionPool)";
        errors.add("spec.egress", required(reason));
        return;
    }
    check_ingress(errors, &sidecar.ingress);
    if let Some(pool) = &sidecar.inbound_connection_pool {
        if let Some(pool) = typed::<ConnectionPoolSettings>(errors, "spec.inboundConnectionPool", pool) {
            check_connection_pool(errors, "spec.inboundConnectionPool", &pool);
        }
    }
    check_egress(errors, &sidecar.egress);
    if let Some(policy) = &sidecar.outbound_traffic_policy {
        check_outbound_policy(errors, "spec.outboundTrafficPolicy", policy);
    }
}

/// Reads a loosely typed part of the spec as its Istio type, reporting why it does not fit (and
/// the fields it does not have, as warnings).
fn typed<T: DeserializeOwned>(errors: &mut Errors, path: &str, value: &Value) -> Option<T> {
    match decode::<T>(value.clone(), path) {
        Ok(decoded) => {
            for field in decoded.unknown {
                let reason = format!("{}, ignored as Istio ignores it", unknown_field_reason(&field));
                errors.warn(field, reason);
            }
            Some(decoded.value)
        }
        Err(error) => {
            errors.add(error.field, error.reason);
            None
        }
    }
}

/// Checks the egress listeners: ports and binds unique, one catch-all (no port) at the end, hosts valid.
fn check_egress(errors: &mut Errors, egress: &[IstioEgressListener]) {
    let mut ports = BTreeSet::new();
    let mut sockets = BTreeSet::new();
    let mut catch_all_seen = false;
    for (i, listener) in egress.iter().enumerate() {
        let path = format!("spec.egress[{i}]");
        match &listener.port {
            None if catch_all_seen => {
                errors.add(
                    format!("{path}.port"),
                    forbidden("sidecar: egress can have only one listener with empty port"),
                );
            }
            None if i + 1 != egress.len() => {
                let reason =
                    forbidden("sidecar: the egress listener with empty port should be the last listener in the list");
                errors.add(&path, reason);
                catch_all_seen = true;
            }
            None => catch_all_seen = true,
            Some(port) => check_egress_port(errors, &path, port, listener, &mut ports, &mut sockets),
        }
        if listener.hosts.is_empty() {
            errors.add(format!("{path}.hosts"), required("sidecar: egress listener must contain at least one host"));
        }
        for (k, host) in listener.hosts.iter().enumerate() {
            let result = check_namespaced_host(host, HostScope::Sidecar).map_err(|e| invalid(host, e));
            errors.check(format!("{path}.hosts[{k}]"), result);
        }
    }
}

/// Checks an egress listener's port and bind: IP listeners on distinct ports, unix sockets on port 0.
fn check_egress_port<'a>(
    errors: &mut Errors,
    path: &str,
    port: &Port,
    listener: &'a IstioEgressListener,
    ports: &mut BTreeSet<u32>,
    sockets: &mut BTreeSet<&'a str>,
) {
    check_listener_port(errors, &format!("{path}.port"), port);
    let bind = listener.bind.as_str();
    if port.number == 0 {
        if !bind.starts_with(UNIX_PREFIX) {
            errors.add(
                format!("{path}.bind"),
                required("sidecar: ports with 0 value must have a unix domain socket bind address"),
            );
        } else {
            errors.check(format!("{path}.bind"), check_unix_address(bind).map_err(|e| invalid(bind, e)));
            if !sockets.insert(bind) {
                errors.add(
                    format!("{path}.bind"),
                    duplicate(bind, "sidecar: unix domain socket values for listeners must be unique"),
                );
            }
        }
        if listener.capture_mode == Some(CaptureMode::Iptables) {
            let reason = forbidden("sidecar: captureMode must be DEFAULT/NONE for unix domain socket listeners");
            errors.add(format!("{path}.captureMode"), reason);
        }
        return;
    }
    errors.check(format!("{path}.port.number"), check_port(port.number));
    if !bind.is_empty() {
        errors.check(format!("{path}.bind"), check_ip(bind).map_err(|e| invalid(bind, e)));
    }
    if !ports.insert(port.number) {
        let reason = duplicate(port.number, "sidecar: ports on IP bound listeners must be unique");
        errors.add(format!("{path}.port.number"), reason);
    }
}

/// Checks what egress and ingress ports share: optional valid name, known protocol, no targetPort.
fn check_listener_port(errors: &mut Errors, path: &str, port: &Port) {
    if !port.name.is_empty() {
        errors.check(format!("{path}.name"), check_port_name(&port.name));
    }
    errors.check(format!("{path}.protocol"), check_protocol(&port.protocol));
    if port.target_port.is_some_and(|t| t > 0) {
        errors.add(format!("{path}.targetPort"), forbidden("targetPort has no impact on Sidecars"));
    }
}

/// Checks the ingress listeners (kept loosely typed by the API): port, bind, endpoint, TLS and pool.
fn check_ingress(errors: &mut Errors, ingress: &[Value]) {
    let mut ports = BTreeSet::new();
    for (i, listener) in ingress.iter().enumerate() {
        let path = format!("spec.ingress[{i}]");
        let Some(fields) = listener.as_object() else {
            errors.add(path, invalid(listener, "ingress listener must be an object"));
            continue;
        };
        for key in fields.keys().filter(|k| !INGRESS_FIELDS.contains(&k.as_str())) {
            errors.warn(
                format!("{path}.{key}"),
                format!("unknown field `{key}`, ignored as Istio ignores it (known: {})", INGRESS_FIELDS.join(", ")),
            );
        }
        let text = |name: &str| listener.get(name).and_then(Value::as_str).unwrap_or_default();
        match listener.get("port").filter(|p| !p.is_null()) {
            None => errors.add(format!("{path}.port"), required("sidecar: port is required for ingress listeners")),
            Some(value) => {
                if let Some(port) = typed::<Port>(errors, &format!("{path}.port"), value) {
                    check_listener_port(errors, &format!("{path}.port"), &port);
                    errors.check(format!("{path}.port.number"), check_port(port.number));
                    if !ports.insert(port.number) {
                        let reason = duplicate(port.number, "sidecar: ports on IP bound listeners must be unique");
                        errors.add(format!("{path}.port.number"), reason);
                    }
                }
            }
        }
        let bind = text("bind");
        if !bind.is_empty() {
            errors.check(format!("{path}.bind"), check_ip(bind).map_err(|e| invalid(bind, e)));
        }
        if let Some(mode) = listener.get("captureMode").filter(|m| !m.is_null()) {
            if !mode.as_str().is_some_and(|m| CAPTURE_MODES.contains(&m)) {
                errors.add(format!("{path}.captureMode"), unsupported(mode, &CAPTURE_MODES));
            }
        }
        let endpoint = text("defaultEndpoint");
        if !endpoint.is_empty() {
            errors.check(format!("{path}.defaultEndpoint"), check_default_endpoint(endpoint));
        }
        if let Some(tls) = listener.get("tls").filter(|t| !t.is_null()) {
            if let Some(tls) = typed::<ServerTlsSettings>(errors, &format!("{path}.tls"), tls) {
                check_ingress_tls(errors, &format!("{path}.tls"), &tls);
            }
        }
        if let Some(pool) = listener.get("connectionPool").filter(|p| !p.is_null()) {
            if let Some(pool) = typed::<ConnectionPoolSettings>(errors, &format!("{path}.connectionPool"), pool) {
                check_connection_pool(errors, &format!("{path}.connectionPool"), &pool);
            }
        }
    }
}

/// Checks where an ingress listener forwards to: a loopback/any address with a port, or a unix socket.
fn check_default_endpoint(endpoint: &str) -> Result<(), String> {
    if endpoint.starts_with(UNIX_PREFIX) {
        return check_unix_address(endpoint).map_err(|e| invalid(endpoint, e));
    }
    let shape = "sidecar: defaultEndpoint must be of form 127.0.0.1:<port>,0.0.0.0:<port>,[::1]:port,[::]:port,unix://filepath or unset";
    let split = match endpoint.strip_prefix('[') {
        Some(rest) => rest.split_once("]:"),
        None => endpoint.rsplit_once(':').filter(|(host, _)| !host.contains(':')),
    };
    let Some((host, port)) = split else {
        return Err(invalid(endpoint, shape));
    };
    if !DEFAULT_ENDPOINT_HOSTS.contains(&host) {
        return Err(invalid(endpoint, shape));
    }
    match port.parse::<u32>() {
        Ok(number) => check_port(number),
        Err(_) => Err(invalid(endpoint, format!("sidecar: defaultEndpoint port ({port}) is not a number"))),
    }
}

/// Checks ingress TLS: what sidecars cannot do, then the server TLS rules.
fn check_ingress_tls(errors: &mut Errors, path: &str, tls: &ServerTlsSettings) {
    if !tls.subject_alt_names.is_empty() {
        errors.add(
            format!("{path}.subjectAltNames"),
            forbidden("sidecar: subjectAltNames is not supported in ingress tls"),
        );
    }
    if tls.https_redirect {
        errors.add(format!("{path}.httpsRedirect"), forbidden("sidecar: httpsRedirect is not supported"));
    }
    if !tls.credential_name.is_empty() {
        errors.add(format!("{path}.credentialName"), forbidden("sidecar: credentialName is not currently supported"));
    }
    if let Some(mode) = tls.mode.as_deref().filter(|m| matches!(*m, "ISTIO_MUTUAL" | "AUTO_PASSTHROUGH")) {
        errors.add(format!("{path}.mode"), forbidden(format!("cannot set mode to {mode} in sidecar ingress tls")));
    }
    check_server_tls(errors, path, tls);
}

/// Checks the outbound traffic policy: an egress proxy only with ALLOW_ANY, and a complete one.
fn check_outbound_policy(errors: &mut Errors, path: &str, policy: &OutboundTrafficPolicy) {
    let Some(proxy) = &policy.egress_proxy else {
        return;
    };
    let field = format!("{path}.egressProxy");
    if policy.mode != Some(OutboundMode::AllowAny) {
        errors.add(
            field,
            forbidden("sidecar: egress_proxy must be set only with ALLOW_ANY outbound_traffic_policy mode"),
        );
        return;
    }
    let Some(destination) = typed::<Destination>(errors, &field, proxy) else {
        return;
    };
    if destination.host.starts_with('*') {
        errors.add(format!("{field}.host"), invalid(&destination.host, "egress proxy host must be an FQDN"));
    }
    if destination.port.is_none() {
        errors.add(format!("{field}.port"), required("sidecar: egress_proxy port must be non-nil"));
    }
    check_destination(errors, &field, &destination);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::validation::testing::{all_errors, assert_error, assert_valid, assert_warning};

    const SC: &str = "Sidecar";

    #[test]
    fn typical_sidecars_are_valid() {
        assert_valid(SC, "egress: [{hosts: [\"abc/*\"]}]");
        assert_valid(
            SC,
            "egress:\n- {port: {number: 9080, protocol: HTTP, name: http}, bind: 127.0.0.1, hosts: [\"./*\"]}\n\
             - {port: {number: 0, name: uds}, bind: \"unix:///var/run/a.sock\", captureMode: NONE, hosts: [\"*/a.example.com\"]}\n\
             - {hosts: [\"istio-system/*\", \"~/*\"]}",
        );
        assert_valid(SC, "outboundTrafficPolicy: {mode: REGISTRY_ONLY}");
        assert_valid(
            SC,
            "ingress: [{port: {number: 9080, protocol: HTTP, name: http}, defaultEndpoint: \"127.0.0.1:8080\", captureMode: DEFAULT}]",
        );
        assert_valid(SC, "outboundTrafficPolicy: {mode: ALLOW_ANY, egressProxy: {host: proxy.ns.svc.cluster.local, port: {number: 3128}}}");
        assert_valid(SC, "inboundConnectionPool: {http: {http1MaxPendingRequests: 10}}");
    }

    #[test]
    fn something_must_be_configured() {
        assert_error(
            SC,
            "workloadSelector: {labels: {app: a}}",
            "spec.egress",
            "sidecar: empty configuration provided",
        );
    }

    #[test]
    fn selectors_use_labels_without_wildcards() {
        assert_error(
            SC,
            "workloadSelector: {labels: {app: \"*\"}}\negress: [{hosts: [\"*/*\"]}]",
            "spec.workloadSelector.labels[app]",
            "wildcard",
        );
    }

    #[test]
    fn egress_hosts_are_namespaced() {
        assert_error(SC, "egress: [{port: {number: 80, name: http}}]", "spec.egress[0].hosts", "at least one host");
        assert_error(
            SC,
            "egress: [{hosts: [a.com]}]",
            "spec.egress[0].hosts[0]",
            "host must be of form namespace/dnsName",
        );
        assert_error(SC, "egress: [{hosts: [\"Bad_NS/*\"]}]", "spec.egress[0].hosts[0]", "invalid namespace value");
        assert_error(SC, "egress: [{hosts: [ns/short]}]", "spec.egress[0].hosts[0]", "short names");
    }

    #[test]
    fn the_catch_all_listener_is_single_and_last() {
        assert_error(
            SC,
            "egress: [{hosts: [\"*/*\"]}, {port: {number: 80}, hosts: [\"*/*\"]}]",
            "spec.egress[0]",
            "should be the last listener",
        );
        assert_error(
            SC,
            "egress: [{hosts: [\"a/*\"]}, {hosts: [\"b/*\"]}]",
            "spec.egress[0]",
            "should be the last listener",
        );
        let three = "egress: [{hosts: [\"a/*\"]}, {hosts: [\"b/*\"]}, {hosts: [\"c/*\"]}]";
        let found: Vec<String> = all_errors(SC, three).iter().map(|e| e.to_string()).collect();
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].starts_with("spec.egress[0]: Forbidden"), "{found:?}");
        for (i, error) in found.iter().enumerate().skip(1) {
            let field = format!("spec.egress[{i}].port: Forbidden");
            assert!(error.starts_with(&field) && error.contains("only one listener"), "{found:?}");
        }
    }

    #[test]
    fn egress_ports_and_binds_are_checked() {
        assert_error(
            SC,
            "egress: [{port: {number: 70000}, hosts: [\"*/*\"]}]",
            "spec.egress[0].port.number",
            "1-65535",
        );
        assert_error(
            SC,
            "egress: [{port: {number: 80, protocol: FTP}, hosts: [\"*/*\"]}]",
            "spec.egress[0].port.protocol",
            "unsupported protocol",
        );
        assert_error(
            SC,
            "egress: [{port: {number: 80, name: a_b}, hosts: [\"*/*\"]}]",
            "spec.egress[0].port.name",
            "invalid port name",
        );
        assert_error(
            SC,
            "egress: [{port: {number: 80, targetPort: 8080}, hosts: [\"*/*\"]}]",
            "spec.egress[0].port.targetPort",
            "no impact on Sidecars",
        );
        assert_error(
            SC,
            "egress: [{port: {number: 80}, bind: localhost, hosts: [\"*/*\"]}]",
            "spec.egress[0].bind",
            "not a valid IP",
        );
        assert_error(
            SC,
            "egress: [{port: {number: 80}, hosts: [\"*/*\"]}, {port: {number: 80}, hosts: [\"*/*\"]}]",
            "spec.egress[1].port.number",
            "ports on IP bound listeners must be unique",
        );
    }

    #[test]
    fn unix_socket_listeners_are_checked() {
        assert_error(
            SC,
            "egress: [{port: {number: 0}, hosts: [\"*/*\"]}]",
            "spec.egress[0].bind",
            "unix domain socket bind address",
        );
        assert_error(
            SC,
            "egress: [{port: {number: 0}, bind: \"unix://rel\", hosts: [\"*/*\"]}]",
            "spec.egress[0].bind",
            "UDS must be an absolute path",
        );
        assert_error(
            SC,
            "egress: [{port: {number: 0}, bind: \"unix:///s\", captureMode: IPTABLES, hosts: [\"*/*\"]}]",
            "spec.egress[0].captureMode",
            "DEFAULT/NONE",
        );
        assert_error(
            SC,
            "egress: [{port: {number: 0}, bind: \"unix:///s\", hosts: [\"*/*\"]}, {port: {number: 0}, bind: \"unix:///s\", hosts: [\"*/*\"]}]",
            "spec.egress[1].bind",
            "must be unique",
        );
    }

    #[test]
    fn ingress_listeners_are_checked() {
        assert_error(SC, "ingress: [{defaultEndpoint: \"127.0.0.1:80\"}]", "spec.ingress[0].port", "port is required");
        assert_error(SC, "ingress: [{port: {number: 0}}]", "spec.ingress[0].port.number", "1-65535");
        assert_warning(
            SC,
            "ingress: [{port: {number: 80, nmae: x}}]",
            "spec.ingress[0].port.nmae",
            "unknown field `nmae`",
        );
        assert_warning(SC, "ingress: [{port: {number: 80}, bnid: x}]", "spec.ingress[0].bnid", "unknown field `bnid`");
        assert_error(
            SC,
            "ingress: [{port: {number: 80}}, {port: {number: 80}}]",
            "spec.ingress[1].port.number",
            "must be unique",
        );
        assert_error(SC, "ingress: [{port: {number: 80}, bind: a.b}]", "spec.ingress[0].bind", "not a valid IP");
        assert_error(
            SC,
            "ingress: [{port: {number: 80}, captureMode: ALWAYS}]",
            "spec.ingress[0].captureMode",
            "Unsupported value",
        );
        assert_error(
            SC,
            "ingress: [{port: {number: 80}, tls: {mode: ISTIO_MUTUAL}}]",
            "spec.ingress[0].tls.mode",
            "cannot set mode to ISTIO_MUTUAL",
        );
        assert_error(
            SC,
            "ingress: [{port: {number: 80}, tls: {mode: SIMPLE, privateKey: /k}}]",
            "spec.ingress[0].tls.serverCertificate",
            "SIMPLE TLS requires a server certificate",
        );
        assert_error(
            SC,
            "ingress: [{port: {number: 80}, connectionPool: {tcp: {maxConnections: -1}}}]",
            "spec.ingress[0].connectionPool.tcp.maxConnections",
            "greater than or equal to 0",
        );
    }

    #[test]
    fn default_endpoints_are_local() {
        assert!(check_default_endpoint("127.0.0.1:8080").is_ok());
        assert!(check_default_endpoint(":8080").is_ok());
        assert!(check_default_endpoint("[::1]:8080").is_ok());
        assert!(check_default_endpoint("unix:///var/run/app.sock").is_ok());
        assert!(check_default_endpoint("10.0.0.1:8080").unwrap_err().contains("must be of form"));
        assert!(check_default_endpoint("127.0.0.1").unwrap_err().contains("must be of form"));
        assert!(check_default_endpoint("127.0.0.1:http").unwrap_err().contains("not a number"));
        assert!(check_default_endpoint("127.0.0.1:0").unwrap_err().contains("1-65535"));
        assert!(check_default_endpoint("unix://x").unwrap_err().contains("UDS must be an absolute path"));
    }

    #[test]
    fn inbound_connection_pools_are_checked() {
        assert_error(SC, "inboundConnectionPool: {}", "spec.inboundConnectionPool", "at least one field");
    }

    #[test]
    fn egress_proxies_need_allow_any_and_a_port() {
        let path = "spec.outboundTrafficPolicy.egressProxy";
        assert_error(
            SC,
            "outboundTrafficPolicy: {mode: REGISTRY_ONLY, egressProxy: {host: p.com, port: {number: 1}}}",
            path,
            "ALLOW_ANY",
        );
        assert_error(
            SC,
            "outboundTrafficPolicy: {mode: ALLOW_ANY, egressProxy: {host: p.com}}",
            &format!("{path}.port"),
            "non-nil",
        );
        assert_error(
            SC,
            "outboundTrafficPolicy: {mode: ALLOW_ANY, egressProxy: {host: \"*.p.com\", port: {number: 1}}}",
            &format!("{path}.host"),
            "FQDN",
        );
    }
}
