//! Envoy's messages as protobuf JSON, the way Envoy's admin endpoints write them: proto field
//! names, defaults left out, `Any` expanded with its `@type`. The mapping reads the descriptor set
//! envoy-types compiled (copied into `OUT_DIR` by the build script), so every extension meshpilot
//! generates (filters, transport sockets) is known.

use std::sync::LazyLock;

use prost::{Message, Name};
use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use serde_json::Value;

/// Why a message could not be written as JSON.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    /// The embedded descriptor set did not load.
    #[error("Envoy's descriptor set does not load: {0}")]
    Descriptors(String),
    /// The message type is not in the descriptor set.
    #[error("no descriptor for {0}")]
    UnknownType(String),
    /// The bytes do not decode as that type.
    #[error("decoding {name}: {source}")]
    Decode {
        /// The message type.
        name: String,
        /// The decoder's error.
        source: prost::DecodeError,
    },
    /// JSON mapping failed (e.g. an `Any` of a type the descriptor set lacks).
    #[error("writing {name} as JSON: {source}")]
    Json {
        /// The message type.
        name: String,
        /// The mapper's error.
        source: serde_json::Error,
    },
}

static POOL: LazyLock<Result<DescriptorPool, String>> = LazyLock::new(|| {
    DescriptorPool::decode(include_bytes!(concat!(env!("OUT_DIR"), "/envoy_descriptors.bin")).as_slice())
        .map_err(|e| e.to_string())
});

/// Envoy's JSON of `message`.
pub fn to_json<M: Message + Name>(message: &M) -> Result<Value, JsonError> {
    bytes_to_json(&M::full_name(), &message.encode_to_vec())
}

/// Envoy's JSON of the encoded message `bytes` of type `full_name` (e.g. `envoy.admin.v3.ConfigDump`).
pub fn bytes_to_json(full_name: &str, bytes: &[u8]) -> Result<Value, JsonError> {
    let pool = POOL.as_ref().map_err(|e| JsonError::Descriptors(e.clone()))?;
    let descriptor = pool.get_message_by_name(full_name).ok_or_else(|| JsonError::UnknownType(full_name.into()))?;
    let message = DynamicMessage::decode(descriptor, bytes)
        .map_err(|source| JsonError::Decode { name: full_name.into(), source })?;
    let options = SerializeOptions::new().use_proto_field_name(true).skip_default_fields(true);
    let mut value = message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|source| JsonError::Json { name: full_name.into(), source })?;
    integral_numbers(&mut value);
    Ok(value)
}

/// Writes doubles holding whole numbers as integers (`100`, not `100.0`), as Envoy's JSON
/// printer does, so that a dump compares equal to Envoy's own.
fn integral_numbers(value: &mut Value) {
    match value {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                // Below 2^53 every whole double is exactly an integer.
                if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 {
                    *n = serde_json::Number::from(f as i64);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_numbers),
        Value::Object(map) => map.values_mut().for_each(integral_numbers),
        _ => {}
    }
}

/// Envoy's JSON of `bytes` as [`bytes_to_json`] writes it, except that an `Any` of a type the
/// descriptor set lacks (extensions only Istio's Envoy build has, e.g. `stats.PluginConfig`) is
/// kept as `{"@type": URL, "@raw": HEX}` instead of failing the whole message: a comparison of
/// two servers' resources still sees every other field, and both sides' unknown blobs.
pub fn bytes_to_json_lenient(full_name: &str, bytes: &[u8]) -> Result<Value, JsonError> {
    match bytes_to_json(full_name, bytes) {
        Err(JsonError::Json { .. }) => {}
        done => return done,
    }
    let pool = POOL.as_ref().map_err(|e| JsonError::Descriptors(e.clone()))?;
    let descriptor = pool.get_message_by_name(full_name).ok_or_else(|| JsonError::UnknownType(full_name.into()))?;
    let mut message = DynamicMessage::decode(descriptor, bytes)
        .map_err(|source| JsonError::Decode { name: full_name.into(), source })?;
    opaque::wrap_unknown(&mut message, pool);
    let options = SerializeOptions::new().use_proto_field_name(true).skip_default_fields(true);
    let mut value = message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|source| JsonError::Json { name: full_name.into(), source })?;
    opaque::unwrap_marked(&mut value);
    integral_numbers(&mut value);
    Ok(value)
}

/// Unknown `Any` payloads carried through JSON mapping: wrapped as a `Struct` that marks them,
/// then unwrapped in the JSON into `{"@type", "@raw"}`, or for a `TypedStruct` (which the
/// descriptor set lacks, and whose content is JSON already) `{"@type", "type_url", "value"}`.
mod opaque {
    use prost::Message;
    use prost_reflect::{DescriptorPool, DynamicMessage, ReflectMessage, Value as PValue};
    use serde_json::Value;

    const STRUCT_URL: &str = "type.googleapis.com/google.protobuf.Struct";
    const MARK: &str = "@meshpilot_unknown_type";
    const RAW: &str = "@raw";

