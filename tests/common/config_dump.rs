//! Readers for Envoy's `/config_dump`: sections, dynamic resources by name, endpoint ports, the
//! versions last accepted, and a comparison of what two Envoys hold.

use std::collections::BTreeSet;

use serde_json::{json, Value};

/// The `configs[]` entry of a `/config_dump` whose `@type` ends with `type_suffix` (e.g.
/// `"ClustersConfigDump"`).
pub fn dump_section<'a>(dump: &'a Value, type_suffix: &str) -> Option<&'a Value> {
    dump["configs"]
        .as_array()?
        .iter()
        .find(|c| c["@type"].as_str().is_some_and(|t| t.ends_with(&format!(".{type_suffix}"))))
}

/// The items of list `list` of section `section` (empty if either is missing).
fn section_list<'a>(dump: &'a Value, section: &str, list: &str) -> Vec<&'a Value> {
    dump_section(dump, section).and_then(|s| s[list].as_array()).map(|a| a.iter().collect()).unwrap_or_default()
}

/// The value at `path` inside each item of `list` of section `section`.
fn section_items<'a>(dump: &'a Value, section: &str, list: &str, path: &[&str]) -> Vec<&'a Value> {
    section_list(dump, section, list).into_iter().map(|item| path.iter().fold(item, |v, p| &v[*p])).collect()
}

/// The names (string at `path` inside each item) of list `list` of section `section`.
pub fn section_names(dump: &Value, section: &str, list: &str, path: &[&str]) -> Vec<String> {
    section_items(dump, section, list, path).into_iter().filter_map(|v| v.as_str().map(str::to_string)).collect()
}

/// Names of the dynamic route configurations.
pub fn dynamic_route_config_names(dump: &Value) -> Vec<String> {
    section_names(dump, "RoutesConfigDump", "dynamic_route_configs", &["route_config", "name"])
}

/// The `dynamic_route_configs` entry (`version_info`, `route_config`) of route configuration `name`.
pub fn dynamic_route_config<'a>(dump: &'a Value, name: &str) -> Option<&'a Value> {
    section_list(dump, "RoutesConfigDump", "dynamic_route_configs")
        .into_iter()
        .find(|r| r["route_config"]["name"] == name)
}

/// Names of the dynamic listeners.
pub fn dynamic_listener_names(dump: &Value) -> Vec<String> {
    section_names(dump, "ListenersConfigDump", "dynamic_listeners", &["name"])
}

/// The `dynamic_listeners` entry of listener `name`.
pub fn dynamic_listener<'a>(dump: &'a Value, name: &str) -> Option<&'a Value> {
    section_list(dump, "ListenersConfigDump", "dynamic_listeners").into_iter().find(|l| l["name"] == name)
}

/// Names of the dynamic active clusters.
pub fn dynamic_cluster_names(dump: &Value) -> Vec<String> {
    section_names(dump, "ClustersConfigDump", "dynamic_active_clusters", &["cluster", "name"])
}

/// The `dynamic_active_clusters` entry (`version_info`, `cluster`) of cluster `name`.
pub fn dynamic_cluster<'a>(dump: &'a Value, name: &str) -> Option<&'a Value> {
    section_list(dump, "ClustersConfigDump", "dynamic_active_clusters")
        .into_iter()
        .find(|c| c["cluster"]["name"] == name)
}

/// Ports of the endpoints Envoy holds for EDS cluster `cluster`, sorted (None if it has no
/// assignment for it).
pub fn endpoint_ports(dump: &Value, cluster: &str) -> Option<Vec<u64>> {
    let cla = section_list(dump, "EndpointsConfigDump", "dynamic_endpoint_configs")
        .into_iter()
        .find(|e| e["endpoint_config"]["cluster_name"] == cluster)?;
    let mut ports: Vec<u64> = cla["endpoint_config"]["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| l["lb_endpoints"].as_array().into_iter().flatten())
        .filter_map(|e| e["endpoint"]["address"]["socket_address"]["port_value"].as_u64())
        .collect();
    ports.sort();
    Some(ports)
}

/// The load assignment Envoy holds for EDS cluster `cluster`.
pub fn load_assignment<'a>(dump: &'a Value, cluster: &str) -> Option<&'a Value> {
    section_list(dump, "EndpointsConfigDump", "dynamic_endpoint_configs")
        .into_iter()
        .find(|e| e["endpoint_config"]["cluster_name"] == cluster)
        .map(|e| &e["endpoint_config"])
}

