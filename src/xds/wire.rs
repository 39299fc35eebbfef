//! The ADS service on the wire: gRPC framing of each response into a buffer of its own.
//!
//! tonic's generated server encodes every message of a stream into one buffer that lives as
//! long as the stream and keeps the capacity of its largest message. A sidecar's CDS or EDS of
//! a large mesh is a megabyte or more, so each connected proxy kept that much for good
//! (measured: 1.3 MB of live heap per connected proxy at 1,000 services). Here a response is
//! one buffer of exactly its size (see `response`), handed to HTTP/2 and freed once written. Its
//! request decoder does the same on the way in: an EDS request names every cluster (tens of
//! kilobytes), and the buffer it needed is released once it is decoded.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use futures::future::BoxFuture;
use futures::Stream;
use http_body::{Body as _, Frame};
use prost::Message;
use tokio::sync::mpsc;
use tonic::server::NamedService;
use tonic::Status;
use tracing::warn;

use super::connection::StateOfTheWorld;
use super::delta::Delta;
use super::limits::MAX_REQUEST_BYTES;
use super::response::{Framed, GRPC_PREFIX};
use super::stream::{serve_as, Caller, ConnectionContext, Protocol};
use crate::security::tls::PeerInfo;
use crate::security::Authenticator;
use crate::telemetry::log_text::Untrusted;

/// The gRPC service name of ADS.
const SERVICE: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
/// State-of-the-world ADS.
const SOTW_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
/// Delta ADS.
const DELTA_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
/// gRPC's message prefix: a compression flag and a 4-byte length.
const PREFIX: usize = GRPC_PREFIX;

/// Responses buffered per connection before the connection task waits (back-pressure).
const RESPONSE_QUEUE: usize = 8;

/// The ADS gRPC service (both protocols) over a frontend's connection context.
#[derive(Clone)]
pub struct AdsService {
    ctx: ConnectionContext,
    /// Set on the secure port: every stream's caller must authenticate, and may claim only its
    /// own node.
    authn: Option<Arc<Authenticator>>,
}

impl AdsService {
    /// Serves streams with `ctx` to anyone (the plaintext port, for local use).
    pub fn new(ctx: ConnectionContext) -> AdsService {
        AdsService { ctx, authn: None }
    }

    /// Serves streams with `ctx` to callers `authn` authenticates (the secure port).
    pub fn authenticated(ctx: ConnectionContext, authn: Arc<Authenticator>) -> AdsService {
        AdsService { ctx, authn: Some(authn) }
    }
}

impl NamedService for AdsService {
    const NAME: &'static str = SERVICE;
}

impl tower_service::Service<http::Request<tonic::body::Body>> for AdsService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let ctx = self.ctx.clone();
        let authn = self.authn.clone();
        Box::pin(async move {
            let caller = match authn {
                None => Caller::Unauthenticated,
                Some(authn) => {
                    let peer = request.extensions().get::<PeerInfo>().cloned();
                    let headers = request.headers().clone();
                    match authn.authenticate(peer.as_ref(), &headers).await {
                        Ok(identities) => Caller::Authenticated(identities),
                        Err(e) => {
                            warn!(remote = ?peer.and_then(|p| p.remote), error = %Untrusted(&e.to_string()), "xDS stream not authenticated");
                            return Ok(e.status().into_http());
                        }
                    }
                }
            };
            Ok(match request.uri().path() {
                SOTW_PATH => open::<StateOfTheWorld, DiscoveryRequest>(ctx, caller, request),
                DELTA_PATH => open::<Delta, DeltaDiscoveryRequest>(ctx, caller, request),
                other => Status::unimplemented(format!("no method {other}")).into_http(),
            })
        })
    }
}

/// Starts serving one stream of protocol `P` and answers with its response body.
fn open<P, Req>(
    ctx: ConnectionContext,
    caller: Caller,
    request: http::Request<tonic::body::Body>,
) -> http::Response<tonic::body::Body>
where
    P: Protocol<Request = Req> + Default + 'static,
    Req: Message + Default + Send + 'static,
{
    if let Some(encoding) = request.headers().get("grpc-encoding").filter(|e| e.as_bytes() != b"identity") {
        let status = Status::unimplemented(format!("request compression {encoding:?} is not supported"));
        return status.into_http();
    }
    let requests = Requests::<Req>::new(request.into_body());
    let (tx, rx) = mpsc::channel(RESPONSE_QUEUE);
    // The task ends with the stream; it holds the drain watcher, so shutdown waits for it.
    tokio::spawn(async move {
        serve_as(ctx, caller, P::default(), requests, tx).await;
    });
    let mut response = http::Response::new(tonic::body::Body::new(ResponseBody { rx, pending: None, done: false }));
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
    response
}

