//! istioctl's `proxy-config` tables, built from the generated resources: clusters by service,
//! port, subset and direction; listeners per filter chain with its match and destination; routes
//! per virtual host route; endpoints per address; secrets by name.

use envoy_types::pb::envoy::config::cluster::v3::{cluster::ClusterDiscoveryType, cluster::DiscoveryType, Cluster};
use envoy_types::pb::envoy::config::core::v3::{address, Metadata};
use envoy_types::pb::envoy::config::endpoint::v3::{lb_endpoint, ClusterLoadAssignment};
use envoy_types::pb::envoy::config::listener::v3::{filter, FilterChainMatch, Listener};
use envoy_types::pb::envoy::config::route::v3::{
    route, route_action, route_match::PathSpecifier, RouteConfiguration, RouteMatch, VirtualHost,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::RouteSpecifier, HttpConnectionManager,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{tcp_proxy, TcpProxy};
use prost::Message;

use super::tables::render;

/// Padding between columns (istioctl's proxy-config tables).
const PADDING: usize = 1;

/// istioctl's filters: `--fqdn`, `--port`, `--subset`, `--direction`.
#[derive(Debug, Clone, Default)]
pub struct Filters {
    /// Part of the service host.
    pub fqdn: Option<String>,
    /// Service port (clusters), listener port (listeners), endpoint port (endpoints).
    pub port: Option<u32>,
    /// Subset name.
    pub subset: Option<String>,
    /// `inbound` or `outbound`.
    pub direction: Option<String>,
}

impl Filters {
    /// Whether a cluster named `name` passes, as istioctl matches them: by parts of the name.
    pub fn cluster(&self, name: &str) -> bool {
        let contains = |f: &Option<String>| f.as_ref().is_none_or(|v| name.contains(v.as_str()));
        contains(&self.fqdn)
            && contains(&self.direction)
            && contains(&self.subset)
            && self.port.is_none_or(|p| name.contains(&format!("|{p}|")))
    }

    /// Whether a listener passes (`--port`).
    pub fn listener(&self, listener: &Listener) -> bool {
        self.port.is_none_or(|p| listener_address(listener).1 == p)
    }
}

/// `SERVICE FQDN  PORT  SUBSET  DIRECTION  TYPE  DESTINATION RULE`.
pub fn clusters(clusters: &[Cluster], filters: &Filters) -> String {
    let mut rows: Vec<Vec<String>> = clusters
        .iter()
        .filter(|c| filters.cluster(&c.name))
        .map(|c| {
            let parts: Vec<&str> = c.name.split('|').collect();
            let (fqdn, port, subset, direction) = match parts.as_slice() {
                [direction, port, subset, fqdn] => {
                    let subset = if subset.is_empty() { "-" } else { subset };
                    (fqdn.to_string(), port.to_string(), subset.to_string(), direction.to_string())
                }
                _ => (c.name.clone(), "-".into(), "-".into(), "-".into()),
            };
            vec![fqdn, port, subset, direction, cluster_type(c), managed_by(c.metadata.as_ref())]
        })
        .collect();
    rows.sort();
    render(&["SERVICE FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE", "DESTINATION RULE"], &rows, PADDING)
}

/// `ADDRESSES  PORT  MATCH  DESTINATION`, a line per filter chain.
pub fn listeners(listeners: &[Listener], filters: &Filters) -> String {
    let mut sorted: Vec<&Listener> = listeners.iter().filter(|l| filters.listener(l)).collect();
    sorted.sort_by_key(|l| {
        let (address, port) = listener_address(l);
        (port, address)
    });
    let mut rows = Vec::new();
    for l in sorted {
        let (address, port) = listener_address(l);
        let mut chains: Vec<(String, String)> = l
            .filter_chains
            .iter()
            .map(|fc| (chain_match(fc.filter_chain_match.as_ref()), destination(&fc.filters)))
            .collect();
        if let Some(fc) = &l.default_filter_chain {
            chains.push(("ALL".into(), destination(&fc.filters)));
        }
        chains.sort_by(|a, b| b.1.cmp(&a.1));
        rows.extend(chains.into_iter().map(|(m, d)| vec![address.clone(), port.to_string(), m, d]));
    }
    render(&["ADDRESSES", "PORT", "MATCH", "DESTINATION"], &rows, PADDING)
}

/// `NAME  VHOST NAME  DOMAINS  MATCH  VIRTUAL SERVICE`, a line per route.
pub fn routes(routes: &[RouteConfiguration]) -> String {
    let mut rows = Vec::new();
    let mut sorted: Vec<&RouteConfiguration> = routes.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    for rc in sorted {
        for vh in &rc.virtual_hosts {
            for r in vh.routes.iter().filter(|r| !is_passthrough(r)) {
                let m = r.r#match.as_ref().map(describe_match).unwrap_or_default();
                rows.push(vec![rc.name.clone(), vh.name.clone(), domains(vh), m, managed_by(r.metadata.as_ref())]);
            }
            if vh.routes.is_empty() {
                rows.push(vec![rc.name.clone(), vh.name.clone(), domains(vh), "/*".into(), "404".into()]);
            }
        }
    }
    render(&["NAME", "VHOST NAME", "DOMAINS", "MATCH", "VIRTUAL SERVICE"], &rows, PADDING)
}

/// `ENDPOINT  STATUS  OUTLIER CHECK  CLUSTER`, a line per endpoint.
pub fn endpoints(assignments: &[ClusterLoadAssignment], filters: &Filters) -> String {
    let mut rows = Vec::new();
    for cla in assignments.iter().filter(|c| filters.fqdn.as_ref().is_none_or(|f| c.cluster_name.contains(f.as_str())))
    {
        for lb in cla.endpoints.iter().flat_map(|l| &l.lb_endpoints) {
            let Some(lb_endpoint::HostIdentifier::Endpoint(e)) = &lb.host_identifier else { continue };
            let (address, port) = match e.address.as_ref().and_then(|a| a.address.as_ref()) {
                Some(address::Address::SocketAddress(s)) => (s.address.clone(), socket_port(s)),
                Some(address::Address::Pipe(p)) => (format!("unix://{}", p.path), 0),
                _ => continue,
            };
            if filters.port.is_some_and(|p| p != port) {
                continue;
            }
            let endpoint = if port == 0 { address } else { format!("{address}:{port}") };
            // Envoy reports an endpoint of unknown health as healthy.
            let status = match lb.health_status {
                0 | 1 => "HEALTHY".to_string(),
                s => envoy_types::pb::envoy::config::core::v3::HealthStatus::try_from(s)
                    .map(|h| h.as_str_name().to_string())
                    .unwrap_or_else(|_| s.to_string()),
            };
            rows.push(vec![endpoint, status, "OK".into(), cla.cluster_name.clone()]);
        }
    }
    rows.sort_by(|a, b| (&a[3], &a[0]).cmp(&(&b[3], &b[0])));
    render(&["ENDPOINT", "STATUS", "OUTLIER CHECK", "CLUSTER"], &rows, PADDING)
}

/// `RESOURCE NAME`, a line per secret meshpilot serves the proxy.
pub fn secrets(names: &[String]) -> String {
    let rows: Vec<Vec<String>> = names.iter().map(|n| vec![n.clone(), "Cert Chain".into(), "ACTIVE".into()]).collect();
    render(&["RESOURCE NAME", "TYPE", "STATUS"], &rows, PADDING)
}

fn cluster_type(c: &Cluster) -> String {
    match &c.cluster_discovery_type {
        Some(ClusterDiscoveryType::Type(t)) => {
            DiscoveryType::try_from(*t).map(|d| d.as_str_name().to_string()).unwrap_or_else(|_| t.to_string())
        }
        Some(ClusterDiscoveryType::ClusterType(custom)) => custom.name.clone(),
        None => DiscoveryType::Static.as_str_name().to_string(),
    }
}

/// The Istio object a resource came from (`name.namespace`), from its `istio.config` metadata.
fn managed_by(metadata: Option<&Metadata>) -> String {
    let config = metadata.and_then(|m| m.filter_metadata.get("istio")).and_then(|s| s.fields.get("config")).and_then(
        |v| match &v.kind {
            Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(s)) => Some(s.clone()),
            _ => None,
        },
    );
    // "/apis/networking.istio.io/v1/namespaces/NS/KIND/NAME"
    config
        .and_then(|path| {
            let parts: Vec<&str> = path.split('/').collect();
            match parts.as_slice() {
                [.., "namespaces", ns, _, name] => Some(format!("{name}.{ns}")),
                _ => None,
            }
        })
        .unwrap_or_else(|| "-".to_string())
}

