//! The frontends' ownership ring agrees with a real Envoy doing RING_HASH over them: every key
//! Envoy routes lands on the backend `Ring::owner` names.

mod support;

use meshpilot::ownership::{Ring, RingSettings, PROXY_KEY_HEADER};
use serde_json::{json, Value};
use support::*;

/// A STATIC cluster of `backends` (endpoint order = slice order) hashing on each endpoint's
/// `envoy.lb` `hash_key`, as the frontends' load balancer is configured.
fn ring_cluster(name: &str, backends: &[&Backend], settings: RingSettings) -> Value {
    let endpoints: Vec<Value> = backends
        .iter()
        .map(|b| {
            json!({
                "endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": b.port()}}},
                "metadata": {"filter_metadata": {"envoy.lb": {"hash_key": b.name()}}}
            })
        })
        .collect();
    json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "lb_policy": "RING_HASH",
        "ring_hash_lb_config": {
            "minimum_ring_size": settings.minimum_ring_size,
            "maximum_ring_size": settings.maximum_ring_size
        },
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]}
    })
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

fn assert_agrees(ring: &Ring, answers: &[(String, String)], label: &str) {
    let disagreements: Vec<String> = answers
        .iter()
        .filter(|(key, backend)| ring.owner(key) != Some(backend.as_str()))
        .map(|(key, backend)| format!("{key}: envoy {backend}, ring {:?}", ring.owner(key)))
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
    assert_eq!(used.len(), ring.members().len(), "{label}: keys should reach every backend: {used:?}");
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

    let port = free_port();
    let envoy = Envoy::builder("router~127.0.0.1~lb.meshpilot~meshpilot.svc.cluster.local", free_addr())
        .bootstrap_patch(json!({"dynamic_resources": null}))
        .static_cluster(ring_cluster("four", &four, default))
        .static_cluster(ring_cluster("three", &three, fractional))
        .static_listener(listener(port, vec![route("/three", "three"), route("/", "four")]))
        .start();
    envoy.wait_ready(STARTUP_TIMEOUT).await;
    let base = format!("http://127.0.0.1:{port}");
    let up = wait_until(STARTUP_TIMEOUT, async || {
        try_http_get(&format!("{base}/"), "", &[(PROXY_KEY_HEADER, "probe")])
            .await
            .map(|(s, _)| s == 200)
            .unwrap_or(false)
    })
    .await;
    assert!(up, "Envoy listener did not answer; log:\n{}", envoy.logs());

    let keys: Vec<String> = (0..200).map(|i| format!("ns-{}/sa-{}", i % 7, i)).collect();

    let ring4 = Ring::new(four.iter().map(|b| b.name()), default).expect("ring");
    assert_eq!(envoy.stat("cluster.four.ring_hash_lb.size").await, Some(ring4.len() as u64));
    let answers = route_keys(&format!("{base}/"), &keys).await;
    assert_agrees(&ring4, &answers, "4 hosts, default ring");

    let ring3 = Ring::new(three.iter().map(|b| b.name()), fractional).expect("ring");
    assert_eq!(envoy.stat("cluster.three.ring_hash_lb.size").await, Some(ring3.len() as u64));
    let answers = route_keys(&format!("{base}/three"), &keys).await;
    assert_agrees(&ring3, &answers, "3 hosts, fractional ring");
}
