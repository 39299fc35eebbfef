use std::io::Write;
use std::os::unix::fs::symlink;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::*;
use crate::config::Spec;
use crate::source::files::tests::{mkfifo, within, UnreadableDir, VS};
use crate::source::fswatch;

fn names(changes: &[(ConfigKey, Option<ValidConfig>)]) -> Vec<(String, bool)> {
    changes.iter().map(|(k, v)| (k.name.clone(), v.is_some())).collect()
}

fn reasons(state: &DirState) -> Vec<(String, String)> {
    state.errors().iter().map(|e| (e.file.clone(), e.error.reason.clone())).collect()
}

/// Truncates `file` now and writes `text` into it (in place, same inode) after `delay`, like
/// `sleep 0.03; cat new > file` does, from another thread.
fn write_in_place_later(file: &Path, text: &str, delay: Duration) -> std::thread::JoinHandle<()> {
    let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(file).unwrap();
    let text = text.to_string();
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        f.write_all(text.as_bytes()).unwrap();
    })
}

#[test]
fn invalid_edit_keeps_last_valid_version_and_delete_removes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vs.yaml");
    std::fs::write(&file, VS).unwrap();
    let mut state = DirState::default();
    let first = state.rescan(dir.path());
    assert_eq!(first.changes.len(), 1);

    std::fs::write(&file, VS.replace("hosts: [a]", "hosts: [\"a b\"]")).unwrap();
    let broken = state.rescan(dir.path());
    assert!(broken.changes.is_empty(), "the last valid version must stay: {:?}", broken.changes);
    assert_eq!(state.errors().len(), 1);
    assert!(broken.status_changed);

    std::fs::write(&file, "not: [valid").unwrap();
    assert!(state.rescan(dir.path()).changes.is_empty());

    std::fs::remove_file(&file).unwrap();
    let gone = state.rescan(dir.path());
    assert!(matches!(gone.changes.as_slice(), [(_, None)]));
    assert!(state.errors().is_empty());
}

#[test]
fn invalid_edit_written_in_place_keeps_the_object() {
    // Reproduction: `cat bad > vs.yaml` was read while empty (object deleted), then the bad
    // content had no previous version to keep, although the log said it was kept.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vs.yaml");
    std::fs::write(&file, VS).unwrap();
    let mut state = DirState::default();
    state.rescan(dir.path());
    let writer = write_in_place_later(&file, &VS.replace("hosts: [a]", "hosts: 7"), Duration::from_millis(30));
    let rescan = state.rescan(dir.path());
    writer.join().unwrap();
    let rescan_after = state.rescan(dir.path());
    assert!(rescan.changes.is_empty() && rescan_after.changes.is_empty(), "{:?}", rescan.changes);
    assert_eq!(state.merged.len(), 1, "the last valid version is still served");
    assert_eq!(state.errors().len(), 1, "{:?}", state.errors());
    assert_eq!(state.errors()[0].document, 1);
}

#[test]
fn truncate_then_write_never_withdraws_the_object() {
    // Reproduction: a truncate-then-write was read while empty and withdrew the routes briefly.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vs.yaml");
    std::fs::write(&file, VS).unwrap();
    let mut state = DirState::default();
    state.rescan(dir.path());
    let updated = VS.replace("hosts: [a]", "hosts: [a, b]");
    let writer = write_in_place_later(&file, &updated, Duration::from_millis(30));
    let rescan = state.rescan(dir.path());
    writer.join().unwrap();
    assert_eq!(names(&rescan.changes), vec![("r".to_string(), true)], "an update, never a deletion");
    assert!(state.errors().is_empty());
}

const AP: &str = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: deny, namespace: default}\nspec: {action: DENY, rules: [{to: [{operation: {paths: [/admin]}}]}]}\n";

