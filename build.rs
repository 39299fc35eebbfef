//! Compiles meshpilot's own protos (proto/) with tonic-prost-build; needs protoc.

const PROTOS: &[&str] = &["proto/meshpilot/snapshot/v1/snapshot.proto", "proto/istio/v1/auth/ca.proto"];

fn main() {
    println!("cargo:rerun-if-env-changed=PROTOC");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let found = match std::env::var_os("PROTOC") {
        Some(path) => std::path::Path::new(&path).is_file(),
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
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}
