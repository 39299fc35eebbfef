//! Node metadata as pilot-agent sends it: mostly strings (`INSTANCE_IPS` comma-separated), `LABELS`
//! a struct of strings, `PROXY_CONFIG` a struct. Unknown keys are ignored; a known key with a value
//! of the wrong shape is ignored (logged at debug), never fatal.

use std::net::IpAddr;

use envoy_types::pb::google::protobuf::{value::Kind as ValueKind, Struct, Value};
use serde::Serialize;
use tracing::debug;

use crate::config::api::Labels;
use crate::mesh::ProxyTracing;
use crate::telemetry::log_text::Untrusted;

/// How traffic reaches a sidecar's listeners (`INTERCEPTION_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Interception {
    /// iptables REDIRECT: listeners do not bind, the virtual listeners do.
    Redirect,
    /// iptables TPROXY: as REDIRECT, the original source address kept on inbound.
    Tproxy,
    /// No interception (`INTERCEPTION_MODE: NONE`): applications dial listeners directly.
    None,
}

impl Interception {
    /// Whether iptables hands connections to the virtual listeners.
    pub fn intercepts(self) -> bool {
        self != Interception::None
    }
}

/// The parts of pilot-agent's `PROXY_CONFIG` meshpilot reads or shows.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProxyConfigMeta {
    /// `discoveryAddress`: where the agent dials xDS.
    pub discovery_address: String,
    /// `concurrency`: Envoy worker threads (0: one per core).
    pub concurrency: Option<u32>,
    /// `proxyMetadata`: environment the agent was given.
    pub proxy_metadata: Labels,
    /// `tracing`, bounded (see [`ProxyTracing::bounded`]); `None` when absent or malformed.
    pub tracing: Option<ProxyTracing>,
}

/// The node metadata meshpilot understands.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeMetadata {
    /// `ISTIO_VERSION`.
    pub istio_version: Option<String>,
    /// `INTERCEPTION_MODE` (REDIRECT when absent or unknown, as in Istio).
    pub interception: Option<Interception>,
    /// `INSTANCE_IPS`: the valid addresses, in the order sent.
    pub instance_ips: Vec<String>,
    /// `LABELS`.
    pub labels: Option<Labels>,
    /// `NAMESPACE`.
    pub namespace: Option<String>,
    /// `SERVICE_ACCOUNT`.
    pub service_account: Option<String>,
    /// `CLUSTER_ID`.
    pub cluster_id: Option<String>,
    /// `WORKLOAD_NAME`.
    pub workload_name: Option<String>,
    /// `MESH_ID`.
    pub mesh_id: Option<String>,
    /// `NAME` (the Pod's name).
    pub pod_name: Option<String>,
    /// `PROXY_CONFIG`.
    pub proxy_config: Option<ProxyConfigMeta>,
}

impl NodeMetadata {
    /// Reads the known keys of `meta`.
    pub fn parse(meta: Option<&Struct>) -> NodeMetadata {
        let Some(meta) = meta else {
            return NodeMetadata::default();
        };
        let text = |key: &str| string_field(meta, key);
        NodeMetadata {
            istio_version: text("ISTIO_VERSION"),
            interception: text("INTERCEPTION_MODE").map(|m| interception(&m)),
            instance_ips: text("INSTANCE_IPS").map(|ips| instance_ips(&ips)).unwrap_or_default(),
            labels: meta.fields.get("LABELS").and_then(|v| string_map(v, "LABELS")),
            namespace: text("NAMESPACE").filter(|n| !n.is_empty()),
            service_account: text("SERVICE_ACCOUNT"),
            cluster_id: text("CLUSTER_ID").filter(|c| !c.is_empty()),
            workload_name: text("WORKLOAD_NAME"),
            mesh_id: text("MESH_ID"),
            pod_name: text("NAME"),
            proxy_config: meta.fields.get("PROXY_CONFIG").and_then(proxy_config),
        }
    }
}

fn interception(mode: &str) -> Interception {
    match mode {
        "NONE" => Interception::None,
        "TPROXY" => Interception::Tproxy,
        "REDIRECT" => Interception::Redirect,
        other => {
            debug!(mode = %Untrusted(other), "unknown INTERCEPTION_MODE; treated as REDIRECT");
            Interception::Redirect
        }
    }
}

/// At most this many instance IPs are read: a pod has one per IP family; a client sending
/// thousands would only make every lookup slower.
const MAX_INSTANCE_IPS: usize = 16;

