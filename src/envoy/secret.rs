//! SDS over ADS: the Kubernetes Secrets Gateway servers (and DestinationRules, for the TLS egress
//! gateways originate) name in `credentialName`, as Envoy
//! `Secret`s named `kubernetes://NAME` (certificate and key) and `kubernetes://NAME-cacert` (the
//! CA, from the Secret's own `ca.crt` or a `NAME-cacert` Secret). Istio's rule: only a gateway
//! proxy in the Secret's namespace is sent it, and only once its caller proved an identity of
//! that namespace (the secure port); sidecars, other namespaces and the plaintext port get
//! nothing, whatever node they claim.

use envoy_types::pb::envoy::config::core::v3::{data_source, DataSource};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    secret, CertificateValidationContext, Secret, TlsCertificate,
};

use super::proto::resource;
use super::resource::Resource;
use super::scope::Scope;
use super::sds::{credential_resource_name, CA_SUFFIX};
use crate::envoy::ProxyKind;
use crate::snapshot::CA_SECRET_SUFFIX;

/// The secrets a proxy may be sent.
pub(super) fn secrets(scope: &Scope<'_>) -> Vec<Resource> {
    if !may_have_credentials(scope) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for s in scope.snapshot.credentials_in(scope.namespace()) {
        let name = credential_resource_name(&s.name);
        if !s.cert_chain.is_empty() && !s.private_key.is_empty() {
            let certificate = TlsCertificate {
                certificate_chain: Some(inline(&s.cert_chain)),
                private_key: Some(inline(&s.private_key.0)),
                ..Default::default()
            };
            out.push(resource(name.clone(), named(&name, secret::Type::TlsCertificate(certificate))));
        }
        if !s.ca.is_empty() {
            // `NAME-cacert` is either NAME's own CA or the CA Secret `NAME-cacert` itself.
            let ca_name = if s.name.ends_with(CA_SECRET_SUFFIX) { name.clone() } else { format!("{name}{CA_SUFFIX}") };
            let validation = CertificateValidationContext { trusted_ca: Some(inline(&s.ca)), ..Default::default() };
            out.push(resource(ca_name.clone(), named(&ca_name, secret::Type::ValidationContext(validation))));
        }
    }
    out
}

/// Whether the view may hold its namespace's credentials: a gateway whose caller proved an
/// identity of that namespace. Anyone can claim a `router~` node on the plaintext port.
pub(super) fn may_have_credentials(scope: &Scope<'_>) -> bool {
    scope.view.kind == ProxyKind::Router && scope.view.credentials
}

