//! The scale-out system as processes on 127.0.0.1: a real etcd, three `meshpilot ingest` nodes
//! (one leader, lease TTL 2 s), `meshpilot frontend`s behind a real Envoy load balancer hashing
//! the `x-meshpilot-proxy-key` header (MAGLEV, as the frontends compute ownership; endpoints'
//! `hash_key` = member ids), real Envoys (an ingress gateway and a sidecar, routing to
//! [`Backend`](crate::common::backend::Backend)s) and simulated proxies.
//!
//! Envoys send their proxy key as gRPC initial metadata. `SimProxy` cannot add metadata, so the
//! load balancer has one extra listener per simulated proxy key that sets the header before
//! routing (Envoy's `header_mutation` filter): simulated proxies go through the same hash as the
//! Envoys, and the frontends must report every one of them as owned. A simulated proxy's key is
//! `namespace/app` (no service account), so proxies are grouped in a few apps per namespace,
//! chosen so that every frontend owns some.

/// The config files the cluster serves.
pub mod files;
/// Traffic and monitors running beside the cluster.
pub mod monitors;
/// Simulated proxies and their keys.
pub mod sims;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use meshpilot::snapshot::Version;
use serde_json::{json, Value};

use crate::common::envoy::Envoy;
use crate::common::etcd::Etcd;
use crate::common::files::temp_dir_with;
use crate::common::ingress::Ingress;
use crate::common::istio::NS;
use crate::common::mesh::{sync_problem, GATEWAY_NODE_ID, SIDECAR_NODE_ID};
use crate::common::meshpilot::{current_leader, wait_leader, Meshpilot};
use crate::common::poll::{poll, STARTUP_TIMEOUT};
use crate::common::ports::free_port;
use crate::common::xds_lb::{proxy_key_patch, XdsLoadBalancer};

use files::{Backends, MeshFiles, MeshState};
use sims::{connect_sim, lb_owner, name_owned_by, sim_spec, wait_sims, Sim, SimKey, LB_POLICY};

/// Every wait of the scale-out tests.
pub const TIMEOUT: Duration = Duration::from_secs(60);
/// Lease TTL of the ingest nodes and the frontends (seconds): failover within a few seconds.
pub const LEASE_TTL: u64 = 2;
/// Quiet period of the ingest nodes' debounce: short, so that an edit stream (one edit every
/// 80 ms) becomes a stream of snapshots.
pub const DEBOUNCE: &str = "30ms";
/// Host of the gateway's VirtualService.
pub const HOST: &str = "shop.example.com";
/// Namespace of the services, the sidecar and the VirtualServices.
pub const SHOP: &str = NS;
/// Namespaces of the simulated proxies.
pub const SIM_NAMESPACES: [&str; 3] = ["team-a", "team-b", "team-c"];

/// Held by each scale-out test: two clusters at once would starve each other on 2 cores.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Node metadata of the gateway Envoy with service account `sa`.
pub fn gateway_metadata(sa: &str) -> Value {
    let mut metadata = crate::common::mesh::gateway_metadata();
    metadata["SERVICE_ACCOUNT"] = json!(sa);
    metadata
}

/// Node metadata of the sidecar Envoy with service account `sa`.
pub fn sidecar_metadata(sa: &str) -> Value {
    let mut metadata = crate::common::mesh::sidecar_metadata();
    metadata["SERVICE_ACCOUNT"] = json!(sa);
    metadata
}

/// The size of a [`Cluster`].
pub struct Options {
    /// Number of frontends.
    pub frontends: usize,
    /// Apps per namespace per frontend (each app one key, one load balancer listener).
    pub apps_per_frontend: usize,
    /// Simulated proxies per key.
    pub sims_per_key: usize,
}

/// etcd, 3 ingest nodes, the frontends behind the load balancer, the gateway and sidecar Envoys
/// (through the load balancer, the gateway's key owned by the first frontend, the sidecar's by the
/// second) and simulated proxies (through the load balancer's keyed listeners). Fields drop in
/// order: proxies first, etcd last.
pub struct Cluster {
    /// The simulated proxies, by node id.
    pub sims: Vec<Sim>,
    /// The ingress gateway Envoy.
    pub gateway: Envoy,
    /// The `client` sidecar Envoy.
    pub sidecar: Envoy,
    /// The load balancer in front of the frontends.
    pub lb: XdsLoadBalancer,
    /// The frontends (`fe-a`, `fe-b`, ...).
    pub frontends: Vec<Meshpilot>,
    /// The ingest nodes (`ingest-0` to `ingest-2`).
    pub ingests: Vec<Meshpilot>,
    /// etcd.
    pub etcd: Etcd,
    /// The files' ports and writers.
    pub files: MeshFiles,
    /// The backends of reviews.
    pub backends: Backends,
    /// The config dir every ingest node watches.
    pub config: tempfile::TempDir,
    /// The simulated proxies' keys.
    pub keys: Vec<SimKey>,
    /// The gateway's service account (its key is `istio-system/SA`).
    pub gateway_sa: String,
    /// The sidecar's service account (its key is `shop/SA`).
    pub sidecar_sa: String,
}

