//! The module structure, read from the source itself (unit tests excluded):
//!
//! - imports between top-level modules of `src/` only point down the data flow (sources →
//!   ingest → snapshot → replication → envoy (translation) → xds (serving)) or into the shared
//!   model, and never form a cycle;
//! - translation (`envoy`) is pure: it reads only the snapshot and its model, never serving;
//! - inside every module with children, at every depth, the children (files and folders) never
//!   import each other, directly or in a ring. The module's own file (`mod.rs`, `lib.rs`, or
//!   `x.rs` beside `x/`) is one more node of that graph: declaring a child (`mod x;`) and
//!   re-exporting from it (`pub use x::Item;`) are not uses, but code in the own file that calls
//!   a child is, and so is a child naming an item the own file defines. So the own file either
//!   uses its children or holds items they use, never both. A name reached through a `use` or a
//!   re-export counts as the module that defines it. Paths are read in every form: `crate::…`,
//!   `super::…`, `self::…`, a bare child name, and `use` groups (`use super::{a, b::c}`).
//!   The failure prints each cycle as modules with the `file:line` of each edge.

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
    // Translation: snapshot and proxy view → Envoy resources; then serving them.
    &["envoy"],
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

/// What translation may read: the snapshot and the model it holds, and the plumbing.
const TRANSLATION_READS: &[&str] =
    &["snapshot", "registry", "config", "mesh", "allocator", "telemetry", "drain", "readiness", "backoff"];

#[test]
fn translation_reads_only_the_snapshot_and_its_model() {
    let graph = import_graph();
    let edges = graph.get("envoy").expect("src/envoy is translation");
    let wrong: Vec<String> = edges
        .iter()
        .filter(|(to, _)| !TRANSLATION_READS.contains(&to.as_str()))
        .map(|(to, file)| format!("envoy -> {to} (in {file})"))
        .collect();
    assert!(wrong.is_empty(), "translation reads beyond the snapshot and its model:\n{}", wrong.join("\n"));
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

// Sibling modules at every depth (the rule is in the doc comment at the top). An edge runs from
// child A to child B of one module when code in A, or below A, names an item defined in B, or
// below B. An item both sides need goes into a sibling module named for what it is.

/// A child module, or the module's own file, in the graph of one module's children.
const OWN_FILE: &str = "";

/// The edges among one module's children: (from, to) → the `file:line`s of the references.
type Edges = BTreeMap<(String, String), Vec<String>>;

/// One token of a source file: an identifier, a number, `::`, or one punctuation character.
#[derive(Debug)]
struct Token {
    text: String,
    line: usize,
}

/// The text with comments, string and character literals blanked, lines kept.
fn blank_literals(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let ident_char = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                blank(&mut out, c[i]);
                i += 1;
            }
            continue;
        }
        if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            continue;
        }
        let starts_word = i == 0 || !ident_char(c[i - 1]);
        if starts_word && (c[i] == 'r' || (c[i] == 'b' && next == Some('r'))) {
            let mut j = i + if c[i] == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) == Some(&'"') {
                // A raw string: it ends at a quote followed by as many hashes as it opened with.
                let mut end = j + 1;
                while end < c.len() && !(c[end] == '"' && (1..=hashes).all(|h| c.get(end + h) == Some(&'#'))) {
                    end += 1;
                }
                let stop = (end + 1 + hashes).min(c.len());
                for &ch in &c[i..stop] {
                    blank(&mut out, ch);
                }
                i = stop;
                continue;
            }
        }
        if c[i] == '"' {
            blank(&mut out, c[i]);
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            if i < c.len() {
                blank(&mut out, c[i]);
                i += 1;
            }
            continue;
        }
        if c[i] == '\'' {
            // A character literal ('a', '\n', '\''), else a lifetime, kept as it is.
            let end = if next == Some('\\') {
                (i + 3..c.len()).find(|&k| c[k] == '\'')
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            if let Some(end) = end {
                for &ch in &c[i..=end] {
                    blank(&mut out, ch);
                }
                i = end + 1;
                continue;
            }
        }
        out.push(c[i]);
        i += 1;
    }
    out
}

