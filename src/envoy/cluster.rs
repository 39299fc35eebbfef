//! CDS: one cluster per visible service port (and DestinationRule subset), plus Istio's
//! `BlackHoleCluster` and `PassthroughCluster`.

use std::collections::HashMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::cluster::common_lb_config::LocalityConfigSpecifier;
use envoy_types::pb::envoy::config::cluster::v3::{cluster, Cluster};
use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::extensions::network::dns_resolver::cares::v3::CaresDnsResolverConfig;

use super::auto_mtls::{auto_mtls_matches, service_sans};
use super::endpoint::{assignment, locality_endpoints};
use super::locality_lb;
use super::names::{self, BLACKHOLE_CLUSTER, PASSTHROUGH_CLUSTER};
use super::outbound_clusters::{outbound_clusters, OutboundCluster};
use super::proto::{ads_config_source, any, duration, resource, u32_value};
use super::resource::Resource;
use super::scope::Scope;
use super::tls::{upstream_transport_socket, Upstream};
use super::traffic_policy::{self, alt_stat_name, Policy};
use crate::config::api::Protocol;
use crate::envoy::ProxyKind;
use crate::registry::{Endpoint, Resolution, Service};

/// All clusters of the view.
pub(super) fn clusters(scope: &Scope<'_>) -> Vec<Resource> {
    // A service's identities are the same for all its ports and subsets: read its endpoints once.
    let mut sans: HashMap<*const Service, Vec<String>> = HashMap::new();
    let mut out: Vec<Resource> = outbound_clusters(scope)
        .iter()
        .map(|c| {
            let sans = sans.entry(Arc::as_ptr(c.service)).or_insert_with(|| service_sans(scope, c.service));
            resource(c.name.clone(), outbound_cluster(scope, c, sans))
        })
        .collect();
    out.push(resource(BLACKHOLE_CLUSTER, blackhole_cluster(scope)));
    // Gateways have no original-destination listeners, so istiod sends them no passthrough.
    if scope.view.kind == ProxyKind::Sidecar {
        out.push(resource(PASSTHROUGH_CLUSTER, passthrough_cluster(scope)));
    }
    out.extend(super::inbound_cluster::clusters(scope));
    out
}

fn outbound_cluster(scope: &Scope<'_>, oc: &OutboundCluster<'_>, sans: &[String]) -> Cluster {
    let mesh = &scope.snapshot.mesh;
    let mut c = Cluster { name: oc.name.clone(), alt_stat_name: alt_stat_name(&oc.name), ..Default::default() };
    match oc.service.resolution {
        _ if oc.eds => {
            c.cluster_discovery_type = Some(discovery(cluster::DiscoveryType::Eds));
            c.eds_cluster_config = Some(cluster::EdsClusterConfig {
                eds_config: Some(ads_config_source()),
                service_name: oc.name.clone(),
            });
        }
        Resolution::Dns | Resolution::DnsRoundRobin => {
            let logical = oc.service.resolution == Resolution::DnsRoundRobin;
            let kind = if logical { cluster::DiscoveryType::LogicalDns } else { cluster::DiscoveryType::StrictDns };
            c.cluster_discovery_type = Some(discovery(kind));
            set_dns_resolution(&mut c, scope);
            c.load_assignment = Some(dns_assignment(scope, oc, logical));
        }
        Resolution::Passthrough => c.cluster_discovery_type = Some(discovery(cluster::DiscoveryType::OriginalDst)),
        Resolution::Static | Resolution::Alias => {}
    }
    let policy = Policy::effective(oc.rule, oc.subset, oc.port.number);
    traffic_policy::apply(&mut c, &policy, oc.port.protocol, mesh);
    traffic_policy::disable_panic_mode_by_default(&mut c);
    let locality = policy.load_balancer.and_then(|lb| lb.locality_lb_setting.as_ref());
    if locality_lb::weighs_localities(locality_lb::effective(locality, mesh), policy.outlier_detection.is_some()) {
        let common = c.common_lb_config.get_or_insert_with(Default::default);
        common.locality_config_specifier = Some(LocalityConfigSpecifier::LocalityWeightedLbConfig(Default::default()));
    }
    if oc.port.protocol == Protocol::Unsupported && scope.view.kind == ProxyKind::Sidecar {
        // A sniffed port's HTTP goes upstream as the client sent it (HTTP/1.1 or h2c), as in
        // Istio; gateways do not sniff.
        traffic_policy::use_downstream_protocol(&mut c);
    }
    let dns = matches!(oc.service.resolution, Resolution::Dns | Resolution::DnsRoundRobin);
    let upstream = Upstream {
        default_sni: dns.then_some(oc.service.hostname.as_str()),
        istio_sni: istio_sni(oc),
        service_sans: sans.to_vec(),
        http2: oc.port.protocol.is_http2() || h2_upgrade(&policy),
    };
    // An SNI-DNAT cluster forwards the client's TLS as it came (AUTO_PASSTHROUGH): none of its own.
    match policy.tls {
        _ if oc.sni_dnat => {}
        Some(tls) => c.transport_socket = upstream_transport_socket(tls, &upstream),
        None => c.transport_socket_matches = auto_mtls_matches(scope, oc.service, &upstream),
    }
    c
}

