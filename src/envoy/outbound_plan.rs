//! Which outbound listeners a sidecar gets, laid out as istiod lays them out: one listener per
//! Sidecar egress HTTP port (or port with a bind), and for the catch-all egress listener and the
//! other egress ports one per service port, keyed by address and port. HTTP ports share the
//! wildcard address (their virtual hosts tell services apart); a TCP, TLS or sniffed port of a service with a virtual IP gets a listener on that IP
//! (`VIP_PORT`), which `virtualOutbound` hands its connections to; a service without one (or
//! with a CIDR) shares the wildcard listener, told apart by CIDR or SNI. Services meeting at one
//! address and port share its listener, which is sniffed when HTTP and TCP meet there.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use super::names::{listener_name, LOCALHOST, WILDCARD_ADDRESS};
use super::scope::{Imports, Scope};
use crate::config::api::sidecar::CaptureMode;
use crate::config::api::Protocol;
use crate::config::Spec;
use crate::registry::{Endpoint, Service, ServiceOrigin};

/// How an outbound listener treats connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ListenerProtocol {
    /// HTTP connection manager with RDS route config `PORT`.
    Http,
    /// TCP proxy per service.
    Tcp,
    /// TCP proxy per SNI.
    Tls,
    /// Sniffed (a service of unknown protocol, or HTTP and TCP services, on the address and
    /// port): HTTP, recognised by the HTTP inspector, to the connection manager; the rest as on
    /// a TCP listener.
    Auto,
}

/// One outbound listener of a sidecar.
pub(super) struct OutboundListener<'a> {
    /// `ADDRESS_PORT`.
    pub name: String,
    /// Address.
    pub address: String,
    /// Port.
    pub port: u16,
    /// Whether Envoy binds the address (else only `virtualOutbound` hands connections to it).
    pub bound: bool,
    /// Protocol.
    pub protocol: ListenerProtocol,
    /// What the listener's hosts are.
    pub imports: Imports<'a>,
    /// For a listener laid out by service address (the catch-all egress listener's, and an
    /// explicit non-HTTP port's without bind): the services whose ports landed on it, in import
    /// order (`None` for an explicit listener on one address: every imported service on the port).
    pub members: Option<Vec<Member<'a>>>,
    /// Whether the address is the members' own virtual IP: their chains then match no
    /// destination, and a sniffed listener routes HTTP by a route configuration of its own.
    pub at_vip: bool,
}

/// A service on a catch-all listener.
pub(super) struct Member<'a> {
    /// The service.
    pub service: &'a Arc<Service>,
    /// Its port's protocol.
    pub protocol: Protocol,
    /// The CIDR that tells its connections apart on a shared listener (a ServiceEntry counts
    /// once per address, as istiod splits it into a service per address).
    pub cidr: Option<String>,
}

impl OutboundListener<'_> {
    /// The route configuration its HTTP connection manager fetches: `PORT`, shared by the
    /// port's HTTP services, or `HOST:PORT` for a sniffed service on its own address (as istiod
    /// names it, holding only that service's virtual host).
    pub(super) fn route_name(&self) -> String {
        match (&self.members, self.at_vip && self.protocol == ListenerProtocol::Auto) {
            (Some(members), true) if !members.is_empty() => format!("{}:{}", members[0].service.hostname, self.port),
            _ => self.port.to_string(),
        }
    }
}

