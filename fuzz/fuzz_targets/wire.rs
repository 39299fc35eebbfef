//! Snapshot wire decoding on arbitrary bytes: full and delta payloads as a frontend receives
//! them from a (possibly broken or hostile) leader, and chunk sequences through the `Assembler`.

#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use meshpilot::replication::wire::{decode_delta, decode_full, proto::SnapshotChunk, Assembler};
use meshpilot::snapshot::Version;
use prost::Message;

#[derive(Debug, Arbitrary)]
struct Input {
    /// A payload decoded directly, as full and as delta.
    payload: Vec<u8>,
    /// Protobuf-encoded chunks pushed through one assembler, in order.
    chunks: Vec<Vec<u8>>,
}

fuzz_target!(|input: Input| {
    let _ = decode_full(&input.payload);
    let _ = decode_delta(Version::new(1, 1), Version::new(1, 2), &input.payload);
    let mut assembler = Assembler::default();
    for bytes in &input.chunks {
        let Ok(chunk) = SnapshotChunk::decode(bytes.as_slice()) else { continue };
        match assembler.push(chunk) {
            Ok(Some(done)) => {
                let update = done.update;
                let _ = decode_full(&update.payload);
                if let Some(base) = update.base {
                    let _ = decode_delta(base, update.version, &update.payload);
                }
            }
            Ok(None) => {}
            // A real subscriber drops the stream on an error; start over the same way.
            Err(_) => assembler = Assembler::default(),
        }
    }
});
