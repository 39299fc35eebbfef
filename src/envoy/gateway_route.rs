//! Gateway RDS: `http.PORT` for the plain HTTP servers of a port, and one route configuration per
//! TLS-terminating HTTPS server. Virtual hosts are the hosts of VirtualServices bound to the
//! gateway, narrowed to the server's hosts.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::route::v3::{
    virtual_host::TlsRequirementType, Route, RouteConfiguration, VirtualHost,
};

use super::gateway::{gateway_ports, GatewayServer, ServerKind};
use super::http_match::{is_catch_all, RouteContext};
use super::http_route::virtual_service_routes;
use super::names::{domain_name, gateway_http_route_name};
use super::proto::{bool_value, resource, u32_value};
use super::resource::Resource;
use super::route::{virtual_host, MAX_DIRECT_RESPONSE_BODY};
use super::scope::Scope;
use super::virtual_host::{host_domains, VirtualHosts};
use crate::config::ConfigKey;

/// Every route configuration the gateway's listeners name.
pub(super) fn route_configs(scope: &Scope<'_>) -> Vec<Resource> {
    let ports = gateway_ports(scope);
    let mut by_route: BTreeMap<String, (u16, Vec<&GatewayServer<'_>>)> = BTreeMap::new();
    for gp in &ports {
        for server in &gp.servers {
            let name = match &server.kind {
                ServerKind::Http => gateway_http_route_name(gp.port),
                ServerKind::HttpsTerminated { route_name } => route_name.clone(),
                _ => continue,
            };
            by_route.entry(name).or_insert_with(|| (gp.port, Vec::new())).1.push(server);
        }
    }
    by_route
        .into_iter()
        .map(|(name, (port, servers))| {
            let config = route_config(scope, &name, port, &servers);
            resource(name, config)
        })
        .collect()
}

/// Routes and redirect requirement gathered for one host, and which gateway's VirtualServices
/// gave its routes.
#[derive(Default)]
struct HostRoutes {
    routes: Vec<Route>,
    require_tls: bool,
    sources: Vec<(String, ConfigKey)>,
}

fn route_config(scope: &Scope<'_>, name: &str, port: u16, servers: &[&GatewayServer<'_>]) -> RouteConfiguration {
    let mut by_host: BTreeMap<String, HostRoutes> = BTreeMap::new();
    for server in servers {
        let ctx = RouteContext {
            listen_port: port,
            gateway: &server.gateway,
            tls: server.server.tls.is_some() && server.kind != ServerKind::Http,
            labels: &scope.view.labels,
            namespace: scope.namespace(),
        };
        for vs in scope.snapshot.virtual_services_for(scope.namespace(), &server.gateway) {
            let hosts = server.exposed_hosts(vs);
            if hosts.is_empty() {
                continue;
            }
            let routes = virtual_service_routes(scope, vs, &ctx);
            if routes.is_empty() {
                continue;
            }
            for host in hosts {
                let entry = by_host.entry(host).or_default();
                entry.routes.extend(routes.iter().cloned());
                entry.require_tls |= server.https_redirect();
                entry.sources.push((server.gateway.clone(), vs.0.config.key.clone()));
            }
        }
        if server.https_redirect() {
            for host in server.plain_hosts() {
                by_host.entry(host).or_default().require_tls = true;
            }
        }
    }
    // As istiod collapses them: hosts whose routes come from the same VirtualServices (and with
    // the same redirect) share one virtual host, named after the most specific host (longest,
    // then alphabetical, wildcards last).
    let mut hosts: Vec<(String, HostRoutes)> = by_host.into_iter().collect();
    hosts.sort_by(|(a, _), (b, _)| {
        (a.starts_with('*'), std::cmp::Reverse(a.len()), a).cmp(&(b.starts_with('*'), std::cmp::Reverse(b.len()), b))
    });
    let mut collapsed: Vec<(HostRoutes, VirtualHost)> = Vec::new();
    for (host, mut entry) in hosts {
        let same =
            |(c, _): &&mut (HostRoutes, VirtualHost)| c.sources == entry.sources && c.require_tls == entry.require_tls;
        if let Some((_, vh)) = collapsed.iter_mut().find(same) {
            vh.domains.extend(host_domains(&host));
            continue;
        }
        let routes = catch_all_last(std::mem::take(&mut entry.routes));
        let mut vh = virtual_host(domain_name(&host, port), host_domains(&host), routes);
        if entry.require_tls {
            vh.require_tls = TlsRequirementType::All as i32;
        }
        collapsed.push((entry, vh));
    }
    let mut vhosts = VirtualHosts::default();
    for (_, vh) in collapsed {
        vhosts.push(vh);
    }
    let mut virtual_hosts = vhosts.into_sorted();
    if virtual_hosts.is_empty() {
        // Istio's answer for a port without routes: a catch-all host without routes (404).
        // istiod's blackhole host does not count request attempts, unlike its others.
        let blackhole = virtual_host(domain_name("blackhole", port), vec!["*".to_string()], Vec::new());
        virtual_hosts.push(VirtualHost { include_request_attempt_count: false, ..blackhole });
    }
    RouteConfiguration {
        name: name.to_string(),
        virtual_hosts,
        validate_clusters: Some(bool_value(false)),
        max_direct_response_body_size_bytes: Some(u32_value(MAX_DIRECT_RESPONSE_BODY)),
        ignore_port_in_host_matching: true,
        ..Default::default()
    }
}

