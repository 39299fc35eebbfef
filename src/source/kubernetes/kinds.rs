//! The kinds the Kubernetes source watches, and how each becomes an [`Item`].

use std::fmt;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::DynamicObject;
use serde_json::Value;

use crate::config::parse::{parse_object, Document};
use crate::mesh::{MeshConfig, MeshConfigError, MeshNetworks};
use crate::registry::kubernetes::{KubeKind, KubeObject};

/// What one watched object became.
// Short-lived: each item is moved once, from the converting thread into the state owner.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Item {
    /// A registry object.
    Kube(KubeObject),
    /// An Istio config object: valid, of a kind not served, or rejected.
    Config(Document),
    /// The mesh config ConfigMap's `mesh` key.
    Mesh(Box<Result<MeshConfig, MeshConfigError>>),
}

/// An Istio CRD kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IstioKind {
    /// API group.
    pub group: &'static str,
    /// Kind.
    pub kind: &'static str,
}

/// Istio's networking API group.
pub const NETWORKING: &str = "networking.istio.io";
/// Istio's security API group.
pub const SECURITY: &str = "security.istio.io";

/// The Istio kinds watched, read at the version the API server prefers.
pub const ISTIO_KINDS: [IstioKind; 10] = [
    IstioKind { group: NETWORKING, kind: "VirtualService" },
    IstioKind { group: NETWORKING, kind: "DestinationRule" },
    IstioKind { group: NETWORKING, kind: "Gateway" },
    IstioKind { group: NETWORKING, kind: "ServiceEntry" },
    IstioKind { group: NETWORKING, kind: "WorkloadEntry" },
    IstioKind { group: NETWORKING, kind: "WorkloadGroup" },
    IstioKind { group: NETWORKING, kind: "Sidecar" },
    IstioKind { group: SECURITY, kind: "AuthorizationPolicy" },
    IstioKind { group: SECURITY, kind: "PeerAuthentication" },
    IstioKind { group: SECURITY, kind: "RequestAuthentication" },
];

/// The registry kinds watched.
pub const REGISTRY_KINDS: [KubeKind; 6] =
    [KubeKind::Namespace, KubeKind::Node, KubeKind::Pod, KubeKind::Service, KubeKind::EndpointSlice, KubeKind::Secret];

/// One watched kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Watched {
    /// A core registry kind.
    Registry(KubeKind),
    /// An Istio CRD kind.
    Istio(IstioKind),
    /// The `istio` ConfigMap in meshpilot's namespace.
    MeshConfigMap,
}

impl Watched {
    /// Whether it is a security policy kind: not reading it would silently drop protection.
    pub fn is_security_policy(&self) -> bool {
        matches!(self, Watched::Istio(k) if k.group == SECURITY)
    }
}

impl fmt::Display for Watched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Watched::Registry(k) => write!(f, "{k}"),
            Watched::Istio(k) => write!(f, "{}.{}", k.kind, k.group),
            Watched::MeshConfigMap => f.write_str("ConfigMap istio"),
        }
    }
}

/// Where errors about Kubernetes objects say they come from.
pub const SOURCE_NAME: &str = "kubernetes";

/// The name of Istio's mesh config ConfigMap.
pub const MESH_CONFIG_MAP: &str = "istio";

/// An Istio object: parsed and validated exactly as a file's document is.
pub fn istio_object(watched: &Watched, obj: DynamicObject) -> Item {
    let (group, kind) = match watched {
        Watched::Istio(k) => (k.group, k.kind),
        _ => ("", ""),
    };
    let types = obj.types.clone();
    let mut value = match serde_json::to_value(obj) {
        Ok(v) => v,
        Err(e) => Value::String(e.to_string()),
    };
    // List items of custom resources carry apiVersion and kind; watch events too. Fill them in
    // if a server leaves them out, so the object is still identified.
    if let Value::Object(map) = &mut value {
        let api_version = types.as_ref().map(|t| t.api_version.clone()).filter(|v| !v.is_empty());
        map.insert("apiVersion".into(), Value::String(api_version.unwrap_or_else(|| format!("{group}/v1"))));
        let kind_name = types.map(|t| t.kind).filter(|k| !k.is_empty());
        map.insert("kind".into(), Value::String(kind_name.unwrap_or_else(|| kind.to_string())));
        // Server-side bookkeeping that is no part of the Istio object.
        if let Some(Value::Object(meta)) = map.get_mut("metadata") {
            meta.remove("managedFields");
        }
        map.remove("status");
    }
    Item::Config(parse_object(SOURCE_NAME, value))
}

