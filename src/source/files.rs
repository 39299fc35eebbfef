//! Reading config files from a directory tree (YAML and JSON), for the directory source, the mesh
//! config source and `validate`.
//!
//! Everything read here comes from outside the process, so every read is bounded and nothing
//! blocks on what a path turns out to be:
//! - the tree walk follows symlinks (Kubernetes ConfigMap mounts are symlinks) but enters each
//!   directory once, keyed by (device, inode), so `ln -s . loop` neither hangs the walk nor makes
//!   files appear twice; it also stops at [`MAX_DEPTH`] and [`MAX_ENTRIES`];
//! - only regular files are read (after resolving symlinks), so a FIFO never blocks a reader and
//!   a symlink to `/dev/zero` is never read; at most [`MAX_FILE_BYTES`] are read of any file;
//! - a directory or file that cannot be used is reported with its path and why ([`ReadError`]),
//!   and the rest of the tree is still read.

use std::collections::{HashMap, HashSet};
use std::fs::{FileType, Metadata, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tracing::debug;

use crate::config::parse::{parse_file_checked, split_documents, Checked, Document};
use crate::config::{ConfigError, FieldError};

/// The largest config file read; a larger one is reported, not read (Kubernetes objects are
/// limited to about 1.5 MiB, so this leaves room for many objects in one file).
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// How deep directories are followed below the root.
pub const MAX_DEPTH: usize = 32;

/// How many directory entries one walk of the tree looks at, in all directories together.
pub const MAX_ENTRIES: usize = 100_000;

/// Between two reads of a file that must agree before its content counts as written: writers
/// that truncate and then write (`cat x > file`) or write in several chunks are done by then.
pub const SETTLE_INTERVAL: Duration = Duration::from_millis(50);

/// How many rounds of re-reads (each [`SETTLE_INTERVAL`] apart) a changing file gets before it
/// counts as unsettled for now (its last good state stays, and it is read again soon).
pub const MAX_SETTLE_ROUNDS: usize = 20;

/// How long before a listing a file's last change must be for its [`FileStamp`] to vouch for its
/// content: a write within the same timestamp tick as the stat could otherwise go unnoticed
/// (Git's "racily clean" problem). Files changed more recently are read every scan.
pub const STAMP_MARGIN: Duration = Duration::from_secs(2);

/// `O_NONBLOCK`, so that opening a FIFO that replaced a regular file after it was checked (a
/// race) returns at once instead of waiting for a writer. Its value is the asm-generic one, which
/// these architectures use; elsewhere the file type check before opening is the only guard. (The
/// crate does not depend on `libc` directly; this keeps it that way.)
#[cfg(all(
    target_os = "linux",
    any(
        target_arch = "x86",
        target_arch = "x86_64",
        target_arch = "arm",
        target_arch = "aarch64",
        target_arch = "riscv64",
        target_arch = "powerpc64",
        target_arch = "s390x",
        target_arch = "loongarch64"
    )
))]
const O_NONBLOCK: i32 = 0o4000;
#[cfg(not(all(
    target_os = "linux",
    any(
        target_arch = "x86",
        target_arch = "x86_64",
        target_arch = "arm",
        target_arch = "aarch64",
        target_arch = "riscv64",
        target_arch = "powerpc64",
        target_arch = "s390x",
        target_arch = "loongarch64"
    )
)))]
const O_NONBLOCK: i32 = 0;

/// Why a config file or directory could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The path no longer exists (deleted between listing and reading).
    #[error("file vanished")]
    Vanished,
    /// A symlink whose target does not exist.
    #[error("dangling symlink: its target does not exist")]
    DanglingSymlink,
    /// Not a regular file after resolving symlinks (a FIFO, socket, device or directory).
    #[error("not a regular file ({kind}); only regular files are read")]
    NotRegular {
        /// What it is instead.
        kind: &'static str,
    },
    /// Larger than [`MAX_FILE_BYTES`].
    #[error("file larger than {limit} bytes; not read")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// Not UTF-8 text.
    #[error("not UTF-8 text: {0}")]
    NotUtf8(std::str::Utf8Error),
    /// The OS refused (permissions, I/O error, a symlink loop on the file itself).
    #[error("cannot read: {0}")]
    Io(#[from] std::io::Error),
    /// A directory deeper than [`MAX_DEPTH`].
    #[error("directory nested deeper than {limit} levels; not read")]
    TooDeep {
        /// The limit.
        limit: usize,
    },
    /// The walk stopped at [`MAX_ENTRIES`].
    #[error("more than {limit} directory entries; the rest of the tree is not read")]
    TooManyEntries {
        /// The limit.
        limit: usize,
    },
    /// The watched config directory itself is gone or no longer a directory.
    #[error("config directory is missing or not a directory; the last config read stays in force until it is back")]
    RootMissing,
}

