//! The snapshot wire form between the leader ingest node and frontends: the protobuf messages,
//! the payload encoding (full state or delta) and the splitting of payloads into chunks.
//!
//! Payloads are JSON: config objects travel as the Istio documents users write, so a payload
//! can be read with `jq`, and the frontend rebuilds objects with the same parser the file source
//! uses. JSON costs size and CPU compared to a binary form, but updates are deltas after the first
//! full snapshot; `PayloadEncoding` leaves room for a binary form later.

mod chunk;
mod delta;
mod payload;

pub use chunk::{Assembled, Assembler, EncodedUpdate, CHUNK_SIZE, MAX_PAYLOAD};
pub use delta::Delta;
pub use payload::{decode_delta, decode_full, encode_delta, encode_full, FullUpdate};

/// Test fixtures shared with the subscription tests.
#[cfg(test)]
pub(crate) use payload::tests as tests_support;

use crate::config::{ConfigKey, FieldError};
use crate::registry::kubernetes::KubeKey;
use crate::snapshot::Version;

/// The generated protobuf types and gRPC stubs of `meshpilot.snapshot.v1`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("meshpilot.snapshot.v1");
}

/// Why a payload or chunk sequence could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Serializing a payload failed.
    #[error("encoding a {kind} payload: {source}")]
    Encode {
        /// `full` or `delta`.
        kind: &'static str,
        /// Cause.
        source: serde_json::Error,
    },
    /// The payload is not the JSON expected for its kind.
    #[error("{kind} payload is not valid: {source}")]
    Json {
        /// `full` or `delta`.
        kind: &'static str,
        /// Cause.
        source: serde_json::Error,
    },
    /// A config document in the payload does not parse.
    #[error("config document {index} ({}): {error}", .key.as_ref().map(ToString::to_string).unwrap_or_default())]
    Document {
        /// 0-based position in the payload.
        index: usize,
        /// The object, if its identity could be read.
        key: Option<ConfigKey>,
        /// What is wrong.
        error: FieldError,
    },
    /// A config document is of a kind meshpilot does not serve.
    #[error("config document {index} is not a kind meshpilot serves")]
    NotServed {
        /// 0-based position in the payload.
        index: usize,
    },
    /// The same object appears twice.
    #[error("config object {0} appears twice in the payload")]
    Duplicate(ConfigKey),
    /// The same Kubernetes object appears twice.
    #[error("Kubernetes object {0} appears twice in the payload")]
    DuplicateKube(KubeKey),
    /// A chunk names an encoding this build does not know.
    #[error("unknown payload encoding {0}")]
    Encoding(i32),
    /// A chunk names an update kind this build does not know.
    #[error("unknown update kind {0}")]
    Kind(i32),
    /// A chunk has no version.
    #[error("chunk without a version")]
    MissingVersion,
    /// A delta chunk has no base version.
    #[error("delta {0} without a base version")]
    MissingBase(Version),
    /// Chunks arrived out of order or with inconsistent headers.
    #[error("chunk {index}/{count} of {version}: {reason}")]
    Sequence {
        /// Version of the chunk.
        version: Version,
        /// Its index.
        index: u32,
        /// Its count.
        count: u32,
        /// What is inconsistent.
        reason: &'static str,
    },
    /// The reassembled payload would exceed [`MAX_PAYLOAD`].
    #[error("update {version} exceeds {MAX_PAYLOAD} bytes")]
    TooLarge {
        /// Version of the update.
        version: Version,
    },
}

/// A version on the wire.
pub fn version_to_wire(v: Version) -> proto::Version {
    proto::Version { term: v.term, seq: v.seq }
}

/// A version from the wire; absent and zero mean "none".
pub fn version_from_wire(v: Option<&proto::Version>) -> Option<Version> {
    v.map(|v| Version::new(v.term, v.seq)).filter(|v| *v != Version::default())
}
