//! Which frontend owns which proxy: consistent hashing of a proxy key over the members, computed
//! exactly as the Envoy load balancer in front of the frontends routes.
//!
//! The load balancer is an Envoy cluster of the frontends with `lb_policy: RING_HASH`, a route
//! `hash_policy` on the header [`PROXY_KEY_HEADER`] (which each proxy sends, carrying its
//! [`ProxyKey`]), and on each endpoint `metadata.filter_metadata["envoy.lb"].hash_key` = the
//! member id. For [`Ring`] to agree with Envoy host by host:
//! - list the endpoints in member-id order (as [`crate::membership::Members`] sorts them), all with
//!   the default weight, in one priority, without locality-weighted balancing;
//! - give Envoy's `ring_hash_lb_config` the same ring sizes as [`RingSettings`] (the defaults match);
//! - use the default hash function (xxHash) and no `hash_balance_factor`.

mod proxy_key;
mod ring;

pub use proxy_key::ProxyKey;
pub use ring::{key_hash, Ring, RingError, RingSettings};

/// The request header the load balancer hashes: the proxy's [`ProxyKey`] value.
pub const PROXY_KEY_HEADER: &str = "x-meshpilot-proxy-key";