/// Every [`ReadError::reason`], for metrics that list each one (at 0) from the start.
pub const REASONS: &[&str] = &["unreadable", "not_regular_file", "too_large", "not_utf8", "limit", "missing"];

impl ReadError {
    /// A short, stable name of the kind of problem (a metric label).
    pub fn reason(&self) -> &'static str {
        match self {
            ReadError::DanglingSymlink | ReadError::Io(_) => "unreadable",
            ReadError::NotRegular { .. } => "not_regular_file",
            ReadError::TooLarge { .. } => "too_large",
            ReadError::NotUtf8(_) => "not_utf8",
            ReadError::TooDeep { .. } | ReadError::TooManyEntries { .. } => "limit",
            ReadError::Vanished | ReadError::RootMissing => "missing",
        }
    }

    /// The error as a rejected "document" of `path`: document 0 stands for the file (or directory)
    /// as a whole, so it shows in `/debug/configz` and `validate` like any other config error.
    pub fn to_config_error(&self, path: &Path) -> ConfigError {
        ConfigError {
            file: path.display().to_string(),
            document: 0,
            object: None,
            error: FieldError::new("", self.to_string()),
            policy_selector: None,
        }
    }
}

/// What a regular-file check calls a file type, for messages.
fn kind_name(file_type: FileType) -> &'static str {
    if file_type.is_dir() {
        "directory"
    } else if file_type.is_fifo() {
        "FIFO"
    } else if file_type.is_socket() {
        "socket"
    } else if file_type.is_char_device() {
        "character device"
    } else if file_type.is_block_device() {
        "block device"
    } else {
        "special file"
    }
}

fn require_regular(metadata: &Metadata) -> Result<(), ReadError> {
    if metadata.is_file() {
        Ok(())
    } else {
        Err(ReadError::NotRegular { kind: kind_name(metadata.file_type()) })
    }
}

/// `metadata` (symlinks followed) of a path that should exist, telling a dangling symlink and a
/// vanished path apart.
fn resolve(path: &Path) -> Result<Metadata, ReadError> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(path).is_ok() {
                Err(ReadError::DanglingSymlink)
            } else {
                Err(ReadError::Vanished)
            }
        }
        Err(e) => Err(ReadError::Io(e)),
    }
}

/// Reads a config file as UTF-8 text: only a regular file (after resolving symlinks), never
/// blocking on a FIFO, at most [`MAX_FILE_BYTES`]. Blocking I/O: call it on the blocking pool.
pub fn read_config_file(path: &Path) -> Result<String, ReadError> {
    // Check the type before opening: opening a FIFO for reading waits for a writer.
    require_regular(&resolve(path)?)?;
    let file = match OpenOptions::new().read(true).custom_flags(O_NONBLOCK).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ReadError::Vanished),
        Err(e) => return Err(ReadError::Io(e)),
    };
    // Check again on what was opened, in case the path was replaced in between.
    let metadata = file.metadata()?;
    require_regular(&metadata)?;
    // The length is a hint only (the file may grow while being read): `take` is the bound.
    let hint = usize::try_from(metadata.len().min(MAX_FILE_BYTES)).unwrap_or(0);
    let mut bytes = Vec::with_capacity(hint);
    file.take(MAX_FILE_BYTES.saturating_add(1)).read_to_end(&mut bytes)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > MAX_FILE_BYTES {
        return Err(ReadError::TooLarge { limit: MAX_FILE_BYTES });
    }
    String::from_utf8(bytes).map_err(|e| ReadError::NotUtf8(e.utf8_error()))
}

