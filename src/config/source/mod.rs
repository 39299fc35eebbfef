//! Config sources: where Istio objects come from.

pub mod files;
mod watcher;

pub use watcher::{watch_config_dir, DirState};
