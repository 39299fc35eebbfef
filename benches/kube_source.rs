//! Kubernetes source at scale: a real kube-apiserver (on a real etcd) holding 1,000 Services,
//! 10,000 Pods and their EndpointSlices, read by a release meshpilot (`standalone --kubeconfig`)
//! and, in the same run, by istiod (`pilot-discovery`) where it can be built.
//!
//! `cargo bench --bench kube_source` prints the figures and writes them to
//! `$CARGO_TARGET_DIR/bench/kube_source.json`. Under `cargo test` (no `--bench` flag) a tiny
//! version runs so the code keeps compiling and working; it skips, as the tests do, where
//! kube-apiserver is missing.
//!
//! Figures (each with its target, its ratio to the physical limit and to istiod):
//! - time from process start to `/ready` 200 (the first snapshot), CPU seconds of that sync and
//!   the first snapshot's build time (`meshpilot_snapshot_build_seconds`);
//! - RSS per pod held: one process started before the pods exist, RSS read at 0 pods and again
//!   once the registry holds every endpoint;
//! - one endpoint change (an EndpointSlice loses one endpoint): API write → new snapshot, and
//!   that snapshot's build time, p50/p99/max over the repeats.
//!
//! Scale knobs: `MESHPILOT_BENCH_PODS`, `_SERVICES`, `_NAMESPACES`, `_NODES`, `_CHANGES`,
//! `_CONCURRENCY`; `MESHPILOT_BENCH_ISTIOD` (path of `pilot-discovery`, or `0` to skip it);
//! `MESHPILOT_BENCH_IN_PROCESS_ONLY=1` runs only the in-process model size and build breakdown.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::http::{http_client_with_timeout, http_request};
use common::kube::{KubeApi, ADMIN_TOKEN};
use common::meshpilot::Meshpilot;
use common::ports::free_port;
use common::process::{temp_dir, Process, ProcessSpec};
use common::prometheus::{metric_value, Samples};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, Namespace, Node, ObjectReference, Pod, PodCondition, PodIP, PodSpec, PodStatus,
    Probe, ResourceRequirements, Service, ServicePort, ServiceSpec, TCPSocketAction, VolumeMount,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::{json, Value};

/// How long one phase (a sync, an endpoint change showing) may take before the bench gives up.
const PHASE_TIMEOUT: Duration = Duration::from_secs(300);
/// Idle time before RSS is read, so start-up and ingest transients have settled.
const IDLE_BEFORE_RSS: Duration = Duration::from_secs(5);
/// The targets of the issue.
const TARGET_RSS_PER_POD: f64 = 2048.0;
const TARGET_CHANGE_BUILD_MS: f64 = 5.0;

struct Scale {
    namespaces: usize,
    services: usize,
    pods: usize,
    nodes: usize,
    changes: usize,
    concurrency: usize,
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

impl Scale {
    fn from_env(full: bool) -> Scale {
        let pods = env_usize("MESHPILOT_BENCH_PODS", if full { 10_000 } else { 40 });
        Scale {
            pods,
            services: env_usize("MESHPILOT_BENCH_SERVICES", (pods / 10).max(1)),
            namespaces: env_usize("MESHPILOT_BENCH_NAMESPACES", if full { 20 } else { 2 }).max(1),
            nodes: env_usize("MESHPILOT_BENCH_NODES", if full { 10 } else { 2 }).max(1),
            changes: env_usize("MESHPILOT_BENCH_CHANGES", if full { 20 } else { 2 }),
            concurrency: env_usize("MESHPILOT_BENCH_CONCURRENCY", 32).max(1),
        }
    }

    fn namespace_of(&self, service: usize) -> String {
        format!("bench-{}", service % self.namespaces)
    }

    /// The service pod `i` belongs to, and its index within it.
    fn service_of(&self, pod: usize) -> (usize, usize) {
        (pod % self.services, pod / self.services)
    }
}

// ---------------------------------------------------------------------------------------------
// Objects, shaped like real ones (a Deployment's pods and the EndpointSlice controller's slices).

fn meta(name: &str, namespace: Option<&str>, labels: &[(&str, String)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()),
        ..ObjectMeta::default()
    }
}

fn pod_name(service: usize, j: usize) -> String {
    format!("svc-{service}-5d8f7c9b4-{j:05}")
}

/// 10.x.y.z, distinct per pod, never .0.
fn pod_ip(i: usize) -> String {
    let n = i + 1;
    format!("10.{}.{}.{}", 1 + (n >> 16), (n >> 8) & 255, n & 255)
}

fn node_name(n: usize) -> String {
    format!("node-{n}")
}

fn node(n: usize) -> Node {
    let labels = [
        ("kubernetes.io/hostname", node_name(n)),
        ("topology.kubernetes.io/region", "region-1".to_string()),
        ("topology.kubernetes.io/zone", format!("zone-{}", n % 3)),
        ("node.kubernetes.io/instance-type", "m5.2xlarge".to_string()),
    ];
    Node { metadata: meta(&node_name(n), None, &labels), ..Node::default() }
}