#[test]
fn a_file_that_turns_blank_keeps_its_objects_until_removed_or_rewritten() {
    // Reproduction: `: > policy.yaml`, then the content written back 0.6 s later, withdrew the
    // DENY AuthorizationPolicy (and the gateway's RBAC filter) for the time in between.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    let both = format!("{VS}---\n{AP}");
    std::fs::write(&file, &both).unwrap();
    let mut state = DirState::default();
    assert_eq!(state.rescan(dir.path()).changes.len(), 2);
    for blank in ["", " \n\n", "# being written\n---\n", "---\n...\n"] {
        std::fs::write(&file, blank).unwrap();
        let rescan = state.rescan(dir.path());
        assert!(rescan.changes.is_empty(), "{blank:?} deleted: {:?}", names(&rescan.changes));
        assert_eq!(state.merged.len(), 2, "{blank:?}");
        assert_eq!(reasons(&state).len(), 1, "the kept objects are reported: {:?}", reasons(&state));
        assert!(reasons(&state)[0].1.contains("file is empty; the 2 objects it held stay served"));
    }
    // Content again: the file is what it says, and the report goes.
    std::fs::write(&file, AP).unwrap();
    let rewritten = state.rescan(dir.path());
    assert_eq!(
        names(&rewritten.changes),
        vec![("r".to_string(), false)],
        "an edit that leaves an object out deletes it"
    );
    assert!(state.errors().is_empty(), "{:?}", reasons(&state));
    // Blank again, then removed: removal deletes what it kept.
    std::fs::write(&file, "").unwrap();
    assert!(state.rescan(dir.path()).changes.is_empty());
    std::fs::remove_file(&file).unwrap();
    let removed = state.rescan(dir.path());
    assert_eq!(names(&removed.changes), vec![("deny".to_string(), false)]);
    assert!(state.errors().is_empty() && state.merged.is_empty());
}

#[test]
fn an_explicit_empty_list_deletes_the_objects() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    for empty in ["[]\n", "apiVersion: v1\nkind: List\nitems: []\n"] {
        std::fs::write(&file, AP).unwrap();
        let mut state = DirState::default();
        state.rescan(dir.path());
        std::fs::write(&file, "").unwrap();
        assert!(state.rescan(dir.path()).changes.is_empty());
        std::fs::write(&file, empty).unwrap();
        let rescan = state.rescan(dir.path());
        assert_eq!(names(&rescan.changes), vec![("deny".to_string(), false)], "{empty:?}");
        assert!(state.errors().is_empty(), "{empty:?}: {:?}", reasons(&state));
    }
}

#[test]
fn a_slow_in_place_write_never_withdraws_a_policy() {
    // The attack's timing: truncated, then written 0.6 s later (longer than any settling).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, AP).unwrap();
    let mut state = DirState::default();
    state.rescan(dir.path());
    let updated = AP.replace("/admin", "/admin*");
    let writer = write_in_place_later(&file, &updated, Duration::from_millis(600));
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(500) {
        let rescan = state.rescan(dir.path());
        assert!(rescan.changes.iter().all(|(_, v)| v.is_some()), "deleted: {:?}", names(&rescan.changes));
        assert_eq!(state.merged.len(), 1);
    }
    writer.join().unwrap();
    let rescan = state.rescan(dir.path());
    assert_eq!(names(&rescan.changes), vec![("deny".to_string(), true)], "an update, never a deletion");
}

#[test]
fn a_removed_file_deletes_its_objects_after_settling() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vs.yaml");
    std::fs::write(&file, VS).unwrap();
    let mut state = DirState::default();
    state.rescan(dir.path());
    std::fs::remove_file(&file).unwrap();
    let started = Instant::now();
    let rescan = state.rescan(dir.path());
    assert_eq!(names(&rescan.changes), vec![("r".to_string(), false)]);
    assert!(started.elapsed() >= SETTLE_INTERVAL * u32::try_from(EMPTY_SETTLE_READS - 1).unwrap());
}

#[test]
fn the_directory_vanishing_is_an_outage_not_a_deletion() {
    // Reproduction: `rm -rf` of the config directory withdrew every object.
    let parent = tempfile::tempdir().unwrap();
    let root = parent.path().join("cfg");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("vs.yaml"), VS).unwrap();
    let mut state = DirState::default();
    state.rescan(&root);

    std::fs::remove_dir_all(&root).unwrap();
    let outage = state.rescan(&root);
    assert!(outage.changes.is_empty(), "{:?}", outage.changes);
    assert_eq!(outage.root, None);
    assert!(outage.status_changed);
    assert_eq!(state.problem_counts(), BTreeMap::from([("missing", 1)]));
    let errors = state.errors();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].file, root.display().to_string());
    assert!(errors[0].error.reason.contains("missing"), "{}", errors[0].error.reason);

    // Back with a change: applied, and the outage is over.
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("vs.yaml"), VS.replace("hosts: [a]", "hosts: [b]")).unwrap();
    let back = state.rescan(&root);
    assert_eq!(names(&back.changes), vec![("r".to_string(), true)]);
    assert!(back.root.is_some());
    assert!(state.errors().is_empty());
}

