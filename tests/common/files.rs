//! Config files for the processes under test: temp dirs holding them, and edits made the way
//! tools (atomic rename) or people (in place) make them.

use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `files` (relative path, contents) under `dir`, creating parent dirs.
pub fn write_files(dir: &Path, files: &[(&str, &str)]) {
    for (name, contents) in files {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("create {}: {e}", parent.display()));
        }
        std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

/// A fresh temp dir holding `files` (e.g. a `--config-dir` for meshpilot).
pub fn temp_dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = super::process::temp_dir("meshpilot-test-");
    write_files(dir.path(), files);
    dir
}

/// Replaces `dir/name` atomically: writes a hidden temp file in the same directory (meshpilot
/// skips hidden files) and renames it over the target, so the watcher never sees half a file.
pub fn write_atomic(dir: &Path, name: &str, contents: &str) {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let target = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}.tmp", SEQ.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&tmp, contents).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, &target).unwrap_or_else(|e| panic!("rename {} -> {}: {e}", tmp.display(), target.display()));
}

/// Writes `dir/name` in place as editors and `cat >` do: truncate, then write the text in two
/// parts (split at a line in the middle), so the watcher may see an empty or half-written file.
pub fn write_in_place(dir: &Path, name: &str, contents: &str) {
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let middle = contents[..contents.len() / 2].rfind('\n').map_or(0, |i| i + 1);
    for part in [&contents[..middle], &contents[middle..]] {
        f.write_all(part.as_bytes()).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        f.flush().unwrap_or_else(|e| panic!("flush {}: {e}", path.display()));
    }
}