fn service(scale: &Scale, s: usize) -> Service {
    let ns = scale.namespace_of(s);
    let mut ports = vec![ServicePort {
        name: Some("http-web".into()),
        port: 80,
        target_port: Some(IntOrString::String("web".into())),
        protocol: Some("TCP".into()),
        ..ServicePort::default()
    }];
    if s.is_multiple_of(2) {
        ports.push(ServicePort {
            name: Some("grpc-metrics".into()),
            port: 9090,
            target_port: Some(IntOrString::Int(9090)),
            protocol: Some("TCP".into()),
            ..ServicePort::default()
        });
    }
    let app = format!("svc-{s}");
    Service {
        metadata: meta(&app, Some(&ns), &[("app", app.clone()), ("team", format!("team-{}", s % 7))]),
        spec: Some(ServiceSpec {
            selector: Some([("app".to_string(), app.clone())].into()),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn pod(scale: &Scale, i: usize) -> (Pod, PodStatus) {
    let (s, j) = scale.service_of(i);
    let ns = scale.namespace_of(s);
    let app = format!("svc-{s}");
    let labels = [
        ("app", app.clone()),
        ("version", "v1".to_string()),
        ("pod-template-hash", "5d8f7c9b4".to_string()),
        ("team", format!("team-{}", s % 7)),
        ("tier", "backend".to_string()),
    ];
    let mut metadata = meta(&pod_name(s, j), Some(&ns), &labels);
    metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: format!("{app}-5d8f7c9b4"),
        uid: format!("6f1c2a3e-0b7d-4c55-9e1a-{:012x}", s),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    metadata.annotations = Some(
        [
            ("kubectl.kubernetes.io/default-container".to_string(), "app".to_string()),
            ("prometheus.io/scrape".to_string(), "true".to_string()),
            ("prometheus.io/port".to_string(), "9090".to_string()),
        ]
        .into(),
    );
    let env = (0..8)
        .map(|k| EnvVar {
            name: format!("APP_SETTING_{k}"),
            value: Some(format!("value-{k}-{app}")),
            ..EnvVar::default()
        })
        .chain([EnvVar { name: "SERVICE_NAME".into(), value: Some(app.clone()), ..EnvVar::default() }]);
    let quantity = |q: &str| Quantity(q.to_string());
    let container = Container {
        name: "app".into(),
        image: Some(format!("registry.example.com/team-{}/{app}:1.42.7", s % 7)),
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(vec!["--port=8080".into(), "--metrics-port=9090".into(), "--log-level=info".into()]),
        ports: Some(vec![
            ContainerPort {
                name: Some("web".into()),
                container_port: 8080,
                protocol: Some("TCP".into()),
                ..Default::default()
            },
            ContainerPort {
                name: Some("metrics".into()),
                container_port: 9090,
                protocol: Some("TCP".into()),
                ..Default::default()
            },
        ]),
        env: Some(env.collect()),
        resources: Some(ResourceRequirements {
            requests: Some([("cpu".to_string(), quantity("100m")), ("memory".to_string(), quantity("128Mi"))].into()),
            limits: Some([("cpu".to_string(), quantity("500m")), ("memory".to_string(), quantity("512Mi"))].into()),
            ..ResourceRequirements::default()
        }),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction { port: IntOrString::String("web".into()), host: None }),
            period_seconds: Some(10),
            ..Probe::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "config".into(),
            mount_path: "/etc/app".into(),
            read_only: Some(true),
            ..VolumeMount::default()
        }]),
        ..Container::default()
    };
    let spec = PodSpec {
        containers: vec![container],
        node_name: Some(node_name(i % scale.nodes)),
        service_account_name: Some(app.clone()),
        termination_grace_period_seconds: Some(30),
        volumes: Some(vec![k8s_openapi::api::core::v1::Volume {
            name: "config".into(),
            config_map: Some(k8s_openapi::api::core::v1::ConfigMapVolumeSource {
                name: format!("{app}-config"),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..PodSpec::default()
    };
    let ip = pod_ip(i);
    let status = PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some(ip.clone()),
        pod_ips: Some(vec![PodIP { ip }]),
        host_ip: Some(format!("192.168.0.{}", 10 + i % scale.nodes)),
        conditions: Some(
            ["Initialized", "Ready", "ContainersReady", "PodScheduled"]
                .iter()
                .map(|t| PodCondition { type_: t.to_string(), status: "True".into(), ..PodCondition::default() })
                .collect(),
        ),
        qos_class: Some("Burstable".into()),
        ..PodStatus::default()
    };
    (Pod { metadata, spec: Some(spec), status: None }, status)
}

fn slice_endpoint(scale: &Scale, i: usize) -> Endpoint {
    let (s, j) = scale.service_of(i);
    Endpoint {
        addresses: vec![pod_ip(i)],
        conditions: Some(EndpointConditions { ready: Some(true), serving: Some(true), terminating: Some(false) }),
        node_name: Some(node_name(i % scale.nodes)),
        zone: Some(format!("zone-{}", (i % scale.nodes) % 3)),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            name: Some(pod_name(s, j)),
            namespace: Some(scale.namespace_of(s)),
            ..ObjectReference::default()
        }),
        ..Endpoint::default()
    }
}

fn endpoint_slice(scale: &Scale, s: usize) -> EndpointSlice {
    let ns = scale.namespace_of(s);
    let app = format!("svc-{s}");
    let labels = [
        ("kubernetes.io/service-name", app.clone()),
        ("endpointslice.kubernetes.io/managed-by", "endpointslice-controller.k8s.io".to_string()),
    ];
    let mut ports = vec![EndpointPort {
        name: Some("http-web".into()),
        port: Some(8080),
        protocol: Some("TCP".into()),
        ..Default::default()
    }];
    if s.is_multiple_of(2) {
        ports.push(EndpointPort {
            name: Some("grpc-metrics".into()),
            port: Some(9090),
            protocol: Some("TCP".into()),
            ..Default::default()
        });
    }
    let endpoints = (0..scale.pods).filter(|i| scale.service_of(*i).0 == s).map(|i| slice_endpoint(scale, i)).collect();
    EndpointSlice {
        metadata: meta(&format!("{app}-x7k2p"), Some(&ns), &labels),
        address_type: "IPv4".into(),
        ports: Some(ports),
        endpoints,
    }
}

// ---------------------------------------------------------------------------------------------
// Writing them, many requests in flight.

async fn concurrently<F>(n: usize, concurrency: usize, f: impl Fn(usize) -> F)
where
    F: std::future::Future<Output = ()>,
{
    futures::stream::iter(0..n).map(f).buffer_unordered(concurrency).collect::<Vec<()>>().await;
}

async fn create_base(client: &Client, scale: &Scale) {
    let nss: Api<Namespace> = Api::all(client.clone());
    let mut names: Vec<String> = (0..scale.namespaces).map(|n| format!("bench-{n}")).collect();
    names.push("istio-system".into());
    for name in names {
        let ns = Namespace { metadata: meta(&name, None, &[]), ..Namespace::default() };
        nss.create(&PostParams::default(), &ns).await.expect("creating a namespace");
    }
    let nodes: Api<Node> = Api::all(client.clone());
    for n in 0..scale.nodes {
        nodes.create(&PostParams::default(), &node(n)).await.expect("creating a node");
    }
    concurrently(scale.services, scale.concurrency, |s| {
        let svc = service(scale, s);
        let api: Api<Service> = Api::namespaced(client.clone(), &scale.namespace_of(s));
        async move {
            api.create(&PostParams::default(), &svc).await.expect("creating a service");
        }
    })
    .await;
}

async fn create_pods_and_slices(client: &Client, scale: &Scale) {
    concurrently(scale.pods, scale.concurrency, |i| {
        let (pod, status) = pod(scale, i);
        let name = pod.metadata.name.clone().expect("a pod name");
        let api: Api<Pod> = Api::namespaced(client.clone(), pod.metadata.namespace.as_deref().expect("a namespace"));
        async move {
            api.create(&PostParams::default(), &pod).await.expect("creating a pod");
            // Pods are created Pending: the kubelet's status is written through the subresource.
            let patch = Patch::Merge(json!({ "status": status }));
            api.patch_status(&name, &PatchParams::default(), &patch).await.expect("writing a pod's status");
        }
    })
    .await;
    concurrently(scale.services, scale.concurrency, |s| {
        let slice = endpoint_slice(scale, s);
        let api: Api<EndpointSlice> = Api::namespaced(client.clone(), &scale.namespace_of(s));
        async move {
            api.create(&PostParams::default(), &slice).await.expect("creating an endpoint slice");
        }
    })
    .await;
}

/// The physical limit of a first sync: LIST every Service, Pod and EndpointSlice, paginated at
/// 500 and deserialized into k8s-openapi types as kube-runtime's watcher does, the three kinds
/// at once (the source lists each kind in its own task).
async fn list_all(client: &Client) -> (Duration, usize) {
    async fn list<K>(api: Api<K>) -> usize
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + kube::Resource,
    {
        let mut count = 0;
        let mut params = ListParams::default().limit(500);
        loop {
            let page = api.list(&params).await.expect("listing");
            count += page.items.len();
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return count,
            }
        }
    }
    let t = Instant::now();
    let (a, b, c) = tokio::join!(
        list(Api::<Service>::all(client.clone())),
        list(Api::<Pod>::all(client.clone())),
        list(Api::<EndpointSlice>::all(client.clone()))
    );
    (t.elapsed(), a + b + c)
}

// ---------------------------------------------------------------------------------------------
// Process figures.

fn rss_bytes(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024.0)
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / hz)
}

fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn stats(mut values: Vec<f64>) -> (Option<f64>, Option<f64>, Option<f64>) {
    values.sort_by(f64::total_cmp);
    (percentile(&values, 50.0), percentile(&values, 99.0), values.last().copied())
}

// ---------------------------------------------------------------------------------------------
// meshpilot.

fn ready_version(body: &str) -> Option<String> {
    body.trim().strip_prefix("ready: snapshot ").map(str::to_string)
}

async fn mp_version(mp: &Meshpilot) -> Option<String> {
    match mp.try_admin_get("/ready").await {
        Ok((200, body)) => ready_version(&body),
        _ => None,
    }
}

/// Endpoints the registry holds in the bench's namespaces.
async fn mp_endpoints(mp: &Meshpilot) -> usize {
    let Some(reg) = mp.try_admin_json("/debug/registryz").await else { return 0 };
    reg["services"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["namespace"].as_str().is_some_and(|n| n.starts_with("bench-")))
        .map(|s| s["endpoints"].as_array().map_or(0, Vec::len))
        .sum()
}

/// (sum, count) of `meshpilot_snapshot_build_seconds`.
async fn mp_builds(mp: &Meshpilot) -> (f64, f64) {
    let text = mp.try_metrics().await.unwrap_or_default();
    (
        metric_value(&text, "meshpilot_snapshot_build_seconds_sum").unwrap_or(0.0),
        metric_value(&text, "meshpilot_snapshot_build_seconds_count").unwrap_or(0.0),
    )
}

/// Live heap bytes of meshpilot (`meshpilot_heap_allocated_bytes`).
async fn mp_heap(mp: &Meshpilot) -> Option<f64> {
    metric_value(&mp.try_metrics().await?, "meshpilot_heap_allocated_bytes")
}

/// Waits until `count()` reaches `want` (→ the time it took) or stops growing for 30 s (→ None).
async fn wait_count<F: std::future::Future<Output = usize>>(
    what: &str,
    want: usize,
    mut count: impl FnMut() -> F,
) -> Option<Duration> {
    let t = Instant::now();
    let (mut last, mut since) = (usize::MAX, Instant::now());
    while t.elapsed() < PHASE_TIMEOUT {
        let n = count().await;
        if n >= want {
            return Some(t.elapsed());
        }
        if n != last {
            (last, since) = (n, Instant::now());
        } else if since.elapsed() > Duration::from_secs(30) {
            println!("  {what}: holds {n} of {want} endpoints and stopped growing");
            return None;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    println!("  {what}: holds {last} of {want} endpoints after {PHASE_TIMEOUT:?}");
    None
}

// ---------------------------------------------------------------------------------------------
// istiod (pilot-discovery), where this machine can build it.

/// The istio module version the Go module proxy serves here (release tags answer 403); the one
/// place it is named is `scripts/istio-version`, which the sidecar tests' pilot-agent is built at.
const ISTIO_VERSION: &str = include_str!("../scripts/istio-version").trim_ascii();

fn istiod_binary() -> Result<PathBuf, String> {
    match std::env::var("MESHPILOT_BENCH_ISTIOD").ok().filter(|v| !v.is_empty()) {
        Some(v) if v == "0" => return Err("skipped: MESHPILOT_BENCH_ISTIOD=0".into()),
        Some(v) => return Ok(PathBuf::from(v)),
        None => {}
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let gopath = std::env::var_os("GOPATH").map(PathBuf::from).unwrap_or_else(|| home.join("go"));
    let bin = gopath.join("bin/pilot-discovery");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "pilot-discovery not found at {}: build it with `GOFLAGS=-mod=mod go install istio.io/istio/pilot/cmd/pilot-discovery@{ISTIO_VERSION}` (the only istio version this Go module proxy serves; release tags are refused with 403) or set MESHPILOT_BENCH_ISTIOD",
            bin.display()
        ))
    }
}

