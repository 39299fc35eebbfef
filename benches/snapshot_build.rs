//! Snapshot build benchmark: the ingest builder's `apply` + `build` at Kubernetes scale.
//!
//! `cargo bench --bench snapshot_build` builds a state of N Services, 10N Pods and N
//! EndpointSlices (N = 1000) in 20 namespaces on 10 Nodes, with VirtualServices, DestinationRules
//! and ServiceEntries as files would give, then measures (min/median of 20 repetitions): the first
//! full build; one EndpointSlice change (one endpoint removed); one Pod label change; one Service
//! port change (a full registry build). It prints the figures and writes them to
//! `$CARGO_TARGET_DIR/bench/snapshot_build.json` (default `target/bench`). Under `cargo test` (no
//! `--bench` flag) it runs a tiny smoke version so the code keeps compiling and working.
//!
//! The "physical limit" of an endpoint change is the registry build of that one service alone
//! (one Service, its 10 Pods and its slice): whatever the design, the changed service's endpoint
//! list must be rebuilt. Each figure's `ratio_to_limit` is its median over that one.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meshpilot::config::parse::{parse_file, Document};
use meshpilot::config::ValidConfig;
use meshpilot::ingest::IngestBuilder;
use meshpilot::mesh::MeshConfig;
use meshpilot::registry::kubernetes::{
    KubeEndpointSlice, KubeNamespace, KubeNode, KubeObject, KubeObjects, KubePod, KubeService, KubeServicePort,
    ServiceType, SliceEndpoint, SlicePort, TargetPort,
};
use meshpilot::snapshot::Version;
use meshpilot::source::SourceEvent;

const NAMESPACES: usize = 20;
const NODES: usize = 10;
const PODS_PER_SERVICE: usize = 10;
/// The target for one endpoint change, in milliseconds.
const ENDPOINT_TARGET_MS: f64 = 5.0;

fn ns(i: usize) -> String {
    format!("ns-{}", i % NAMESPACES)
}

fn ip(service: usize, pod: usize) -> String {
    format!("10.{}.{}.{}", service / 250, service % 250, pod + 1)
}

fn service(i: usize, port: u16) -> KubeObject {
    KubeObject::Service(KubeService {
        name: format!("svc-{i}"),
        namespace: ns(i),
        labels: Default::default(),
        selector: Some([("app".to_string(), format!("svc-{i}"))].into()),
        service_type: ServiceType::ClusterIp,
        cluster_ips: vec![format!("10.96.{}.{}", i / 250, i % 250)],
        headless: false,
        external_name: None,
        ports: vec![KubeServicePort {
            name: "http".into(),
            port,
            protocol: "TCP".into(),
            app_protocol: None,
            target_port: Some(TargetPort::Number(8080)),
        }],
        export_to: Vec::new(),
    })
}

fn pod(i: usize, j: usize, version: &str) -> KubeObject {
    KubeObject::Pod(KubePod {
        name: format!("svc-{i}-{j}"),
        namespace: ns(i).into(),
        labels: Arc::new(
            [("app".to_string(), format!("svc-{i}")), ("version".to_string(), version.to_string())].into(),
        ),
        service_account: format!("svc-{i}").into(),
        ips: vec![ip(i, j)],
        node_name: format!("node-{}", j % NODES).into(),
        ready: true,
        terminating: false,
        named_ports: Arc::from(vec![("http".to_string(), 8080)]),
    })
}

fn slice(i: usize, pods: usize) -> KubeObject {
    KubeObject::EndpointSlice(KubeEndpointSlice {
        name: format!("svc-{i}-abcde"),
        namespace: ns(i),
        service_name: format!("svc-{i}"),
        address_type: "IPv4".into(),
        ports: vec![SlicePort { name: "http".into(), port: Some(8080), protocol: "TCP".into() }],
        endpoints: (0..pods)
            .map(|j| SliceEndpoint {
                addresses: vec![ip(i, j)],
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
                pod: Some(format!("svc-{i}-{j}")),
                node_name: Some(format!("node-{}", j % NODES).into()),
            })
            .collect(),
    })
}

fn cluster(services: usize) -> Vec<KubeObject> {
    let mut out = Vec::new();
    for n in 0..NAMESPACES {
        out.push(KubeObject::Namespace(KubeNamespace { name: ns(n), labels: Default::default() }));
    }
    for n in 0..NODES {
        out.push(KubeObject::Node(KubeNode {
            name: format!("node-{n}"),
            region: "eu-west-1".into(),
            zone: format!("eu-west-1{}", ["a", "b", "c"][n % 3]),
            subzone: String::new(),
        }));
    }
    for i in 0..services {
        out.push(service(i, 80));
        out.push(slice(i, PODS_PER_SERVICE));
        out.extend((0..PODS_PER_SERVICE).map(|j| pod(i, j, "v1")));
    }
    out
}

