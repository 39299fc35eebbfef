//! Responses encoded once, straight from the generation cache's encoded resources.
//!
//! A sidecar's CDS or EDS of a large mesh is a megabyte; a thousand sidecars getting it through
//! prost messages cost a copy of every resource into each response's `Any` and another when
//! the message is encoded. Here the cache holds a generation's resources encoded once, laid out
//! as the `resources` field of a response, and a response is a small head (the gRPC prefix and
//! the other fields) followed by that shared buffer: HTTP/2 sends both as they are, so the
//! thousand responses of one generation copy nothing.

use std::marker::PhantomData;

use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};
use prost::Message;
use tonic::Status;

/// gRPC's message prefix: a compression flag and a 4-byte length.
pub const GRPC_PREFIX: usize = 5;

/// Largest message sent to a proxy (a full CDS or EDS of a large mesh).
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// `resources`, field 2 of both discovery responses and `resource` of a delta `Resource`.
const RESOURCES: u32 = 2;
/// `version` of a delta `Resource`.
const RESOURCE_VERSION: u32 = 1;
/// `name` of a delta `Resource`.
const RESOURCE_NAME: u32 = 3;

/// A response as one encoded gRPC message of type `M`.
#[derive(Debug, Clone)]
pub struct Encoded<M> {
    frame: Result<Frame, Status>,
    _message: PhantomData<fn() -> M>,
}

/// One gRPC message as it goes on the wire, in two parts: HTTP/2 sends them back to back.
#[derive(Debug, Clone)]
pub struct Frame {
    /// The gRPC prefix and the message's fields other than its resources.
    pub head: Bytes,
    /// The resources field (often shared by every response of one generation), or nothing.
    pub body: Bytes,
}

/// A response that can be put on the wire as it is.
pub trait Framed {
    /// The message it encodes.
    type Message: Message + Default;

    /// The gRPC frame (prefix and message), or the status ending the stream instead.
    fn frame(&self) -> Result<Frame, Status>;

    /// The message, decoded again (debugging and tests).
    fn decode(&self) -> Result<Self::Message, Status>;
}

impl<M: Message + Default> Framed for Encoded<M> {
    type Message = M;

    fn frame(&self) -> Result<Frame, Status> {
        self.frame.clone()
    }

    fn decode(&self) -> Result<M, Status> {
        let frame = self.frame.as_ref().map_err(Clone::clone)?;
        let message = [&frame.head[GRPC_PREFIX..], &frame.body[..]].concat();
        M::decode(message.as_slice()).map_err(|e| Status::internal(format!("response does not decode: {e}")))
    }
}

/// Messages laid out as the repeated `resources` field of a state-of-the-world response, and
/// each message's encoding as a slice of it: a response carries the field as it is, and the
/// slices serve responses carrying only some of them.
pub fn resources_field<'a, M: Message + 'a>(messages: impl Iterator<Item = &'a M> + Clone) -> (Bytes, Vec<Bytes>) {
    let len = messages.clone().map(|m| field_len(RESOURCES, m.encoded_len())).sum();
    let mut buf = BytesMut::with_capacity(len);
    let mut ranges = Vec::new();
    for m in messages {
        encode_key(RESOURCES, WireType::LengthDelimited, &mut buf);
        encode_varint(m.encoded_len() as u64, &mut buf);
        let start = buf.len();
        m.encode_raw(&mut buf);
        ranges.push(start..buf.len());
    }
    let field = buf.freeze();
    let each = ranges.into_iter().map(|r| field.slice(r)).collect();
    (field, each)
}

/// Encoded messages (each an `Any`) laid out as the `resources` field, copied into one buffer.
pub fn resources_field_of(resources: &[Bytes]) -> Bytes {
    let len = resources.iter().map(|r| field_len(RESOURCES, r.len())).sum();
    let mut buf = BytesMut::with_capacity(len);
    for r in resources {
        put_field(&mut buf, RESOURCES, r);
    }
    buf.freeze()
}

impl Encoded<DiscoveryResponse> {
    /// A state-of-the-world response carrying `resources`, the `resources` field as laid out by
    /// [`resources_field`] or [`resources_field_of`] (shared, not copied).
    pub fn sotw(version: &str, type_url: &str, nonce: &str, resources: Bytes) -> Self {
        let header = DiscoveryResponse {
            version_info: version.to_string(),
            type_url: type_url.to_string(),
            nonce: nonce.to_string(),
            ..Default::default()
        };
        Encoded::build(&header, resources.len(), |_| {}).with_body(resources)
    }
}

/// One resource of a delta response: its name, its version and the encoded `Any`.
pub struct DeltaResource<'a> {
    /// Resource name.
    pub name: &'a str,
    /// Its version (a content hash).
    pub version: &'a str,
    /// The encoded `Any`.
    pub body: &'a Bytes,
}

impl DeltaResource<'_> {
    fn len(&self) -> usize {
        field_len(RESOURCE_VERSION, self.version.len())
            + field_len(RESOURCE_NAME, self.name.len())
            + field_len(RESOURCES, self.body.len())
    }
}

