//! The PushContext snapshot: an immutable, versioned value carrying the keys that changed.

mod changes;
mod channel;
mod push_context;
pub mod subscription;
mod version;
pub mod wire;

pub use changes::{ChangeSet, ChangedKey};
pub use channel::{channel, SnapshotReader, SnapshotWriter, StaleSnapshot};
pub use push_context::{qualify_gateway, vs_applies_to_gateway, IgnoredObject, Indexed, Snapshot, SourceState};
pub use version::{ParseVersionError, Version};
