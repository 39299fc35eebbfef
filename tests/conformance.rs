//! Istio's validation corpus: every valid document must be accepted, every invalid one rejected with
//! the error Istio's API server reports (field path and reason).
//!
//! The corpus lives in the steering repository, checked out as `shared/` beside this one.

use crate::common;

use std::fs;

use common::corpus::{all_documents, corpus_dir, documents, Document, ERROR_KEY};
use meshpilot::config::error::FieldError;
use meshpilot::config::parse::object_from_value;
use meshpilot::config::validation::validate;
use serde_json::Value;

/// What a document must do.
#[derive(Debug)]
enum Expect {
    /// Be accepted.
    Accept,
    /// Be rejected, with this error when Istio's is known.
    Reject(Option<ExpectedError>),
}

/// Istio's error for a document: `field: reason`, or just a message the reason must contain.
#[derive(Debug)]
struct ExpectedError {
    field: Option<String>,
    reason: String,
}

impl ExpectedError {
    /// Reads an `_err` value; `TODO` means Istio rejects the document without a recorded error.
    fn parse(text: &str) -> Option<ExpectedError> {
        let text = text.trim();
        if text == "TODO" {
            return None;
        }
        match text.split_once(": ") {
            Some((field, reason)) if !field.contains(' ') => {
                Some(ExpectedError { field: Some(field.to_string()), reason: reason.to_string() })
            }
            _ => Some(ExpectedError { field: None, reason: text.to_string() }),
        }
    }

    fn matches(&self, error: &FieldError) -> bool {
        self.field.as_ref().is_none_or(|f| *f == error.field) && error.reason.contains(&self.reason)
    }
}

/// Parses a document, taking out Istio's expected error.
fn parse(doc: &Document) -> Result<(Value, Expect), String> {
    let mut value: Value = serde_saphyr::from_str(&doc.text).map_err(|e| format!("not valid YAML: {e}"))?;
    let recorded = value.as_object_mut().and_then(|map| map.remove(ERROR_KEY));
    let expect = match (doc.invalid, recorded) {
        (false, None) => Expect::Accept,
        (false, Some(e)) => return Err(format!("valid document carries {ERROR_KEY}: {e}")),
        (true, None) => Expect::Reject(None),
        (true, Some(Value::String(e))) => Expect::Reject(ExpectedError::parse(&e)),
        (true, Some(e)) => return Err(format!("{ERROR_KEY} is not a string: {e}")),
    };
    Ok((value, expect))
}

/// Every error meshpilot reports for an object (a parse failure is one error).
fn errors_of(value: Value) -> Result<Vec<FieldError>, String> {
    match object_from_value(value) {
        Ok(Some(obj)) => Ok(validate(&obj)),
        Ok(None) => Err("meshpilot ignored it as a kind it does not serve".into()),
        Err((_, error)) => Ok(vec![error]),
    }
}

/// Checks one document; `Err` describes how it failed.
fn check(doc: &Document) -> Result<(), String> {
    let (value, expect) = parse(doc)?;
    let errors = errors_of(value)?;
    let listed = || errors.iter().map(|e| format!("\n    {e}")).collect::<String>();
    match expect {
        Expect::Accept if errors.is_empty() => Ok(()),
        Expect::Accept => Err(format!("valid document was rejected:{}", listed())),
        Expect::Reject(_) if errors.is_empty() => Err("invalid document was accepted".into()),
        Expect::Reject(None) => Ok(()),
        Expect::Reject(Some(expected)) if errors.iter().any(|e| expected.matches(e)) => Ok(()),
        Expect::Reject(Some(expected)) => Err(format!(
            "rejected, but not with Istio's error (field {:?}, reason containing {:?}); got:{}",
            expected.field.as_deref().unwrap_or("any"),
            expected.reason,
            listed()
        )),
    }
}

#[test]
fn istio_validation_corpus() {
    let mut failures = Vec::new();
    let (mut accepted, mut rejected) = (0, 0);
    for doc in all_documents() {
        match check(&doc) {
            Ok(()) if doc.invalid => rejected += 1,
            Ok(()) => accepted += 1,
            Err(why) => failures.push(format!("{}: {why}", doc.place)),
        }
    }
    println!("conformance: {accepted} valid documents accepted, {rejected} invalid documents rejected");
    assert!(accepted > 0 && rejected > 0, "the corpus at {} holds no documents", corpus_dir().display());
    assert!(failures.is_empty(), "{} corpus documents failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn commented_out_todo_documents_are_uncommented() {
    let dir = std::env::temp_dir().join(format!("meshpilot-conformance-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("x-invalid.yaml");
    fs::write(&path, "_err: a\nkind: A\n#---\n#_err: \"TODO\"\n#kind: B\n---\n# just a comment\n").unwrap();
    let docs = documents(&path);
    fs::remove_dir_all(&dir).unwrap();
    let texts: Vec<&str> = docs.iter().map(|d| d.text.as_str()).collect();
    assert_eq!(texts, ["_err: a\nkind: A\n", "_err: \"TODO\"\nkind: B\n"]);
}

#[test]
fn expected_errors_split_field_and_reason() {
    let e = ExpectedError::parse("spec.ports: Invalid value").unwrap();
    assert_eq!((e.field.as_deref(), e.reason.as_str()), (Some("spec.ports"), "Invalid value"));
    let e = ExpectedError::parse("CIDR addresses are allowed only for NONE/STATIC resolution types").unwrap();
    assert_eq!(e.field, None);
    assert!(ExpectedError::parse("TODO").is_none());
}
