//! The scale-out system end to end on 127.0.0.1: a real etcd, three `meshpilot ingest` nodes (one
//! leader, lease TTL 2 s), `meshpilot frontend`s behind a real Envoy load balancer hashing the
//! `x-meshpilot-proxy-key` header (MAGLEV, as the frontends compute ownership; endpoints'
//! `hash_key` = member ids), real Envoys (an
//! ingress gateway and a sidecar, routing to [`Backend`]s) and simulated proxies.
//!
//! Envoys send their proxy key as gRPC initial metadata. `SimProxy` cannot add metadata, so the
//! load balancer has one extra listener per simulated proxy key that sets the header before
//! routing (Envoy's `header_mutation` filter): simulated proxies go through the same hash as the
//! Envoys, and the frontends must report every one of them as owned. A simulated proxy's key is
//! `namespace/app` (no service account), so proxies are grouped in a few apps per namespace, chosen
//! so that every frontend owns some.
//!
//! The tests are heavy: run them one at a time (`--test-threads=1`); they also take a lock so
//! that two never overlap when run with more threads.

mod common;
mod etcd_support;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_support::Etcd;
use meshpilot::cluster::ownership::{Ownership, ProxyHashing};
use meshpilot::sim::{SimProxy, SimProxySpec, SimState};
use meshpilot::snapshot::Version;
use meshpilot::xds::TypeUrl;
use serde_json::{json, Value};
use support::cluster::*;
use support::mesh::{
    backend_of, dedent, destination_rule, documents, dynamic_route_config, endpoint_ports, gateway, sidecar_resource,
    sync_problem, write_atomic, Ingress,
};
use support::*;

/// Every wait in these tests.
const TIMEOUT: Duration = Duration::from_secs(60);
/// Lease TTL of the ingest nodes and the frontends (seconds): failover within a few seconds.
const LEASE_TTL: u64 = 2;
/// Quiet period of the ingest nodes' debounce: short, so that the edit stream of
/// `leader_kill_during_edits` (one edit every 80 ms) becomes a stream of snapshots.
const DEBOUNCE: &str = "30ms";
/// Host of the gateway's VirtualService.
const HOST: &str = "shop.example.com";
/// Namespace of the services, the sidecar and the VirtualServices.
const SHOP: &str = "shop";
/// Namespaces of the simulated proxies.
const SIM_NAMESPACES: [&str; 3] = ["team-a", "team-b", "team-c"];
const GATEWAY_ID: &str = "router~127.0.0.1~gw-1.istio-system~istio-system.svc.cluster.local";
const SIDECAR_ID: &str = "sidecar~127.0.0.1~client-1.shop~shop.svc.cluster.local";

/// Held by each test: two clusters at once would starve each other on 2 cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---------------------------------------------------------------------------
// Config
// ---------------------------------------------------------------------------

/// The backends of `reviews.shop`: two of version v1, one of v2.
struct Backends {
    v1a: Backend,
    v1b: Backend,
    v2: Backend,
}

impl Backends {
    fn start() -> Backends {
        Backends { v1a: Backend::new("reviews-v1a"), v1b: Backend::new("reviews-v1b"), v2: Backend::new("reviews-v2") }
    }
}

/// What the edited files say: the routes' name and weights, and which backends are endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MeshState {
    /// Name of the one HTTP route of both VirtualServices.
    route: String,
    /// Weights of subsets v1 and v2.
    weights: (u32, u32),
    /// Endpoints of reviews: v1a, v1b, v2.
    endpoints: (bool, bool, bool),
}

impl MeshState {
    /// All traffic to v1, only v1a an endpoint.
    fn initial() -> MeshState {
        MeshState { route: "initial".into(), weights: (100, 0), endpoints: (true, false, false) }
    }
}

/// `gateway.yaml`: Gateway `shop/gw` on the gateway port and Sidecar `shop/default` (egress on the
/// sidecar port). `services.yaml`: ServiceEntry and DestinationRule of `reviews.shop` (service
/// port = the sidecar port). `routes.yaml`: the gateway's VirtualService for [`HOST`] and the mesh
/// VirtualService of reviews, one weighted route each. `teams.yaml`: a namespace-private
/// ServiceEntry in each simulated proxy namespace.
struct MeshFiles {
    gw_port: u16,
    sidecar_port: u16,
}

impl MeshFiles {
    fn write_all(&self, dir: &Path, backends: &Backends, state: &MeshState) {
        write_atomic(dir, "gateway.yaml", &documents(&[gateway(self.gw_port), sidecar_resource(self.sidecar_port)]));
        write_atomic(dir, "teams.yaml", &teams_yaml());
        self.write_services(dir, backends, state);
        self.write_routes(dir, state);
    }

    fn write_services(&self, dir: &Path, b: &Backends, state: &MeshState) {
        let (a, bb, c) = state.endpoints;
        let mut eps: Vec<(&Backend, &str)> = Vec::new();
        if a {
            eps.push((&b.v1a, "v1"));
        }
        if bb {
            eps.push((&b.v1b, "v1"));
        }
        if c {
            eps.push((&b.v2, "v2"));
        }
        let text = documents(&[
            support::mesh::service_entry("reviews", self.sidecar_port, &eps),
            destination_rule("reviews", &["v1", "v2"], None),
        ]);
        write_atomic(dir, "services.yaml", &text);
    }

    fn write_routes(&self, dir: &Path, state: &MeshState) {
        write_atomic(dir, "routes.yaml", &routes_yaml(state));
    }
}

fn routes_yaml(state: &MeshState) -> String {
    let http = format!(
        "  http:\n  - name: {}\n    route:\n    - destination: {{host: reviews.{SHOP}.svc.cluster.local, subset: v1}}\n      \
         weight: {}\n    - destination: {{host: reviews.{SHOP}.svc.cluster.local, subset: v2}}\n      weight: {}\n",
        state.route, state.weights.0, state.weights.1
    );
    let gw = format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: shop, namespace: {SHOP}}}\nspec:\n  \
         hosts: [{HOST}]\n  gateways: [{SHOP}/gw]\n{http}"
    );
    let mesh = format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: reviews, namespace: {SHOP}}}\nspec:\n  \
         hosts: [reviews.{SHOP}.svc.cluster.local]\n{http}"
    );
    documents(&[gw, mesh])
}

fn teams_yaml() -> String {
    let docs: Vec<String> = SIM_NAMESPACES
        .iter()
        .enumerate()
        .map(|(i, ns)| {
            dedent(&format!(
                r#"
                apiVersion: networking.istio.io/v1
                kind: ServiceEntry
                metadata: {{name: svc, namespace: {ns}}}
                spec:
                  hosts: [svc.{ns}.svc.cluster.local]
                  exportTo: ["."]
                  location: MESH_INTERNAL
                  resolution: STATIC
                  ports: [{{number: 8080, name: http, protocol: HTTP}}]
                  endpoints: [{{address: 10.200.{i}.1}}, {{address: 10.200.{i}.2}}]
                "#
            ))
        })
        .collect();
    documents(&docs)
}

