//! xDS serving: the ADS server, per-proxy connections and streams, and the cache of what
//! translation (`crate::envoy`) generated for each view. Its modules are private; what the rest of
//! the crate may use is re-exported here.

mod admission;
mod cache;
mod changes;
mod connection;
mod debug;
mod delta;
mod diff;
mod dump;
mod isolation;
mod limits;
mod metrics;
mod names;
mod protocol;
mod proxy;
mod resource_version;
mod response;
mod server;
mod session;
mod status;
mod stream;
mod stream_context;
#[cfg(test)]
mod stream_testing;
mod subscription;
mod wire;

pub use admission::{Admission, AdmissionSettings, DEFAULT_NEW_STREAMS_PER_SECOND, DEFAULT_PUSH_CONCURRENCY};
pub use cache::{Generated, GenerationCache, DEFAULT_BUDGET_BYTES};
pub use connection::{SotwResponse, StateOfTheWorld};
pub use debug::{control_plane_identifier, find_proxy, CONFIG_DUMP, SYNCZ};
pub use diff::{config_diff, ResourceDiff};
pub use dump::{config_dump, DumpedType};
pub use metrics::XdsMetrics;
pub use response::Framed;
pub use server::{accept_nodelay, AdsServer};
pub use status::{ConnectionRegistry, ConnectionStatus};
pub use stream::{serve, ConnectionContext};

/// The resource types, as translation names them.
pub use crate::envoy::TypeUrl;
