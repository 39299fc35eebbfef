//! Opening one simulated proxy's ADS stream, shared by the SotW and delta clients: its own HTTP/2
//! connection (as every Envoy has), the load balancer's routing header, and raw response bytes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio_stream::Stream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::MetadataValue;
use tonic::Streaming;

use super::board::SharedBoard;
use super::identity::{ProxyIdentity, PROXY_KEY_HEADER};
use super::names::NameCache;
use crate::sim::codec::RawResponses;

/// Responses larger than this end the stream (Envoy's default limit is far below; a bound anyway).
const MAX_RESPONSE_BYTES: usize = 256 << 20;

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// What every proxy of a run shares.
#[derive(Debug)]
pub struct ProxyContext {
    /// ADS URL.
    pub xds_url: String,
    /// Measurements.
    pub board: SharedBoard,
    /// Derived names by resource hash.
    pub cache: Mutex<NameCache>,
    /// Proxies with an index below this are captured (the first of each workload), when capturing.
    pub capture_below: usize,
}

impl ProxyContext {
    /// The cache, locked (never across an await).
    pub fn cache(&self) -> std::sync::MutexGuard<'_, NameCache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The capture key of proxy `id` if its responses are captured.
    pub fn capture_key(&self, id: &ProxyIdentity) -> Option<String> {
        (id.index < self.capture_below).then(|| id.key())
    }
}

/// Connects and opens the stream at `path`, sending `requests`; the error is the message to report.
pub async fn open<Req, S>(
    ctx: &Arc<ProxyContext>,
    id: &ProxyIdentity,
    path: &'static str,
    requests: S,
) -> Result<Streaming<Bytes>, String>
where
    Req: prost::Message + Send + Sync + 'static,
    S: Stream<Item = Req> + Send + 'static,
{
    let endpoint = tonic::transport::Endpoint::from_shared(ctx.xds_url.clone())
        .map_err(|e| format!("bad xDS URL {}: {e}", ctx.xds_url))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    let channel = endpoint.connect().await.map_err(|e| format!("connecting to {}: {e}", ctx.xds_url))?;
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES);
    grpc.ready().await.map_err(|e| format!("connection not ready: {e}"))?;
    let mut request = tonic::Request::new(requests);
    let key = MetadataValue::try_from(id.key()).map_err(|e| format!("proxy key {:?}: {e}", id.key()))?;
    request.metadata_mut().insert(PROXY_KEY_HEADER, key);
    let response = grpc
        .streaming(request, PathAndQuery::from_static(path), RawResponses::<Req>::default())
        .await
        .map_err(|s| format!("opening the stream: {s}"))?;
    Ok(response.into_inner())
}
