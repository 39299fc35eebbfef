//! What meshpilot's validation accepts, a real Envoy (1.40) accepts too, and the limits it refuses
//! are Envoy's own:
//!
//! - regexes: for regexes of many kinds, padded to an RE2 program size of exactly 100 (Envoy's
//!   default `re2.max_program_size.error_level`) and 101, meshpilot accepts the 100s and Envoy
//!   takes them all through xDS without a NACK (`update_rejected` stays 0), while meshpilot
//!   refuses the 101s with the field path and Envoy refuses each in `--mode validate`;
//! - durations: the Cluster rules behind the mesh config checks (`connect_timeout` > 0,
//!   `dns_refresh_rate` > 1ms) are Envoy's, checked in `--mode validate`.

use crate::common;

use std::process::Command;

use common::backend::Backend;
use common::config_dump::{dynamic_route_config, dynamic_route_config_names};
use common::envoy::envoy_path;
use common::files::{temp_dir_with, write_atomic};
use common::istio::{gateway, service_entry, NS};
use common::mesh::{assert_no_rejections, start_gateway, start_meshpilot};
use common::ports::free_port;
use meshpilot::config::parse::{parse_file, Document};
use meshpilot::config::validation::{re2_program_size, ENVOY_MAX_PROGRAM_SIZE};
use serde_json::{json, Value};

/// Regexes of different kinds; `{PAD}` is replaced by `z{k}` to reach a given program size.
const KINDS: [&str; 12] = [
    "/v[0-9]+/{PAD}.*",
    "(?i)/api/(users|orders)/[a-f0-9]{8}/{PAD}",
    "^/static/{PAD}.*\\.(css|js|png)$",
    "[^/]+(?:/[^/]+){0,3}/{PAD}",
    "(a|ab)(c|bcd)(d*){PAD}",
    "\\bfoo\\b|bar\\d+|baz\\s?|{PAD}",
    "é+[à-ÿ]{PAD}",
    "(?s).*token=[A-Za-z0-9_-]{16,}{PAD}",
    "\\pL{2}\\pN/{PAD}",
    "abc|abd|aef|bcx|bcy|{PAD}",
    "(?:x*)*y?{PAD}[[:alpha:]]",
    "{PAD}(?m:^a$)\\w*?\\W",
];

/// `kind` padded to RE2 program size `size`, if some padding gets there exactly.
fn padded(kind: &str, size: usize) -> Option<String> {
    (1..400).map(|k| kind.replace("{PAD}", &format!("z{{{k}}}"))).find(|p| re2_program_size(p) == Ok(size))
}

/// A gateway VirtualService `NAME` on `HOST` with one route per regex, each to `reviews`.
fn regex_vs(name: &str, regexes: &[String]) -> String {
    let mut http = String::new();
    for (i, re) in regexes.iter().enumerate() {
        let quoted = serde_json::to_string(re).expect("a string serializes");
        http.push_str(&format!(
            "  - name: r{i}\n    match: [{{uri: {{regex: {quoted}}}}}]\n    route: [{{destination: {{host: reviews}}}}]\n"
        ));
    }
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  \
         hosts: [{name}.example.com]\n  gateways: [{NS}/gw]\n  http:\n{http}"
    )
}

/// Runs `envoy --mode validate` on `bootstrap`: `Ok` when Envoy accepts it, else its complaint.
fn envoy_validate(bootstrap: &Value) -> Result<(), String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bootstrap.json");
    std::fs::write(&path, bootstrap.to_string()).expect("write bootstrap");
    let out = Command::new(envoy_path())
        .args(["--mode", "validate", "--log-level", "critical", "-c"])
        .arg(&path)
        .output()
        .expect("run envoy --mode validate");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

/// A bootstrap whose one listener routes with `regex`.
fn regex_bootstrap(regex: &str) -> Value {
    json!({"static_resources": {"listeners": [{
        "name": "l", "address": {"socket_address": {"address": "127.0.0.1", "port_value": free_port()}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "s",
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
            "route_config": {"virtual_hosts": [{"name": "v", "domains": ["*"], "routes": [
                {"match": {"safe_regex": {"regex": regex}}, "direct_response": {"status": 200}}]}]}}}]}]}]}})
}

/// A bootstrap with one STRICT_DNS cluster using `connect_timeout` and `dns_refresh_rate`.
fn cluster_bootstrap(connect_timeout: &str, dns_refresh_rate: &str) -> Value {
    json!({"static_resources": {"clusters": [{
        "name": "c", "type": "STRICT_DNS", "connect_timeout": connect_timeout, "dns_refresh_rate": dns_refresh_rate,
        "load_assignment": {"cluster_name": "c", "endpoints": [{"lb_endpoints": [{"endpoint": {"address":
            {"socket_address": {"address": "localhost", "port_value": 80}}}}]}]}}]}})
}

/// Every `regex` string in a piece of Envoy config.
fn regexes_in(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, x) in map {
                match (k.as_str(), x.as_str()) {
                    ("regex", Some(s)) => out.push(s.to_string()),
                    _ => regexes_in(x, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|x| regexes_in(x, out)),
        _ => {}
    }
}