fn named(name: &str, kind: secret::Type) -> Secret {
    Secret { name: name.to_string(), r#type: Some(kind) }
}

fn inline(pem: &str) -> DataSource {
    DataSource { specifier: Some(data_source::Specifier::InlineBytes(pem.as_bytes().to_vec())), ..Default::default() }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use envoy_types::pb::envoy::config::core::v3::transport_socket;
    use envoy_types::pb::envoy::config::listener::v3::Listener;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;

    use super::*;
    use crate::config::parse::{parse_file, Document};
    use crate::envoy::generate;
    use crate::envoy::testing::{decode, find, names, plaintext_router, router, sidecar, unpack};
    use crate::envoy::TypeUrl;
    use crate::registry::kubernetes::{KubeObject, KubeSecret, PrivateKey};
    use crate::snapshot::{ChangeSet, Snapshot, SourceState, Version};

    const GATEWAY: &str = r#"
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: web, namespace: apps}
spec:
  selector: {istio: ingress}
  servers:
  - port: {number: 443, name: https, protocol: HTTPS}
    hosts: [web.example.com]
    tls: {mode: SIMPLE, credentialName: web-cert}
  - port: {number: 8443, name: https-mtls, protocol: HTTPS}
    hosts: [mtls.example.com]
    tls: {mode: MUTUAL, credentialName: "kubernetes://mtls-cert"}
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: ["*"]
"#;

    fn secret(ns: &str, name: &str, cert: &str, key: &str, ca: &str) -> KubeObject {
        KubeObject::Secret(KubeSecret {
            name: name.into(),
            namespace: ns.into(),
            cert_chain: cert.into(),
            private_key: PrivateKey(key.into()),
            ca: ca.into(),
        })
    }

    fn snapshot_with(secrets: Vec<KubeObject>) -> Snapshot {
        let mut state =
            SourceState { kube: secrets.into_iter().map(|o| (o.key(), Arc::new(o))).collect(), ..Default::default() };
        for doc in parse_file("gw.yaml", GATEWAY) {
            let Document::Valid(o) = doc else { panic!("{doc:?}") };
            state.configs.insert(o.key.clone(), Arc::new(o));
        }
        Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state)
    }

    #[test]
    fn gateways_get_their_namespaces_credentials_and_nobody_else_does() {
        let s = snapshot_with(vec![
            secret("gateways", "web-cert", "CERT", "KEY", ""),
            secret("gateways", "mtls-cert", "CERT2", "KEY2", ""),
            secret("gateways", "mtls-cert-cacert", "", "", "CA"),
            secret("gateways", "unrelated", "C", "K", ""),
            secret("elsewhere", "web-cert", "OTHER", "OTHERKEY", ""),
        ]);
        let gw = router("gateways", &[("istio", "ingress")]);
        assert_eq!(
            names(&s, &gw, TypeUrl::Secret),
            ["kubernetes://mtls-cert", "kubernetes://mtls-cert-cacert", "kubernetes://web-cert"]
        );
        let web: Secret = find(&s, &gw, TypeUrl::Secret, "kubernetes://web-cert");
        let Some(secret::Type::TlsCertificate(cert)) = web.r#type else { panic!("{web:?}") };
        assert_eq!(
            cert.private_key.and_then(|k| k.specifier),
            Some(data_source::Specifier::InlineBytes(b"KEY".to_vec()))
        );
        // Sidecars and gateways of other namespaces get no secret of this one.
        assert!(names(&s, &sidecar("gateways", &[]), TypeUrl::Secret).is_empty());
        let other: Vec<Secret> = generate(TypeUrl::Secret, &s, &router("elsewhere", &[])).iter().map(decode).collect();
        assert_eq!(other.len(), 1, "its own web-cert only");
        // Secrets no Gateway or DestinationRule names never enter the snapshot.
        assert!(!s.kube.keys().any(|k| k.name == "unrelated"));
        // The listeners name them over ADS.
        let tls = |port: &str| {
            let l: Listener = find(&s, &gw, TypeUrl::Listener, port);
            let socket = l.filter_chains[0].transport_socket.clone().and_then(|t| t.config_type);
            let Some(transport_socket::ConfigType::TypedConfig(any)) = socket else { panic!("no TLS on {port}") };
            format!("{:?}", unpack::<DownstreamTlsContext>(&any))
        };
        let web = tls("0.0.0.0_443");
        assert!(web.contains("\"kubernetes://web-cert\"") && web.contains("Ads"), "{web}");
        assert!(tls("0.0.0.0_8443").contains("\"kubernetes://mtls-cert-cacert\""));
        assert!(s.errors.is_empty(), "{:?}", s.errors);
    }

    #[test]
    fn a_gateway_without_a_verified_identity_gets_no_secret_and_no_server_needing_one() {
        let s = snapshot_with(vec![
            secret("gateways", "web-cert", "CERT", "KEY", ""),
            secret("gateways", "mtls-cert", "CERT2", "KEY2", "CA"),
        ]);
        let labels = [("istio", "ingress")];
        // Anyone may claim a `router~` node on the plaintext port.
        let forged = plaintext_router("gateways", &labels);
        assert!(names(&s, &forged, TypeUrl::Secret).is_empty());
        assert_eq!(names(&s, &forged, TypeUrl::Listener), ["0.0.0.0_80"], "no listener waits for a secret");
        let verified = router("gateways", &labels);
        assert_eq!(names(&s, &verified, TypeUrl::Listener), ["0.0.0.0_443", "0.0.0.0_80", "0.0.0.0_8443"]);
        assert_ne!(forged, verified, "the two never share a cached generation");
    }

    #[tokio::test]
    async fn the_cache_never_serves_a_verified_gateways_secrets_to_an_unverified_one() {
        use crate::envoy::SharedView;
        use crate::xds::GenerationCache;
        let s = Arc::new(snapshot_with(vec![secret("gateways", "web-cert", "CERT", "KEY", "")]));
        let cache = Arc::new(GenerationCache::default());
        let labels = [("istio", "ingress")];
        let (verified, forged) =
            (SharedView::new(router("gateways", &labels)), SharedView::new(plaintext_router("gateways", &labels)));
        let _leases = (cache.hold(&verified), cache.hold(&forged));
        assert_eq!(cache.get(&s, &verified, TypeUrl::Secret).await.resources.len(), 1);
        assert!(cache.get(&s, &forged, TypeUrl::Secret).await.resources.is_empty());
    }

    #[test]
    fn an_egress_gateway_gets_the_credential_its_destination_rule_names() {
        let yaml = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: api, namespace: gateways}\n\
                    spec: {hosts: [api.example.com], location: MESH_EXTERNAL, resolution: DNS, ports: [{number: 443, name: tls, protocol: TLS}]}\n\
                    ---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: api, namespace: gateways}\n\
                    spec: {host: api.example.com, trafficPolicy: {tls: {mode: MUTUAL, credentialName: egress-cert}}}\n";
        let mut state = SourceState {
            kube: [secret("gateways", "egress-cert", "C", "K", "CA"), secret("gateways", "other", "C", "K", "")]
                .into_iter()
                .map(|o| (o.key(), Arc::new(o)))
                .collect(),
            ..Default::default()
        };
        for doc in parse_file("dr.yaml", yaml) {
            let Document::Valid(o) = doc else { panic!("{doc:?}") };
            state.configs.insert(o.key.clone(), Arc::new(o));
        }
        let s = Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state);
        let gw = router("gateways", &[]);
        assert_eq!(names(&s, &gw, TypeUrl::Secret), ["kubernetes://egress-cert", "kubernetes://egress-cert-cacert"]);
        let c: envoy_types::pb::envoy::config::cluster::v3::Cluster =
            find(&s, &gw, TypeUrl::Cluster, "outbound|443||api.example.com");
        let socket = c.transport_socket.and_then(|t| t.config_type);
        let Some(transport_socket::ConfigType::TypedConfig(any)) = socket else { panic!("no TLS") };
        let tls: envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext = unpack(&any);
        let text = format!("{tls:?}");
        assert!(
            text.contains("\"kubernetes://egress-cert\"") && text.contains("\"kubernetes://egress-cert-cacert\""),
            "{text}"
        );
    }

    #[test]
    fn an_istio_mutual_server_terminates_with_the_gateways_workload_certificate() {
        let yaml = "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: east, namespace: gateways}\n\
                    spec:\n  selector: {istio: ingress}\n  servers:\n  - port: {number: 15443, name: https, protocol: HTTPS}\n    \
                    hosts: [\"*.example.com\"]\n    tls: {mode: ISTIO_MUTUAL}\n";
        let s = crate::envoy::testing::snapshot(yaml);
        let gw = router("gateways", &[("istio", "ingress")]);
        let l: Listener = find(&s, &gw, TypeUrl::Listener, "0.0.0.0_15443");
        let socket = l.filter_chains[0].transport_socket.clone().and_then(|t| t.config_type);
        let Some(transport_socket::ConfigType::TypedConfig(any)) = socket else { panic!("no TLS") };
        let tls: DownstreamTlsContext = unpack(&any);
        assert_eq!(tls.require_client_certificate.map(|b| b.value), Some(true));
        let text = format!("{tls:?}");
        assert!(text.contains("\"default\"") && text.contains("\"ROOTCA\"") && text.contains("sds-grpc"), "{text}");
    }

    #[test]
    fn a_server_without_its_secret_is_reported_and_not_served() {
        // The file source has no Secrets.
        let s = snapshot_with(Vec::new());
        let gw = router("gateways", &[("istio", "ingress")]);
        assert_eq!(names(&s, &gw, TypeUrl::Listener), ["0.0.0.0_80"], "HTTPS servers left out, HTTP still served");
        let fields: Vec<&str> = s.errors.iter().map(|e| e.error.field.as_str()).collect();
        assert_eq!(fields, ["spec.servers[0].tls.credentialName", "spec.servers[1].tls.credentialName"]);
        assert!(s.errors[0].error.reason.contains("web-cert not found"), "{}", s.errors[0].error.reason);
        // MUTUAL without a CA anywhere: not served either.
        let s = snapshot_with(vec![secret("gateways", "mtls-cert", "C", "K", "")]);
        assert_eq!(names(&s, &gw, TypeUrl::Listener), ["0.0.0.0_80"]);
        assert!(s.errors.iter().any(|e| e.error.reason.contains("no ca.crt")), "{:?}", s.errors);
    }
}