/// The filesystem calls the tree walk and the directory source make: real ones in production,
/// in tests one that fails where wanted (as root, `chmod 000` does not make a directory
/// unreadable, so an unreadable directory cannot be produced for real).
pub(crate) trait Fs {
    /// The paths in `dir`, at most `limit + 1` of them (so a caller sees that there are more).
    fn read_dir(&self, dir: &Path, limit: usize) -> std::io::Result<Vec<std::io::Result<PathBuf>>>;
    /// [`read_config_file`].
    fn read_file(&self, path: &Path) -> Result<String, ReadError>;
    /// The current time, to which file timestamps are compared.
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// The real filesystem.
pub(crate) struct RealFs;

impl Fs for RealFs {
    fn read_dir(&self, dir: &Path, limit: usize) -> std::io::Result<Vec<std::io::Result<PathBuf>>> {
        Ok(std::fs::read_dir(dir)?.take(limit.saturating_add(1)).map(|entry| entry.map(|e| e.path())).collect())
    }

    fn read_file(&self, path: &Path) -> Result<String, ReadError> {
        read_config_file(path)
    }
}

/// Whether a path names a config file meshpilot reads.
pub fn is_config_file(path: &Path) -> bool {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or_default();
    !is_hidden(path) && matches!(ext, "yaml" | "yml" | "json")
}

/// Hidden names are skipped: editors keep swap files there, and Kubernetes ConfigMap mounts keep
/// `..data` style copies of every file.
fn is_hidden(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.'))
}

/// A writer's temp or swap file (`.name...`): hidden, and not one of Kubernetes' `..data` links,
/// whose swap is how a mounted ConfigMap changes.
pub(crate) fn is_temp_file(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.') && !n.starts_with(".."))
}

/// The config files of a tree, and what could not be read of it.
#[derive(Debug, Default)]
pub struct Listing {
    /// Config files, sorted, each file once (a file reachable by several paths under the first
    /// path the walk reaches it by). Some may turn out unreadable when read.
    pub files: Vec<PathBuf>,
    /// Directories and entries that could not be examined, with why.
    pub problems: Vec<(PathBuf, ReadError)>,
    /// Directories whose content is not (fully) known: files seen under them before still exist
    /// as far as anyone can tell.
    pub incomplete: Vec<PathBuf>,
    /// The walk stopped at [`MAX_ENTRIES`]: no file not listed can be assumed gone.
    pub truncated: bool,
    /// The stamp of each regular file listed whose last change is at least [`STAMP_MARGIN`]
    /// older than the listing: while it stays the same, so does the content.
    pub stamps: HashMap<PathBuf, FileStamp>,
}

/// What `stat` says about a regular file: while all of it stays the same, the content does too
/// (a write changes the modification and change times, a rename-in the inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    /// The stamp of `meta`, if its last change is at least [`STAMP_MARGIN`] before `now`.
    fn settled(meta: &Metadata, now: SystemTime) -> Option<FileStamp> {
        let stamp = FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        };
        let horizon = now.checked_sub(STAMP_MARGIN)?.duration_since(SystemTime::UNIX_EPOCH).ok()?;
        let horizon = (i64::try_from(horizon.as_secs()).ok()?, i64::from(horizon.subsec_nanos()));
        (stamp.mtime < horizon && stamp.ctime < horizon).then_some(stamp)
    }
}

/// The (device, inode) identity of a directory, `None` when `path` is not (or no longer) one.
pub fn dir_identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().filter(Metadata::is_dir).map(|m| (m.dev(), m.ino()))
}

/// Lists the config files under `root` (or `root` itself if it is a file), skipping hidden
/// entries. Fails only when `root` itself cannot be used; problems below it are in the listing.
/// Blocking I/O.
pub fn list_config_files(root: &Path) -> Result<Listing, ReadError> {
    list_with(root, &RealFs)
}