fn socket_port(s: &envoy_types::pb::envoy::config::core::v3::SocketAddress) -> u32 {
    match s.port_specifier {
        Some(envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(p)) => p,
        _ => 0,
    }
}

fn listener_address(l: &Listener) -> (String, u32) {
    match l.address.as_ref().and_then(|a| a.address.as_ref()) {
        Some(address::Address::SocketAddress(s)) => (s.address.clone(), socket_port(s)),
        Some(address::Address::Pipe(p)) => (p.path.clone(), 0),
        _ => (String::new(), 0),
    }
}

/// istioctl's description of a filter chain match.
fn chain_match(m: Option<&FilterChainMatch>) -> String {
    let default = FilterChainMatch::default();
    let m = m.unwrap_or(&default);
    let mut parts = Vec::new();
    if !m.server_names.is_empty() {
        parts.push(format!("SNI: {}", m.server_names.join(",")));
    }
    if !m.transport_protocol.is_empty() {
        parts.push(format!("Trans: {}", m.transport_protocol));
    }
    if !m.application_protocols.is_empty() {
        let named: &[(&str, &[&str])] = &[
            ("App: HTTP TLS", &["http/1.0", "http/1.1", "h2c", "istio-http/1.0", "istio-http/1.1", "istio-h2"]),
            ("App: Istio HTTP Plain", &["istio", "istio-http/1.0", "istio-http/1.1", "istio-h2"]),
            ("App: TCP TLS", &["istio-peer-exchange", "istio"]),
            ("App: HTTP", &["http/1.0", "http/1.1", "h2c"]),
        ];
        let found = named.iter().find(|(_, protocols)| m.application_protocols.iter().eq(protocols.iter()));
        parts.push(match found {
            Some((name, _)) => name.to_string(),
            None => format!("App: {}", m.application_protocols.join(",")),
        });
    }
    let port = m.destination_port.map(|p| format!(":{}", p.value)).unwrap_or_default();
    if !m.prefix_ranges.is_empty() {
        let ranges: Vec<String> = m
            .prefix_ranges
            .iter()
            .map(|r| format!("{}/{}", r.address_prefix, r.prefix_len.map_or(0, |l| l.value)))
            .collect();
        parts.push(format!("Addr: {}{port}", ranges.join(",")));
    } else if !port.is_empty() {
        parts.push(format!("Addr: *{port}"));
    }
    if parts.is_empty() {
        "ALL".to_string()
    } else {
        parts.join("; ")
    }
}

