//! Generated resources cached by (snapshot version, proxy view, type): a thousand identical
//! sidecars cost one generation and one encoding per snapshot.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use prometheus::IntCounter;
use tokio::sync::OnceCell;

use super::generate::{generate, Resource};
use super::proxy::ProxyView;
use super::TypeUrl;
use crate::snapshot::{Snapshot, Version};

/// The resources of one type for one view, with content hashes to detect real changes.
#[derive(Debug)]
pub struct Generated {
    /// Resources sorted by name.
    pub resources: Vec<Resource>,
    /// Hash of each resource's encoded bytes, parallel to `resources`.
    pub hashes: Vec<u64>,
}

impl Generated {
    fn new(mut resources: Vec<Resource>) -> Generated {
        resources.sort_by(|a, b| a.name.cmp(&b.name));
        let hashes = resources.iter().map(resource_hash).collect();
        Generated { resources, hashes }
    }

    /// The resources whose names are in `names` (all when `names` is `None`), with a hash of the selection.
    pub fn select(&self, names: Option<&std::collections::BTreeSet<String>>) -> (Vec<&Resource>, u64) {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let mut out = Vec::new();
        for (r, rh) in self.resources.iter().zip(&self.hashes) {
            if names.is_none_or(|n| n.contains(&r.name)) {
                rh.hash(&mut h);
                out.push(r);
            }
        }
        out.len().hash(&mut h);
        (out, h.finish())
    }
}

fn resource_hash(r: &Resource) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    r.name.hash(&mut h);
    r.body.type_url.hash(&mut h);
    r.body.value.hash(&mut h);
    h.finish()
}

type Slot = Arc<OnceCell<Arc<Generated>>>;

struct Generation {
    version: Version,
    // Held only to find or insert a slot, never across generation or an await.
    slots: Mutex<HashMap<(ProxyView, TypeUrl), Slot>>,
}

/// Cache of generated resources for the latest snapshot version; older entries are dropped
/// when a newer snapshot is first asked for.
pub struct GenerationCache {
    current: ArcSwap<Generation>,
    internal_errors: IntCounter,
}

impl Default for GenerationCache {
    fn default() -> Self {
        GenerationCache::new(super::metrics::XdsMetrics::default().xds_internal_errors)
    }
}

impl GenerationCache {
    /// An empty cache counting failed generations in `internal_errors` (`pilot_total_xds_internal_errors`).
    pub fn new(internal_errors: IntCounter) -> GenerationCache {
        let current = ArcSwap::from_pointee(Generation { version: Version::default(), slots: Mutex::default() });
        GenerationCache { current, internal_errors }
    }

    /// The resources of `type_url` for `view` in `snapshot`, generated at most once.
    pub async fn get(&self, snapshot: &Arc<Snapshot>, view: &ProxyView, type_url: TypeUrl) -> Arc<Generated> {
        let slot = self.slot(snapshot.version, view, type_url);
        let internal_errors = self.internal_errors.clone();
        let snapshot = snapshot.clone();
        let view = view.clone();
        slot.get_or_init(|| async move {
            // Generation is CPU work: keep it off the async workers' hot path.
            let started = std::time::Instant::now();
            let generated = tokio::task::spawn_blocking(move || Generated::new(generate(type_url, &snapshot, &view)))
                .await
                .unwrap_or_else(|e| {
                    tracing::error!(error = %e, "xDS generation failed");
                    internal_errors.inc();
                    Generated::new(Vec::new())
                });
            tracing::debug!(type_url = %type_url, took_ms = started.elapsed().as_millis() as u64, resources = generated.resources.len(), "generated");
            Arc::new(generated)
        })
        .await
        .clone()
    }

    fn slot(&self, version: Version, view: &ProxyView, type_url: TypeUrl) -> Slot {
        let mut generation = self.current.load_full();
        if generation.version < version {
            let fresh = Arc::new(Generation { version, slots: Mutex::default() });
            let prev = self.current.compare_and_swap(&generation, fresh.clone());
            generation = if Arc::ptr_eq(&prev, &generation) { fresh } else { self.current.load_full() };
        }
        if generation.version != version {
            // A caller still on an older snapshot: generate without caching.
            return Arc::new(OnceCell::new());
        }
        let mut slots = match generation.slots.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        slots.entry((view.clone(), type_url)).or_default().clone()
    }
}