impl Encoded<DeltaDiscoveryResponse> {
    /// A delta response carrying `resources` and naming `removed`.
    pub fn delta(
        system_version: &str,
        type_url: &str,
        nonce: &str,
        resources: &[DeltaResource<'_>],
        removed: Vec<String>,
    ) -> Self {
        let header = DeltaDiscoveryResponse {
            system_version_info: system_version.to_string(),
            type_url: type_url.to_string(),
            nonce: nonce.to_string(),
            removed_resources: removed,
            ..Default::default()
        };
        let body: usize = resources.iter().map(|r| field_len(RESOURCES, r.len())).sum();
        Encoded::build(&header, body, |buf| {
            for r in resources {
                encode_key(RESOURCES, WireType::LengthDelimited, buf);
                encode_varint(r.len() as u64, buf);
                put_field(buf, RESOURCE_VERSION, r.version.as_bytes());
                put_field(buf, RESOURCE_NAME, r.name.as_bytes());
                put_field(buf, RESOURCES, r.body);
            }
        })
    }
}

impl<M: Message> Encoded<M> {
    /// A whole message, encoded as it is (small answers such as debug responses).
    pub fn whole(message: &M) -> Self {
        Encoded::build(message, 0, |_| {})
    }

    /// The frame of `header` (a message without resources) followed by `body` bytes of
    /// resource fields that `put` writes. Repeated fields may come in any order on the wire.
    fn build(header: &M, body: usize, put: impl FnOnce(&mut BytesMut)) -> Self {
        let len = header.encoded_len() + body;
        if len > MAX_RESPONSE_BYTES {
            let status = Status::resource_exhausted(format!(
                "response of {len} bytes is larger than the {MAX_RESPONSE_BYTES} bytes sent at most"
            ));
            return Encoded { frame: Err(status), _message: PhantomData };
        }
        let mut buf = BytesMut::with_capacity(GRPC_PREFIX + len);
        buf.put_u8(0);
        // At most MAX_RESPONSE_BYTES: fits.
        buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
        header.encode_raw(&mut buf);
        put(&mut buf);
        Encoded { frame: Ok(Frame { head: buf.freeze(), body: Bytes::new() }), _message: PhantomData }
    }

    /// This frame followed by `body`, which its length prefix already counts.
    fn with_body(mut self, body: Bytes) -> Self {
        if let Ok(frame) = &mut self.frame {
            frame.body = body;
        }
        self
    }
}

/// Encoded length of a length-delimited field of `len` bytes.
fn field_len(tag: u32, len: usize) -> usize {
    prost::encoding::key_len(tag) + encoded_len_varint(len as u64) + len
}

/// Writes a length-delimited field.
fn put_field(buf: &mut BytesMut, tag: u32, value: &[u8]) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(value.len() as u64, buf);
    buf.put_slice(value);
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::discovery::v3::Resource;
    use envoy_types::pb::google::protobuf::Any;

    use super::*;

    fn any(type_url: &str, value: &[u8]) -> (Any, Bytes) {
        let a = Any { type_url: type_url.into(), value: value.to_vec() };
        let encoded = Bytes::from(a.encode_to_vec());
        (a, encoded)
    }

    #[test]
    fn a_sotw_response_is_what_prost_would_encode() {
        let (a, ea) = any("type.googleapis.com/envoy.config.cluster.v3.Cluster", b"cluster a");
        let (b, eb) = any("type.googleapis.com/envoy.config.cluster.v3.Cluster", &[7u8; 300]);
        let encoded = Encoded::sotw("v1", "cds", "n-1", resources_field_of(&[ea.clone(), eb.clone()]));
        let expected = DiscoveryResponse {
            version_info: "v1".into(),
            resources: vec![a.clone(), b.clone()],
            type_url: "cds".into(),
            nonce: "n-1".into(),
            ..Default::default()
        };
        assert_eq!(encoded.decode().ok(), Some(expected.clone()));
        let Frame { head, body } = encoded.frame().expect("small");
        assert_eq!(head.len() + body.len(), GRPC_PREFIX + expected.encoded_len(), "exactly its size");
        assert_eq!(u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize, expected.encoded_len());
        // The field laid out from the messages is the same, and each message is a slice of it.
        let (field, each) = resources_field([&a, &b].into_iter());
        assert_eq!(field, body);
        assert_eq!(each, [ea, eb]);
        assert!(each.iter().all(|e| field.as_ptr_range().contains(&e.as_ptr())), "slices, not copies");
    }

    #[test]
    fn a_delta_response_is_what_prost_would_encode() {
        let (a, ea) = any("eds", b"endpoints");
        let encoded = Encoded::delta(
            "v2",
            "eds",
            "n-2",
            &[DeltaResource { name: "outbound|80||a", version: "00ff", body: &ea }],
            vec!["gone".into()],
        );
        let expected = DeltaDiscoveryResponse {
            system_version_info: "v2".into(),
            resources: vec![Resource {
                name: "outbound|80||a".into(),
                version: "00ff".into(),
                resource: Some(a),
                ..Default::default()
            }],
            type_url: "eds".into(),
            removed_resources: vec!["gone".into()],
            nonce: "n-2".into(),
            ..Default::default()
        };
        assert_eq!(encoded.decode().ok(), Some(expected));
    }

    #[test]
    fn an_oversized_response_becomes_a_status() {
        let huge = Bytes::from(vec![0u8; MAX_RESPONSE_BYTES]);
        let encoded = Encoded::sotw("v", "t", "n", resources_field_of(&[huge]));
        assert_eq!(encoded.frame().err().map(|s| s.code()), Some(tonic::Code::ResourceExhausted));
    }
}