/// A stream's requests, decoded from gRPC's length-prefixed messages.
struct Requests<T> {
    body: tonic::body::Body,
    buf: BytesMut,
    ended: bool,
    _message: std::marker::PhantomData<fn() -> T>,
}

impl<T: Message + Default> Requests<T> {
    fn new(body: tonic::body::Body) -> Self {
        Requests { body, buf: BytesMut::new(), ended: false, _message: std::marker::PhantomData }
    }

    /// The next whole message in the buffer, if one has arrived.
    fn next_message(&mut self) -> Result<Option<T>, Status> {
        if self.buf.len() < PREFIX {
            return Ok(None);
        }
        if self.buf[0] != 0 {
            return Err(Status::unimplemented("compressed requests are not supported"));
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_REQUEST_BYTES {
            return Err(Status::out_of_range(format!(
                "request of {len} bytes is larger than the {MAX_REQUEST_BYTES} bytes accepted"
            )));
        }
        if self.buf.len() < PREFIX + len {
            self.buf.reserve(PREFIX + len - self.buf.len());
            return Ok(None);
        }
        let message = T::decode(&self.buf[PREFIX..PREFIX + len])
            .map_err(|e| Status::invalid_argument(format!("request does not decode: {e}")))?;
        self.buf.advance(PREFIX + len);
        if self.buf.is_empty() {
            // Release what a large request needed; the next small one starts afresh.
            self.buf = BytesMut::new();
        }
        Ok(Some(message))
    }
}

impl<T: Message + Default> Stream for Requests<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match self.next_message() {
                Ok(Some(message)) => return Poll::Ready(Some(Ok(message))),
                Ok(None) => {}
                Err(status) => {
                    self.ended = true;
                    self.buf = BytesMut::new();
                    return Poll::Ready(Some(Err(status)));
                }
            }
            if self.ended {
                return Poll::Ready(if self.buf.is_empty() {
                    None
                } else {
                    self.buf = BytesMut::new();
                    Some(Err(Status::invalid_argument("the request stream ended inside a message")))
                });
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => {
                    // Trailers from a client carry nothing for ADS.
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Poll::Ready(Some(Err(status))) => {
                    self.ended = true;
                    self.buf = BytesMut::new();
                    return Poll::Ready(Some(Err(status)));
                }
                Poll::Ready(None) => self.ended = true,
            }
        }
    }
}

/// A stream's responses, each as its head then its (shared) body, then the status as trailers.
struct ResponseBody<R> {
    rx: mpsc::Receiver<Result<R, Status>>,
    /// The body of the response whose head went last.
    pending: Option<Bytes>,
    done: bool,
}

