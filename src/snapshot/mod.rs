//! The PushContext snapshot: an immutable, versioned value carrying the keys that changed, and the
//! one-writer/many-readers channel it is published on, and the one builder of it that ingest
//! (from source events) and frontends (from replicated updates) both feed. Sending it to other
//! processes is replication's job.

mod builder;
mod changes;
mod channel;
mod config_index;
mod credentials;
mod delegation;
mod destination_rules;
mod ext_authz;
mod history;
mod peer_authn;
mod push_context;
mod security;
mod version;

pub use builder::SnapshotBuilder;
pub use changes::{ChangeSet, ChangedKey};
pub use channel::{channel, SnapshotReader, SnapshotWriter, StaleSnapshot};
pub use config_index::Indexed;
pub use credentials::{secret_name, CA_SECRET_SUFFIX};
pub use destination_rules::{Direction, MergedRule};
pub use ext_authz::ResolvedProvider;
pub use history::{SnapshotHistory, DEFAULT_DEPTH as DEFAULT_HISTORY_DEPTH};
pub use peer_authn::PeerMtls;
pub use push_context::{qualify_gateway, vs_applies_to_gateway, Snapshot, SourceState};
pub use security::{RejectedPolicy, SecurityIndex};
pub use version::{ParseVersionError, Version};
