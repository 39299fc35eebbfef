//! DestinationRule traffic policy → cluster settings (load balancing, limits, outlier detection).

use envoy_types::pb::envoy::config::cluster::v3::{
    circuit_breakers::Thresholds, cluster, CircuitBreakers, Cluster, OutlierDetection as EnvoyOutlier,
    UpstreamConnectionOptions,
};
use envoy_types::pb::envoy::config::core::v3::{
    Http1ProtocolOptions, Http2ProtocolOptions, HttpProtocolOptions, TcpKeepalive,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    http_protocol_options::UseDownstreamHttpConfig,
    http_protocol_options::{explicit_http_config::ProtocolConfig, ExplicitHttpConfig, UpstreamProtocolOptions},
    HttpProtocolOptions as UpstreamHttpOptions,
};
use envoy_types::pb::envoy::r#type::v3::Percent as EnvoyPercent;
use envoy_types::pb::google::protobuf::{Any, UInt64Value};

use super::names::ext;
use super::proto::{any, clamp_u32, duration, map_field, u32_value};
use crate::config::api::destination_rule::{
    ClientTlsSettings, ConnectionPoolSettings, LoadBalancerSettings, OutlierDetection, SimpleLb, Subset, TrafficPolicy,
};
use crate::config::api::{DestinationRule, Protocol};
use crate::mesh::MeshConfig;

/// The policy components that apply to one cluster, after Istio's merge: port-level settings
/// replace the level they are on wholesale, subset components override the rule's one by one.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Policy<'a> {
    /// Load balancing.
    pub load_balancer: Option<&'a LoadBalancerSettings>,
    /// Connection limits.
    pub connection_pool: Option<&'a ConnectionPoolSettings>,
    /// Outlier detection.
    pub outlier_detection: Option<&'a OutlierDetection>,
    /// Client TLS.
    pub tls: Option<&'a ClientTlsSettings>,
}

impl<'a> Policy<'a> {
    /// The policy for `port` of the rule's host, optionally within a subset.
    pub(super) fn effective(rule: Option<&'a DestinationRule>, subset: Option<&'a Subset>, port: u16) -> Self {
        let mut policy = rule.and_then(|r| r.traffic_policy.as_ref()).map(|tp| at_port(tp, port)).unwrap_or_default();
        if let Some(sp) = subset.and_then(|s| s.traffic_policy.as_ref()) {
            policy.load_balancer = sp.load_balancer.as_ref().or(policy.load_balancer);
            policy.connection_pool = sp.connection_pool.as_ref().or(policy.connection_pool);
            policy.outlier_detection = sp.outlier_detection.as_ref().or(policy.outlier_detection);
            policy.tls = sp.tls.as_ref().or(policy.tls);
            if let Some(pls) = port_level(sp, port) {
                policy = pls;
            }
        }
        policy
    }
}

fn at_port(tp: &TrafficPolicy, port: u16) -> Policy<'_> {
    port_level(tp, port).unwrap_or(Policy {
        load_balancer: tp.load_balancer.as_ref(),
        connection_pool: tp.connection_pool.as_ref(),
        outlier_detection: tp.outlier_detection.as_ref(),
        tls: tp.tls.as_ref(),
    })
}

fn port_level(tp: &TrafficPolicy, port: u16) -> Option<Policy<'_>> {
    let pls = tp.port_level_settings.iter().find(|p| p.port.map(|s| s.number) == Some(u32::from(port)))?;
    Some(Policy {
        load_balancer: pls.load_balancer.as_ref(),
        connection_pool: pls.connection_pool.as_ref(),
        outlier_detection: pls.outlier_detection.as_ref(),
        tls: pls.tls.as_ref(),
    })
}

/// Applies connection pool, HTTP protocol, outlier detection and load balancing to a cluster.
pub(super) fn apply(cluster: &mut Cluster, policy: &Policy<'_>, protocol: Protocol, mesh: &MeshConfig) {
    apply_connection_pool(cluster, policy.connection_pool, mesh);
    if let Some(options) = http_protocol_options(policy.connection_pool, protocol) {
        cluster.typed_extension_protocol_options = map_field([(ext::HTTP_PROTOCOL_OPTIONS.to_string(), options)]);
    }
    if let Some(outlier) = policy.outlier_detection {
        apply_outlier_detection(cluster, outlier);
    }
    apply_load_balancer(cluster, policy.load_balancer);
}

