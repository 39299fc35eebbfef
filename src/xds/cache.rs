//! Generated resources cached by (snapshot version, proxy view, type): a thousand identical
//! sidecars cost one generation and one encoding per snapshot.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use bytes::Bytes;
use prometheus::IntGauge;
use tokio::sync::{OnceCell, Semaphore};

use super::metrics::XdsMetrics;
use super::response::resources_field;
use super::TypeUrl;
use crate::config::ConfigKey;
use crate::envoy::{
    changed_types, generate, generate_endpoints_of, generate_routes_of, has_clusters_of, Resource, RoutingEdit,
};
use crate::envoy::{ChangeEffects, KeptResolutions, ProxyView, SharedView};
use crate::registry::Hostname;
use crate::snapshot::{Snapshot, Version};
use crate::telemetry::metrics::gauge_value;

/// The resources of one type for one view, with content hashes to detect real changes.
#[derive(Debug)]
pub struct Generated {
    /// Resources sorted by name.
    pub resources: Vec<Resource>,
    /// Hash of each resource's encoded bytes, parallel to `resources`.
    pub hashes: Vec<u64>,
    /// Each resource encoded as the `Any` it is sent as, parallel to `resources`: a slice of
    /// `field`, which responses carrying only some resources copy.
    pub encoded: Vec<Bytes>,
    /// All resources laid out as a state-of-the-world response's `resources` field: a response
    /// carrying them all sends this buffer as it is.
    pub field: Bytes,
    /// Its bytes counted in the cache's live total for as long as anything holds it.
    charge: Option<Charge>,
}

/// A generation's bytes in the live total of the cache that made it, given back when the last
/// holder (the cache, a connection, a stream lagging on an older snapshot) drops it.
#[derive(Debug)]
struct Charge {
    live: IntGauge,
    bytes: i64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.live.sub(self.bytes);
    }
}

impl Generated {
    /// Resources sorted by name, with their hashes.
    pub fn from_resources(resources: Vec<Resource>) -> Generated {
        Generated::new(resources)
    }

    /// Indices of the resources whose names are in `names` (all when `None`), in name order.
    pub fn select_indices(&self, names: Option<&super::names::NameSet>) -> Vec<usize> {
        (0..self.resources.len()).filter(|&i| names.is_none_or(|n| n.contains(&self.resources[i].name))).collect()
    }

    /// Index of the resource named `name` (resources are sorted by name).
    pub fn find(&self, name: &str) -> Option<usize> {
        self.resources.binary_search_by(|r| r.name.as_str().cmp(name)).ok()
    }

    fn new(mut resources: Vec<Resource>) -> Generated {
        resources.sort_by(|a, b| a.name.cmp(&b.name));
        let hashes = resources.iter().map(resource_hash).collect();
        Generated::laid_out(resources, hashes)
    }

    /// Sorted resources and their hashes, encoded.
    fn laid_out(resources: Vec<Resource>, hashes: Vec<u64>) -> Generated {
        let (field, encoded) = resources_field(resources.iter().map(|r| &r.body));
        Generated { resources, hashes, encoded, field, charge: None }
    }

    /// This generation, its bytes counted in `live` until it is dropped.
    fn charged(mut self, live: &IntGauge) -> Generated {
        let bytes = gauge_value(self.bytes());
        live.add(bytes);
        self.charge = Some(Charge { live: live.clone(), bytes });
        self
    }

    /// This generation with `fresh` (sorted by name) in place of the resources of the same
    /// names; `None` if some fresh resource has no counterpart (the set of names changed).
    fn patched(&self, fresh: Vec<Resource>) -> Option<Generated> {
        let (mut resources, mut hashes) = (self.resources.clone(), self.hashes.clone());
        for resource in fresh {
            let i = self.find(&resource.name)?;
            hashes[i] = resource_hash(&resource);
            resources[i] = resource;
        }
        Some(Generated::laid_out(resources, hashes))
    }

    /// Whether `other` holds the same resources, byte for byte.
    fn same_content(&self, other: &Generated) -> bool {
        self.hashes == other.hashes
            && self.resources.len() == other.resources.len()
            && self.resources.iter().zip(&other.resources).all(|(a, b)| a.name == b.name)
            && self.encoded == other.encoded
    }

    /// Bytes it holds (encoded resources and names), for the cache's budget.
    pub fn bytes(&self) -> usize {
        self.resources.iter().map(|r| r.body.value.len() + r.body.type_url.len() + r.name.len() * 2).sum::<usize>()
            + self.hashes.len() * 8
            + self.field.len()
    }
}

/// A content hash stable across processes and builds: delta xDS sends it as the resource's
/// version, so frontends agree on versions and a reconnecting proxy's versions still match.
fn resource_hash(r: &Resource) -> u64 {
    let mut h = xxhash_rust::xxh64::Xxh64::new(0);
    for part in [r.name.as_bytes(), r.body.type_url.as_bytes(), &r.body.value] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.digest()
}

/// Memory the generated config of a frontend may take by default: about 100 distinct views of a
/// 2,000-service mesh (each stream of a view shares its generations).
pub const DEFAULT_BUDGET_BYTES: usize = 512 * 1024 * 1024;

/// A new distinct view refused: the generated config alive already takes the whole budget.
#[derive(Debug, thiserror::Error)]
#[error("this frontend's generated config takes {live} bytes, at its budget of {budget} (--max-config-memory-bytes): a proxy with a configuration no connected proxy shares is not admitted; retry later or through another frontend")]
pub struct OverBudget {
    /// Bytes of generated config alive.
    pub live: usize,
    /// The budget.
    pub budget: usize,
}

/// One cached generation of one type for one view.
#[derive(Default)]
struct Entry {
    cell: OnceCell<Arc<Generated>>,
    /// Cache tick of the last use, for least-recently-used eviction.
    last_used: AtomicU64,
    /// Bytes accounted for it once generated.
    bytes: AtomicUsize,
}

/// A view resolved against a generation's snapshot, shared by every entry and lookup of it (a
/// connection's own view is a plain [`SharedView`]: the two never mix as keys).
#[derive(Clone, PartialEq, Eq, Hash)]
struct Resolved(SharedView);

impl Resolved {
    fn new(view: ProxyView) -> Resolved {
        Resolved(SharedView::new(view))
    }
}

impl std::ops::Deref for Resolved {
    type Target = ProxyView;

    fn deref(&self) -> &ProxyView {
        &self.0
    }
}

type Key = (Resolved, TypeUrl);

struct Generation {
    version: Version,
    /// The snapshot it generates from (`None` for the empty start): the next generation compares
    /// itself with it to know which entries it can take over.
    snapshot: Option<Arc<Snapshot>>,
    /// The previous generation, whose entries this one takes over or compares with.
    carry: Mutex<Option<Carry>>,
    // Held only to find, insert or evict entries, never across generation or an await.
    entries: Mutex<HashMap<Key, Arc<Entry>>>,
    bytes: AtomicUsize,
    /// Connection views resolved against this generation's snapshot (entries are keyed by the
    /// resolved view, which several connection views may share).
    resolved: Mutex<Resolutions>,
    /// Per resolved view, whether this generation's change may alter its resources.
    concerned: Mutex<HashMap<Resolved, bool>>,
}