struct Istiod {
    process: Process,
    http: u16,
    monitoring: u16,
    client: reqwest::Client,
}

impl Istiod {
    fn start(binary: &Path, kubeconfig: &Path) -> Istiod {
        let dir = temp_dir("meshpilot-istiod-");
        let mesh = dir.path().join("mesh.yaml");
        std::fs::write(&mesh, "defaultConfig:\n  discoveryAddress: 127.0.0.1:15012\n").expect("writing mesh.yaml");
        let (http, grpc, monitoring) = (free_port(), free_port(), free_port());
        let addr = |p: u16| format!("127.0.0.1:{p}");
        let spec = ProcessSpec::new("istiod", binary)
            .args(["discovery", "--kubeconfig"])
            .args([kubeconfig.display().to_string(), "--meshConfig".into(), mesh.display().to_string()])
            .args(["--httpAddr".to_string(), addr(http), "--grpcAddr".into(), addr(grpc)])
            .args(["--monitoringAddr".to_string(), addr(monitoring)])
            .args(["--secureGRPCAddr", "", "--httpsAddr", "", "--domain", "cluster.local"])
            .args(["--log_output_level", "default:warn"])
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAMESPACE", "istio-system")
            .env("POD_NAME", "istiod-bench")
            .env("REVISION", "default")
            .env("ENABLE_CA_SERVER", "false")
            .env("PILOT_ENABLE_CONFIG_DISTRIBUTION_TRACKING", "false")
            .env("INJECTION_WEBHOOK_CONFIG_NAME", "")
            .env("VALIDATION_WEBHOOK_CONFIG_NAME", "")
            .env("PILOT_ENABLE_GATEWAY_API", "false")
            .env("PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER", "false")
            .env("PILOT_ENABLE_GATEWAY_API_STATUS", "false")
            .env("PILOT_ENABLE_ANALYSIS", "false")
            .env("PILOT_ENABLE_STATUS", "false")
            .env("CLUSTER_ID", "Kubernetes")
            .env("GOMAXPROCS", "2")
            .log_tail(60, 60);
        Istiod {
            process: Process::start(dir, spec),
            http,
            monitoring,
            client: http_client_with_timeout(Duration::from_secs(30)),
        }
    }

    async fn get(&self, port: u16, path: &str) -> Option<(u16, String)> {
        let url = format!("http://127.0.0.1:{port}{path}");
        http_request(&self.client, "GET", &url, "", &[], None).await.ok().map(|r| (r.status, r.body))
    }

    async fn wait_ready(&self) -> Result<(), String> {
        let t = Instant::now();
        while t.elapsed() < PHASE_TIMEOUT {
            if !self.process.is_running() {
                return Err(format!("istiod exited; log tail:\n{}", self.process.log_tail(30)));
            }
            if let Some((200, _)) = self.get(self.http, "/ready").await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!("istiod not ready after {PHASE_TIMEOUT:?}; log tail:\n{}", self.process.log_tail(30)))
    }

    /// Endpoints in istiod's endpoint index (`/debug/endpointShardz`) in the bench's namespaces.
    async fn endpoints(&self) -> usize {
        let Some((200, body)) = self.get(self.http, "/debug/endpointShardz").await else { return 0 };
        let Ok(v) = serde_json::from_str::<Value>(&body) else { return 0 };
        // {service: {namespace: {Shards: {cluster: [endpoint, ...]}}}}
        let mut n = 0;
        for namespaces in v.as_object().into_iter().flat_map(|m| m.values()) {
            for (ns, shards) in namespaces.as_object().into_iter().flatten() {
                if !ns.starts_with("bench-") {
                    continue;
                }
                let shards = shards.get("Shards").or_else(|| shards.get("shards"));
                for eps in shards.and_then(Value::as_object).into_iter().flat_map(|m| m.values()) {
                    n += eps.as_array().map_or(0, Vec::len);
                }
            }
        }
        n
    }

    async fn metrics(&self) -> Samples {
        Samples::parse(&self.get(self.monitoring, "/metrics").await.map(|(_, b)| b).unwrap_or_default())
    }

    fn pid(&self) -> Option<u32> {
        self.process.pid()
    }
}

// ---------------------------------------------------------------------------------------------
// Endpoint changes.

/// Removes the last endpoint of service `s`'s slice; returns the write's resourceVersion.
async fn remove_one_endpoint(client: &Client, scale: &Scale, s: usize) -> String {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), &scale.namespace_of(s));
    let name = format!("svc-{s}-x7k2p");
    let mut slice = api.get(&name).await.expect("reading a slice");
    slice.endpoints.pop();
    let written = api.replace(&name, &PostParams::default(), &slice).await.expect("replacing a slice");
    written.metadata.resource_version.expect("a resourceVersion")
}

/// A plain watch of every EndpointSlice (the physical limit of "the change is visible"): sends
/// each event's resourceVersion and arrival time.
fn spawn_slice_watch(
    client: Client,
) -> (tokio::sync::mpsc::UnboundedReceiver<(String, Instant)>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let stream = watcher(Api::<EndpointSlice>::all(client), watcher::Config::default());
        futures::pin_mut!(stream);
        while let Ok(Some(event)) = stream.try_next().await {
            if let watcher::Event::Apply(s) = event {
                if let Some(rv) = s.metadata.resource_version {
                    let _ = tx.send((rv, Instant::now()));
                }
            }
        }
    });
    (rx, task)
}

async fn watch_saw(rx: &mut tokio::sync::mpsc::UnboundedReceiver<(String, Instant)>, rv: &str) -> Option<Instant> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((got, at))) if got == rv => return Some(at),
            Ok(Some(_)) => continue,
            _ => return None,
        }
    }
}

struct Change {
    /// API write → new snapshot served (meshpilot; includes the debounce).
    visible_ms: f64,
    /// That snapshot's build (meshpilot_snapshot_build_seconds).
    build_ms: Option<f64>,
    /// API write → a plain watch sees it.
    watch_ms: Option<f64>,
}

