//! Convergence benchmark: N simulated sidecars against an in-process standalone meshpilot.
//!
//! `cargo bench --bench convergence` prints the figures and writes them to
//! `target/bench/convergence.json`. Under `cargo test` (no `--bench` flag) it runs a tiny
//! smoke version so the code keeps compiling and working.
//!
//! Figures: time for all proxies to receive and ACK their initial config; time from a config
//! file write to every proxy ACKing the new version (a change affecting all proxies); and
//! time from an endpoint-only write to every proxy ACKing it (EDS-only push).

use std::path::Path;
use std::time::{Duration, Instant};

use meshpilot::app::standalone::{self, StandaloneSettings};
use meshpilot::app::Process;
use meshpilot::ingest::DebounceSettings;
use meshpilot::sim::{SimProxy, SimProxySpec};
use meshpilot::source::SourceSettings;
use meshpilot::xds::TypeUrl;

fn services(count: usize, endpoints: usize) -> String {
    (0..count)
        .map(|i| {
            let eps: Vec<String> = (0..endpoints).map(|e| format!("{{address: 10.{}.{}.{}}}", i / 250, i % 250, e + 1)).collect();
            format!(
                "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: svc-{i}, namespace: bench}}\nspec:\n  hosts: [svc-{i}.bench.svc.cluster.local]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{{number: 80, name: http, protocol: HTTP}}]\n  endpoints: [{}]\n---\n",
                eps.join(", ")
            )
        })
        .collect()
}

fn route(weight: u32) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: r, namespace: bench}}\nspec:\n  hosts: [svc-0.bench.svc.cluster.local]\n  http:\n  - route:\n    - destination: {{host: svc-0.bench.svc.cluster.local}}\n      weight: {weight}\n    - destination: {{host: svc-1.bench.svc.cluster.local}}\n      weight: {}\n",
        100 - weight
    )
}

fn write(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, dir.join(name)).expect("rename");
}

#[path = "../tests/common/ports.rs"]
#[allow(dead_code)]
mod ports;
use ports::free_addr;

async fn all_acked(
    proxies: &[SimProxy],
    timeout: Duration,
    done: impl Fn(&meshpilot::sim::SimState) -> bool,
) -> Duration {
    let start = Instant::now();
    for p in proxies {
        assert!(p.wait_for(timeout, &done).await, "a proxy did not converge: {:?}", p.state().types.keys());
    }
    start.elapsed()
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (proxies, service_count) = if full { (1000, 200) } else { (20, 10) };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(async move {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "services.yaml", &services(service_count, 3));
        write(dir.path(), "route.yaml", &route(90));
        let (xds, admin) = (free_addr(), free_addr());
        let settings = StandaloneSettings {
            sources: SourceSettings::config_dir(dir.path()),
            debounce: DebounceSettings::default(),
            xds_addr: xds,
            admin_addr: admin,
            admission: Default::default(),
            plaintext_xds: true,
            security: Default::default(),
            webhook: None,
        };
        // Dropping the trigger drains the server.
        let (stop, drain) = meshpilot::drain::new();
        let process = Process::new(meshpilot::telemetry::metrics::Registry::new(), "standalone", "test");
        tokio::spawn(standalone::run(settings, process, drain));
        tokio::time::sleep(Duration::from_millis(500)).await;

        let url = format!("http://{xds}");
        let started = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for i in 0..proxies {
            let spec = SimProxySpec::sidecar(
                &url,
                "bench",
                &format!("app-{}", i % 50),
                &format!("10.200.{}.{}", i / 250, i % 250),
            );
            set.spawn(async move { SimProxy::connect(spec).await });
        }
        let mut sims = Vec::new();
        while let Some(r) = set.join_next().await {
            sims.push(r.expect("join").expect("connect"));
        }
        let timeout = Duration::from_secs(120);
        all_acked(&sims, timeout, |s| s.types.len() == 4 && s.types.values().all(|t| t.acked_version == t.version))
            .await;
        let initial = started.elapsed();

        let t = Instant::now();
        write(dir.path(), "route.yaml", &route(10));
        all_acked(&sims, timeout, |s| s.types.get(&TypeUrl::Route).is_some_and(|t| t.acked_version == "1.2")).await;
        let config_push = t.elapsed();

        let t = Instant::now();
        write(dir.path(), "services.yaml", &services(service_count, 4));
        all_acked(&sims, timeout, |s| s.types.get(&TypeUrl::Endpoint).is_some_and(|t| t.acked_version == "1.3")).await;
        let eds_push = t.elapsed();
        drop(stop);

        let report = serde_json::json!({
            "proxies": proxies,
            "services": service_count,
            "initial_convergence_seconds": initial.as_secs_f64(),
            "config_push_convergence_seconds": config_push.as_secs_f64(),
            "endpoint_push_convergence_seconds": eds_push.as_secs_f64(),
            "note": "config and endpoint figures include the 100 ms debounce",
        });
        println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
        if full {
            let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
            let _ = std::fs::create_dir_all(&out);
            let _ = std::fs::write(out.join("convergence.json"), report.to_string());
            println!("written to target/bench/convergence.json");
        }
    });
}