fn tokenize(code: &str) -> Vec<Token> {
    let c: Vec<char> = code.chars().collect();
    let mut tokens = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let start = i;
        if c[i] == '\n' {
            line += 1;
            i += 1;
            continue;
        }
        if c[i].is_whitespace() {
            i += 1;
            continue;
        }
        if c[i].is_alphanumeric() || c[i] == '_' {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
        } else if c[i] == ':' && c.get(i + 1) == Some(&':') {
            i += 2;
        } else {
            i += 1;
        }
        tokens.push(Token { text: c[start..i].iter().collect(), line });
    }
    tokens
}

fn is_ident(text: &str) -> bool {
    text.chars().next().is_some_and(|ch| ch.is_alphabetic() || ch == '_')
}

/// A path named by a file, as written: its first segment may be `crate`, `super`, `self` or a
/// child module's name.
#[derive(Debug)]
struct PathRef {
    /// The module the path is written in (a module inline in the file included).
    module: Vec<String>,
    segments: Vec<String>,
    line: usize,
    /// A `use` at the top of its module binds this name (`None` for a glob).
    binds: Option<String>,
    /// The `use` is `pub` or `pub(…)`: a re-export.
    public: bool,
}

/// What one file declares and names.
#[derive(Debug, Default)]
struct FileScan {
    /// Child modules declared with `mod x;` in the file's own module.
    declared: Vec<String>,
    /// Modules written inline (`mod x { … }`), outside unit tests.
    inline: Vec<Vec<String>>,
    paths: Vec<PathRef>,
    /// Single identifiers outside `use` and paths, with their module and line: a name a `pub use`
    /// brought in is a use of its module when the own file's code names it.
    words: Vec<(Vec<String>, String, usize)>,
}

