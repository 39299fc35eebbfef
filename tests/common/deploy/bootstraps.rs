//! The Envoy bootstraps the deployment ships: where they are, and how the load balancers hash
//! proxies onto frontends and proxies send their key.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Container;
use meshpilot::cluster::ownership::{MaglevSettings, ProxyHashing, PROXY_KEY_HEADER};
use serde_json::{json, Value};

use super::cli::{is_meshpilot, parse_cli, Cli};
use super::workloads::Workload;
use super::{kustomization, local_dir};

/// Every Envoy bootstrap under deploy/: the kustomize ones (generator files under envoy/) and
/// deploy/local's YAML files.
pub fn envoy_bootstraps() -> Vec<PathBuf> {
    let k = kustomization();
    let mut files: Vec<PathBuf> = k
        .config_map_generator
        .iter()
        .flat_map(|g| g.entries().map(|(_, file)| g.dir.join(file)))
        .filter(|file| file.parent().is_some_and(|dir| dir.ends_with("envoy")))
        .collect();
    let local = std::fs::read_dir(local_dir()).unwrap_or_else(|e| panic!("list deploy/local: {e}"));
    for entry in local {
        let path = entry.unwrap_or_else(|e| panic!("list deploy/local: {e}")).path();
        if path.extension().is_some_and(|e| e == "yaml") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The element of `array` (a JSON array at `what`) whose `name` is `name`.
pub fn named<'a>(array: &'a Value, name: &str, what: &str) -> &'a Value {
    array
        .as_array()
        .and_then(|a| a.iter().find(|v| v["name"] == name))
        .unwrap_or_else(|| panic!("{what}: nothing named {name:?}"))
}

/// The HTTP connection manager of listener `name`.
pub fn http_connection_manager<'a>(bootstrap: &'a Value, name: &str, what: &str) -> &'a Value {
    let listener = named(&bootstrap["static_resources"]["listeners"], name, what);
    &listener["filter_chains"][0]["filters"][0]["typed_config"]
}

/// Problems of a load balancer bootstrap's hashing: the route hashes the proxy-key header into
/// cluster `frontends`, a MAGLEV cluster with meshpilot's table size: the algorithm and size
/// the frontends compute ownership with (`Ownership::new(ids, ProxyHashing::default())`).
pub fn hashing_problems(bootstrap: &Value, what: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let hcm = http_connection_manager(bootstrap, "xds", what);
    let route = &hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"];
    if route["cluster"] != "frontends" {
        problems.push(format!("the xds route goes to {}, not frontends", route["cluster"]));
    }
    if route["hash_policy"] != json!([{"header": {"header_name": PROXY_KEY_HEADER}}]) {
        problems.push(format!("hash_policy {} is not the header {PROXY_KEY_HEADER} alone", route["hash_policy"]));
    }
    if route["timeout"] != "0s" || hcm["stream_idle_timeout"] != "0s" {
        problems.push("ADS streams need route timeout 0s and stream_idle_timeout 0s".into());
    }
    let cluster = named(&bootstrap["static_resources"]["clusters"], "frontends", what);
    // The frontends compute ownership with the default hashing: the LB must use that algorithm.
    if ProxyHashing::default() != ProxyHashing::Maglev {
        problems.push(format!("the frontends hash by {:?}, this checks for Maglev", ProxyHashing::default()));
    }
    if cluster["lb_policy"] != "MAGLEV" {
        problems.push(format!("lb_policy {} is not MAGLEV", cluster["lb_policy"]));
    }
    if !cluster["load_balancing_policy"].is_null() {
        problems.push("load_balancing_policy would override lb_policy MAGLEV".into());
    }
    let size = json!({"table_size": MaglevSettings::default().table_size});
    if cluster["maglev_lb_config"] != size {
        problems.push(format!("maglev_lb_config {} is not meshpilot's {size}", cluster["maglev_lb_config"]));
    }
    if !cluster["common_lb_config"].is_null() {
        problems.push("common_lb_config (hostname hashing, locality weights...) changes the table".into());
    }
    problems.into_iter().map(|p| format!("{what}: {p}")).collect()
}

/// The `x-meshpilot-proxy-key` a proxy bootstrap sends must be the key the frontends compute
/// from its node metadata (namespace-service-account). Returns the xds cluster's address.
pub fn proxy_bootstrap_problems(bootstrap: &Value, what: &str) -> (Vec<String>, (String, u64)) {
    let mut problems = Vec::new();
    let meta = &bootstrap["node"]["metadata"];
    let expected =
        format!("{}/{}", meta["NAMESPACE"].as_str().unwrap_or("?"), meta["SERVICE_ACCOUNT"].as_str().unwrap_or("?"));
    let service = &bootstrap["dynamic_resources"]["ads_config"]["grpc_services"][0];
    let metadata = json!([{"key": PROXY_KEY_HEADER, "value": expected}]);
    if service["initial_metadata"] != metadata {
        problems.push(format!("{what}: initial_metadata {} should be {metadata}", service["initial_metadata"]));
    }
    let cluster_name = service["envoy_grpc"]["cluster_name"].as_str().unwrap_or_default();
    let cluster = named(&bootstrap["static_resources"]["clusters"], cluster_name, what);
    let socket =
        &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"];
    let addr = (socket["address"].as_str().unwrap_or_default().to_string(), socket["port_value"].as_u64().unwrap_or(0));
    (problems, addr)
}

/// The single frontend Deployment's meshpilot container and parsed command line.
pub fn frontend_container<'a>(workloads: &'a [Workload<'a>]) -> (&'a Workload<'a>, &'a Container, Cli) {
    let mut found = Vec::new();
    for w in workloads {
        for c in w.containers().iter().filter(|c| is_meshpilot(c)) {
            let cli = parse_cli(c.args.as_deref().unwrap_or_default()).unwrap_or_else(|e| panic!("{}: {e:?}", w.at));
            if cli.subcommand == "frontend" {
                found.push((w, c, cli));
            }
        }
    }
    assert_eq!(found.len(), 1, "expected exactly one frontend container");
    found.remove(0)
}