impl<R: Framed> http_body::Body for ResponseBody<R> {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(body) = self.pending.take() {
            return Poll::Ready(Some(Ok(Frame::data(body))));
        }
        if self.done {
            return Poll::Ready(None);
        }
        let next = match self.rx.poll_recv(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(next) => next,
        };
        let frame = match next {
            Some(Ok(response)) => match response.frame() {
                Ok(frame) => {
                    self.pending = Some(frame.body).filter(|b| !b.is_empty());
                    return Poll::Ready(Some(Ok(Frame::data(frame.head))));
                }
                Err(status) => trailers(&status),
            },
            Some(Err(status)) => trailers(&status),
            None => trailers(&Status::ok("")),
        };
        self.done = true;
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// The trailers ending a stream with `status`.
fn trailers(status: &Status) -> Frame<Bytes> {
    let mut headers = http::HeaderMap::new();
    if status.add_header(&mut headers).is_err() {
        headers.insert("grpc-status", http::HeaderValue::from_static("13"));
    }
    Frame::trailers(headers)
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;

    use envoy_types::pb::google::protobuf::Any;
    use http_body_util::BodyExt;

    use crate::xds::response::{resources_field, Encoded};

    use super::*;

    #[tokio::test]
    async fn the_body_sends_each_response_then_the_status() {
        let (tx, rx) = mpsc::channel(4);
        let any = Any { type_url: "t".into(), value: vec![7; 300] };
        let first = DiscoveryResponse { nonce: "1".into(), resources: vec![any.clone()], ..Default::default() };
        let (field, _) = resources_field([&any].into_iter());
        tx.send(Ok(Encoded::sotw("", "", "1", field.clone()))).await.ok();
        tx.send(Err(Status::unavailable("frontend shutting down"))).await.ok();
        let mut body = ResponseBody { rx, pending: None, done: false };
        let head = body.frame().await.and_then(Result::ok).and_then(|f| f.into_data().ok()).expect("the head");
        let rest = body.frame().await.and_then(Result::ok).and_then(|f| f.into_data().ok()).expect("the resources");
        assert_eq!(rest.as_ptr(), field.as_ptr(), "the resources go as they are, not copied");
        let data = [head, rest].concat();
        assert_eq!(DiscoveryResponse::decode(&data[PREFIX..]).ok(), Some(first));
        let trailers = body.frame().await.and_then(Result::ok).and_then(|f| f.into_trailers().ok()).expect("trailers");
        assert_eq!(trailers.get("grpc-status").map(|v| v.as_bytes()), Some(&b"14"[..]));
        assert!(body.frame().await.is_none(), "nothing after the trailers");
    }

    /// A request body arriving in `chunks`.
    fn body(chunks: Vec<Vec<u8>>) -> tonic::body::Body {
        let frames = chunks.into_iter().map(|c| Ok::<_, Status>(Frame::data(Bytes::from(c))));
        tonic::body::Body::new(http_body_util::StreamBody::new(futures::stream::iter(frames)))
    }

    /// `request` as one gRPC message.
    fn framed(request: &DiscoveryRequest) -> Vec<u8> {
        let mut out = vec![0u8];
        out.extend_from_slice(&u32::try_from(request.encoded_len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(&request.encode_to_vec());
        out
    }

    #[tokio::test]
    async fn requests_split_or_joined_across_frames_decode_in_order() {
        use futures::StreamExt;
        let a = DiscoveryRequest {
            resource_names: (0..500).map(|i| format!("cluster-{i}")).collect(),
            ..Default::default()
        };
        let b = DiscoveryRequest { response_nonce: "n1".into(), ..Default::default() };
        let c = DiscoveryRequest { response_nonce: "n2".into(), ..Default::default() };
        let (fa, mut fb, fc) = (framed(&a), framed(&b), framed(&c));
        // `a` in three pieces, then `b` and `c` in one frame.
        let (first, rest) = fa.split_at(3);
        let (second, third) = rest.split_at(rest.len() / 2);
        fb.extend_from_slice(&fc);
        let mut requests = Requests::<DiscoveryRequest>::new(body(vec![first.into(), second.into(), third.into(), fb]));
        assert_eq!(requests.next().await.and_then(Result::ok), Some(a));
        assert_eq!(requests.next().await.and_then(Result::ok), Some(b));
        assert_eq!(requests.next().await.and_then(Result::ok), Some(c));
        assert!(requests.next().await.is_none());
        assert_eq!(requests.buf.capacity(), 0, "nothing kept between requests");
    }

    #[tokio::test]
    async fn bad_requests_end_the_stream_with_a_status() {
        use futures::StreamExt;
        let oversized = {
            let mut f = vec![0u8];
            f.extend_from_slice(&u32::try_from(MAX_REQUEST_BYTES + 1).unwrap_or(u32::MAX).to_be_bytes());
            f
        };
        let compressed = vec![1u8, 0, 0, 0, 0];
        let garbage = vec![0u8, 0, 0, 0, 3, 0xff, 0xff, 0xff];
        let truncated = framed(&DiscoveryRequest { response_nonce: "n".into(), ..Default::default() })[..6].to_vec();
        for (chunks, code) in [
            (oversized, tonic::Code::OutOfRange),
            (compressed, tonic::Code::Unimplemented),
            (garbage, tonic::Code::InvalidArgument),
            (truncated, tonic::Code::InvalidArgument),
        ] {
            let mut requests = Requests::<DiscoveryRequest>::new(body(vec![chunks]));
            let status = requests.next().await.and_then(Result::err).expect("an error");
            assert_eq!(status.code(), code, "{status:?}");
            assert!(requests.next().await.is_none(), "the stream ends after an error");
        }
    }

    #[tokio::test]
    async fn a_closed_channel_ends_with_ok() {
        let (tx, rx) = mpsc::channel::<Result<Encoded<DiscoveryResponse>, Status>>(1);
        drop(tx);
        let mut body = ResponseBody { rx, pending: None, done: false };
        let trailers = body.frame().await.and_then(Result::ok).and_then(|f| f.into_trailers().ok()).expect("trailers");
        assert_eq!(trailers.get("grpc-status").map(|v| v.as_bytes()), Some(&b"0"[..]));
    }
}
