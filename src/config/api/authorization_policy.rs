//! `AuthorizationPolicy` (security.istio.io v1, v1beta1): who may do what to a workload.
//!
//! `rules`, `from` and `to` are options so that validation can tell "absent" from "empty", as
//! Istio's does (a DENY policy without `rules` is rejected; `from: []` is rejected).

use serde::{Deserialize, Serialize};

use super::common::WorkloadSelector;

/// The `spec` of an AuthorizationPolicy.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AuthorizationPolicy {
    /// Workloads the policy applies to; none means every workload of its namespace (or the mesh
    /// for the root namespace).
    pub selector: Option<WorkloadSelector>,
    /// Gateway API / Service target (not served by meshpilot; rejected by validation).
    pub target_ref: Option<PolicyTargetReference>,
    /// Gateway API / Service targets (not served by meshpilot; rejected by validation).
    pub target_refs: Vec<PolicyTargetReference>,
    /// Rules; a request matching any rule matches the policy.
    pub rules: Option<Vec<Rule>>,
    /// ALLOW (default), DENY, AUDIT or CUSTOM.
    pub action: Action,
    /// The external authorizer of a CUSTOM policy.
    pub provider: Option<ExtensionProvider>,
}

/// What a matching policy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Action {
    /// Allow matching requests (and, once any ALLOW policy applies, only those).
    #[default]
    Allow,
    /// Deny matching requests.
    Deny,
    /// Log matching requests (Envoy RBAC action LOG).
    Audit,
    /// Delegate to the external authorizer (ext_authz) of the mesh config provider it names.
    Custom,
}

impl Action {
    /// The name as written in YAML.
    pub fn name(self) -> &'static str {
        match self {
            Action::Allow => "ALLOW",
            Action::Deny => "DENY",
            Action::Audit => "AUDIT",
            Action::Custom => "CUSTOM",
        }
    }
}

/// A CUSTOM policy's provider.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ExtensionProvider {
    /// Name of an extension provider of the mesh config.
    pub name: String,
}

/// A reference to the object a policy attaches to (Gateway API style).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PolicyTargetReference {
    /// API group.
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Name.
    pub name: String,
    /// Namespace (cross-namespace references are not allowed).
    pub namespace: String,
}

/// One rule: sources, operations and conditions, all of which must match.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Rule {
    /// Sources (any may match); absent means any source.
    pub from: Option<Vec<From>>,
    /// Operations (any may match); absent means any operation.
    pub to: Option<Vec<To>>,
    /// Extra conditions (all must match).
    pub when: Vec<Condition>,
}

/// A `from` entry.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct From {
    /// The source.
    pub source: Option<Source>,
}

/// A `to` entry.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct To {
    /// The operation.
    pub operation: Option<Operation>,
}

/// Who sends a request; every field set must match.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Source {
    /// Peer identities (`TRUST_DOMAIN/ns/NS/sa/SA`, `*` wildcards at either end).
    pub principals: Vec<String>,
    /// Peer identities that must not match.
    pub not_principals: Vec<String>,
    /// JWT principals (`ISS/SUB`).
    pub request_principals: Vec<String>,
    /// JWT principals that must not match.
    pub not_request_principals: Vec<String>,
    /// Peer namespaces.
    pub namespaces: Vec<String>,
    /// Peer namespaces that must not match.
    pub not_namespaces: Vec<String>,
    /// Peer service accounts (`SA` in the policy's namespace, or `NS/SA`).
    pub service_accounts: Vec<String>,
    /// Peer service accounts that must not match.
    pub not_service_accounts: Vec<String>,
    /// Peer trust domains.
    pub trust_domains: Vec<String>,
    /// Peer trust domains that must not match.
    pub not_trust_domains: Vec<String>,
    /// Peer (connection) addresses or CIDRs.
    pub ip_blocks: Vec<String>,
    /// Peer addresses that must not match.
    pub not_ip_blocks: Vec<String>,
    /// Original client addresses (X-Forwarded-For, proxy protocol).
    pub remote_ip_blocks: Vec<String>,
    /// Original client addresses that must not match.
    pub not_remote_ip_blocks: Vec<String>,
}

/// What a request does; every field set must match.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Operation {
    /// Hosts (`:authority`).
    pub hosts: Vec<String>,
    /// Hosts that must not match.
    pub not_hosts: Vec<String>,
    /// Destination ports.
    pub ports: Vec<String>,
    /// Ports that must not match.
    pub not_ports: Vec<String>,
    /// HTTP methods.
    pub methods: Vec<String>,
    /// Methods that must not match.
    pub not_methods: Vec<String>,
    /// Paths (without query).
    pub paths: Vec<String>,
    /// Paths that must not match.
    pub not_paths: Vec<String>,
}

/// A `when` condition on an attribute.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Condition {
    /// Attribute name, e.g. `request.headers[x-user]`.
    pub key: String,
    /// Values, any of which matches.
    pub values: Vec<String>,
    /// Values none of which may match.
    pub not_values: Vec<String>,
}

#[cfg(test)]
mod tests {
    use crate::config::parse::{object_from_value, parse_file, Document};
    use crate::config::render::IstioDocument;

    /// Replication and the debug endpoints render objects back to documents: the security kinds
    /// must read back equal (absent and empty `rules` stay distinct).
    #[test]
    fn security_kinds_render_back_to_equal_objects() {
        let text = r#"
apiVersion: security.istio.io/v1beta1
kind: AuthorizationPolicy
metadata: {name: p, namespace: shop}
spec:
  selector: {matchLabels: {app: a}}
  action: DENY
  rules:
  - from: [{source: {principals: [cluster.local/ns/a/sa/b], notIpBlocks: [10.0.0.1]}}]
    to: [{operation: {paths: [/admin], notMethods: [GET]}}]
    when: [{key: "request.auth.claims[groups]", values: [x], notValues: [z]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: nothing, namespace: shop}
spec: {}
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: r, namespace: shop}
spec:
  jwtRules:
  - issuer: i
    jwksUri: https://k.example/keys
    timeout: 2s
    fromHeaders: [{name: x, prefix: "Bearer "}]
    outputClaimToHeaders: [{header: x-sub, claim: sub}]
"#;
        for doc in parse_file("t.yaml", text) {
            let Document::Valid(obj) = doc else { panic!("{doc:?}") };
            let value = serde_json::to_value(IstioDocument(&obj)).expect("renders");
            let back = object_from_value(value).expect("parses").expect("served kind");
            assert_eq!(back, obj);
        }
    }
}
