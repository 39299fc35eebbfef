//! EDS: one ClusterLoadAssignment per EDS cluster, endpoints grouped by locality.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use envoy_types::pb::envoy::config::core::v3::{HealthStatus, Locality};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint as EnvoyEndpoint, LbEndpoint, LocalityLbEndpoints,
};

use super::auto_mtls::endpoint_metadata;
use super::locality_lb::{self, Client, Group};
use super::outbound_clusters::{outbound_clusters, outbound_clusters_of, OutboundCluster};
use super::proto::{resource, socket_address, u32_value};
use super::resource::Resource;
use super::scope::Scope;
use super::traffic_policy::Policy;
use crate::registry::{Endpoint, EndpointHealth, Hostname};

/// Every load assignment the proxy's EDS clusters need, including empty ones: Envoy keeps an EDS
/// cluster warming until its assignment arrives.
pub(super) fn load_assignments(scope: &Scope<'_>) -> Vec<Resource> {
    assignments_of(scope, &outbound_clusters(scope))
}

/// [`load_assignments`] of the services of `hosts` alone.
pub(super) fn load_assignments_of(scope: &Scope<'_>, hosts: &BTreeSet<Hostname>) -> Vec<Resource> {
    assignments_of(scope, &outbound_clusters_of(scope, scope.imported_services_of(hosts)))
}

fn assignments_of(scope: &Scope<'_>, clusters: &[OutboundCluster<'_>]) -> Vec<Resource> {
    clusters.iter().filter(|c| c.eds).map(|c| resource(c.name.clone(), assignment(scope, c, is_ip_or_socket))).collect()
}

