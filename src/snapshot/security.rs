//! Security policies indexed by where they apply, so a proxy's policies are found without
//! scanning every policy: root-namespace policies without selector apply mesh-wide, other
//! namespace policies without selector to their namespace, selector policies to the workloads
//! (sidecars and gateways alike) whose labels they match — in any namespace for the root
//! namespace, as in Istio.
//!
//! A rejected AuthorizationPolicy with no earlier valid version is indexed too, as a
//! [`RejectedPolicy`]: its scope must stay denied (fail closed). Istio never sees such objects,
//! because its admission webhook refuses them; meshpilot reads files and CRDs it cannot refuse, and
//! leaving the scope open would turn a typo in a DENY policy into an allow-all.

use std::collections::BTreeMap;

use crate::config::api::{AuthorizationPolicy, Labels, RequestAuthentication};
use crate::config::{ConfigError, ConfigKey, Kind, Spec, ValidConfig};

/// An AuthorizationPolicy that was rejected and has no valid version in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedPolicy {
    /// Its identity.
    pub key: ConfigKey,
    /// Why it was rejected (`field: reason`).
    pub reason: String,
}

/// One policy and where it applies inside its namespace.
#[derive(Debug, Clone)]
struct Entry<T> {
    selector: Option<Labels>,
    item: T,
}

/// Policies of one kind by namespace, in key order.
#[derive(Debug, Clone)]
struct ByNamespace<T>(BTreeMap<String, Vec<Entry<T>>>);

impl<T> Default for ByNamespace<T> {
    fn default() -> Self {
        ByNamespace(BTreeMap::new())
    }
}

impl<T> ByNamespace<T> {
    fn add(&mut self, namespace: &str, selector: Option<Labels>, item: T) {
        self.0.entry(namespace.to_string()).or_default().push(Entry { selector, item });
    }

    /// Items of `root` and `namespace` applying to a workload with `labels`: root-namespace ones
    /// first, then the namespace's own.
    fn applying<'a>(&'a self, root: &str, namespace: &str, labels: &Labels) -> Vec<&'a T> {
        let selects =
            |e: &&Entry<T>| e.selector.as_ref().is_none_or(|sel| sel.iter().all(|(k, v)| labels.get(k) == Some(v)));
        let mut namespaces = vec![root];
        if namespace != root {
            namespaces.push(namespace);
        }
        namespaces
            .into_iter()
            .filter_map(|ns| self.0.get(ns))
            .flat_map(|entries| entries.iter().filter(selects).map(|e| &e.item))
            .collect()
    }
}

/// The security policies of a snapshot, indexed by scope.
#[derive(Debug, Clone, Default)]
pub struct SecurityIndex {
    root_namespace: String,
    authorization: ByNamespace<ValidConfig>,
    authentication: ByNamespace<ValidConfig>,
    rejected: ByNamespace<RejectedPolicy>,
}

impl SecurityIndex {
    /// Indexes the valid policies of `configs` and the rejected AuthorizationPolicies of `errors`
    /// that have no valid version in `configs`.
    pub fn build<'a>(
        root_namespace: &str,
        configs: impl Iterator<Item = &'a ValidConfig>,
        errors: &[ConfigError],
        in_force: impl Fn(&ConfigKey) -> bool,
    ) -> SecurityIndex {
        let mut index = SecurityIndex { root_namespace: root_namespace.to_string(), ..Default::default() };
        for config in configs {
            let ns = config.key.namespace.as_str();
            match &config.spec {
                Spec::AuthorizationPolicy(ap) => index.authorization.add(ns, selector_of(ap), config.clone()),
                Spec::RequestAuthentication(ra) => {
                    let selector = ra.selector.as_ref().map(|s| s.match_labels.clone());
                    index.authentication.add(ns, selector, config.clone());
                }
                _ => {}
            }
        }
        for error in errors {
            let Some(key) = error.object.as_ref().filter(|k| k.kind == Kind::AuthorizationPolicy) else { continue };
            if in_force(key) {
                // Its last valid version stays in force, as in Istio when the webhook refuses an edit.
                continue;
            }
            let selector = error.policy_selector.clone().filter(|s| !s.is_empty());
            let rejected = RejectedPolicy { key: key.clone(), reason: error.error.to_string() };
            index.rejected.add(&key.namespace, selector, rejected);
        }
        index
    }

    /// AuthorizationPolicies applying to a workload in `namespace` with `labels`.
    pub fn authorization_policies_for(
        &self,
        namespace: &str,
        labels: &Labels,
    ) -> Vec<(&ValidConfig, &AuthorizationPolicy)> {
        self.authorization
            .applying(&self.root_namespace, namespace, labels)
            .into_iter()
            .filter_map(|c| match &c.spec {
                Spec::AuthorizationPolicy(ap) => Some((c, ap)),
                _ => None,
            })
            .collect()
    }

    /// RequestAuthentications applying to a workload in `namespace` with `labels`.
    pub fn request_authentications_for(
        &self,
        namespace: &str,
        labels: &Labels,
    ) -> Vec<(&ValidConfig, &RequestAuthentication)> {
        self.authentication
            .applying(&self.root_namespace, namespace, labels)
            .into_iter()
            .filter_map(|c| match &c.spec {
                Spec::RequestAuthentication(ra) => Some((c, ra)),
                _ => None,
            })
            .collect()
    }

    /// Rejected AuthorizationPolicies whose scope covers a workload in `namespace` with `labels`.
    pub fn rejected_policies_for(&self, namespace: &str, labels: &Labels) -> Vec<&RejectedPolicy> {
        self.rejected.applying(&self.root_namespace, namespace, labels)
    }

    /// Label keys the policies' selectors read (rejected policies included).
    pub fn selector_keys(&self) -> impl Iterator<Item = &String> {
        let a = self.authorization.0.values().flatten().filter_map(|e| e.selector.as_ref());
        let b = self.authentication.0.values().flatten().filter_map(|e| e.selector.as_ref());
        let c = self.rejected.0.values().flatten().filter_map(|e| e.selector.as_ref());
        a.chain(b).chain(c).flat_map(|s| s.keys())
    }
}