/// Routes merged from several VirtualServices: catch-all routes move last, order kept otherwise.
fn catch_all_last(routes: Vec<Route>) -> Vec<Route> {
    let (catch_all, specific): (Vec<Route>, Vec<Route>) =
        routes.into_iter().partition(|r| r.r#match.as_ref().is_some_and(is_catch_all));
    specific.into_iter().chain(catch_all).collect()
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::route::v3::{route, route_match::PathSpecifier};

    use super::*;
    use crate::envoy::testing::{find, names, router, snapshot, testdata_snapshot, vhost};
    use crate::envoy::TypeUrl;

    #[test]
    fn gateway_route_config_holds_the_virtual_service_hosts() {
        let s = testdata_snapshot("bookinfo.yaml");
        let view = router("bookinfo", &[("istio", "ingressgateway")]);
        let rc: RouteConfiguration = find(&s, &view, TypeUrl::Route, "http.8080");
        let vh = vhost(&rc, "*:8080");
        assert_eq!(vh.domains, ["*"], "the port is ignored in host matching");
        let paths: Vec<_> =
            vh.routes.iter().map(|r| r.r#match.as_ref().and_then(|m| m.path_specifier.clone())).collect();
        assert_eq!(
            paths,
            [
                Some(PathSpecifier::Path("/productpage".into())),
                Some(PathSpecifier::Prefix("/static".into())),
                Some(PathSpecifier::Prefix("/old".into())),
                Some(PathSpecifier::Prefix("/api/v1".into()))
            ]
        );
        let Some(route::Action::Route(a)) = &vh.routes[3].action else { panic!() };
        assert_eq!(a.prefix_rewrite, "/api");
        // The HTTPS server only exposes its own host.
        let https: RouteConfiguration = find(&s, &view, TypeUrl::Route, "https.8443.https.bookinfo-gateway.bookinfo");
        let hosts: Vec<&str> = https.virtual_hosts.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(hosts, ["bookinfo.example.com:8443"]);
    }

    #[test]
    fn https_redirect_requires_tls() {
        let s = testdata_snapshot("features.yaml");
        let rc: RouteConfiguration = find(&s, &router("edge", &[("istio", "edge")]), TypeUrl::Route, "http.80");
        let vh = vhost(&rc, "web.shop.example:80");
        assert_eq!(vh.require_tls, TlsRequirementType::All as i32);
    }

    const GATEWAY: &str = r#"
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: gw, namespace: edge}
spec:
  selector: {istio: gw}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["team-a/*", "./shared.example.com"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: a, namespace: team-a}
spec:
  hosts: [a.example.com]
  gateways: [edge/gw, mesh]
  http:
  - match: [{uri: {prefix: /a}, gateways: [edge/gw]}, {uri: {prefix: /mesh-only}, gateways: [mesh]}]
    route: [{destination: {host: a.team-a.svc.cluster.local}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: b, namespace: team-b}
spec:
  hosts: [b.example.com, shared.example.com]
  gateways: [edge/gw]
  http:
  - route: [{destination: {host: b.team-b.svc.cluster.local}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: shared, namespace: edge}
spec:
  hosts: [shared.example.com]
  gateways: [gw]
  http:
  - route: [{destination: {host: shared.edge.svc.cluster.local}}]
"#;

    #[test]
    fn server_hosts_select_virtual_services_by_namespace() {
        let s = snapshot(GATEWAY);
        let view = router("edge", &[("istio", "gw")]);
        assert_eq!(names(&s, &view, TypeUrl::Route), ["http.8080"]);
        let rc: RouteConfiguration = find(&s, &view, TypeUrl::Route, "http.8080");
        let hosts: Vec<&str> = rc.virtual_hosts.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(hosts, ["a.example.com:8080", "shared.example.com:8080"], "team-b is not allowed");
        let a = vhost(&rc, "a.example.com:8080");
        assert_eq!(a.routes.len(), 1, "the mesh-only match is dropped");
    }

    #[test]
    fn a_port_without_routes_gets_the_404_host() {
        let s = snapshot(GATEWAY.split("---").next().unwrap_or_default());
        let rc: RouteConfiguration = find(&s, &router("edge", &[("istio", "gw")]), TypeUrl::Route, "http.8080");
        assert_eq!(rc.virtual_hosts.len(), 1);
        assert_eq!((rc.virtual_hosts[0].name.as_str(), rc.virtual_hosts[0].routes.len()), ("blackhole:8080", 0));
    }
}