/// The endpoints of one cluster (subset applied), keeping those `keep` accepts and that serve the
/// cluster's port. Health follows Istio: terminating endpoints are never sent; not-ready ones are
/// sent as UNHEALTHY (so Envoy counts them in the healthy percentage) unless outlier detection's
/// `minHealthPercent` would make Envoy route to them in panic mode.
pub(super) fn assignment(
    scope: &Scope<'_>,
    cluster: &OutboundCluster<'_>,
    keep: fn(&Endpoint) -> bool,
) -> ClusterLoadAssignment {
    let endpoints = scope.snapshot.endpoints(cluster.service);
    let policy = Policy::effective(cluster.rule, cluster.subset, cluster.port.number);
    let panic_threshold = policy.outlier_detection.and_then(|o| o.min_health_percent).is_some_and(|p| p > 0);
    let selected = endpoints
        .map(|e| e.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(|e| keep(e))
        .filter(|e| match e.health {
            EndpointHealth::Healthy | EndpointHealth::Draining => true,
            EndpointHealth::Unhealthy => !panic_threshold,
            EndpointHealth::Terminating => false,
        })
        .filter(|e| cluster.subset.is_none_or(|s| e.matches(&s.labels)))
        .filter_map(|e| Some((e, e.port_for(cluster.port)?)));
    let mut by_locality: BTreeMap<&str, Vec<(&Endpoint, u16)>> = BTreeMap::new();
    for (endpoint, port) in selected {
        by_locality.entry(&*endpoint.locality).or_default().push((endpoint, port));
    }
    let groups = by_locality
        .into_iter()
        .map(|(locality, endpoints)| {
            let sources = endpoints.iter().map(|(e, _)| *e).collect();
            let group = (locality_endpoints(locality, &endpoints), sources);
            if cluster.sni_dnat {
                mutual_tls_only(group)
            } else {
                group
            }
        })
        .collect();
    // Relative to the proxy receiving them, as istiod does (the view carries its locality).
    let setting = locality_lb::effective(
        policy.load_balancer.and_then(|lb| lb.locality_lb_setting.as_ref()),
        &scope.snapshot.mesh,
    );
    let client = Client { locality: &scope.view.locality, labels: &scope.view.labels };
    let endpoints = locality_lb::apply(groups, setting, policy.outlier_detection.is_some(), client);
    ClusterLoadAssignment { cluster_name: cluster.name.clone(), endpoints, ..Default::default() }
}

/// The endpoints of a group that take Istio's mutual TLS, the only ones an SNI-DNAT cluster may
/// reach (its gateway cannot tell mutual TLS from any TLS it passes through). A group left empty
/// stays, without weight, as istiod sends it.
fn mutual_tls_only((group, sources): Group<'_>) -> Group<'_> {
    let (lb_endpoints, sources): (Vec<LbEndpoint>, Vec<&Endpoint>) =
        group.lb_endpoints.into_iter().zip(sources).filter(|(_, e)| e.istio_mtls).unzip();
    let weight: u32 =
        lb_endpoints.iter().map(|e| e.load_balancing_weight.map_or(0, |w| w.value)).fold(0, u32::saturating_add);
    let group =
        LocalityLbEndpoints { lb_endpoints, load_balancing_weight: (weight > 0).then(|| u32_value(weight)), ..group };
    (group, sources)
}

/// Endpoints of one locality with the port each serves, weighted as their WorkloadEntries say.
pub(super) fn locality_endpoints(locality: &str, endpoints: &[(&Endpoint, u16)]) -> LocalityLbEndpoints {
    let lb_endpoints: Vec<LbEndpoint> = endpoints
        .iter()
        .map(|(e, port)| {
            let mut lb = lb_endpoint(&e.address, *port, e.weight.max(1));
            lb.health_status = health_status(e.health) as i32;
            lb.metadata = endpoint_metadata(e);
            lb
        })
        .collect();
    let total: u32 = endpoints.iter().map(|(e, _)| e.weight.max(1)).fold(0, u32::saturating_add);
    LocalityLbEndpoints {
        locality: parse_locality(locality),
        lb_endpoints,
        load_balancing_weight: Some(u32_value(total.max(1))),
        ..Default::default()
    }
}

/// Envoy's health status of an endpoint; healthy ones stay UNKNOWN, which Envoy treats as healthy
/// (and which keeps ServiceEntry endpoints' output as it always was).
fn health_status(health: EndpointHealth) -> HealthStatus {
    match health {
        EndpointHealth::Healthy => HealthStatus::Unknown,
        EndpointHealth::Unhealthy => HealthStatus::Unhealthy,
        EndpointHealth::Draining => HealthStatus::Draining,
        EndpointHealth::Terminating => HealthStatus::Unhealthy,
    }
}

/// One endpoint at `address:port`.
pub(super) fn lb_endpoint(address: &str, port: u16, weight: u32) -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(HostIdentifier::Endpoint(EnvoyEndpoint {
            address: Some(socket_address(address, u32::from(port))),
            ..Default::default()
        })),
        load_balancing_weight: Some(u32_value(weight)),
        ..Default::default()
    }
}

/// EDS delivers addresses Envoy does not resolve: IPs and unix sockets only (a hostname would be
/// rejected with the whole assignment).
fn is_ip_or_socket(endpoint: &Endpoint) -> bool {
    endpoint.address.starts_with("unix://") || endpoint.address.parse::<IpAddr>().is_ok()
}