/// Parses one `use` tree from `toks[*i]` into its leaves: the path, the name it binds, its line.
fn use_tree(toks: &[Token], i: &mut usize, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>, usize)>) {
    let mut path = prefix.clone();
    while *i < toks.len() {
        let tok = &toks[*i];
        match tok.text.as_str() {
            "::" => *i += 1,
            "{" => {
                *i += 1;
                while *i < toks.len() && toks[*i].text != "}" {
                    use_tree(toks, i, path.clone(), out);
                    if toks.get(*i).is_some_and(|t| t.text == ",") {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            "*" => {
                out.push((path, None, tok.line));
                *i += 1;
                return;
            }
            text if is_ident(text) => {
                let group_self = text == "self" && !path.is_empty() && path == prefix;
                if !group_self {
                    path.push(text.to_string());
                }
                *i += 1;
                if toks.get(*i).is_some_and(|t| t.text == "::") {
                    continue;
                }
                let mut name = path.last().cloned();
                if toks.get(*i).is_some_and(|t| t.text == "as") {
                    name = toks.get(*i + 1).map(|t| t.text.clone());
                    *i += 2;
                }
                out.push((path, name, tok.line));
                return;
            }
            _ => return,
        }
    }
}

/// The index after the item starting at `toks[i]`: through its first `{…}` block, or its `;`
/// or `,`, or up to the brace that closes the block around it.
fn skip_item(toks: &[Token], mut i: usize) -> usize {
    let mut depth = 0;
    while i < toks.len() {
        match toks[i].text.as_str() {
            "{" | "(" | "[" => depth += 1,
            "}" | ")" | "]" if depth == 0 => return i,
            "}" if depth == 1 => return i + 1,
            "}" | ")" | "]" => depth -= 1,
            ";" | "," if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

fn scan_file(text: &str, module: &[String]) -> FileScan {
    let toks = tokenize(&blank_literals(text));
    let mut scan = FileScan::default();
    let mut depth = 0;
    // Inline modules open here: the name and the brace depth outside it.
    let mut inline: Vec<(String, i32)> = Vec::new();
    let current = |inline: &Vec<(String, i32)>| {
        let mut path = module.to_vec();
        path.extend(inline.iter().map(|(name, _)| name.clone()));
        path
    };
    let mut unit_test = false;
    let mut i = 0;
    while i < toks.len() {
        let text = toks[i].text.as_str();
        if text == "#" {
            let open = if toks.get(i + 1).is_some_and(|t| t.text == "!") { i + 2 } else { i + 1 };
            if toks.get(open).is_some_and(|t| t.text == "[") {
                let end = skip_item(&toks[open + 1..], 0) + open + 1;
                let attr: String = toks[open + 1..end].iter().map(|t| t.text.as_str()).collect();
                unit_test |= attr == "cfg(test)";
                i = end + 1;
                continue;
            }
        }
        if unit_test {
            unit_test = false;
            i = skip_item(&toks, i);
            continue;
        }
        match text {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            "mod" if toks.get(i + 1).is_some_and(|t| is_ident(&t.text)) => {
                let name = toks[i + 1].text.clone();
                match toks.get(i + 2).map(|t| t.text.as_str()) {
                    Some(";") if inline.is_empty() => scan.declared.push(name),
                    Some("{") => {
                        inline.push((name, depth));
                        scan.inline.push(current(&inline));
                    }
                    _ => {}
                }
                i += 2;
                continue;
            }
            "use" => {
                let public = i > 0 && {
                    let mut k = i - 1;
                    if toks[k].text == ")" {
                        while k > 0 && toks[k].text != "(" {
                            k -= 1;
                        }
                        k = k.saturating_sub(1);
                    }
                    toks[k].text == "pub"
                };
                let top = inline.last().map_or(0, |(_, d)| d + 1) == depth;
                let mut leaves = Vec::new();
                i += 1;
                use_tree(&toks, &mut i, Vec::new(), &mut leaves);
                for (segments, name, line) in leaves {
                    let binds = if top { name } else { None };
                    scan.paths.push(PathRef { module: current(&inline), segments, line, binds, public });
                }
                continue;
            }
            _ if is_ident(text)
                && toks.get(i + 1).is_some_and(|t| t.text == "::")
                && toks.get(i + 2).is_some_and(|t| is_ident(&t.text))
                && (i == 0 || toks[i - 1].text != "::") =>
            {
                let line = toks[i].line;
                let mut segments = vec![text.to_string()];
                i += 1;
                while toks.get(i).is_some_and(|t| t.text == "::") && toks.get(i + 1).is_some_and(|t| is_ident(&t.text))
                {
                    segments.push(toks[i + 1].text.clone());
                    i += 2;
                }
                scan.paths.push(PathRef { module: current(&inline), segments, line, binds: None, public: false });
                continue;
            }
            _ if is_ident(text) && (i == 0 || !matches!(toks[i - 1].text.as_str(), "::" | ".")) => {
                scan.words.push((current(&inline), text.to_string(), toks[i].line));
            }
            _ => {}
        }
        i += 1;
    }
    scan
}

/// The crate's modules, from `lib.rs` down its `mod` declarations (unit-test modules left out).
struct Crate {
    /// Module → the file holding it, relative to the repository.
    files: BTreeMap<Vec<String>, String>,
    /// Module → its child modules (inline ones included).
    children: BTreeMap<Vec<String>, BTreeSet<String>>,
    /// Module → name → the absolute path a top-level `use` binds it to.
    names: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>,
    /// The same, for `pub use` (any `pub(…)`) only.
    reexports: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>,
    /// Module of the file → what the file names.
    scans: BTreeMap<Vec<String>, FileScan>,
}

impl Crate {
    fn read() -> Crate {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut krate = Crate {
            files: BTreeMap::new(),
            children: BTreeMap::new(),
            names: BTreeMap::new(),
            reexports: BTreeMap::new(),
            scans: BTreeMap::new(),
        };
        let mut queue = vec![(Vec::<String>::new(), root.join("src/lib.rs"))];
        while let Some((module, file)) = queue.pop() {
            let text = std::fs::read_to_string(&file).expect("read module file");
            let scan = scan_file(&text, &module);
            let stem = file.file_stem().expect("file name").to_string_lossy().to_string();
            let dir = if stem == "mod" || stem == "lib" {
                file.parent().expect("parent").to_path_buf()
            } else {
                file.with_extension("")
            };
            for child in &scan.declared {
                let flat = dir.join(format!("{child}.rs"));
                let path = if flat.exists() { flat } else { dir.join(child).join("mod.rs") };
                let mut child_module = module.clone();
                child_module.push(child.clone());
                krate.children.entry(module.clone()).or_default().insert(child.clone());
                queue.push((child_module, path));
            }
            for inline in &scan.inline {
                let (name, parent) = inline.split_last().expect("inline module path");
                krate.children.entry(parent.to_vec()).or_default().insert(name.clone());
            }
            let rel = file.strip_prefix(root).expect("under the repository").to_string_lossy().to_string();
            krate.files.insert(module.clone(), rel);
            krate.scans.insert(module, scan);
        }
        let (mut names, mut reexports) = (BTreeMap::new(), BTreeMap::new());
        for scan in krate.scans.values() {
            for path in &scan.paths {
                if let (Some(name), Some(absolute)) = (&path.binds, krate.absolute(&path.segments, &path.module)) {
                    if path.public {
                        let bound = reexports.entry(path.module.clone()).or_insert_with(BTreeMap::new);
                        bound.insert(name.clone(), absolute.clone());
                    }
                    names.entry(path.module.clone()).or_insert_with(BTreeMap::new).insert(name.clone(), absolute);
                }
            }
        }
        (krate.names, krate.reexports) = (names, reexports);
        krate
    }

    fn is_child(&self, module: &[String], name: &str) -> bool {
        self.children.get(module).is_some_and(|c| c.contains(name))
    }

    /// The path from the crate root, or `None` for a path into another crate or a local name.
    fn absolute(&self, segments: &[String], module: &[String]) -> Option<Vec<String>> {
        let first = segments.first()?;
        let (mut path, rest) = match first.as_str() {
            "crate" => (Vec::new(), &segments[1..]),
            "self" => (module.to_vec(), &segments[1..]),
            "super" => {
                let ups = segments.iter().take_while(|s| *s == "super").count();
                (module[..module.len().checked_sub(ups)?].to_vec(), &segments[ups..])
            }
            name if self.is_child(module, name) => (module.to_vec(), segments),
            _ => return None,
        };
        path.extend(rest.iter().cloned());
        Some(path)
    }

    /// The module that defines what an absolute path names, following `use` re-bindings.
    fn defining_module(&self, absolute: &[String], hops: usize) -> Vec<String> {
        let mut module = Vec::new();
        for (k, segment) in absolute.iter().enumerate() {
            if self.is_child(&module, segment) {
                module.push(segment.clone());
                continue;
            }
            let bound = self.names.get(&module).and_then(|n| n.get(segment));
            if let (Some(bound), true) = (bound, hops < 8) {
                let mut next = bound.clone();
                next.extend(absolute[k + 1..].iter().cloned());
                return self.defining_module(&next, hops + 1);
            }
            return module;
        }
        module
    }

    /// Module with children → the edges among them; a node is a child, or [`OWN_FILE`].
    fn sibling_edges(&self) -> BTreeMap<Vec<String>, Edges> {
        let mut graphs: BTreeMap<Vec<String>, Edges> = BTreeMap::new();
        let mut add = |from: &Vec<String>, absolute: &[String], reexport: bool, at: String| {
            let target = self.defining_module(absolute, 0);
            let common = from.iter().zip(&target).take_while(|(a, b)| a == b).count();
            let node = |m: &Vec<String>| m.get(common).cloned().unwrap_or_else(|| OWN_FILE.to_string());
            let (a, b) = (node(from), node(&target));
            // Declaring and re-exporting children are the parent's job, not uses.
            if a != b && !(a == OWN_FILE && reexport) {
                graphs.entry(from[..common].to_vec()).or_default().entry((a, b)).or_default().push(at);
            }
        };
        for (file_module, scan) in &self.scans {
            let file = &self.files[file_module];
            for path in &scan.paths {
                if let Some(absolute) = self.absolute(&path.segments, &path.module) {
                    add(&path.module, &absolute, path.public, format!("{file}:{}", path.line));
                }
            }
            for (module, word, line) in &scan.words {
                if let Some(absolute) = self.reexports.get(module).and_then(|r| r.get(word)) {
                    add(module, absolute, false, format!("{file}:{line}"));
                }
            }
        }
        graphs
    }

    fn label(&self, parent: &[String], node: &str) -> String {
        if node == OWN_FILE {
            let file = self.files.get(parent).map_or("(inline)", |f| f.rsplit('/').next().unwrap_or(f));
            let name = if parent.is_empty() { "crate".to_string() } else { parent.join("::") };
            return format!("{name} [{file}]");
        }
        let mut path = parent.to_vec();
        path.push(node.to_string());
        path.join("::")
    }
}

/// For every edge on a cycle, the shortest cycle through it, each cycle once: every import that
/// could be the one to remove shows up.
fn shortest_cycles(edges: &Edges) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        next.entry(a).or_default().push(b);
    }
    let mut cycles = BTreeSet::new();
    for (a, b) in edges.keys() {
        // Breadth-first from `b` back to `a`.
        let mut came_from: BTreeMap<&str, &str> = BTreeMap::from([(b.as_str(), a.as_str())]);
        let mut queue = std::collections::VecDeque::from([b.as_str()]);
        while let Some(node) = queue.pop_front() {
            if node == a {
                break;
            }
            for &succ in next.get(node).into_iter().flatten() {
                if let std::collections::btree_map::Entry::Vacant(e) = came_from.entry(succ) {
                    e.insert(node);
                    queue.push_back(succ);
                }
            }
        }
        if !came_from.contains_key(a.as_str()) || a == b {
            continue;
        }
        let mut cycle = vec![a.clone()];
        let mut at = came_from[a.as_str()];
        while at != b {
            cycle.push(at.to_string());
            at = came_from[at];
        }
        cycle.push(b.clone());
        cycle.reverse();
        // Now b … a; start at the smallest node, so each cycle is kept once.
        let min = (0..cycle.len()).min_by_key(|&k| &cycle[k]).unwrap_or(0);
        cycle.rotate_left(min);
        cycles.insert(cycle);
    }
    cycles.into_iter().collect()
}

#[test]
fn no_import_cycles_between_siblings_at_any_depth() {
    let krate = Crate::read();
    let mut report = Vec::new();
    for (parent, edges) in krate.sibling_edges() {
        for cycle in shortest_cycles(&edges) {
            let mut line = krate.label(&parent, &cycle[0]);
            for (k, node) in cycle.iter().enumerate() {
                let to = &cycle[(k + 1) % cycle.len()];
                let at = &edges[&(node.clone(), to.clone())];
                let more = if at.len() > 1 { format!(" +{} more", at.len() - 1) } else { String::new() };
                line.push_str(&format!("\n      -> {}  ({}{more})", krate.label(&parent, to), at[0]));
            }
            report.push(line);
        }
    }
    assert!(
        report.is_empty(),
        "{} import cycles among sibling modules; move what both sides need to the module it \
         belongs to:\n  {}",
        report.len(),
        report.join("\n  ")
    );
}

#[test]
fn the_sibling_check_reads_every_path_form_and_finds_rings() {
    let text = "use super::{a, b::{c, D as E}};\nfn f() { crate::x::y(); self::z::w(\"super::s\"); }\n\
                #[cfg(test)]\nmod tests { use super::q; }\n";
    let scan = scan_file(text, &["m".to_string(), "n".to_string()]);
    let paths: Vec<String> = scan.paths.iter().map(|p| p.segments.join("::")).collect();
    assert_eq!(paths, ["super::a", "super::b::c", "super::b::D", "crate::x::y", "self::z::w"]);
    let mut edges = Edges::new();
    edges.insert(("a".to_string(), "b".to_string()), vec!["a.rs:1".to_string()]);
    edges.insert(("b".to_string(), "a".to_string()), vec!["b.rs:2".to_string()]);
    edges.insert(("b".to_string(), "c".to_string()), vec!["b.rs:3".to_string()]);
    assert_eq!(shortest_cycles(&edges), [["a", "b"]]);
}