/// Istio's ISTIO_MUTUAL SNI, which the server side's (gateway AUTO_PASSTHROUGH) routing reads.
fn istio_sni(oc: &OutboundCluster<'_>) -> String {
    let subset = oc.subset.map(|s| s.name.as_str()).unwrap_or_default();
    names::istio_sni(oc.port.number, subset, oc.service.hostname.as_str())
}

fn h2_upgrade(policy: &Policy<'_>) -> bool {
    let http = policy.connection_pool.and_then(|p| p.http.as_ref());
    http.and_then(|h| h.h2_upgrade_policy.as_deref()) == Some("UPGRADE")
}

/// Endpoints Envoy resolves itself: the registry's endpoint addresses, or the service host when
/// there are none. LOGICAL_DNS clusters take exactly one.
fn dns_assignment(scope: &Scope<'_>, oc: &OutboundCluster<'_>, logical: bool) -> ClusterLoadAssignment {
    let mut cla = assignment(scope, oc, |_| true);
    if logical {
        cla.endpoints.truncate(1);
        if let Some(locality) = cla.endpoints.first_mut() {
            locality.lb_endpoints.truncate(1);
            locality.load_balancing_weight = None;
        }
    }
    let empty = cla.endpoints.iter().all(|l| l.lb_endpoints.is_empty());
    let registry_empty = scope.snapshot.endpoints(oc.service).is_none_or(|e| e.is_empty());
    if empty && (registry_empty || logical) {
        let host = Endpoint::at(oc.service.hostname.to_string());
        let port = oc.port.target_port.unwrap_or(oc.port.number);
        cla.endpoints = vec![locality_endpoints("", &[(&host, port)])];
    }
    // istiod writes an empty locality where the endpoints have none.
    for group in &mut cla.endpoints {
        group.locality.get_or_insert_with(Default::default);
    }
    cla
}

fn blackhole_cluster(scope: &Scope<'_>) -> Cluster {
    Cluster {
        name: BLACKHOLE_CLUSTER.to_string(),
        alt_stat_name: alt_stat_name(BLACKHOLE_CLUSTER),
        cluster_discovery_type: Some(discovery(cluster::DiscoveryType::Static)),
        connect_timeout: Some(duration(scope.snapshot.mesh.connect_timeout.as_std())),
        ..Default::default()
    }
}

fn passthrough_cluster(scope: &Scope<'_>) -> Cluster {
    let mut c = Cluster {
        name: PASSTHROUGH_CLUSTER.to_string(),
        alt_stat_name: alt_stat_name(PASSTHROUGH_CLUSTER),
        cluster_discovery_type: Some(discovery(cluster::DiscoveryType::OriginalDst)),
        ..Default::default()
    };
    traffic_policy::apply(&mut c, &Policy::default(), Protocol::Tcp, &scope.snapshot.mesh);
    traffic_policy::passthrough_http_options(&mut c);
    c
}

