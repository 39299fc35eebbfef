//! Istio's pilot-discovery (`istiod`) run as `scripts/bench/servers.py` runs it: on a config dir
//! (`--configDir`) and a real kube-apiserver, plaintext xDS on a port chosen at run time, its CA,
//! webhooks, status writers and Gateway API off.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::common::kube::{KubeApi, ADMIN_TOKEN};
use crate::common::poll::{poll, STARTUP_TIMEOUT};
use crate::common::ports::{free_addr, free_port};
use crate::common::process::{deref_to_process, temp_dir, Process, ProcessSpec};

/// pilot-discovery: `$MESHPILOT_PILOT_DISCOVERY`, else what `scripts/istio-tool.sh
/// pilot-discovery` built. `None` (the test skips, saying why) where neither exists, except in
/// CI, where a judge that cannot run is a failure.
pub fn pilot_discovery() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MESHPILOT_PILOT_DISCOVERY").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "MESHPILOT_PILOT_DISCOVERY={} does not exist", p.display());
        return Some(p);
    }
    let script = crate::common::deploy::repo().join("scripts/istio-tool.sh");
    let out = Command::new("bash").arg(script).arg("pilot-discovery").output().ok();
    if let Some(path) =
        out.filter(|o| o.status.success()).map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
    {
        return Some(path);
    }
    let why = "pilot-discovery is not available: `bash scripts/istio-tool.sh pilot-discovery` builds it where Go \
               exists (or set MESHPILOT_PILOT_DISCOVERY)";
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why} (CI=true: this test must run)");
    eprintln!("SKIPPED: {why}");
    None
}

/// A running istiod; derefs to its [`Process`].
pub struct Istiod {
    process: Process,
    grpc: std::net::SocketAddr,
    http: std::net::SocketAddr,
}

deref_to_process!(Istiod);

impl Istiod {
    /// Starts `binary` on `config_dir` and `api` with `mesh` as its MeshConfig, and waits until it
    /// is ready and has loaded `configs` documents from the dir (or its count stops moving).
    pub async fn start(binary: &Path, api: &KubeApi, config_dir: &Path, mesh: &Path, configs: usize) -> Istiod {
        let dir = temp_dir("meshpilot-istiod-");
        let kubeconfig = api.write_kubeconfig(dir.path(), "istiod.kubeconfig", &api.url(), ADMIN_TOKEN);
        let (grpc, http, monitoring) = (free_addr(), free_addr(), free_addr());
        let spec = ProcessSpec::new("istiod", binary)
            .args(["discovery", "--kubeconfig"])
            .args([kubeconfig.display().to_string()])
            .args(["--meshConfig".to_string(), mesh.display().to_string()])
            .args(["--configDir".to_string(), config_dir.display().to_string()])
            .args(["--httpAddr".to_string(), http.to_string(), "--grpcAddr".into(), grpc.to_string()])
            .args(["--monitoringAddr".to_string(), monitoring.to_string()])
            .args(["--secureGRPCAddr", "", "--httpsAddr", ""])
            .args(["--ctrlz_port".to_string(), free_port().to_string()])
            .args(["--domain", "cluster.local", "--log_output_level", "default:warn"])
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAMESPACE", "istio-system")
            .env("POD_NAME", "istiod-judge")
            .env("REVISION", "default")
            .env("CLUSTER_ID", "Kubernetes")
            .env("ENABLE_CA_SERVER", "false")
            .env("PILOT_ENABLE_CONFIG_DISTRIBUTION_TRACKING", "false")
            .env("INJECTION_WEBHOOK_CONFIG_NAME", "")
            .env("VALIDATION_WEBHOOK_CONFIG_NAME", "")
            .env("PILOT_ENABLE_GATEWAY_API", "false")
            .env("PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER", "false")
            .env("PILOT_ENABLE_GATEWAY_API_STATUS", "false")
            .env("PILOT_ENABLE_ANALYSIS", "false")
            .env("PILOT_ENABLE_STATUS", "false")
            .env("GOMAXPROCS", "2")
            .log_tail(60, 0);
        let istiod = Istiod { process: Process::start(dir, spec), grpc, http };
        let ready_url = format!("http://{http}/ready");
        let client = reqwest::Client::new();
        let ready = poll(STARTUP_TIMEOUT, async || {
            assert!(istiod.process.is_running(), "istiod exited during start-up");
            client.get(&ready_url).send().await.is_ok_and(|r| r.status().is_success())
        })
        .await;
        assert!(ready, "istiod was not ready within {STARTUP_TIMEOUT:?}");
        istiod.wait_configs(configs).await;
        istiod
    }

    /// Waits until `/debug/configz` lists `expected` configs, or (documents istiod drops as
    /// invalid never appear) until its count has stayed put for two seconds.
    async fn wait_configs(&self, expected: usize) {
        let url = format!("http://{}/debug/configz", self.http);
        let client = reqwest::Client::new();
        let (mut last, mut stable) = (usize::MAX, 0);
        poll(Duration::from_secs(30), async || {
            let count = match client.get(&url).send().await {
                Ok(r) => r.json::<Value>().await.ok().and_then(|v| v.as_array().map(Vec::len)).unwrap_or(0),
                Err(_) => 0,
            };
            stable = if count == last { stable + 1 } else { 0 };
            last = count;
            count >= expected || stable >= 20
        })
        .await;
    }

    /// `http://GRPC`: the plaintext xDS address.
    pub fn xds_url(&self) -> String {
        format!("http://{}", self.grpc)
    }
}