async fn meshpilot_changes(mp: &Meshpilot, client: &Client, scale: &Scale, first_service: usize) -> Vec<Change> {
    let (mut rx, task) = spawn_slice_watch(client.clone());
    tokio::time::sleep(Duration::from_secs(2)).await; // the watch's initial list
    while rx.try_recv().is_ok() {}
    let mut out = Vec::new();
    for k in 0..scale.changes {
        let s = (first_service + k * 37) % scale.services;
        let before = mp_version(mp).await;
        let (sum0, count0) = mp_builds(mp).await;
        let t = Instant::now();
        let rv = remove_one_endpoint(client, scale, s).await;
        let mut visible = None;
        while t.elapsed() < Duration::from_secs(30) {
            if let Some(v) = mp_version(mp).await.filter(|v| Some(v) != before.as_ref()) {
                visible = Some((t.elapsed(), v));
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let Some((visible, _version)) = visible else {
            println!("  change {k}: no new snapshot within 30 s");
            continue;
        };
        let watch_ms = watch_saw(&mut rx, &rv).await.map(|at| at.duration_since(t).as_secs_f64() * 1e3);
        // The build is recorded as the snapshot is published: wait for its observation.
        let mut build_ms = None;
        for _ in 0..100 {
            let (sum, count) = mp_builds(mp).await;
            if count > count0 {
                build_ms = Some((sum - sum0) / (count - count0) * 1e3);
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        out.push(Change { visible_ms: visible.as_secs_f64() * 1e3, build_ms, watch_ms });
        // Let the debounce window close so changes do not merge.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    task.abort();
    out
}

/// istiod: API write → its endpoint index has the change (`pilot_inbound_updates{type="eds"}`
/// grows), and → the debounced push is done (`pilot_debounce_time` count grows).
async fn istiod_changes(
    istiod: &Istiod,
    client: &Client,
    scale: &Scale,
    first_service: usize,
) -> Vec<(f64, Option<f64>)> {
    let mut out = Vec::new();
    let eds = |m: &Samples| m.sum("pilot_inbound_updates", &[("type", "eds")]);
    let pushes = |m: &Samples| m.sum("pilot_debounce_time_count", &[]);
    for k in 0..scale.changes {
        let s = (first_service + k * 37) % scale.services;
        let m0 = istiod.metrics().await;
        let (eds0, push0) = (eds(&m0), pushes(&m0));
        let t = Instant::now();
        remove_one_endpoint(client, scale, s).await;
        let (mut seen, mut pushed) = (None, None);
        while t.elapsed() < Duration::from_secs(30) && pushed.is_none() {
            let m = istiod.metrics().await;
            if seen.is_none() && eds(&m) > eds0 {
                seen = Some(t.elapsed().as_secs_f64() * 1e3);
            }
            if pushes(&m) > push0 {
                pushed = Some(t.elapsed().as_secs_f64() * 1e3);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        match seen {
            Some(seen) => out.push((seen, pushed)),
            None => println!("  istiod change {k}: not seen within 30 s"),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    out
}

// ---------------------------------------------------------------------------------------------
// In process: the compact model's size (the memory physical limit) and where a build's time goes.

/// Counts the bench process's live heap bytes, so the compact model's size is measured, not
/// estimated.
struct Counting;

static LIVE: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is added.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE.fetch_sub(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> isize {
    LIVE.load(std::sync::atomic::Ordering::Relaxed)
}

/// What the Kubernetes source hands ingest for the bench's cluster: every object converted to
/// the compact model, keyed as ingest keeps it.
fn compact_objects(scale: &Scale) -> meshpilot::registry::kubernetes::KubeObjects {
    use meshpilot::source::kubernetes::convert;
    let mut objects = meshpilot::registry::kubernetes::KubeObjects::new();
    let mut add = |o: meshpilot::registry::kubernetes::KubeObject| {
        objects.insert(o.key(), std::sync::Arc::new(o));
    };
    for n in 0..scale.namespaces {
        add(convert::namespace(Namespace { metadata: meta(&format!("bench-{n}"), None, &[]), ..Namespace::default() }));
    }
    for n in 0..scale.nodes {
        add(convert::node(node(n)));
    }
    for s in 0..scale.services {
        add(convert::service(service(scale, s)));
        add(convert::endpoint_slice(endpoint_slice(scale, s)));
    }
    for i in 0..scale.pods {
        let (p, status) = pod(scale, i);
        add(convert::pod(slim(Pod { status: Some(status), ..p })));
    }
    objects
}

/// `pod` as the source decodes it from the API server's JSON.
fn slim(pod: Pod) -> meshpilot::source::kubernetes::slim::SlimPod {
    serde_json::to_value(&pod).and_then(serde_json::from_value).expect("a pod decodes as the source reads it")
}

/// Heap bytes per pod of the compact model, one copy: the pods (`KubePod` in an `Arc`, keyed in
/// a map) plus their share of the EndpointSlices; and a pod's JSON size.
fn compact_pod_bytes(scale: &Scale) -> (f64, usize) {
    use meshpilot::source::kubernetes::convert;
    let (p, status) = pod(scale, 0);
    let pod_json = serde_json::to_vec(&Pod { status: Some(status), ..p }).map_or(0, |v| v.len());
    let before = live();
    let mut pods = meshpilot::registry::kubernetes::KubeObjects::new();
    let mut interner = meshpilot::registry::intern::Interner::default();
    for i in 0..scale.pods {
        let (p, status) = pod(scale, i);
        let o = interner.object(convert::pod(slim(Pod { status: Some(status), ..p })));
        pods.insert(o.key(), std::sync::Arc::new(o));
    }
    let mid = live();
    let mut slices = meshpilot::registry::kubernetes::KubeObjects::new();
    for s in 0..scale.services {
        let o = convert::endpoint_slice(endpoint_slice(scale, s));
        slices.insert(o.key(), std::sync::Arc::new(o));
    }
    let after = live();
    let per_pod = (mid - before) as f64 / scale.pods as f64;
    let per_endpoint = (after - mid) as f64 / scale.pods as f64;
    println!("compact model, one copy: {per_pod:.0} B per pod + {per_endpoint:.0} B per slice endpoint (heap, allocator-counted)");
    drop((pods, slices));
    (per_pod + per_endpoint, pod_json)
}

fn median_ms(mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            f();
            ms(t.elapsed())
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Where one snapshot build's time goes, in this process, on the same objects: the registry
/// from the Kubernetes objects, the copy of the object map every snapshot holds, the whole
/// build. Medians of 7.
fn build_breakdown(scale: &Scale) -> Value {
    use meshpilot::snapshot::{ChangeSet, Snapshot, SourceState, Version};
    let mesh = meshpilot::mesh::MeshConfig { domain: "cluster.local".into(), ..Default::default() };
    let state = SourceState { kube: compact_objects(scale), mesh: std::sync::Arc::new(mesh), ..SourceState::default() };
    let registry_ms = median_ms(|| {
        let r = meshpilot::registry::build_registry(state.configs.iter().map(|(_, c)| c), &state.kube, &state.mesh);
        std::hint::black_box(r);
    });
    let clone_ms = median_ms(|| {
        std::hint::black_box(state.kube.clone());
    });
    let build_ms = median_ms(|| {
        std::hint::black_box(Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state));
    });
    let registry = meshpilot::registry::build_registry(state.configs.iter().map(|(_, c)| c), &state.kube, &state.mesh);
    let endpoints: usize = registry.endpoints.values().map(|e| e.len()).sum();
    println!(
        "in process ({} objects): build_registry {registry_ms:.2} ms ({} services, {endpoints} endpoints), kube map clone {clone_ms:.2} ms, Snapshot::build {build_ms:.2} ms",
        state.kube.len(),
        registry.services.len()
    );
    json!({"objects": state.kube.len(), "registry_services": registry.services.len(), "registry_endpoints": endpoints,
           "build_registry_ms": registry_ms, "kube_map_clone_ms": clone_ms, "snapshot_build_ms": build_ms})
}

// ---------------------------------------------------------------------------------------------
// Reporting.

struct Figure {
    name: &'static str,
    value: Option<f64>,
    unit: &'static str,
    target: Option<(f64, &'static str)>,
    physical: Result<(f64, String), String>,
    istiod: Result<f64, String>,
    note: String,
}

impl Default for Figure {
    fn default() -> Self {
        Figure {
            name: "",
            value: None,
            unit: "",
            target: None,
            physical: Err("no physical limit measured for this figure".into()),
            istiod: Err("not measured".into()),
            note: String::new(),
        }
    }
}

fn ratio(value: Option<f64>, to: f64) -> Option<f64> {
    value.filter(|_| to > 0.0).map(|v| v / to)
}

impl Figure {
    fn json(&self) -> Value {
        let physical = match &self.physical {
            Ok((v, what)) => json!({"value": v, "what": what, "ratio": ratio(self.value, *v)}),
            Err(why) => json!({"value": null, "ratio": null, "reason": why}),
        };
        let istiod = match &self.istiod {
            Ok(v) => json!({"value": v, "ratio": ratio(self.value, *v)}),
            Err(why) => json!({"value": null, "ratio": null, "reason": why}),
        };
        json!({
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "target": self.target.map(|(t, text)| json!({"value": t, "text": text})),
            "meets_target": self.target.and_then(|(t, _)| self.value.map(|v| v <= t)),
            "physical_limit": physical,
            "istiod": istiod,
            "note": self.note,
        })
    }

    fn print(&self) {
        let v = self.value.map_or("n/a".to_string(), |v| format!("{v:.3}"));
        let target = self.target.map_or(String::new(), |(_, t)| format!(" (target {t})"));
        let phys = match &self.physical {
            Ok((p, what)) => ratio(self.value, *p).map_or("n/a".into(), |r| format!("{r:.2}× {what} ({p:.3})")),
            Err(why) => format!("n/a: {why}"),
        };
        let ist = match &self.istiod {
            Ok(i) => ratio(self.value, *i).map_or("n/a".into(), |r| format!("{r:.2}× istiod ({i:.3})")),
            Err(why) => format!("n/a: {why}"),
        };
        println!(
            "{:<40} {v} {}{target}\n{:<40}   vs physical: {phys}\n{:<40}   vs istiod:   {ist}",
            self.name, self.unit, "", ""
        );
        if !self.note.is_empty() {
            println!("{:<40}   note: {}", "", self.note);
        }
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.2}"))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ---------------------------------------------------------------------------------------------

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let scale = Scale::from_env(full);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(run(full, scale));
}

#[allow(clippy::too_many_lines)]
async fn run(full: bool, scale: Scale) {
    if std::env::var_os("MESHPILOT_BENCH_IN_PROCESS_ONLY").is_some_and(|v| v == "1") {
        // Only the in-process figures (no API server), e.g. under `perf record`.
        compact_pod_bytes(&scale);
        build_breakdown(&scale);
        return;
    }
    let Some(api) = KubeApi::start().await else {
        println!("SKIPPED: kube-apiserver is not available");
        return;
    };
    let client = api.admin().await;
    let dir = temp_dir("meshpilot-bench-");
    let kubeconfig = api.write_kubeconfig(dir.path(), "bench.kubeconfig", &api.url(), ADMIN_TOKEN);
    let istiod_bin = if full || std::env::var_os("MESHPILOT_BENCH_ISTIOD").is_some() {
        istiod_binary()
    } else {
        Err("not run in the smoke mode".into())
    };
    println!(
        "kube_source: {} namespaces, {} services, {} pods, {} nodes; meshpilot {}; istiod {}",
        scale.namespaces,
        scale.services,
        scale.pods,
        scale.nodes,
        Meshpilot::binary().display(),
        istiod_bin.as_ref().map_or_else(|e| e.clone(), |p| p.display().to_string())
    );

    let t = Instant::now();
    create_base(&client, &scale).await;
    let base_took = t.elapsed();

    // Run A: started with Services and Nodes only, so one process gives RSS at 0 pods and at N.
    let mp_a = Meshpilot::standalone_on_kubernetes(&kubeconfig).start();
    mp_a.wait_ready(PHASE_TIMEOUT).await;
    let mut istiod_a = match &istiod_bin {
        Ok(bin) => {
            let i = Istiod::start(bin, &kubeconfig);
            match i.wait_ready().await {
                Ok(()) => Ok(i),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e.clone()),
    };
    let _ = mp_endpoints(&mp_a).await;
    if let Ok(i) = &istiod_a {
        let _ = i.endpoints().await;
    }
    tokio::time::sleep(IDLE_BEFORE_RSS).await;
    let mp_rss0 = mp_a.pid().and_then(rss_bytes);
    let mp_heap0 = mp_heap(&mp_a).await;
    let istiod_rss0 = istiod_a.as_ref().ok().and_then(|i| i.pid()).and_then(rss_bytes);
    let istiod_heap0 = match &istiod_a {
        Ok(i) => Some(i.metrics().await.value("go_memstats_heap_alloc_bytes", &[])),
        Err(_) => None,
    };

    let t = Instant::now();
    create_pods_and_slices(&client, &scale).await;
    let pods_took = t.elapsed();
    // What the API server serves for one pod (defaults, uid, managedFields added), as the watch reads it.
    let (s0, j0) = scale.service_of(0);
    let served = Api::<Pod>::namespaced(client.clone(), &scale.namespace_of(s0))
        .get(&pod_name(s0, j0))
        .await
        .expect("reading a pod");
    let served_pod_bytes = serde_json::to_vec(&served).map_or(0, |v| v.len());
    println!("created {} pods and {} slices in {:.1} s", scale.pods, scale.services, pods_took.as_secs_f64());

    let mp_a_synced = wait_count("meshpilot", scale.pods, || mp_endpoints(&mp_a)).await;
    if let Ok(i) = &istiod_a {
        if wait_count("istiod", scale.pods, || i.endpoints()).await.is_none() {
            istiod_a = Err("istiod did not hold every endpoint".into());
        }
    }
    tokio::time::sleep(IDLE_BEFORE_RSS).await;
    let mp_rss1 = mp_a.pid().and_then(rss_bytes);
    let mp_heap1 = mp_heap(&mp_a).await;
    let istiod_rss1 = istiod_a.as_ref().ok().and_then(|i| i.pid()).and_then(rss_bytes);
    let istiod_heap1 = match &istiod_a {
        Ok(i) => Some(i.metrics().await.value("go_memstats_heap_alloc_bytes", &[])),
        Err(_) => None,
    };
    drop(mp_a);
    if let Ok(i) = istiod_a {
        drop(i);
    }

    // Physical limit of the first sync.
    let (list_took, listed) = list_all(&client).await;

    // Run B: started against the full cluster.
    let t = Instant::now();
    let mp_b = Meshpilot::standalone_on_kubernetes(&kubeconfig).start();
    mp_b.wait_ready(PHASE_TIMEOUT).await;
    let mp_ready = t.elapsed();
    let mp_ready_cpu = mp_b.pid().and_then(cpu_seconds);
    let first_version = mp_version(&mp_b).await;
    let (first_build_sum, first_build_count) = mp_builds(&mp_b).await;
    let mp_b_endpoints = mp_endpoints(&mp_b).await;
    tokio::time::sleep(IDLE_BEFORE_RSS).await;
    let mp_b_rss = mp_b.pid().and_then(rss_bytes);
    let changes = meshpilot_changes(&mp_b, &client, &scale, 0).await;
    drop(mp_b);

    // istiod, run B: the same.
    let mut istiod_ready = Err("not run".to_string());
    let mut istiod_cpu = None;
    let mut istiod_b_rss = None;
    let mut istiod_changes_ms = Vec::new();
    if let Ok(bin) = &istiod_bin {
        let t = Instant::now();
        let i = Istiod::start(bin, &kubeconfig);
        match i.wait_ready().await {
            Ok(()) => {
                istiod_ready = Ok(t.elapsed());
                istiod_cpu = i.pid().and_then(cpu_seconds);
                if wait_count("istiod (run B)", scale.pods, || i.endpoints()).await.is_some() {
                    tokio::time::sleep(IDLE_BEFORE_RSS).await;
                    istiod_b_rss = i.pid().and_then(rss_bytes);
                    istiod_changes_ms = istiod_changes(&i, &client, &scale, 1).await;
                }
            }
            Err(e) => istiod_ready = Err(e),
        }
    } else if let Err(e) = &istiod_bin {
        istiod_ready = Err(e.clone());
    }

    // Reference figures.
    let (compact_bytes, pod_json_bytes) = compact_pod_bytes(&scale);
    let breakdown = build_breakdown(&scale);
    let per_pod = |a: Option<f64>, b: Option<f64>| Some((b? - a?) / scale.pods as f64);
    let mp_per_pod = per_pod(mp_rss0, mp_rss1).filter(|_| mp_a_synced.is_some());
    let istiod_per_pod = per_pod(istiod_rss0, istiod_rss1);
    let istiod_why = |e: &str| {
        let first = e.lines().next().unwrap_or(e).to_string();
        first
    };
    let istiod_err = istiod_ready.as_ref().err().map(|e| istiod_why(e));
    let istiod_val = |v: Option<f64>, what: &str| -> Result<f64, String> {
        match (&istiod_err, v) {
            (Some(e), _) => Err(e.clone()),
            (None, Some(v)) => Ok(v),
            (None, None) => Err(format!("istiod {what} not measured")),
        }
    };
    let visible: Vec<f64> = changes.iter().map(|c| c.visible_ms).collect();
    let builds: Vec<f64> = changes.iter().filter_map(|c| c.build_ms).collect();
    let watches: Vec<f64> = changes.iter().filter_map(|c| c.watch_ms).collect();
    let (vis50, vis99, vismax) = stats(visible);
    let (b50, b99, bmax) = stats(builds);
    let (w50, _, _) = stats(watches);
    let (i_seen50, _, _) = stats(istiod_changes_ms.iter().map(|c| c.0).collect());
    let (i_push50, i_push99, _) = stats(istiod_changes_ms.iter().filter_map(|c| c.1).collect());
    let registry_note = if mp_b_endpoints < scale.pods {
        format!("the registry held {mp_b_endpoints} of {} endpoints at ready", scale.pods)
    } else {
        String::new()
    };

    let figures = vec![
        Figure {
            name: "time_to_first_snapshot",
            value: Some(ms(mp_ready)),
            unit: "ms",
            physical: Ok((ms(list_took), format!("LIST of {listed} Services+Pods+EndpointSlices (limit=500)"))),
            istiod: istiod_val(istiod_ready.as_ref().ok().map(|d| ms(*d)), "ready"),
            note: format!("process start → /ready 200, snapshot {}; {registry_note}", first_version.as_deref().unwrap_or("?")),
            ..Figure::default()
        },
        Figure {
            name: "first_snapshot_build",
            value: (first_build_count > 0.0).then(|| first_build_sum / first_build_count * 1e3),
            unit: "ms",
            note: format!("meshpilot_snapshot_build_seconds: {first_build_count} builds before ready, mean"),
            istiod: Err("istiod has no equivalent single build figure here".into()),
            ..Figure::default()
        },
        Figure {
            name: "initial_sync_cpu",
            value: mp_ready_cpu,
            unit: "s",
            istiod: istiod_val(istiod_cpu, "CPU"),
            note: "utime+stime at /ready (start-up included)".into(),
            ..Figure::default()
        },
        Figure {
            name: "rss_per_pod",
            value: mp_per_pod,
            unit: "bytes",
            target: Some((TARGET_RSS_PER_POD, "≤ 2 KB/pod")),
            physical: Ok((compact_bytes, "heap of the compact model, one copy (KubePod + its slice endpoint, allocator-counted)".into())),
            istiod: istiod_val(istiod_per_pod, "RSS"),
            note: format!(
                "(RSS at {} pods − RSS at 0) / pods; RSS {:.1} MB → {:.1} MB; a pod is {pod_json_bytes} bytes of JSON as written, {served_pod_bytes} as served",
                scale.pods,
                mp_rss0.unwrap_or(0.0) / 1e6,
                mp_rss1.unwrap_or(0.0) / 1e6
            ),
        },
        Figure {
            name: "heap_per_pod",
            value: per_pod(mp_heap0, mp_heap1).filter(|_| mp_a_synced.is_some()),
            unit: "bytes",
            physical: Ok((compact_bytes, "heap of the compact model, one copy (KubePod + its slice endpoint, allocator-counted)".into())),
            istiod: istiod_val(per_pod(istiod_heap0, istiod_heap1), "heap"),
            note: "live heap allocations at N pods − at 0, / pods (meshpilot_heap_allocated_bytes; istiod go_memstats_heap_alloc_bytes); the rest of rss_per_pod is what the allocator keeps".into(),
            ..Figure::default()
        },
        Figure {
            name: "rss_full_start",
            value: mp_b_rss.map(|r| r / 1e6),
            unit: "MB",
            istiod: istiod_val(istiod_b_rss.map(|r| r / 1e6), "RSS"),
            note: format!(
                "RSS of a process started against the full cluster, idle after ready; started empty and grown: meshpilot {:.1} MB, istiod {:.1} MB",
                mp_rss1.unwrap_or(0.0) / 1e6,
                istiod_rss1.unwrap_or(0.0) / 1e6
            ),
            ..Figure::default()
        },
        Figure {
            name: "endpoint_change_build_p50",
            value: b50,
            unit: "ms",
            target: Some((TARGET_CHANGE_BUILD_MS, "≤ 5 ms")),
            istiod: Err("istiod builds no snapshot for an endpoint change (EDS-incremental)".into()),
            note: format!("p99 {} ms, max {} ms over {} changes", opt(b99), opt(bmax), changes.len()),
            ..Figure::default()
        },
        Figure {
            name: "endpoint_change_build_max",
            value: bmax,
            unit: "ms",
            target: Some((TARGET_CHANGE_BUILD_MS, "≤ 5 ms")),
            istiod: Err("istiod builds no snapshot for an endpoint change (EDS-incremental)".into()),
            ..Figure::default()
        },
        Figure {
            name: "endpoint_change_visible_p50",
            value: vis50,
            unit: "ms",
            physical: w50.map(|w| (w, "a plain watch sees the write".to_string())).ok_or_else(|| "watch not seen".to_string()),
            istiod: istiod_val(i_push50, "push"),
            note: format!(
                "API write → new snapshot (/ready), debounce (100 ms) included; p99 {} ms, max {} ms; istiod: write → debounced push done (pilot_debounce_time), p99 {} ms; write → its endpoint index (pilot_inbound_updates eds) p50 {} ms",
                opt(vis99),
                opt(vismax),
                opt(i_push99),
                opt(i_seen50)
            ),
            ..Figure::default()
        },
    ];

    println!("\n== kube_source ({} pods) ==", scale.pods);
    println!(
        "setup (not meshpilot): namespaces/nodes/services in {:.1} s; pods+status+slices in {:.1} s ({:.0} writes/s)",
        base_took.as_secs_f64(),
        pods_took.as_secs_f64(),
        (2 * scale.pods + scale.services) as f64 / pods_took.as_secs_f64()
    );
    for f in &figures {
        f.print();
    }
    let report = json!({
        "scale": {"namespaces": scale.namespaces, "services": scale.services, "pods": scale.pods, "nodes": scale.nodes, "changes": scale.changes},
        "pod_json_bytes": {"written": pod_json_bytes, "served": served_pod_bytes},
        "setup_seconds": {"base": base_took.as_secs_f64(), "pods_and_slices": pods_took.as_secs_f64()},
        "istiod": istiod_bin.as_ref().map_or_else(|e| json!({"available": false, "reason": e}), |p| json!({"available": istiod_err.is_none(), "binary": p.display().to_string(), "version": ISTIO_VERSION, "error": istiod_err})),
        "figures": figures.iter().map(Figure::json).collect::<Vec<_>>(),
        "in_process_build": breakdown,
    });
    if full {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
        let out = target.join("bench");
        let _ = std::fs::create_dir_all(&out);
        let file = out.join("kube_source.json");
        std::fs::write(&file, serde_json::to_string_pretty(&report).unwrap_or_default()).expect("writing the report");
        println!("written to {}", file.display());
    } else {
        assert!(!changes.is_empty() || scale.changes == 0, "no endpoint change produced a snapshot");
    }
}
