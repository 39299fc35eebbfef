//! Mesh configuration: Istio API types, parsing, validation, and the file source.

pub mod api;
pub mod decode;
pub mod error;
pub mod object;
pub mod parse;
pub mod render;
pub mod validation;

#[cfg(test)]
pub(crate) mod fuzz_seeds;

pub use error::{ConfigError, FieldError, IgnoredObject};
pub use object::{ConfigKey, ConfigObject, ConfigObjects, Kind, Spec, ValidConfig};
