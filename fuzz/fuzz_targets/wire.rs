//! Snapshot wire decoding on arbitrary bytes: full and delta payloads as a frontend receives
//! them from a (possibly broken or hostile) leader, and chunk sequences through the `Assembler`.
//!
//! Input: one control byte, then the rest. Control bit 6 clear: the rest is a payload, decoded as
//! a full and as a delta update, then split into 1-8 chunks (bits 1-3) of a full or delta update
//! (bit 0), possibly out of order (bit 4) or with an inconsistent count (bit 5), and reassembled
//! and decoded. Bit 6 set: the rest is a sequence of `u16` little-endian length-prefixed
//! `SnapshotChunk` protobufs, pushed in order. The seeds are real payloads (`encode_full`,
//! `encode_delta` of the bookinfo example) so mutations start from the JSON a leader sends.

#![no_main]

use libfuzzer_sys::fuzz_target;
use meshpilot::replication::wire::proto::{PayloadEncoding, SnapshotChunk, UpdateKind};
use meshpilot::replication::wire::{decode_delta, decode_full, version_to_wire, Assembled, Assembler, WireError};
use meshpilot::snapshot::Version;
use prost::bytes::Bytes;
use prost::Message;

/// Counts how deep inputs get (printed with MESHPILOT_FUZZ_STATS set; replay with `-runs=0`).
#[derive(Default)]
struct Stats {
    decoded: usize,
    assembled: usize,
}

impl Stats {
    fn decode(&mut self, kind: i32, version: Version, base: Option<Version>, payload: &[u8]) {
        let ok = if kind == UpdateKind::Delta as i32 {
            base.is_some_and(|b| decode_delta(b, version, payload).is_ok())
        } else {
            decode_full(payload).is_ok()
        };
        self.decoded += usize::from(ok);
    }

    fn push(&mut self, assembler: &mut Assembler, chunk: SnapshotChunk) {
        let result: Result<Option<Assembled>, WireError> = assembler.push(chunk);
        match result {
            Ok(Some(done)) => {
                self.assembled += 1;
                let u = done.update;
                self.decode(u.kind as i32, u.version, u.base, &u.payload);
            }
            Ok(None) => {}
            // A real subscriber drops the stream on an error; start over the same way.
            Err(_) => *assembler = Assembler::default(),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else { return };
    let mut stats = Stats::default();
    let mut assembler = Assembler::default();
    if control & 0x40 == 0 {
        let (base, version) = (Version::new(1, 1), Version::new(1, 2));
        stats.decoded += usize::from(decode_full(rest).is_ok());
        stats.decoded += usize::from(decode_delta(base, version, rest).is_ok());
        let delta = control & 1 == 1;
        let count = usize::from((control >> 1) & 7) + 1;
        let payload = Bytes::copy_from_slice(rest);
        let piece = rest.len().div_ceil(count).max(1);
        let mut chunks: Vec<SnapshotChunk> = (0..count)
            .map(|i| SnapshotChunk {
                version: Some(version_to_wire(version)),
                base: delta.then(|| version_to_wire(base)),
                kind: if delta { UpdateKind::Delta } else { UpdateKind::Full } as i32,
                index: i as u32,
                count: if control & 0x20 != 0 && i > 0 { count as u32 + 1 } else { count as u32 },
                payload: payload.slice((i * piece).min(rest.len())..((i + 1) * piece).min(rest.len())),
                trace_context: Default::default(),
                leader_latest: Some(version_to_wire(version)),
                encoding: PayloadEncoding::Json as i32,
            })
            .collect();
        if control & 0x10 != 0 && chunks.len() > 1 {
            chunks.swap(0, 1);
        }
        for chunk in chunks {
            stats.push(&mut assembler, chunk);
        }
    } else {
        let mut rest = rest;
        while rest.len() >= 2 {
            let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
            let (frame, tail) = rest[2..].split_at(len);
            rest = tail;
            if let Ok(chunk) = SnapshotChunk::decode(frame) {
                stats.push(&mut assembler, chunk);
            }
        }
    }
    if std::env::var_os("MESHPILOT_FUZZ_STATS").is_some() {
        eprintln!("wire-stats decoded={} assembled={}", stats.decoded, stats.assembled);
    }
});
