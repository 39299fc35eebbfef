//! The replay server's gRPC plumbing. Requests are decoded with prost (tonic's `Streaming`);
//! responses are the captured bytes, each sent as a 5-byte gRPC prefix and the blob itself — the
//! `Bytes` shared by every stream of the workload, never copied into an encode buffer. (Encoding
//! through tonic would copy each response into a per-stream buffer that then stays as large as
//! the largest response: about 1 MB per stream with 1,000 services, 10 GB for 10,000 streams.)

use std::convert::Infallible;
use std::marker::PhantomData;

use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use http_body::Frame;
use http_body_util::StreamBody;
use prost::Message;
use tokio::sync::mpsc;
use tonic::codec::{DecodeBuf, Decoder};
use tonic::codegen::http::{header, HeaderMap, HeaderValue, StatusCode};
use tonic::Status;

/// Decodes a prost message.
#[derive(Debug)]
pub struct ProstDecode<T>(PhantomData<T>);

impl<T> Default for ProstDecode<T> {
    fn default() -> Self {
        ProstDecode(PhantomData)
    }
}

impl<T: Message + Default> Decoder for ProstDecode<T> {
    type Item = T;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<T>, Status> {
        T::decode(src).map(Some).map_err(|e| Status::invalid_argument(format!("decoding a request: {e}")))
    }
}

/// What a stream's task hands the response body: captured bytes, or the status that ends it.
pub type Outbound = Result<Bytes, Status>;

/// The HTTP response of a gRPC stream whose messages come out of `rx`, already encoded; it ends
/// with OK trailers when `rx` closes, or with the status it yields.
pub fn response(rx: mpsc::Receiver<Outbound>) -> Response {
    let frames = futures::stream::unfold(Body { rx, pending: None, done: false }, |mut body| async move {
        let frame = body.next().await?;
        Some((Ok::<_, Infallible>(frame), body))
    });
    let mut response = Response::new(axum::body::Body::new(StreamBody::new(frames)));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

/// The frames of a response body, one at a time.
struct Body {
    rx: mpsc::Receiver<Outbound>,
    /// The blob whose prefix was just sent.
    pending: Option<Bytes>,
    done: bool,
}

impl Body {
    async fn next(&mut self) -> Option<Frame<Bytes>> {
        if let Some(blob) = self.pending.take() {
            return Some(Frame::data(blob));
        }
        if self.done {
            return None;
        }
        let status = match self.rx.recv().await {
            Some(Ok(blob)) => {
                let prefix = prefix(blob.len());
                self.pending = Some(blob);
                return Some(Frame::data(prefix));
            }
            Some(Err(status)) => status,
            None => Status::ok(""),
        };
        self.done = true;
        let mut trailers = HeaderMap::new();
        if status.add_header(&mut trailers).is_err() {
            trailers.insert("grpc-status", HeaderValue::from(status.code() as i32));
        }
        Some(Frame::trailers(trailers))
    }
}

/// gRPC's message prefix: not compressed, big-endian length.
fn prefix(len: usize) -> Bytes {
    let mut b = BytesMut::with_capacity(5);
    b.put_u8(0);
    // Captured messages came through a 256 MiB receive limit, far below u32::MAX.
    b.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    b.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_response_is_prefixed_blobs_then_trailers() {
        let (tx, rx) = mpsc::channel(4);
        tx.send(Ok(Bytes::from_static(b"abc"))).await.expect("send");
        drop(tx);
        let collected = response(rx).into_body().collect().await.expect("body");
        let trailers = collected.trailers().cloned().expect("trailers");
        assert_eq!(trailers.get("grpc-status").map(|v| v.as_bytes()), Some(&b"0"[..]));
        assert_eq!(&collected.to_bytes()[..], &[0, 0, 0, 0, 3, b'a', b'b', b'c']);
    }

    #[tokio::test]
    async fn a_status_ends_the_response() {
        let (tx, rx) = mpsc::channel(4);
        tx.send(Err(Status::not_found("no such workload"))).await.expect("send");
        let collected = response(rx).into_body().collect().await.expect("body");
        let trailers = collected.trailers().cloned().expect("trailers");
        assert_eq!(trailers.get("grpc-status").map(|v| v.as_bytes()), Some(&b"5"[..]));
        assert!(collected.to_bytes().is_empty());
    }
}
