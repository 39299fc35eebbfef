//! Sidecar RDS: route configuration `PORT` for each outbound HTTP listener — a virtual host per
//! service on the port (VirtualService routes, else the default route), virtual hosts for
//! VirtualService hosts that are not services, and Istio's catch-all virtual host.
//!
//! VirtualService hosts that name no service get virtual hosts where Istio puts them: port 80, and
//! ports where the VirtualService also routes a service.

use std::collections::{HashMap, HashSet};

use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost};
use envoy_types::pb::google::protobuf::Any;

use super::http_match::RouteContext;
use super::http_route::{default_route, virtual_service_routes};
use super::names::domain_name;
use super::outbound_plan::{outbound_plan, services_on_port, ListenerProtocol, OutboundListener};
use super::proto::{bool_value, resource, u32_value};
use super::resource::Resource;
use super::route_splice::replace_routes;
use super::scope::{Scope, VsRef};
use super::virtual_host::{catch_all, host_domains, service_domains, VirtualHosts};
use crate::config::ConfigKey;
use crate::registry::{host_matches, Service};

/// Envoy's limit for direct response bodies is 4 KiB; Istio raises it to 1 MiB.
pub(super) const MAX_DIRECT_RESPONSE_BODY: u32 = 1024 * 1024;

/// One route configuration per outbound HTTP listener port.
pub(super) fn route_configs(scope: &Scope<'_>) -> Vec<Resource> {
    outbound_plan(scope)
        .iter()
        .filter(|l| matches!(l.protocol, ListenerProtocol::Http | ListenerProtocol::Auto))
        .map(|l| resource(l.route_name(), route_config(scope, l)))
        .collect()
}

/// The route configurations that `edited` VirtualServices, each changed in its HTTP routes only
/// (the same hosts and destinations), alter: `previous` (this view's route configurations before
/// the edit) with the routes of the virtual hosts those VirtualServices route replaced. `None`
/// when an edit may add or drop virtual hosts: then the view's routes are generated whole.
pub(super) fn patched_route_configs(
    scope: &Scope<'_>,
    edited: &[ConfigKey],
    previous: &[Resource],
) -> Option<Vec<Resource>> {
    let mut out = Vec::new();
    for l in
        outbound_plan(scope).iter().filter(|l| matches!(l.protocol, ListenerProtocol::Http | ListenerProtocol::Auto))
    {
        let routes = edited_virtual_hosts(scope, l, edited)?;
        if routes.is_empty() {
            continue;
        }
        let name = l.route_name();
        let before = previous.iter().find(|r| r.name == name)?;
        let value = match replace_routes(&before.body.value, &routes) {
            Ok(value) => value,
            Err(error) => {
                tracing::debug!(%error, route_config = %name, "route configuration generated whole");
                return None;
            }
        };
        out.push(Resource { name, body: Any { type_url: before.body.type_url.clone(), value } });
    }
    Some(out)
}

/// The routes of the virtual hosts of listener `l` that the `edited` VirtualServices route, by
/// virtual host name; `None` when an edit may add or drop virtual hosts here.
fn edited_virtual_hosts(
    scope: &Scope<'_>,
    l: &OutboundListener<'_>,
    edited: &[ConfigKey],
) -> Option<HashMap<String, Vec<Route>>> {
    let vss = scope.mesh_virtual_services(l.imports);
    let mut out = HashMap::new();
    let mut services = None;
    for (i, vs) in vss.iter().enumerate().filter(|(_, (ix, _))| edited.contains(&ix.config.key)) {
        let services = services.get_or_insert_with(|| services_on_port(scope, l));
        let claimed: Vec<&Service> =
            services.iter().map(|(s, _)| &***s).filter(|s| claiming_virtual_service(&vss, s) == Some(i)).collect();
        let other_hosts =
            vs.0.hosts.iter().any(|h| !services.iter().any(|(s, _)| host_matches(h.as_str(), s.hostname.as_str())));
        // Hosts that are no service get virtual hosts of their own here, which the edit may add
        // or drop (they depend on whether its routes are empty).
        if other_hosts && (l.port == 80 || !claimed.is_empty()) {
            return None;
        }
        if claimed.is_empty() {
            continue;
        }
        let routes = virtual_service_routes(scope, *vs, &route_context(scope, l.port));
        // Its services fall back to their default routes, which they may not have had before.
        if routes.is_empty() {
            return None;
        }
        for svc in claimed {
            out.insert(domain_name(svc.hostname.as_str(), l.port), routes.clone());
        }
    }
    Some(out)
}

