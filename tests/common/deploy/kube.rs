//! What meshpilot's Kubernetes source reads and writes through the API server, as the deploy
//! tests expect it: the Istio kinds (and their CRDs), the core objects, the `istio` ConfigMap and
//! Events; and the RBAC grants the deployment gives, flattened to compare with that.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::PolicyRule;

use super::{Build, Object};

/// An Istio config kind the source watches.
pub struct IstioKind {
    /// API group.
    pub group: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Resource (plural).
    pub plural: &'static str,
    /// Short names, as Istio's CRDs have them.
    pub short_names: &'static [&'static str],
}

impl IstioKind {
    /// The versions Istio serves for the kind; `v1` (first) is the one stored.
    pub fn versions(&self) -> &'static [&'static str] {
        if self.group == NETWORKING {
            &["v1", "v1beta1", "v1alpha3"]
        } else {
            &["v1", "v1beta1"]
        }
    }
}

const NETWORKING: &str = "networking.istio.io";
const SECURITY: &str = "security.istio.io";

/// The ten Istio kinds the source watches (list + watch).
pub const ISTIO_KINDS: &[IstioKind] = &[
    IstioKind { group: NETWORKING, kind: "VirtualService", plural: "virtualservices", short_names: &["vs"] },
    IstioKind { group: NETWORKING, kind: "DestinationRule", plural: "destinationrules", short_names: &["dr"] },
    IstioKind { group: NETWORKING, kind: "Gateway", plural: "gateways", short_names: &["gw"] },
    IstioKind { group: NETWORKING, kind: "ServiceEntry", plural: "serviceentries", short_names: &["se"] },
    IstioKind { group: NETWORKING, kind: "WorkloadEntry", plural: "workloadentries", short_names: &["we"] },
    IstioKind { group: NETWORKING, kind: "WorkloadGroup", plural: "workloadgroups", short_names: &["wg"] },
    IstioKind { group: NETWORKING, kind: "Sidecar", plural: "sidecars", short_names: &[] },
    IstioKind { group: SECURITY, kind: "AuthorizationPolicy", plural: "authorizationpolicies", short_names: &["ap"] },
    IstioKind { group: SECURITY, kind: "PeerAuthentication", plural: "peerauthentications", short_names: &["pa"] },
    IstioKind {
        group: SECURITY,
        kind: "RequestAuthentication",
        plural: "requestauthentications",
        short_names: &["ra"],
    },
];

/// (group, resource) of the Kubernetes objects the service registry watches (list + watch).
pub const REGISTRY_RESOURCES: &[(&str, &str)] = &[
    ("", "services"),
    ("", "pods"),
    ("", "nodes"),
    ("", "namespaces"),
    ("discovery.k8s.io", "endpointslices"),
    // Gateway `credentialName` certificates.
    ("", "secrets"),
];

/// The mesh config's ConfigMap, in meshpilot's namespace, and its MeshConfig key.
pub const MESH_CONFIG_MAP: &str = "istio";
/// The key of [`MESH_CONFIG_MAP`] holding the MeshConfig YAML.
pub const MESH_KEY: &str = "mesh";

/// Where a grant applies: cluster-wide, or in the build's namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// A ClusterRole bound by a ClusterRoleBinding.
    Cluster,
    /// A Role (or ClusterRole) bound by a RoleBinding in meshpilot's namespace.
    Namespace,
}

/// One grant: (scope, API group, resource, resource names (empty: all), verbs), one rule
/// expanded to one resource.
pub type Grant = (Scope, String, String, BTreeSet<String>, BTreeSet<String>);

/// `grant` on one line, for messages.
pub fn show_grant((scope, group, resource, names, verbs): &Grant) -> String {
    let group = if group.is_empty() { "core" } else { group };
    let names = if names.is_empty() { String::new() } else { format!(" names {names:?}") };
    format!("{scope:?}: {group} {resource}{names} verbs {verbs:?}")
}

fn grant(scope: Scope, group: &str, resource: &str, names: &[&str], verbs: &[&str]) -> Grant {
    let set = |items: &[&str]| items.iter().map(|s| s.to_string()).collect();
    (scope, group.to_string(), resource.to_string(), set(names), set(verbs))
}

