//! The ADS gRPC service.

use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::admission::{Admission, AdmissionSettings};
use super::cache::{GenerationCache, DEFAULT_BUDGET_BYTES};
use super::connection::StateOfTheWorld;
use super::delta::Delta;
use super::metrics::XdsMetrics;
use super::status::ConnectionRegistry;
use super::stream::{serve, ConnectionContext};
use crate::drain::DrainWatcher;
use crate::snapshot::SnapshotReader;

/// Responses buffered per connection before the connection task waits (back-pressure).
const RESPONSE_QUEUE: usize = 8;

/// Largest message sent to a proxy (a full CDS or EDS of a large mesh).
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

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
        let cache = Arc::new(GenerationCache::new(metrics.clone(), DEFAULT_BUDGET_BYTES));
        let admission = Arc::new(Admission::new(admission));
        AdsServer { ctx: ConnectionContext { snapshots, cache, registry, metrics, drain, admission } }
    }

    /// The tonic service.
    pub fn into_service(self) -> AggregatedDiscoveryServiceServer<AdsServer> {
        AggregatedDiscoveryServiceServer::new(self)
            .max_decoding_message_size(super::limits::MAX_REQUEST_BYTES)
            .max_encoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// The generation cache (shared with debug endpoints).
    pub fn cache(&self) -> Arc<GenerationCache> {
        self.ctx.cache.clone()
    }
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsServer {
    type StreamAggregatedResourcesStream = ResponseStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = ResponseStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let requests = request.into_inner();
        let (tx, rx) = mpsc::channel(RESPONSE_QUEUE);
        let ctx = self.ctx.clone();
        tokio::spawn(async move {
            serve(ctx, StateOfTheWorld::default(), requests, tx).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let requests = request.into_inner();
        let (tx, rx) = mpsc::channel(RESPONSE_QUEUE);
        let ctx = self.ctx.clone();
        tokio::spawn(async move {
            serve(ctx, Delta::default(), requests, tx).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
