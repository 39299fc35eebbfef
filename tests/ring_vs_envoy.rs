//! The frontends' ownership computation agrees with a real Envoy load balancing over them: every key
//! Envoy routes lands on the backend `Ring::owner` (for RING_HASH) or `Maglev::owner` (for MAGLEV)
//! names.

use crate::common;

use common::backend::Backend;
use common::envoy::{merge_patch, Envoy};
use common::http::{http_client, http_request, try_http_get};
use common::poll::{poll, STARTUP_TIMEOUT};
use common::ports::{free_addr, free_port};
use meshpilot::cluster::ownership::{Maglev, MaglevSettings, Ring, RingSettings, PROXY_KEY_HEADER};
use serde_json::{json, Value};

/// A STATIC cluster of `backends` (endpoint order = slice order, with the given
/// `load_balancing_weight`s, or the default) hashing on each endpoint's `envoy.lb` `hash_key`, as
/// the frontends' load balancer is configured; `lb` holds `lb_policy` and its config.
fn hash_cluster(name: &str, backends: &[(&Backend, Option<u32>)], lb: Value) -> Value {
    let endpoints: Vec<Value> = backends
        .iter()
        .map(|(b, weight)| {
            let mut endpoint = json!({
                "endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": b.port()}}},
                "metadata": {"filter_metadata": {"envoy.lb": {"hash_key": b.name()}}}
            });
            if let Some(w) = weight {
                endpoint["load_balancing_weight"] = json!(w);
            }
            endpoint
        })
        .collect();
    let mut cluster = json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]}
    });
    merge_patch(&mut cluster, &lb);
    cluster
}

fn ring_cluster(name: &str, backends: &[&Backend], settings: RingSettings) -> Value {
    let backends: Vec<(&Backend, Option<u32>)> = backends.iter().map(|b| (*b, None)).collect();
    let lb = json!({
        "lb_policy": "RING_HASH",
        "ring_hash_lb_config": {
            "minimum_ring_size": settings.minimum_ring_size,
            "maximum_ring_size": settings.maximum_ring_size
        }
    });
    hash_cluster(name, &backends, lb)
}

fn maglev_cluster(name: &str, backends: &[(&Backend, Option<u32>)], settings: MaglevSettings) -> Value {
    let lb = json!({"lb_policy": "MAGLEV", "maglev_lb_config": {"table_size": settings.table_size}});
    hash_cluster(name, backends, lb)
}

fn route(prefix: &str, cluster: &str) -> Value {
    json!({
        "match": {"prefix": prefix},
        "route": {"cluster": cluster, "hash_policy": [{"header": {"header_name": PROXY_KEY_HEADER}}]}
    })
}

fn listener(port: u16, routes: Vec<Value>) -> Value {
    json!({
        "name": "frontends",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "frontends",
                "route_config": {"name": "frontends", "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}]},
                "http_filters": [{
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
                }]
            }
        }]}]
    })
}

/// Sends `keys` through Envoy at `url` and returns (key, backend that answered).
async fn route_keys(url: &str, keys: &[String]) -> Vec<(String, String)> {
    let client = http_client();
    let mut answers = Vec::new();
    for key in keys {
        let resp = http_request(&client, "GET", url, "", &[(PROXY_KEY_HEADER, key)], None)
            .await
            .unwrap_or_else(|e| panic!("GET {url} with key {key}: {e}"));
        assert_eq!(resp.status, 200, "key {key}: {}", resp.body);
        let backend = resp.header("x-backend").unwrap_or_else(|| panic!("no x-backend for key {key}")).to_string();
        answers.push((key.clone(), backend));
    }
    answers
}

/// Every answer's backend is `owner(key)`, and the keys reach all `members` backends.
fn assert_agrees<'a>(
    owner: impl Fn(&str) -> Option<&'a str>,
    members: usize,
    answers: &[(String, String)],
    label: &str,
) {
    let disagreements: Vec<String> = answers
        .iter()
        .filter(|(key, backend)| owner(key) != Some(backend.as_str()))
        .map(|(key, backend)| format!("{key}: envoy {backend}, ours {:?}", owner(key)))
        .collect();
    assert!(
        disagreements.is_empty(),
        "{label}: {} of {} keys disagree:\n{}",
        disagreements.len(),
        answers.len(),
        disagreements.join("\n")
    );
    let mut used: Vec<&str> = answers.iter().map(|(_, b)| b.as_str()).collect();
    used.sort_unstable();
    used.dedup();
    assert_eq!(used.len(), members, "{label}: keys should reach every backend: {used:?}");
}

/// Starts Envoy with `clusters`, routing `/<cluster name>` to each (the first also gets `/`),
/// and waits until its listener answers; returns Envoy and the listener's base URL.
async fn start_lb(clusters: Vec<Value>) -> (Envoy, String) {
    let port = free_port();
    let mut routes: Vec<Value> = clusters
        .iter()
        .map(|c| {
            let name = c["name"].as_str().expect("cluster name");
            route(&format!("/{name}"), name)
        })
        .collect();
    routes.push(route("/", clusters[0]["name"].as_str().expect("cluster name")));
    let mut builder = Envoy::builder("router~127.0.0.1~lb.meshpilot~meshpilot.svc.cluster.local", free_addr())
        .bootstrap_patch(json!({"dynamic_resources": null}));
    for cluster in clusters {
        builder = builder.static_cluster(cluster);
    }
    let envoy = builder.static_listener(listener(port, routes)).start();
    envoy.wait_ready(STARTUP_TIMEOUT).await;
    let base = format!("http://127.0.0.1:{port}");
    let up = poll(STARTUP_TIMEOUT, async || {
        try_http_get(&format!("{base}/"), "", &[(PROXY_KEY_HEADER, "probe")])
            .await
            .map(|(s, _)| s == 200)
            .unwrap_or(false)
    })
    .await;
    assert!(up, "Envoy listener did not answer; log:\n{}", envoy.logs());
    (envoy, base)
}

