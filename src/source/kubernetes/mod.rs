//! The Kubernetes source: Istio's CRDs, the registry kinds (Services, EndpointSlices, Pods, Nodes,
//! Namespaces) and the `istio` mesh config ConfigMap, listed and watched through the API server.
//!
//! Each kind has one list/watch task (kube-runtime's watcher: a 410 Gone or a dropped watch
//! relists; an unreachable server is retried with backoff while the last state stays in force).
//! The tasks send their changes to one owner, [`state::KubeState`], which keeps what each object
//! last became and sends `SourceEvent`s. `InitDone(Kubernetes)` follows once every kind has listed;
//! a kind this node may not read, or whose CRD is missing, is reported and counts as empty, so
//! it does not hold back the rest.

pub mod client;
pub mod convert;
pub mod kinds;
pub mod slim;
pub mod state;
pub mod watch;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::DynamicObject;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::mpsc;
use tracing::warn;

pub use client::{ClusterChoice, KubeError};
use kinds::{IstioKind, Item, Watched, ISTIO_KINDS, MESH_CONFIG_MAP, REGISTRY_KINDS};
use state::KubeState;
use watch::{pump, Change, Failure, Update};

use super::{SourceEvent, SourceId, SourceMetrics};
use crate::backoff::Backoff;
use crate::drain::DrainWatcher;
use crate::registry::kubernetes::KubeKind;

/// Watch updates queued between the watch tasks and the state owner.
const UPDATE_QUEUE: usize = 64;
/// How often a missing API group (CRDs not installed) is looked for again.
const DISCOVERY_RETRY: Duration = Duration::from_secs(30);

/// Where the Kubernetes source reads from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeSettings {
    /// The cluster.
    pub cluster: ClusterChoice,
    /// meshpilot's own namespace: its `istio` ConfigMap holds the mesh config.
    pub namespace: String,
}