/// Envoy's DNS cluster extension (the STRICT_DNS / LOGICAL_DNS types' replacement, whose
/// refresh settings on the cluster are deprecated): IPv4 answers, refreshed at the mesh's rate or
/// the records' TTL.
/// How Envoy resolves a DNS cluster, as istiod sets it: the cluster's own (deprecated) DNS
/// fields rather than the DNS cluster extension, IPv4 only, the mesh's refresh rate bounded by
/// the records' TTL with 100ms of jitter, and c-ares sending at most 100 queries per UDP port.
#[allow(deprecated)]
fn set_dns_resolution(c: &mut Cluster, scope: &Scope<'_>) {
    c.dns_lookup_family = cluster::DnsLookupFamily::V4Only as i32;
    c.dns_refresh_rate = Some(duration(scope.snapshot.mesh.dns_refresh_rate.as_std()));
    c.respect_dns_ttl = true;
    c.dns_jitter = Some(duration(DNS_JITTER));
    let cares =
        CaresDnsResolverConfig { udp_max_queries: Some(u32_value(CARES_UDP_MAX_QUERIES)), ..Default::default() };
    c.typed_dns_resolver_config =
        Some(TypedExtensionConfig { name: CARES_RESOLVER.to_string(), typed_config: Some(any(cares)) });
}

/// istiod's jitter of DNS refreshes (`PILOT_DNS_JITTER_DURATION`).
const DNS_JITTER: std::time::Duration = std::time::Duration::from_millis(100);
/// istiod's bound on c-ares queries per UDP port (`PILOT_DNS_CARES_UDP_MAX_QUERIES`).
const CARES_UDP_MAX_QUERIES: u32 = 100;
/// Envoy's c-ares DNS resolver extension.
const CARES_RESOLVER: &str = "envoy.network.dns_resolver.cares";

