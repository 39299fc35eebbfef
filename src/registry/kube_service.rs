//! Kubernetes Services → registry services, as Istio's Kubernetes registry converts them:
//! hostname `name.namespace.svc.<domain>`, ports with Istio's protocol selection, cluster IPs,
//! `exportTo` from the `networking.istio.io/exportTo` annotation.
//!
//! - Headless Services (`clusterIP: None`) resolve as Passthrough; their endpoints are still listed.
//! - ExternalName Services are aliases of `externalName`, as istiod's ExternalName alias takes
//!   them: no config of their own, their names served by the target's virtual hosts.
//! - UDP ports are left out: Envoy sidecars carry no UDP, and Istio skips them when building config.

use super::kubernetes::{KubeKey, KubeKind, KubeService, KubeServicePort, ServiceType, TargetPort};
use super::service::{Resolution, Service, ServiceOrigin, ServicePort};
use super::{Hostname, Visibility};
use crate::config::api::Protocol;
use crate::mesh::MeshConfig;

/// Ports on which an unnamed, unknown protocol is taken as TCP, as Istio does: SMTP, DNS, MySQL and
/// MongoDB speak first or break under protocol sniffing.
const WELL_KNOWN_TCP_PORTS: [u16; 4] = [25, 53, 3306, 27017];

/// The hostname of a Kubernetes Service: `name.namespace.svc.<domain>`.
pub fn kube_hostname(name: &str, namespace: &str, domain: &str) -> Hostname {
    Hostname::new(&format!("{name}.{namespace}.svc.{domain}"))
}

/// The registry service of a Kubernetes Service.
pub(super) fn service_from_kube(svc: &KubeService, mesh: &MeshConfig) -> Service {
    let external_name =
        svc.external_name.as_deref().filter(|n| svc.service_type == ServiceType::ExternalName && !n.is_empty());
    // Istio checks headless after ExternalName, so `clusterIP: None` wins.
    let resolution = if svc.headless {
        Resolution::Passthrough
    } else if external_name.is_some() {
        Resolution::Alias
    } else {
        Resolution::Static
    };
    let export_to: Vec<String> = svc.export_to.iter().map(|e| e.trim().to_string()).filter(|e| !e.is_empty()).collect();
    Service {
        hostname: kube_hostname(&svc.name, &svc.namespace, &mesh.domain),
        namespace: svc.namespace.clone(),
        ports: svc
            .ports
            .iter()
            .filter(|p| !p.protocol.eq_ignore_ascii_case("UDP"))
            .map(|p| ServicePort {
                name: p.name.clone(),
                number: p.port,
                protocol: kube_port_protocol(p),
                // An ExternalName target is reached on the service port (Kubernetes ignores targetPort there).
                target_port: match (&p.target_port, external_name) {
                    (Some(TargetPort::Number(n)), None) => Some(*n),
                    _ => None,
                },
            })
            .collect(),
        addresses: if svc.headless { Vec::new() } else { svc.cluster_ips.clone() },
        resolution,
        mesh_external: external_name.is_some(),
        visibility: Visibility::from_export_to(&export_to, &svc.namespace, &mesh.default_service_export_to),
        origin: ServiceOrigin::Kube(KubeKey {
            kind: KubeKind::Service,
            namespace: svc.namespace.clone(),
            name: svc.name.clone(),
        }),
        subject_alt_names: Vec::new(),
        alias_of: external_name.filter(|_| !svc.headless).map(Hostname::new),
    }
}

