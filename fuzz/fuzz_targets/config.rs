//! Config parsing and validation on arbitrary text: the files users write (any number of
//! documents, `kind: List`, JSON), the mesh config, and the RE2 program size estimate every
//! regex field goes through. None of them may panic, whatever the input.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = meshpilot::config::parse::parse_file("fuzz.yaml", &text);
    let _ = meshpilot::mesh::MeshConfig::parse("mesh.yaml", &text);
    let _ = meshpilot::config::validation::re2_program_size(&text);
});
