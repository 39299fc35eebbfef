//! The capture: every response the first proxy of each workload received, as the raw protobuf
//! bytes, so the replay server can write exactly those bytes again. On disk: `index.json` (the
//! mode, and per workload `<ns>/wl-<w>` the responses in arrival order, each tagged with its
//! phase and type URL and naming a blob) and `blobs/<xxh64 hex>.bin`, deduplicated.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The phase of the responses received while connecting.
pub const INITIAL_PHASE: &str = "initial";

/// Which ADS flavour a run speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// State of the world (`StreamAggregatedResources`).
    Sotw,
    /// Incremental (`DeltaAggregatedResources`).
    Delta,
}

impl Mode {
    /// `sotw` or `delta`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Sotw => "sotw",
            Mode::Delta => "delta",
        }
    }
}

/// `index.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureIndex {
    /// The ADS flavour the responses were received on.
    pub mode: Mode,
    /// Workload key (`<ns>/wl-<w>`) → its responses in arrival order.
    pub workloads: BTreeMap<String, Vec<IndexEntry>>,
}

/// One response of the index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IndexEntry {
    /// `initial` or the phase's name.
    pub phase: String,
    /// The response's type URL.
    pub type_url: String,
    /// The blob: 16 hex digits of the xxh64 of its bytes.
    pub blob: String,
}

/// Why a capture could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// File or directory.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// `index.json` is not a capture index.
    #[error("{path}: {source}")]
    Index {
        /// The index file.
        path: PathBuf,
        /// Cause.
        source: serde_json::Error,
    },
    /// A blob name is not 16 hex digits (it would name a file outside `blobs/`).
    #[error("blob name {0:?} is not 16 hex digits")]
    BlobName(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CaptureError + '_ {
    move |source| CaptureError::Io { path: path.to_path_buf(), source }
}

/// Collects responses during a run; [`CaptureWriter::write`] stores them.
#[derive(Debug)]
pub struct CaptureWriter {
    mode: Mode,
    workloads: BTreeMap<String, Vec<(Arc<str>, String, u64)>>,
    blobs: HashMap<u64, Bytes>,
}

impl CaptureWriter {
    /// An empty capture of a `mode` run.
    pub fn new(mode: Mode) -> CaptureWriter {
        CaptureWriter { mode, workloads: BTreeMap::new(), blobs: HashMap::new() }
    }

    /// Records one response `bytes` of `workload`, received during `phase`.
    pub fn record(&mut self, workload: &str, phase: &Arc<str>, type_url: &str, bytes: &Bytes) {
        let h = xxhash_rust::xxh64::xxh64(bytes, 0);
        // A copy of its own: the received bytes share a buffer that may be larger.
        self.blobs.entry(h).or_insert_with(|| Bytes::copy_from_slice(bytes));
        let list = match self.workloads.get_mut(workload) {
            Some(list) => list,
            None => self.workloads.entry(workload.to_string()).or_default(),
        };
        list.push((phase.clone(), type_url.to_string(), h));
    }

    /// The index of what was recorded.
    pub fn index(&self) -> CaptureIndex {
        let entry = |(phase, type_url, h): &(Arc<str>, String, u64)| IndexEntry {
            phase: phase.to_string(),
            type_url: type_url.clone(),
            blob: format!("{h:016x}"),
        };
        CaptureIndex {
            mode: self.mode,
            workloads: self.workloads.iter().map(|(k, v)| (k.clone(), v.iter().map(entry).collect())).collect(),
        }
    }

    /// Writes `dir/index.json` and `dir/blobs/*.bin` (creating the directories).
    pub fn write(&self, dir: &Path) -> Result<(), CaptureError> {
        let blobs = dir.join("blobs");
        std::fs::create_dir_all(&blobs).map_err(io(&blobs))?;
        for (h, bytes) in &self.blobs {
            let path = blobs.join(format!("{h:016x}.bin"));
            std::fs::write(&path, bytes).map_err(io(&path))?;
        }
        let path = dir.join("index.json");
        let text = serde_json::to_vec_pretty(&self.index())
            .map_err(|source| CaptureError::Index { path: path.clone(), source })?;
        std::fs::write(&path, text).map_err(io(&path))
    }
}