fn parse_locality(locality: &str) -> Option<Locality> {
    (!locality.is_empty()).then(|| locality_lb::parse(locality))
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::{address::Address, socket_address::PortSpecifier};

    use super::*;
    use crate::envoy::testing::{find, kube_snapshot, names, router, sidecar, snapshot, testdata_snapshot};
    use crate::envoy::TypeUrl;

    fn assignment_of(file: &str, name: &str) -> ClusterLoadAssignment {
        let s = testdata_snapshot(file);
        find(&s, &sidecar("bookinfo", &[]), TypeUrl::Endpoint, name)
    }

    fn addresses(cla: &ClusterLoadAssignment) -> Vec<(String, u32, u32)> {
        let mut out = Vec::new();
        for e in cla.endpoints.iter().flat_map(|l| &l.lb_endpoints) {
            let Some(HostIdentifier::Endpoint(ep)) = &e.host_identifier else { continue };
            let Some(Address::SocketAddress(sa)) = ep.address.as_ref().and_then(|a| a.address.as_ref()) else {
                continue;
            };
            let Some(PortSpecifier::PortValue(port)) = sa.port_specifier else { continue };
            out.push((sa.address.clone(), port, e.load_balancing_weight.map_or(0, |w| w.value)));
        }
        out
    }

    #[test]
    fn subset_assignment_selects_by_labels() {
        let v2 = assignment_of("bookinfo.yaml", "outbound|9080|v2|reviews.bookinfo.svc.cluster.local");
        assert_eq!(addresses(&v2), [("10.0.0.22".to_string(), 9090, 3)], "targetPort and weight");
        let v3 = assignment_of("bookinfo.yaml", "outbound|9080|v3|reviews.bookinfo.svc.cluster.local");
        assert_eq!(addresses(&v3), [("10.0.0.23".to_string(), 9091, 1)], "the entry's port override");
    }

    #[test]
    fn endpoints_are_grouped_by_locality() {
        let all = assignment_of("bookinfo.yaml", "outbound|9080||reviews.bookinfo.svc.cluster.local");
        let localities: Vec<(String, usize, u32)> = all
            .endpoints
            .iter()
            .map(|l| {
                let loc = l.locality.clone().unwrap_or_default();
                (
                    format!("{}/{}", loc.region, loc.zone),
                    l.lb_endpoints.len(),
                    l.load_balancing_weight.map_or(0, |w| w.value),
                )
            })
            .collect();
        assert_eq!(localities, [("us-east/zone-a".to_string(), 1, 1), ("us-east/zone-b".to_string(), 2, 4)]);
    }

    #[test]
    fn clusters_without_endpoints_get_an_empty_assignment() {
        let s = snapshot(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: empty, namespace: ns}\nspec:\n  \
             hosts: [empty.ns.svc.cluster.local]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  \
             ports: [{number: 80, name: http}]\n",
        );
        let cla: ClusterLoadAssignment =
            find(&s, &sidecar("ns", &[]), TypeUrl::Endpoint, "outbound|80||empty.ns.svc.cluster.local");
        assert!(cla.endpoints.is_empty());
        assert_eq!(cla.cluster_name, "outbound|80||empty.ns.svc.cluster.local");
    }

    #[test]
    fn only_eds_clusters_have_assignments() {
        let s = testdata_snapshot("bookinfo.yaml");
        let all = names(&s, &sidecar("bookinfo", &[]), TypeUrl::Endpoint);
        assert!(!all.iter().any(|n| n.contains("httpbin.org")), "DNS clusters carry their endpoints: {all:?}");
    }

    fn with_health(cla: &ClusterLoadAssignment) -> Vec<(String, u32, i32)> {
        let all = cla.endpoints.iter().flat_map(|l| &l.lb_endpoints);
        addresses(cla).into_iter().zip(all).map(|((a, p, _), e)| (a, p, e.health_status)).collect()
    }

    #[test]
    fn kubernetes_endpoints_carry_health_and_only_the_ports_they_serve() {
        let s = kube_snapshot("");
        let view = sidecar("shop", &[]);
        let http: ClusterLoadAssignment = find(&s, &view, TypeUrl::Endpoint, "outbound|80||web.shop.svc.cluster.local");
        let (healthy, unhealthy) = (HealthStatus::Unknown as i32, HealthStatus::Unhealthy as i32);
        assert_eq!(
            with_health(&http),
            [
                ("10.0.0.1".to_string(), 8080, healthy),
                ("10.0.0.2".to_string(), 8080, unhealthy),
                ("10.0.0.4".to_string(), 8080, healthy)
            ],
            "terminating endpoints are never sent; not-ready ones go as UNHEALTHY"
        );
        let admin: ClusterLoadAssignment =
            find(&s, &view, TypeUrl::Endpoint, "outbound|81||web.shop.svc.cluster.local");
        assert_eq!(addresses(&admin).len(), 2, "10.0.0.4 does not serve `admin`");

        // With a panic threshold, Envoy would route to unhealthy hosts: Istio leaves them out.
        let s = kube_snapshot(
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: web, namespace: shop}\nspec:\n  \
             host: web\n  trafficPolicy: {outlierDetection: {consecutive5xxErrors: 5, minHealthPercent: 50}}\n",
        );
        let http: ClusterLoadAssignment = find(&s, &view, TypeUrl::Endpoint, "outbound|80||web.shop.svc.cluster.local");
        assert_eq!(addresses(&http).iter().map(|a| a.0.as_str()).collect::<Vec<_>>(), ["10.0.0.1", "10.0.0.4"]);
    }

    #[test]
    fn assignments_found_by_host_are_those_of_the_whole_generation() {
        let entry = |name: &str, ns: &str, host: &str, export: &str, ip: &str| {
            format!(
                "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: {ns}}}\n\
                 spec:\n  hosts: [{host}]\n  exportTo: [\"{export}\"]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  \
                 ports: [{{number: 80, name: http}}]\n  endpoints: [{{address: {ip}, labels: {{v: one}}}}]\n---\n"
            )
        };
        let yaml = [
            entry("a", "one", "a.example.com", "*", "10.0.0.1"),
            // The same host declared in `two` too: proxies there reach their own declaration.
            entry("a", "two", "a.example.com", "*", "10.0.0.2"),
            entry("b", "two", "b.example.com", ".", "10.0.0.3"),
            entry("c", "two", "c.example.com", "*", "10.0.0.4"),
            entry("d", "two", "d.example.com", "*", "10.0.0.5"),
            // `one` imports only its own namespace, and reaches c through a route to it.
            "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: default, namespace: one}\n\
             spec: {egress: [{hosts: [\"./*\"]}]}\n---\n"
                .to_string(),
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: a, namespace: one}\n\
             spec: {hosts: [a.example.com], http: [{route: [{destination: {host: c.example.com}}]}]}\n---\n"
                .to_string(),
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: c, namespace: two}\n\
             spec: {host: c.example.com, subsets: [{name: one, labels: {v: one}}]}\n"
                .to_string(),
        ]
        .concat();
        let s = snapshot(&yaml);
        let host_of = |cluster: &str| cluster.rsplit('|').next().unwrap_or_default().to_string();
        for view in [sidecar("one", &[]), sidecar("two", &[]), sidecar("three", &[]), router("two", &[])] {
            let whole = crate::envoy::generate(TypeUrl::Endpoint, &s, &view);
            for hosts in
                [vec!["a.example.com"], vec!["b.example.com", "c.example.com"], vec!["d.example.com", "e.example.com"]]
            {
                let hosts: BTreeSet<Hostname> = hosts.into_iter().map(Hostname::new).collect();
                let expected: Vec<(&str, &[u8])> = whole
                    .iter()
                    .filter(|r| hosts.contains(&Hostname::new(&host_of(&r.name))))
                    .map(|r| (r.name.as_str(), r.body.value.as_slice()))
                    .collect();
                let found = crate::envoy::generate_endpoints_of(&s, &view, &hosts);
                let found: Vec<(&str, &[u8])> =
                    found.iter().map(|r| (r.name.as_str(), r.body.value.as_slice())).collect();
                assert_eq!(found, expected, "{view} {hosts:?}");
            }
        }
        // The cases above are not vacuous: `one` reaches c by the route alone, and not b.
        let one = names(&s, &sidecar("one", &[]), TypeUrl::Endpoint);
        assert!(
            one.iter().any(|n| n.ends_with("|one|c.example.com")) && !one.iter().any(|n| n.ends_with("b.example.com")),
            "{one:?}"
        );
    }
}