/// Istio's protocol selection for a Service port: `appProtocol` (with Kubernetes' standard
/// `kubernetes.io/h2c`, `ws`, `wss` names), else the port name; either as a protocol or as a
/// `protocol-suffix` prefix (`grpc-web` checked whole first); unknown protocols on a few well-known
/// ports are TCP.
pub fn kube_port_protocol(port: &KubeServicePort) -> Protocol {
    let name = match port.app_protocol.as_deref() {
        Some("kubernetes.io/h2c") => return Protocol::Http2,
        Some("kubernetes.io/ws") => return Protocol::Http,
        Some("kubernetes.io/wss") => return Protocol::Https,
        Some(app) => app,
        None => port.name.as_str(),
    };
    let is_grpc_web = name.get(..8).is_some_and(|p| p.eq_ignore_ascii_case("grpc-web"));
    let prefix = if is_grpc_web { "grpc-web" } else { name.split('-').next().unwrap_or_default() };
    match Protocol::parse(prefix) {
        Protocol::Unsupported if WELL_KNOWN_TCP_PORTS.contains(&port.port) => Protocol::Tcp,
        protocol => protocol,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::api::Labels;

    fn port(name: &str, number: u16, app_protocol: Option<&str>) -> KubeServicePort {
        KubeServicePort {
            name: name.into(),
            port: number,
            protocol: "TCP".into(),
            app_protocol: app_protocol.map(str::to_string),
            target_port: None,
        }
    }

    pub(crate) fn service(name: &str, ns: &str) -> KubeService {
        KubeService {
            name: name.into(),
            namespace: ns.into(),
            labels: Labels::new(),
            selector: None,
            service_type: ServiceType::ClusterIp,
            cluster_ips: vec!["10.96.0.10".into()],
            headless: false,
            external_name: None,
            ports: vec![port("http", 80, None)],
            export_to: Vec::new(),
        }
    }

    #[test]
    fn protocol_from_app_protocol_then_name_prefix() {
        let p = |name: &str, number: u16, app: Option<&str>| kube_port_protocol(&port(name, number, app));
        assert_eq!(p("tcp-metrics", 80, Some("http")), Protocol::Http, "appProtocol beats the name");
        assert_eq!(p("http", 80, Some("kubernetes.io/h2c")), Protocol::Http2);
        assert_eq!(p("x", 80, Some("kubernetes.io/wss")), Protocol::Https);
        assert_eq!(p("http-foo", 80, None), Protocol::Http);
        assert_eq!(p("HTTP2", 80, None), Protocol::Http2);
        assert_eq!(p("grpc-web", 80, None), Protocol::Grpc);
        assert_eq!(p("grpc-web-ui", 80, None), Protocol::Grpc);
        assert_eq!(p("grpc", 80, None), Protocol::Grpc);
        assert_eq!(p("tcp", 80, None), Protocol::Tcp);
        assert_eq!(p("tls-db", 80, None), Protocol::Tls);
        assert_eq!(p("mongo", 80, None), Protocol::Mongo);
        assert_eq!(p("redis-cache", 80, None), Protocol::Redis);
        assert_eq!(p("web", 80, None), Protocol::Unsupported);
        assert_eq!(p("", 8080, None), Protocol::Unsupported);
        assert_eq!(p("", 3306, None), Protocol::Tcp, "well-known port");
        assert_eq!(p("httpx", 80, None), Protocol::Unsupported, "a prefix is a whole protocol name");
    }

    #[test]
    fn hostnames_use_the_mesh_domain_and_udp_ports_are_skipped() {
        let mesh = MeshConfig { domain: "corp.internal".into(), ..MeshConfig::default() };
        let mut svc = service("reviews", "shop");
        svc.ports.push(KubeServicePort { protocol: "UDP".into(), ..port("dns", 53, None) });
        svc.export_to = vec![" . ".into()];
        let s = service_from_kube(&svc, &mesh);
        assert_eq!(s.hostname.as_str(), "reviews.shop.svc.corp.internal");
        assert_eq!(s.ports.len(), 1);
        assert_eq!((s.resolution, s.mesh_external), (Resolution::Static, false));
        assert_eq!(s.addresses, ["10.96.0.10"]);
        assert!(s.visibility.visible_to("shop") && !s.visibility.visible_to("other"));
        assert_eq!(s.origin.to_string(), "Service shop/reviews");
    }

    #[test]
    fn headless_and_external_name_services() {
        let mesh = MeshConfig::default();
        let mut headless = service("db", "shop");
        headless.headless = true;
        headless.cluster_ips.clear();
        let s = service_from_kube(&headless, &mesh);
        assert_eq!((s.resolution, s.addresses.len()), (Resolution::Passthrough, 0));

        let mut ext = service("search", "shop");
        ext.service_type = ServiceType::ExternalName;
        ext.external_name = Some("search.example.com".into());
        ext.cluster_ips.clear();
        ext.ports[0].target_port = Some(TargetPort::Number(8080));
        let s = service_from_kube(&ext, &mesh);
        assert_eq!(
            (s.resolution, s.alias_of.as_ref().map(Hostname::as_str)),
            (Resolution::Alias, Some("search.example.com"))
        );
        assert_eq!(s.ports[0].target_port, None, "ExternalName is reached on the service port");
    }
}
