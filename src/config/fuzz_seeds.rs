//! The committed seeds of the fuzz targets (`fuzz/corpus/<target>/seed-*`), replayed through the
//! calls the targets make: the test command's share of fuzzing, which `scripts/fuzz.sh` does in
//! full (the instrumented build is too slow for every CI run). The `config` target's mesh config
//! half is replayed in `mesh`, its wire target in `replication::wire`.

use std::path::PathBuf;

use crate::config::parse::{parse_file, Document};

/// The seeds of a fuzz target, by file name.
pub(crate) fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .filter(|(name, _)| name.starts_with("seed-"))
        .map(|(name, path)| (name, std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))))
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no seeds in {}", dir.display());
    out
}

#[test]
fn config_seeds_replay_as_the_fuzz_target_runs_them() {
    for (name, data) in seeds("config") {
        let text = String::from_utf8_lossy(&data);
        let docs = parse_file("fuzz.yaml", &text);
        let _ = crate::config::validation::re2_program_size(&text);
        // The seeds are inputs users write: none is invalid (a ConfigMap in a list is ignored).
        if matches!(name.as_str(), "seed-virtualservice.yaml" | "seed-list.yaml") {
            assert!(!docs.iter().any(|d| matches!(d, Document::Invalid(_))), "{name}: {docs:?}");
        }
    }
}
