//! Conversions from meshpilot values to protobuf well-known and Envoy core types.

use envoy_types::pb::envoy::config::core::v3::{
    address, config_source, socket_address, Address, AggregatedConfigSource, ApiVersion, ConfigSource, Pipe,
    SocketAddress,
};
use envoy_types::pb::envoy::r#type::v3::{fractional_percent::DenominatorType, FractionalPercent};
use envoy_types::pb::google::protobuf::{Any, BoolValue, Duration, UInt32Value};
use prost::{Message, Name};

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::sync::OnceLock;

use super::resource::Resource;
use crate::config::api::common::Percent;

/// Packs a message into a named resource.
pub(super) fn resource<T: Name + Message>(name: impl Into<String>, message: T) -> Resource {
    Resource { name: name.into(), body: any(message) }
}

/// Packs a message into an `Any`.
pub(super) fn any<T: Name + Message>(message: T) -> Any {
    envoy_types::util::pack_any(message)
}

/// A protobuf duration.
pub(super) fn duration(d: std::time::Duration) -> Duration {
    Duration { seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nanos: d.subsec_nanos() as i32 }
}

/// Istio's "no timeout": an explicit zero duration.
pub(super) fn zero_duration() -> Duration {
    Duration { seconds: 0, nanos: 0 }
}

/// A `UInt32Value`.
pub(super) fn u32_value(value: u32) -> UInt32Value {
    UInt32Value { value }
}

/// A `BoolValue`.
pub(super) fn bool_value(value: bool) -> BoolValue {
    BoolValue { value }
}

/// Clamps a config integer into a `u32` (negative values become 0).
pub(super) fn clamp_u32(value: i32) -> u32 {
    u32::try_from(value).unwrap_or(0)
}

/// The ADS config source every dynamic resource (EDS, RDS) is fetched from. A zero
/// `initial_fetch_timeout` makes Envoy wait for the resource instead of warming without it.
pub(super) fn ads_config_source() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        initial_fetch_timeout: Some(zero_duration()),
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..Default::default()
    }
}

/// A TCP socket address, or a pipe for `unix://` addresses.
pub(super) fn socket_address(address: &str, port: u32) -> Address {
    if let Some(path) = address.strip_prefix("unix://") {
        return Address { address: Some(address::Address::Pipe(Pipe { path: path.to_string(), mode: 0 })) };
    }
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: address.to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

/// Istio's percent → fractional percent: a share of a million, so fractions survive.
pub(super) fn percent_of_million(p: &Percent) -> FractionalPercent {
    let numerator = (p.value.clamp(0.0, 100.0) * 10_000.0).round() as u32;
    FractionalPercent { numerator, denominator: DenominatorType::Million as i32 }
}

/// An integer percentage as a fractional percent of a hundred.
pub(super) fn percent_of_hundred(p: u32) -> FractionalPercent {
    FractionalPercent { numerator: p.min(100), denominator: DenominatorType::Hundred as i32 }
}

/// A protobuf map field. prost maps are `HashMap`s, which encode in iteration order; sharing one
/// hasher state across the process makes equal maps encode to equal bytes, so regenerating a
/// resource from the same snapshot reproduces it exactly.
pub(super) fn map_field<V>(entries: impl IntoIterator<Item = (String, V)>) -> HashMap<String, V> {
    static STATE: OnceLock<RandomState> = OnceLock::new();
    let mut map = HashMap::with_hasher(STATE.get_or_init(RandomState::new).clone());
    map.extend(entries);
    map
}