/// `IP:PORT` of each endpoint Envoy holds for EDS cluster `cluster`, sorted (empty without an
/// assignment).
pub fn endpoint_addresses(dump: &Value, cluster: &str) -> Vec<String> {
    let mut out: Vec<String> = load_assignment(dump, cluster)
        .and_then(|cla| cla["endpoints"].as_array())
        .into_iter()
        .flatten()
        .flat_map(|l| l["lb_endpoints"].as_array().into_iter().flatten())
        .map(|e| {
            let a = &e["endpoint"]["address"]["socket_address"];
            format!("{}:{}", a["address"].as_str().unwrap_or_default(), a["port_value"])
        })
        .collect();
    out.sort();
    out
}

/// `region/zone/sub_zone` of each locality of EDS cluster `cluster`, sorted.
pub fn endpoint_localities(dump: &Value, cluster: &str) -> Vec<String> {
    let mut out: Vec<String> = load_assignment(dump, cluster)
        .and_then(|cla| cla["endpoints"].as_array())
        .into_iter()
        .flatten()
        .map(|l| {
            let s = |k: &str| l["locality"][k].as_str().unwrap_or_default().to_string();
            format!("{}/{}/{}", s("region"), s("zone"), s("sub_zone"))
        })
        .collect();
    out.sort();
    out
}

/// The `version_info` of the last accepted CDS, LDS and route configuration `route` responses.
pub fn xds_versions(dump: &Value, route: &str) -> (String, String, String) {
    let v = |x: &Value| x.as_str().unwrap_or_default().to_string();
    let cds = dump_section(dump, "ClustersConfigDump").map(|s| v(&s["version_info"])).unwrap_or_default();
    let lds = dump_section(dump, "ListenersConfigDump").map(|s| v(&s["version_info"])).unwrap_or_default();
    let rds = dynamic_route_config(dump, route).map(|r| v(&r["version_info"])).unwrap_or_default();
    (cds, lds, rds)
}

/// `items` as a JSON array sorted by `name`.
fn sorted_by_name(items: Vec<&Value>, name: impl Fn(&Value) -> String) -> Value {
    let mut items: Vec<Value> = items.into_iter().cloned().collect();
    items.sort_by_key(|i| name(i));
    Value::Array(items)
}

/// The dynamic xDS resources an Envoy holds, without versions and timestamps: active clusters,
/// route configurations, listeners (active state) and endpoint assignments, each sorted by name.
pub fn dynamic_resources(dump: &Value) -> Value {
    let list = |section: &str, list: &str, inner: &[&str]| section_items(dump, section, list, inner);
    json!({
        "clusters": sorted_by_name(list("ClustersConfigDump", "dynamic_active_clusters", &["cluster"]), |c| c["name"].to_string()),
        "routes": sorted_by_name(list("RoutesConfigDump", "dynamic_route_configs", &["route_config"]), |r| r["name"].to_string()),
        "listeners": sorted_by_name(list("ListenersConfigDump", "dynamic_listeners", &["active_state", "listener"]), |l| l["name"].to_string()),
        "endpoints": sorted_by_name(list("EndpointsConfigDump", "dynamic_endpoint_configs", &["endpoint_config"]), |e| e["cluster_name"].to_string()),
    })
}

/// Paths where `a` and `b` differ (at most `limit`).
pub fn json_diff(a: &Value, b: &Value, path: &str, out: &mut Vec<String>, limit: usize) {
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

/// Asserts two Envoys' config dumps hold the same dynamic resources (`want` from a fresh Envoy on
/// a standalone meshpilot, which must hold some of each).
pub fn assert_same_dynamic_config(what: &str, got: &Value, want: &Value) {
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
