//! Virtual hosts: the domains a host answers to, uniqueness within a route configuration, and
//! Istio's catch-all virtual host.

use std::collections::HashSet;

use envoy_types::pb::envoy::config::route::v3::{
    route, route_match::PathSpecifier, DirectResponseAction, Route, RouteAction, RouteMatch, VirtualHost,
};

use super::http_action::set_cluster;
use super::names::{domain_name, ALLOW_ANY_VHOST, BLOCK_ALL_VHOST, PASSTHROUGH_CLUSTER};
use super::proto::zero_duration;
use crate::config::api::sidecar::OutboundMode;
use crate::registry::Service;

/// Domains of a service on `port` for a proxy in `proxy_ns`: the host, Istio's short forms of
/// Kubernetes-style hosts (`name`, `name.ns`, `name.ns.svc`), and the service's IPs, each also
/// with `:PORT`.
pub(super) fn service_domains(service: &Service, port: u16, proxy_ns: &str, domain: &str) -> Vec<String> {
    let host = service.hostname.as_str();
    let mut names = vec![host.to_string()];
    names.extend(short_names(host, proxy_ns, domain));
    names.extend(service.addresses.iter().filter(|a| !a.contains('/') && a.as_str() != "0.0.0.0").cloned());
    names.iter().flat_map(|n| host_domains(n, port)).collect()
}

/// `name.ns.svc.DOMAIN` → the shorter names clients in `proxy_ns` may use.
fn short_names(host: &str, proxy_ns: &str, domain: &str) -> Vec<String> {
    let Some(prefix) = host.strip_suffix(&format!(".svc.{domain}")) else { return Vec::new() };
    let Some((name, ns)) = prefix.split_once('.') else { return Vec::new() };
    if ns.is_empty() || ns.contains('.') || name.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    if ns == proxy_ns {
        out.push(name.to_string());
    }
    out.push(format!("{prefix}.svc"));
    out.push(prefix.to_string());
    out
}

/// Domains of a host that is not a service: the host and `host:PORT`.
pub(super) fn host_domains(host: &str, port: u16) -> Vec<String> {
    vec![host.to_string(), domain_name(host, port)]
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
            let mut action = RouteAction { timeout: Some(zero_duration()), ..Default::default() };
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
        ..Default::default()
    }
}