/// What ingest's ServiceAccount must be granted, and nothing more: list + watch on what the
/// source watches, and list/watch on the `istio` ConfigMap alone (the source watches it with a
/// `metadata.name` field selector); for the CA, its `istio-ca-secret` (get, create) and the
/// `istio-ca-root-cert` ConfigMaps the leader keeps in every namespace (get, patch, create).
pub fn expected_ingest_grants() -> BTreeSet<Grant> {
    let watched = ISTIO_KINDS.iter().map(|k| (k.group, k.plural)).chain(REGISTRY_RESOURCES.iter().copied());
    let mut grants: BTreeSet<Grant> =
        watched.map(|(group, resource)| grant(Scope::Cluster, group, resource, &[], &["list", "watch"])).collect();
    grants.insert(grant(Scope::Namespace, "", "configmaps", &[MESH_CONFIG_MAP], &["list", "watch"]));
    grants.insert(grant(Scope::Namespace, "", "secrets", &["istio-ca-secret"], &["get"]));
    grants.insert(grant(Scope::Namespace, "", "secrets", &[], &["create"]));
    grants.insert(grant(Scope::Cluster, "", "configmaps", &["istio-ca-root-cert"], &["get", "patch"]));
    grants.insert(grant(Scope::Cluster, "", "configmaps", &[], &["create"]));
    // The leader keeps the validating webhook's caBundle (watched by name, then replaced).
    let verbs = ["get", "list", "watch", "update", "patch"];
    grants.insert(grant(
        Scope::Cluster,
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
        &[WEBHOOK_CONFIG],
        &verbs,
    ));
    grants
}

/// The ValidatingWebhookConfiguration of the deployment: meshpilot's default `--webhook-config-name`.
pub const WEBHOOK_CONFIG: &str = "meshpilot-validator";
/// The Service the API server calls the webhook through: meshpilot's default `--webhook-service`.
pub const WEBHOOK_SERVICE: &str = "meshpilot-webhook";
/// The webhook's port, istiod's.
pub const WEBHOOK_PORT: i32 = 15017;

/// What frontends' ServiceAccount must be granted for the secure port, and nothing more:
/// TokenReviews, and reading the CA's `istio-ca-secret`.
pub fn expected_frontend_grants() -> BTreeSet<Grant> {
    BTreeSet::from([
        grant(Scope::Cluster, "authentication.k8s.io", "tokenreviews", &[], &["create"]),
        grant(Scope::Namespace, "", "secrets", &["istio-ca-secret"], &["get"]),
    ])
}

/// Each rule of `rules` expanded per (group, resource).
fn expand(scope: Scope, rules: &[PolicyRule]) -> Vec<Grant> {
    let mut out = Vec::new();
    for rule in rules {
        let names: BTreeSet<String> = rule.resource_names.iter().flatten().cloned().collect();
        let verbs: BTreeSet<String> = rule.verbs.iter().cloned().collect();
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                out.push((scope, group.clone(), resource.clone(), names.clone(), verbs.clone()));
            }
        }
    }
    out
}

/// ServiceAccount name → what its bindings grant it, in `build`. A subject of another namespace
/// or kind is keyed `KIND NAMESPACE/NAME`, so it shows up as unexpected.
pub fn grants_by_account(build: &Build) -> BTreeMap<String, BTreeSet<Grant>> {
    let mut roles = BTreeMap::new();
    let mut cluster_roles = BTreeMap::new();
    for m in &build.manifests {
        match &m.object {
            Object::Role(r) => {
                roles.insert(r.metadata.name.clone().unwrap_or_default(), r.rules.clone().unwrap_or_default());
            }
            Object::ClusterRole(r) => {
                cluster_roles.insert(r.metadata.name.clone().unwrap_or_default(), r.rules.clone().unwrap_or_default());
            }
            _ => {}
        }
    }
    let mut out: BTreeMap<String, BTreeSet<Grant>> = BTreeMap::new();
    for m in &build.manifests {
        let (scope, role_ref, subjects) = match &m.object {
            Object::RoleBinding(b) => (Scope::Namespace, &b.role_ref, &b.subjects),
            Object::ClusterRoleBinding(b) => (Scope::Cluster, &b.role_ref, &b.subjects),
            _ => continue,
        };
        let rules = match role_ref.kind.as_str() {
            "Role" => roles.get(&role_ref.name),
            "ClusterRole" => cluster_roles.get(&role_ref.name),
            _ => None,
        };
        let grants = expand(scope, rules.map(Vec::as_slice).unwrap_or_default());
        for s in subjects.iter().flatten() {
            let key = if s.kind == "ServiceAccount" && s.namespace.as_ref() == Some(&build.namespace) {
                s.name.clone()
            } else {
                format!("{} {}/{}", s.kind, s.namespace.as_deref().unwrap_or_default(), s.name)
            };
            out.entry(key).or_default().extend(grants.iter().cloned());
        }
    }
    out
}
