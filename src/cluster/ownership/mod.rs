//! Which frontend owns which proxy: consistent hashing of a proxy key over the members, computed
//! exactly as the Envoy load balancer in front of the frontends routes.
//!
//! The load balancer is an Envoy cluster of the frontends with a route `hash_policy` on the header
//! [`PROXY_KEY_HEADER`] (which each proxy sends, carrying its [`ProxyKey`]), and on each endpoint
//! `metadata.filter_metadata["envoy.lb"].hash_key` = the member id. Its `lb_policy` is one of two
//! consistent hashes, chosen by [`ProxyHashing`] and looked up through [`Ownership`]:
//!
//! - **`MAGLEV`** ([`Maglev`], the default). When a frontend leaves, only about its own share of
//!   proxies moves: with 4 frontends, removing one moves ≈ 25% of the keys plus a few percent of
//!   table reshuffling (the unit test measures it), and adding it back restores every owner. Every
//!   proxy that moves reconnects and costs its new frontend a full push, so fewer moves is what
//!   matters for a control plane; Maglev's table (65537 slots) also spreads keys evenly.
//! - **`RING_HASH`** ([`Ring`]). Envoy gives every host `ring_size / n` entries, so when a host
//!   leaves each remaining host gets new entries, and those take keys from the *other remaining*
//!   hosts too: with 4 frontends about 3/8 (37.5%) of the keys move, half again the necessary
//!   quarter. Kept for load balancers already configured with it.
//!
//! For the frontends' computation to agree with Envoy host by host:
//! - all endpoints with the default weight, in one priority, without locality-weighted balancing,
//!   no `hash_balance_factor`, the default hash function (xxHash);
//! - the same sizes as [`MaglevSettings`] (`maglev_lb_config.table_size`) or [`RingSettings`]
//!   (`ring_hash_lb_config`); the defaults match Envoy's;
//! - ring hash only: the endpoints listed in member-id order (as [`crate::cluster::membership::Members`]
//!   sorts them), since leftover ring entries fall on hosts by position. Maglev sorts hosts by
//!   hash key itself, so for it the endpoint order does not matter.

mod hashing;
mod maglev;
mod proxy_key;
mod ring;

use xxhash_rust::xxh64::xxh64;

pub use hashing::{Ownership, OwnershipError, ProxyHashing};
pub use maglev::{Maglev, MaglevError, MaglevSettings};
pub use proxy_key::{ProxyIdentity, ProxyKey};
pub use ring::{Ring, RingError, RingSettings};

/// The request header the load balancer hashes: the proxy's [`ProxyKey`] value.
pub const PROXY_KEY_HEADER: &str = "x-meshpilot-proxy-key";

/// The hash Envoy computes for a request whose proxy-key header is `key`: xxHash64 of the value,
/// seed 0 (several values of the header would be sorted and hashed together: proxies send one).
pub fn key_hash(key: &str) -> u64 {
    xxh64(key.as_bytes(), 0)
}