fn test_keys() -> Vec<String> {
    (0..200).map(|i| format!("ns-{}/sa-{}", i % 7, i)).collect()
}

#[tokio::test]
async fn ring_owner_matches_envoy_ring_hash_routing() {
    // Ids as membership lists them (sorted); endpoints listed in the same order.
    let backends: Vec<Backend> =
        ["frontend-0", "frontend-1", "frontend-2", "frontend-3"].into_iter().map(Backend::new).collect();
    let four: Vec<&Backend> = backends.iter().collect();
    let three: Vec<&Backend> = backends.iter().take(3).collect();
    // Default sizes (256 entries per host), and a size where 3 hosts get fractional targets
    // (scale = ceil(1000/3)*3 = 1002 in doubles), so rounding must match Envoy's exactly.
    let default = RingSettings::default();
    let fractional = RingSettings { minimum_ring_size: 1000, maximum_ring_size: 1001 };
    let (envoy, base) =
        start_lb(vec![ring_cluster("four", &four, default), ring_cluster("three", &three, fractional)]).await;
    let keys = test_keys();

    let ring4 = Ring::new(four.iter().map(|b| b.name()), default).expect("ring");
    assert_eq!(envoy.stat("cluster.four.ring_hash_lb.size").await, Some(ring4.len() as u64));
    let answers = route_keys(&format!("{base}/four"), &keys).await;
    assert_agrees(|k| ring4.owner(k), ring4.members().len(), &answers, "4 hosts, default ring");

    let ring3 = Ring::new(three.iter().map(|b| b.name()), fractional).expect("ring");
    assert_eq!(envoy.stat("cluster.three.ring_hash_lb.size").await, Some(ring3.len() as u64));
    let answers = route_keys(&format!("{base}/three"), &keys).await;
    assert_agrees(|k| ring3.owner(k), ring3.members().len(), &answers, "3 hosts, fractional ring");
}

/// Envoy's `min/max_entries_per_host` gauges for cluster `name` equal the table's extremes.
async fn assert_entries_per_host(envoy: &Envoy, name: &str, maglev: &Maglev) {
    let min = maglev.counts().iter().min().copied();
    let max = maglev.counts().iter().max().copied();
    assert_eq!(envoy.stat(&format!("cluster.{name}.maglev_lb.min_entries_per_host")).await, min, "{name}");
    assert_eq!(envoy.stat(&format!("cluster.{name}.maglev_lb.max_entries_per_host")).await, max, "{name}");
}

#[tokio::test]
async fn maglev_owner_matches_envoy_maglev_routing() {
    let backends: Vec<Backend> =
        ["frontend-0", "frontend-1", "frontend-2", "frontend-3"].into_iter().map(Backend::new).collect();
    let four: Vec<(&Backend, Option<u32>)> = backends.iter().map(|b| (b, None)).collect();
    // Out of id order: Envoy sorts hosts by hash key before filling the table, as Maglev does.
    let three: Vec<(&Backend, Option<u32>)> = [2, 0, 1].into_iter().map(|i| (&backends[i], None)).collect();
    // Weights and a small prime table: hosts sit out rounds by the same double arithmetic.
    let weighted: Vec<(&Backend, Option<u32>)> =
        [(3, 3), (0, 1), (1, 2)].into_iter().map(|(i, w)| (&backends[i], Some(w))).collect();
    let default = MaglevSettings::default();
    let small = MaglevSettings { table_size: 1009 };
    let (envoy, base) = start_lb(vec![
        maglev_cluster("four", &four, default),
        maglev_cluster("three", &three, default),
        maglev_cluster("weighted", &weighted, small),
    ])
    .await;
    let keys = test_keys();

    let maglev4 = Maglev::new(four.iter().map(|(b, _)| b.name()), default).expect("maglev");
    assert_entries_per_host(&envoy, "four", &maglev4).await;
    let answers = route_keys(&format!("{base}/four"), &keys).await;
    assert_agrees(|k| maglev4.owner(k), 4, &answers, "4 hosts, maglev");

    let maglev3 = Maglev::new(three.iter().map(|(b, _)| b.name()), default).expect("maglev");
    assert_entries_per_host(&envoy, "three", &maglev3).await;
    // Keys in the few slots whose owner depends on the fill order (see the Maglev unit tests).
    let mut keys3 = keys.clone();
    keys3.extend(["ns-5/sa-22062", "ns-3/sa-34870", "ns-4/sa-35508", "ns-6/sa-44876"].map(String::from));
    let answers = route_keys(&format!("{base}/three"), &keys3).await;
    assert_agrees(|k| maglev3.owner(k), 3, &answers, "3 hosts out of order, maglev");

    let maglev_w = Maglev::weighted(weighted.iter().map(|(b, w)| (b.name(), w.unwrap_or(1))), small).expect("maglev");
    assert_entries_per_host(&envoy, "weighted", &maglev_w).await;
    let answers = route_keys(&format!("{base}/weighted"), &keys).await;
    assert_agrees(|k| maglev_w.owner(k), 3, &answers, "3 weighted hosts, table 1009");
}
