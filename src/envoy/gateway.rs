//! Gateway servers of a router, merged by listener address and port, and how Istio's `ns/host`
//! server hosts select VirtualServices.

use std::collections::BTreeMap;

use super::names::{gateway_https_route_name, WILDCARD_ADDRESS};
use super::scope::{Scope, VsRef};
use crate::config::api::gateway::Server;
use crate::config::api::Protocol;
use crate::registry::host_matches;

/// What a server does with connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ServerKind {
    /// Plain HTTP, routed by route configuration `http.PORT`.
    Http,
    /// HTTPS terminated here, routed by its own route configuration.
    HttpsTerminated {
        /// `https.PORT.PORTNAME.GATEWAY.NAMESPACE`.
        route_name: String,
    },
    /// TLS terminated here, forwarded by VirtualService TCP rules.
    TlsTerminated,
    /// TLS forwarded by SNI, per VirtualService TLS rules.
    TlsPassthrough,
    /// TLS forwarded by Istio's SNI (`outbound_.PORT_.SUBSET_.HOST`) to that cluster, without
    /// VirtualService: the mesh's mutual TLS passes through (east-west gateways).
    AutoPassthrough,
    /// Opaque TCP, forwarded by VirtualService TCP rules.
    Tcp,
}

/// One server of a Gateway selecting this router.
pub(super) struct GatewayServer<'a> {
    /// The gateway as VirtualServices name it: `namespace/name`.
    pub gateway: String,
    /// Namespace of the Gateway.
    pub namespace: &'a str,
    /// The server.
    pub server: &'a Server,
    /// Port number.
    pub port: u16,
    /// What it does.
    pub kind: ServerKind,
}

impl GatewayServer<'_> {
    /// The server's hosts allowed for a VirtualService in `vs_ns` (`*/h`, `./h` for the gateway's
    /// namespace, `ns/h`, or plain `h`), lower-cased.
    pub(super) fn hosts_for(&self, vs_ns: &str) -> Vec<String> {
        self.server
            .hosts
            .iter()
            .filter_map(|h| {
                let (ns, host) = h.split_once('/').unwrap_or(("*", h.as_str()));
                let allowed = match ns {
                    "*" => true,
                    "." => vs_ns == self.namespace,
                    "~" => false,
                    other => other == vs_ns,
                };
                allowed.then(|| host.to_ascii_lowercase())
            })
            .collect()
    }

    /// The server's hosts without namespace part, lower-cased.
    pub(super) fn plain_hosts(&self) -> Vec<String> {
        self.server.hosts.iter().map(|h| h.rsplit('/').next().unwrap_or(h).to_ascii_lowercase()).collect()
    }

    /// Hosts of a VirtualService this server exposes: the more specific of each overlapping pair.
    pub(super) fn exposed_hosts(&self, (ix, _): VsRef<'_>) -> Vec<String> {
        let server_hosts = self.hosts_for(&ix.config.key.namespace);
        let mut out: Vec<String> = Vec::new();
        for vs_host in &ix.hosts {
            for s in &server_hosts {
                let exposed = if host_matches(s, vs_host.as_str()) {
                    vs_host.as_str()
                } else if host_matches(vs_host.as_str(), s) {
                    s.as_str()
                } else {
                    continue;
                };
                if !out.iter().any(|h| h == exposed) {
                    out.push(exposed.to_string());
                }
            }
        }
        out
    }

    /// Whether the server sends plain-HTTP clients to HTTPS.
    pub(super) fn https_redirect(&self) -> bool {
        self.server.tls.as_ref().is_some_and(|t| t.https_redirect)
    }
}

/// Servers sharing one listener (bind address and port).
pub(super) struct GatewayPort<'a> {
    /// Listener address.
    pub address: String,
    /// Port.
    pub port: u16,
    /// Servers, in Gateway key then declaration order.
    pub servers: Vec<GatewayServer<'a>>,
}

/// Whether one of the router's servers is AUTO_PASSTHROUGH (then it gets SNI-DNAT clusters).
pub(super) fn has_auto_passthrough(scope: &Scope<'_>) -> bool {
    gateway_ports(scope).iter().flat_map(|gp| &gp.servers).any(|s| s.kind == ServerKind::AutoPassthrough)
}

/// The router's servers grouped by listener, in address then port order.
pub(super) fn gateway_ports<'a>(scope: &Scope<'a>) -> Vec<GatewayPort<'a>> {
    let mut by_listener: BTreeMap<(String, u16), Vec<GatewayServer<'a>>> = BTreeMap::new();
    for (config, gateway) in scope.snapshot.gateways_for(&scope.view.labels) {
        for server in &gateway.servers {
            let Some(port) = &server.port else { continue };
            let Some(number) = u16::try_from(port.number).ok().filter(|n| *n != 0) else { continue };
            let Some(kind) = server_kind(server, number, &config.key.name, &config.key.namespace) else { continue };
            let address = if server.bind.is_empty() { WILDCARD_ADDRESS.to_string() } else { server.bind.clone() };
            by_listener.entry((address, number)).or_default().push(GatewayServer {
                gateway: format!("{}/{}", config.key.namespace, config.key.name),
                namespace: &config.key.namespace,
                server,
                port: number,
                kind,
            });
        }
    }
    by_listener.into_iter().map(|((address, port), servers)| GatewayPort { address, port, servers }).collect()
}

/// Istio's server protocol handling; `None` for servers meshpilot cannot serve (HTTPS without
/// TLS settings).
fn server_kind(server: &Server, port: u16, gateway: &str, namespace: &str) -> Option<ServerKind> {
    let port_spec = server.port.as_ref()?;
    let protocol = Protocol::parse(&port_spec.protocol);
    // Istio's default TLS mode is PASSTHROUGH.
    let mode = server.tls.as_ref().map(|t| t.mode.as_deref().unwrap_or("PASSTHROUGH"));
    if protocol.is_http() {
        return Some(ServerKind::Http);
    }
    let passthrough = matches!(mode, Some("PASSTHROUGH" | "AUTO_PASSTHROUGH"));
    let terminated = matches!(mode, Some("SIMPLE" | "MUTUAL" | "OPTIONAL_MUTUAL" | "ISTIO_MUTUAL"));
    match protocol {
        Protocol::Https if terminated => Some(ServerKind::HttpsTerminated {
            route_name: gateway_https_route_name(port, &port_spec.name, gateway, namespace),
        }),
        Protocol::Https | Protocol::Tls if mode == Some("AUTO_PASSTHROUGH") => Some(ServerKind::AutoPassthrough),
        Protocol::Https | Protocol::Tls if passthrough => Some(ServerKind::TlsPassthrough),
        Protocol::Tls if terminated => Some(ServerKind::TlsTerminated),
        Protocol::Https | Protocol::Tls => None,
        _ => Some(ServerKind::Tcp),
    }
}
