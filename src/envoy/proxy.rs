//! What translation knows of a proxy: its kind, the metadata its node declares, and the view of
//! the mesh its config depends on.

mod kind;
mod metadata;
mod view;

pub use kind::ProxyKind;
pub use metadata::{Interception, NodeMetadata, ProxyConfigMeta};
pub use view::{ProxyView, SharedView};