/// A VirtualService and DestinationRule for every tenth service, and a few ServiceEntries.
fn configs(services: usize) -> Vec<ValidConfig> {
    let mut yaml = String::new();
    for i in (0..services).step_by(10) {
        let (n, host) = (ns(i), format!("svc-{i}"));
        yaml.push_str(&format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {host}, namespace: {n}}}\nspec:\n  hosts: [{host}]\n  http:\n  - route:\n    - destination: {{host: {host}, subset: v1}}\n      weight: 90\n    - destination: {{host: {host}, subset: v2}}\n      weight: 10\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {host}, namespace: {n}}}\nspec:\n  host: {host}\n  subsets: [{{name: v1, labels: {{version: v1}}}}, {{name: v2, labels: {{version: v2}}}}]\n---\n"
        ));
    }
    for i in 0..services / 100 + 1 {
        yaml.push_str(&format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: ext-{i}, namespace: {}}}\nspec: {{hosts: [ext-{i}.example.com], location: MESH_EXTERNAL, resolution: DNS, ports: [{{number: 443, name: tls, protocol: TLS}}]}}\n---\n",
            ns(i)
        ));
    }
    parse_file("bench.yaml", &yaml)
        .into_iter()
        .filter_map(|d| match d {
            Document::Valid(o) => Some(Arc::new(o) as ValidConfig),
            _ => None,
        })
        .collect()
}

fn kube_event(objects: impl IntoIterator<Item = KubeObject>) -> SourceEvent {
    SourceEvent::Kube(objects.into_iter().map(|o| (o.key(), Some(Arc::new(o)))).collect())
}

/// Min and median of `samples`, in milliseconds.
fn stats(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    (
        samples.first().map(|d| ms(*d)).unwrap_or_default(),
        samples.get(samples.len() / 2).map(|d| ms(*d)).unwrap_or_default(),
    )
}

struct Bench {
    builder: IngestBuilder,
    seq: u64,
}

impl Bench {
    /// Applies `events` and builds the next snapshot; returns the time both took.
    fn step(&mut self, events: Vec<SourceEvent>) -> Duration {
        self.seq += 1;
        let start = Instant::now();
        let changes = self.builder.apply(events);
        let snapshot = self.builder.build(Version::new(1, self.seq), changes);
        let took = start.elapsed();
        std::hint::black_box(snapshot);
        took
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (services, reps) = if full { (1000, 20) } else { (20, 2) };
    let objects = cluster(services);
    let configs = configs(services);

    // The first full build (a fresh builder each time).
    let mut first = Vec::new();
    let mut bench = None;
    for _ in 0..reps.min(5) {
        let mut b = Bench { builder: IngestBuilder::default(), seq: 0 };
        let config_event = SourceEvent::Config(configs.iter().map(|c| (c.key.clone(), Some(c.clone()))).collect());
        first.push(b.step(vec![config_event, kube_event(objects.clone())]));
        bench = Some(b);
    }
    let Some(mut bench) = bench else { return };

    // One endpoint removed from one service's slice (a different service each time).
    let slice_change: Vec<Duration> =
        (0..reps).map(|r| bench.step(vec![kube_event([slice(r, PODS_PER_SERVICE - 1)])])).collect();
    let last = bench.builder.last().cloned();
    if let Some(s) = &last {
        assert!(s.changes.endpoints_only(), "a slice change is an endpoint change: {:?}", s.changes);
    }
    // One Pod's labels changed.
    let pod_change: Vec<Duration> =
        (0..reps).map(|r| bench.step(vec![kube_event([pod(r + reps, 0, &format!("v2-{r}"))])])).collect();
    // One Service's port changed: the service definition changes, a full registry build.
    let service_change: Vec<Duration> = (0..reps).map(|r| bench.step(vec![kube_event([service(r, 81)])])).collect();

    // The physical limit: the registry of the one changed service alone.
    let mut alone = KubeObjects::new();
    for o in
        [service(0, 80), slice(0, PODS_PER_SERVICE)].into_iter().chain((0..PODS_PER_SERVICE).map(|j| pod(0, j, "v1")))
    {
        alone.insert(o.key(), Arc::new(o));
    }
    let mesh = MeshConfig::default();
    let limit: Vec<Duration> = (0..reps.max(20))
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(meshpilot::registry::build_registry(std::iter::empty(), &alone, &mesh));
            start.elapsed()
        })
        .collect();
    let (_, limit_median) = stats(limit.clone());

    let figure = |name: &str, samples: Vec<Duration>, target: Option<f64>| {
        let (min, median) = stats(samples);
        println!(
            "{name:<28} min {min:>9.3} ms  median {median:>9.3} ms  limit x{:>8.1}{}",
            median / limit_median,
            target.map(|t| format!("  target <= {t} ms")).unwrap_or_default()
        );
        serde_json::json!({
            "min_ms": min, "median_ms": median, "target_ms": target,
            "ratio_to_limit": median / limit_median,
        })
    };
    println!(
        "snapshot build: {services} services, {} pods, {services} slices, {} configs",
        services * PODS_PER_SERVICE,
        configs.len()
    );
    let report = serde_json::json!({
        "services": services,
        "pods": services * PODS_PER_SERVICE,
        "endpoint_slices": services,
        "configs": configs.len(),
        "repetitions": reps,
        "first_full_build": figure("first full build", first, None),
        "endpoint_slice_change": figure("endpoint slice change", slice_change, Some(ENDPOINT_TARGET_MS)),
        "pod_label_change": figure("pod label change", pod_change, Some(ENDPOINT_TARGET_MS)),
        "service_port_change": figure("service port change (full)", service_change, None),
        "limit_one_service_registry": figure("limit: one service alone", limit, None),
        "note": "each figure is IngestBuilder::apply + build; the limit is build_registry of the changed service's own objects",
    });
    if full {
        let dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
            .join("bench");
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("snapshot_build.json");
        match std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap_or_default()) {
            Ok(()) => println!("written to {}", path.display()),
            Err(e) => println!("not written to {}: {e}", path.display()),
        }
    }
}
