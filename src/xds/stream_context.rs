//! What every ADS stream carries, whatever protocol serves it: who opened it, what it needs from
//! its frontend, and why it ended.

use std::sync::Arc;

use tonic::Status;

use super::admission::Admission;
use super::cache::GenerationCache;
use super::limits;
use super::metrics::XdsMetrics;
use super::proxy::Proxy;
use super::status::ConnectionRegistry;
use crate::drain::DrainWatcher;
use crate::security::Identity;
use crate::snapshot::SnapshotReader;
use crate::telemetry::log_text::Untrusted;

/// Who opened a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The plaintext port, for local use: whoever can reach it may claim any node.
    Unauthenticated,
    /// The secure port: the identities the caller proved (client certificate or token). The
    /// node it claims must be one of them.
    Authenticated(Vec<Identity>),
}

impl Caller {
    /// Whether the caller proved an identity (the secure port).
    pub fn is_authenticated(&self) -> bool {
        matches!(self, Caller::Authenticated(_))
    }

    /// Checks the claimed node as istiod does: some identity has the proxy's namespace and, when
    /// the node names one, its service account; else the stream ends with PERMISSION_DENIED.
    pub fn authorize(&self, proxy: &Proxy) -> Result<(), Status> {
        let Caller::Authenticated(identities) = self else { return Ok(()) };
        let allowed = identities.iter().any(|id| {
            id.namespace() == proxy.namespace
                && (proxy.service_account.is_empty() || id.service_account() == proxy.service_account)
        });
        if allowed {
            return Ok(());
        }
        let ids: Vec<String> = identities.iter().map(ToString::to_string).collect();
        Err(Status::permission_denied(format!(
            "authorization failed: no identity of the caller ({}) matches the node's namespace {:?} and service account {:?}",
            ids.join(", "),
            proxy.namespace,
            proxy.service_account
        )))
    }
}

/// What a connection needs from its frontend.
#[derive(Clone)]
pub struct ConnectionContext {
    /// Latest snapshot.
    pub snapshots: SnapshotReader,
    /// Shared generation cache.
    pub cache: Arc<GenerationCache>,
    /// Live connections.
    pub registry: Arc<ConnectionRegistry>,
    /// Metrics of this server.
    pub metrics: XdsMetrics,
    /// Held by every stream; when the drain starts each ends, so proxies reconnect elsewhere.
    pub drain: DrainWatcher,
    /// New-stream rate, push concurrency and stream age.
    pub admission: Arc<Admission>,
    /// How answers name this server (see [`super::debug::control_plane_identifier`]).
    pub control_plane: Arc<str>,
}

/// Why a stream ended.
#[derive(Debug, thiserror::Error)]
pub enum StreamEnd {
    /// The proxy closed it.
    #[error("closed by the proxy")]
    Closed,
    /// The proxy sent something unusable.
    #[error("{0}")]
    Invalid(String),
    /// The request broke a limit or did not decode; the client gets this status.
    #[error("refused: {}", Untrusted(.0.message()))]
    Refused(Status),
    /// The response channel is gone.
    #[error("response stream dropped")]
    Dropped,
    /// The frontend is shutting down.
    #[error("frontend shutting down")]
    Draining,
    /// The stream reached its maximum age; the proxy reconnects, maybe to another frontend.
    #[error("maximum stream age reached")]
    MaxAge,
}

/// A limit the request broke, as the status the stream ends with.
pub fn over_limit(error: limits::LimitError) -> StreamEnd {
    StreamEnd::Refused(Status::resource_exhausted(error.to_string()))
}