/// Which resolved view each connection view maps to, and how many map to each resolved view.
#[derive(Default)]
struct Resolutions {
    of: HashMap<SharedView, Resolved>,
    users: HashMap<Resolved, usize>,
}

/// The generation before, as a new one takes over from it: its entries move out of it as this
/// one takes them, so at most one generation's worth is kept twice, and only until every view
/// was asked for again.
struct Carry {
    from: Arc<Generation>,
    /// The types whose generations stay the same whatever the view (see [`ChangeEffects`]).
    types: Vec<TypeUrl>,
    /// With CDS taken over (the same clusters): the hosts whose endpoints changed, the only ones
    /// whose EDS resources need generating again.
    endpoint_hosts: BTreeSet<Hostname>,
    /// A change made only of VirtualServices and DestinationRules: views that depend on none of
    /// them keep every resource.
    routing: Option<RoutingChange>,
    /// The views whose resolution the previous generation's is still.
    resolutions: KeptResolutions,
}

/// What a generation regenerates of the previous one's resources, the rest being kept.
enum Patch {
    /// EDS with the same clusters: the resources of the hosts whose endpoints changed.
    Endpoints(BTreeSet<Hostname>),
    /// RDS after edits of these VirtualServices that changed only their HTTP routes.
    Routes(Vec<ConfigKey>),
}

impl Patch {
    /// `base` patched for `view` in `snapshot`; `None` when it must be generated whole.
    fn apply(&self, base: &Generated, snapshot: &Snapshot, view: &ProxyView) -> Option<Generated> {
        let fresh = match self {
            Patch::Endpoints(hosts) => generate_endpoints_of(snapshot, view, hosts),
            Patch::Routes(edited) => generate_routes_of(snapshot, view, edited, &base.resources)?,
        };
        base.patched(fresh)
    }
}

/// The edits of a routing-only change, and which views it leaves as they were.
struct RoutingChange {
    previous: Arc<Snapshot>,
    edits: Arc<[RoutingEdit]>,
    /// Per resolved view: the types the change may alter for it (none: it reads none of the edited objects).
    changed: HashMap<Resolved, Arc<[TypeUrl]>>,
}

impl Generation {
    fn new(version: Version) -> Generation {
        Generation {
            version,
            snapshot: None,
            carry: Mutex::default(),
            entries: Mutex::default(),
            bytes: AtomicUsize::new(0),
            resolved: Mutex::default(),
            concerned: Mutex::default(),
        }
    }

    /// The generation of `snapshot`, taking over from `previous` what the change allows.
    fn after(previous: &Arc<Generation>, snapshot: &Arc<Snapshot>) -> Generation {
        // Only one generation back: the previous one's own link goes, so no chain of old
        // generations (and their snapshots) stays alive.
        let taken = previous.lock_carry().take();
        drop(taken);
        let carry = previous.snapshot.as_ref().map(|p| {
            let ChangeEffects { carried: types, endpoint_hosts, routing } = ChangeEffects::between(p, snapshot);
            let routing = routing.map(|edits| RoutingChange { previous: p.clone(), edits, changed: HashMap::new() });
            let resolutions = KeptResolutions::between(p, snapshot);
            Carry { from: previous.clone(), types, endpoint_hosts, routing, resolutions }
        });
        Generation { snapshot: Some(snapshot.clone()), carry: Mutex::new(carry), ..Generation::new(snapshot.version) }
    }

    /// Whether a routing-only change leaves `type_url` of `view` (resolved) as the previous
    /// generation had it. Decided once per view.
    fn routing_keeps(&self, view: &Resolved, type_url: TypeUrl) -> bool {
        let (previous, edits) = {
            let carry = self.lock_carry();
            let Some(routing) = carry.as_ref().and_then(|c| c.routing.as_ref()) else {
                return false;
            };
            if let Some(changed) = routing.changed.get(view) {
                return !changed.contains(&type_url);
            }
            (routing.previous.clone(), routing.edits.clone())
        };
        let Some(next) = self.snapshot.as_deref() else {
            return false;
        };
        // Scopes are resolved outside the lock: other views' lookups go on meanwhile.
        let changed: Arc<[TypeUrl]> = changed_types(&previous, next, view, &edits).into();
        let keeps = !changed.contains(&type_url);
        if let Some(routing) = self.lock_carry().as_mut().and_then(|c| c.routing.as_mut()) {
            routing.changed.insert(view.clone(), changed);
        }
        keeps
    }

    /// Whether the change leaves every resource of `view` (resolved; `connection` as a stream
    /// holds it) as the previous generation has them: see [`GenerationCache::concerns`].
    fn unconcerned(&self, view: &Resolved, connection: &SharedView) -> bool {
        let (from, routing, endpoint_hosts) = {
            let carry = self.lock_carry();
            let Some(carry) = carry.as_ref().filter(|c| c.resolutions.keeps(connection)) else { return false };
            let endpoints_only = TypeUrl::PUSH_ORDER.iter().all(|t| *t == TypeUrl::Endpoint || carry.types.contains(t));
            let hosts = endpoints_only.then(|| carry.endpoint_hosts.clone());
            (carry.from.clone(), carry.routing.is_some(), hosts)
        };
        // Served by the previous generation: its entries are there to take over.
        if !from.lock_resolved().users.contains_key(view) {
            return false;
        }
        let Some(next) = self.snapshot.as_deref() else { return false };
        match endpoint_hosts {
            Some(hosts) => !has_clusters_of(next, view, &hosts),
            None => routing && TypeUrl::PUSH_ORDER.iter().all(|t| self.routing_keeps(view, *t)),
        }
    }

    /// The entry of `key`, taken over from the previous generation if this one has none yet;
    /// `None` when neither has it.
    fn carried_entry(&self, key: &Key) -> Option<Arc<Entry>> {
        let mut entries = self.lock();
        match entries.get(key) {
            Some(entry) => Some(entry.clone()),
            None => self.take_over(&mut entries, key, false),
        }
    }

    /// Takes the previous generation's entry of `key` over into `entries` (this generation's,
    /// locked); `carry_only` as for [`Generation::take_previous`].
    fn take_over(&self, entries: &mut HashMap<Key, Arc<Entry>>, key: &Key, carry_only: bool) -> Option<Arc<Entry>> {
        let (generated, bytes) = self.take_previous(key, carry_only)?;
        // Counted under the lock, as removals are.
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        let entry = Arc::new(Entry {
            cell: OnceCell::new_with(Some(generated)),
            last_used: AtomicU64::new(0),
            bytes: AtomicUsize::new(bytes),
        });
        entries.insert(key.clone(), entry.clone());
        Some(entry)
    }