fn discovery(kind: cluster::DiscoveryType) -> cluster::ClusterDiscoveryType {
    cluster::ClusterDiscoveryType::Type(kind as i32)
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::transport_socket;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
        http_protocol_options::{explicit_http_config::ProtocolConfig, UpstreamProtocolOptions},
        HttpProtocolOptions,
    };

    use super::*;
    use crate::envoy::names::ext;
    use crate::envoy::testing::{find, names, sidecar, testdata_snapshot, unpack};
    use crate::envoy::TypeUrl;

    fn bookinfo(name: &str) -> Cluster {
        let s = testdata_snapshot("bookinfo.yaml");
        find(&s, &sidecar("bookinfo", &[("app", "productpage")]), TypeUrl::Cluster, name)
    }

    fn features(name: &str) -> Cluster {
        let s = testdata_snapshot("features.yaml");
        find(&s, &sidecar("shop", &[("app", "web")]), TypeUrl::Cluster, name)
    }

    fn lb(c: &Cluster) -> cluster::LbPolicy {
        cluster::LbPolicy::try_from(c.lb_policy).expect("known lb policy")
    }

    #[test]
    fn static_services_are_eds_clusters_named_after_themselves() {
        let c = bookinfo("outbound|9080||details.bookinfo.svc.cluster.local");
        assert_eq!(c.cluster_discovery_type, Some(discovery(cluster::DiscoveryType::Eds)));
        let eds = c.eds_cluster_config.clone().expect("eds config");
        assert_eq!(eds.service_name, c.name);
        assert_eq!(eds.eds_config, Some(ads_config_source()));
        assert_eq!(lb(&c), cluster::LbPolicy::LeastRequest, "Istio's default");
        assert_eq!(c.connect_timeout.map(|d| d.seconds), Some(10), "mesh default");
    }

    #[test]
    fn subsets_inherit_the_rule_policy_and_override_it() {
        let v1 = bookinfo("outbound|9080|v1|reviews.bookinfo.svc.cluster.local");
        assert_eq!(lb(&v1), cluster::LbPolicy::RoundRobin);
        assert_eq!(v1.connect_timeout.map(|d| d.seconds), Some(3), "tcp.connectTimeout");
        let thresholds = &v1.circuit_breakers.as_ref().expect("limits").thresholds[0];
        assert_eq!(thresholds.max_connections.map(|v| v.value), Some(100));
        assert_eq!(thresholds.max_pending_requests.map(|v| v.value), Some(10));
        assert_eq!(thresholds.max_requests.map(|v| v.value), Some(u32::MAX));
        let outlier = v1.outlier_detection.as_ref().expect("outlier detection");
        assert_eq!(outlier.consecutive_5xx.map(|v| v.value), Some(5));
        assert_eq!(outlier.enforcing_consecutive_5xx.map(|v| v.value), Some(100));
        let keepalive =
            v1.upstream_connection_options.as_ref().and_then(|o| o.tcp_keepalive.as_ref()).expect("keepalive");
        assert_eq!(keepalive.keepalive_time.map(|v| v.value), Some(7200));
        assert_eq!(keepalive.keepalive_interval.map(|v| v.value), Some(75));
        assert_eq!(keepalive.keepalive_probes, None, "the system's count");
        let v3 = bookinfo("outbound|9080|v3|reviews.bookinfo.svc.cluster.local");
        assert_eq!(lb(&v3), cluster::LbPolicy::Random, "the subset's own load balancer");
    }

    #[test]
    fn connection_pool_http_settings_go_in_protocol_options() {
        let c = bookinfo("outbound|9080||reviews.bookinfo.svc.cluster.local");
        let options: HttpProtocolOptions = unpack(&c.typed_extension_protocol_options[ext::HTTP_PROTOCOL_OPTIONS]);
        let common = options.common_http_protocol_options.expect("common options");
        assert_eq!(common.max_requests_per_connection.map(|v| v.value), Some(5));
        assert_eq!(common.idle_timeout.map(|d| d.seconds), Some(30));
        let Some(UpstreamProtocolOptions::ExplicitHttpConfig(explicit)) = options.upstream_protocol_options else {
            panic!("explicit protocol expected")
        };
        assert!(matches!(explicit.protocol_config, Some(ProtocolConfig::HttpProtocolOptions(_))));
    }

    #[test]
    fn grpc_ports_and_upgrade_policy_get_http2() {
        let c = features("outbound|9090||web.shop.svc.cluster.local");
        let options: HttpProtocolOptions = unpack(&c.typed_extension_protocol_options[ext::HTTP_PROTOCOL_OPTIONS]);
        let Some(UpstreamProtocolOptions::ExplicitHttpConfig(explicit)) = options.upstream_protocol_options else {
            panic!("explicit protocol expected")
        };
        let Some(ProtocolConfig::Http2ProtocolOptions(h2)) = explicit.protocol_config else { panic!("http2 expected") };
        // Port 9090's own settings replace the rule's wholesale: maglev, and no connection pool.
        assert_eq!(h2.max_concurrent_streams, None);
        assert_eq!(lb(&c), cluster::LbPolicy::Maglev);
        let http = features("outbound|8080||web.shop.svc.cluster.local");
        assert_eq!(lb(&http), cluster::LbPolicy::RingHash);
        assert!(http.typed_extension_protocol_options.contains_key(ext::HTTP_PROTOCOL_OPTIONS), "UPGRADE policy");
    }

    #[test]
    #[allow(deprecated)]
    fn dns_services_are_strict_dns_clusters_with_endpoint_hostnames() {
        let c = features("outbound|443||api.partner.example");
        assert_eq!(c.cluster_discovery_type, Some(discovery(cluster::DiscoveryType::StrictDns)));
        assert!(c.respect_dns_ttl, "istiod's DNS fields");
        assert_eq!(c.dns_lookup_family, cluster::DnsLookupFamily::V4Only as i32);
        assert_eq!(c.typed_dns_resolver_config.as_ref().map(|t| t.name.as_str()), Some(CARES_RESOLVER));
        let la = c.load_assignment.expect("load assignment");
        assert_eq!(la.endpoints[0].lb_endpoints.len(), 2);
        let subset = features("outbound|443|pool-a|api.partner.example");
        assert_eq!(subset.load_assignment.expect("load assignment").endpoints[0].lb_endpoints.len(), 1);
    }

    #[test]
    fn mutual_tls_names_its_files_as_sds_secrets_and_uses_the_dns_host_as_sni() {
        let c = features("outbound|443||api.partner.example");
        let socket = c.transport_socket.expect("tls");
        assert_eq!(socket.name, ext::TLS_TRANSPORT_SOCKET);
        let Some(transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type else { panic!() };
        let tls: UpstreamTlsContext = unpack(any);
        assert_eq!(tls.sni, "api.partner.example");
        let common = tls.common_tls_context.expect("common");
        assert!(common.tls_certificates.is_empty(), "no file paths in the resource");
        let cert = &common.tls_certificate_sds_secret_configs[0];
        assert!(
            cert.name.starts_with("file-cert:") && cert.name.contains("tls.crt~") && cert.name.ends_with("tls.key")
        );
        let validation = format!("{:?}", common.validation_context_type);
        assert!(validation.contains("file-root:") && validation.contains("sds-grpc"), "{validation}");
        assert!(validation.contains("spiffe://partner/api"), "SANs kept: {validation}");
    }

    #[test]
    fn resolution_none_is_original_dst() {
        let c = features("outbound|7000||*.wild.example");
        assert_eq!(c.cluster_discovery_type, Some(discovery(cluster::DiscoveryType::OriginalDst)));
        assert_eq!(lb(&c), cluster::LbPolicy::ClusterProvided);
    }

    #[test]
    fn catch_all_clusters_and_sorted_names() {
        let s = testdata_snapshot("bookinfo.yaml");
        let all = names(&s, &sidecar("bookinfo", &[]), TypeUrl::Cluster);
        assert!(all.contains(&BLACKHOLE_CLUSTER.to_string()) && all.contains(&PASSTHROUGH_CLUSTER.to_string()));
        let mut sorted = all.clone();
        sorted.sort();
        assert_eq!(all, sorted);
        let passthrough = bookinfo(PASSTHROUGH_CLUSTER);
        assert_eq!(lb(&passthrough), cluster::LbPolicy::ClusterProvided);
        let options: HttpProtocolOptions =
            unpack(&passthrough.typed_extension_protocol_options[ext::HTTP_PROTOCOL_OPTIONS]);
        let idle = options.common_http_protocol_options.and_then(|c| c.idle_timeout).map(|d| d.seconds);
        assert_eq!(idle, Some(300), "istiod's idle timeout");
        assert!(matches!(
            options.upstream_protocol_options,
            Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(_))
        ));
    }

    #[test]
    fn sniffed_ports_speak_the_clients_protocol_upstream() {
        let s = testdata_snapshot("inbound.yaml");
        let c: Cluster =
            find(&s, &sidecar("shop", &[]), TypeUrl::Cluster, "outbound|9000||orders.shop.svc.cluster.local");
        let options: HttpProtocolOptions = unpack(&c.typed_extension_protocol_options[ext::HTTP_PROTOCOL_OPTIONS]);
        assert!(matches!(
            options.upstream_protocol_options,
            Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(_))
        ));
        let tcp: Cluster =
            find(&s, &sidecar("shop", &[]), TypeUrl::Cluster, "outbound|5432||orders.shop.svc.cluster.local");
        assert!(tcp.typed_extension_protocol_options.is_empty(), "declared TCP: no HTTP options");
    }
}
