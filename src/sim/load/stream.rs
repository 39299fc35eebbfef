//! One simulated proxy's ADS stream: its own HTTP/2 connection (as every Envoy has), the load
//! balancer's routing header, and the response messages as raw bytes.
//!
//! The gRPC framing is done here rather than by `tonic::Streaming`: tonic keeps each stream's
//! receive buffer at the size of the largest message it ever held, which is the whole CDS
//! response (1.5 MB per proxy measured with 1,000 services: 15 GB for 10,000 proxies). Here a
//! message is assembled in a buffer of its own that is dropped once the message is processed,
//! so an idle proxy holds no config bytes at all.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::config::core::v3::Node;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::body::Body;
use tonic::codegen::http::{self, header};
use tonic::codegen::Service;
use tonic::{Code, Status};

use super::board::SharedBoard;
use super::identity::{ProxyIdentity, PROXY_KEY_HEADER};
use super::names::NameCache;
use crate::xds::TypeUrl;

/// Responses larger than this end the stream (a bound on what one message may make us allocate).
const MAX_RESPONSE_BYTES: usize = 256 << 20;

/// gRPC's message prefix: compression flag and big-endian length.
const PREFIX: usize = 5;

/// Proxies that may be in the middle of receiving a message that spans several HTTP/2 frames.
/// A proxy holds a message's bytes until it is whole; without a bound, 10,000 proxies receiving
/// a 2 MB CDS response together would hold 20 GB. The others wait with at most their HTTP/2
/// window in flight, and the server's send waits for them, as it would for a busy Envoy.
pub const CONCURRENT_MESSAGES: usize = 256;

/// HTTP/2 stream and connection window: what a proxy lets the server send ahead of its reading.
const WINDOW: u32 = 256 * 1024;

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
    /// Permits to assemble a multi-frame message ([`CONCURRENT_MESSAGES`]).
    pub assembly: tokio::sync::Semaphore,
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

/// One ADS flavour as a simulated proxy speaks it: its method, its first requests, and what it
/// does with each response (ACK, subscribe to the names it leads to, record convergence).
pub trait Flavour: Default + Send + 'static {
    /// The request message.
    type Request: prost::Message + Send + Sync + 'static;
    /// The gRPC method path.
    const PATH: &'static str;

    /// The first request for `type_url` (the stream's very first carries the node).
    fn subscribe(type_url: TypeUrl, node: Option<Node>) -> Self::Request;

    /// Handles one response message; the error is the message to report.
    fn on_response(
        &mut self,
        ctx: &ProxyContext,
        id: &ProxyIdentity,
        capture: Option<&str>,
        bytes: Bytes,
        tx: &mpsc::Sender<Box<Self::Request>>,
    ) -> impl Future<Output = Result<(), String>> + Send;
}

/// Runs proxy `id` speaking `F` until its stream ends (or the task is aborted).
pub async fn run<F: Flavour>(ctx: Arc<ProxyContext>, id: ProxyIdentity) {
    // Boxed: a request with its node is large, and the channel allocates slots for 32 at once.
    let (tx, rx) = mpsc::channel::<Box<F::Request>>(16);
    let node = id.node();
    for (i, t) in [TypeUrl::Cluster, TypeUrl::Listener].into_iter().enumerate() {
        // The channel is new and has room: this cannot fail.
        let _ = tx.try_send(Box::new(F::subscribe(t, (i == 0).then(|| node.clone()))));
    }
    let mut responses = match open(&ctx, &id, F::PATH, ReceiverStream::new(rx).map(|r| *r)).await {
        Ok(s) => s,
        Err(e) => return ctx.board.error(id.index, e),
    };
    ctx.board.connected(id.index);
    let capture = ctx.capture_key(&id);
    let mut state = F::default();
    loop {
        match responses.message(&ctx.assembly).await {
            Ok(Some(bytes)) => {
                if let Err(e) = state.on_response(&ctx, &id, capture.as_deref(), bytes, &tx).await {
                    return ctx.board.error(id.index, e);
                }
            }
            Ok(None) => return ctx.board.error(id.index, "stream closed by the server"),
            Err(e) => return ctx.board.error(id.index, e),
        }
    }
}

/// The response side of an open stream.
pub struct RawStream {
    body: Body,
    /// Bytes received of the next message(s); a fresh, empty buffer between messages.
    buf: BytesMut,
    /// Whether the response has ended.
    done: bool,
}

