//! What translation knows of a proxy: its kind, the metadata its node declares, and the view of
//! the mesh its config depends on.

mod kind;
mod metadata;
mod trace_identity;
mod view;

pub use kind::ProxyKind;
pub use metadata::{Interception, NodeMetadata, ProxyConfigMeta};
pub use trace_identity::TraceIdentity;
pub use view::{ProxyView, SharedView};