/// The mesh config from the `mesh` key of the `istio` ConfigMap (defaults without one). Its
/// `meshNetworks` key is validated too: an invalid one keeps the whole ConfigMap's previous
/// version in force, as an invalid `mesh` does.
pub fn mesh_config_map(_: &Watched, cm: ConfigMap) -> Item {
    let namespace = cm.metadata.namespace.unwrap_or_default();
    let mut data = cm.data.unwrap_or_default();
    let text = data.remove("mesh").unwrap_or_default();
    let networks = data.remove("meshNetworks").unwrap_or_default();
    let source = |key: &str| format!("ConfigMap {namespace}/{MESH_CONFIG_MAP} key {key}");
    match MeshNetworks::parse(&networks) {
        Err((field, reason)) => {
            return Item::Mesh(Box::new(Err(MeshConfigError::Field { path: source("meshNetworks"), field, reason })));
        }
        // Parsed and checked, but nothing routes across networks yet: say so rather than pretend.
        Ok(n) if !n.networks.is_empty() => tracing::warn!(
            networks = n.networks.len(),
            "meshNetworks is valid but not used: meshpilot does not route across networks yet"
        ),
        Ok(_) => {}
    }
    Item::Mesh(Box::new(MeshConfig::parse(&source("mesh"), &text)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse::Document;
    use serde_json::json;

    fn dynamic(v: Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    const VS: Watched = Watched::Istio(IstioKind { group: NETWORKING, kind: "VirtualService" });

    #[test]
    fn istio_object_validates_like_a_file() {
        let ok = dynamic(json!({"apiVersion": "networking.istio.io/v1beta1", "kind": "VirtualService",
            "metadata": {"name": "r", "namespace": "shop", "resourceVersion": "7", "managedFields": [{"manager": "kubectl"}]},
            "spec": {"hosts": ["r"], "http": [{"route": [{"destination": {"host": "r"}}]}]}}));
        assert!(matches!(istio_object(&VS, ok), Item::Config(Document::Valid(o)) if o.key.namespace == "shop"));
        let bad = dynamic(json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "r", "namespace": "shop"},
            "spec": {"hosts": ["r"], "http": [{"route": [{"destination": {"host": "r"}, "weight": -1}]}]}}));
        let Item::Config(Document::Invalid(e)) = istio_object(&VS, bad) else { panic!("expected invalid") };
        assert_eq!(e.file, "kubernetes");
        assert_eq!(e.object.map(|k| k.to_string()).as_deref(), Some("VirtualService shop/r"));
        assert!(e.error.field.starts_with("spec.http[0].route[0]"), "{}", e.error.field);
    }

    #[test]
    fn security_kinds_go_through_the_same_path() {
        let ap = dynamic(json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
            "metadata": {"name": "deny", "namespace": "shop"}, "spec": {"action": "DENY"}}));
        let w = Watched::Istio(IstioKind { group: SECURITY, kind: "AuthorizationPolicy" });
        // Validated as a file's document is: a DENY policy needs rules.
        let Item::Config(Document::Invalid(e)) = istio_object(&w, ap) else { panic!("expected invalid") };
        assert_eq!(e.object.map(|k| k.to_string()).as_deref(), Some("AuthorizationPolicy shop/deny"));
        assert_eq!(e.error.field, "spec.rules");
        let ap = dynamic(json!({"apiVersion": "security.istio.io/v1beta1", "kind": "AuthorizationPolicy",
            "metadata": {"name": "deny", "namespace": "shop"}, "spec": {"action": "DENY", "rules": [{}]}}));
        assert!(matches!(istio_object(&w, ap), Item::Config(Document::Valid(o)) if o.key.namespace == "shop"));
        let ra = dynamic(json!({"apiVersion": "security.istio.io/v1", "kind": "RequestAuthentication",
            "metadata": {"name": "jwt", "namespace": "shop"}, "spec": {"jwtRules": [{"issuer": "https://i.example", "jwksUri": "https://i.example/keys"}]}}));
        let w = Watched::Istio(IstioKind { group: SECURITY, kind: "RequestAuthentication" });
        assert!(matches!(istio_object(&w, ra), Item::Config(Document::Valid(o)) if o.key.name == "jwt"));
        let pa = dynamic(json!({"apiVersion": "security.istio.io/v1beta1", "kind": "PeerAuthentication",
            "metadata": {"name": "strict", "namespace": "shop"}, "spec": {"mtls": {"mode": "STRICT"}}}));
        let w = Watched::Istio(IstioKind { group: SECURITY, kind: "PeerAuthentication" });
        assert!(matches!(istio_object(&w, pa), Item::Config(Document::Valid(o)) if o.key.name == "strict"));
    }

    #[test]
    fn mesh_from_config_map() {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "istio", "namespace": "istio-system"},
            "data": {"mesh": "trustDomain: example.org\n"}}))
        .unwrap();
        let Item::Mesh(m) = mesh_config_map(&Watched::MeshConfigMap, cm) else { panic!() };
        let m = m.unwrap();
        assert_eq!(m.trust_domain, "example.org");
        let bad: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "istio", "namespace": "istio-system"},
            "data": {"mesh": "", "meshNetworks": "networks: {n: {endpoints: [{fromCidr: 10.0.0.0/99}]}}"}}))
        .unwrap();
        let Item::Mesh(m) = mesh_config_map(&Watched::MeshConfigMap, bad) else { panic!() };
        let e = m.unwrap_err().to_string();
        assert!(e.contains("meshNetworks") && e.contains("networks.n.endpoints[0].fromCidr"), "{e}");
    }
}
