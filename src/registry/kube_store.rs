//! Kubernetes objects indexed for the registry's joins and kept across builds: each change
//! updates the indexes of its one object, so an endpoint change costs no pass over all objects.
//!
//! Unlike the one-build [`KubeIndex`](super::kube_index::KubeIndex) it holds every namespace:
//! every lookup is by a namespace the caller took from an in-scope service, so out-of-scope
//! objects are never reached.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::kube_index::{KubeLookup, Topology};
use super::kubernetes::{KubeEndpointSlice, KubeKind, KubeObject, KubePod, KubeService};
use crate::config::api::Labels;

/// Objects by namespace, then by a name (or IP).
type ByNamespace<T> = HashMap<String, HashMap<String, T>>;

/// Every Kubernetes object, indexed by the keys the registry joins on.
#[derive(Debug, Default)]
pub struct KubeStore {
    services: ByNamespace<Arc<KubeObject>>,
    /// Pods by namespace, in name order.
    pods: HashMap<String, BTreeMap<String, Arc<KubeObject>>>,
    /// Pods by namespace and IP, in name order (host-network pods share an IP).
    pods_by_ip: ByNamespace<Vec<Arc<KubeObject>>>,
    /// Slices by namespace and Service name, in slice name order.
    slices: ByNamespace<BTreeMap<String, Arc<KubeObject>>>,
    /// Services whose slices name a Pod in `targetRef`, with how many endpoints do.
    refs_by_pod: ByNamespace<Few<String, usize>>,
    /// Services whose slices list an address without `targetRef` (joined to a Pod by IP).
    refs_by_ip: ByNamespace<Few<String, usize>>,
    topology: Topology,
}

impl KubeStore {
    /// Replaces `old` (if any) by `new` (if any): both are versions of one object.
    pub fn update(&mut self, old: Option<&Arc<KubeObject>>, new: Option<&Arc<KubeObject>>) {
        if let Some(old) = old {
            self.remove(old);
        }
        if let Some(new) = new {
            self.insert(new);
        }
    }

    /// The Service `namespace/name`.
    pub fn service(&self, namespace: &str, name: &str) -> Option<&KubeService> {
        match self.services.get(namespace)?.get(name)?.as_ref() {
            KubeObject::Service(s) => Some(s),
            _ => None,
        }
    }

    /// Names of the Services of `namespace` whose selector picks a workload labelled `labels` (a
    /// WorkloadEntry: an empty selector, or no labels, selects nothing).
    pub fn services_selecting(&self, namespace: &str, labels: &Labels) -> BTreeSet<String> {
        let services = self.services.get(namespace).into_iter().flat_map(HashMap::values);
        let selecting = services.filter_map(|object| match object.as_ref() {
            KubeObject::Service(s) => {
                let selector = s.selector.as_ref().filter(|sel| !sel.is_empty() && !labels.is_empty())?;
                selector.iter().all(|(k, v)| labels.get(k) == Some(v)).then(|| s.name.clone())
            }
            _ => None,
        });
        selecting.collect()
    }

    /// Names of the Services of `namespace` whose slices refer to `pod` by name or to one of `ips`.
    pub fn services_referring_to(&self, namespace: &str, pod: &str, ips: &[String]) -> BTreeSet<String> {
        let by_pod = self.refs_by_pod.get(namespace).and_then(|m| m.get(pod));
        let by_ip = self.refs_by_ip.get(namespace);
        let by_ip = ips.iter().filter_map(|ip| by_ip?.get(ip));
        by_pod.into_iter().chain(by_ip).flat_map(|m| m.keys().cloned()).collect()
    }

    fn insert(&mut self, object: &Arc<KubeObject>) {
        let shared = object.clone();
        match object.as_ref() {
            KubeObject::Service(s) => {
                self.services.entry(s.namespace.clone()).or_default().insert(s.name.clone(), shared);
            }
            KubeObject::EndpointSlice(s) => {
                for (map, key) in slice_refs(s) {
                    let refs = match map {
                        RefMap::Pod => &mut self.refs_by_pod,
                        RefMap::Ip => &mut self.refs_by_ip,
                    };
                    let count = refs.entry(s.namespace.clone()).or_default().entry(key.to_string()).or_default();
                    *count.entry(s.service_name.clone(), 0) += 1;
                }
                let by_service = self.slices.entry(s.namespace.clone()).or_default();
                by_service.entry(s.service_name.clone()).or_default().insert(s.name.clone(), shared);
            }
            KubeObject::Pod(p) => {
                for ip in &p.ips {
                    let by_ip = self.pods_by_ip.entry(p.namespace.to_string()).or_default();
                    let pods = by_ip.entry(ip.clone()).or_default();
                    let at = pods.partition_point(|o| as_pod(o).is_some_and(|o| o.name < p.name));
                    pods.insert(at, shared.clone());
                }
                self.pods.entry(p.namespace.to_string()).or_default().insert(p.name.clone(), shared);
            }
            KubeObject::Node(n) => self.topology.set_node(n),
            KubeObject::Namespace(n) => self.topology.set_namespace(n),
            // Certificates shape no service or endpoint.
            KubeObject::Secret(_) => {}
        }
    }

