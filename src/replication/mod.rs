//! Replication: snapshots between processes over gRPC. [`wire`] is the wire form; the leader
//! ingest node serves its snapshots ([`SnapshotServer`]), frontends follow the leader and rebuild
//! them ([`SnapshotSubscriber`]).
//!
//! A subscriber says which version it holds; the leader answers with the deltas since then (one
//! coalesced delta) when that version is in its history of the current term, else with a full
//! snapshot, then streams every new snapshot as a delta. Terms fence deposed leaders: a frontend
//! never applies a term below the highest it has seen.

mod apply;
mod history;
pub mod metrics;
mod send_queue;
mod server;
mod status;
mod subscriber;
pub mod wire;

pub use server::{ServerSettings, SnapshotServer, TOO_MANY_SUBSCRIBERS, TOO_SLOW};
pub use status::SubscriberStatus;
pub use subscriber::{SnapshotSubscriber, SubscribeError, SubscriberSettings};