/// Turns Envoy's panic mode off on an outbound service cluster whose outlier detection did not
/// set a threshold, as istiod does: it sends not-ready endpoints (as UNHEALTHY), and in panic
/// mode Envoy would route to them.
pub(super) fn disable_panic_mode_by_default(cluster: &mut Cluster) {
    let common = cluster.common_lb_config.get_or_insert_with(Default::default);
    common.healthy_panic_threshold.get_or_insert(EnvoyPercent { value: 0.0 });
}

/// The name a cluster's statistics are also kept under, as istiod sets it: the name followed by
/// Istio's stat prefix delimiter.
pub(super) fn alt_stat_name(name: &str) -> String {
    format!("{name};")
}

/// How long the passthrough cluster keeps an idle upstream connection (istiod's value).
const PASSTHROUGH_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// The passthrough cluster's HTTP options, as istiod sends them: upstream in the client's protocol,
/// idle connections closed after five minutes.
pub(super) fn passthrough_http_options(cluster: &mut Cluster) {
    let options = UpstreamHttpOptions {
        common_http_protocol_options: Some(HttpProtocolOptions {
            idle_timeout: Some(duration(PASSTHROUGH_IDLE_TIMEOUT)),
            ..Default::default()
        }),
        upstream_protocol_options: Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(
            UseDownstreamHttpConfig {
                http_protocol_options: Some(Http1ProtocolOptions::default()),
                http2_protocol_options: Some(Http2ProtocolOptions::default()),
                ..Default::default()
            },
        )),
        ..Default::default()
    };
    cluster.typed_extension_protocol_options = map_field([(ext::HTTP_PROTOCOL_OPTIONS.to_string(), any(options))]);
}

/// Makes a sidecar cluster of a sniffed port speak upstream the protocol the client spoke (Istio's
/// `use_downstream_protocol` for unknown protocols), unless a policy already asked for HTTP/2.
pub(super) fn use_downstream_protocol(cluster: &mut Cluster) {
    let mut options: UpstreamHttpOptions = cluster
        .typed_extension_protocol_options
        .get(ext::HTTP_PROTOCOL_OPTIONS)
        .and_then(|a| prost::Message::decode(a.value.as_slice()).ok())
        .unwrap_or_default();
    if let Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
        protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(_)),
    })) = &options.upstream_protocol_options
    {
        return;
    }
    if matches!(options.upstream_protocol_options, Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(_))) {
        return;
    }
    options.upstream_protocol_options =
        Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(UseDownstreamHttpConfig {
            http_protocol_options: Some(Http1ProtocolOptions::default()),
            http2_protocol_options: Some(Http2ProtocolOptions::default()),
            ..Default::default()
        }));
    cluster.typed_extension_protocol_options = map_field([(ext::HTTP_PROTOCOL_OPTIONS.to_string(), any(options))]);
}

fn apply_connection_pool(cluster: &mut Cluster, pool: Option<&ConnectionPoolSettings>, mesh: &MeshConfig) {
    let tcp = pool.and_then(|p| p.tcp.as_ref());
    let http = pool.and_then(|p| p.http.as_ref());
    let connect_timeout = tcp.and_then(|t| t.connect_timeout).unwrap_or(mesh.connect_timeout);
    cluster.connect_timeout = Some(duration(connect_timeout.as_std()));
    // Istio lifts Envoy's small defaults (max_retries 3) to "unlimited" unless configured.
    let limit = |v: Option<i32>| u32_value(v.filter(|v| *v > 0).map(clamp_u32).unwrap_or(u32::MAX));
    let thresholds = Thresholds {
        max_connections: Some(limit(tcp.and_then(|t| t.max_connections))),
        max_pending_requests: Some(limit(http.and_then(|h| h.http1_max_pending_requests))),
        max_requests: Some(limit(http.and_then(|h| h.http2_max_requests))),
        max_retries: Some(limit(http.and_then(|h| h.max_retries))),
        ..Default::default()
    };
    cluster.circuit_breakers = Some(CircuitBreakers { thresholds: vec![thresholds], ..Default::default() });
    if let Some(keepalive) = tcp.and_then(|t| t.tcp_keepalive.as_ref()) {
        let options = cluster.upstream_connection_options.get_or_insert_with(UpstreamConnectionOptions::default);
        options.tcp_keepalive = Some(tcp_keepalive(keepalive));
    }
}