/// Connects and opens the stream at `path`, sending `requests`; the error is the message to report.
pub async fn open<Req, S>(
    ctx: &ProxyContext,
    id: &ProxyIdentity,
    path: &'static str,
    requests: S,
) -> Result<RawStream, String>
where
    Req: prost::Message + 'static,
    S: Stream<Item = Req> + Send + Sync + 'static,
{
    let endpoint = tonic::transport::Endpoint::from_shared(ctx.xds_url.clone())
        .map_err(|e| format!("bad xDS URL {}: {e}", ctx.xds_url))?
        .connect_timeout(CONNECT_TIMEOUT)
        .initial_stream_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .tcp_nodelay(true);
    let mut channel = endpoint.connect().await.map_err(|e| format!("connecting to {}: {e}", ctx.xds_url))?;
    let frames = requests.map(|r| framed(&r).map(Frame::data));
    let request = http::Request::builder()
        .method(http::Method::POST)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/grpc")
        .header(header::TE, "trailers")
        .header(PROXY_KEY_HEADER, id.key())
        .body(Body::new(StreamBody::new(frames)))
        .map_err(|e| format!("building the request: {e}"))?;
    std::future::poll_fn(|cx| channel.poll_ready(cx)).await.map_err(|e| format!("connection not ready: {e}"))?;
    let response = channel.call(request).await.map_err(|e| format!("opening the stream: {e}"))?;
    if response.status() != http::StatusCode::OK {
        return Err(format!("opening the stream: HTTP status {}", response.status()));
    }
    // A server refusing the call answers with the status in the headers and no body.
    let refused = Status::from_header_map(response.headers()).filter(|s| s.code() != Code::Ok);
    if let Some(status) = refused {
        return Err(format!("opening the stream: {status}"));
    }
    Ok(RawStream { body: response.into_body(), buf: BytesMut::new(), done: false })
}

/// A request as one gRPC message: uncompressed, length-prefixed.
fn framed<M: prost::Message>(message: &M) -> Result<Bytes, Status> {
    let len = message.encoded_len();
    let prefix = u32::try_from(len).map_err(|_| Status::internal("request too large"))?;
    let mut buf = BytesMut::with_capacity(PREFIX + len);
    buf.put_u8(0);
    buf.put_u32(prefix);
    message.encode(&mut buf).map_err(|e| Status::internal(format!("encoding a request: {e}")))?;
    Ok(buf.freeze())
}

impl RawStream {
    /// The next response message's bytes; `None` when the server ended the stream with OK.
    /// A message that does not arrive whole in one frame is assembled under one of `assembly`'s
    /// permits.
    pub async fn message(&mut self, assembly: &tokio::sync::Semaphore) -> Result<Option<Bytes>, String> {
        let mut permit = None;
        loop {
            if let Some(message) = self.take_message()? {
                return Ok(Some(message));
            }
            if permit.is_none() && !self.buf.is_empty() && !self.done {
                permit = Some(assembly.acquire().await.map_err(|_| "the run is over".to_string())?);
            }
            if self.done {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err("stream ended in the middle of a message".into());
            }
            match self.body.frame().await {
                None => self.done = true,
                Some(Err(status)) => return Err(status.to_string()),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.buf.extend_from_slice(&data),
                    Err(frame) => {
                        self.done = true;
                        let trailers = frame.into_trailers().ok();
                        let status = trailers.as_ref().and_then(Status::from_header_map);
                        if let Some(status) = status.filter(|s| s.code() != Code::Ok) {
                            return Err(status.to_string());
                        }
                    }
                },
            }
        }
    }

    /// A whole message from the buffer, if one is there.
    fn take_message(&mut self) -> Result<Option<Bytes>, String> {
        if self.buf.len() < PREFIX {
            return Ok(None);
        }
        if self.buf[0] != 0 {
            return Err("compressed response (compression was not offered)".into());
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_RESPONSE_BYTES {
            return Err(format!("response of {len} bytes is over the {MAX_RESPONSE_BYTES} byte limit"));
        }
        if self.buf.len() < PREFIX + len {
            // The buffer grows with what arrived, not to the announced length at once: HTTP/2 flow
            // control then bounds what 10,000 proxies in the middle of a large message hold.
            return Ok(None);
        }
        let mut message = self.buf.split_to(PREFIX + len);
        message.advance(PREFIX);
        if self.buf.is_empty() {
            // Let go of the message's allocation: it is freed once the message is processed.
            self.buf = BytesMut::new();
        }
        Ok(Some(message.freeze()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream_of(bytes: &[u8]) -> RawStream {
        RawStream { body: Body::empty(), buf: BytesMut::from(bytes), done: true }
    }

    fn permits() -> tokio::sync::Semaphore {
        tokio::sync::Semaphore::new(1)
    }

    #[tokio::test]
    async fn messages_are_cut_at_their_prefix() {
        let mut wire = framed(&"ab".to_string()).expect("encode").to_vec();
        wire.extend_from_slice(&framed(&String::new()).expect("encode"));
        let mut s = stream_of(&wire);
        assert_eq!(s.message(&permits()).await, Ok(Some(Bytes::from_static(&[0x0a, 2, b'a', b'b']))));
        assert_eq!(s.message(&permits()).await, Ok(Some(Bytes::new())));
        assert_eq!(s.message(&permits()).await, Ok(None));
        assert_eq!(s.buf.capacity(), 0, "nothing held between messages");
    }

    #[tokio::test]
    async fn a_cut_or_compressed_message_is_an_error() {
        assert!(stream_of(&[0, 0, 0, 0, 9, 1]).message(&permits()).await.is_err(), "ends mid-message");
        assert!(stream_of(&[1, 0, 0, 0, 0]).message(&permits()).await.is_err(), "compressed");
    }
}