    fn lock_concerned(&self) -> MutexGuard<'_, HashMap<Resolved, bool>> {
        self.concerned.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_carry(&self) -> MutexGuard<'_, Option<Carry>> {
        self.carry.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes the previous generation's entry for `key` out of it; `carry_only`: only when this
    /// generation takes its type over unchanged. Returns its finished generation and bytes.
    fn take_previous(&self, key: &Key, carry_only: bool) -> Option<(Arc<Generated>, usize)> {
        let from = {
            let carry = self.lock_carry();
            let carry = carry.as_ref().filter(|c| !carry_only || c.types.contains(&key.1))?;
            carry.from.clone()
        };
        let entry = {
            let mut entries = from.lock();
            let entry = entries.remove(key)?;
            from.bytes.fetch_sub(entry.bytes.load(Ordering::Relaxed), Ordering::Relaxed);
            entry
        };
        let generated = entry.cell.get()?.clone();
        Some((generated, entry.bytes.load(Ordering::Relaxed)))
    }

    /// The previous generation's resources of `key` (taken out of it) and what to generate
    /// again to patch them, when the change allows: EDS with the same clusters, and RDS of a
    /// view whose routes alone the change alters.
    fn patch_base(&self, key: &Key) -> Option<(Arc<Generated>, Patch)> {
        let patch = {
            let carry = self.lock_carry();
            let carry = carry.as_ref()?;
            match key.1 {
                TypeUrl::Endpoint if carry.types.contains(&TypeUrl::Cluster) => {
                    Patch::Endpoints(carry.endpoint_hosts.clone())
                }
                TypeUrl::Route => {
                    let routing = carry.routing.as_ref()?;
                    // Decided by `routing_keeps` at the entry's first lookup.
                    if **routing.changed.get(&key.0)? != [TypeUrl::Route] {
                        return None;
                    }
                    Patch::Routes(routing.edits.iter().filter_map(RoutingEdit::routes_only).cloned().collect())
                }
                _ => return None,
            }
        };
        let (base, _) = self.take_previous(key, false)?;
        Some((base, patch))
    }