pub(crate) fn list_with(root: &Path, fs: &dyn Fs) -> Result<Listing, ReadError> {
    let root_meta = resolve(root)?;
    if root_meta.is_file() {
        return Ok(Listing { files: vec![root.to_path_buf()], ..Listing::default() });
    }
    if !root_meta.is_dir() {
        return Err(ReadError::NotRegular { kind: kind_name(root_meta.file_type()) });
    }
    let mut listing = Listing::default();
    let now = fs.now();
    let mut visited_dirs = HashSet::from([(root_meta.dev(), root_meta.ino())]);
    let mut seen_files = HashSet::new();
    let mut entries_left = MAX_ENTRIES;
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let entries = match fs.read_dir(&dir, entries_left) {
            Ok(entries) => entries,
            Err(e) => {
                listing.problems.push((dir.clone(), ReadError::Io(e)));
                listing.incomplete.push(dir);
                continue;
            }
        };
        if entries.len() > entries_left {
            listing.problems.push((dir, ReadError::TooManyEntries { limit: MAX_ENTRIES }));
            listing.truncated = true;
            break;
        }
        entries_left -= entries.len();
        let mut paths = Vec::with_capacity(entries.len());
        for entry in entries {
            match entry {
                Ok(path) => paths.push(path),
                Err(e) => {
                    // The rest of this directory is unknown.
                    listing.problems.push((dir.clone(), ReadError::Io(e)));
                    listing.incomplete.push(dir.clone());
                }
            }
        }
        paths.sort();
        let mut subdirs = Vec::new();
        for path in paths {
            match std::fs::metadata(&path) {
                Ok(meta) if meta.is_dir() => {
                    if is_hidden(&path) {
                        continue;
                    }
                    // A directory seen before is a symlink loop or a second way to the same one.
                    if !visited_dirs.insert((meta.dev(), meta.ino())) {
                        debug!(dir = %path.display(), "directory already read (symlink loop or alias); skipped");
                        continue;
                    }
                    if depth >= MAX_DEPTH {
                        listing.problems.push((path.clone(), ReadError::TooDeep { limit: MAX_DEPTH }));
                        listing.incomplete.push(path);
                        continue;
                    }
                    subdirs.push(path);
                }
                Ok(meta) => {
                    if !is_config_file(&path) {
                        continue;
                    }
                    // Regular files once each (hard links, symlinks to a file already listed);
                    // anything else is listed so that reading it reports what it is.
                    if meta.is_file() && !seen_files.insert((meta.dev(), meta.ino())) {
                        debug!(file = %path.display(), "file already listed under another path; skipped");
                        continue;
                    }
                    if let Some(stamp) = FileStamp::settled(&meta, now).filter(|_| meta.is_file()) {
                        listing.stamps.insert(path.clone(), stamp);
                    }
                    listing.files.push(path);
                }
                // Vanished, or a dangling symlink: a config file's is reported when read, anything
                // else's does not matter.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if is_config_file(&path) {
                        listing.files.push(path);
                    }
                }
                Err(e) => {
                    if is_config_file(&path) {
                        listing.files.push(path);
                    } else if !is_hidden(&path) {
                        // Maybe a directory we cannot look at: report it, and forget nothing under it.
                        listing.problems.push((path.clone(), ReadError::Io(e)));
                        listing.incomplete.push(path);
                    }
                }
            }
        }
        // Depth first, in name order.
        stack.extend(subdirs.into_iter().rev().map(|d| (d, depth + 1)));
    }
    listing.files.sort();
    Ok(listing)
}

/// Parses `text` like [`parse_file`], with each document's 1-based index in the file; warnings
/// are logged.
pub fn parse_documents(file: &str, text: &str) -> Vec<(usize, Document)> {
    parse_documents_checked(file, text).into_iter().map(|(index, checked)| (index, checked.logged())).collect()
}

/// As [`parse_documents`], returning the warnings.
///
/// `parse_file` does not say which document a valid object came from; this splits the documents
/// with its own splitter and parses them one by one.
pub fn parse_documents_checked(file: &str, text: &str) -> Vec<(usize, Checked)> {
    split_documents(text)
        .into_iter()
        .enumerate()
        .flat_map(|(i, doc)| {
            let index = i + 1;
            parse_file_checked(file, doc).into_iter().map(move |c| (index, renumber(c, index)))
        })
        .collect()
}