/// The sidecar's outbound listeners, first claim of a name winning.
pub(super) fn outbound_plan<'a>(scope: &Scope<'a>) -> Vec<OutboundListener<'a>> {
    let intercepted = scope.view.interception.intercepts();
    let mut out: Vec<OutboundListener<'a>> = Vec::new();
    for egress in scope.egress_listeners() {
        let Some(port) = &egress.port else { continue };
        let Some(number) = u16::try_from(port.number).ok().filter(|n| *n != 0) else { continue };
        let declared = Protocol::parse(if port.protocol.is_empty() {
            port.name.split('-').next().unwrap_or_default()
        } else {
            &port.protocol
        });
        let imports = Imports::of(egress, scope.namespace());
        let services = scope.services_in(imports);
        // As istiod builds an egress port's listener per service: none without a service there.
        if services.is_empty() {
            continue;
        }
        let protocol = listener_protocol([declared].into_iter());
        let binds = egress.capture_mode == Some(CaptureMode::None) || !intercepted;
        if egress.bind.is_empty() && !binds && protocol != ListenerProtocol::Http {
            // istiod listens on each service's own address, as for the catch-all listener.
            let services = services.into_iter().map(|s| (s, number, declared));
            out.extend(service_listeners(scope, services, imports, Layout::explicit(), &HashSet::new()));
            continue;
        }
        let address = match (egress.bind.as_str(), binds) {
            ("", true) => LOCALHOST.to_string(),
            ("", false) => WILDCARD_ADDRESS.to_string(),
            (bind, _) => bind.to_string(),
        };
        out.push(OutboundListener {
            name: listener_name(&address, number),
            address,
            port: number,
            bound: binds,
            protocol,
            imports,
            members: None,
            at_vip: false,
        });
    }
    // The catch-all listener adds nothing at an address and port an explicit listener holds
    // (istiod locks those), and may add at the same port elsewhere (another service's address).
    let claimed: HashSet<(String, u16)> = out.iter().map(|l| (l.address.clone(), l.port)).collect();
    if let Some(imports) = scope.catch_all_imports() {
        let services = scope
            .services_in(imports)
            .into_iter()
            .flat_map(|svc| svc.ports.iter().filter(|p| p.number != 0).map(move |p| (svc, p.number, p.protocol)));
        out.extend(service_listeners(scope, services, imports, Layout::catch_all(intercepted), &claimed));
    }
    let mut names = HashSet::new();
    out.retain(|l| names.insert(l.name.clone()));
    out
}

/// How [`service_listeners`] lays service ports out.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// The address services without one of their own share.
    shared: &'static str,
    /// Whether connections are intercepted (so a listener can sit on a service's address).
    intercepted: bool,
    /// Whether a headless service's non-HTTP port gets a listener per endpoint address.
    per_endpoint: bool,
}

impl Layout {
    /// An explicit non-HTTP egress port without bind (intercepted).
    fn explicit() -> Self {
        Layout { shared: WILDCARD_ADDRESS, intercepted: true, per_endpoint: false }
    }

    /// The catch-all egress listener. Without interception every listener binds localhost: there
    /// is no original destination to tell services apart by address.
    fn catch_all(intercepted: bool) -> Self {
        let shared = if intercepted { WILDCARD_ADDRESS } else { LOCALHOST };
        Layout { shared, intercepted, per_endpoint: intercepted }
    }
}

/// Listeners for service ports laid out by address (see the module's doc), in port order: a
/// non-HTTP port on the service's own addresses when intercepted (a headless service's, on its
/// endpoints' addresses), else on the shared address told apart by CIDR. Addresses and ports in
/// `claimed` are left out.
fn service_listeners<'a>(
    scope: &Scope<'a>,
    services: impl Iterator<Item = (&'a Arc<Service>, u16, Protocol)>,
    imports: Imports<'a>,
    layout: Layout,
    claimed: &HashSet<(String, u16)>,
) -> Vec<OutboundListener<'a>> {
    let shared = layout.shared;
    let mut entries: Vec<OutboundListener<'a>> = Vec::new();
    let mut index: HashMap<(String, u16), usize> = HashMap::new();
    let intercepted = layout.intercepted;
    for (svc, port, protocol) in services {
        let mut own = if intercepted && !protocol.is_http() { listen_addresses(svc) } else { Vec::new() };
        if layout.per_endpoint && !protocol.is_http() && svc.is_headless() {
            match endpoint_addresses(scope, svc, port) {
                Some(addresses) => own = addresses,
                None => continue,
            }
        }
        let cidrs = if intercepted && own.is_empty() { shared_cidrs(svc) } else { vec![None] };
        let addresses: Vec<(String, Option<String>)> = if own.is_empty() {
            cidrs.into_iter().map(|c| (shared.to_string(), c)).collect()
        } else {
            own.into_iter().map(|a| (a, None)).collect()
        };
        for (address, cidr) in addresses {
            if claimed.contains(&(address.clone(), port)) {
                continue;
            }
            let at_vip = address != shared;
            let i = *index.entry((address.clone(), port)).or_insert_with(|| {
                entries.push(OutboundListener {
                    name: listener_name(&address, port),
                    address: address.clone(),
                    port,
                    bound: !intercepted,
                    protocol: ListenerProtocol::Tcp,
                    imports,
                    members: Some(Vec::new()),
                    at_vip,
                });
                entries.len() - 1
            });
            if let Some(members) = entries[i].members.as_mut() {
                members.push(Member { service: svc, protocol, cidr });
            }
        }
    }
    for entry in &mut entries {
        let protocols: Vec<Protocol> = entry.members.iter().flatten().map(|m| m.protocol).collect();
        entry.protocol = listener_protocol(protocols.into_iter());
    }
    entries.sort_by_key(|e| (e.port, e.at_vip, e.address.clone()));
    entries
}