// ---------------------------------------------------------------------------
// Proxies
// ---------------------------------------------------------------------------

/// The load balancer's policy: the one the frontends compute ownership with (they use
/// `ProxyHashing::default()`, Maglev).
const LB_POLICY: LbPolicy = LbPolicy::Maglev;

/// The frontend the load balancer sends `key` to while all of `ids` are healthy ([`LB_POLICY`]
/// over the ids; `tests/ring_vs_envoy.rs` checks the crate's tables against Envoy's). Used to
/// choose keys that spread over the frontends; where proxies land is then asked of the load
/// balancer itself ([`XdsLoadBalancer::route_of`]).
fn lb_owner(ids: &[String], key: &str) -> String {
    let mut sorted = ids.to_vec();
    sorted.sort();
    let hashing = match LB_POLICY {
        LbPolicy::Maglev => ProxyHashing::Maglev,
        LbPolicy::RingHash => ProxyHashing::RingHash,
    };
    Ownership::new(sorted, hashing).unwrap().owner(key).unwrap().to_string()
}

/// The first `{prefix}-N` such that `{ns}/{prefix}-N` is owned by `owner`.
fn name_owned_by(ids: &[String], ns: &str, prefix: &str, owner: &str) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|name| lb_owner(ids, &format!("{ns}/{name}")) == owner)
        .unwrap_or_else(|| panic!("no {prefix}-N in {ns} owned by {owner}"))
}

/// A group of simulated proxies sharing a proxy key `namespace/app`.
#[derive(Debug, Clone)]
struct SimKey {
    namespace: String,
    app: String,
    /// The frontend the load balancer's hash gives this key.
    owner: String,
}

impl SimKey {
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.app)
    }
}

/// One simulated proxy and how it was made.
struct Sim {
    spec: SimProxySpec,
    key: String,
    proxy: SimProxy,
}

fn sim_spec(xds_url: &str, key: &SimKey, index: usize) -> SimProxySpec {
    let ns = &key.namespace;
    let ip = format!("10.{}.{}.{}", 100 + index / 65536 % 100, index / 256 % 256, index % 256);
    let mut spec = SimProxySpec::sidecar(xds_url, ns, &format!("sim-{index}"), &ip);
    spec.labels = [("app".to_string(), key.app.clone())].into_iter().collect();
    spec
}