    /// Replaces every `Any` (at any depth, inside known `Any`s too) whose type `pool` lacks.
    pub(super) fn wrap_unknown(message: &mut DynamicMessage, pool: &DescriptorPool) {
        if message.descriptor().full_name() == "google.protobuf.Any" {
            return wrap_any(message, pool);
        }
        for (_, value) in message.fields_mut() {
            wrap_value(value, pool);
        }
    }

    fn wrap_value(value: &mut PValue, pool: &DescriptorPool) {
        match value {
            PValue::Message(m) => wrap_unknown(m, pool),
            PValue::List(items) => items.iter_mut().for_each(|v| wrap_value(v, pool)),
            PValue::Map(map) => map.values_mut().for_each(|v| wrap_value(v, pool)),
            _ => {}
        }
    }

    fn wrap_any(any: &mut DynamicMessage, pool: &DescriptorPool) {
        let url = any.get_field_by_name("type_url").and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
        let bytes = any.get_field_by_name("value").and_then(|v| v.as_bytes().cloned()).unwrap_or_default();
        let inner = pool
            .get_message_by_name(url.rsplit('/').next().unwrap_or_default())
            .and_then(|d| DynamicMessage::decode(d, bytes.as_ref()).ok());
        let replacement = match inner {
            Some(mut inner) => {
                wrap_unknown(&mut inner, pool);
                (url, inner.encode_to_vec())
            }
            None => (STRUCT_URL.to_string(), marker(&url, &bytes)),
        };
        any.set_field_by_name("type_url", PValue::String(replacement.0));
        any.set_field_by_name("value", PValue::Bytes(replacement.1.into()));
    }

    /// `xds.type.v3.TypedStruct` and `udpa.type.v1.TypedStruct`, which share this layout.
    #[derive(Clone, PartialEq, prost::Message)]
    struct TypedStruct {
        #[prost(string, tag = "1")]
        type_url: String,
        #[prost(message, optional, tag = "2")]
        value: Option<envoy_types::pb::google::protobuf::Struct>,
    }

