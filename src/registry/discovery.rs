//! Discovery scope: the namespaces MeshConfig's `discoverySelectors` select.
//!
//! A namespace is in scope when its labels match any selector; an empty list selects every
//! namespace. Out-of-scope namespaces contribute nothing to the registry: no Kubernetes
//! Services, EndpointSlices or Pods, and, as Istio does since 1.22 (enhanced resource scoping,
//! on by default), no Istio config objects either (ServiceEntries, WorkloadEntries here;
//! VirtualServices, DestinationRules, Sidecars and Gateways in the snapshot). Cluster-scoped
//! objects (Nodes, Namespaces) are always in scope.
//!
//! Namespace labels come from the Kubernetes source. A namespace whose Namespace object is not
//! known counts as unlabelled (as in Istio, where objects of a namespace the informer has not
//! seen are filtered out). Without any Namespace object at all, no Kubernetes source is running
//! (file config only): the selectors cannot be evaluated and every namespace stays in scope.

use std::collections::HashMap;

use super::kubernetes::{KubeKey, KubeKind, KubeObject, KubeObjects};
use crate::config::api::Labels;
use crate::mesh::MeshConfig;

/// The namespaces in discovery scope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceScope {
    /// Known namespaces and whether each is selected; `None` when every namespace is in scope.
    known: Option<HashMap<String, bool>>,
    /// Whether a namespace without a Namespace object is selected (its labels are empty).
    unknown_selected: bool,
}

impl NamespaceScope {
    /// The scope `mesh.discovery_selectors` selects among the Namespaces in `kube`.
    pub fn new(mesh: &MeshConfig, kube: &KubeObjects) -> NamespaceScope {
        let selectors = &mesh.discovery_selectors;
        if selectors.is_empty() {
            return NamespaceScope::default();
        }
        let matches = |labels: &Labels| selectors.iter().any(|s| s.matches(labels));
        // Keys order by kind first: the Namespaces are one range, not a scan of every Pod.
        let first = KubeKey { kind: KubeKind::Namespace, namespace: String::new(), name: String::new() };
        let known: HashMap<String, bool> = kube
            .range(first..)
            .filter_map(|(_, o)| match o.as_ref() {
                KubeObject::Namespace(ns) => Some((ns.name.clone(), matches(&ns.labels))),
                _ => None,
            })
            .collect();
        if known.is_empty() {
            return NamespaceScope::default();
        }
        NamespaceScope { known: Some(known), unknown_selected: matches(&Labels::new()) }
    }

    /// Whether every namespace is in scope.
    pub fn selects_all(&self) -> bool {
        self.known.is_none()
    }

    /// Whether objects of `namespace` are in scope (cluster-scoped ones, with an empty namespace, always are).
    pub fn contains(&self, namespace: &str) -> bool {
        match &self.known {
            None => true,
            Some(_) if namespace.is_empty() => true,
            Some(known) => known.get(namespace).copied().unwrap_or(self.unknown_selected),
        }
    }
}