/// `tcpKeepalive` (validated: `probes` a count, `time` and `interval` durations) as Envoy's socket
/// keepalive; an empty one turns SO_KEEPALIVE on with the system's timing, as istiod sends it.
fn tcp_keepalive(keepalive: &serde_json::Value) -> TcpKeepalive {
    let seconds = |name: &str| {
        let value = keepalive.get(name)?.clone();
        let parsed: crate::config::api::common::Duration = serde_json::from_value(value).ok()?;
        Some(u32_value(u32::try_from(parsed.0.as_secs()).unwrap_or(u32::MAX)))
    };
    let probes = keepalive.get("probes").and_then(serde_json::Value::as_u64).filter(|p| *p > 0);
    TcpKeepalive {
        keepalive_probes: probes.map(|p| u32_value(u32::try_from(p).unwrap_or(u32::MAX))),
        keepalive_time: seconds("time"),
        keepalive_interval: seconds("interval"),
    }
}

/// `envoy.extensions.upstreams.http.v3.HttpProtocolOptions` for the cluster, when it needs any.
fn http_protocol_options(pool: Option<&ConnectionPoolSettings>, protocol: Protocol) -> Option<Any> {
    let tcp = pool.and_then(|p| p.tcp.as_ref());
    let http = pool.and_then(|p| p.http.as_ref());
    let upgrade = http.and_then(|h| h.h2_upgrade_policy.as_deref()) == Some("UPGRADE");
    let http2 = protocol.is_http2() || upgrade;
    let common = HttpProtocolOptions {
        idle_timeout: http.and_then(|h| h.idle_timeout).or(tcp.and_then(|t| t.idle_timeout)).map(|d| duration(d.0)),
        max_requests_per_connection: http
            .and_then(|h| h.max_requests_per_connection)
            .filter(|v| *v > 0)
            .map(|v| u32_value(clamp_u32(v))),
        max_connection_duration: tcp.and_then(|t| t.max_connection_duration).map(|d| duration(d.0)),
        ..Default::default()
    };
    let use_client_protocol = http.and_then(|h| h.use_client_protocol).unwrap_or(false);
    if !http2 && !use_client_protocol && common == HttpProtocolOptions::default() {
        return None;
    }
    let h2 = || Http2ProtocolOptions {
        max_concurrent_streams: http
            .and_then(|h| h.max_concurrent_streams)
            .filter(|v| *v > 0)
            .map(|v| u32_value(clamp_u32(v))),
        ..Default::default()
    };
    let upstream = if use_client_protocol {
        UpstreamProtocolOptions::UseDownstreamProtocolConfig(UseDownstreamHttpConfig {
            http_protocol_options: Some(Http1ProtocolOptions::default()),
            http2_protocol_options: Some(h2()),
            ..Default::default()
        })
    } else {
        // The protocol oneof is required by Envoy even when only common options are set.
        let config = if http2 {
            ProtocolConfig::Http2ProtocolOptions(h2())
        } else {
            ProtocolConfig::HttpProtocolOptions(Http1ProtocolOptions::default())
        };
        UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig { protocol_config: Some(config) })
    };
    let options = UpstreamHttpOptions {
        common_http_protocol_options: (common != HttpProtocolOptions::default()).then_some(common),
        upstream_protocol_options: Some(upstream),
        ..Default::default()
    };
    Some(any(options))
}