/// How a sidecar's outbound routes on `port` match requests.
fn route_context<'a>(scope: &'a Scope<'_>, port: u16) -> RouteContext<'a> {
    RouteContext {
        listen_port: port,
        gateway: "mesh",
        tls: false,
        labels: &scope.view.labels,
        namespace: scope.namespace(),
    }
}

fn route_config(scope: &Scope<'_>, l: &OutboundListener<'_>) -> RouteConfiguration {
    let port = l.port;
    let ctx = route_context(scope, port);
    let services = services_on_port(scope, l);
    let vss = scope.mesh_virtual_services(l.imports);
    let vs_routes: Vec<Vec<Route>> = vss.iter().map(|vs| virtual_service_routes(scope, *vs, &ctx)).collect();
    let mut vhosts = VirtualHosts::default();
    let mut routing_vs = HashSet::new();
    for (svc, service_port) in &services {
        let claimed = claiming_virtual_service(&vss, svc).filter(|i| !vs_routes[*i].is_empty());
        let routes = match claimed {
            Some(i) => {
                routing_vs.insert(i);
                vs_routes[i].clone()
            }
            None => vec![default_route(scope, svc, *service_port)],
        };
        let aliases = scope.snapshot.aliases_of(&svc.hostname);
        let domains = service_domains(svc, aliases, scope.namespace(), scope.domain());
        vhosts.push(virtual_host(domain_name(svc.hostname.as_str(), port), domains, routes));
    }
    for (i, (ix, _)) in vss.iter().enumerate() {
        if vs_routes[i].is_empty() || !(port == 80 || routing_vs.contains(&i)) {
            continue;
        }
        for host in
            ix.hosts.iter().filter(|h| !services.iter().any(|(s, _)| host_matches(h.as_str(), s.hostname.as_str())))
        {
            let domains = host_domains(host.as_str());
            vhosts.push(virtual_host(domain_name(host.as_str(), port), domains, vs_routes[i].clone()));
        }
    }
    let mut virtual_hosts = vhosts.into_sorted();
    let name = l.route_name();
    if l.at_vip {
        // A sniffed service's own route configuration: only its virtual host, answering to any
        // authority (the address already chose the service), and no catch-all, as istiod.
        let host = services.first().map(|(s, _)| s.hostname.to_string()).unwrap_or_default();
        virtual_hosts.retain(|vh| vh.domains.iter().any(|d| *d == host || *d == name));
        if let [only] = virtual_hosts.as_mut_slice() {
            only.domains = vec!["*".to_string()];
        }
    } else {
        virtual_hosts.push(catch_all(scope.outbound_mode));
    }
    RouteConfiguration {
        name,
        virtual_hosts,
        validate_clusters: Some(bool_value(false)),
        max_direct_response_body_size_bytes: Some(u32_value(MAX_DIRECT_RESPONSE_BODY)),
        ignore_port_in_host_matching: true,
        ..Default::default()
    }
}

/// A virtual host counting request attempts, as Istio's do.
pub(super) fn virtual_host(name: String, domains: Vec<String>, routes: Vec<Route>) -> VirtualHost {
    VirtualHost { name, domains, routes, include_request_attempt_count: true, ..Default::default() }
}

