//! A sidecar's inbound clusters (CDS): `inbound|PORT||` per inbound port and
//! `InboundPassthroughCluster`. As in current Istio (inbound traffic policy PASSTHROUGH), an
//! inbound cluster forwards to the connection's original destination — the workload's IP and
//! target port — from 127.0.0.6, a source iptables does not redirect again; a Sidecar ingress
//! `defaultEndpoint` names a fixed address instead.

use envoy_types::pb::envoy::config::cluster::v3::{cluster, Cluster};
use envoy_types::pb::envoy::config::core::v3::{socket_address, BindConfig, SocketAddress};
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, LbEndpoint, LocalityLbEndpoints};
use envoy_types::pb::google::protobuf::Duration;

use super::endpoint::lb_endpoint;
use super::inbound::{inbound_plan, InboundChain, InboundEndpoint};
use super::names::{inbound_cluster_name, INBOUND_PASSTHROUGH_BIND, INBOUND_PASSTHROUGH_CLUSTER, PASSTHROUGH_CLUSTER};
use super::proto::resource;
use super::resource::Resource;
use super::scope::Scope;
use super::traffic_policy::{self, alt_stat_name, use_downstream_protocol, Policy};
use crate::config::api::Protocol;
use crate::envoy::ProxyKind;

/// Istio never cleans up inbound original-destination hosts: the longest interval Envoy takes
/// (its nanosecond count must fit an i64), about 292 years.
const NO_CLEANUP_SECONDS: i64 = (i64::MAX - 999_999_999) / 1_000_000_000;

/// The inbound clusters of a sidecar (none for gateways).
pub(super) fn clusters(scope: &Scope<'_>) -> Vec<Resource> {
    if scope.view.kind != ProxyKind::Sidecar {
        return Vec::new();
    }
    let mut out: Vec<Resource> = inbound_plan(scope)
        .iter()
        .map(|c| resource(inbound_cluster_name(c.target_port), inbound_cluster(scope, c)))
        .collect();
    out.push(resource(INBOUND_PASSTHROUGH_CLUSTER, passthrough_cluster(scope)));
    out
}

fn inbound_cluster(scope: &Scope<'_>, c: &InboundChain) -> Cluster {
    let name = inbound_cluster_name(c.target_port);
    let mut cl = Cluster { name: name.clone(), alt_stat_name: alt_stat_name(&name), ..Default::default() };
    match &c.endpoint {
        InboundEndpoint::OriginalDst => {
            cl.cluster_discovery_type = Some(discovery(cluster::DiscoveryType::OriginalDst));
            cl.cleanup_interval = Some(Duration { seconds: NO_CLEANUP_SECONDS, nanos: 0 });
            cl.upstream_bind_config = Some(passthrough_bind());
        }
        InboundEndpoint::Address(ip, port) => {
            cl.cluster_discovery_type = Some(discovery(cluster::DiscoveryType::Static));
            cl.load_assignment = Some(assignment(&name, ip, *port));
            // Only loopback escapes iptables by itself; the workload's own IP needs the magic source.
            if ip != "127.0.0.1" && ip != "::1" {
                cl.upstream_bind_config = Some(passthrough_bind());
            }
        }
        InboundEndpoint::Unix(path) => {
            cl.cluster_discovery_type = Some(discovery(cluster::DiscoveryType::Static));
            cl.load_assignment = Some(assignment(&name, &format!("unix://{path}"), 0));
        }
    }
    // Receivers need capacity for what their callers send: the service's DestinationRule pool
    // (its port's, else the rule's) applies here, and the Sidecar's inbound pool overrides it.
    let sidecar_pool = scope.sidecar.and_then(|s| s.inbound_connection_pool(c.target_port));
    let rule = c.service.as_ref().and_then(|key| {
        let service = scope.snapshot.registry.services.get(key)?;
        scope.inbound_destination_rule(service)
    });
    let rule_pool = Policy::effective(rule, None, c.port).connection_pool;
    // Only the pool: load balancing, outlier detection and TLS are the callers' business.
    let policy = Policy { connection_pool: sidecar_pool.as_ref().or(rule_pool), ..Policy::default() };
    traffic_policy::apply(&mut cl, &policy, c.protocol, &scope.snapshot.mesh);
    // As istiod builds inbound clusters: an empty common LB config, and Envoy's default policy
    // (round robin) where the cluster picks endpoints itself.
    cl.common_lb_config.get_or_insert_with(Default::default);
    if !matches!(c.endpoint, InboundEndpoint::OriginalDst) {
        cl.lb_policy = cluster::LbPolicy::RoundRobin as i32;
    }
    if c.protocol == Protocol::Unsupported {
        // Sniffed HTTP goes upstream as it came: HTTP/1.1 or h2c.
        use_downstream_protocol(&mut cl);
    }
    cl
}

fn passthrough_cluster(scope: &Scope<'_>) -> Cluster {
    let mut c = Cluster {
        name: INBOUND_PASSTHROUGH_CLUSTER.to_string(),
        // istiod builds it as the outbound passthrough cluster renamed: its statistics too.
        alt_stat_name: alt_stat_name(PASSTHROUGH_CLUSTER),
        cluster_discovery_type: Some(discovery(cluster::DiscoveryType::OriginalDst)),
        upstream_bind_config: Some(passthrough_bind()),
        ..Default::default()
    };
    traffic_policy::apply(&mut c, &Policy::default(), Protocol::Unsupported, &scope.snapshot.mesh);
    traffic_policy::passthrough_http_options(&mut c);
    c
}

fn passthrough_bind() -> BindConfig {
    BindConfig {
        source_address: Some(SocketAddress {
            address: INBOUND_PASSTHROUGH_BIND.to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(0)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn assignment(name: &str, address: &str, port: u16) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: name.to_string(),
        endpoints: vec![LocalityLbEndpoints {
            // No weight: istiod sets none on the workload's own endpoint.
            lb_endpoints: vec![LbEndpoint { load_balancing_weight: None, ..lb_endpoint(address, port, 1) }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn discovery(kind: cluster::DiscoveryType) -> cluster::ClusterDiscoveryType {
    cluster::ClusterDiscoveryType::Type(kind as i32)
}