    fn marker(url: &str, bytes: &[u8]) -> Vec<u8> {
        use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value as PbValue};
        let text = |s: String| PbValue { kind: Some(Kind::StringValue(s)) };
        let mut fields: std::collections::HashMap<String, PbValue> =
            [(MARK.to_string(), text(url.to_string()))].into_iter().collect();
        let typed = url.ends_with("/xds.type.v3.TypedStruct") || url.ends_with("/udpa.type.v1.TypedStruct");
        match TypedStruct::decode(bytes).ok().filter(|_| typed) {
            Some(t) => {
                fields.insert("type_url".into(), text(t.type_url));
                fields.insert("value".into(), PbValue { kind: Some(Kind::StructValue(t.value.unwrap_or_default())) });
            }
            None => {
                fields.insert(RAW.into(), text(bytes.iter().map(|b| format!("{b:02x}")).collect()));
            }
        }
        Struct { fields }.encode_to_vec()
    }

    /// Turns the marked `Struct`s back into `{"@type": URL, "@raw": HEX}`.
    pub(super) fn unwrap_marked(value: &mut Value) {
        match value {
            Value::Object(map) => {
                let marked = map.get("@type").and_then(Value::as_str) == Some(STRUCT_URL)
                    && map.get("value").is_some_and(|v| v.get(MARK).is_some());
                if marked {
                    if let Some(Value::Object(mut inner)) = map.remove("value") {
                        map.insert("@type".into(), inner.remove(MARK).unwrap_or_default());
                        map.extend(inner);
                    }
                } else {
                    map.values_mut().for_each(unwrap_marked);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(unwrap_marked),
            _ => {}
        }
    }
}

/// The message of type `M` that Envoy's JSON `value` writes (what an admin endpoint answered).
pub fn from_json<M: Message + Name + Default>(value: &Value) -> Result<M, JsonError> {
    let name = M::full_name();
    let pool = POOL.as_ref().map_err(|e| JsonError::Descriptors(e.clone()))?;
    let descriptor = pool.get_message_by_name(&name).ok_or_else(|| JsonError::UnknownType(name.clone()))?;
    let message = DynamicMessage::deserialize(descriptor, value)
        .map_err(|source| JsonError::Json { name: name.clone(), source })?;
    message.transcode_to::<M>().map_err(|source| JsonError::Decode { name, source })
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::cluster::v3::{cluster, Cluster};
    use envoy_types::pb::google::protobuf::{Any, Duration};
    use serde_json::json;

    use super::*;

    #[test]
    fn writes_proto_field_names_durations_enums_and_expanded_any() {
        let c = Cluster {
            name: "outbound|80||a.ns.svc.cluster.local".into(),
            connect_timeout: Some(Duration { seconds: 10, nanos: 0 }),
            lb_policy: cluster::LbPolicy::LeastRequest as i32,
            ..Default::default()
        };
        assert_eq!(
            to_json(&c).expect("json"),
            json!({"name": "outbound|80||a.ns.svc.cluster.local", "connect_timeout": "10s", "lb_policy": "LEAST_REQUEST"})
        );
        let any = Any { type_url: Cluster::type_url(), value: c.encode_to_vec() };
        let expanded = to_json(&any).expect("json");
        assert_eq!(expanded["@type"], "type.googleapis.com/envoy.config.cluster.v3.Cluster");
        assert_eq!(expanded["connect_timeout"], "10s");
    }

    #[test]
    fn json_reads_back_into_the_message() {
        let c = Cluster {
            name: "a".into(),
            connect_timeout: Some(Duration { seconds: 1, nanos: 500_000_000 }),
            ..Default::default()
        };
        let any = Any { type_url: Cluster::type_url(), value: c.encode_to_vec() };
        let back: Any = from_json(&to_json(&any).expect("json")).expect("reads back");
        assert_eq!(Cluster::decode(back.value.as_slice()).expect("decodes"), c);
        assert!(from_json::<Cluster>(&json!({"name": 5})).is_err());
    }

    #[test]
    fn whole_doubles_are_written_as_integers_as_envoy_does() {
        use envoy_types::pb::envoy::r#type::v3::Percent;
        assert_eq!(to_json(&Percent { value: 100.0 }).expect("json"), json!({"value": 100}));
        assert_eq!(to_json(&Percent { value: 0.5 }).expect("json"), json!({"value": 0.5}));
        let back: Percent = from_json(&json!({"value": 100})).expect("reads back");
        assert_eq!(back.value, 100.0);
    }

    #[test]
    fn lenient_json_keeps_unknown_extensions_raw_and_typed_structs_as_json() {
        use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
        use envoy_types::pb::envoy::config::listener::v3::{Filter, Listener};
        let unknown = Any { type_url: "type.googleapis.com/stats.PluginConfig".into(), value: vec![8, 1] };
        let listener = Listener {
            name: "l".into(),
            listener_filters: vec![],
            filter_chains: vec![envoy_types::pb::envoy::config::listener::v3::FilterChain {
                filters: vec![Filter {
                    name: "istio.stats".into(),
                    config_type: Some(ConfigType::TypedConfig(unknown)),
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let bytes = listener.encode_to_vec();
        assert!(bytes_to_json("envoy.config.listener.v3.Listener", &bytes).is_err());
        let json = bytes_to_json_lenient("envoy.config.listener.v3.Listener", &bytes).expect("lenient json");
        assert_eq!(
            json["filter_chains"][0]["filters"][0]["typed_config"],
            json!({"@type": "type.googleapis.com/stats.PluginConfig", "@raw": "0801"})
        );
        assert_eq!(json["name"], "l");

        use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value as PbValue};
        let config = Struct {
            fields: [("k".to_string(), PbValue { kind: Some(Kind::StringValue("v".into())) })].into_iter().collect(),
        };
        let typed = opaque_typed_struct_bytes("type.googleapis.com/some.Filter", config);
        let any = Any { type_url: "type.googleapis.com/xds.type.v3.TypedStruct".into(), value: typed };
        let json = bytes_to_json_lenient("google.protobuf.Any", &any.encode_to_vec()).expect("lenient json");
        assert_eq!(
            json,
            json!({"@type": "type.googleapis.com/xds.type.v3.TypedStruct", "type_url": "type.googleapis.com/some.Filter", "value": {"k": "v"}})
        );
    }

    /// A TypedStruct's encoding: the type URL (field 1) and the Struct (field 2).
    fn opaque_typed_struct_bytes(url: &str, value: envoy_types::pb::google::protobuf::Struct) -> Vec<u8> {
        let mut out = Vec::new();
        prost::encoding::string::encode(1, &url.to_string(), &mut out);
        prost::encoding::message::encode(2, &value, &mut out);
        out
    }

    #[test]
    fn ext_authz_filters_are_known_types() {
        // CUSTOM policies put them in listeners; /debug/config_dump must expand them.
        use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::ExtAuthz;
        use envoy_types::pb::envoy::extensions::filters::network::ext_authz::v3::ExtAuthz as NetworkExtAuthz;
        let http = ExtAuthz { failure_mode_allow: true, ..Default::default() };
        let any = Any { type_url: ExtAuthz::type_url(), value: http.encode_to_vec() };
        assert_eq!(to_json(&any).expect("json")["failure_mode_allow"], true);
        let tcp = NetworkExtAuthz { stat_prefix: "tcp.".into(), ..Default::default() };
        let any = Any { type_url: NetworkExtAuthz::type_url(), value: tcp.encode_to_vec() };
        assert_eq!(to_json(&any).expect("json")["stat_prefix"], "tcp.");
    }

    #[test]
    fn bad_bytes_and_unknown_types_are_errors() {
        assert!(matches!(bytes_to_json("envoy.config.cluster.v3.Cluster", &[0xff]), Err(JsonError::Decode { .. })));
        assert!(matches!(bytes_to_json("no.such.Type", &[]), Err(JsonError::UnknownType(_))));
    }
}