    fn remove(&mut self, object: &KubeObject) {
        match object {
            KubeObject::Service(s) => {
                if let Some(services) = self.services.get_mut(&s.namespace) {
                    services.remove(&s.name);
                    if services.is_empty() {
                        self.services.remove(&s.namespace);
                    }
                }
            }
            KubeObject::EndpointSlice(s) => {
                for (map, key) in slice_refs(s) {
                    let refs = match map {
                        RefMap::Pod => &mut self.refs_by_pod,
                        RefMap::Ip => &mut self.refs_by_ip,
                    };
                    remove_nested(refs, &s.namespace, key, |m| {
                        if let Some(count) = m.get_mut(&s.service_name) {
                            *count = count.saturating_sub(1);
                            if *count == 0 {
                                m.remove(&s.service_name);
                            }
                        }
                    });
                }
                remove_nested(&mut self.slices, &s.namespace, &s.service_name, |m| {
                    m.remove(&s.name);
                });
            }
            KubeObject::Pod(p) => {
                for ip in &p.ips {
                    remove_nested(&mut self.pods_by_ip, &p.namespace, ip, |pods| {
                        pods.retain(|o| as_pod(o).is_none_or(|o| o.name != p.name));
                    });
                }
                if let Some(pods) = self.pods.get_mut(&*p.namespace) {
                    pods.remove(&p.name);
                    if pods.is_empty() {
                        self.pods.remove(&*p.namespace);
                    }
                }
            }
            KubeObject::Node(n) => self.topology.remove_node(&n.name),
            KubeObject::Namespace(n) => self.topology.remove_namespace(&n.name),
            KubeObject::Secret(_) => {}
        }
    }
}

/// A small map in key order: the values under one key of an index are usually one (a Pod per
/// IP, a Service per Pod), for which a map's node would cost several hundred bytes.
#[derive(Debug)]
struct Few<K, V>(Vec<(K, V)>);

impl<K, V> Default for Few<K, V> {
    fn default() -> Self {
        Few(Vec::new())
    }
}

impl<K: Ord, V> Few<K, V> {
    fn find<Q: Ord + ?Sized>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
    {
        self.0.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    /// The value of `key`, inserted as `value` if absent.
    fn entry(&mut self, key: K, value: V) -> &mut V {
        let i = match self.find(&key) {
            Ok(i) => i,
            Err(i) => {
                self.0.insert(i, (key, value));
                i
            }
        };
        &mut self.0[i].1
    }

    fn get_mut<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        let i = self.find(key).ok()?;
        Some(&mut self.0[i].1)
    }

    fn remove<Q: Ord + ?Sized>(&mut self, key: &Q)
    where
        K: Borrow<Q>,
    {
        if let Ok(i) = self.find(key) {
            self.0.remove(i);
        }
    }

    fn keys(&self) -> impl Iterator<Item = &K> {
        self.0.iter().map(|(k, _)| k)
    }
}

/// Which reverse index a slice endpoint's reference goes to.
enum RefMap {
    Pod,
    Ip,
}

/// The references of a slice's endpoints: a Pod name, else each address (joined by IP).
fn slice_refs(slice: &KubeEndpointSlice) -> impl Iterator<Item = (RefMap, &str)> {
    slice.endpoints.iter().flat_map(|e| -> Box<dyn Iterator<Item = (RefMap, &str)>> {
        match &e.pod {
            Some(pod) => Box::new(std::iter::once((RefMap::Pod, pod.as_str()))),
            None => Box::new(e.addresses.iter().map(|a| (RefMap::Ip, a.as_str()))),
        }
    })
}

/// Applies `edit` to the entry `namespace/key` of `map` and drops the entries it leaves empty,
/// so the maps keep no dead keys.
fn remove_nested<T: Emptiness>(map: &mut ByNamespace<T>, namespace: &str, key: &str, edit: impl FnOnce(&mut T)) {
    let Some(inner) = map.get_mut(namespace) else { return };
    if let Some(value) = inner.get_mut(key) {
        edit(value);
        if value.is_empty() {
            inner.remove(key);
        }
    }
    if inner.is_empty() {
        map.remove(namespace);
    }
}

/// A container that can be empty.
trait Emptiness {
    fn is_empty(&self) -> bool;
}

impl<K, V> Emptiness for Few<K, V> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<T> Emptiness for Vec<T> {
    fn is_empty(&self) -> bool {
        Vec::is_empty(self)
    }
}

impl<K, V> Emptiness for BTreeMap<K, V> {
    fn is_empty(&self) -> bool {
        BTreeMap::is_empty(self)
    }
}

impl<K, V> Emptiness for HashMap<K, V> {
    fn is_empty(&self) -> bool {
        HashMap::is_empty(self)
    }
}

fn as_pod(object: &KubeObject) -> Option<&KubePod> {
    match object {
        KubeObject::Pod(p) => Some(p),
        _ => None,
    }
}

impl KubeLookup for KubeStore {
    fn pod(&self, namespace: &str, name: &str) -> Option<&KubePod> {
        as_pod(self.pods.get(namespace)?.get(name)?)
    }

    fn pod_by_ip(&self, namespace: &str, ip: &str) -> Option<&KubePod> {
        as_pod(self.pods_by_ip.get(namespace)?.get(ip)?.first()?)
    }

    fn pods_in(&self, namespace: &str) -> Vec<&KubePod> {
        self.pods.get(namespace).into_iter().flat_map(|m| m.values()).filter_map(|p| as_pod(p)).collect()
    }

    fn slices_of(&self, namespace: &str, service: &str) -> Vec<&KubeEndpointSlice> {
        let slices = self.slices.get(namespace).and_then(|m| m.get(service));
        slices
            .into_iter()
            .flat_map(|m| m.values())
            .filter_map(|s| match s.as_ref() {
                KubeObject::EndpointSlice(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    fn topology(&self) -> &Topology {
        &self.topology
    }
}

/// Whether a change of this kind can change only endpoints (never a service definition, the
/// discovery scope or every endpoint at once).
pub fn endpoint_kind(kind: KubeKind) -> bool {
    matches!(kind, KubeKind::EndpointSlice | KubeKind::Pod)
}
