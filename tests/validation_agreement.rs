//! `meshpilot validate` and Istio's real `istioctl validate` give the same verdict on every
//! document: Istio's validation corpus (`shared/conformance/istio-validation`) and meshpilot's own
//! documents of the security kinds and of unknown fields (`tests/testdata/validation/`).
//!
//! Each document is validated alone, by both binaries, from the same file. Where meshpilot
//! disagrees on purpose, the document says so in a `# differs: WHY` line, and the test checks
//! that the disagreement is exactly that one:
//! - `unknown-field`: istioctl decodes strictly and rejects a field of a spec its types lack;
//!   istiod and its admission webhook drop it, and so does meshpilot, with a warning naming it.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::corpus::{self, ERROR_KEY};
use common::istioctl::istioctl;
use meshpilot::config::parse::split_documents;

/// One document to validate with both.
struct Case {
    /// Where it came from, for messages.
    place: String,
    /// The document (Istio's expected error taken out).
    text: String,
    /// Why meshpilot's verdict differs, from a `# differs:` line.
    differs: Option<String>,
}

/// What a validator said of one document.
struct Verdict {
    valid: bool,
    output: String,
}

fn run(binary: &Path, args: &[&str], file: &Path, home: &Path) -> Verdict {
    let out = Command::new(binary)
        .args(args)
        .arg(file)
        .env("HOME", home)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", binary.display()));
    let output = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Verdict { valid: out.status.success(), output }
}

/// A document's text without Istio's expected error (istioctl would reject the key). The YAML is
/// kept as written: YAML readers differ on plain scalars such as `001:db8::` in a flow list, and
/// both validators must read the same text.
fn without_expected_error(text: &str) -> String {
    let key = format!("{ERROR_KEY}:");
    text.lines().filter(|l| !l.starts_with(&key)).map(|l| format!("{l}\n")).collect()
}

fn corpus_cases() -> Vec<Case> {
    corpus::all_documents()
        .into_iter()
        .map(|doc| Case { text: without_expected_error(&doc.text), place: doc.place, differs: None })
        .collect()
}

fn testdata_cases() -> Vec<Case> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/validation");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("reading test data");
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        for (i, doc) in split_documents(&text).into_iter().enumerate() {
            let differs = doc.lines().find_map(|l| l.strip_prefix("# differs: ")).map(|w| w.trim().to_string());
            let place = format!("{name} document {}", i + 1);
            cases.push(Case { text: doc.to_string(), place, differs });
        }
    }
    cases
}

/// The field istioctl names in `unknown field "X"`.
fn istioctl_unknown_field(output: &str) -> Option<&str> {
    let rest = &output[output.find("unknown field \"")? + "unknown field \"".len()..];
    rest.split('"').next()
}

/// Checks one case; `Err` says how the two disagree.
fn check(case: &Case, istioctl: &Verdict, meshpilot: &Verdict) -> Result<(), String> {
    let both = || format!("\n  istioctl: {}\n  meshpilot: {}", istioctl.output.trim(), meshpilot.output.trim());
    match case.differs.as_deref() {
        None if istioctl.valid == meshpilot.valid => Ok(()),
        None => Err(format!("istioctl valid={}, meshpilot valid={}:{}", istioctl.valid, meshpilot.valid, both())),
        Some("unknown-field") => {
            let field = istioctl_unknown_field(&istioctl.output);
            let warned = field.is_some_and(|f| {
                meshpilot.output.contains("warning:") && meshpilot.output.contains(&format!("unknown field `{f}`"))
            });
            match (istioctl.valid, meshpilot.valid, warned) {
                (false, true, true) => Ok(()),
                _ => Err(format!("expected istioctl to reject an unknown field and meshpilot to accept it with a warning naming it:{}", both())),
            }
        }
        Some(other) => Err(format!("unknown `# differs: {other}`")),
    }
}

#[test]
fn meshpilot_validate_agrees_with_istioctl_validate() {
    let Some(istioctl) = istioctl() else { return };
    let meshpilot = PathBuf::from(env!("CARGO_BIN_EXE_meshpilot"));
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("document.yaml");
    let cases: Vec<Case> = corpus_cases().into_iter().chain(testdata_cases()).collect();
    let mut failures = Vec::new();
    let (mut valid, mut invalid, mut differing) = (0, 0, 0);
    for case in &cases {
        std::fs::write(&file, &case.text).expect("writing the document");
        let theirs = run(&istioctl, &["validate", "-f"], &file, dir.path());
        let ours = run(&meshpilot, &["validate", "-f"], &file, dir.path());
        match check(case, &theirs, &ours) {
            Ok(()) if case.differs.is_some() => differing += 1,
            Ok(()) if ours.valid => valid += 1,
            Ok(()) => invalid += 1,
            Err(why) => failures.push(format!("{}: {why}", case.place)),
        }
    }
    println!(
        "validation agreement: {} documents; both valid {valid}, both invalid {invalid}, declared differences {differing}",
        cases.len()
    );
    assert!(valid > 20 && invalid > 20 && differing > 0, "too few documents: is the corpus complete?");
    assert!(failures.is_empty(), "{} of {} documents disagree:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn a_differing_verdict_without_a_declaration_fails_the_comparison() {
    let case = Case { place: "x".into(), text: String::new(), differs: None };
    let valid = || Verdict { valid: true, output: String::new() };
    let invalid = |output: &str| Verdict { valid: false, output: output.into() };
    assert!(check(&case, &valid(), &valid()).is_ok());
    assert!(check(&case, &invalid("bad"), &valid()).is_err());
    let unknown = Case { differs: Some("unknown-field".into()), ..case };
    let istioctl = invalid("* VirtualService/shop/r: cannot parse proto message: unknown field \"retires\" in X");
    let warned =
        Verdict { valid: true, output: "warning: f: spec.http[0].retires: unknown field `retires`, ignored".into() };
    assert!(check(&unknown, &istioctl, &warned).is_ok());
    let silent = Verdict { valid: true, output: "ok: VirtualService shop/r".into() };
    assert!(
        check(&unknown, &istioctl, &silent).is_err(),
        "accepting without the warning is not the declared difference"
    );
}
