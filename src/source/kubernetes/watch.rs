//! One list/watch per kind: kube-runtime's watcher (relists on 410 Gone and on a dropped watch,
//! backs off while the API server is unreachable) pumped into the source's one state owner.

use std::fmt;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::watcher::{self, watcher, Event};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use super::kinds::{Item, Watched};
use crate::backoff::Backoff;
use crate::drain::DrainWatcher;

/// Namespace and name of a watched object (namespace empty for cluster-scoped kinds).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectName {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl fmt::Display for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// Why a watch is not delivering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The service account may not list or watch this kind (403).
    Forbidden(String),
    /// The API server does not accept the credentials (401): nothing can be read, so unlike a
    /// 403 for one kind this holds readiness back rather than serve an empty mesh.
    Unauthorized(String),
    /// The API server does not serve this kind (404: its CRD is not installed).
    NotInstalled(String),
    /// The API server is unreachable or failing; the watcher retries with backoff.
    Unreachable(String),
}

impl Failure {
    /// The metric label of this failure.
    pub fn reason(&self) -> &'static str {
        match self {
            Failure::Forbidden(_) => "forbidden",
            Failure::Unauthorized(_) => "unauthorized",
            Failure::NotInstalled(_) => "not_installed",
            Failure::Unreachable(_) => "unreachable",
        }
    }

    /// Whether retrying cannot help until someone changes the cluster (RBAC, CRDs): the kind
    /// then counts as listed (empty) so that the other kinds are served.
    pub fn is_permanent(&self) -> bool {
        matches!(self, Failure::Forbidden(_) | Failure::NotInstalled(_))
    }

    /// What a watcher error means; `None` for a 410 Gone, which the watcher answers itself by
    /// relisting (a normal event after a long disconnection or an API server restart).
    fn from_watcher(error: &watcher::Error) -> Option<Failure> {
        let api_code = match error {
            watcher::Error::InitialListFailed(kube::Error::Api(s))
            | watcher::Error::WatchStartFailed(kube::Error::Api(s))
            | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s.code),
            watcher::Error::WatchError(s) => Some(s.code),
            _ => None,
        };
        let text = error.to_string();
        Some(match api_code {
            Some(410) => return None,
            Some(401) => Failure::Unauthorized(text),
            Some(403) => Failure::Forbidden(text),
            Some(404) => Failure::NotInstalled(text),
            _ => Failure::Unreachable(text),
        })
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Forbidden(e) => write!(f, "forbidden: the service account may not list/watch it ({e})"),
            Failure::Unauthorized(e) => write!(f, "unauthorized: the API server refuses the credentials ({e})"),
            Failure::NotInstalled(e) => write!(f, "not served by the API server; is its CRD installed? ({e})"),
            Failure::Unreachable(e) => write!(f, "API server unreachable; retrying, last state kept ({e})"),
        }
    }
}

/// What a watch reports to the state owner.
// Short-lived, as `Item`.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Change {
    /// A complete list (first, or after a 410/relist): objects not in it are gone.
    Relisted(Vec<(ObjectName, Item)>),
    /// An object was added or modified.
    Applied(ObjectName, Item),
    /// An object was deleted.
    Deleted(ObjectName),
    /// The watch is failing.
    Failed(Failure),
}

impl Change {
    /// What kind of change this is, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Change::Relisted(_) => "relisted",
            Change::Applied(..) => "applied",
            Change::Deleted(_) => "deleted",
            Change::Failed(_) => "failed",
        }
    }
}

/// A change of one watched kind.
#[derive(Debug)]
pub struct Update {
    /// The kind.
    pub watched: Watched,
    /// The change.
    pub change: Change,
}

/// Converts a watched object into an [`Item`].
pub type Convert<K> = fn(&Watched, K) -> Item;

