//! The ADS server of a frontend: its connection context and the gRPC service over it.

use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::{Stream, StreamExt};

use super::admission::{Admission, AdmissionSettings};
use super::cache::GenerationCache;
use super::metrics::XdsMetrics;
use super::status::ConnectionRegistry;
use super::stream::ConnectionContext;
use super::wire::AdsService;
use crate::drain::DrainWatcher;
use crate::snapshot::SnapshotReader;

/// The ADS server of a frontend.
#[derive(Clone)]
pub struct AdsServer {
    ctx: ConnectionContext,
}

impl AdsServer {
    /// A server serving snapshots from `snapshots` within `admission`'s limits; every stream
    /// holds `drain` and ends when it starts.
    pub fn new(
        snapshots: SnapshotReader,
        registry: Arc<ConnectionRegistry>,
        metrics: XdsMetrics,
        drain: DrainWatcher,
        admission: AdmissionSettings,
    ) -> Self {
        let cache = Arc::new(GenerationCache::new(metrics.clone(), admission.config_memory_bytes));
        let admission = Arc::new(Admission::new(admission));
        let control_plane = super::debug::control_plane_identifier("meshpilot").into();
        AdsServer { ctx: ConnectionContext { snapshots, cache, registry, metrics, drain, admission, control_plane } }
    }

    /// Names this server `id` in answers to debug clients (istioctl's ISTIOD column).
    pub fn with_server_id(mut self, id: &str) -> Self {
        self.ctx.control_plane = super::debug::control_plane_identifier(id).into();
        self
    }

    /// The gRPC service (state of the world and delta) for anyone (the plaintext port).
    pub fn into_service(self) -> AdsService {
        AdsService::new(self.ctx)
    }

    /// The gRPC service for callers `authn` authenticates, each limited to its own node (the
    /// secure port).
    pub fn authenticated_service(&self, authn: Arc<crate::security::Authenticator>) -> AdsService {
        AdsService::authenticated(self.ctx.clone(), authn)
    }

    /// The generation cache (shared with debug endpoints).
    pub fn cache(&self) -> Arc<GenerationCache> {
        self.ctx.cache.clone()
    }
}

/// The connections `listener` accepts, with Nagle's algorithm off (as gRPC-Go and Envoy set it):
/// otherwise the last segment of a response waits for the client's delayed ACK, up to 40 ms.
pub fn accept_nodelay(listener: TcpListener) -> impl Stream<Item = std::io::Result<TcpStream>> {
    TcpListenerStream::new(listener).map(|accepted| {
        accepted.inspect(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "could not set TCP_NODELAY");
            }
        })
    })
}
