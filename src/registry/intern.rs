//! Interning of the values many Kubernetes objects repeat: a workload's pods carry the same
//! labels, named ports, namespace, service account and node, so each is held once.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;

use super::kubernetes::{KubeObject, KubePod};
use crate::config::api::Labels;

/// Entries below which a pool is never swept.
const MIN_SWEEP: usize = 1024;

/// One pool of shared values. Values no object holds any more are dropped by a sweep, which
/// runs when the pool has doubled since the last one (amortised O(1) per insert).
#[derive(Debug)]
struct Pool<T: ?Sized> {
    values: HashSet<Arc<T>>,
    sweep_at: usize,
}

impl<T: ?Sized> Default for Pool<T> {
    fn default() -> Self {
        Pool { values: HashSet::new(), sweep_at: MIN_SWEEP }
    }
}

impl<T: ?Sized + Hash + Eq> Pool<T> {
    /// The pool's value equal to `value`, which joins the pool if it has none.
    fn share(&mut self, value: Arc<T>) -> Arc<T> {
        if let Some(held) = self.values.get(&value) {
            return held.clone();
        }
        if self.values.len() >= self.sweep_at {
            // Only the pool holds these: no object uses them any more.
            self.values.retain(|v| Arc::strong_count(v) > 1);
            self.sweep_at = (self.values.len() * 2).max(MIN_SWEEP);
        }
        self.values.insert(value.clone());
        value
    }
}

/// The shared values of the registry's Kubernetes objects. One owner (the source's state) holds it.
#[derive(Debug, Default)]
pub struct Interner {
    labels: Pool<Labels>,
    strings: Pool<str>,
    ports: Pool<[(String, u16)]>,
}

impl Interner {
    /// `object` with its repeated parts replaced by the shared values equal to them.
    pub fn object(&mut self, object: KubeObject) -> KubeObject {
        match object {
            KubeObject::Pod(pod) => KubeObject::Pod(self.pod(pod)),
            KubeObject::EndpointSlice(mut slice) => {
                for endpoint in &mut slice.endpoints {
                    endpoint.node_name = endpoint.node_name.take().map(|n| self.strings.share(n));
                }
                KubeObject::EndpointSlice(slice)
            }
            other => other,
        }
    }

    fn pod(&mut self, pod: KubePod) -> KubePod {
        KubePod {
            namespace: self.strings.share(pod.namespace),
            labels: self.labels.share(pod.labels),
            service_account: self.strings.share(pod.service_account),
            node_name: self.strings.share(pod.node_name),
            named_ports: self.ports.share(pod.named_ports),
            ..pod
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, app: &str) -> KubeObject {
        KubeObject::Pod(KubePod {
            name: name.into(),
            namespace: "shop".into(),
            labels: Arc::new([("app".to_string(), app.to_string())].into()),
            service_account: app.into(),
            ips: vec![],
            node_name: "node-1".into(),
            ready: true,
            terminating: false,
            named_ports: Arc::from(vec![("http".to_string(), 8080)]),
        })
    }

    fn parts(o: &KubeObject) -> &KubePod {
        match o {
            KubeObject::Pod(p) => p,
            _ => unreachable!("a pod"),
        }
    }

    #[test]
    fn pods_of_one_workload_share_their_values_and_others_do_not() {
        let mut interner = Interner::default();
        let a = interner.object(pod("reviews-1", "reviews"));
        let b = interner.object(pod("reviews-2", "reviews"));
        let c = interner.object(pod("ratings-1", "ratings"));
        let (a, b, c) = (parts(&a), parts(&b), parts(&c));
        assert!(Arc::ptr_eq(&a.labels, &b.labels));
        assert!(Arc::ptr_eq(&a.named_ports, &b.named_ports));
        assert!(Arc::ptr_eq(&a.namespace, &c.namespace));
        assert!(Arc::ptr_eq(&a.node_name, &c.node_name));
        assert!(!Arc::ptr_eq(&a.labels, &c.labels));
        assert_eq!(c.labels.get("app").map(String::as_str), Some("ratings"));
    }

    #[test]
    fn a_sweep_drops_values_no_object_holds() {
        let mut interner = Interner::default();
        for i in 0..MIN_SWEEP * 3 {
            drop(interner.object(pod(&format!("p-{i}"), &format!("app-{i}"))));
        }
        // Each sweep leaves only what was inserted since; the pool never holds all 3,072.
        assert!(interner.labels.values.len() <= MIN_SWEEP + 1, "{}", interner.labels.values.len());
    }
}