/// Starts watching through `client` (the process's one Kubernetes client): every kind in its own
/// task, all feeding one state owner that sends to `events`. With `owns_mesh`, the mesh config
/// comes from the `istio` ConfigMap (and this source sends `InitDone(MeshConfig)`), stamped with
/// `domain`. Tasks end with the drain.
pub fn watch<E>(
    client: Client,
    settings: &KubeSettings,
    owns_mesh: bool,
    domain: String,
    events: mpsc::Sender<E>,
    metrics: SourceMetrics,
    drain: DrainWatcher,
) where
    E: From<SourceEvent> + Send + 'static,
{
    let mut kinds: Vec<Watched> = REGISTRY_KINDS.iter().map(|k| Watched::Registry(*k)).collect();
    kinds.extend(ISTIO_KINDS.iter().map(|k| Watched::Istio(*k)));
    if owns_mesh {
        kinds.push(Watched::MeshConfigMap);
    }
    let mut state = KubeState::new(kinds, owns_mesh, domain);
    let (tx, mut rx) = mpsc::channel::<Update>(UPDATE_QUEUE);

    for kind in REGISTRY_KINDS {
        spawn_registry_watch(kind, client.clone(), tx.clone(), drain.clone());
    }
    for group in [kinds::NETWORKING, kinds::SECURITY] {
        tokio::spawn(watch_group(group, client.clone(), tx.clone(), drain.clone()));
    }
    if owns_mesh {
        let api = Api::<ConfigMap>::namespaced(client.clone(), &settings.namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={MESH_CONFIG_MAP}"));
        tokio::spawn(pump(Watched::MeshConfigMap, api, config, kinds::mesh_config_map, tx.clone(), drain.clone()));
    }
    drop(tx);

    tokio::spawn(async move {
        loop {
            let update = tokio::select! {
                _ = drain.draining() => return,
                update = rx.recv() => update,
            };
            let Some(update) = update else { return };
            tracing::debug!(kind = %update.watched, change = update.change.name(), "kubernetes: watch update");
            if matches!(update.change, Change::Relisted(_)) {
                metrics.kube_lists.with_label_values(&[update.watched.to_string().as_str()]).inc();
            }
            let outcome = state.apply(update);
            metrics.set_problems(SourceId::Kubernetes, &state.problem_counts());
            for event in outcome.events {
                if events.send(event.into()).await.is_err() {
                    return;
                }
            }
        }
    });
}

fn spawn_registry_watch(kind: KubeKind, client: Client, tx: mpsc::Sender<Update>, drain: DrainWatcher) {
    let w = Watched::Registry(kind);
    let config = watcher::Config::default();
    match kind {
        KubeKind::Service => tokio::spawn(pump(
            w,
            Api::<Service>::all(client),
            config,
            |_, o| Item::Kube(convert::service(o)),
            tx,
            drain,
        )),
        KubeKind::EndpointSlice => tokio::spawn(pump(
            w,
            Api::<EndpointSlice>::all(client),
            config,
            |_, o| Item::Kube(convert::endpoint_slice(o)),
            tx,
            drain,
        )),
        KubeKind::Pod => tokio::spawn(pump(
            w,
            Api::<slim::SlimPod>::all(client),
            config,
            |_, o| Item::Kube(convert::pod(o)),
            tx,
            drain,
        )),
        KubeKind::Node => {
            tokio::spawn(pump(w, Api::<Node>::all(client), config, |_, o| Item::Kube(convert::node(o)), tx, drain))
        }
        KubeKind::Namespace => tokio::spawn(pump(
            w,
            Api::<Namespace>::all(client),
            config,
            |_, o| Item::Kube(convert::namespace(o)),
            tx,
            drain,
        )),
        // As istiod: every Secret but service account tokens and Helm releases; only those
        // gateways name reach a snapshot.
        KubeKind::Secret => tokio::spawn(pump(
            w,
            Api::<Secret>::all(client),
            config.fields("type!=kubernetes.io/service-account-token,type!=helm.sh/release.v1"),
            |_, o| Item::Kube(convert::secret(o)),
            tx,
            drain,
        )),
    };
}

/// Finds the preferred version of each Istio kind of `group` through API discovery, then watches
/// each. A group or kind the server does not serve is reported and looked for again later.
async fn watch_group(group: &'static str, client: Client, tx: mpsc::Sender<Update>, drain: DrainWatcher) {
    let kinds: Vec<IstioKind> = ISTIO_KINDS.iter().filter(|k| k.group == group).copied().collect();
    let mut backoff = Backoff::new(Duration::from_millis(500), DISCOVERY_RETRY);
    let api_group = loop {
        let failure = match kube::discovery::group(&client, group).await {
            Ok(g) => break g,
            Err(kube::Error::Discovery(e)) => Failure::NotInstalled(format!("API group {group}: {e}")),
            Err(kube::Error::Api(s)) if s.code == 401 => {
                Failure::Unauthorized(format!("discovery of {group}: {}", s.message))
            }
            Err(kube::Error::Api(s)) if s.code == 403 => {
                Failure::Forbidden(format!("discovery of {group}: {}", s.message))
            }
            Err(e) => Failure::Unreachable(format!("discovery of {group}: {e}")),
        };
        let delay = if failure.is_permanent() { DISCOVERY_RETRY } else { backoff.next_delay() };
        for kind in &kinds {
            let update = Update { watched: Watched::Istio(*kind), change: Change::Failed(failure.clone()) };
            if tx.send(update).await.is_err() {
                return;
            }
        }
        tokio::select! {
            _ = drain.draining() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    };
    for kind in kinds {
        let watched = Watched::Istio(kind);
        match api_group.recommended_kind(kind.kind) {
            Some((resource, _)) => {
                let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
                let config = watcher::Config::default();
                tokio::spawn(pump(watched, api, config, kinds::istio_object, tx.clone(), drain.clone()));
            }
            None => {
                warn!(kind = %watched, "kubernetes: kind not served by the API server");
                let failure = Failure::NotInstalled(format!("{} is not served in {group}", kind.kind));
                let _ = tx.send(Update { watched, change: Change::Failed(failure) }).await;
            }
        }
    }
}