/// The valid IPs of a comma-separated list, canonical (`fd00::3`, not `fd00:0::3`).
fn instance_ips(list: &str) -> Vec<String> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        if out.len() == MAX_INSTANCE_IPS {
            debug!(max = MAX_INSTANCE_IPS, "INSTANCE_IPS lists more addresses; the rest are ignored");
            break;
        }
        match item.parse::<IpAddr>() {
            Ok(ip) if !out.contains(&ip.to_string()) => out.push(ip.to_string()),
            Ok(_) => {}
            Err(_) => debug!(address = %Untrusted(item), "INSTANCE_IPS entry is not an IP address; ignored"),
        }
    }
    out
}

fn string_field(meta: &Struct, key: &str) -> Option<String> {
    let value = meta.fields.get(key)?;
    let text = scalar(value);
    if text.is_none() {
        debug!(key, "node metadata value is not a string; ignored");
    }
    text
}

/// A scalar as pilot-agent would have written it: strings as they are, numbers and booleans as text.
pub(super) fn scalar(v: &Value) -> Option<String> {
    match &v.kind {
        Some(ValueKind::StringValue(s)) => Some(s.clone()),
        Some(ValueKind::NumberValue(n)) => Some(n.to_string()),
        Some(ValueKind::BoolValue(b)) => Some(b.to_string()),
        _ => None,
    }
}

/// A struct of scalars (entries of other shapes dropped); `None` if not a struct.
fn string_map(v: &Value, key: &str) -> Option<Labels> {
    match &v.kind {
        Some(ValueKind::StructValue(s)) => {
            Some(s.fields.iter().filter_map(|(k, v)| Some((k.clone(), scalar(v)?))).collect())
        }
        _ => {
            debug!(key, "node metadata value is not a struct; ignored");
            None
        }
    }
}

fn proxy_config(v: &Value) -> Option<ProxyConfigMeta> {
    let Some(ValueKind::StructValue(s)) = &v.kind else {
        debug!(key = "PROXY_CONFIG", "node metadata value is not a struct; ignored");
        return None;
    };
    let concurrency = s.fields.get("concurrency").and_then(|v| match &v.kind {
        Some(ValueKind::NumberValue(n)) if *n >= 0.0 && *n <= f64::from(u32::MAX) => Some(*n as u32),
        Some(ValueKind::StringValue(t)) => t.parse().ok(),
        _ => None,
    });
    Some(ProxyConfigMeta {
        discovery_address: s.fields.get("discoveryAddress").and_then(scalar).unwrap_or_default(),
        concurrency,
        proxy_metadata: s
            .fields
            .get("proxyMetadata")
            .and_then(|v| string_map(v, "PROXY_CONFIG.proxyMetadata"))
            .unwrap_or_default(),
        tracing: s.fields.get("tracing").and_then(tracing),
    })
}

fn tracing(v: &Value) -> Option<ProxyTracing> {
    match serde_json::from_value::<ProxyTracing>(json(v)) {
        Ok(t) => Some(t.bounded()),
        Err(e) => {
            debug!(key = "PROXY_CONFIG.tracing", error = %Untrusted(&e.to_string()), "malformed; ignored");
            None
        }
    }
}

