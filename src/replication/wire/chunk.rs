//! Splitting an encoded update into chunks below gRPC's message limit, and putting them back together.

use std::collections::HashMap;

use prost::bytes::{Bytes, BytesMut};

use super::proto::{PayloadEncoding, SnapshotChunk, UpdateKind};
use super::{version_from_wire, version_to_wire, WireError};
use crate::snapshot::Version;

/// Payload bytes per chunk, far below gRPC's 4 MiB message limit. The gRPC layer copies each
/// message into its stream's own buffer, and a subscriber that stops reading keeps the last one
/// for as long as its connection lives; with 1 MiB chunks that was 1.1 MB per such subscriber.
/// Receivers accept any chunk size, so this can change without a protocol change.
pub const CHUNK_SIZE: usize = 64 * 1024;

/// Largest reassembled payload a frontend accepts (bounds memory against a broken peer).
pub const MAX_PAYLOAD: usize = 1024 * 1024 * 1024;

/// An encoded update, ready to be sent to any number of subscribers.
#[derive(Debug, Clone)]
pub struct EncodedUpdate {
    /// Full or delta.
    pub kind: UpdateKind,
    /// Version the update brings a frontend to.
    pub version: Version,
    /// Version a delta applies on.
    pub base: Option<Version>,
    /// The JSON payload.
    pub payload: Bytes,
}

impl EncodedUpdate {
    /// Number of chunks the payload takes (at least one, even when empty).
    pub fn chunk_count(&self) -> usize {
        self.payload.len().div_ceil(CHUNK_SIZE).max(1)
    }

    /// The chunks of this update; payload slices share the encoded bytes.
    pub fn chunks(
        &self,
        leader_latest: Version,
        trace_context: HashMap<String, String>,
    ) -> impl Iterator<Item = SnapshotChunk> + Send + '_ {
        let count = self.chunk_count();
        (0..count).map(move |i| {
            let end = ((i + 1) * CHUNK_SIZE).min(self.payload.len());
            SnapshotChunk {
                version: Some(version_to_wire(self.version)),
                base: self.base.map(version_to_wire),
                kind: self.kind as i32,
                // Counts fit in u32: payloads are far below 4 PiB.
                index: u32::try_from(i).unwrap_or(u32::MAX),
                count: u32::try_from(count).unwrap_or(u32::MAX),
                payload: self.payload.slice((i * CHUNK_SIZE).min(end)..end),
                trace_context: trace_context.clone(),
                leader_latest: Some(version_to_wire(leader_latest)),
                encoding: PayloadEncoding::Json as i32,
            }
        })
    }
}

/// A reassembled update.
#[derive(Debug, Clone)]
pub struct Assembled {
    /// The update.
    pub update: EncodedUpdate,
    /// The leader's latest version when the last chunk was sent.
    pub leader_latest: Option<Version>,
    /// Trace context of the update.
    pub trace_context: HashMap<String, String>,
}

#[derive(Debug)]
struct Pending {
    kind: UpdateKind,
    version: Version,
    base: Option<Version>,
    count: u32,
    next: u32,
    buf: BytesMut,
}

/// Reassembles chunks of one stream, in order, into updates.
#[derive(Debug, Default)]
pub struct Assembler {
    pending: Option<Pending>,
}