fn apply_outlier_detection(cluster: &mut Cluster, outlier: &OutlierDetection) {
    // Enforcement is all-or-nothing in Istio: 100% when a threshold is set above zero.
    let enforcing = |v: u32| u32_value(if v > 0 { 100 } else { 0 });
    let mut out = EnvoyOutlier {
        // Success-rate ejection stays off, as in Istio.
        enforcing_success_rate: Some(u32_value(0)),
        consecutive_5xx: outlier.consecutive_5xx_errors.map(u32_value),
        enforcing_consecutive_5xx: outlier.consecutive_5xx_errors.map(enforcing),
        consecutive_gateway_failure: outlier.consecutive_gateway_errors.map(u32_value),
        enforcing_consecutive_gateway_failure: outlier.consecutive_gateway_errors.map(enforcing),
        interval: outlier.interval.map(|d| duration(d.0)),
        base_ejection_time: outlier.base_ejection_time.map(|d| duration(d.0)),
        max_ejection_percent: outlier.max_ejection_percent.filter(|p| *p > 0).map(|p| u32_value(clamp_u32(p))),
        ..Default::default()
    };
    if outlier.split_external_local_origin_errors == Some(true) {
        out.split_external_local_origin_errors = true;
        if let Some(n) = outlier.consecutive_local_origin_failures.filter(|n| *n > 0) {
            out.consecutive_local_origin_failure = Some(u32_value(n));
            out.enforcing_consecutive_local_origin_failure = Some(u32_value(100));
        }
        out.enforcing_local_origin_success_rate = Some(u32_value(0));
    }
    cluster.outlier_detection = Some(out);
    // Istio sets the panic threshold even when 0, disabling Envoy's 50% default.
    let min_health = f64::from(outlier.min_health_percent.unwrap_or(0).max(0));
    let common = cluster.common_lb_config.get_or_insert_with(Default::default);
    common.healthy_panic_threshold = Some(EnvoyPercent { value: min_health });
}

fn apply_load_balancer(cluster: &mut Cluster, lb: Option<&LoadBalancerSettings>) {
    if cluster.cluster_discovery_type
        == Some(cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::OriginalDst as i32))
    {
        cluster.lb_policy = cluster::LbPolicy::ClusterProvided as i32;
        return;
    }
    let slow_start = lb.and_then(|l| l.warmup_duration_secs.or(l.warmup.as_ref().and_then(|w| w.duration)));
    let slow_start_config =
        slow_start.map(|d| cluster::SlowStartConfig { slow_start_window: Some(duration(d.0)), ..Default::default() });
    match lb.and_then(|l| l.simple) {
        Some(SimpleLb::Random) => cluster.lb_policy = cluster::LbPolicy::Random as i32,
        Some(SimpleLb::RoundRobin) => {
            cluster.lb_policy = cluster::LbPolicy::RoundRobin as i32;
            cluster.lb_config = slow_start_config.map(|s| {
                cluster::LbConfig::RoundRobinLbConfig(cluster::RoundRobinLbConfig { slow_start_config: Some(s) })
            });
        }
        Some(SimpleLb::Passthrough) => {
            cluster.cluster_discovery_type =
                Some(cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::OriginalDst as i32));
            cluster.eds_cluster_config = None;
            cluster.load_assignment = None;
            cluster.lb_policy = cluster::LbPolicy::ClusterProvided as i32;
            return;
        }
        // Istio's default (and LEAST_CONN, its deprecated alias) is least request.
        _ => {
            cluster.lb_policy = cluster::LbPolicy::LeastRequest as i32;
            cluster.lb_config = slow_start_config.map(|s| {
                cluster::LbConfig::LeastRequestLbConfig(cluster::LeastRequestLbConfig {
                    slow_start_config: Some(s),
                    ..Default::default()
                })
            });
        }
    }
    if let Some(hash) = lb.and_then(|l| l.consistent_hash.as_ref()) {
        if let Some(maglev) = &hash.maglev {
            cluster.lb_policy = cluster::LbPolicy::Maglev as i32;
            cluster.lb_config = maglev.table_size.filter(|t| *t > 0).map(|t| {
                cluster::LbConfig::MaglevLbConfig(cluster::MaglevLbConfig {
                    table_size: Some(UInt64Value { value: t }),
                })
            });
        } else {
            let size = hash.ring_hash.as_ref().and_then(|r| r.minimum_ring_size).or(hash.minimum_ring_size);
            cluster.lb_policy = cluster::LbPolicy::RingHash as i32;
            cluster.lb_config = Some(cluster::LbConfig::RingHashLbConfig(cluster::RingHashLbConfig {
                minimum_ring_size: Some(UInt64Value { value: size.filter(|s| *s > 0).unwrap_or(1024) }),
                ..Default::default()
            }));
        }
    }
}
