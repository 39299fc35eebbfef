//! Rewrites applied to both servers' resources (as Envoy's JSON) before they are compared. Each
//! rule removes a difference Envoy's behaviour does not depend on, and says why; a difference
//! that changes what Envoy does is never normalised here (it is declared, with its reason, in
//! `tests/testdata/differential/declared.yaml`, or it counts against meshpilot).
//!
//! Not listed because the comparison never sees them: response versions and nonces (they live
//! on the DiscoveryResponse, not in a resource), and map key order (JSON objects compare as
//! maps).

use serde_json::Value;

/// One normalisation.
pub struct Rule {
    /// Its name, as reports list it.
    pub name: &'static str,
    /// Rewrites one resource's JSON in place.
    pub apply: fn(&mut Value),
}

/// Every rule, in the order applied.
pub const RULES: [Rule; 5] = [
    Rule { name: "istio_only_extensions", apply: istio_only_extensions },
    Rule { name: "istio_telemetry_metadata", apply: istio_telemetry_metadata },
    Rule { name: "empty_locality", apply: empty_locality },
    Rule { name: "unknown_health_is_healthy", apply: unknown_health_is_healthy },
    Rule { name: "set_like_lists", apply: set_like_lists },
];

/// `value` with every rule applied.
pub fn normalise(mut value: Value) -> Value {
    for rule in &RULES {
        (rule.apply)(&mut value);
    }
    value
}

/// Whether a filter (by name or `@type`) exists only in Istio's own Envoy build: its stats and
/// peer-metadata-exchange extensions (`istio.stats`, `istio.metadata_exchange`, `istio.alpn`,
/// `io.istio.*`, `stats.PluginConfig`, `envoy.tcp.metadataexchange.*`).
fn istio_only(filter: &Value) -> bool {
    let name = filter["name"].as_str().unwrap_or("");
    let url = filter["typed_config"]["@type"].as_str().unwrap_or("");
    let url = url.rsplit('/').next().unwrap_or("");
    name.starts_with("istio.")
        || url.starts_with("io.istio.")
        || url.starts_with("stats.")
        || url.starts_with("envoy.tcp.metadataexchange.")
        || url.starts_with("istio.")
}

/// Filters of Istio's own Envoy build (telemetry: stats, peer metadata exchange and the ALPN
/// override that feeds it) and their per-route configs are dropped from both sides. meshpilot
/// targets stock Envoy, which has none of these extensions (it would reject a resource naming
/// them); they produce metrics and metadata and make no routing, security or load-balancing
/// decision.
fn istio_only_extensions(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for key in ["http_filters", "filters", "listener_filters"] {
                if let Some(Value::Array(items)) = map.get_mut(key) {
                    items.retain(|f| !istio_only(f));
                }
            }
            if let Some(Value::Object(per)) = map.get_mut("typed_per_filter_config") {
                per.retain(|name, config| !istio_only(&serde_json::json!({"name": name, "typed_config": config})));
            }
            for key in ["http_filters", "filters", "listener_filters", "typed_per_filter_config"] {
                if map.get(key).is_some_and(is_empty) {
                    map.remove(key);
                }
            }
            map.values_mut().for_each(istio_only_extensions);
        }
        Value::Array(items) => items.iter_mut().for_each(istio_only_extensions),
        _ => {}
    }
}

/// `metadata.filter_metadata.istio` (clusters, routes, listeners, filter chains, endpoints) is
/// dropped: Istio's telemetry filters and istioctl read it (the config a resource came from, a
/// workload's name); Envoy's own filters never do, so it changes nothing a request meets.
/// Other metadata (`envoy.lb`, `envoy.transport_socket_match`) is kept: Envoy acts on it.
fn istio_telemetry_metadata(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(Value::Object(fm)) = map.get_mut("metadata").and_then(|m| m.get_mut("filter_metadata")) {
                fm.remove("istio");
            }
            let empty_filter_metadata =
                map.get("metadata").and_then(|m| m.get("filter_metadata")).is_some_and(is_empty);
            if empty_filter_metadata {
                if let Some(Value::Object(m)) = map.get_mut("metadata") {
                    m.remove("filter_metadata");
                }
            }
            if map.get("metadata").is_some_and(is_empty) {
                map.remove("metadata");
            }
            map.values_mut().for_each(istio_telemetry_metadata);
        }
        Value::Array(items) => items.iter_mut().for_each(istio_telemetry_metadata),
        _ => {}
    }
}

/// Lists Envoy treats as sets are sorted: a virtual host's `domains`, a filter chain match's
/// `server_names`, `application_protocols`, `prefix_ranges` and `source_prefix_ranges` (any
/// entry matches), `match_subject_alt_names` (any entry matches), a route configuration's
/// `virtual_hosts` (chosen by domain, and a domain may appear in only one), a listener's
/// `filter_chains` (chosen by their match, never by position; Envoy rejects two equal matches),
/// and an assignment's localities (`endpoints`) and their `lb_endpoints` (balanced over all).
fn set_like_lists(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.values_mut().for_each(set_like_lists);
            for key in [
                "domains",
                "server_names",
                "application_protocols",
                "prefix_ranges",
                "source_prefix_ranges",
                "match_subject_alt_names",
                "virtual_hosts",
                "filter_chains",
                "lb_endpoints",
                "endpoints",
            ] {
                if let Some(Value::Array(items)) = map.get_mut(key) {
                    items.sort_by_cached_key(|v| serde_json::to_string(v).unwrap_or_default());
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(set_like_lists),
        _ => {}
    }
}

/// An endpoint group's `locality: {}` is dropped: every field of a Locality is a string, and
/// Envoy reads an absent locality as the one with all of them empty.
fn empty_locality(value: &mut Value) {
    if let Some(Value::Array(groups)) = value.get_mut("endpoints") {
        for group in groups.iter_mut().filter_map(Value::as_object_mut) {
            if group.get("locality").is_some_and(is_empty) {
                group.remove("locality");
            }
        }
    }
}

/// An endpoint's `health_status: HEALTHY` is dropped: an absent status is UNKNOWN, which Envoy
/// load-balances to exactly as HEALTHY (its docs: "interpreted by Envoy as HEALTHY").
fn unknown_health_is_healthy(value: &mut Value) {
    let Some(Value::Array(groups)) = value.get_mut("endpoints") else { return };
    for group in groups.iter_mut() {
        let Some(Value::Array(lb)) = group.get_mut("lb_endpoints") else { continue };
        for e in lb.iter_mut().filter_map(Value::as_object_mut) {
            if e.get("health_status").and_then(Value::as_str) == Some("HEALTHY") {
                e.remove("health_status");
            }
        }
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Null => true,
        _ => false,
    }
}
