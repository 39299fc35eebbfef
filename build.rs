//! Compiles meshpilot's own protos (proto/) with tonic-prost-build (needs protoc), and copies
//! envoy-types' compiled descriptor set into OUT_DIR: the admin endpoints map Envoy's messages
//! to protobuf JSON with it, as Envoy's own `/config_dump` writes them.

use std::path::{Path, PathBuf};

const PROTOS: &[&str] = &["proto/meshpilot/snapshot/v1/snapshot.proto", "proto/istio/v1/auth/ca.proto"];

/// Where envoy-types keeps the descriptor set of every proto it compiled (not exported by the crate).
const ENVOY_DESCRIPTORS: &str = "src/generated/types.bin";

fn main() {
    println!("cargo:rerun-if-env-changed=PROTOC");
    println!("cargo:rerun-if-changed=Cargo.lock");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let found = match std::env::var_os("PROTOC") {
        Some(path) => Path::new(&path).is_file(),
        None => on_path("protoc"),
    };
    if !found {
        panic!(
            "protoc not found ($PROTOC is not a file, or no protoc on PATH): run `bash scripts/setup.sh` to install it"
        );
    }
    tonic_prost_build::configure()
        // Payloads are sliced into chunks without copying.
        .bytes(".")
        // Well-known types (the CA request's metadata Struct) are envoy-types' own.
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::envoy_types::pb::google::protobuf")
        .compile_protos(PROTOS, &["proto"])
        .unwrap_or_else(|e| panic!("compiling {PROTOS:?} failed: {e} (`bash scripts/setup.sh` installs protoc)"));
    copy_envoy_descriptors();
}

/// Finds envoy-types' source in Cargo's registry (the version `Cargo.lock` pins) and copies its
/// descriptor set to `$OUT_DIR/envoy_descriptors.bin`. `MESHPILOT_ENVOY_TYPES_DIR` names the
/// crate's directory where sources are vendored elsewhere.
fn copy_envoy_descriptors() {
    println!("cargo:rerun-if-env-changed=MESHPILOT_ENVOY_TYPES_DIR");
    let dir = match std::env::var_os("MESHPILOT_ENVOY_TYPES_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => registry_dir("envoy-types").unwrap_or_else(|why| {
            panic!("envoy-types' sources not found ({why}); set MESHPILOT_ENVOY_TYPES_DIR to the crate's directory")
        }),
    };
    let source = dir.join(ENVOY_DESCRIPTORS);
    println!("cargo:rerun-if-changed={}", source.display());
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    std::fs::copy(&source, out_dir.join("envoy_descriptors.bin"))
        .unwrap_or_else(|e| panic!("copying {}: {e}", source.display()));
}

/// `$CARGO_HOME/registry/src/*/<crate>-<version>`, the version read from `Cargo.lock`.
fn registry_dir(krate: &str) -> Result<PathBuf, String> {
    let lock = std::fs::read_to_string("Cargo.lock").map_err(|e| format!("reading Cargo.lock: {e}"))?;
    let entry = format!("name = \"{krate}\"\nversion = \"");
    let at = lock.find(&entry).ok_or_else(|| format!("{krate} is not in Cargo.lock"))? + entry.len();
    let version = lock[at..].split('"').next().unwrap_or_default();
    let home = match std::env::var_os("CARGO_HOME") {
        Some(home) => PathBuf::from(home),
        None => PathBuf::from(std::env::var_os("HOME").ok_or("neither CARGO_HOME nor HOME is set")?).join(".cargo"),
    };
    let src = home.join("registry/src");
    let registries = std::fs::read_dir(&src).map_err(|e| format!("reading {}: {e}", src.display()))?;
    registries
        .filter_map(Result::ok)
        .map(|r| r.path().join(format!("{krate}-{version}")))
        .find(|dir| dir.is_dir())
        .ok_or_else(|| format!("no {krate}-{version} under {}", src.display()))
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}