/// The first error meshpilot reports for `yaml`, as (field, reason).
fn first_error(yaml: &str) -> Option<(String, String)> {
    parse_file("vs.yaml", yaml).into_iter().find_map(|d| match d {
        Document::Invalid(e) => Some((e.error.field, e.error.reason)),
        _ => None,
    })
}

#[tokio::test]
async fn regexes_meshpilot_accepts_reach_envoy_and_the_ones_it_refuses_envoy_refuses() {
    let at_limit: Vec<String> = KINDS.iter().filter_map(|k| padded(k, ENVOY_MAX_PROGRAM_SIZE)).collect();
    let over: Vec<String> = KINDS.iter().filter_map(|k| padded(k, ENVOY_MAX_PROGRAM_SIZE + 1)).collect();
    assert_eq!((at_limit.len(), over.len()), (KINDS.len(), KINDS.len()), "every kind can be padded to 100 and 101");

    // One over the limit: meshpilot refuses it with its field path, and so does Envoy.
    for re in &over {
        let (field, reason) = first_error(&regex_vs("over", std::slice::from_ref(re)))
            .unwrap_or_else(|| panic!("meshpilot accepted {re:?}, of program size 101"));
        assert_eq!(field, "spec.http[0].match[0].uri.regex", "{re:?}");
        assert!(reason.contains("RE2 program size is 101"), "{re:?}: {reason}");
        let complaint = envoy_validate(&regex_bootstrap(re)).err().unwrap_or_else(|| {
            panic!("Envoy accepted {re:?}, which meshpilot computes as 101 instructions (too strict)")
        });
        assert!(complaint.contains("RE2 program size of 101 > max program size of 100"), "{re:?}: {complaint}");
    }

    // At the limit: meshpilot accepts every one; served to a gateway Envoy, none is rejected.
    assert_eq!(first_error(&regex_vs("limit", &at_limit)), None);
    let reviews = Backend::new("reviews-v1");
    let port = free_port();
    let config = temp_dir_with(&[]);
    write_atomic(config.path(), "gateway.yaml", &gateway(port));
    write_atomic(config.path(), "services.yaml", &service_entry("reviews", reviews.port(), &[(&reviews, "v1")]));
    write_atomic(config.path(), "limit.yaml", &regex_vs("limit", &at_limit));
    // The refused ones sit beside it: reported, never sent (Envoy would NACK the whole RDS update).
    write_atomic(config.path(), "over.yaml", &regex_vs("over", &over));
    let cp = start_meshpilot(config.path()).await;
    let envoy = start_gateway(&cp).await; // waits until ready and asserts nothing was rejected
    let dump = envoy.config_dump().await;
    let route_config = dynamic_route_config(&dump, &format!("http.{port}"))
        .unwrap_or_else(|| panic!("no route configuration http.{port}: {:?}", dynamic_route_config_names(&dump)));
    let mut held = Vec::new();
    regexes_in(route_config, &mut held);
    for re in &at_limit {
        assert!(held.contains(re), "Envoy does not hold the route for {re:?}; it holds {held:?}");
    }
    for re in &over {
        assert!(!held.contains(re), "meshpilot sent {re:?}, which Envoy refuses");
    }
    let configz = cp.admin_json("/debug/configz").await;
    let reported = configz["errors"].as_array().map_or(0, |errors| {
        errors.iter().filter(|e| e["file"].as_str().is_some_and(|f| f.ends_with("over.yaml"))).count()
    });
    assert!(reported >= 1, "the refused VirtualService is not reported: {:#}", configz["errors"]);
    assert_no_rejections(&envoy).await;
}

#[test]
fn envoy_refuses_the_cluster_durations_the_mesh_config_checks_refuse() {
    // connect_timeout: `gt {}`.
    assert!(envoy_validate(&cluster_bootstrap("0.001s", "5s")).is_ok());
    let e = envoy_validate(&cluster_bootstrap("0s", "5s")).expect_err("connect_timeout 0s");
    assert!(e.contains("ConnectTimeout"), "{e}");
    // dns_refresh_rate: `gt {nanos: 1000000}`, so 1ms itself is refused.
    assert!(envoy_validate(&cluster_bootstrap("1s", "0.002s")).is_ok());
    for rate in ["0.001s", "0.0005s"] {
        let e = envoy_validate(&cluster_bootstrap("1s", rate)).expect_err(rate);
        assert!(e.contains("DnsRefreshRate"), "{rate}: {e}");
    }
    // And meshpilot's mesh config refuses exactly those.
    for (text, ok) in [
        ("connectTimeout: 1ms\n", true),
        ("connectTimeout: 0s\n", false),
        ("dnsRefreshRate: 2ms\n", true),
        ("dnsRefreshRate: 1ms\n", false),
        ("dnsRefreshRate: 0.5ms\n", false),
    ] {
        assert_eq!(meshpilot::mesh::MeshConfig::parse("mesh.yaml", text).is_ok(), ok, "{text}");
    }
}
