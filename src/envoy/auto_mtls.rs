//! Auto mTLS (mesh config `enableAutoMtls`, on by default): a cluster whose DestinationRule sets
//! no TLS gets Istio's transport socket matches, ISTIO_MUTUAL for endpoints labelled
//! `security.istio.io/tlsMode: istio` (workloads with a sidecar) and plaintext for the rest.
//! Skipped, as in Istio, for services outside the mesh, original-destination clusters, and
//! services whose namespace (or the mesh) disables mutual TLS; and for proxies without
//! pilot-agent, which have no workload certificate (plaintext, as to a workload without sidecar).

use envoy_types::pb::envoy::config::cluster::v3::cluster::TransportSocketMatch;
use envoy_types::pb::envoy::config::core::v3::{transport_socket, Metadata, TransportSocket};
use envoy_types::pb::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer;
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

use super::mtls::istio_mutual_transport_socket;
use super::proto::{any, map_field};
use super::scope::Scope;
use super::tls::Upstream;
use crate::config::api::peer_authentication::MtlsMode;
use crate::registry::{Endpoint, Resolution, Service};

/// The endpoint metadata key transport socket matches read.
const TRANSPORT_SOCKET_MATCH: &str = "envoy.transport_socket_match";
/// The raw buffer transport socket.
const RAW_BUFFER_SOCKET: &str = "envoy.transport_sockets.raw_buffer";

/// The cluster's transport socket matches under auto mTLS; empty when it does not apply.
pub(super) fn auto_mtls_matches(
    scope: &Scope<'_>,
    service: &Service,
    upstream: &Upstream<'_>,
) -> Vec<TransportSocketMatch> {
    let mesh = &scope.snapshot.mesh;
    let applies = mesh.enable_auto_mtls
        && scope.view.agent_sds
        && !service.mesh_external
        && service.resolution != Resolution::Passthrough
        && scope.snapshot.namespace_mtls_mode(&service.namespace) != MtlsMode::Disable;
    if !applies {
        return Vec::new();
    }
    let mtls = istio_mutual_transport_socket(&upstream.istio_sni, &upstream.service_sans, upstream.http2);
    vec![
        TransportSocketMatch {
            name: "tlsMode-istio".into(),
            r#match: Some(tls_mode_struct()),
            transport_socket: Some(mtls),
        },
        TransportSocketMatch {
            name: "tlsMode-disabled".into(),
            r#match: Some(Struct::default()),
            transport_socket: Some(TransportSocket {
                name: RAW_BUFFER_SOCKET.into(),
                config_type: Some(transport_socket::ConfigType::TypedConfig(any(RawBuffer::default()))),
            }),
        },
    ]
}

/// `{tlsMode: istio}`.
fn tls_mode_struct() -> Struct {
    let value = Value { kind: Some(Kind::StringValue("istio".into())) };
    Struct { fields: map_field([("tlsMode".to_string(), value)]) }
}

/// The EDS metadata of an endpoint whose workload has a sidecar, which the `tlsMode-istio`
/// match selects.
pub(super) fn endpoint_metadata(endpoint: &Endpoint) -> Option<Metadata> {
    endpoint.istio_mtls.then(|| Metadata {
        filter_metadata: map_field([(TRANSPORT_SOCKET_MATCH.to_string(), tls_mode_struct())]),
        ..Default::default()
    })
}

/// The SPIFFE identities of a service's workloads (`spiffe://TRUST_DOMAIN/ns/NS/sa/SA`, from
/// its endpoints' service accounts) and the ServiceEntry's `subjectAltNames`, sorted: what
/// ISTIO_MUTUAL checks the server certificate against.
pub(super) fn service_sans(scope: &Scope<'_>, service: &Service) -> Vec<String> {
    let trust_domain = &scope.snapshot.mesh.trust_domain;
    let mut sans: Vec<String> = service.subject_alt_names.clone();
    if let Some(endpoints) = scope.snapshot.endpoints(service) {
        for e in endpoints.as_slice().iter().filter(|e| !e.service_account.is_empty()) {
            sans.push(format!("spiffe://{trust_domain}/ns/{}/sa/{}", service.namespace, e.service_account));
        }
    }
    sans.sort();
    sans.dedup();
    sans
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Arc;

    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;

    use super::*;
    use crate::envoy::testing::{find, sidecar, snapshot, unpack};
    use crate::envoy::TypeUrl;
    use crate::mesh::MeshConfig;
    use crate::snapshot::{ChangeSet, Snapshot, SourceState, Version};

    pub(in crate::envoy) const MESH: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: a, namespace: ns}
spec:
  hosts: [a.ns.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http}]
  endpoints:
  - {address: 10.0.0.1, serviceAccount: sa-a, labels: {security.istio.io/tlsMode: istio}}
  - {address: 10.0.0.2, serviceAccount: sa-legacy, labels: {security.istio.io/tlsMode: disabled}}
  - {address: 10.0.0.4, serviceAccount: sa-vm}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: b, namespace: ns}
