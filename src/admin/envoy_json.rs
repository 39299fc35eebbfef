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
    message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|source| JsonError::Json { name: full_name.into(), source })
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