/// The addresses a headless service's port listens on, as istiod lays them out: each endpoint's
/// IP, but the proxy's own (its inbound listener takes that traffic); `Some(empty)` (the shared
/// address) for a ServiceEntry without endpoints or workload selector; `None` (no listener) for
/// a Kubernetes Service or selecting ServiceEntry without endpoints, or when the proxy is the only
/// one.
fn endpoint_addresses(scope: &Scope<'_>, svc: &Service, port: u16) -> Option<Vec<String>> {
    let service_port = svc.port(port)?;
    let endpoints = scope.snapshot.endpoints(svc).map(|e| e.as_slice()).unwrap_or_default();
    let serving: Vec<&Endpoint> = endpoints.iter().filter(|e| e.port_for(service_port).is_some()).collect();
    if serving.is_empty() {
        let selects = match &svc.origin {
            ServiceOrigin::Kube(_) => true,
            ServiceOrigin::Config(key) => scope
                .snapshot
                .configs
                .get(key)
                .is_some_and(|c| matches!(&c.spec, Spec::ServiceEntry(se) if se.workload_selector.is_some())),
        };
        return (!selects).then(Vec::new);
    }
    let own_ip = scope.view.ips.first().map(String::as_str);
    let mut out: Vec<String> = Vec::new();
    for e in serving {
        let Ok(ip) = e.address.parse::<IpAddr>() else { continue };
        let ip = ip.to_string();
        if Some(ip.as_str()) != own_ip && !out.contains(&ip) {
            out.push(ip);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The addresses a service's TCP port listens on: its virtual IP (a Kubernetes Service's first
/// cluster IP; each IP of a ServiceEntry, which istiod splits into a service per address). A
/// CIDR is matched on the wildcard listener instead.
fn listen_addresses(svc: &Service) -> Vec<String> {
    let ips = svc.addresses.iter().filter_map(|a| a.parse::<IpAddr>().ok()).map(|ip| ip.to_string());
    match svc.origin {
        ServiceOrigin::Kube(_) => ips.take(1).collect(),
        ServiceOrigin::Config(_) => ips.collect(),
    }
}

/// The CIDRs of a service without a virtual IP of its own, each telling it apart on the shared
/// listener: a Kubernetes Service's together, a ServiceEntry's one by one (istiod splits it into a
/// service per address); `[None]` without any.
fn shared_cidrs(svc: &Service) -> Vec<Option<String>> {
    let cidrs: Vec<String> = svc.addresses.iter().filter(|a| a.contains('/')).cloned().collect();
    match (&svc.origin, cidrs.is_empty()) {
        (_, true) => vec![None],
        (ServiceOrigin::Config(_), false) => cidrs.into_iter().map(Some).collect(),
        (ServiceOrigin::Kube(_), false) => vec![Some(cidrs.join(","))],
    }
}

/// A port with a service of unknown protocol, or with HTTP and other protocols, is sniffed, as
/// in Istio; TLS needs every service to be TLS.
pub(super) fn listener_protocol(mut protocols: impl Iterator<Item = Protocol> + Clone) -> ListenerProtocol {
    let http = protocols.clone().any(Protocol::is_http);
    if protocols.clone().any(|p| p == Protocol::Unsupported) || (http && protocols.clone().any(|p| !p.is_http())) {
        ListenerProtocol::Auto
    } else if http {
        ListenerProtocol::Http
    } else if protocols.all(|p| matches!(p, Protocol::Tls | Protocol::Https)) {
        ListenerProtocol::Tls
    } else {
        ListenerProtocol::Tcp
    }
}

/// The services a listener's route configuration serves, each with the service port its cluster
/// is for: a sniffed VIP listener's own services; else every imported service with the
/// listener's port.
pub(super) fn services_on_port<'a>(scope: &Scope<'a>, l: &OutboundListener<'a>) -> Vec<(&'a Arc<Service>, u16)> {
    if let (Some(members), true) = (&l.members, l.at_vip) {
        return members.iter().map(|m| (m.service, l.port)).collect();
    }
    scope.services_in(l.imports).into_iter().filter_map(|s| Some((s, s.port(l.port)?.number))).collect()
}

/// A service a listener's chains serve: the service, its port there, the port's protocol and
/// the destinations telling its connections apart.
pub(super) type ChainService<'a> = (&'a Arc<Service>, u16, Protocol, Vec<String>);

/// The services a listener's chains serve: a catch-all listener's members (by their CIDR); an
/// explicit listener's services on its port (by their addresses).
pub(super) fn chain_services<'a>(scope: &Scope<'a>, l: &OutboundListener<'a>) -> Vec<ChainService<'a>> {
    match &l.members {
        Some(members) => members
            .iter()
            .map(|m| {
                let cidrs = m.cidr.iter().flat_map(|c| c.split(',')).map(str::to_string).collect();
                (m.service, l.port, m.protocol, cidrs)
            })
            .collect(),
        None => services_on_port(scope, l)
            .into_iter()
            .map(|(s, port)| {
                let protocol = s.port(port).map(|p| p.protocol).unwrap_or(Protocol::Tcp);
                (s, port, protocol, s.addresses.clone())
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use crate::envoy::testing::{names, sidecar_at, snapshot};
    use crate::envoy::TypeUrl;

    const HEADLESS: &str = "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: data}
spec:
  hosts: [db.data.internal]
  location: MESH_INTERNAL
  resolution: NONE
  ports: [{number: 9042, name: tcp-cql, protocol: TCP}, {number: 8080, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: db}}
";

    fn workload(name: &str, ip: &str) -> String {
        format!(
            "---\napiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {{name: {name}, namespace: data}}\n\
             spec: {{address: {ip}, labels: {{app: db}}}}\n"
        )
    }

    fn listeners(yaml: &str, ip: &str) -> Vec<String> {
        let s = snapshot(yaml);
        let view = sidecar_at("data", &[], &[ip]).resolve(&s);
        names(&s, &view, TypeUrl::Listener)
            .into_iter()
            .filter(|n| n.ends_with("_9042") || n.ends_with("_8080"))
            .collect()
    }

    #[test]
    fn a_headless_services_tcp_port_listens_on_each_endpoint_but_the_proxys_own() {
        let two = format!("{HEADLESS}{}{}", workload("db-0", "10.0.0.1"), workload("db-1", "10.0.0.2"));
        assert_eq!(listeners(&two, "10.9.9.9"), ["0.0.0.0_8080", "10.0.0.1_9042", "10.0.0.2_9042"]);
        // One of its endpoints reaches itself through its inbound listener, not an outbound one.
        assert_eq!(listeners(&two, "10.0.0.1"), ["0.0.0.0_8080", "10.0.0.2_9042"]);
        // Selecting no workload yet: no listener; selecting none at all: the wildcard listener.
        assert_eq!(listeners(HEADLESS, "10.9.9.9"), ["0.0.0.0_8080"]);
        let unselecting = HEADLESS.replace("  workloadSelector: {labels: {app: db}}\n", "");
        assert_eq!(listeners(&unselecting, "10.9.9.9"), ["0.0.0.0_8080", "0.0.0.0_9042"]);
    }
}