/// One captured response, loaded.
#[derive(Debug, Clone)]
pub struct Captured {
    /// Its phase.
    pub phase: String,
    /// Its type URL.
    pub type_url: String,
    /// The bytes as received.
    pub bytes: Bytes,
}

/// A capture loaded into memory: each distinct blob read once and shared.
#[derive(Debug, Clone)]
pub struct Capture {
    /// ADS flavour.
    pub mode: Mode,
    /// Workload key → responses in capture order.
    pub workloads: BTreeMap<String, Vec<Captured>>,
}

impl Capture {
    /// Reads `dir/index.json` and the blobs it names.
    pub fn load(dir: &Path) -> Result<Capture, CaptureError> {
        let path = dir.join("index.json");
        let text = std::fs::read(&path).map_err(io(&path))?;
        let index: CaptureIndex =
            serde_json::from_slice(&text).map_err(|source| CaptureError::Index { path: path.clone(), source })?;
        let mut blobs: HashMap<String, Bytes> = HashMap::new();
        let mut workloads = BTreeMap::new();
        for (key, entries) in index.workloads {
            let mut list = Vec::with_capacity(entries.len());
            for e in entries {
                if e.blob.len() != 16 || !e.blob.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(CaptureError::BlobName(e.blob));
                }
                let bytes = match blobs.get(&e.blob) {
                    Some(b) => b.clone(),
                    None => {
                        let path = dir.join("blobs").join(format!("{}.bin", e.blob));
                        let b = Bytes::from(std::fs::read(&path).map_err(io(&path))?);
                        blobs.insert(e.blob.clone(), b.clone());
                        b
                    }
                };
                list.push(Captured { phase: e.phase, type_url: e.type_url, bytes });
            }
            workloads.insert(key, list);
        }
        Ok(Capture { mode: index.mode, workloads })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_round_trips_through_the_directory() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut w = CaptureWriter::new(Mode::Delta);
        let initial: Arc<str> = Arc::from(INITIAL_PHASE);
        let edit: Arc<str> = Arc::from("vs-edit");
        w.record("ns-0/wl-0", &initial, "t/cds", &Bytes::from_static(b"one"));
        w.record("ns-0/wl-0", &edit, "t/rds", &Bytes::from_static(b"two"));
        w.record("ns-1/wl-1", &initial, "t/cds", &Bytes::from_static(b"one"));
        w.write(dir.path()).expect("write");
        assert_eq!(std::fs::read_dir(dir.path().join("blobs")).expect("blobs").count(), 2, "deduplicated");
        let c = Capture::load(dir.path()).expect("load");
        assert_eq!(c.mode, Mode::Delta);
        let wl0 = &c.workloads["ns-0/wl-0"];
        assert_eq!(
            (wl0[1].phase.as_str(), wl0[1].type_url.as_str(), &wl0[1].bytes[..]),
            ("vs-edit", "t/rds", &b"two"[..])
        );
        assert_eq!(c.workloads["ns-1/wl-1"][0].bytes, &Bytes::from_static(b"one"));
        let text = std::fs::read_to_string(dir.path().join("index.json")).expect("index");
        let index: CaptureIndex = serde_json::from_str(&text).expect("json");
        assert_eq!(index, w.index());
        assert_eq!(index.workloads["ns-0/wl-0"][0].blob.len(), 16);
    }

    #[test]
    fn a_blob_name_outside_the_blob_dir_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let index =
            r#"{"mode":"sotw","workloads":{"a/b":[{"phase":"initial","type_url":"t","blob":"../../etc/passwd"}]}}"#;
        std::fs::write(dir.path().join("index.json"), index).expect("write");
        assert!(matches!(Capture::load(dir.path()), Err(CaptureError::BlobName(_))));
    }
}