spec:
  hosts: [b.ns.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9090, name: grpc}]
  endpoints: [{address: 10.0.0.3, labels: {version: v1}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: b, namespace: ns}
spec:
  host: b.ns.svc.cluster.local
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}
  subsets: [{name: v1, labels: {version: v1}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ext, namespace: ns}
spec:
  hosts: [ext.example.com]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http}]
  endpoints: [{address: 10.9.0.1, labels: {security.istio.io/tlsMode: istio}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: c, namespace: plain}
spec:
  hosts: [c.plain.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http}]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: plain, namespace: plain}
spec: {mtls: {mode: DISABLE}}
"#;

    fn cluster(s: &Snapshot, name: &str) -> Cluster {
        find(s, &sidecar("client", &[]), TypeUrl::Cluster, name)
    }

    fn upstream_tls(socket: &TransportSocket) -> UpstreamTlsContext {
        match &socket.config_type {
            Some(transport_socket::ConfigType::TypedConfig(a)) => unpack(a),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn clusters_without_rule_tls_use_istio_mutual_towards_sidecars_only() {
        let s = snapshot(MESH);
        let a = cluster(&s, "outbound|80||a.ns.svc.cluster.local");
        assert!(a.transport_socket.is_none());
        let names: Vec<&str> = a.transport_socket_matches.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["tlsMode-istio", "tlsMode-disabled"]);
        let m = &a.transport_socket_matches[0];
        assert_eq!(m.r#match, Some(tls_mode_struct()));
        let tls = upstream_tls(m.transport_socket.as_ref().expect("socket"));
        assert_eq!(tls.sni, "outbound_.80_._.a.ns.svc.cluster.local");
        let common = tls.common_tls_context.expect("common");
        assert_eq!(common.alpn_protocols, ["istio-peer-exchange", "istio"]);
        assert_eq!(common.tls_certificate_sds_secret_configs[0].name, "default");
        let validation = format!("{:?}", common.validation_context_type);
        for san in ["spiffe://cluster.local/ns/ns/sa/sa-a", "spiffe://cluster.local/ns/ns/sa/sa-legacy", "ROOTCA"] {
            assert!(validation.contains(san), "{san} missing: {validation}");
        }
        // EDS marks the endpoints with a sidecar, which the first match selects: by the label, or,
        // without it, an entry's endpoint naming a service account (as istiod does).
        let cla: ClusterLoadAssignment =
            find(&s, &sidecar("client", &[]), TypeUrl::Endpoint, "outbound|80||a.ns.svc.cluster.local");
        let marked: Vec<bool> = cla.endpoints[0].lb_endpoints.iter().map(|e| e.metadata.is_some()).collect();
        assert_eq!(marked, [true, false, true]);
        // Outside the mesh, or where the destination's namespace disables mutual TLS: plaintext.
        assert!(cluster(&s, "outbound|80||ext.example.com").transport_socket_matches.is_empty());
        assert!(cluster(&s, "outbound|80||c.plain.svc.cluster.local").transport_socket_matches.is_empty());
    }

    #[test]
    fn rule_istio_mutual_is_always_tls_with_istio_sni_per_subset() {
        let s = snapshot(MESH);
        let v1 = cluster(&s, "outbound|9090|v1|b.ns.svc.cluster.local");
        assert!(v1.transport_socket_matches.is_empty());
        let tls = upstream_tls(v1.transport_socket.as_ref().expect("ISTIO_MUTUAL"));
        assert_eq!(tls.sni, "outbound_.9090_.v1_.b.ns.svc.cluster.local");
        assert_eq!(tls.common_tls_context.expect("common").alpn_protocols, ["istio-peer-exchange", "istio", "h2"]);
    }

    #[test]
    fn proxies_without_pilot_agent_get_no_optional_mutual_tls() {
        let s = snapshot(MESH);
        let plain = crate::envoy::ProxyView { agent_sds: false, ..sidecar("client", &[]) };
        let a: Cluster = find(&s, &plain, TypeUrl::Cluster, "outbound|80||a.ns.svc.cluster.local");
        assert!(a.transport_socket_matches.is_empty(), "no certificate to present: plaintext");
        let b: Cluster = find(&s, &plain, TypeUrl::Cluster, "outbound|9090|v1|b.ns.svc.cluster.local");
        assert!(b.transport_socket.is_some(), "a rule's ISTIO_MUTUAL stays: closed, never plaintext");
    }

    #[test]
    fn mesh_config_can_turn_auto_mtls_off() {
        let mut state = SourceState { configs: snapshot(MESH).configs.clone(), ..Default::default() };
        state.mesh = Arc::new(MeshConfig { enable_auto_mtls: false, ..Default::default() });
        let s = Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state);
        assert!(cluster(&s, "outbound|80||a.ns.svc.cluster.local").transport_socket_matches.is_empty());
        assert!(MeshConfig::parse("m", "enableAutoMtls: false\n").is_ok_and(|m| !m.enable_auto_mtls));
    }
}