/// istioctl's description of where a filter chain sends traffic.
fn destination(filters: &[envoy_types::pb::envoy::config::listener::v3::Filter]) -> String {
    for f in filters {
        let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else { continue };
        if f.name == "envoy.filters.network.http_connection_manager" {
            let Ok(hcm) = HttpConnectionManager::decode(any.value.as_slice()) else { return "HTTP".into() };
            return match hcm.route_specifier {
                Some(RouteSpecifier::Rds(rds)) => format!("Route: {}", rds.route_config_name),
                Some(RouteSpecifier::RouteConfig(rc)) => inline_route(&rc),
                _ => "HTTP".into(),
            };
        }
        if f.name == "envoy.filters.network.tcp_proxy" {
            let Ok(tcp) = TcpProxy::decode(any.value.as_slice()) else { continue };
            if let Some(tcp_proxy::ClusterSpecifier::Cluster(cluster)) = tcp.cluster_specifier {
                if cluster == "BlackHoleCluster" {
                    continue;
                }
                return if cluster.contains("Cluster") { cluster } else { format!("Cluster: {cluster}") };
            }
        }
    }
    "Non-HTTP/Non-TCP".into()
}

fn inline_route(rc: &RouteConfiguration) -> String {
    if let [vh] = rc.virtual_hosts.as_slice() {
        if vh.domains == ["*"] {
            if let [r] = vh.routes.as_slice() {
                let prefix_all = matches!(
                    r.r#match.as_ref().and_then(|m| m.path_specifier.as_ref()),
                    Some(PathSpecifier::Prefix(p)) if p == "/"
                );
                if let (true, Some(cluster)) = (prefix_all, route_cluster(r)) {
                    return if cluster.contains("Cluster") { cluster } else { format!("Cluster: {cluster}") };
                }
            }
        }
    }
    let vhosts: Vec<String> = rc
        .virtual_hosts
        .iter()
        .map(|vh| {
            let matches: Vec<String> =
                vh.routes.iter().filter_map(|r| r.r#match.as_ref()).map(describe_match).collect();
            let routes = matches.join(", ");
            if vh.domains == ["*"] {
                routes
            } else {
                format!("{} {routes}", vh.domains.join("/"))
            }
        })
        .collect();
    format!("Inline Route: {}", vhosts.join("; "))
}

fn route_cluster(r: &envoy_types::pb::envoy::config::route::v3::Route) -> Option<String> {
    match &r.action {
        Some(route::Action::Route(a)) => match &a.cluster_specifier {
            Some(route_action::ClusterSpecifier::Cluster(c)) => Some(c.clone()),
            _ => None,
        },
        _ => None,
    }
}

fn is_passthrough(r: &envoy_types::pb::envoy::config::route::v3::Route) -> bool {
    route_cluster(r).as_deref() == Some("PassthroughCluster")
}

fn describe_match(m: &RouteMatch) -> String {
    match &m.path_specifier {
        Some(PathSpecifier::Prefix(p)) => format!("{p}*"),
        Some(PathSpecifier::Path(p)) => p.clone(),
        Some(PathSpecifier::SafeRegex(r)) => format!("regex {}", r.regex),
        Some(PathSpecifier::PathSeparatedPrefix(p)) => format!("PathPrefix:{p}"),
        _ => String::new(),
    }
}

/// The shortest names of a virtual host: its domains without ports, at most two and a count.
fn domains(vh: &VirtualHost) -> String {
    if let [one] = vh.domains.as_slice() {
        return one.clone();
    }
    let names: Vec<&str> =
        vh.domains.iter().map(String::as_str).filter(|d| !d.contains(':') || d.ends_with(']')).collect();
    match names.len() {
        0..=2 => names.join(", "),
        n => format!("{} + {} more...", names[..2].join(", "), n - 2),
    }
}