impl Assembler {
    /// Takes the next chunk; returns the update it completes, if any.
    pub fn push(&mut self, chunk: SnapshotChunk) -> Result<Option<Assembled>, WireError> {
        let version = version_from_wire(chunk.version.as_ref()).ok_or(WireError::MissingVersion)?;
        let kind = UpdateKind::try_from(chunk.kind).map_err(|_| WireError::Kind(chunk.kind))?;
        if PayloadEncoding::try_from(chunk.encoding) != Ok(PayloadEncoding::Json) {
            return Err(WireError::Encoding(chunk.encoding));
        }
        let base = version_from_wire(chunk.base.as_ref());
        let seq_err = |reason| WireError::Sequence { version, index: chunk.index, count: chunk.count, reason };
        match kind {
            UpdateKind::Unspecified => return Err(WireError::Kind(chunk.kind)),
            UpdateKind::Delta if base.is_none() => return Err(WireError::MissingBase(version)),
            _ => {}
        }
        if chunk.count == 0 || chunk.index >= chunk.count {
            return Err(seq_err("index outside count"));
        }
        let pending = match self.pending.take() {
            None if chunk.index == 0 => {
                Pending { kind, version, base, count: chunk.count, next: 0, buf: BytesMut::new() }
            }
            None => return Err(seq_err("first chunk of an update must have index 0")),
            Some(p) if p.kind != kind || p.version != version || p.base != base || p.count != chunk.count => {
                return Err(seq_err("header differs from the update's first chunk"))
            }
            Some(p) if p.next != chunk.index => return Err(seq_err("chunk out of order")),
            Some(p) => p,
        };
        let mut pending = pending;
        if pending.buf.len() + chunk.payload.len() > MAX_PAYLOAD {
            return Err(WireError::TooLarge { version });
        }
        pending.buf.extend_from_slice(&chunk.payload);
        pending.next += 1;
        if pending.next < pending.count {
            self.pending = Some(pending);
            return Ok(None);
        }
        Ok(Some(Assembled {
            update: EncodedUpdate { kind, version, base, payload: pending.buf.freeze() },
            leader_latest: version_from_wire(chunk.leader_latest.as_ref()),
            trace_context: chunk.trace_context,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(len: usize) -> EncodedUpdate {
        let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        EncodedUpdate {
            kind: UpdateKind::Delta,
            version: Version::new(2, 5),
            base: Some(Version::new(2, 4)),
            payload: payload.into(),
        }
    }

    #[test]
    fn splits_below_the_limit_and_reassembles() {
        for len in [0, 1, CHUNK_SIZE, CHUNK_SIZE + 1, 5 * CHUNK_SIZE - 3] {
            let u = update(len);
            let chunks: Vec<_> = u.chunks(Version::new(2, 6), HashMap::new()).collect();
            assert_eq!(chunks.len(), len.div_ceil(CHUNK_SIZE).max(1));
            assert!(chunks.iter().all(|c| c.payload.len() <= CHUNK_SIZE));
            let mut a = Assembler::default();
            let mut done = None;
            for (i, c) in chunks.into_iter().enumerate() {
                assert!(done.is_none(), "completed early at {i}");
                done = a.push(c).unwrap();
            }
            let done = done.unwrap();
            assert_eq!(done.update.payload, u.payload);
            assert_eq!((done.update.version, done.update.base), (u.version, u.base));
            assert_eq!(done.leader_latest, Some(Version::new(2, 6)));
        }
    }

    #[test]
    fn inconsistent_sequences_are_errors() {
        let u = update(3 * CHUNK_SIZE);
        let chunks: Vec<_> = u.chunks(Version::new(2, 5), HashMap::new()).collect();

        let mut a = Assembler::default();
        assert!(matches!(a.push(chunks[1].clone()), Err(WireError::Sequence { .. })));

        let mut a = Assembler::default();
        a.push(chunks[0].clone()).unwrap();
        assert!(matches!(a.push(chunks[2].clone()), Err(WireError::Sequence { .. })));

        let mut a = Assembler::default();
        a.push(chunks[0].clone()).unwrap();
        let mut other = chunks[1].clone();
        other.version = Some(version_to_wire(Version::new(2, 9)));
        assert!(matches!(a.push(other), Err(WireError::Sequence { .. })));

        let mut bad = chunks[0].clone();
        bad.base = None;
        assert!(matches!(Assembler::default().push(bad), Err(WireError::MissingBase(_))));
        let mut bad = chunks[0].clone();
        bad.encoding = 7;
        assert!(matches!(Assembler::default().push(bad), Err(WireError::Encoding(7))));
        let mut bad = chunks[0].clone();
        bad.kind = 0;
        assert!(matches!(Assembler::default().push(bad), Err(WireError::Kind(0))));
        let mut bad = chunks[0].clone();
        bad.count = 0;
        assert!(matches!(Assembler::default().push(bad), Err(WireError::Sequence { .. })));
    }
}