/// Connects a simulated proxy, retrying while the listener comes up.
async fn connect_sim(spec: SimProxySpec) -> SimProxy {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match SimProxy::connect(spec.clone()).await {
            Ok(p) => return p,
            Err(e) => {
                assert!(Instant::now() < deadline, "simulated proxy {} could not connect: {e}", spec.node_id);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Why a simulated proxy has not converged on `at_least` (None when it has: connected, all four
/// types received and acked, some type acked at `at_least` or later).
fn sim_problem(state: &SimState, at_least: Option<Version>) -> Option<String> {
    if !state.connected {
        return Some(format!("disconnected: {:?}", state.error));
    }
    if state.types.len() != 4 {
        return Some(format!("has types {:?}", state.types.keys().collect::<Vec<_>>()));
    }
    if let Some((t, s)) = state.types.iter().find(|(_, s)| s.acked_version != s.version) {
        return Some(format!("{t:?}: received {} acked {}", s.version, s.acked_version));
    }
    if let Some(v) = at_least {
        let newest = state.types.values().filter_map(|s| s.acked_version.parse::<Version>().ok()).max();
        if newest.is_none_or(|n| n < v) {
            return Some(format!("newest acked {newest:?} < {v}"));
        }
    }
    None
}

/// Resource names per type a simulated proxy holds.
fn sim_names(state: &SimState) -> BTreeMap<TypeUrl, BTreeSet<String>> {
    state.types.iter().map(|(t, s)| (*t, s.names.clone())).collect()
}

/// Polls until every simulated proxy converged on `at_least`; panics with the first problems.
async fn wait_sims(sims: &[Sim], at_least: Option<Version>) {
    let mut problems = Vec::new();
    let ok = wait_until(TIMEOUT, async || {
        problems = sims
            .iter()
            .filter_map(|s| sim_problem(&s.proxy.state(), at_least).map(|p| format!("{}: {p}", s.spec.node_id)))
            .collect();
        problems.is_empty()
    })
    .await;
    assert!(
        ok,
        "{} of {} simulated proxies not converged on {at_least:?} after {TIMEOUT:?}; first: {:#?}",
        problems.len(),
        sims.len(),
        &problems[..problems.len().min(10)]
    );
}

/// Node metadata of the gateway Envoy.
fn gateway_metadata(sa: &str) -> Value {
    json!({"NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}, "SERVICE_ACCOUNT": sa})
}

/// Node metadata of the sidecar Envoy (no interception: the egress listener binds 127.0.0.1).
fn sidecar_metadata(sa: &str) -> Value {
    json!({"NAMESPACE": SHOP, "LABELS": {"app": "client"}, "INTERCEPTION_MODE": "NONE", "SERVICE_ACCOUNT": sa})
}

// ---------------------------------------------------------------------------
// The cluster
// ---------------------------------------------------------------------------

struct Options {
    frontends: usize,
    /// Apps per namespace per frontend (each app one key, one load balancer listener).
    apps_per_frontend: usize,
    /// Simulated proxies per key.
    sims_per_key: usize,
}

/// etcd, 3 ingest nodes, the frontends behind the load balancer, the gateway and sidecar Envoys
/// (through the load balancer, the gateway's key owned by the first frontend, the sidecar's by the
/// second) and simulated proxies (through the load balancer's keyed listeners). Fields drop in
/// order: proxies first, etcd last.
struct Cluster {
    sims: Vec<Sim>,
    gateway: Envoy,
    sidecar: Envoy,
    lb: XdsLoadBalancer,
    frontends: Vec<FrontendNode>,
    ingests: Vec<IngestNode>,
    etcd: Etcd,
    files: MeshFiles,
    backends: Backends,
    config: tempfile::TempDir,
    keys: Vec<SimKey>,
    gateway_sa: String,
    sidecar_sa: String,
}

impl Cluster {
    async fn start(opts: Options) -> Cluster {
        let started = Instant::now();
        let backends = Backends::start();
        let files = MeshFiles { gw_port: free_port(), sidecar_port: free_port() };
        let config = temp_dir_with(&[]);
        files.write_all(config.path(), &backends, &MeshState::initial());

        let etcd = Etcd::start().await;
        let ingests: Vec<IngestNode> = (0..3)
            .map(|i| {
                IngestNode::builder(&etcd.endpoint(), config.path())
                    .id(&format!("ingest-{i}"))
                    .lease_ttl(LEASE_TTL)
                    .debounce_after(DEBOUNCE)
                    .start()
            })
            .collect();
        let frontends: Vec<FrontendNode> = (0..opts.frontends)
            .map(|i| {
                FrontendNode::builder(&etcd.endpoint())
                    .id(&format!("fe-{}", (b'a' + i as u8) as char))
                    .lease_ttl(LEASE_TTL)
                    .start()
            })
            .collect();
        for n in &ingests {
            n.wait_ready(STARTUP_TIMEOUT).await;
        }
        wait_leader(&ingests, TIMEOUT, |_| true).await;
        for f in &frontends {
            f.wait_ready(STARTUP_TIMEOUT).await;
        }
        let ids: Vec<String> = frontends.iter().map(|f| f.id().to_string()).collect();
        wait_members(&frontends, ids.len()).await;

        let mut keys = Vec::new();
        for ns in SIM_NAMESPACES {
            for owner in &ids {
                let mut taken = 0;
                for i in 0.. {
                    let app = format!("app-{i}");
                    if lb_owner(&ids, &format!("{ns}/{app}")) == *owner {
                        keys.push(SimKey { namespace: ns.into(), app, owner: owner.clone() });
                        taken += 1;
                        if taken == opts.apps_per_frontend {
                            break;
                        }
                    }
                }
            }
        }
        let mut lb = XdsLoadBalancer::builder().policy(LB_POLICY);
        for f in &frontends {
            lb = lb.frontend(f.id(), f.xds_addr());
        }
        for k in &keys {
            lb = lb.keyed_listener(&k.key());
        }
        let lb = lb.start().await;

        let gateway_sa = name_owned_by(&ids, "istio-system", "gateway-sa", &ids[0]);
        let sidecar_sa = name_owned_by(&ids, SHOP, "client-sa", &ids[1 % ids.len()]);
        let gateway = Envoy::builder(GATEWAY_ID, lb.addr())
            .metadata(gateway_metadata(&gateway_sa))
            .bootstrap_patch(proxy_key_patch(&format!("istio-system/{gateway_sa}")))
            .start();
        let sidecar = Envoy::builder(SIDECAR_ID, lb.addr())
            .metadata(sidecar_metadata(&sidecar_sa))
            .bootstrap_patch(proxy_key_patch(&format!("{SHOP}/{sidecar_sa}")))
            .start();

        let mut tasks = tokio::task::JoinSet::new();
        let mut index = 0;
        for k in &keys {
            let url = lb.keyed_url(&k.key());
            for _ in 0..opts.sims_per_key {
                let spec = sim_spec(&url, k, index);
                let key = k.key();
                index += 1;
                tasks.spawn(async move { Sim { spec: spec.clone(), key, proxy: connect_sim(spec).await } });
            }
        }
        let mut sims = Vec::new();
        while let Some(sim) = tasks.join_next().await {
            sims.push(sim.expect("connect task"));
        }
        sims.sort_by(|a, b| a.spec.node_id.cmp(&b.spec.node_id));
        gateway.wait_ready(STARTUP_TIMEOUT).await;
        sidecar.wait_ready(STARTUP_TIMEOUT).await;
        eprintln!(
            "cluster up in {:?}: {} frontends, {} keys, {} simulated proxies",
            started.elapsed(),
            frontends.len(),
            keys.len(),
            sims.len()
        );
        Cluster {
            sims,
            gateway,
            sidecar,
            lb,
            frontends,
            ingests,
            etcd,
            files,
            backends,
            config,
            keys,
            gateway_sa,
            sidecar_sa,
        }
    }

    fn dir(&self) -> &Path {
        self.config.path()
    }

    fn gateway_ingress(&self) -> Ingress {
        Ingress::new(self.files.gw_port, HOST)
    }

    fn sidecar_ingress(&self) -> Ingress {
        Ingress::new(self.files.sidecar_port, &format!("reviews.{SHOP}.svc.cluster.local"))
    }

    fn frontend_ids(&self) -> Vec<String> {
        self.frontends.iter().map(|f| f.id().to_string()).collect()
    }

    /// The current leader (index, term).
    async fn leader(&self) -> (usize, u64) {
        wait_leader(&self.ingests, TIMEOUT, |_| true).await
    }

    /// Writes `state` and waits until the leader's snapshot holds it (its route name in
    /// `/debug/configz`); returns that snapshot's version.
    async fn apply(&self, state: &MeshState) -> Version {
        self.files.write_services(self.dir(), &self.backends, state);
        self.files.write_routes(self.dir(), state);
        self.wait_leader_has(state).await
    }

    /// Polls the leader's `/debug/configz` until it serves `state` (route name and endpoint
    /// count); returns its version.
    async fn wait_leader_has(&self, state: &MeshState) -> Version {
        let want_endpoints = [state.endpoints.0, state.endpoints.1, state.endpoints.2].iter().filter(|b| **b).count();
        let mut last = String::new();
        let mut version = None;
        let ok = wait_until(TIMEOUT, async || {
            let Some((i, term)) = current_leader(&self.ingests).await else {
                last = "no leader".into();
                return false;
            };
            let Some(configz) = self.ingests[i].try_admin_json("/debug/configz").await else { return false };
            let Some(v) = configz["version"].as_str().and_then(|s| s.parse::<Version>().ok()) else { return false };
            let configs = configz["configs"].as_array().cloned().unwrap_or_default();
            let find = |kind: &str, name: &str| {
                configs.iter().find(|c| c["kind"] == kind && c["name"] == name && c["namespace"] == SHOP).cloned()
            };
            let route_ok = ["shop", "reviews"].iter().all(|vs| {
                find("VirtualService", vs).is_some_and(|c| {
                    c["spec"]["http"][0]["name"] == state.route.as_str()
                        && c["spec"]["http"][0]["route"][0]["weight"] == state.weights.0
                        && c["spec"]["http"][0]["route"][1]["weight"] == state.weights.1
                })
            });
            let endpoints = find("ServiceEntry", "reviews")
                .and_then(|c| c["spec"]["endpoints"].as_array().map(Vec::len))
                .unwrap_or(usize::MAX);
            last = format!("leader {} term {term} version {v}: routes ok {route_ok}, {endpoints} endpoints", i);
            if route_ok && endpoints == want_endpoints && v.term == term {
                version = Some(v);
                return true;
            }
            false
        })
        .await;
        assert!(ok, "the leader did not build {state:?} within {TIMEOUT:?}; last: {last}");
        version.unwrap()
    }

    /// Polls until every running frontend holds `v` or later.
    async fn wait_frontends_hold(&self, v: Version) {
        for f in self.frontends.iter().filter(|f| f.is_running()) {
            let mut held = None;
            let ok = f
                .wait_for(TIMEOUT, async |_| {
                    held = f.held().await;
                    held.is_some_and(|h| h >= v)
                })
                .await;
            assert!(ok, "{} holds {held:?}, not {v} or later, after {TIMEOUT:?}", f.id());
        }
    }

    /// Polls until each Envoy is connected to exactly one running frontend and in sync there
    /// (every type acked as sent, snapshot `v` or later processed). Returns the frontend of each
    /// (gateway, sidecar).
    async fn wait_envoys_synced(&self, v: Version) -> (String, String) {
        let mut problem = String::new();
        let mut found = (String::new(), String::new());
        let ok = wait_until(TIMEOUT, async || {
            let mut where_ = Vec::new();
            for id in [GATEWAY_ID, SIDECAR_ID] {
                let mut on = Vec::new();
                for f in self.frontends.iter().filter(|f| f.is_running()) {
                    let Some(syncz) = f.try_admin_json("/debug/syncz").await else { continue };
                    let Some(conn) = syncz.as_array().and_then(|a| a.iter().find(|c| c["proxy"]["id"] == id)).cloned()
                    else {
                        continue;
                    };
                    if let Some(p) = sync_problem(&syncz, id) {
                        problem = format!("{}: {p}", f.id());
                        return false;
                    }
                    let sv = conn["snapshot_version"].as_str().and_then(|s| s.parse::<Version>().ok());
                    if sv.is_none_or(|sv| sv < v) {
                        problem = format!("{id} on {} processed {sv:?}, not {v}", f.id());
                        return false;
                    }
                    on.push(f.id().to_string());
                }
                if on.len() != 1 {
                    problem = format!("{id} connected to {on:?}");
                    return false;
                }
                where_.push(on.remove(0));
            }
            found = (where_[0].clone(), where_[1].clone());
            true
        })
        .await;
        assert!(ok, "Envoys not in sync on {v} after {TIMEOUT:?}: {problem}");
        found
    }

    /// Everything on `v` or later: frontends, Envoys, simulated proxies.
    async fn wait_converged(&self, v: Version) {
        self.wait_frontends_hold(v).await;
        self.wait_envoys_synced(v).await;
        wait_sims(&self.sims, Some(v)).await;
    }

    /// Asserts every running frontend reports its proxies as owned (none foreign) and that
    /// together they hold every proxy of the cluster exactly once, each on the frontend the load
    /// balancer routes its key to (asked through its probe listener).
    async fn assert_ownership_agrees(&self) {
        let ids = self.frontend_ids();
        let mut routes: BTreeMap<String, String> = BTreeMap::new();
        let mut keys: Vec<(String, String)> =
            self.sims.iter().map(|s| (s.spec.node_id.clone(), s.key.clone())).collect();
        keys.push((GATEWAY_ID.into(), format!("istio-system/{}", self.gateway_sa)));
        keys.push((SIDECAR_ID.into(), format!("{SHOP}/{}", self.sidecar_sa)));
        let mut expected: BTreeMap<String, String> = BTreeMap::new();
        for (proxy, key) in keys {
            if !routes.contains_key(&key) {
                let to =
                    self.lb.route_of(&key).await.unwrap_or_else(|| panic!("the load balancer routes {key} nowhere"));
                routes.insert(key.clone(), to);
            }
            expected.insert(proxy, routes[&key].clone());
        }
        let mut seen: BTreeMap<String, String> = BTreeMap::new();
        let mut last = String::new();
        // The ownership summary is recomputed every second: poll until it counts every proxy.
        let ok = wait_until(TIMEOUT, async || {
            seen.clear();
            let mut summaries = Vec::new();
            for f in &self.frontends {
                let node = f.node().await;
                let here = f.connected_proxies().await;
                let o = &node["ownership"];
                summaries.push(format!(
                    "{}: members {} owned {} foreign {} (connected {}) sample {}",
                    f.id(),
                    o["members"],
                    o["owned"],
                    o["foreign"],
                    here.len(),
                    o["foreign_sample"]
                ));
                if o["members"] != ids.len() || o["foreign"] != 0 || o["owned"] != here.len() {
                    last = summaries.join("\n");
                    return false;
                }
                for p in here {
                    seen.insert(p, f.id().to_string());
                }
            }
            last = summaries.join("\n");
            seen.len() == expected.len()
        })
        .await;
        assert!(ok, "frontends do not report every proxy as owned:\n{last}");
        let misplaced: Vec<String> = expected
            .iter()
            .filter(|(p, owner)| seen.get(*p) != Some(*owner))
            .map(|(p, owner)| format!("{p}: routed to {owner}, connected to {:?}", seen.get(p)))
            .collect();
        assert!(misplaced.is_empty(), "proxies not where the load balancer routes:\n{}", misplaced.join("\n"));
        for id in &ids {
            assert!(seen.values().any(|o| o == id), "frontend {id} got no proxy: {seen:?}");
        }
    }
}

/// Polls until every running frontend is registered and sees `n` members.
async fn wait_members(frontends: &[FrontendNode], n: usize) {
    for f in frontends.iter().filter(|f| f.is_running()) {
        let mut last = Value::Null;
        let ok = f
            .wait_for(TIMEOUT, async |_| {
                last = f.try_node().await.unwrap_or(Value::Null);
                last["registered"] == true && last["ownership"]["members"] == n
            })
            .await;
        assert!(ok, "{} not registered with {n} members after {TIMEOUT:?}: {last:#}", f.id());
    }
}

// ---------------------------------------------------------------------------
// Traffic and monitors
// ---------------------------------------------------------------------------

/// Requests sent in a loop (one at a time, every 10 ms) through a proxy listener, counting
/// answers from a backend and everything else.
struct Traffic {
    what: String,
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Traffic {
    fn start(what: &str, ingress: Ingress) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let task = {
            let (stop, ok, failures) = (stop.clone(), ok.clone(), failures.clone());
            tokio::spawn(async move {
                let t0 = Instant::now();
                while !stop.load(Ordering::SeqCst) {
                    match ingress.try_get("/", &[]).await {
                        Ok(r) if backend_of(&r).is_some() => {
                            ok.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(r) => failures.lock().unwrap().push(format!(
                            "at {:?}: status {} body {:?}",
                            t0.elapsed(),
                            r.status,
                            r.body.chars().take(200).collect::<String>()
                        )),
                        Err(e) => failures.lock().unwrap().push(format!("at {:?}: {e:?}", t0.elapsed())),
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        };
        Traffic { what: what.to_string(), stop, ok, failures, task }
    }

    fn ok(&self) -> u64 {
        self.ok.load(Ordering::SeqCst)
    }

    /// Waits until `n` more requests succeeded (the loop is running and healthy).
    async fn wait_progress(&self, n: u64) {
        let target = self.ok() + n;
        assert!(
            wait_until(TIMEOUT, async || self.ok() >= target).await,
            "{}: no progress ({} ok, failures {:?})",
            self.what,
            self.ok(),
            self.failures.lock().unwrap()
        );
    }

    /// Stops the loop and asserts nothing failed and at least `min_ok` requests succeeded.
    async fn finish(self, min_ok: u64) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        let _ = (&mut { self.task }).await;
        let failures = self.failures.lock().unwrap().clone();
        let ok = self.ok.load(Ordering::SeqCst);
        assert!(
            failures.is_empty(),
            "{}: {} of {} requests failed: {:#?}",
            self.what,
            failures.len(),
            ok + failures.len() as u64,
            &failures[..failures.len().min(20)]
        );
        assert!(ok >= min_ok, "{}: only {ok} requests succeeded", self.what);
        eprintln!("{}: {ok} requests, none failed", self.what);
        ok
    }
}

/// Polls each frontend's `/debug/node` (`held`) and `/metrics` (`meshpilot_snapshot_leader_term`)
/// every 100 ms, recording violations of monotonicity: a frontend must never go back to an older
/// snapshot or term.
struct TermMonitor {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(Vec<String>, usize)>,
}

impl TermMonitor {
    fn start(frontends: &[FrontendNode]) -> TermMonitor {
        let stop = Arc::new(AtomicBool::new(false));
        let targets: Vec<(String, String)> = frontends.iter().map(|f| (f.id().to_string(), f.admin_url())).collect();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build().unwrap();
                let mut highest: BTreeMap<String, (Version, f64)> = BTreeMap::new();
                let mut violations = Vec::new();
                let mut samples = 0;
                while !stop.load(Ordering::SeqCst) {
                    for (id, url) in &targets {
                        let held = async {
                            let node: Value =
                                client.get(format!("{url}/debug/node")).send().await.ok()?.json().await.ok()?;
                            node["held"].as_str()?.parse::<Version>().ok()
                        }
                        .await;
                        let term = async {
                            let text = client.get(format!("{url}/metrics")).send().await.ok()?.text().await.ok()?;
                            metric_value(&text, "meshpilot_snapshot_leader_term")
                        }
                        .await;
                        let (Some(held), Some(term)) = (held, term) else { continue };
                        samples += 1;
                        let entry = highest.entry(id.clone()).or_insert((held, term));
                        if held < entry.0 {
                            violations.push(format!("{id}: held {held} after {}", entry.0));
                        }
                        if term < entry.1 {
                            violations.push(format!("{id}: followed term {term} after {}", entry.1));
                        }
                        *entry = (entry.0.max(held), entry.1.max(term));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                (violations, samples)
            })
        };
        TermMonitor { stop, task }
    }

    async fn finish(self) {
        self.stop.store(true, Ordering::SeqCst);
        let (violations, samples) = self.task.await.expect("monitor task");
        assert!(samples > 10, "the term monitor took only {samples} samples");
        assert!(violations.is_empty(), "frontends went back in version or term: {violations:#?}");
    }
}

// ---------------------------------------------------------------------------
// Config dumps
// ---------------------------------------------------------------------------

fn sorted_by_name(items: Vec<Value>, name: impl Fn(&Value) -> String) -> Value {
    let mut items = items;
    items.sort_by_key(|i| name(i));
    Value::Array(items)
}

/// The dynamic xDS resources an Envoy holds, without versions and timestamps: active clusters,
/// route configurations, listeners (active state) and endpoint assignments, each sorted by name.
fn dynamic_resources(dump: &Value) -> Value {
    let list = |section: &str, list: &str, inner: &[&str]| -> Vec<Value> {
        dump_section(dump, section)
            .and_then(|s| s[list].as_array())
            .into_iter()
            .flatten()
            .map(|item| {
                let mut v = item;
                for p in inner {
                    v = &v[*p];
                }
                v.clone()
            })
            .collect()
    };
    json!({
        "clusters": sorted_by_name(list("ClustersConfigDump", "dynamic_active_clusters", &["cluster"]), |c| c["name"].to_string()),
        "routes": sorted_by_name(list("RoutesConfigDump", "dynamic_route_configs", &["route_config"]), |r| r["name"].to_string()),
        "listeners": sorted_by_name(list("ListenersConfigDump", "dynamic_listeners", &["active_state", "listener"]), |l| l["name"].to_string()),
        "endpoints": sorted_by_name(list("EndpointsConfigDump", "dynamic_endpoint_configs", &["endpoint_config"]), |e| e["cluster_name"].to_string()),
    })
}

/// Paths where `a` and `b` differ (at most `limit`).
fn json_diff(a: &Value, b: &Value, path: &str, out: &mut Vec<String>, limit: usize) {
    if out.len() >= limit {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                json_diff(
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    &format!("{path}.{k}"),
                    out,
                    limit,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                json_diff(p, q, &format!("{path}[{i}]"), out, limit);
            }
        }
        _ if a != b => {
            let short = |v: &Value| v.to_string().chars().take(300).collect::<String>();
            out.push(format!("{path}: {} != {}", short(a), short(b)));
        }
        _ => {}
    }
}

/// Asserts two Envoys hold the same dynamic resources.
fn assert_same_dynamic_config(what: &str, got: &Value, want: &Value) {
    let (got, want) = (dynamic_resources(got), dynamic_resources(want));
    for part in ["clusters", "routes", "listeners", "endpoints"] {
        assert!(
            want[part].as_array().is_some_and(|a| !a.is_empty()),
            "{what}: the reference Envoy has no {part}: {want:#}"
        );
    }
    let mut diffs = Vec::new();
    json_diff(&got, &want, "", &mut diffs, 30);
    assert!(
        diffs.is_empty(),
        "{what}: config differs from a fresh Envoy on a standalone meshpilot:\n{}",
        diffs.join("\n")
    );
}

// ---------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------

/// ≥ 500 simulated proxies over three namespaces and two real Envoys, all through the load
/// balancer: everything converges; then a change (a new endpoint for reviews, and both
/// VirtualServices routing to it) reaches every proxy, and traffic follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_change_reaches_every_proxy() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let c = Cluster::start(Options { frontends: 2, apps_per_frontend: 1, sims_per_key: 84 }).await;
    assert!(c.sims.len() >= 500, "{} simulated proxies", c.sims.len());

    let v0 = c.wait_leader_has(&MeshState::initial()).await;
    c.wait_converged(v0).await;
    c.gateway_ingress().wait_all_from("/", &[], "reviews-v1a", 5).await;
    c.sidecar_ingress().wait_all_from("/", &[], "reviews-v1a", 5).await;
    c.assert_ownership_agrees().await;
    eprintln!("converged on {v0} at {:?}", t0.elapsed());

    let changed = MeshState { route: "to-v2".into(), weights: (0, 100), endpoints: (true, false, true) };
    let v1 = c.apply(&changed).await;
    assert!(v1 > v0);
    c.wait_converged(v1).await;
    eprintln!("{} simulated proxies and 2 Envoys on {v1} at {:?}", c.sims.len(), t0.elapsed());

    // Every simulated proxy received the new endpoint (EDS) and route (RDS) versions.
    for s in &c.sims {
        let state = s.proxy.state();
        for t in [TypeUrl::Endpoint, TypeUrl::Route] {
            let acked = state.types[&t].acked_version.parse::<Version>().ok();
            assert!(acked.is_some_and(|a| a >= v1), "{}: {t:?} acked {acked:?}, want {v1}", s.spec.node_id);
        }
    }
    let route_port = c.files.sidecar_port.to_string();
    for (envoy, route) in [(&c.gateway, format!("http.{}", c.files.gw_port)), (&c.sidecar, route_port)] {
        let dump = envoy.config_dump().await;
        let rc = dynamic_route_config(&dump, &route)
            .unwrap_or_else(|| panic!("{}: no route config {route}", envoy.node_id()));
        assert!(
            rc.to_string().contains("\"to-v2\""),
            "{}: route config {route} lacks the new route: {rc:#}",
            envoy.node_id()
        );
        let cluster = format!("outbound|{}|v2|reviews.{SHOP}.svc.cluster.local", c.files.sidecar_port);
        assert_eq!(
            endpoint_ports(&dump, &cluster),
            Some(vec![u64::from(c.backends.v2.port())]),
            "{}: endpoints of {cluster}",
            envoy.node_id()
        );
    }
    c.gateway_ingress().wait_all_from("/", &[], "reviews-v2", 10).await;
    c.sidecar_ingress().wait_all_from("/", &[], "reviews-v2", 10).await;
    eprintln!("config_change_reaches_every_proxy: {:?}", t0.elapsed());
}

/// Config edits at > 10/s for > 10 s with traffic through the gateway and sidecar; the leader is
/// killed (-9) in the middle. A standby takes over with a higher term, no request fails, no
/// frontend goes back to an older version or term, and at the end every proxy holds exactly what a
/// fresh standalone meshpilot serves for the final files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_during_edits() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut c = Cluster::start(Options { frontends: 2, apps_per_frontend: 1, sims_per_key: 10 }).await;
    let both = MeshState { route: "both".into(), weights: (50, 50), endpoints: (true, true, true) };
    let v0 = c.apply(&both).await;
    c.wait_converged(v0).await;
    let (old_leader, old_term) = c.leader().await;

    let gw = Traffic::start("gateway", c.gateway_ingress());
    let sc = Traffic::start("sidecar", c.sidecar_ingress());
    gw.wait_progress(20).await;
    sc.wait_progress(20).await;
    let monitor = TermMonitor::start(&c.frontends);

    // The edit stream: every 80 ms the routes (name, weights) and every other time the endpoints
    // of v1 (always one or two live backends), for 11 s; the leader dies after 5 s.
    let edits_started = Instant::now();
    let mut killed_at = None;
    let mut edits: u32 = 0;
    let v1_sets = [(true, false), (true, true), (false, true)];
    while edits_started.elapsed() < Duration::from_secs(11) {
        let w = 10 + (edits * 7) % 81;
        let (a, b) = v1_sets[(edits / 2) as usize % v1_sets.len()];
        let state = MeshState { route: format!("edit-{edits}"), weights: (w, 100 - w), endpoints: (a, b, true) };
        c.files.write_routes(c.dir(), &state);
        if edits.is_multiple_of(2) {
            c.files.write_services(c.dir(), &c.backends, &state);
        }
        edits += 1;
        if killed_at.is_none() && edits_started.elapsed() >= Duration::from_secs(5) {
            c.ingests[old_leader].kill();
            killed_at = Some(edits_started.elapsed());
            eprintln!("killed leader {} (term {old_term}) after {edits} edits", c.ingests[old_leader].id());
        }
        tokio::time::sleep_until((edits_started + Duration::from_millis(80) * edits).into()).await;
    }
    let rate = edits as f64 / edits_started.elapsed().as_secs_f64();
    eprintln!("{edits} edits in {:?} ({rate:.1}/s)", edits_started.elapsed());
    assert!(edits >= 100 && rate >= 10.0, "{edits} edits at {rate:.1}/s");
    let last = MeshState { route: "final".into(), weights: (30, 70), endpoints: (true, true, true) };
    c.files.write_services(c.dir(), &c.backends, &last);
    c.files.write_routes(c.dir(), &last);

    let (new_leader, new_term) = wait_leader(&c.ingests, TIMEOUT, |t| t > old_term).await;
    assert_ne!(new_leader, old_leader);
    eprintln!("new leader {} term {new_term}", c.ingests[new_leader].id());
    let v_final = c.wait_leader_has(&last).await;
    assert_eq!(v_final.term, new_term);
    c.wait_converged(v_final).await;
    gw.wait_progress(20).await;
    let gw_ok = gw.finish(200).await;
    let sc_ok = sc.finish(200).await;
    monitor.finish().await;

    // Frontends: on the new term, never applied an older version than one applied before.
    for f in &c.frontends {
        let node = f.node().await;
        let held: Version = node["held"].as_str().unwrap().parse().unwrap();
        assert_eq!(held.term, new_term, "{}: {node:#}", f.id());
        assert_eq!(node["highest_term"], new_term, "{}: {node:#}", f.id());
        let runs = applied_versions(&f.logs());
        assert_eq!(runs.len(), 1, "{} restarted", f.id());
        let applied = &runs[0];
        assert!(applied.iter().any(|v| v.term == old_term) && applied.iter().any(|v| v.term == new_term));
        for w in applied.windows(2) {
            assert!(w[0] < w[1], "{} applied {} after {}: {applied:?}", f.id(), w[1], w[0]);
        }
        eprintln!(
            "{}: applied {} snapshots ({} fulls, {} deltas), refused {} of a lower term, {} resyncs",
            f.id(),
            applied.len(),
            node["fulls_applied"],
            node["deltas_applied"],
            node["refused_lower_term"],
            node["resyncs"]
        );
    }

    // The final state, as a fresh standalone meshpilot serves it to fresh proxies.
    let reference = Meshpilot::start(c.dir(), None);
    reference.wait_ready(STARTUP_TIMEOUT).await;
    let fresh_gateway =
        Envoy::builder(GATEWAY_ID, reference.xds_addr()).metadata(gateway_metadata(&c.gateway_sa)).start();
    let fresh_sidecar =
        Envoy::builder(SIDECAR_ID, reference.xds_addr()).metadata(sidecar_metadata(&c.sidecar_sa)).start();
    fresh_gateway.wait_ready(STARTUP_TIMEOUT).await;
    fresh_sidecar.wait_ready(STARTUP_TIMEOUT).await;
    let (status, body) = reference.admin_get("/debug/push_status").await;
    assert_eq!(status, 200, "{body}");
    for (envoy, fresh) in [(&c.gateway, &fresh_gateway), (&c.sidecar, &fresh_sidecar)] {
        // The fresh Envoy may still be receiving EDS/RDS: poll until equal or timeout.
        let mut got = Value::Null;
        let mut want = Value::Null;
        let same = wait_until(TIMEOUT, async || {
            got = envoy.config_dump().await;
            want = fresh.config_dump().await;
            dynamic_resources(&got) == dynamic_resources(&want)
        })
        .await;
        assert_same_dynamic_config(envoy.node_id(), &got, &want);
        assert!(same);
    }
    let mut fresh_sims: BTreeMap<String, SimProxy> = BTreeMap::new();
    for k in &c.keys {
        let spec = sim_spec(&format!("http://{}", reference.xds_addr()), k, 90_000 + fresh_sims.len());
        let sim = connect_sim(spec).await;
        assert!(
            sim.wait_for(TIMEOUT, |s| sim_problem(s, None).is_none()).await,
            "fresh simulated proxy of {}",
            k.key()
        );
        fresh_sims.insert(k.key(), sim);
    }
    for s in &c.sims {
        let want = sim_names(&fresh_sims[&s.key].state());
        let got = sim_names(&s.proxy.state());
        assert_eq!(got, want, "{}: resource names differ from a fresh simulated proxy on standalone", s.spec.node_id);
    }
    c.gateway_ingress().wait_backend("/", &[], "reviews-v2").await;
    eprintln!(
        "leader_kill_during_edits: {:?} (killed at {killed_at:?}; {gw_ok} gateway and {sc_ok} sidecar requests)",
        t0.elapsed()
    );
}

/// A frontend is killed (-9): the Envoy it served reconnects through the load balancer to the
/// other one and converges there; traffic never fails; membership drops to 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frontend_kill_moves_proxies() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut c = Cluster::start(Options { frontends: 2, apps_per_frontend: 1, sims_per_key: 0 }).await;
    let v0 = c.wait_leader_has(&MeshState::initial()).await;
    let (gw_on, sc_on) = c.wait_envoys_synced(v0).await;
    let ids = c.frontend_ids();
    assert_eq!((gw_on.as_str(), sc_on.as_str()), (ids[0].as_str(), ids[1].as_str()), "Envoys where the ring puts them");

    let gw = Traffic::start("gateway", c.gateway_ingress());
    let sc = Traffic::start("sidecar", c.sidecar_ingress());
    gw.wait_progress(20).await;

    let killed_at = Instant::now();
    c.frontends[0].kill();
    let survivor = &c.frontends[1];
    let mut listed = Vec::new();
    let ok = survivor
        .wait_for(TIMEOUT, async |_| {
            listed = survivor.connected_proxies().await;
            listed.iter().any(|p| p == GATEWAY_ID)
        })
        .await;
    assert!(ok, "{} does not list the gateway after {TIMEOUT:?}: {listed:?}", survivor.id());
    eprintln!("gateway moved to {} in {:?}", survivor.id(), killed_at.elapsed());
    let (gw_on, sc_on) = c.wait_envoys_synced(v0).await;
    assert_eq!((gw_on.as_str(), sc_on.as_str()), (ids[1].as_str(), ids[1].as_str()));
    c.lb.wait_healthy(1, TIMEOUT).await;
    wait_members(&c.frontends[1..], 1).await;
    assert!(survivor.node().await["ownership"]["foreign"] == 0);

    // The moved gateway still gets updates: route everything to v2.
    let changed = MeshState { route: "to-v2".into(), weights: (0, 100), endpoints: (true, false, true) };
    let v1 = c.apply(&changed).await;
    c.wait_envoys_synced(v1).await;
    c.gateway_ingress().wait_all_from("/", &[], "reviews-v2", 10).await;
    gw.wait_progress(20).await;
    gw.finish(100).await;
    sc.finish(100).await;
    eprintln!("frontend_kill_moves_proxies: {:?}", t0.elapsed());
}

/// etcd is killed for ~10 s: frontends keep serving (traffic, unchanged config, a new simulated
/// proxy gets the full config), the leader steps down; after etcd returns a leader is elected,
/// frontends register again, and a change made then reaches the proxies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_outage() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut c = Cluster::start(Options { frontends: 2, apps_per_frontend: 1, sims_per_key: 5 }).await;
    let v0 = c.wait_leader_has(&MeshState::initial()).await;
    c.wait_converged(v0).await;
    let (_, old_term) = c.leader().await;
    let before: Vec<Value> =
        vec![dynamic_resources(&c.gateway.config_dump().await), dynamic_resources(&c.sidecar.config_dump().await)];
    let gw = Traffic::start("gateway", c.gateway_ingress());
    let sc = Traffic::start("sidecar", c.sidecar_ingress());
    gw.wait_progress(20).await;

    c.etcd.kill();
    let outage = Instant::now();
    eprintln!("etcd killed");
    // The leader steps down once its lease cannot be kept (no leader while etcd is away).
    let mut leaders = Vec::new();
    let stepped_down = wait_until(TIMEOUT, async || {
        leaders.clear();
        for n in &c.ingests {
            // Unreachable counts as not stepped down.
            let node = n.try_node().await;
            if node.as_ref().is_none_or(|n| n["leader"] != false) {
                leaders.push(format!("{}: {node:?}", n.id()));
            }
        }
        leaders.is_empty()
    })
    .await;
    assert!(stepped_down, "still leading without etcd: {leaders:?}");
    eprintln!("leader stepped down {:?} into the outage", outage.elapsed());
    // Frontends keep serving their snapshot, also to a proxy that connects now.
    for (i, f) in c.frontends.iter().enumerate() {
        assert_eq!(f.try_admin_get("/ready").await.map(|r| r.0).ok(), Some(200), "{} not ready", f.id());
        let held = f.held().await.expect("held");
        assert_eq!(held, v0, "{} changed snapshot during the outage", f.id());
        let key = c.keys.iter().find(|k| k.owner == f.id()).unwrap();
        let sim = connect_sim(sim_spec(&f.xds_url(), key, 80_000 + i)).await;
        assert!(
            sim.wait_for(TIMEOUT, |s| sim_problem(s, Some(v0)).is_none()).await,
            "a new simulated proxy on {} during the outage: {:?}",
            f.id(),
            sim.state()
        );
        let peer = c.sims.iter().find(|s| s.key == key.key()).unwrap();
        assert_eq!(sim_names(&sim.state()), sim_names(&peer.proxy.state()), "config of a new proxy on {}", f.id());
    }
    let remaining = Duration::from_secs(10).saturating_sub(outage.elapsed());
    tokio::time::sleep(remaining).await;
    assert_eq!(
        dynamic_resources(&c.gateway.config_dump().await),
        before[0],
        "gateway config changed during the outage"
    );
    assert_eq!(
        dynamic_resources(&c.sidecar.config_dump().await),
        before[1],
        "sidecar config changed during the outage"
    );
    gw.wait_progress(20).await;

    c.etcd.restart().await;
    eprintln!("etcd back after {:?}", outage.elapsed());
    let (_, new_term) = wait_leader(&c.ingests, TIMEOUT, |t| t > old_term).await;
    wait_members(&c.frontends, 2).await;
    eprintln!(
        "leader elected (term {new_term}) and frontends registered {:?} after the outage began",
        outage.elapsed()
    );

    let changed = MeshState { route: "after-outage".into(), weights: (0, 100), endpoints: (true, false, true) };
    let v1 = c.apply(&changed).await;
    assert_eq!(v1.term, new_term);
    c.wait_converged(v1).await;
    c.gateway_ingress().wait_all_from("/", &[], "reviews-v2", 10).await;
    c.sidecar_ingress().wait_all_from("/", &[], "reviews-v2", 10).await;
    gw.finish(200).await;
    sc.finish(200).await;
    eprintln!("etcd_outage: {:?}", t0.elapsed());
}

/// Each frontend in turn is stopped (SIGTERM) and started again on the same ports, the next only
/// once it is ready: no request through the Envoys fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_of_frontends() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut c = Cluster::start(Options { frontends: 2, apps_per_frontend: 1, sims_per_key: 0 }).await;
    let v0 = c.wait_leader_has(&MeshState::initial()).await;
    c.wait_envoys_synced(v0).await;
    let gw = Traffic::start("gateway", c.gateway_ingress());
    let sc = Traffic::start("sidecar", c.sidecar_ingress());
    gw.wait_progress(20).await;
    sc.wait_progress(20).await;

    let mut slow_exits = Vec::new();
    for i in 0..c.frontends.len() {
        let stopped_at = Instant::now();
        let graceful = c.frontends[i].terminate(TERMINATE_GRACE).await;
        if !graceful {
            slow_exits.push(format!("{} did not exit within {TERMINATE_GRACE:?} of SIGTERM", c.frontends[i].id()));
        }
        eprintln!("{} stopped in {:?} (graceful: {graceful})", c.frontends[i].id(), stopped_at.elapsed());
        c.frontends[i].start_again();
        c.frontends[i].wait_ready(STARTUP_TIMEOUT).await;
        wait_members(&c.frontends, 2).await;
        c.lb.wait_healthy(2, TIMEOUT).await;
        c.wait_envoys_synced(v0).await;
        gw.wait_progress(20).await;
        sc.wait_progress(20).await;
    }
    // Still programmable after the restarts.
    let changed = MeshState { route: "after-restarts".into(), weights: (0, 100), endpoints: (true, false, true) };
    let v1 = c.apply(&changed).await;
    c.wait_envoys_synced(v1).await;
    c.gateway_ingress().wait_all_from("/", &[], "reviews-v2", 10).await;
    gw.finish(100).await;
    sc.finish(100).await;
    assert!(slow_exits.is_empty(), "{slow_exits:?}");
    eprintln!("rolling_restart_of_frontends: {:?}", t0.elapsed());
}

/// `(owned, foreign)` per running frontend, once each frontend's ownership summary counts every
/// proxy connected to it (the summary is recomputed every second).
async fn ownership_counts(frontends: &[FrontendNode]) -> BTreeMap<String, (u64, u64)> {
    let mut counts = BTreeMap::new();
    for f in frontends.iter().filter(|f| f.is_running()) {
        let mut last = Value::Null;
        let ok = f
            .wait_for(TIMEOUT, async |_| {
                let connected = f.connected_proxies().await.len() as u64;
                last = f.node().await["ownership"].clone();
                let (owned, foreign) = (last["owned"].as_u64().unwrap_or(0), last["foreign"].as_u64().unwrap_or(0));
                counts.insert(f.id().to_string(), (owned, foreign));
                owned + foreign == connected
            })
            .await;
        assert!(ok, "{}: ownership summary does not count its proxies: {last:#}", f.id());
    }
    counts
}

/// Connects one new simulated proxy per key through the load balancer and asserts each lands on
/// the frontend the load balancer routes its key to right now, and that frontend counts it as
/// owned: owned counts grow by exactly the arrivals, foreign counts do not change.
async fn assert_new_proxies_owned(c: &Cluster, first_index: usize) -> Vec<Sim> {
    let before = ownership_counts(&c.frontends).await;
    let mut sims = Vec::new();
    for (i, k) in c.keys.iter().enumerate() {
        let spec = sim_spec(&c.lb.keyed_url(&k.key()), k, first_index + i);
        let proxy = connect_sim(spec.clone()).await;
        sims.push(Sim { spec, key: k.key(), proxy });
    }
    wait_sims(&sims, None).await;
    let mut arrivals: BTreeMap<String, u64> = BTreeMap::new();
    for s in &sims {
        let routed = c.lb.route_of(&s.key).await.unwrap_or_else(|| panic!("{} routed nowhere", s.key));
        let mut on = Vec::new();
        for f in c.frontends.iter().filter(|f| f.is_running()) {
            if f.connected_proxies().await.contains(&s.spec.node_id) {
                on.push(f.id().to_string());
            }
        }
        assert_eq!(
            on,
            vec![routed.clone()],
            "{} (key {}) is connected to {on:?}, routed to {routed}",
            s.spec.node_id,
            s.key
        );
        *arrivals.entry(routed).or_default() += 1;
    }
    let mut last = BTreeMap::new();
    let ok = wait_until(TIMEOUT, async || {
        last = ownership_counts(&c.frontends).await;
        before.iter().all(|(id, (owned, foreign))| {
            last.get(id) == Some(&(owned + arrivals.get(id).copied().unwrap_or(0), *foreign))
        })
    })
    .await;
    assert!(ok, "new proxies not all counted as owned: before {before:?}, arrivals {arrivals:?}, after {last:?}");
    sims
}

/// With the load balancer in front, every proxy (Envoys sending their key as gRPC metadata,
/// simulated proxies through keyed listeners) lands on the frontend the load balancer routes its
/// key to, and that frontend reports it as owned: the load balancer and the frontends agree on the
/// hash. Three frontends, two keys per namespace per frontend. Then a frontend dies and comes back:
/// after each membership change, proxies that connect anew are again owned where they land
/// (proxies that stayed may now count as foreign: long-lived streams are not rebalanced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_stability_across_membership() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut c = Cluster::start(Options { frontends: 3, apps_per_frontend: 2, sims_per_key: 3 }).await;
    let v0 = c.wait_leader_has(&MeshState::initial()).await;
    c.wait_converged(v0).await;
    c.assert_ownership_agrees().await;
    for f in &c.frontends {
        let o = &f.node().await["ownership"];
        eprintln!("{}: owned {} foreign {}", f.id(), o["owned"], o["foreign"]);
    }

    // Membership 3 → 2.
    c.frontends[2].kill();
    c.lb.wait_healthy(2, TIMEOUT).await;
    wait_members(&c.frontends[..2], 2).await;
    let after_leave = assert_new_proxies_owned(&c, 50_000).await;
    eprintln!("2 members: {:?}", ownership_counts(&c.frontends).await);

    // Membership 2 → 3.
    c.frontends[2].start_again();
    c.frontends[2].wait_ready(STARTUP_TIMEOUT).await;
    c.lb.wait_healthy(3, TIMEOUT).await;
    wait_members(&c.frontends, 3).await;
    let after_join = assert_new_proxies_owned(&c, 60_000).await;
    eprintln!("3 members again: {:?}", ownership_counts(&c.frontends).await);
    drop((after_leave, after_join));
    eprintln!("hash_stability_across_membership: {:?}", t0.elapsed());
}
