//! gRPC codecs that leave one direction as raw protobuf bytes: the load client measures and
//! captures responses exactly as they arrived, and the replay server writes captured responses
//! verbatim, so neither pays for (or alters) a decode/re-encode of the config.

use std::marker::PhantomData;

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// Initial buffer of the load client's streams: tonic's 8 KiB per direction is most of a
/// simulated proxy's memory once there are 10,000; requests are small, and the read buffer grows
/// to fit each response anyway.
fn small_buffers() -> BufferSettings {
    BufferSettings::new(1024, 32 * 1024)
}

/// Client side: requests are prost messages, responses are the raw bytes of each message.
#[derive(Debug)]
pub struct RawResponses<Req>(PhantomData<Req>);

impl<Req> Default for RawResponses<Req> {
    fn default() -> Self {
        RawResponses(PhantomData)
    }
}

/// Server side: requests are prost messages, responses are pre-encoded bytes written as they are.
#[derive(Debug)]
pub struct RawReplies<Req>(PhantomData<Req>);

impl<Req> Default for RawReplies<Req> {
    fn default() -> Self {
        RawReplies(PhantomData)
    }
}

/// Encodes a prost message.
#[derive(Debug)]
pub struct ProstEncode<T>(PhantomData<T>);

/// Decodes a prost message.
#[derive(Debug)]
pub struct ProstDecode<T>(PhantomData<T>);

/// Writes bytes verbatim.
#[derive(Debug)]
pub struct RawEncode;

/// Yields the message's bytes.
#[derive(Debug)]
pub struct RawDecode;

impl<T: Message> Encoder for ProstEncode<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst).map_err(|e| Status::internal(format!("encoding a request: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        small_buffers()
    }
}

impl<T: Message + Default> Decoder for ProstDecode<T> {
    type Item = T;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<T>, Status> {
        T::decode(src).map(Some).map_err(|e| Status::invalid_argument(format!("decoding a request: {e}")))
    }
}

impl Encoder for RawEncode {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawDecode {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }

    fn buffer_settings(&self) -> BufferSettings {
        small_buffers()
    }
}

impl<Req: Message + Send + Sync + 'static> Codec for RawResponses<Req> {
    type Encode = Req;
    type Decode = Bytes;
    type Encoder = ProstEncode<Req>;
    type Decoder = RawDecode;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncode(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawDecode
    }
}

impl<Req: Message + Default + Send + Sync + 'static> Codec for RawReplies<Req> {
    type Encode = Bytes;
    type Decode = Req;
    type Encoder = RawEncode;
    type Decoder = ProstDecode<Req>;

    fn encoder(&mut self) -> Self::Encoder {
        RawEncode
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecode(PhantomData)
    }
}