/// A protobuf `Value` as JSON (its depth is bounded by the protobuf decoder's recursion limit).
fn json(v: &Value) -> serde_json::Value {
    match &v.kind {
        Some(ValueKind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(ValueKind::NumberValue(n)) => serde_json::Number::from_f64(*n).map_or(serde_json::Value::Null, Into::into),
        Some(ValueKind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(ValueKind::StructValue(s)) => s.fields.iter().map(|(k, v)| (k.clone(), json(v))).collect(),
        Some(ValueKind::ListValue(l)) => l.values.iter().map(json).collect(),
        Some(ValueKind::NullValue(_)) | None => serde_json::Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Value {
        Value { kind: Some(ValueKind::StringValue(v.into())) }
    }

    fn n(v: f64) -> Value {
        Value { kind: Some(ValueKind::NumberValue(v)) }
    }

    fn st(fields: &[(&str, Value)]) -> Value {
        Value {
            kind: Some(ValueKind::StructValue(Struct {
                fields: fields.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            })),
        }
    }

    fn meta(fields: &[(&str, Value)]) -> Struct {
        Struct { fields: fields.iter().map(|(k, v)| (k.to_string(), v.clone())).collect() }
    }

    #[test]
    fn reads_what_pilot_agent_sends() {
        let m = meta(&[
            ("ISTIO_VERSION", s("1.24.0")),
            ("INTERCEPTION_MODE", s("REDIRECT")),
            ("INSTANCE_IPS", s("10.1.2.3,fd00:0::3")),
            ("LABELS", st(&[("app", s("reviews")), ("version", s("v1"))])),
            ("NAMESPACE", s("shop")),
            ("SERVICE_ACCOUNT", s("reviews")),
            ("CLUSTER_ID", s("Kubernetes")),
            ("WORKLOAD_NAME", s("reviews-v1")),
            ("MESH_ID", s("cluster.local")),
            ("NAME", s("reviews-v1-abc")),
            ("ENVOY_PROMETHEUS_PORT", n(15090.0)),
            ("POD_PORTS", s("[{\"containerPort\":9080}]")),
            (
                "PROXY_CONFIG",
                st(&[
                    ("discoveryAddress", s("istiod.istio-system.svc:15012")),
                    ("concurrency", n(2.0)),
                    ("proxyMetadata", st(&[("DNS_CAPTURE", s("true"))])),
                    (
                        "tracing",
                        st(&[
                            ("sampling", n(25.0)),
                            ("customTags", st(&[("team", st(&[("literal", st(&[("value", s("shop"))]))]))])),
                        ]),
                    ),
                ]),
            ),
        ]);
        let md = NodeMetadata::parse(Some(&m));
        assert_eq!(md.istio_version.as_deref(), Some("1.24.0"));
        assert_eq!(md.interception, Some(Interception::Redirect));
        assert_eq!(md.instance_ips, ["10.1.2.3", "fd00::3"]);
        assert_eq!(md.labels.as_ref().and_then(|l| l.get("version")).map(String::as_str), Some("v1"));
        assert_eq!(md.namespace.as_deref(), Some("shop"));
        assert_eq!(md.service_account.as_deref(), Some("reviews"));
        assert_eq!(md.cluster_id.as_deref(), Some("Kubernetes"));
        assert_eq!(md.workload_name.as_deref(), Some("reviews-v1"));
        assert_eq!(md.mesh_id.as_deref(), Some("cluster.local"));
        assert_eq!(md.pod_name.as_deref(), Some("reviews-v1-abc"));
        let pc = md.proxy_config.expect("PROXY_CONFIG");
        assert_eq!(pc.discovery_address, "istiod.istio-system.svc:15012");
        assert_eq!(pc.concurrency, Some(2));
        assert_eq!(pc.proxy_metadata.get("DNS_CAPTURE").map(String::as_str), Some("true"));
        let tracing = pc.tracing.expect("PROXY_CONFIG.tracing");
        assert_eq!(tracing.sampling, crate::mesh::Sampling(25.0));
        assert_eq!(tracing.custom_tags["team"], crate::mesh::CustomTag::Literal { value: "shop".into() });
    }

    #[test]
    fn malformed_known_values_are_ignored() {
        let m = meta(&[
            ("INTERCEPTION_MODE", s("SIDEWAYS")),
            ("INSTANCE_IPS", s("not-an-ip, 10.0.0.7,,10.0.0.7,999.1.1.1")),
            ("LABELS", s("app=reviews")),
            ("NAMESPACE", st(&[])),
            ("SERVICE_ACCOUNT", Value { kind: None }),
            ("PROXY_CONFIG", s("{}")),
            ("ISTIO_VERSION", n(1.5)),
        ]);
        let md = NodeMetadata::parse(Some(&m));
        assert_eq!(md.interception, Some(Interception::Redirect), "Istio's default");
        assert_eq!(md.instance_ips, ["10.0.0.7"]);
        assert_eq!(md.labels, None);
        assert_eq!(md.namespace, None);
        assert_eq!(md.service_account, None);
        assert_eq!(md.proxy_config, None);
        assert_eq!(md.istio_version.as_deref(), Some("1.5"));
        let weird_labels = meta(&[("LABELS", st(&[("a", n(3.0)), ("b", st(&[])), ("c", Value { kind: None })]))]);
        let labels = NodeMetadata::parse(Some(&weird_labels)).labels.expect("a struct");
        assert_eq!(labels.get("a").map(String::as_str), Some("3"));
        assert_eq!(labels.len(), 1, "non-scalar label values are dropped");
        let huge = meta(&[("PROXY_CONFIG", st(&[("concurrency", n(-4.0))]))]);
        assert_eq!(NodeMetadata::parse(Some(&huge)).proxy_config.and_then(|p| p.concurrency), None);
        let odd_tracing = meta(&[("PROXY_CONFIG", st(&[("tracing", st(&[("sampling", s("lots"))]))]))]);
        assert_eq!(NodeMetadata::parse(Some(&odd_tracing)).proxy_config.and_then(|p| p.tracing), None);
        assert_eq!(NodeMetadata::parse(None), NodeMetadata::default());
        let many: Vec<String> = (0..1000).map(|i| format!("10.0.{}.{}", i / 250, i % 250)).collect();
        let flood = meta(&[("INSTANCE_IPS", s(&many.join(",")))]);
        assert_eq!(NodeMetadata::parse(Some(&flood)).instance_ips.len(), MAX_INSTANCE_IPS);
    }
}