#[test]
fn files_vanishing_while_the_directory_goes_are_not_deleted() {
    // `rm -rf` deletes the files first: a scan that sees them gone must not delete their
    // objects before it knows whether the directory goes too.
    let parent = tempfile::tempdir().unwrap();
    let root = parent.path().join("cfg");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("vs.yaml"), VS).unwrap();
    let mut state = DirState::default();
    state.rescan(&root);
    std::fs::remove_file(root.join("vs.yaml")).unwrap();
    let remover = {
        let root = root.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            std::fs::remove_dir(&root).unwrap();
        })
    };
    let rescan = state.rescan(&root);
    remover.join().unwrap();
    assert!(rescan.changes.is_empty(), "{:?}", rescan.changes);
    assert_eq!(rescan.root, None);
}

#[test]
fn symlink_loops_give_no_duplicates() {
    // Reproduction: one `ln -s . loop` read every file 41 times and reported 480 duplicates.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("vs.yaml"), VS).unwrap();
    symlink(".", dir.path().join("l1")).unwrap();
    symlink(".", dir.path().join("l2")).unwrap();
    let root = dir.path().to_path_buf();
    let (state, rescan) = within(Duration::from_secs(10), move || {
        let mut state = DirState::default();
        let rescan = state.rescan(&root);
        (state, rescan)
    });
    assert_eq!(names(&rescan.changes), vec![("r".to_string(), true)]);
    assert!(state.errors().is_empty(), "{:?}", state.errors());
}

#[test]
fn duplicates_are_served_from_the_first_file_and_both_places_named() {
    // Reproduction: the error blamed the other file and said "document 0".
    let dir = tempfile::tempdir().unwrap();
    let other = VS.replace("name: r", "name: other");
    std::fs::write(dir.path().join("a.yaml"), format!("{other}---\n{VS}")).unwrap();
    let second = VS.replace("hosts: [a]", "hosts: [z]");
    std::fs::write(dir.path().join("b.yaml"), format!("{other}---\n{other}---\n{second}")).unwrap();
    let mut state = DirState::default();
    state.rescan(dir.path());
    let (key, served) = state.merged.iter().find(|(k, _)| k.name == "r").unwrap();
    assert!(Arc::ptr_eq(served, &state.files[&dir.path().join("a.yaml")].objects[key].config));
    let errors = state.errors();
    let a = dir.path().join("a.yaml").display().to_string();
    let b = dir.path().join("b.yaml").display().to_string();
    // b.yaml document 1 repeats "other" (a.yaml document 1), document 2 repeats it within
    // b.yaml, document 3 repeats "r" (a.yaml document 2).
    let found: Vec<(String, usize, String)> =
        errors.iter().map(|e| (e.file.clone(), e.document, e.object.as_ref().unwrap().name.clone())).collect();
    assert_eq!(
        found,
        vec![(b.clone(), 2, "other".to_string()), (b.clone(), 1, "other".to_string()), (b.clone(), 3, "r".to_string())]
    );
    let r_error = errors.iter().find(|e| e.object.as_ref().unwrap().name == "r").unwrap();
    assert!(r_error.error.reason.contains(&format!("{a} document 2")), "{}", r_error.error.reason);
    let within_file = errors.iter().find(|e| e.document == 2).unwrap();
    assert!(within_file.error.reason.contains(&format!("{b} document 1")), "{}", within_file.error.reason);
    assert!(r_error.to_string().contains("document 3"), "{r_error}");
}

