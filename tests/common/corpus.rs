//! Istio's validation corpus (`shared/conformance/istio-validation`, the steering repository
//! checked out beside this one) read as documents.

use std::fs;
use std::path::{Path, PathBuf};

/// The key of an invalid document that holds Istio's error; it is not part of the object.
pub const ERROR_KEY: &str = "_err";

/// Where the corpus is checked out.
pub fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance/istio-validation")
}

/// One document of a corpus file.
pub struct Document {
    /// File name and 1-based document index, for messages.
    pub place: String,
    /// YAML text.
    pub text: String,
    /// Whether the file holds invalid documents.
    pub invalid: bool,
}

/// Splits a corpus file into documents.
///
/// Some invalid documents are commented out wholesale, with a `#_err: "TODO"` line, because Istio has
/// no error text for them yet; they must still be rejected, so they are uncommented here. Their
/// separators are commented too (`#---`).
pub fn documents(path: &Path) -> Vec<Document> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let invalid = name.ends_with("-invalid.yaml");
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut chunks = vec![String::new()];
    for line in text.lines() {
        if matches!(line.trim_end(), "---" | "#---") {
            chunks.push(String::new());
        } else if let Some(chunk) = chunks.last_mut() {
            chunk.push_str(line);
            chunk.push('\n');
        }
    }
    chunks
        .into_iter()
        .filter_map(|chunk| {
            let has_content = chunk.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
            if has_content {
                Some(chunk)
            } else if invalid && chunk.lines().any(|l| l.starts_with("#_err:")) {
                Some(chunk.lines().map(|l| format!("{}\n", l.strip_prefix('#').unwrap_or(l))).collect())
            } else {
                None
            }
        })
        .enumerate()
        .map(|(i, text)| Document { place: format!("{name} document {}", i + 1), text, invalid })
        .collect()
}

/// The corpus files to run, sorted: `crds/*-valid.yaml`, `crds/*-invalid.yaml` and `dataset/*.yaml`.
pub fn corpus_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for sub in ["crds", "dataset"] {
        let entries =
            fs::read_dir(dir.join(sub)).unwrap_or_else(|e| panic!("cannot list {}/{sub}: {e}", dir.display()));
        files.extend(
            entries
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|ext| ext == "yaml")),
        );
    }
    files.sort();
    files
}

/// Every document of the corpus at [`corpus_dir`]; panics, saying what to do, when it is missing.
pub fn all_documents() -> Vec<Document> {
    let dir = corpus_dir();
    assert!(
        dir.is_dir(),
        "the Istio validation corpus is missing at {}: check out the steering repository as `shared/` beside this one",
        dir.display()
    );
    corpus_files(&dir).iter().flat_map(|file| documents(file)).collect()
}
