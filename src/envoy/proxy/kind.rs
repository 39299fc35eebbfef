//! What a proxy is: a sidecar or a gateway.

use serde::Serialize;

/// Role of a proxy, from the first part of its node id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum ProxyKind {
    /// `sidecar~...`: a workload's sidecar.
    Sidecar,
    /// `router~...`: a gateway.
    Router,
}