#[test]
fn special_unreadable_and_oversized_files_are_reported_and_keep_their_objects() {
    // Reproduction: a FIFO blocked the watcher forever, `/dev/zero` was read without limit, and
    // non-UTF-8 files were only in the log.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("vs.yaml"), VS).unwrap();
    let latin1 = dir.path().join("latin1.yaml");
    std::fs::write(&latin1, VS.replace("name: r", "name: l")).unwrap();
    let root = dir.path().to_path_buf();
    let mut state = DirState::default();
    state.rescan(&root);
    assert_eq!(state.merged.len(), 2);

    mkfifo(&dir.path().join("pipe.yaml"));
    symlink("/dev/zero", dir.path().join("zero.yaml")).unwrap();
    std::fs::File::create(dir.path().join("big.yaml"))
        .unwrap()
        .set_len(crate::source::files::MAX_FILE_BYTES + 1)
        .unwrap();
    std::fs::write(&latin1, b"caf\xe9: 1\n").unwrap();
    let (state, rescan) = within(Duration::from_secs(10), move || {
        let rescan = state.rescan(&root);
        (state, rescan)
    });
    assert!(rescan.changes.is_empty(), "latin1.yaml keeps its object: {:?}", rescan.changes);
    assert_eq!(state.problem_counts(), BTreeMap::from([("not_regular_file", 2), ("not_utf8", 1), ("too_large", 1)]));
    let errors = reasons(&state);
    for (name, reason) in [
        ("pipe.yaml", "FIFO"),
        ("zero.yaml", "character device"),
        ("big.yaml", "larger than"),
        ("latin1.yaml", "UTF-8"),
    ] {
        assert!(
            errors.iter().any(|(f, r)| f == &dir.path().join(name).display().to_string() && r.contains(reason)),
            "{name}: {errors:?}"
        );
    }
}

#[test]
fn an_unreadable_subdirectory_keeps_its_objects_and_does_not_freeze_the_rest() {
    // Reproduction: a `chmod 000` subdirectory failed every later scan, so no change applied.
    // As root (these tests run as root) permissions do not stop reads, so the directory is
    // made unreadable through an injected `read_dir` failure.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("vs.yaml"), VS).unwrap();
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::write(locked.join("other.yaml"), VS.replace("name: r", "name: other")).unwrap();
    let mut state = DirState::default();
    state.rescan(dir.path());
    assert_eq!(state.merged.len(), 2);

    std::fs::write(dir.path().join("vs.yaml"), VS.replace("hosts: [a]", "hosts: [b]")).unwrap();
    let rescan = state.rescan_with(dir.path(), &UnreadableDir(locked.clone()));
    assert_eq!(names(&rescan.changes), vec![("r".to_string(), true)], "the rest still updates");
    assert_eq!(state.merged.len(), 2, "the unreadable directory's objects stay");
    assert_eq!(state.problem_counts(), BTreeMap::from([("unreadable", 1)]));
    assert_eq!(state.errors()[0].file, locked.display().to_string());
    assert!(rescan.status_changed);

    let readable = state.rescan(dir.path());
    assert!(readable.changes.is_empty() && readable.status_changed);
    assert!(state.errors().is_empty());
}

/// The real filesystem, counting reads per file, with a clock `ahead` of the real one.
#[derive(Default)]
struct Counting {
    reads: std::sync::Mutex<HashMap<PathBuf, usize>>,
    listings: std::sync::atomic::AtomicUsize,
    ahead: Duration,
}

impl Counting {
    fn reads(&self, path: &Path) -> usize {
        self.reads.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    fn total(&self) -> usize {
        self.reads.lock().unwrap().values().sum()
    }
}

impl Fs for Counting {
    fn read_dir(&self, dir: &Path, limit: usize) -> std::io::Result<Vec<std::io::Result<PathBuf>>> {
        self.listings.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        RealFs.read_dir(dir, limit)
    }

    fn read_file(&self, path: &Path) -> Result<String, ReadError> {
        *self.reads.lock().unwrap().entry(path.to_path_buf()).or_default() += 1;
        RealFs.read_file(path)
    }

    fn now(&self) -> std::time::SystemTime {
        std::time::SystemTime::now() + self.ahead
    }
}

#[test]
fn files_whose_stamp_did_not_change_are_not_read_again() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["a", "b", "c"] {
        std::fs::write(dir.path().join(format!("{name}.yaml")), VS.replace("name: r", &format!("name: {name}")))
            .unwrap();
    }
    // Seen from an hour later, no file changed recently: their stamps vouch for them.
    let later = Counting { ahead: Duration::from_secs(3600), ..Counting::default() };
    let mut state = DirState::default();
    assert_eq!(state.rescan_with(dir.path(), &later).changes.len(), 3);
    assert_eq!(later.total(), 6, "each new file read until two reads agree");
    assert!(state.rescan_with(dir.path(), &later).changes.is_empty());
    assert_eq!(later.total(), 6, "nothing changed: nothing read");

