//! One case run against both servers: its Kubernetes objects applied to the one API server both
//! watch, its Istio documents in one config dir both read, istiod and meshpilot started on them,
//! the case's proxies connected to each, and what each proxy holds once both have settled.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::FutureExt;
use kube::Client;
use meshpilot::sim::SimProxy;
use serde_json::{json, Value};

use super::case::Case;
use super::istiod::{pilot_discovery, Istiod};
use super::proxies::ProxyDef;
use crate::common::cluster::sims::connect_sim;
use crate::common::kube::{apply, delete, KubeApi, ADMIN_TOKEN};
use crate::common::meshpilot::Meshpilot;
use crate::common::oracle::{settled_view, Held};
use crate::common::poll::STARTUP_TIMEOUT;
use crate::common::process::temp_dir;

/// How long both servers' proxies must stay quiet to count as settled (istiod debounces pushes
/// by 100 ms and may push again after its first full push).
const QUIET: Duration = Duration::from_millis(1500);
/// How long a case's proxies may take to settle.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The MeshConfig a case without its own gets, on both servers: Istio's defaults with the
/// root namespace and trust domain spelled out.
const DEFAULT_MESH: &str = "rootNamespace: istio-system\ntrustDomain: cluster.local\n";

/// What one proxy got from each server.
pub struct ProxyResult {
    /// The proxy.
    pub proxy: ProxyDef,
    /// What it holds from istiod.
    pub istiod: Held,
    /// What it holds from meshpilot.
    pub meshpilot: Held,
}

/// The judge's shared parts: the API server (one for all cases) and pilot-discovery.
pub struct Judge {
    api: KubeApi,
    admin: Client,
    pilot_discovery: PathBuf,
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

impl Judge {
    /// Starts the API server; None (the test skips, saying why) where pilot-discovery or
    /// kube-apiserver is missing, outside CI.
    pub async fn start() -> Option<Judge> {
        let pilot_discovery = pilot_discovery()?;
        let api = KubeApi::start().await?;
        let admin = api.admin().await;
        let dir = temp_dir("meshpilot-judge-");
        let kubeconfig = api.write_kubeconfig(dir.path(), "judge.kubeconfig", &api.url(), ADMIN_TOKEN);
        Some(Judge { api, admin, pilot_discovery, kubeconfig, dir })
    }

    /// Runs `case`: what each of its proxies got from each server, or why the case failed (a
    /// server that did not start, proxies that did not settle). The case's Kubernetes objects
    /// are deleted again afterwards (its namespaces stay: nothing would finalise them).
    pub async fn run(&self, case: &Case) -> Result<Vec<ProxyResult>, String> {
        let namespaces: Vec<Value> = case
            .namespaces()
            .into_iter()
            .filter(|ns| !case.kube.iter().any(|d| d["kind"] == "Namespace" && d["metadata"]["name"] == ns.as_str()))
            .map(|ns| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .collect();
        let applied = caught(apply(&self.admin, &yaml(namespaces.iter().chain(&case.kube)))).await;
        let result = match applied {
            Ok(()) => caught(self.run_servers(case)).await,
            Err(e) => Err(format!("applying the case's Kubernetes objects: {e}")),
        };
        for doc in case.kube.iter().rev().filter(|d| d["kind"] != "Namespace") {
            let (api_version, kind) = (doc["apiVersion"].as_str().unwrap_or(""), doc["kind"].as_str().unwrap_or(""));
            let (ns, name) = (doc["metadata"]["namespace"].as_str(), doc["metadata"]["name"].as_str().unwrap_or(""));
            let _ = caught(delete(&self.admin, api_version, kind, ns, name)).await;
        }
        result
    }

    async fn run_servers(&self, case: &Case) -> Vec<ProxyResult> {
        let dir = temp_dir("meshpilot-judge-case-");
        let config_dir = dir.path().join("config");
        std::fs::create_dir_all(&config_dir).expect("creating the config dir");
        std::fs::write(config_dir.join("config.yaml"), yaml(case.config.iter())).expect("writing the config");
        let mesh = match &case.mesh {
            Some(m) => m.clone(),
            None => write(dir.path(), "mesh.yaml", DEFAULT_MESH),
        };
        let meshpilot = Meshpilot::standalone(&config_dir).kubeconfig(&self.kubeconfig).mesh_config(&mesh).start();
        let istiod = Istiod::start(&self.pilot_discovery, &self.api, &config_dir, &mesh, case.config.len()).await;
        meshpilot.wait_ready(STARTUP_TIMEOUT).await;
        let (mut to_istiod, mut to_meshpilot) = (Vec::new(), Vec::new());
        for proxy in &case.proxies {
            to_istiod.push(connect_sim(proxy.spec(&istiod.xds_url())).await);
            to_meshpilot.push(connect_sim(proxy.spec(&meshpilot.xds_url())).await);
        }
        let (from_istiod, from_meshpilot) = tokio::join!(settle(&to_istiod), settle(&to_meshpilot));
        drop((to_istiod, to_meshpilot, istiod, meshpilot));
        case.proxies
            .iter()
            .zip(from_istiod.into_iter().zip(from_meshpilot))
            .map(|(proxy, (istiod, meshpilot))| ProxyResult { proxy: proxy.clone(), istiod, meshpilot })
            .collect()
    }

    /// The judge's own temp dir.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

async fn settle(proxies: &[SimProxy]) -> Vec<Held> {
    settled_view(proxies, QUIET, SETTLE_TIMEOUT).await
}

/// `docs` as one YAML stream (JSON documents are YAML).
fn yaml<'a>(docs: impl Iterator<Item = &'a Value>) -> String {
    docs.map(|d| serde_json::to_string_pretty(d).unwrap_or_default()).collect::<Vec<_>>().join("\n---\n")
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    path
}

/// `f`'s output, or its panic's message.
async fn caught<T>(f: impl Future<Output = T>) -> Result<T, String> {
    AssertUnwindSafe(f).catch_unwind().await.map_err(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".into())
    })
}
