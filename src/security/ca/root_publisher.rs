//! Keeps the `istio-ca-root-cert` ConfigMap (`root-cert.pem`: the roots workloads trust) in
//! every namespace, as istiod does: written when a namespace appears, and put back within a
//! minute when someone edits or deletes it. On a split deployment only the leader runs it.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ObjectMeta, Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use tracing::{debug, info, warn};

/// The ConfigMap's name.
pub const ROOT_CERT_CONFIGMAP: &str = "istio-ca-root-cert";
/// Its key.
pub const ROOT_CERT_KEY: &str = "root-cert.pem";
/// Every namespace's ConfigMap is checked this often.
const RESYNC: Duration = Duration::from_secs(60);
/// The field manager of meshpilot's writes.
const MANAGER: &str = "meshpilot-ca";

/// Publishes `root_pem` into every namespace until `stop` resolves.
pub async fn run(client: kube::Client, root_pem: String, stop: impl std::future::Future<Output = ()>) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut events = watcher(namespaces.clone(), watcher::Config::default()).applied_objects().boxed();
    let mut resync = tokio::time::interval(RESYNC);
    tokio::pin!(stop);
    info!("publishing the root certificate to {ROOT_CERT_CONFIGMAP} in every namespace");
    loop {
        tokio::select! {
            _ = &mut stop => return,
            event = events.next() => match event {
                Some(Ok(ns)) => {
                    if let Some(name) = ns.metadata.name.as_deref() {
                        publish(&client, name, &root_pem).await;
                    }
                }
                Some(Err(e)) => {
                    debug!(error = %e, "namespace watch");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                None => return,
            },
            _ = resync.tick() => match namespaces.list(&Default::default()).await {
                Ok(list) => {
                    for name in list.items.iter().filter_map(|n| n.metadata.name.as_deref()) {
                        publish(&client, name, &root_pem).await;
                    }
                }
                Err(e) => warn!(error = %e, "listing namespaces for {ROOT_CERT_CONFIGMAP}"),
            },
        }
    }
}

/// Writes the ConfigMap in `namespace` unless it already holds `root_pem`.
async fn publish(client: &kube::Client, namespace: &str, root_pem: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    if let Ok(Some(cm)) = api.get_opt(ROOT_CERT_CONFIGMAP).await {
        if cm.data.as_ref().and_then(|d| d.get(ROOT_CERT_KEY)).map(String::as_str) == Some(root_pem) {
            return;
        }
    }
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(ROOT_CERT_CONFIGMAP.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([("istio.io/config".to_string(), "true".to_string())])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(ROOT_CERT_KEY.to_string(), root_pem.to_string())])),
        ..Default::default()
    };
    let params = PatchParams::apply(MANAGER).force();
    match api.patch(ROOT_CERT_CONFIGMAP, &params, &Patch::Apply(&cm)).await {
        Ok(_) => debug!(%namespace, "{ROOT_CERT_CONFIGMAP} written"),
        // A namespace being deleted refuses new objects; the next resync tries again.
        Err(e) => warn!(%namespace, error = %e, "writing {ROOT_CERT_CONFIGMAP}"),
    }
}
