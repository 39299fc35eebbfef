//! Kubernetes objects indexed for one registry build: every join the service model makes
//! (slice → Service, endpoint → Pod by name or IP, Pod → Node, Pod → Namespace) is a hash
//! lookup, so a build is linear in the number of objects.

use std::collections::HashMap;

use super::discovery::NamespaceScope;
use super::kubernetes::{KubeEndpointSlice, KubeNamespace, KubeNode, KubeObject, KubeObjects, KubePod, KubeService};

/// Kubernetes objects in discovery scope, indexed by the keys the registry joins on.
#[derive(Debug, Default)]
pub(super) struct KubeIndex<'a> {
    /// Services, in key order.
    pub services: Vec<&'a KubeService>,
    pods: HashMap<&'a str, HashMap<&'a str, &'a KubePod>>,
    pods_by_ip: HashMap<&'a str, Vec<&'a KubePod>>,
    pods_by_namespace: HashMap<&'a str, Vec<&'a KubePod>>,
    slices: HashMap<&'a str, HashMap<&'a str, Vec<&'a KubeEndpointSlice>>>,
    nodes: HashMap<&'a str, &'a KubeNode>,
    namespaces: HashMap<&'a str, &'a KubeNamespace>,
}

/// The joins the service model makes on Kubernetes objects, answered by the one-build
/// [`KubeIndex`] or by the [`KubeStore`](super::kube_store::KubeStore) kept across builds.
pub(super) trait KubeLookup {
    /// The Pod `namespace/name`.
    fn pod(&self, namespace: &str, name: &str) -> Option<&KubePod>;
    /// A Pod of `namespace` with `ip` (host-network pods share IPs: the first in name order, as Istio guesses).
    fn pod_by_ip(&self, namespace: &str, ip: &str) -> Option<&KubePod>;
    /// Pods of `namespace`, in name order.
    fn pods_in(&self, namespace: &str) -> Vec<&KubePod>;
    /// EndpointSlices of the Service `namespace/service`, in name order.
    fn slices_of(&self, namespace: &str, service: &str) -> Vec<&KubeEndpointSlice>;
    /// The Node `name`.
    fn node(&self, name: &str) -> Option<&KubeNode>;
    /// The Namespace `name`.
    fn namespace(&self, name: &str) -> Option<&KubeNamespace>;
}

impl<'a> KubeIndex<'a> {
    /// Indexes the objects of `kube` that `scope` keeps, in one pass.
    pub fn new(kube: &'a KubeObjects, scope: &NamespaceScope) -> KubeIndex<'a> {
        let mut index = KubeIndex::default();
        for object in kube.values() {
            match object.as_ref() {
                KubeObject::Service(s) if scope.contains(&s.namespace) => index.services.push(s),
                KubeObject::EndpointSlice(s) if scope.contains(&s.namespace) => {
                    index.slices.entry(&s.namespace).or_default().entry(&s.service_name).or_default().push(s)
                }
                KubeObject::Pod(p) if scope.contains(&p.namespace) => {
                    index.pods.entry(&p.namespace).or_default().insert(&p.name, p);
                    for ip in &p.ips {
                        index.pods_by_ip.entry(ip.as_str()).or_default().push(p);
                    }
                    index.pods_by_namespace.entry(p.namespace.as_str()).or_default().push(p);
                }
                KubeObject::Node(n) => {
                    index.nodes.insert(n.name.as_str(), n);
                }
                KubeObject::Namespace(n) => {
                    index.namespaces.insert(n.name.as_str(), n);
                }
                _ => {}
            }
        }
        index
    }
}

impl KubeLookup for KubeIndex<'_> {
    fn pod(&self, namespace: &str, name: &str) -> Option<&KubePod> {
        self.pods.get(namespace)?.get(name).copied()
    }

    fn pod_by_ip(&self, namespace: &str, ip: &str) -> Option<&KubePod> {
        self.pods_by_ip.get(ip)?.iter().find(|p| p.namespace == namespace).copied()
    }

    fn pods_in(&self, namespace: &str) -> Vec<&KubePod> {
        self.pods_by_namespace.get(namespace).cloned().unwrap_or_default()
    }

    fn slices_of(&self, namespace: &str, service: &str) -> Vec<&KubeEndpointSlice> {
        self.slices.get(namespace).and_then(|s| s.get(service)).cloned().unwrap_or_default()
    }

    fn node(&self, name: &str) -> Option<&KubeNode> {
        self.nodes.get(name).copied()
    }

    fn namespace(&self, name: &str) -> Option<&KubeNamespace> {
        self.namespaces.get(name).copied()
    }
}