fn selector_of(ap: &AuthorizationPolicy) -> Option<Labels> {
    ap.selector.as_ref().map(|s| s.match_labels.clone())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::parse::{parse_file, Document};

    fn index(yaml: &str) -> SecurityIndex {
        let mut configs = Vec::new();
        let mut errors = Vec::new();
        for doc in parse_file("t.yaml", yaml) {
            match doc {
                Document::Valid(o) => configs.push(Arc::new(o)),
                Document::Invalid(e) => errors.push(e),
                Document::Ignored { .. } => {}
            }
        }
        SecurityIndex::build("istio-system", configs.iter(), &errors, |_| false)
    }

    fn ap(ns: &str, name: &str, spec: &str) -> String {
        format!("---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n")
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// Names of the policies applying, root namespace first, each namespace in document order.
    fn names(index: &SecurityIndex, ns: &str, l: &[(&str, &str)]) -> Vec<String> {
        index.authorization_policies_for(ns, &labels(l)).iter().map(|(c, _)| c.key.name.clone()).collect()
    }

    #[test]
    fn scopes_follow_istio() {
        let yaml = [
            ap("istio-system", "mesh-wide", "{}"),
            ap("istio-system", "root-selects-gw", "{selector: {matchLabels: {istio: ingressgateway}}}"),
            ap("shop", "shop-wide", "{}"),
            ap("shop", "orders-only", "{selector: {matchLabels: {app: orders}}}"),
            ap("other", "other-wide", "{}"),
        ]
        .concat();
        let ix = index(&yaml);
        assert_eq!(names(&ix, "shop", &[("app", "orders")]), ["mesh-wide", "shop-wide", "orders-only"]);
        assert_eq!(names(&ix, "shop", &[("app", "web")]), ["mesh-wide", "shop-wide"]);
        assert_eq!(names(&ix, "istio-system", &[("istio", "ingressgateway")]), ["mesh-wide", "root-selects-gw"]);
        assert_eq!(names(&ix, "edge", &[("istio", "ingressgateway")]), ["mesh-wide", "root-selects-gw"]);
        assert_eq!(names(&ix, "default", &[]), ["mesh-wide"]);
        let keys: Vec<&String> = ix.selector_keys().collect();
        assert_eq!(keys, ["istio", "app"]);
    }

    #[test]
    fn rejected_policies_deny_their_selector_or_namespace() {
        let yaml = [
            ap("shop", "custom", "{action: CUSTOM, provider: {name: x}, selector: {matchLabels: {app: orders}}}"),
            ap("shop", "typo", "{action: DENY, rules: [{to: [{operation: {pahts: [/admin]}}]}]}"),
            ap("other", "wild", "{action: DENY, rules: [{}], selector: {matchLabels: {app: '*'}}}"),
        ]
        .concat();
        let ix = index(&yaml);
        let rejected = |ns: &str, l: &[(&str, &str)]| -> Vec<String> {
            ix.rejected_policies_for(ns, &labels(l)).iter().map(|r| r.key.name.clone()).collect()
        };
        assert_eq!(rejected("shop", &[("app", "orders")]), ["custom", "typo"]);
        assert_eq!(rejected("shop", &[("app", "web")]), ["typo"], "the invalid CUSTOM policy's selector is readable");
        assert!(rejected("shop", &[("app", "*")]).iter().all(|n| n != "wild"));
        assert_eq!(rejected("other", &[("app", "orders")]), ["wild"], "an invalid selector denies the namespace");
        let r = &ix.rejected_policies_for("shop", &labels(&[]))[0];
        assert!(r.reason.contains("spec.rules[0].to[0].operation.pahts"), "{}", r.reason);
        let in_force = SecurityIndex::build("istio-system", std::iter::empty(), &[], |_| true);
        assert!(in_force.rejected_policies_for("shop", &labels(&[])).is_empty());
    }
}