/// The VirtualService that routes a service: the first naming its host exactly, else the one with
/// the most specific wildcard host covering it.
fn claiming_virtual_service(vss: &[VsRef<'_>], svc: &Service) -> Option<usize> {
    let host = svc.hostname.as_str();
    if let Some(i) = vss.iter().position(|(ix, _)| ix.hosts.iter().any(|h| h.as_str() == host)) {
        return Some(i);
    }
    vss.iter()
        .enumerate()
        .filter_map(|(i, (ix, _))| {
            let best = ix
                .hosts
                .iter()
                .filter(|h| h.is_wildcard() && host_matches(h.as_str(), host))
                .map(|h| h.as_str().len())
                .max()?;
            Some((i, best))
        })
        .min_by_key(|(i, len)| (usize::MAX - len, *i))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::route::v3::{route, route_action::ClusterSpecifier};

    use super::*;
    use crate::config::Kind;
    use crate::envoy::names::{ALLOW_ANY_VHOST, BLOCK_ALL_VHOST, PASSTHROUGH_CLUSTER};
    use crate::envoy::testing::{find, route_action, service_entry, sidecar, snapshot, testdata_snapshot, vhost};
    use crate::envoy::TypeUrl;
    use crate::envoy::{generate, generate_routes_of};

    fn bookinfo(ns: &str, name: &str) -> RouteConfiguration {
        let s = testdata_snapshot("bookinfo.yaml");
        find(&s, &sidecar(ns, &[("app", "productpage")]), TypeUrl::Route, name)
    }

    #[test]
    fn services_answer_to_istio_short_names_without_ports() {
        let rc = bookinfo("bookinfo", "9080");
        // Per-port route configurations ignore the port in host matching: domains carry none.
        assert!(rc.ignore_port_in_host_matching);
        let vh = vhost(&rc, "reviews.bookinfo.svc.cluster.local:9080");
        assert_eq!(
            vh.domains,
            [
                "reviews.bookinfo.svc.cluster.local",
                "reviews.bookinfo.svc.cluster.local.",
                "reviews",
                "reviews.bookinfo.svc",
                "reviews.bookinfo",
                "240.240.0.2"
            ]
        );
        let elsewhere = bookinfo("other", "9080");
        let vh = vhost(&elsewhere, "reviews.bookinfo.svc.cluster.local:9080");
        assert!(!vh.domains.iter().any(|x| x == "reviews"), "bare names only in the service's namespace");
        assert!(vh.domains.iter().any(|x| x == "reviews.bookinfo"));
    }

    #[test]
    fn services_without_virtual_service_get_istios_default_route() {
        let rc = bookinfo("bookinfo", "9080");
        let r = &vhost(&rc, "details.bookinfo.svc.cluster.local:9080").routes[0];
        assert_eq!(r.name, "default");
        let action = route_action(r);
        assert_eq!(action.timeout.map(|t| (t.seconds, t.nanos)), Some((0, 0)));
        let retry = action.retry_policy.clone().expect("default retry");
        assert_eq!(retry.num_retries.map(|n| n.value), Some(2));
        assert_eq!(retry.retry_on, "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes");
        assert_eq!(retry.host_selection_retry_max_attempts, 5);
        assert_eq!(retry.retry_host_predicate[0].name, "envoy.retry_host_predicates.previous_hosts");
    }

    #[test]
    fn catch_all_host_follows_the_outbound_policy() {
        let rc = bookinfo("bookinfo", "80");
        let last = rc.virtual_hosts.last().expect("vhosts");
        assert_eq!((last.name.as_str(), last.domains.as_slice()), (ALLOW_ANY_VHOST, &["*".to_string()][..]));
        let Some(route::Action::Route(a)) = &last.routes[0].action else { panic!() };
        assert_eq!(a.cluster_specifier, Some(ClusterSpecifier::Cluster(PASSTHROUGH_CLUSTER.into())));
        let s = testdata_snapshot("features.yaml");
        let rc: RouteConfiguration = find(&s, &sidecar("shop", &[("app", "web")]), TypeUrl::Route, "8080");
        let last = rc.virtual_hosts.last().expect("vhosts");
        let Some(route::Action::DirectResponse(d)) = &last.routes[0].action else { panic!() };
        assert_eq!((last.name.as_str(), d.status), (BLOCK_ALL_VHOST, 502));
    }

    #[test]
    fn an_egress_port_routes_only_the_services_of_that_port() {
        let s = testdata_snapshot("features.yaml");
        let rc: RouteConfiguration = find(&s, &sidecar("shop", &[("app", "web")]), TypeUrl::Route, "18080");
        let names: Vec<&str> = rc.virtual_hosts.iter().map(|v| v.name.as_str()).collect();
        // As istiod trims the listener's imports: web (port 8080) and the VirtualService hosts
        // routing to it are not imported on 18080.
        assert_eq!(names, ["proxy.shop.svc.cluster.local:18080", BLOCK_ALL_VHOST]);
    }

    #[test]
    fn domains_stay_unique_across_virtual_hosts() {
        let rc = bookinfo("bookinfo", "9080");
        let mut all: Vec<&String> = rc.virtual_hosts.iter().flat_map(|v| &v.domains).collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n);
    }

    /// A mesh of services a, b and c in `shop`, with VirtualService `vs` (hosts `hosts`, one
    /// HTTP rule `rule`).
    fn edited(hosts: &str, rule: &str) -> crate::snapshot::Snapshot {
        let services = ["a", "b", "c"].map(|n| service_entry(n, "shop")).concat();
        snapshot(&format!(
            "{services}apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: vs, namespace: shop}}\n\
             spec: {{hosts: [{hosts}], http: [{rule}]}}\n"
        ))
    }

    fn patched(before: &crate::snapshot::Snapshot, after: &crate::snapshot::Snapshot) -> Option<Vec<Resource>> {
        let view = sidecar("shop", &[]);
        let key = ConfigKey { kind: Kind::VirtualService, namespace: "shop".into(), name: "vs".into() };
        generate_routes_of(after, &view, &[key], &generate(TypeUrl::Route, before, &view))
    }

    #[test]
    fn a_route_edit_patches_what_generation_gives() {
        let to = |host: &str, timeout: &str| {
            format!("{{timeout: {timeout}, route: [{{destination: {{host: {host}.shop.svc.cluster.local}}}}]}}")
        };
        let before = edited("b.shop.svc.cluster.local", &to("b", "1s"));
        let after = edited("b.shop.svc.cluster.local", &to("b", "3s"));
        let view = sidecar("shop", &[]);
        let whole = generate(TypeUrl::Route, &after, &view);
        let fresh = patched(&before, &after).expect("patched");
        assert_eq!(fresh.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["80"]);
        assert_eq!(fresh[0], whole[whole.iter().position(|r| r.name == "80").expect("80")]);
        let rc: RouteConfiguration = prost::Message::decode(fresh[0].body.value.as_slice()).expect("decodes");
        let timeout = route_action(&vhost(&rc, "b.shop.svc.cluster.local:80").routes[0]).timeout;
        assert_eq!(timeout.map(|t| t.seconds), Some(3));
        // From the default route to the VirtualService's, as when a rule starts matching.
        let unrouted = edited("b.shop.svc.cluster.local", "{match: [{port: 9}], route: [{destination: {host: b}}]}");
        assert_eq!(patched(&unrouted, &after).expect("patched")[0], fresh[0]);
    }

    #[test]
    fn an_edit_that_may_add_or_drop_virtual_hosts_is_generated_whole() {
        let rule = "{route: [{destination: {host: b.shop.svc.cluster.local}}]}";
        let before = edited("b.shop.svc.cluster.local", rule);
        // The rule stops matching port 80: b's virtual host takes its default route.
        let unrouted = edited("b.shop.svc.cluster.local", "{match: [{port: 9}], route: [{destination: {host: b}}]}");
        assert_eq!(patched(&before, &unrouted), None);
        // A host that is no service has a virtual host of its own on port 80.
        let before = edited("\"b.shop.svc.cluster.local\", ext.example", rule);
        assert_eq!(patched(&before, &before), None);
        // Not in the previous configuration at all.
        let view = sidecar("shop", &[]);
        let key = ConfigKey { kind: Kind::VirtualService, namespace: "shop".into(), name: "vs".into() };
        assert_eq!(generate_routes_of(&before, &view, &[key], &[]), None);
    }

    #[test]
    fn an_external_name_service_is_an_alias_of_its_target_with_no_config_of_its_own() {
        use std::sync::Arc;

        use crate::registry::kubernetes::{KubeObject, KubeService, KubeServicePort, ServiceType};
        use crate::snapshot::{ChangeSet, Snapshot, SourceState, Version};
        let service = |name: &str, external: Option<&str>| KubeService {
            name: name.into(),
            namespace: "shop".into(),
            labels: Default::default(),
            selector: None,
            service_type: if external.is_some() { ServiceType::ExternalName } else { ServiceType::ClusterIp },
            cluster_ips: if external.is_some() { vec![] } else { vec!["10.96.0.9".into()] },
            headless: false,
            external_name: external.map(str::to_string),
            ports: vec![KubeServicePort {
                name: "http".into(),
                port: 80,
                protocol: "TCP".into(),
                app_protocol: None,
                target_port: None,
            }],
            export_to: vec![],
        };
        let objects = [
            service("web", None),
            service("www", Some("web.shop.svc.cluster.local")),
            service("legacy", Some("www.shop.svc.cluster.local")),
            service("loop-a", Some("loop-b.shop.svc.cluster.local")),
            service("loop-b", Some("loop-a.shop.svc.cluster.local")),
        ];
        let kube = objects.into_iter().map(KubeObject::Service).map(|o| (o.key(), Arc::new(o))).collect();
        let s = Snapshot::build(Version::new(1, 1), ChangeSet::full(), &SourceState { kube, ..Default::default() });
        let view = sidecar("shop", &[]);
        let clusters = crate::envoy::testing::names(&s, &view, TypeUrl::Cluster);
        assert!(clusters.contains(&"outbound|80||web.shop.svc.cluster.local".to_string()));
        assert!(
            !clusters.iter().any(|c| c.contains("www") || c.contains("legacy") || c.contains("loop")),
            "{clusters:?}"
        );
        let rc = find::<RouteConfiguration>(&s, &view, TypeUrl::Route, "80");
        assert!(rc.virtual_hosts.iter().all(|vh| !vh.name.contains("www") && !vh.name.contains("legacy")));
        let web = vhost(&rc, "web.shop.svc.cluster.local:80");
        for name in ["web", "www.shop.svc.cluster.local", "www", "legacy.shop.svc.cluster.local", "legacy"] {
            assert!(web.domains.contains(&name.to_string()), "{name} in {:?}", web.domains);
        }
        assert!(!web.domains.iter().any(|d| d.contains("loop")), "a loop resolves to nothing");
    }
}
