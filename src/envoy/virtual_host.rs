//! Virtual hosts: the domains a host answers to, uniqueness within a route configuration, and
//! Istio's catch-all virtual host.

use std::collections::HashSet;

use envoy_types::pb::envoy::config::route::v3::{
    route, route_match::PathSpecifier, DirectResponseAction, Route, RouteAction, RouteMatch, VirtualHost,
};

use super::http_action::{set_cluster, set_timeout};
use super::names::{ALLOW_ANY_VHOST, BLOCK_ALL_VHOST, PASSTHROUGH_CLUSTER};
use crate::config::api::sidecar::OutboundMode;
use crate::registry::{Hostname, Resolution, Service, ServiceOrigin};

/// Domains of a service for a sidecar in `proxy_ns`, as istiod lists them for its per-port route
/// configurations (which ignore the port in host matching, so no `:PORT` forms): the host and its
/// absolute form (`host.`), Istio's short forms of Kubernetes-style hosts (`name`, `name.ns.svc`,
/// `name.ns` in the proxy's namespace; `name.ns`, `name.ns.svc` elsewhere), each also as
/// `*.NAME` for a headless Kubernetes service (its pods' own names), then the service's IPs.
pub(super) fn service_domains(service: &Service, aliases: &[Hostname], proxy_ns: &str, domain: &str) -> Vec<String> {
    let mut names = Vec::new();
    // The service's names, then each alias's (istiod's ExternalName aliases), alike.
    for host in std::iter::once(&service.hostname).chain(aliases).map(Hostname::as_str) {
        names.extend([ip_compliant(host), format!("{host}.")]);
        names.extend(short_names(host, proxy_ns, domain));
    }
    if service.resolution == Resolution::Passthrough && matches!(service.origin, ServiceOrigin::Kube(_)) {
        let pods: Vec<String> = names.iter().map(|n| format!("*.{n}")).collect();
        names.extend(pods);
    }
    let addresses = service.addresses.iter().filter(|a| !a.contains('/') && a.as_str() != "0.0.0.0");
    names.extend(addresses.map(|a| ip_compliant(a)));
    names
}

/// `name.ns.svc.DOMAIN` → the shorter names clients in `proxy_ns` may use, in istiod's order.
fn short_names(host: &str, proxy_ns: &str, domain: &str) -> Vec<String> {
    let Some(prefix) = host.strip_suffix(&format!(".svc.{domain}")) else { return Vec::new() };
    let Some((name, ns)) = prefix.split_once('.') else { return Vec::new() };
    if ns.is_empty() || ns.contains('.') || name.is_empty() {
        return Vec::new();
    }
    match ns == proxy_ns {
        true => vec![name.to_string(), format!("{prefix}.svc"), prefix.to_string()],
        false => vec![prefix.to_string(), format!("{prefix}.svc")],
    }
}

/// An IPv6 address in brackets, as a `Host` header carries it; anything else as it is.
fn ip_compliant(host: &str) -> String {
    match host.parse::<std::net::Ipv6Addr>() {
        Ok(_) => format!("[{host}]"),
        Err(_) => host.to_string(),
    }
}

/// Domains of a host that is not a service (a VirtualService's or a gateway server's): the host
/// alone, the route configuration ignoring the port.
pub(super) fn host_domains(host: &str) -> Vec<String> {
    vec![ip_compliant(host)]
}

/// Virtual hosts of one route configuration, keeping names and domains unique: Envoy rejects a
/// route configuration with duplicates, so the first claim wins.
#[derive(Default)]
pub(super) struct VirtualHosts {
    hosts: Vec<VirtualHost>,
    names: HashSet<String>,
    domains: HashSet<String>,
}

impl VirtualHosts {
    /// Adds a virtual host with its domains not claimed yet; dropped if none remain.
    pub(super) fn push(&mut self, mut vh: VirtualHost) {
        if self.names.contains(&vh.name) {
            return;
        }
        let mut seen = HashSet::new();
        vh.domains.retain(|d| {
            let key = d.to_ascii_lowercase();
            !self.domains.contains(&key) && seen.insert(key)
        });
        if vh.domains.is_empty() {
            return;
        }
        self.domains.extend(vh.domains.iter().map(|d| d.to_ascii_lowercase()));
        self.names.insert(vh.name.clone());
        self.hosts.push(vh);
    }

    /// The virtual hosts, sorted by name.
    pub(super) fn into_sorted(mut self) -> Vec<VirtualHost> {
        self.hosts.sort_by(|a, b| a.name.cmp(&b.name));
        self.hosts
    }
}

/// Istio's catch-all virtual host for unknown hosts: forward to the original destination
/// (ALLOW_ANY, `allow_any`) or answer 502 (REGISTRY_ONLY, `block_all`).
pub(super) fn catch_all(mode: OutboundMode) -> VirtualHost {
    let (name, action) = match mode {
        OutboundMode::AllowAny => {
            let mut action = RouteAction::default();
            set_timeout(&mut action, None);
            set_cluster(&mut action, PASSTHROUGH_CLUSTER.to_string());
            (ALLOW_ANY_VHOST, route::Action::Route(action))
        }
        OutboundMode::RegistryOnly => {
            (BLOCK_ALL_VHOST, route::Action::DirectResponse(DirectResponseAction { status: 502, ..Default::default() }))
        }
    };
    VirtualHost {
        name: name.to_string(),
        domains: vec!["*".to_string()],
        routes: vec![Route {
            name: name.to_string(),
            r#match: Some(RouteMatch { path_specifier: Some(PathSpecifier::Prefix("/".into())), ..Default::default() }),
            action: Some(action),
            ..Default::default()
        }],
        include_request_attempt_count: true,
        ..Default::default()
    }
}
