//! The replay server's gRPC codec: requests are decoded with prost, responses are captured bytes
//! written verbatim, so the server pays for (and alters) no encoding of the config.

use std::marker::PhantomData;

use bytes::{BufMut, Bytes};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// Server side: requests are prost messages, responses are pre-encoded bytes written as they are.
#[derive(Debug)]
pub struct RawReplies<Req>(PhantomData<Req>);

impl<Req> Default for RawReplies<Req> {
    fn default() -> Self {
        RawReplies(PhantomData)
    }
}

/// Decodes a prost message.
#[derive(Debug)]
pub struct ProstDecode<T>(PhantomData<T>);

/// Writes bytes verbatim.
#[derive(Debug)]
pub struct RawEncode;

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
