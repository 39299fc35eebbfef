//! What generators produce: one named, encoded Envoy resource.

use envoy_types::pb::google::protobuf::Any;

/// One named, encoded Envoy resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    /// Resource name (cluster, listener, route config or cluster-load-assignment name).
    pub name: String,
    /// The resource, packed.
    pub body: Any,
}