    fn lock_resolved(&self) -> MutexGuard<'_, Resolutions> {
        self.resolved.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The resolved form of `view` in `snapshot` (this generation's), computed once per view.
    fn resolve(&self, snapshot: &Snapshot, view: &SharedView) -> Resolved {
        if let Some(resolved) = self.lock_resolved().of.get(view) {
            return resolved.clone();
        }
        // Resolved outside the lock: the first inbound lookup of a snapshot builds its IP index.
        let resolved = self.kept_resolution(view).unwrap_or_else(|| Resolved::new(view.resolve(snapshot)));
        let mut r = self.lock_resolved();
        if !r.of.contains_key(view) {
            r.of.insert(view.clone(), resolved.clone());
            *r.users.entry(resolved.clone()).or_default() += 1;
        }
        resolved
    }

    /// The previous generation's resolution of `view`, when the change leaves it as it was.
    fn kept_resolution(&self, view: &SharedView) -> Option<Resolved> {
        let from = {
            let carry = self.lock_carry();
            let carry = carry.as_ref().filter(|c| c.resolutions.keeps(view))?;
            carry.from.clone()
        };
        let resolved = from.lock_resolved().of.get(view).cloned();
        resolved
    }

    /// Forgets `view`; returns its resolved view if no other view maps to it any more.
    fn forget(&self, view: &SharedView) -> Option<Resolved> {
        let mut r = self.lock_resolved();
        let resolved = r.of.remove(view)?;
        let users = r.users.get_mut(&resolved)?;
        *users = users.saturating_sub(1);
        if *users > 0 {
            return None;
        }
        r.users.remove(&resolved);
        Some(resolved)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Arc<Entry>>> {
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Removes the entries `remove` selects, returning the bytes freed.
    fn remove_where(&self, mut remove: impl FnMut(&Key) -> bool) -> usize {
        let mut freed = 0;
        let mut entries = self.lock();
        entries.retain(|key, entry| {
            let drop_it = remove(key);
            if drop_it {
                freed += entry.bytes.load(Ordering::Relaxed);
            }
            !drop_it
        });
        self.bytes.fetch_sub(freed, Ordering::Relaxed);
        freed
    }
}

/// Cache of generated resources for the latest snapshot version. Older generations are dropped
/// when a newer snapshot is first asked for; within one, the entries of a view go when the last
/// connection holding it ([`ViewLease`]) goes, and the least recently used go when the cache
/// exceeds its memory budget. Any client can invent views (labels are metadata it sends), so
/// nothing here may grow with what clients claim, only with what connected proxies hold; and
/// what connections hold counts too: every generation's bytes stay in the live total until its
/// last holder drops it, and a new distinct view is admitted only while that total is within
/// the budget ([`GenerationCache::admit`]).
pub struct GenerationCache {
    current: ArcSwap<Generation>,
    metrics: XdsMetrics,
    budget: usize,
    /// Bytes of every generation alive, wherever it is held (`meshpilot_xds_generated_bytes`).
    live: IntGauge,
    tick: AtomicU64,
    held: Mutex<HashMap<SharedView, usize>>,
    /// Generations running at once: each builds a whole proxy's config in memory, so a burst of
    /// new views must queue here rather than hold hundreds of them (and blocking threads) at once.
    generating: Arc<Semaphore>,
    /// Generations run, by type in [`TypeUrl::PUSH_ORDER`] (entries taken over do not count).
    generations: Arc<[AtomicU64; 5]>,
    /// Of those, the ones that patched the previous generation's resources.
    patches: Arc<[AtomicU64; 5]>,
}

/// A connection's claim on its view: the view's entries are kept while a lease on it exists.
pub struct ViewLease {
    cache: Arc<GenerationCache>,
    view: SharedView,
}

impl Default for GenerationCache {
    fn default() -> Self {
        GenerationCache::new(XdsMetrics::default(), DEFAULT_BUDGET_BYTES)
    }
}

impl GenerationCache {
    /// An empty cache of at most `budget` bytes, reporting to `metrics`.
    pub fn new(metrics: XdsMetrics, budget: usize) -> GenerationCache {
        GenerationCache {
            current: ArcSwap::from_pointee(Generation::new(Version::default())),
            live: metrics.generated_bytes.clone(),
            metrics,
            budget,
            tick: AtomicU64::new(0),
            held: Mutex::default(),
            generating: Arc::new(Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get()))),
            generations: Arc::default(),
            patches: Arc::default(),
        }
    }

    /// Holds `view` for a connection until the lease is dropped.
    pub fn hold(self: &Arc<Self>, view: &SharedView) -> ViewLease {
        *self.lock_held().entry(view.clone()).or_default() += 1;
        ViewLease { cache: self.clone(), view: view.clone() }
    }

    /// Holds `view` for a new connection unless it needs config of its own while the generated
    /// config alive is at the budget. A view that resolves in `snapshot` as a held one does (the
    /// pods of one deployment, whatever their IPs and pod-template labels) costs nothing more:
    /// its streams share that view's generations. Without this bound, streams each claiming
    /// another namespace or label took a frontend to several times its budget, since what a
    /// connection holds outlives the cache's eviction.
    pub fn admit(
        self: &Arc<Self>,
        snapshot: Option<&Arc<Snapshot>>,
        view: &SharedView,
    ) -> Result<ViewLease, OverBudget> {
        let live = self.live_bytes();
        let admitted = live < self.budget
            || self.lock_held().contains_key(view)
            || snapshot.is_some_and(|snapshot| self.shares_resolution(snapshot, view));
        if !admitted {
            self.metrics.views_refused.inc();
            return Err(OverBudget { live, budget: self.budget });
        }
        Ok(self.hold(view))
    }

    /// Whether `view` resolves in `snapshot` as a view some connection holds; if not, its
    /// resolution is forgotten again (a refused caller leaves nothing behind).
    fn shares_resolution(&self, snapshot: &Arc<Snapshot>, view: &SharedView) -> bool {
        let Some(generation) = self.generation_of(snapshot) else { return false };
        let resolved = generation.resolve(snapshot, view);
        let shared = generation.lock_resolved().users.get(&resolved).is_some_and(|users| *users > 1);
        if !shared {
            generation.forget(view);
        }
        shared
    }

    /// Bytes of generated config alive: in the cache, held by connections, or both.
    pub fn live_bytes(&self) -> usize {
        usize::try_from(self.live.get()).unwrap_or(0)
    }

    /// Bytes held by the current generation.
    pub fn bytes(&self) -> usize {
        self.current.load().bytes.load(Ordering::Relaxed)
    }

    /// How many times resources of `type_url` were generated (for any view and snapshot).
    pub fn generations(&self, type_url: TypeUrl) -> u64 {
        self.generations[type_index(type_url)].load(Ordering::Relaxed)
    }

    /// How many of the generations of `type_url` patched the previous generation's resources.
    pub fn patches(&self, type_url: TypeUrl) -> u64 {
        self.patches[type_index(type_url)].load(Ordering::Relaxed)
    }

    /// Entries (view and type) of the current generation.
    pub fn entries(&self) -> usize {
        self.current.load().lock().len()
    }

    /// The resources of `type_url` for `view` in `snapshot`, generated at most once.
    pub async fn get(&self, snapshot: &Arc<Snapshot>, view: &SharedView, type_url: TypeUrl) -> Arc<Generated> {
        let (generation, entry, view) = self.entry(snapshot, view, type_url);
        entry.last_used.store(self.tick.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        // Most lookups, by every proxy on every push: nothing to generate or copy.
        if let Some(generated) = entry.cell.get() {
            return generated.clone();
        }
        let view = &view;
        let internal_errors = self.metrics.xds_internal_errors.clone();
        let (snapshot, task_view) = (snapshot.clone(), view.0.clone());
        let (key_view, owner) = (view.clone(), generation.clone());
        let mut generated_here = false;
        let generating = self.generating.clone();
        let (generations, patches) = (self.generations.clone(), self.patches.clone());
        let live = self.live.clone();
        let generated = entry
            .cell
            .get_or_init(|| async {
                generated_here = true;
                // Closed never: the semaphore lives as long as the cache.
                let _permit = generating.acquire_owned().await.ok();
                let started = std::time::Instant::now();
                generations[type_index(type_url)].fetch_add(1, Ordering::Relaxed);
                let key = (key_view, type_url);
                // An endpoint change with the same clusters, or route edits: only what changed is
                // generated, the rest is the previous generation's.
                let base = owner.as_ref().and_then(|g| g.patch_base(&key));
                let previous = base.as_ref().map(|(base, _)| base.clone());
                let patched = base.and_then(|(base, patch)| {
                    // A patch is small and on a push's critical path: run here, now. Handed to the
                    // blocking pool, it waited up to 5 ms for a core behind the streams a snapshot
                    // wakes, for 1 ms of work.
                    in_place(|| timed(|| patch.apply(&base, &snapshot, &task_view)))
                });
                let patched_here = patched.is_some();
                let outcome = match patched {
                    Some(done) => Some(done),
                    // A whole generation is CPU work: kept off the async workers.
                    None => tokio::task::spawn_blocking(move || {
                        timed(|| Some(Generated::new(generate(type_url, &snapshot, &task_view))))
                    })
                    .await
                    .ok()
                    .flatten(),
                };
                let (generated, work) = outcome.unwrap_or_else(|| {
                    tracing::error!(%type_url, "xDS generation failed");
                    internal_errors.inc();
                    (Generated::new(Vec::new()), std::time::Duration::ZERO)
                });
                if patched_here {
                    patches[type_index(type_url)].fetch_add(1, Ordering::Relaxed);
                }
                // `took` counts from the generation slot, `work` the generation alone.
                tracing::debug!(type_url = %type_url, took_ms = started.elapsed().as_millis() as u64, work_us = work.as_micros() as u64, resources = generated.resources.len(), patched = patched_here, "generated");
                // The same content as the previous generation's: that one is kept, so every
                // proxy holding it sees at once (by pointer) that nothing changed for it.
                let before = previous.or_else(|| owner.as_ref().and_then(|g| g.take_previous(&key, false)).map(|(g, _)| g));
                match before {
                    Some(before) if before.same_content(&generated) => before,
                    _ => Arc::new(generated.charged(&live)),
                }
            })
            .await
            .clone();
        if generated_here {
            if let Some(generation) = generation {
                let bytes = generated.bytes();
                let key = (view.clone(), type_url);
                {
                    // The view may have been released while generating: then the entry is gone
                    // from the map and its bytes must not count.
                    let entries = generation.lock();
                    if !entries.get(&key).is_some_and(|e| Arc::ptr_eq(e, &entry)) {
                        return generated;
                    }
                    entry.bytes.store(bytes, Ordering::Relaxed);
                    // Counted under the lock, as removals are: the total never goes below zero.
                    generation.bytes.fetch_add(bytes, Ordering::Relaxed);
                }
                let total = generation.bytes.load(Ordering::Relaxed);
                if total > self.budget {
                    self.evict(&generation, &key);
                }
                self.report(&generation);
            }
        }
        generated
    }

    /// The entry for (`view` resolved, `type_url`) in the generation of the snapshot's version,
    /// that generation, and the resolved view; a caller still on an older snapshot gets an
    /// uncached entry and no generation.
    fn entry(
        &self,
        snapshot: &Arc<Snapshot>,
        view: &SharedView,
        type_url: TypeUrl,
    ) -> (Option<Arc<Generation>>, Arc<Entry>, Resolved) {
        let Some(generation) = self.generation_of(snapshot) else {
            return (None, Arc::new(Entry::default()), Resolved::new(view.resolve(snapshot)));
        };
        let key = (generation.resolve(snapshot, view), type_url);
        let found = generation.lock().get(&key).cloned();
        if let Some(entry) = found {
            return (Some(generation), entry, key.0);
        }
        // The entry's first lookup in this generation: whether the previous generation's may be
        // taken over is decided outside the lock.
        let unchanged = generation.routing_keeps(&key.0, type_url);
        let entry = {
            let mut entries = generation.lock();
            match entries.get(&key) {
                Some(entry) => entry.clone(),
                // Under this generation's lock (the previous one's is taken inside it, never the
                // other way): one request takes the entry over, the others find it here.
                None => generation.take_over(&mut entries, &key, !unchanged).unwrap_or_else(|| {
                    let entry = Arc::new(Entry::default());
                    entries.insert(key.clone(), entry.clone());
                    entry
                }),
            }
        };
        (Some(generation), entry, key.0)
    }

    /// The generation of `snapshot`, begun if it is newer than the current one; `None` for a
    /// caller still on an older snapshot.
    fn generation_of(&self, snapshot: &Arc<Snapshot>) -> Option<Arc<Generation>> {
        let mut generation = self.current.load_full();
        if generation.version < snapshot.version {
            let fresh = Arc::new(Generation::after(&generation, snapshot));
            let prev = self.current.compare_and_swap(&generation, fresh.clone());
            generation = if Arc::ptr_eq(&prev, &generation) { fresh } else { self.current.load_full() };
            self.report(&generation);
        }
        (generation.version == snapshot.version).then_some(generation)
    }

    /// Whether `snapshot` may change any resource of `view`, decided once per resolved view.
    /// It cannot for a routing change the view reads none of, or new endpoints of hosts the view
    /// has no cluster of, when the view's resolution and entries carry over: those entries are
    /// then taken over at once, and its streams have nothing to push. (Most proxies, on most
    /// snapshots: a thousand streams each looking up every type to find nothing to send kept
    /// the few with something waiting among them.)
    pub fn concerns(&self, snapshot: &Arc<Snapshot>, view: &SharedView) -> bool {
        let Some(generation) = self.generation_of(snapshot) else { return true };
        let resolved = generation.resolve(snapshot, view);
        if let Some(concerned) = generation.lock_concerned().get(&resolved) {
            return *concerned;
        }
        let concerned = !generation.unconcerned(&resolved, view);
        if !concerned {
            for type_url in TypeUrl::PUSH_ORDER {
                generation.carried_entry(&(resolved.clone(), type_url));
            }
        }
        generation.lock_concerned().insert(resolved, concerned);
        concerned
    }

    /// Drops least recently used entries (never `keep`) until the generation fits the budget.
    fn evict(&self, generation: &Generation, keep: &Key) {
        let mut entries = generation.lock();
        let mut candidates: Vec<(u64, Key, usize)> = entries
            .iter()
            .filter(|(key, entry)| *key != keep && entry.cell.initialized())
            .map(|(key, entry)| {
                (entry.last_used.load(Ordering::Relaxed), key.clone(), entry.bytes.load(Ordering::Relaxed))
            })
            .collect();
        candidates.sort_unstable_by_key(|(tick, _, _)| *tick);
        let mut total = generation.bytes.load(Ordering::Relaxed);
        let mut freed = 0;
        for (_, key, bytes) in candidates {
            if total <= self.budget {
                break;
            }
            entries.remove(&key);
            total = total.saturating_sub(bytes);
            freed += bytes;
        }
        generation.bytes.fetch_sub(freed, Ordering::Relaxed);
        drop(entries);

        if freed > 0 {
            tracing::debug!(
                freed,
                budget = self.budget,
                "generation cache over budget; least recently used entries dropped"
            );
        }
    }

    fn release(&self, view: &SharedView) {
        let last = {
            let mut held = self.lock_held();
            match held.get_mut(view) {
                Some(count) if *count > 1 => {
                    *count -= 1;
                    false
                }
                Some(_) => {
                    held.remove(view);
                    true
                }
                None => false,
            }
        };
        if last {
            let generation = self.current.load_full();
            if let Some(resolved) = generation.forget(view) {
                generation.remove_where(|(v, _)| *v == resolved);
            }
            self.report(&generation);
        }
    }

    fn report(&self, generation: &Generation) {
        let entries = generation.lock().len();
        self.metrics.cache_bytes.set(gauge_value(generation.bytes.load(Ordering::Relaxed)));
        self.metrics.cache_entries.set(gauge_value(entries));
    }

    fn lock_held(&self) -> MutexGuard<'_, HashMap<SharedView, usize>> {
        self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Runs `work` on this thread: in place of a worker of a multi-threaded runtime (its other
/// tasks move to another thread meanwhile), else plainly. A panic comes back as `None`.
fn in_place<T>(work: impl FnOnce() -> Option<T>) -> Option<T> {
    let guarded = || std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).ok().flatten();
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(guarded),
        _ => guarded(),
    }
}

/// `work`'s result with the time it took.
fn timed<T>(work: impl FnOnce() -> Option<T>) -> Option<(T, std::time::Duration)> {
    let started = std::time::Instant::now();
    work().map(|done| (done, started.elapsed()))
}

/// The position of `type_url` in [`TypeUrl::PUSH_ORDER`].
fn type_index(type_url: TypeUrl) -> usize {
    TypeUrl::PUSH_ORDER.iter().position(|t| *t == type_url).unwrap_or(0)
}

impl Drop for ViewLease {
    fn drop(&mut self) {
        self.cache.release(&self.view);
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;

    use super::*;
    use crate::config::Kind;
    use crate::envoy::testing::{self, snapshot};

    /// A sidecar's view, as its connection holds it.
    fn sidecar(namespace: &str, labels: &[(&str, &str)]) -> SharedView {
        SharedView::new(testing::sidecar(namespace, labels))
    }

    /// A sidecar's view at `ips`, as its connection holds it.
    fn sidecar_at(namespace: &str, labels: &[(&str, &str)], ips: &[&str]) -> SharedView {
        SharedView::new(testing::sidecar_at(namespace, labels, ips))
    }

    const MESH: &str = "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: a, namespace: default}
spec: {hosts: [a.example.com], location: MESH_INTERNAL, resolution: STATIC, ports: [{number: 80, name: http}], endpoints: [{address: 10.0.0.1}]}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: b, namespace: other}
spec: {hosts: [b.example.com], location: MESH_INTERNAL, resolution: STATIC, ports: [{number: 80, name: http}], endpoints: [{address: 10.0.1.1}]}
";

    #[tokio::test]
    async fn a_view_no_connection_holds_is_freed() {
        let cache = Arc::new(GenerationCache::default());
        let snap = Arc::new(snapshot(MESH));
        for i in 0..50 {
            // A client claiming fresh labels on every stream, opening and closing it.
            let view = sidecar("default", &[("app", &format!("a{i}"))]);
            let lease = cache.hold(&view);
            cache.get(&snap, &view, TypeUrl::Cluster).await;
            assert_eq!(cache.entries(), 1);
            drop(lease);
        }
        assert_eq!((cache.entries(), cache.bytes()), (0, 0));

        let kept = sidecar("default", &[("app", "kept")]);
        let (a, b) = (cache.hold(&kept), cache.hold(&kept));
        cache.get(&snap, &kept, TypeUrl::Cluster).await;
        drop(a);
        assert_eq!(cache.entries(), 1, "still held by the second connection");
        assert!(cache.bytes() > 0);
        drop(b);
        assert_eq!(cache.entries(), 0);
    }

    #[tokio::test]
    async fn the_budget_evicts_the_least_recently_used() {
        let snap = Arc::new(snapshot(MESH));
        let probe = GenerationCache::default();
        let one = probe.get(&snap, &sidecar("default", &[]), TypeUrl::Cluster).await.bytes();
        // Room for three entries.
        let cache = Arc::new(GenerationCache::new(XdsMetrics::default(), one * 3 + one / 2));
        // Namespaces tell views apart (labels would not: no selector reads them).
        let views: Vec<_> = (0..5).map(|i| sidecar(&format!("ns{i}"), &[])).collect();
        let _leases: Vec<_> = views.iter().map(|v| cache.hold(v)).collect();
        for v in &views[..3] {
            cache.get(&snap, v, TypeUrl::Cluster).await;
        }
        // Use the first again, so the second is now the least recently used.
        cache.get(&snap, &views[0], TypeUrl::Cluster).await;
        cache.get(&snap, &views[3], TypeUrl::Cluster).await;
        assert_eq!(cache.entries(), 3);
        assert!(cache.bytes() <= one * 3 + one / 2);
        let cached: Vec<bool> = views
            .iter()
            .map(|v| cache.current.load().lock().contains_key(&(Resolved(v.clone()), TypeUrl::Cluster)))
            .collect();
        assert_eq!(cached, [true, false, true, true, false]);
    }

    #[tokio::test]
    async fn generations_held_by_connections_count_until_dropped_and_bound_new_views() {
        let snap = Arc::new(snapshot(MESH));
        let probe = GenerationCache::default();
        let one = probe.get(&snap, &sidecar("default", &[]), TypeUrl::Cluster).await.bytes();
        // Room for two views' clusters.
        let cache = Arc::new(GenerationCache::new(XdsMetrics::default(), one * 2 + one / 2));
        let views: Vec<_> = (0..4).map(|i| sidecar(&format!("ns{i}"), &[])).collect();
        let mut leases = Vec::new();
        let mut held = Vec::new();
        for v in &views[..3] {
            leases.push(cache.admit(Some(&snap), v).expect("within the budget"));
            // What a connection holds once it sent it: the cache may evict its entry, the bytes stay.
            held.push(cache.get(&snap, v, TypeUrl::Cluster).await);
        }
        assert!(cache.bytes() <= one * 2 + one / 2, "the cache itself evicted down to its budget");
        assert_eq!(cache.live_bytes(), one * 3, "what connections hold counts although evicted");
        let refused = cache.admit(Some(&snap), &views[3]).err().expect("a fourth distinct view is refused");
        assert_eq!((refused.live, refused.budget), (one * 3, one * 2 + one / 2));
        assert_eq!(cache.metrics.views_refused.get(), 1);
        // Another stream of a view already held costs nothing: admitted; so is another pod that
        // resolves as a held view (its IP is nobody's endpoint, its labels nobody's selector's).
        let again = cache.admit(Some(&snap), &views[0]).expect("a held view is admitted");
        let sibling = sidecar_at("ns0", &[("pod-template-hash", "x1")], &["10.0.0.9"]);
        assert_ne!(sibling, views[0]);
        let sibling = cache.admit(Some(&snap), &sibling).expect("a view resolving as a held one is admitted");
        assert_eq!(cache.metrics.views_refused.get(), 1);
        // Connections going give their bytes back, and a new view is admitted again.
        drop((again, sibling, leases.pop(), held.pop(), leases.pop(), held.pop()));
        assert_eq!(cache.live_bytes(), one);
        assert!(cache.admit(Some(&snap), &views[3]).is_ok());
        assert_eq!(cache.metrics.generated_bytes.get(), i64::try_from(one).expect("small"));
    }

    #[tokio::test]
    async fn proxies_with_the_same_instances_share_entries_and_others_do_not() {
        let cache = Arc::new(GenerationCache::default());
        let snap = Arc::new(snapshot(MESH));
        // 10.0.0.1 is an endpoint of a.example.com; 10.0.0.2 and 10.0.0.3 are nobody's.
        let instance = sidecar_at("default", &[], &["10.0.0.1"]);
        let (x, y) = (sidecar_at("default", &[], &["10.0.0.2"]), sidecar_at("default", &[], &["10.0.0.3"]));
        let leases: Vec<_> = [&instance, &x, &y].iter().map(|v| cache.hold(v)).collect();
        let mine = cache.get(&snap, &instance, TypeUrl::Listener).await;
        let (gx, gy) = (cache.get(&snap, &x, TypeUrl::Listener).await, cache.get(&snap, &y, TypeUrl::Listener).await);
        assert!(Arc::ptr_eq(&gx, &gy), "proxies without instances share one generation");
        assert_eq!(cache.entries(), 2);
        let inbound_chains = |g: &Generated| {
            g.find("virtualInbound").map(|i| {
                let l: envoy_types::pb::envoy::config::listener::v3::Listener =
                    prost::Message::decode(g.resources[i].body.value.as_slice()).expect("listener");
                l.filter_chains.len()
            })
        };
        assert!(inbound_chains(&mine) > inbound_chains(&gx), "the instance's port has its own chain");
        let mut leases = leases.into_iter();
        drop(leases.next());
        assert_eq!(cache.entries(), 1, "the instance's entry goes with its last connection");
        drop(leases.next());
        assert_eq!(cache.entries(), 1, "still used by the other proxy without instances");
        drop(leases.next());
        assert_eq!(cache.entries(), 0);
    }

    /// Snapshots built as ingest builds them, one per YAML state, each with its change set.
    fn snapshots(states: &[&str]) -> Vec<Arc<Snapshot>> {
        let mut builder = crate::ingest::IngestBuilder::default();
        let mut seq = 0;
        states
            .iter()
            .map(|yaml| {
                let objects = crate::config::parse::parse_file("t.yaml", yaml)
                    .into_iter()
                    .map(|d| match d {
                        crate::config::parse::Document::Valid(o) => {
                            (o.key.clone(), Some(Arc::new(o) as crate::config::ValidConfig))
                        }
                        other => panic!("{other:?}"),
                    })
                    .collect();
                let changes = builder.apply(vec![crate::source::SourceEvent::Config(objects)]);
                seq += 1;
                builder.build(Version::new(1, seq), changes)
            })
            .collect()
    }

    #[tokio::test]
    async fn an_endpoint_change_regenerates_only_endpoints() {
        let moved = MESH.replace("10.0.0.1", "10.0.0.9");
        let with_account = moved.replace("{address: 10.0.0.9}", "{address: 10.0.0.9, serviceAccount: sa}");
        let new_port = with_account.replace("number: 80", "number: 81");
        let snaps = snapshots(&[MESH, &moved, &with_account, &new_port]);
        assert!(snaps[1].changes.endpoints_only() && snaps[2].changes.endpoints_only());
        let cache = Arc::new(GenerationCache::default());
        let view = sidecar("default", &[]);
        let _lease = cache.hold(&view);
        let all = [TypeUrl::Cluster, TypeUrl::Endpoint, TypeUrl::Listener, TypeUrl::Route];
        let mut generations = Vec::new();
        for snap in &snaps {
            let mut of_snapshot = Vec::new();
            for t in all {
                of_snapshot.push(cache.get(snap, &view, t).await);
            }
            generations.push(of_snapshot);
        }
        let reused = |from: usize, to: usize| -> Vec<bool> {
            (0..all.len()).map(|t| Arc::ptr_eq(&generations[from][t], &generations[to][t])).collect()
        };
        // Only the endpoints moved: CDS, LDS and RDS are the previous generation's.
        assert_eq!(reused(0, 1), [true, false, true, true]);
        let eds = &generations[1][1];
        let cla: ClusterLoadAssignment = prost::Message::decode(eds.resources[0].body.value.as_slice()).unwrap();
        assert!(format!("{cla:?}").contains("10.0.0.9"), "{cla:?}");
        // 4 snapshots: EDS generated for each; CDS again for the new service account (the
        // identities clusters check) and the port change; LDS and RDS only for the port change.
        let counts: Vec<u64> = all.iter().map(|t| cache.generations(*t)).collect();
        assert_eq!(counts, [3, 4, 2, 2]);
        assert_eq!(all.iter().map(|t| cache.patches(*t)).collect::<Vec<_>>(), [0, 1, 0, 0], "EDS of the first move");
        // EDS patched with the changed hosts' resources is what a full generation gives.
        for (snap, of_snapshot) in snaps.iter().zip(&generations) {
            for (t, cached) in all.iter().zip(of_snapshot) {
                assert_eq!(cached.encoded, Generated::new(generate(*t, snap, &view)).encoded, "{t}");
            }
        }
        assert!(cache.bytes() > 0 && cache.entries() == all.len());
    }

    /// [`MESH`] with a Sidecar that keeps `default`'s proxies to their own namespace.
    fn scoped_mesh() -> String {
        format!(
            "{MESH}---\napiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: default, namespace: default}}\n\
             spec: {{egress: [{{hosts: [\"./*\"]}}]}}\n"
        )
    }

    /// A VirtualService routing b with `timeout`.
    fn timeout_route(timeout: &str) -> String {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: b, namespace: other}}\n\
             spec: {{hosts: [b.example.com], http: [{{timeout: {timeout}, route: [{{destination: {{host: b.example.com}}}}]}}]}}\n"
        )
    }

    /// A DestinationRule for b.
    const B_RULE: &str =
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: b, namespace: other}\n\
             spec: {host: b.example.com, trafficPolicy: {connectionPool: {tcp: {maxConnections: 7}}}}\n";

    #[tokio::test]
    async fn a_routing_change_regenerates_only_the_views_that_read_it() {
        let (scoped, vs) = (scoped_mesh(), timeout_route);
        let dr = B_RULE;
        // Each step applies only the objects it names, as a source sends what changed.
        let snaps = snapshots(&[&format!("{scoped}---\n{}", vs("1s")), &vs("2s"), dr]);
        let cache = Arc::new(GenerationCache::default());
        let (outside, inside) = (sidecar("default", &[]), sidecar("other", &[]));
        let _leases = (cache.hold(&outside), cache.hold(&inside));
        let all = [TypeUrl::Cluster, TypeUrl::Endpoint, TypeUrl::Listener, TypeUrl::Route];
        let mut got = Vec::new();
        for snap in &snaps {
            let mut of_snapshot = Vec::new();
            for view in [&outside, &inside] {
                for t in all {
                    let generated = cache.get(snap, view, t).await;
                    assert_eq!(generated.encoded, Generated::new(generate(t, snap, view)).encoded, "{view} {t}");
                    of_snapshot.push(generated);
                }
            }
            got.push(of_snapshot);
        }
        // 2 views x 4 types at first; then, only for the view that imports `other`, its routes
        // (the edit keeps the VirtualService's hosts and destinations), then all 4 for the rule.
        assert_eq!(all.iter().map(|t| cache.generations(*t)).collect::<Vec<_>>(), [3, 3, 3, 4]);
        // The timeout edit's routes were patched from the previous ones, not generated whole.
        assert_eq!(all.iter().map(|t| cache.patches(*t)).collect::<Vec<_>>(), [0, 0, 0, 1]);
        let kept =
            |from: usize| -> Vec<bool> { (0..8).map(|i| Arc::ptr_eq(&got[from][i], &got[from + 1][i])).collect() };
        // The timeout edit changes the importing view's routes only; the rule, its clusters.
        assert_eq!(kept(0), [true, true, true, true, true, true, true, false]);
        assert_eq!(kept(1), [true, true, true, true, false, true, true, true]);
    }

    #[tokio::test]
    async fn a_view_is_unconcerned_only_by_changes_that_leave_all_it_holds() {
        let (scoped, vs) = (scoped_mesh(), timeout_route);
        let entry = |name: &str, ns: &str, ip: &str| {
            format!(
                "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: {ns}}}\n\
                 spec: {{hosts: [{name}.example.com], location: MESH_INTERNAL, resolution: STATIC, ports: [{{number: 80, name: http}}], endpoints: [{{address: {ip}}}]}}\n"
            )
        };
        let dr = B_RULE;
        let snaps = snapshots(&[
            &format!("{scoped}---\n{}", vs("1s")),
            &vs("2s"),
            &entry("a", "default", "10.0.0.9"),
            &entry("b", "other", "10.0.1.9"),
            dr,
        ]);
        let cache = Arc::new(GenerationCache::default());
        // `default` imports its own namespace only (a); `other` imports everything.
        let (outside, inside) = (sidecar("default", &[]), sidecar("other", &[]));
        let _leases = (cache.hold(&outside), cache.hold(&inside));
        let all = [TypeUrl::Cluster, TypeUrl::Endpoint, TypeUrl::Listener, TypeUrl::Route];
        let mut concerned = Vec::new();
        let mut previous: Vec<Arc<Generated>> = Vec::new();
        for snap in &snaps {
            let of_snapshot = [cache.concerns(snap, &outside), cache.concerns(snap, &inside)];
            let mut got = Vec::new();
            for (v, view) in [&outside, &inside].into_iter().enumerate() {
                for (i, t) in all.into_iter().enumerate() {
                    let generated = cache.get(snap, view, t).await;
                    assert_eq!(generated.encoded, Generated::new(generate(t, snap, view)).encoded, "{view} {t}");
                    if !of_snapshot[v] {
                        assert!(Arc::ptr_eq(&generated, &previous[v * 4 + i]), "{view} {t} was not taken over");
                    }
                    got.push(generated);
                }
            }
            concerned.push(of_snapshot);
            previous = got;
        }
        // The first snapshot concerns everyone; then `default` only by its own service's endpoints.
        assert_eq!(concerned, [[true, true], [false, true], [true, true], [false, true], [false, true]]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_in_place_runs_on_a_worker_and_a_panic_comes_back_as_none() {
        assert_eq!(in_place(|| Some(1)), Some(1));
        assert_eq!(in_place(|| -> Option<u8> { panic!("a generator bug") }), None);
        // Without a runtime (or on a current-thread one) it runs plainly.
        assert_eq!(std::thread::spawn(|| in_place(|| Some(2))).join().ok().flatten(), Some(2));
    }

    #[tokio::test]
    async fn a_skipped_snapshot_takes_nothing_over() {
        let moved = MESH.replace("10.0.0.1", "10.0.0.9");
        let snaps = snapshots(&[MESH, &moved, &MESH.replace("10.0.0.1", "10.0.0.8")]);
        let cache = GenerationCache::default();
        let view = sidecar("default", &[]);
        let first = cache.get(&snaps[0], &view, TypeUrl::Listener).await;
        // The frontend never saw snapshot 2: snapshot 3's change set does not cover the step.
        let third = cache.get(&snaps[2], &view, TypeUrl::Listener).await;
        assert_eq!(cache.generations(TypeUrl::Listener), 2, "generated again");
        assert!(Arc::ptr_eq(&first, &third), "the same content: the generation held before is kept");
    }

    /// A DestinationRule that stops applying to a host (its host changed, its exportTo narrowed,
    /// it or the service deleted) leaves nothing of it in any view: every type each view is
    /// served, through the cache across incremental snapshots, is what a snapshot built from
    /// scratch on the same objects generates. Which rule takes over follows the lookup order
    /// (the proxy's namespace, then the service's, then the root namespace).
    #[tokio::test]
    async fn a_rule_leaving_a_host_leaves_no_trace_in_any_view() {
        use std::collections::BTreeMap;

        use envoy_types::pb::envoy::config::cluster::v3::Cluster;

        use crate::config::parse::{parse_file, Document};
        use crate::source::SourceEvent;

        let entry = |name: &str, ns: &str, host: &str, ip: &str| {
            format!(
                "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: {ns}}}\n\
                 spec: {{hosts: [{host}], location: MESH_INTERNAL, resolution: STATIC, ports: [{{number: 80, name: http}}], \
                 endpoints: [{{address: {ip}, labels: {{version: v1}}}}]}}\n"
            )
        };
        let rule = |ns: &str, name: &str, host: &str, extra: &str| {
            format!(
                "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: {ns}}}\n\
                 spec: {{host: {host}, subsets: [{{name: v1, labels: {{version: v1}}}}], {extra}}}\n"
            )
        };
        let alpha = entry("alpha", "ns-a", "alpha.ns-a.svc.cluster.local", "10.0.0.1");
        let www = entry("www", "ns-b", "www.example.com", "10.0.0.2");
        let limited = "trafficPolicy: {connectionPool: {tcp: {maxConnections: 76}}}";
        let service_rule = rule("ns-a", "dr-0", "alpha.ns-a.svc.cluster.local", limited);
        let root_rule =
            rule("istio-system", "root", "'*.example.com'", "trafficPolicy: {loadBalancer: {simple: RANDOM}}");
        let outlier = "trafficPolicy: {outlierDetection: {consecutive5xxErrors: 3, interval: 10s}}";
        let on_alpha = rule("ns-b", "dr-0", "alpha.ns-a.svc.cluster.local", outlier);
        let on_www = rule("ns-b", "dr-0", "www.example.com", outlier);
        let own_only = rule("ns-b", "dr-0", "alpha.ns-a.svc.cluster.local", &format!("{outlier}, exportTo: ['.']"));
        let narrowed_root =
            rule("istio-system", "root", "ext.example.com", "trafficPolicy: {loadBalancer: {simple: RANDOM}}");
        let service_rule_private =
            rule("ns-a", "dr-0", "alpha.ns-a.svc.cluster.local", &format!("{limited}, exportTo: ['.']"));
        let key = |kind: Kind, ns: &str, name: &str| ConfigKey { kind, namespace: ns.into(), name: name.into() };
        let (local_key, alpha_key) =
            (key(Kind::DestinationRule, "ns-b", "dr-0"), key(Kind::ServiceEntry, "ns-a", "alpha"));
        // Each step: the objects it applies and the keys it deletes, as a source sends them.
        let steps: Vec<(Vec<&str>, Vec<&ConfigKey>)> = vec![
            (vec![&alpha, &www, &service_rule, &root_rule, &on_alpha], vec![]),
            // ns-b's rule leaves alpha for www: alpha falls back to ns-a's, www leaves the root's.
            (vec![&on_www], vec![]),
            (vec![&own_only], vec![]),
            (vec![], vec![&local_key]),
            (vec![&on_alpha], vec![]),
            (vec![], vec![&alpha_key]),
            (vec![&alpha], vec![]),
            // The root namespace's wildcard rule narrows to another host: www keeps nothing of it.
            (vec![&narrowed_root], vec![]),
            (vec![], vec![&local_key]),
            // ns-a's rule no longer exported: ns-b's proxies have no rule for alpha.
            (vec![&service_rule_private], vec![]),
        ];
        let mut builder = crate::ingest::IngestBuilder::default();
        let mut state: BTreeMap<ConfigKey, String> = BTreeMap::new();
        let cache = Arc::new(GenerationCache::default());
        let views: Vec<SharedView> = ["ns-a", "ns-b", "istio-system"].iter().map(|ns| sidecar(ns, &[])).collect();
        let _leases: Vec<_> = views.iter().map(|v| cache.hold(v)).collect();
        let all = [TypeUrl::Cluster, TypeUrl::Endpoint, TypeUrl::Listener, TypeUrl::Route];
        let mut limits = Vec::new();
        for (seq, (applied, deleted)) in steps.into_iter().enumerate() {
            let mut objects = Vec::new();
            for yaml in applied {
                for doc in parse_file("t.yaml", yaml) {
                    let Document::Valid(o) = doc else { panic!("{doc:?}") };
                    state.insert(o.key.clone(), yaml.to_string());
                    objects.push((o.key.clone(), Some(Arc::new(o))));
                }
            }
            for key in deleted {
                state.remove(key);
                objects.push((key.clone(), None));
            }
            let changes = builder.apply(vec![SourceEvent::Config(objects)]);
            let snap = builder.build(Version::new(1, seq as u64 + 1), changes);
            let scratch = snapshot(&state.values().cloned().collect::<Vec<_>>().join("---\n"));
            for view in &views {
                for t in all {
                    let served = cache.get(&snap, view, t).await;
                    let fresh = Generated::new(generate(t, &scratch, view));
                    assert_eq!(served.encoded, fresh.encoded, "step {seq}: {view} {t}");
                }
            }
            // What ns-b's proxies are served for alpha: the connection limit of the rule in force.
            let clusters = cache.get(&snap, &views[1], TypeUrl::Cluster).await;
            let limit = clusters.find("outbound|80||alpha.ns-a.svc.cluster.local").map(|i| {
                let c: Cluster = prost::Message::decode(clusters.resources[i].body.value.as_slice()).expect("cluster");
                c.circuit_breakers.and_then(|b| b.thresholds.first()?.max_connections).map(|m| m.value)
            });
            limits.push(limit);
        }
        // Their own rule (no limit); ns-a's once it left alpha; their own again (exported to its
        // namespace only, theirs); ns-a's once it is deleted; their own; no cluster; their own
        // (twice); ns-a's once theirs is deleted; none (no limit) once ns-a's is private.
        let (unlimited, service) = (Some(Some(u32::MAX)), Some(Some(76)));
        let expected =
            [unlimited, service, unlimited, service, unlimited, None, unlimited, unlimited, service, unlimited];
        assert_eq!(limits, expected);
    }
}
