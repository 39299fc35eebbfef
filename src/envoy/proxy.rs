//! What translation knows of a proxy: its kind, the metadata its node declares, and the view of
//! the mesh its config depends on (and which snapshot changes can alter a view's resolution).

mod kind;
mod metadata;
mod resolution;
mod view;

pub use kind::ProxyKind;
pub use metadata::{Interception, NodeMetadata, ProxyConfigMeta};
pub use resolution::KeptResolutions;
pub use view::{ProxyView, SharedView};