fn renumber(checked: Checked, index: usize) -> Checked {
    let document = match checked.document {
        Document::Valid(obj) => Document::Valid(obj),
        Document::Ignored { api_version, kind, name, .. } => {
            Document::Ignored { document: index, api_version, kind, name }
        }
        Document::Invalid(mut err) => {
            err.document = index;
            Document::Invalid(err)
        }
    };
    let warnings = checked.warnings.into_iter().map(|w| ConfigError { document: index, ..w }).collect();
    Checked { document, warnings }
}

/// Parses every config file under `root` (for `validate`), with warnings. A file or directory
/// that cannot be read yields one invalid document naming it and why; fails only when `root`
/// itself cannot be used. Blocking I/O.
pub fn parse_tree(root: &Path) -> Result<Vec<(PathBuf, Vec<Checked>)>, ReadError> {
    let listing = list_config_files(root)?;
    let unreadable = |path: &Path, e: ReadError| Checked {
        document: Document::Invalid(e.to_config_error(path)),
        warnings: Vec::new(),
    };
    let mut parsed: Vec<(PathBuf, Vec<Checked>)> = listing
        .files
        .into_iter()
        .map(|path| {
            let docs = match read_config_file(&path) {
                Ok(text) => {
                    parse_documents_checked(&path.display().to_string(), &text).into_iter().map(|(_, d)| d).collect()
                }
                Err(e) => vec![unreadable(&path, e)],
            };
            (path, docs)
        })
        .collect();
    parsed.extend(listing.problems.into_iter().map(|(path, e)| {
        let doc = unreadable(&path, e);
        (path, vec![doc])
    }));
    Ok(parsed)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::os::unix::fs::symlink;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::config::parse::parse_file;

    pub(crate) const VS: &str = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}]}]}\n";

    /// Runs `f` on a thread and fails (instead of hanging the test run) when it takes longer than
    /// `limit`: the bugs tested here hang.
    pub(crate) fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        match rx.recv_timeout(limit) {
            Ok(v) => v,
            Err(_) => panic!("did not finish within {limit:?}"),
        }
    }

    pub(crate) fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo").arg(path).status().unwrap();
        assert!(status.success(), "mkfifo failed");
    }

    /// A filesystem whose `read_dir` fails on one directory, like an unreadable (`chmod 000`)
    /// directory does for a non-root user.
    pub(crate) struct UnreadableDir(pub PathBuf);

    impl Fs for UnreadableDir {
        fn read_dir(&self, dir: &Path, limit: usize) -> std::io::Result<Vec<std::io::Result<PathBuf>>> {
            if dir == self.0 {
                return Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
            }
            RealFs.read_dir(dir, limit)
        }

        fn read_file(&self, path: &Path) -> Result<String, ReadError> {
            RealFs.read_file(path)
        }
    }

    #[test]
    fn symlink_loops_are_entered_once_and_each_file_listed_once() {
        // Reproduction: `ln -s . l1; ln -s . l2` made the walk branch twice per level down to
        // ELOOP (it never ended); one loop listed every file 41 times.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("vs.yaml"), VS).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/dr.yaml"), "{}").unwrap();
        symlink(".", dir.path().join("l1")).unwrap();
        symlink(".", dir.path().join("l2")).unwrap();
        symlink("..", dir.path().join("sub/up")).unwrap();
        let root = dir.path().to_path_buf();
        let listing = within(Duration::from_secs(10), move || list_config_files(&root).unwrap());
        assert_eq!(listing.files, vec![dir.path().join("sub/dr.yaml"), dir.path().join("vs.yaml")]);
        assert!(listing.problems.is_empty(), "{:?}", listing.problems);
    }

    #[test]
    fn a_symlinked_directory_outside_the_root_is_read() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("vs.yaml"), VS).unwrap();
        let dir = tempfile::tempdir().unwrap();
        symlink(outside.path(), dir.path().join("linked")).unwrap();
        let listing = list_config_files(dir.path()).unwrap();
        assert_eq!(listing.files, vec![dir.path().join("linked/vs.yaml")]);
    }

    #[test]
    fn a_fifo_is_reported_without_being_opened() {
        // Reproduction: a FIFO named *.yaml blocked the reader forever (no writer ever came).
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe.yaml");
        mkfifo(&fifo);
        let path = fifo.clone();
        let err = within(Duration::from_secs(5), move || read_config_file(&path)).unwrap_err();
        assert!(matches!(err, ReadError::NotRegular { kind: "FIFO" }), "{err}");
        assert_eq!(err.reason(), "not_regular_file");
        // As a config error it names the file, and no document (it is about the whole file).
        assert_eq!(
            err.to_config_error(&fifo).to_string(),
            format!("{}: not a regular file (FIFO); only regular files are read", fifo.display())
        );
    }

    #[test]
    fn a_symlink_to_dev_zero_is_not_read() {
        // Reproduction: `zero.yaml -> /dev/zero` was read without limit.
        let dir = tempfile::tempdir().unwrap();
        let zero = dir.path().join("zero.yaml");
        symlink("/dev/zero", &zero).unwrap();
        let err = within(Duration::from_secs(5), move || read_config_file(&zero)).unwrap_err();
        assert!(matches!(err, ReadError::NotRegular { kind: "character device" }), "{err}");
    }

    #[test]
    fn an_oversized_file_is_reported_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.yaml");
        // Sparse: costs no disk, and reading stops after the limit.
        std::fs::File::create(&big).unwrap().set_len(MAX_FILE_BYTES + 1).unwrap();
        let err = read_config_file(&big).unwrap_err();
        assert_eq!(err.to_string(), format!("file larger than {MAX_FILE_BYTES} bytes; not read"));
        assert_eq!(err.reason(), "too_large");
        std::fs::File::create(&big).unwrap().set_len(MAX_FILE_BYTES).unwrap();
        assert_eq!(read_config_file(&big).unwrap().len(), usize::try_from(MAX_FILE_BYTES).unwrap());
    }

    #[test]
    fn non_utf8_and_dangling_symlinks_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let latin1 = dir.path().join("latin1.yaml");
        std::fs::write(&latin1, b"metadata: {name: caf\xe9}\n").unwrap();
        assert_eq!(read_config_file(&latin1).unwrap_err().reason(), "not_utf8");
        let dangling = dir.path().join("gone.yaml");
        symlink(dir.path().join("nowhere.yaml"), &dangling).unwrap();
        assert!(matches!(read_config_file(&dangling), Err(ReadError::DanglingSymlink)));
        assert!(matches!(read_config_file(&dir.path().join("never.yaml")), Err(ReadError::Vanished)));
    }

    #[test]
    fn an_unreadable_directory_is_reported_and_the_rest_listed() {
        // Reproduction: a `chmod 000` subdirectory failed the whole listing. Tested through an
        // injected `read_dir` failure (root, which runs these tests, can read any directory), and
        // for real below when not root.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("vs.yaml"), VS).unwrap();
        let locked = dir.path().join("locked");
        std::fs::create_dir(&locked).unwrap();
        std::fs::write(locked.join("dr.yaml"), "{}").unwrap();
        let listing = list_with(dir.path(), &UnreadableDir(locked.clone())).unwrap();
        assert_eq!(listing.files, vec![dir.path().join("vs.yaml")]);
        assert_eq!(listing.incomplete, vec![locked.clone()]);
        assert!(matches!(listing.problems.as_slice(), [(p, ReadError::Io(_))] if *p == locked));

        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
        let real = list_config_files(dir.path()).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
        if std::fs::read_dir(&locked).is_ok() && real.problems.is_empty() {
            // Root: permissions do not apply; the injected failure above is the test.
            return;
        }
        assert_eq!(real.files, vec![dir.path().join("vs.yaml")]);
        assert_eq!(real.incomplete, vec![locked]);
    }

    #[test]
    fn directories_deeper_than_the_limit_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut deep = dir.path().to_path_buf();
        for _ in 0..=MAX_DEPTH {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("vs.yaml"), VS).unwrap();
        std::fs::write(deep.parent().unwrap().join("vs.yaml"), VS).unwrap();
        let listing = list_config_files(dir.path()).unwrap();
        assert_eq!(listing.files, vec![deep.parent().unwrap().join("vs.yaml")]);
        assert_eq!(listing.incomplete, vec![deep.clone()]);
        assert!(matches!(listing.problems.as_slice(), [(p, ReadError::TooDeep { .. })] if *p == deep));
        assert_eq!(listing.problems[0].1.reason(), "limit");
    }

    #[test]
    fn parse_documents_numbers_documents_as_parse_file_does() {
        let text = format!(
            "# leading comment\n---\n{VS}---\n\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c}}\n---\n{}...\n{}",
            VS.replace("name: r", "name: s"),
            VS.replace("hosts: [a]", "hosts: [\"a b\"]").replace("name: r", "name: t")
        );
        let ours = parse_documents("f", &text);
        let indices: Vec<usize> = ours.iter().map(|(i, _)| *i).collect();
        assert_eq!(indices, vec![1, 2, 3, 4]);
        // Where parse_file reports an index itself, it is the same one.
        let theirs = parse_file("f", &text);
        assert_eq!(theirs.len(), ours.len());
        for ((index, ours), theirs) in ours.iter().zip(&theirs) {
            match (ours, theirs) {
                (Document::Valid(a), Document::Valid(b)) => assert_eq!(a.key, b.key),
                (Document::Ignored { document: a, .. }, Document::Ignored { document: b, .. }) => {
                    assert_eq!(a, b);
                    assert_eq!(a, index);
                }
                (Document::Invalid(a), Document::Invalid(b)) => {
                    assert_eq!(a.document, b.document);
                    assert_eq!(a.document, *index);
                }
                (a, b) => panic!("documents differ: {a:?} vs {b:?}"),
            }
        }
    }

    #[test]
    fn unknown_fields_are_warnings_numbered_by_document() {
        let text = format!("{VS}---\n{}", VS.replace("hosts: [a]", "hosts: [a], exportTo: [\".\"], tcpp: []"));
        let checked = parse_documents_checked("f.yaml", &text);
        assert!(checked.iter().all(|(_, c)| matches!(c.document, Document::Valid(_))), "{checked:?}");
        assert!(checked[0].1.warnings.is_empty());
        let warnings: Vec<String> = checked[1].1.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(
            warnings,
            ["f.yaml: document 2 (VirtualService default/r): spec.tcpp: unknown field `tcpp`, ignored as Istio ignores it"]
        );
    }

    #[test]
    fn parse_tree_reports_special_files_and_ends() {
        // `validate` hung on loops and FIFOs; unreadable files must be errors there too.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("vs.yaml"), VS).unwrap();
        symlink(".", dir.path().join("loop")).unwrap();
        mkfifo(&dir.path().join("pipe.yaml"));
        std::fs::write(dir.path().join("latin1.yaml"), b"\xff\xfe").unwrap();
        let root = dir.path().to_path_buf();
        let parsed = within(Duration::from_secs(10), move || parse_tree(&root).unwrap());
        let errors: Vec<(String, String)> = parsed
            .iter()
            .flat_map(|(_, docs)| docs)
            .filter_map(|d| match &d.document {
                Document::Invalid(e) => Some((e.file.clone(), e.error.reason.clone())),
                _ => None,
            })
            .collect();
        let valid =
            parsed.iter().flat_map(|(_, docs)| docs).filter(|d| matches!(d.document, Document::Valid(_))).count();
        assert_eq!(valid, 1, "{parsed:?}");
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors.iter().any(|(f, r)| f.ends_with("pipe.yaml") && r.contains("FIFO")), "{errors:?}");
        assert!(errors.iter().any(|(f, r)| f.ends_with("latin1.yaml") && r.contains("UTF-8")), "{errors:?}");
        let started = Instant::now();
        let fifo_root = dir.path().join("pipe.yaml");
        assert!(matches!(parse_tree(&fifo_root), Err(ReadError::NotRegular { .. })));
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