    let b = dir.path().join("b.yaml");
    std::fs::write(&b, VS.replace("name: r", "name: b").replace("hosts: [a]", "hosts: [z]")).unwrap();
    let rescan = state.rescan_with(dir.path(), &later);
    assert_eq!(names(&rescan.changes), vec![("b".to_string(), true)]);
    assert_eq!((later.reads(&dir.path().join("a.yaml")), later.reads(&b)), (2, 4), "b read until settled");

    // Just written (within the stamp margin): a same-tick rewrite could keep the stamp, so
    // such files are read on every scan.
    let now = Counting::default();
    state.rescan_with(dir.path(), &now);
    state.rescan_with(dir.path(), &now);
    assert_eq!(now.total(), 6);
}

#[test]
fn a_file_renamed_in_is_used_at_its_first_read() {
    let parent = tempfile::tempdir().unwrap();
    let root = parent.path().join("cfg");
    std::fs::create_dir(&root).unwrap();
    let file = root.join("vs.yaml");
    std::fs::write(&file, VS).unwrap();
    let (mut state, arrivals, _watch, _rx) = scanned_and_watched(&root);

    // Written beside the directory, then renamed in: complete the moment it appears.
    let staged = parent.path().join("vs.yaml.new");
    std::fs::write(&staged, VS.replace("hosts: [a]", "hosts: [b]")).unwrap();
    std::fs::rename(&staged, &file).unwrap();
    let notified = arrivals.clone();
    within(Duration::from_secs(10), move || {
        while !notified.renames_only() {
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let fs = Counting::default();
    let rescan = state.rescan_inner(&root, &fs, Some(&arrivals));
    assert_eq!(names(&rescan.changes), vec![("r".to_string(), true)]);
    assert_eq!(fs.reads(&file), 1, "no settle rounds for a file renamed in");

    // Written to a hidden temp file beside it (as editors and `meshpilot load` do), then renamed
    // over it: just as whole.
    let temp = root.join(".vs.yaml.tmp");
    std::fs::write(&temp, VS.replace("hosts: [a]", "hosts: [d]")).unwrap();
    std::fs::rename(&temp, &file).unwrap();
    let notified = arrivals.clone();
    within(Duration::from_secs(10), move || {
        while !notified.renames_only() {
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let rescan = state.rescan_inner(&root, &fs, Some(&arrivals));
    assert_eq!(names(&rescan.changes), vec![("r".to_string(), true)]);
    assert_eq!(fs.reads(&file), 2, "read once more, without settle rounds");

    // Written in place: read until two reads agree.
    std::fs::write(&file, VS.replace("hosts: [a]", "hosts: [c]")).unwrap();
    let rescan = state.rescan_inner(&root, &fs, Some(&arrivals));
    assert_eq!(names(&rescan.changes), vec![("r".to_string(), true)]);
    assert_eq!(fs.reads(&file), 4);
}

/// `root` scanned once, and watched recording arrivals (for as long as the watch and receiver live).
fn scanned_and_watched(root: &Path) -> (DirState, Arrivals, fswatch::FsWatch, mpsc::Receiver<()>) {
    let mut state = DirState::default();
    state.rescan(root);
    let arrivals = Arrivals::default();
    let (tx, rx) = mpsc::channel(1);
    let watch = fswatch::watch_recording(root, tx, arrivals.clone()).unwrap();
    (state, arrivals, watch, rx)
}

/// Writes `content` to `staging` and renames it to `path`, then waits for the watch to record it.
/// Staged outside the watched tree: a rename inside it is notified twice (the target, then the
/// pair), and the second notification could land after the rescan took the first.
fn rename_in(staging: &Path, arrivals: &Arrivals, path: &Path, content: &str) {
    std::fs::write(staging, content).unwrap();
    std::fs::rename(staging, path).unwrap();
    let notified = arrivals.clone();
    within(Duration::from_secs(10), move || {
        while !notified.renames_only() {
            std::thread::sleep(Duration::from_millis(5));
        }
    });
}

#[test]
fn edits_renamed_in_merge_as_a_full_rescan_would() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("config");
    std::fs::create_dir(&root).unwrap();
    let with_host = |host: &str| VS.replace("hosts: [a]", &format!("hosts: [{host}]"));
    // r is served from a.yaml; b.yaml's r is a duplicate, reported naming a.yaml.
    std::fs::write(root.join("a.yaml"), with_host("a")).unwrap();
    std::fs::write(root.join("b.yaml"), with_host("b")).unwrap();
    std::fs::write(root.join("c.yaml"), VS.replace("{name: r}", "{name: s}")).unwrap();
    let (mut state, arrivals, _watch, _rx) = scanned_and_watched(&root);
    let staging = dir.path().join("staging.tmp");
    let fresh = || {
        let mut fresh = DirState::default();
        fresh.rescan(&root);
        fresh
    };
    let hosts_of_r = |state: &DirState| match state.merged.values().find(|c| c.key.name == "r").map(|c| &c.spec) {
        Some(Spec::VirtualService(vs)) => vs.hosts.clone(),
        other => panic!("r is no VirtualService: {other:?}"),
    };

    // The served definition edited: r changes, the duplicate is still reported.
    rename_in(&staging, &arrivals, &root.join("a.yaml"), &with_host("c"));
    let rescan = state.rescan_renamed(&root, &RealFs, &arrivals).expect("renamed in only");
    assert_eq!(names(&rescan.changes), vec![("r".to_string(), true)]);
    assert_eq!(hosts_of_r(&state), ["c"], "r serves the edit");
    assert_eq!((&state.merged, reasons(&state)), (&fresh().merged, reasons(&fresh())));
    // The duplicate edited: nothing served changes.
    rename_in(&staging, &arrivals, &root.join("b.yaml"), &with_host("d"));
    let rescan = state.rescan_renamed(&root, &RealFs, &arrivals).expect("renamed in only");
    assert!(rescan.changes.is_empty(), "{:?}", names(&rescan.changes));
    assert_eq!((&state.merged, reasons(&state)), (&fresh().merged, reasons(&fresh())));
    // An edit that adds an object: merged in whole, as before.
    let two = format!("{}---\n{}", with_host("e"), VS.replace("{name: r}", "{name: t}"));
    rename_in(&staging, &arrivals, &root.join("a.yaml"), &two);
    let rescan = state.rescan_renamed(&root, &RealFs, &arrivals).expect("renamed in only");
    assert_eq!(names(&rescan.changes), vec![("r".to_string(), true), ("t".to_string(), true)]);
    assert_eq!((&state.merged, reasons(&state)), (&fresh().merged, reasons(&fresh())));
}

#[test]
fn files_renamed_in_are_read_without_listing_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("config");
    std::fs::create_dir(&root).unwrap();
    let file = root.join("vs.yaml");
    std::fs::write(&file, VS).unwrap();
    std::fs::create_dir(root.join("sub")).unwrap();
    let (mut state, arrivals, _watch, _rx) = scanned_and_watched(&root);
    let staging = dir.path().join("staging.tmp");
    let rename_in = |path: &Path, content: &str| rename_in(&staging, &arrivals, path, content);

    // An edit of a known file, and a new file directly in the directory: read, never listed.
    let fs = Counting::default();
    rename_in(&file, &VS.replace("hosts: [a]", "hosts: [b]"));
    let rescan = state.rescan_renamed(&root, &fs, &arrivals).expect("renamed in only");
    assert_eq!(names(&rescan.changes), vec![("r".to_string(), true)]);
    rename_in(&root.join("new.yaml"), &VS.replace("{name: r}", "{name: new}"));
    let rescan = state.rescan_renamed(&root, &fs, &arrivals).expect("renamed in only");
    assert_eq!(names(&rescan.changes), vec![("new".to_string(), true)]);
    assert_eq!((fs.reads(&file), fs.listings.load(std::sync::atomic::Ordering::Relaxed)), (1, 0));
    assert!(state.rescan_renamed(&root, &fs, &arrivals).is_none(), "nothing recorded since");

    // A file the listing might not reach (below the root, never read) takes a full rescan.
    rename_in(&root.join("sub/deep.yaml"), &VS.replace("{name: r}", "{name: deep}"));
    assert!(state.rescan_renamed(&root, &fs, &arrivals).is_none());
    let rescan = state.rescan_after(&root, &arrivals);
    assert_eq!(names(&rescan.changes), vec![("deep".to_string(), true)]);
}
