//! The module structure: imports between top-level modules of `src/` only point down the data
//! flow (sources → ingest → snapshot → replication → xds) or into the shared model, and never
//! form a cycle. Read from the source itself (`crate::` paths), unit tests excluded.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every top-level module, lowest layer first. A module may import only modules of lower layers.
const LAYERS: &[&[&str]] = &[
    // Depend on nothing: plumbing every component uses.
    &["allocator"],
    &["telemetry", "drain", "readiness", "backoff"],
    // The shared model.
    &["config"],
    &["mesh"],
    &["registry"],
    &["snapshot"],
    // The data flow.
    &["source"],
    &["ingest"],
    &["cluster"],
    // CA, identities and authentication: used by replication, xds and app.
    &["security"],
    // Beside replication, Istio's validating webhook: the config parser behind HTTPS from the CA.
    &["replication", "webhook"],
    &["xds"],
    // Readers of everything below, and the composition roots.
    &["admin", "sim"],
    &["ctl"],
    &["app"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Top-level module → the top-level modules its files name through `crate::`, with one file each.
fn import_graph() -> BTreeMap<String, BTreeMap<String, String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let path_re = regex::Regex::new(r"crate::(\w+)").expect("regex");
    let group_re = regex::Regex::new(r"crate::\{([^}]*)\}").expect("regex");
    let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src").to_string_lossy().to_string();
        let top = rel.split('/').next().unwrap_or_default().trim_end_matches(".rs").to_string();
        if top == "main" || top == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read file");
        // Unit tests sit at the end of a file, after `#[cfg(test)]`; they may reach anywhere.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let mut targets: BTreeSet<String> = path_re.captures_iter(code).map(|c| c[1].to_string()).collect();
        for group in group_re.captures_iter(code) {
            targets.extend(group[1].split(',').filter_map(|p| p.split("::").next()).map(|p| p.trim().to_string()));
        }
        let edges = graph.entry(top.clone()).or_default();
        for target in targets.into_iter().filter(|t| *t != top && !t.is_empty()) {
            edges.entry(target).or_insert_with(|| rel.clone());
        }
    }
    graph
}

#[test]
fn every_top_level_module_has_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut unknown = Vec::new();
    for entry in std::fs::read_dir(&src).expect("read src") {
        let name = entry.expect("entry").file_name().to_string_lossy().trim_end_matches(".rs").to_string();
        if name != "main" && name != "lib" && layer_of(&name).is_none() {
            unknown.push(name);
        }
    }
    assert!(unknown.is_empty(), "modules missing from LAYERS in tests/architecture.rs: {unknown:?}");
}

#[test]
fn imports_only_point_down_the_layers() {
    let mut wrong = Vec::new();
    for (from, edges) in import_graph() {
        for (to, file) in edges {
            let (Some(a), Some(b)) = (layer_of(&from), layer_of(&to)) else {
                wrong.push(format!("{from} -> {to} ({file}): a module without a layer"));
                continue;
            };
            if a <= b {
                wrong.push(format!("{from} -> {to} (in {file})"));
            }
        }
    }
    assert!(wrong.is_empty(), "imports against the data flow:\n{}", wrong.join("\n"));
}

#[test]
fn no_import_cycles_between_top_level_modules() {
    let graph = import_graph();
    // Depth-first search; a back edge closes a cycle, reported with its path.
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeMap<String, String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(pos) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[pos..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flat_map(|e| e.keys()) {
            if let Some(cycle) = visit(next, graph, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, &graph, &mut Vec::new(), &mut done) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn telemetry_and_plumbing_depend_on_nothing() {
    let graph = import_graph();
    for leaf in LAYERS[0] {
        let edges = graph.get(*leaf).cloned().unwrap_or_default();
        assert!(edges.is_empty(), "{leaf} must import no other module, imports {edges:?}");
    }
}
