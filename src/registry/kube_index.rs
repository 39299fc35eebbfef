//! Kubernetes objects indexed for one registry build: every join the service model makes
//! (slice → Service, endpoint → Pod by name or IP, Pod → Node, Pod → Namespace) is a hash
//! lookup, so a build is linear in the number of objects.

use std::collections::HashMap;
use std::sync::Arc;

use super::discovery::NamespaceScope;
use super::kubernetes::{KubeEndpointSlice, KubeNamespace, KubeNode, KubeObject, KubeObjects, KubePod, KubeService};
use super::service::NETWORK_LABEL;

/// Kubernetes objects in discovery scope, indexed by the keys the registry joins on.
#[derive(Debug, Default)]
pub(super) struct KubeIndex<'a> {
    /// Services, in key order.
    pub services: Vec<&'a KubeService>,
    pods: HashMap<&'a str, HashMap<&'a str, &'a KubePod>>,
    pods_by_ip: HashMap<&'a str, Vec<&'a KubePod>>,
    pods_by_namespace: HashMap<&'a str, Vec<&'a KubePod>>,
    slices: HashMap<&'a str, HashMap<&'a str, Vec<&'a KubeEndpointSlice>>>,
    topology: Topology,
}

/// Nodes' localities and Namespaces' networks, each one shared string that every endpoint on
/// that Node or in that Namespace holds.
#[derive(Debug, Default)]
pub(super) struct Topology {
    localities: HashMap<String, Arc<str>>,
    networks: HashMap<String, Arc<str>>,
    none: Arc<str>,
}

impl Topology {
    /// Records a Node's locality (`region/zone/subzone`).
    pub fn set_node(&mut self, node: &KubeNode) {
        if node.region.is_empty() && node.zone.is_empty() && node.subzone.is_empty() {
            self.localities.remove(&node.name);
        } else {
            let locality = format!("{}/{}/{}", node.region, node.zone, node.subzone);
            self.localities.insert(node.name.clone(), locality.into());
        }
    }

    /// Forgets a Node.
    pub fn remove_node(&mut self, name: &str) {
        self.localities.remove(name);
    }

    /// Records a Namespace's network (its `topology.istio.io/network` label).
    pub fn set_namespace(&mut self, namespace: &KubeNamespace) {
        match namespace.labels.get(NETWORK_LABEL).filter(|n| !n.is_empty()) {
            Some(network) => self.networks.insert(namespace.name.clone(), network.as_str().into()),
            None => self.networks.remove(&namespace.name),
        };
    }

    /// Forgets a Namespace.
    pub fn remove_namespace(&mut self, name: &str) {
        self.networks.remove(name);
    }

    /// The locality of the Node `name` (empty when unknown or unlabelled).
    pub fn locality(&self, node: &str) -> Arc<str> {
        self.localities.get(node).unwrap_or(&self.none).clone()
    }

    /// The network of the Namespace `name` (empty when none).
    pub fn network(&self, namespace: &str) -> Arc<str> {
        self.networks.get(namespace).unwrap_or(&self.none).clone()
    }
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
    /// Localities of Nodes and networks of Namespaces.
    fn topology(&self) -> &Topology;
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
                    index.pods.entry(&*p.namespace).or_default().insert(&p.name, p);
                    for ip in &p.ips {
                        index.pods_by_ip.entry(ip.as_str()).or_default().push(p);
                    }
                    index.pods_by_namespace.entry(&*p.namespace).or_default().push(p);
                }
                KubeObject::Node(n) => index.topology.set_node(n),
                KubeObject::Namespace(n) => index.topology.set_namespace(n),
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
        self.pods_by_ip.get(ip)?.iter().find(|p| &*p.namespace == namespace).copied()
    }

    fn pods_in(&self, namespace: &str) -> Vec<&KubePod> {
        self.pods_by_namespace.get(namespace).cloned().unwrap_or_default()
    }

    fn slices_of(&self, namespace: &str, service: &str) -> Vec<&KubeEndpointSlice> {
        self.slices.get(namespace).and_then(|s| s.get(service)).cloned().unwrap_or_default()
    }

    fn topology(&self) -> &Topology {
        &self.topology
    }
}