impl Cluster {
    /// Starts everything and waits until the Envoys are ready and every simulated proxy connected.
    pub async fn start(opts: Options) -> Cluster {
        let started = Instant::now();
        let backends = Backends::start();
        let files = MeshFiles { gw_port: free_port(), sidecar_port: free_port() };
        let config = temp_dir_with(&[]);
        files.write_all(config.path(), &backends, &MeshState::initial());

        let etcd = Etcd::start().await;
        let ingests: Vec<Meshpilot> = (0..3)
            .map(|i| {
                Meshpilot::ingest(&etcd.endpoint(), config.path())
                    .id(&format!("ingest-{i}"))
                    .lease_ttl(LEASE_TTL)
                    .debounce_after(DEBOUNCE)
                    .start()
            })
            .collect();
        let frontends: Vec<Meshpilot> = (0..opts.frontends)
            .map(|i| {
                Meshpilot::frontend(&etcd.endpoint())
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
        let gateway = Envoy::builder(GATEWAY_NODE_ID, lb.addr())
            .metadata(gateway_metadata(&gateway_sa))
            .bootstrap_patch(proxy_key_patch(&format!("istio-system/{gateway_sa}")))
            .start();
        let sidecar = Envoy::builder(SIDECAR_NODE_ID, lb.addr())
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

    /// The config dir.
    pub fn dir(&self) -> &Path {
        self.config.path()
    }

    /// A client of the gateway's listener for [`HOST`].
    pub fn gateway_ingress(&self) -> Ingress {
        Ingress::new(self.files.gw_port, HOST)
    }

    /// A client of the sidecar's egress listener for reviews.
    pub fn sidecar_ingress(&self) -> Ingress {
        Ingress::new(self.files.sidecar_port, &format!("reviews.{SHOP}.svc.cluster.local"))
    }

    /// The frontends' ids.
    pub fn frontend_ids(&self) -> Vec<String> {
        self.frontends.iter().map(|f| f.id().to_string()).collect()
    }

    /// The current leader (index, term).
    pub async fn leader(&self) -> (usize, u64) {
        wait_leader(&self.ingests, TIMEOUT, |_| true).await
    }

    /// Writes `state` and waits until the leader's snapshot holds it (its route name in
    /// `/debug/configz`); returns that snapshot's version.
    pub async fn apply(&self, state: &MeshState) -> Version {
        self.files.write_services(self.dir(), &self.backends, state);
        self.files.write_routes(self.dir(), state);
        self.wait_leader_has(state).await
    }

    /// Polls the leader's `/debug/configz` until it serves `state` (route name and endpoint
    /// count); returns its version.
    pub async fn wait_leader_has(&self, state: &MeshState) -> Version {
        let want_endpoints = [state.endpoints.0, state.endpoints.1, state.endpoints.2].iter().filter(|b| **b).count();
        let mut last = String::new();
        let mut version = None;
        let ok = poll(TIMEOUT, async || {
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
    pub async fn wait_frontends_hold(&self, v: Version) {
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
    pub async fn wait_envoys_synced(&self, v: Version) -> (String, String) {
        let mut problem = String::new();
        let mut found = (String::new(), String::new());
        let ok = poll(TIMEOUT, async || {
            let mut where_ = Vec::new();
            for id in [GATEWAY_NODE_ID, SIDECAR_NODE_ID] {
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
    pub async fn wait_converged(&self, v: Version) {
        self.wait_frontends_hold(v).await;
        self.wait_envoys_synced(v).await;
        wait_sims(&self.sims, Some(v)).await;
    }

    /// Asserts every running frontend reports its proxies as owned (none foreign) and that
    /// together they hold every proxy of the cluster exactly once, each on the frontend the load
    /// balancer routes its key to (asked through its probe listener).
    pub async fn assert_ownership_agrees(&self) {
        let ids = self.frontend_ids();
        let mut routes: BTreeMap<String, String> = BTreeMap::new();
        let mut keys: Vec<(String, String)> =
            self.sims.iter().map(|s| (s.spec.node_id.clone(), s.key.clone())).collect();
        keys.push((GATEWAY_NODE_ID.into(), format!("istio-system/{}", self.gateway_sa)));
        keys.push((SIDECAR_NODE_ID.into(), format!("{SHOP}/{}", self.sidecar_sa)));
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
        let ok = poll(TIMEOUT, async || {
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
pub async fn wait_members(frontends: &[Meshpilot], n: usize) {
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

/// `(owned, foreign)` per running frontend, once each frontend's ownership summary counts every
/// proxy connected to it (the summary is recomputed every second).
pub async fn ownership_counts(frontends: &[Meshpilot]) -> BTreeMap<String, (u64, u64)> {
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
pub async fn assert_new_proxies_owned(c: &Cluster, first_index: usize) -> Vec<Sim> {
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
    let ok = poll(TIMEOUT, async || {
        last = ownership_counts(&c.frontends).await;
        before.iter().all(|(id, (owned, foreign))| {
            last.get(id) == Some(&(owned + arrivals.get(id).copied().unwrap_or(0), *foreign))
        })
    })
    .await;
    assert!(ok, "new proxies not all counted as owned: before {before:?}, arrivals {arrivals:?}, after {last:?}");
    sims
}