/// Shortest and longest wait before listing again after a failure.
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Watches `api` until the drain, converting each object with `convert` (see [`cheap`]) and
/// sending updates to `tx`.
///
/// After a failure the watch starts over with a fresh list, after a backoff, as client-go's
/// reflector does: the list both resynchronises what changed meanwhile and tells the state owner
/// the kind is healthy again (a quiet kind would otherwise never say so). A 410 Gone is answered
/// by the watcher itself with a relist.
pub async fn pump<K>(
    watched: Watched,
    api: Api<K>,
    config: watcher::Config,
    convert: Convert<K>,
    tx: mpsc::Sender<Update>,
    drain: DrainWatcher,
) where
    K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
{
    let mut backoff = Backoff::new(RETRY_MIN, RETRY_MAX);
    loop {
        match watch_until_failure(watched, api.clone(), config.clone(), convert, &tx, &drain, &mut backoff).await {
            Some(failure) => {
                if tx.send(Update { watched, change: Change::Failed(failure) }).await.is_err() {
                    return;
                }
            }
            None => return,
        }
        tokio::select! {
            _ = drain.draining() => return,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}

/// One list and watch: returns the failure that ended it, or `None` when the pump must stop
/// (drain, or nobody listening).
async fn watch_until_failure<K>(
    watched: Watched,
    api: Api<K>,
    config: watcher::Config,
    convert: Convert<K>,
    tx: &mpsc::Sender<Update>,
    drain: &DrainWatcher,
    backoff: &mut Backoff,
) -> Option<Failure>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
{
    let stream = watcher(api, config);
    futures::pin_mut!(stream);
    // A list is converted page by page as it arrives: holding a whole list of API objects (a
    // Pod is kilobytes of JSON, the compact object a tenth of it) costs far more memory than
    // the converted items, and the allocator keeps that peak.
    let mut raw: Vec<K> = Vec::new();
    let mut listing: Vec<(ObjectName, Item)> = Vec::new();
    loop {
        let event = tokio::select! {
            _ = drain.draining() => return None,
            event = stream.next() => event,
        };
        let change = match event {
            None => return None,
            Some(Ok(Event::Init)) => {
                raw.clear();
                listing.clear();
                continue;
            }
            Some(Ok(Event::InitApply(obj))) => {
                raw.push(obj);
                if raw.len() >= LIST_CHUNK {
                    match convert_all(watched, std::mem::take(&mut raw), convert).await {
                        Ok(items) => listing.extend(items),
                        Err(failure) => return Some(failure),
                    }
                }
                continue;
            }
            Some(Ok(Event::InitDone)) => {
                match convert_all(watched, std::mem::take(&mut raw), convert).await {
                    Ok(items) => listing.extend(items),
                    Err(failure) => return Some(failure),
                }
                backoff.reset();
                listing.shrink_to_fit();
                Change::Relisted(std::mem::take(&mut listing))
            }
            Some(Ok(Event::Apply(obj))) => {
                let name = name_of(&obj);
                if cheap(watched) {
                    Change::Applied(name, convert(&watched, obj))
                } else {
                    match tokio::task::spawn_blocking(move || convert(&watched, obj)).await {
                        Ok(item) => Change::Applied(name, item),
                        Err(e) => return Some(Failure::Unreachable(format!("converting {name}: {e}"))),
                    }
                }
            }
            Some(Ok(Event::Delete(obj))) => Change::Deleted(name_of(&obj)),
            Some(Err(e)) => match Failure::from_watcher(&e) {
                Some(failure) => return Some(failure),
                None => {
                    tracing::info!(kind = %watched, "kubernetes: watch expired (410 Gone); relisting");
                    continue;
                }
            },
        };
        if tx.send(Update { watched, change }).await.is_err() {
            return None;
        }
    }
}

/// Objects converted per trip to the blocking pool while a list arrives.
const LIST_CHUNK: usize = 256;

/// Whether converting an object of `watched` is cheap enough for the async worker: the registry
/// kinds only copy fields. Their objects are then allocated by the few worker threads rather than
/// by whichever blocking thread a burst of watch events started, each of which keeps its own
/// partly used allocator pages (measured: 5 KB of RSS per pod kept after 10,000 pod events).
fn cheap(watched: Watched) -> bool {
    matches!(watched, Watched::Registry(_))
}

/// Converts `objects`: Istio objects (validated: regexes compiled, routes checked) on the
/// blocking pool, registry objects in place.
async fn convert_all<K>(
    watched: Watched,
    objects: Vec<K>,
    convert: Convert<K>,
) -> Result<Vec<(ObjectName, Item)>, Failure>
where
    K: Resource + Send + 'static,
{
    if objects.is_empty() {
        return Ok(Vec::new());
    }
    if cheap(watched) {
        return Ok(objects.into_iter().map(|o| (name_of(&o), convert(&watched, o))).collect());
    }
    tokio::task::spawn_blocking(move || objects.into_iter().map(|o| (name_of(&o), convert(&watched, o))).collect())
        .await
        .map_err(|e| Failure::Unreachable(format!("converting the list: {e}")))
}

fn name_of<K: Resource>(obj: &K) -> ObjectName {
    ObjectName { namespace: obj.namespace().unwrap_or_default(), name: obj.name_any() }
}
