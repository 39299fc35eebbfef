//! Turning file text (multi-document YAML or JSON) into typed config objects.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::api;
use super::error::{ConfigError, FieldError};
use super::object::{ConfigKey, ConfigObject, Kind, Meta, Spec, NETWORKING_GROUP, NETWORKING_VERSIONS};
use super::validation;

/// Namespace given to objects whose metadata has none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// What one document of a file turned out to be.
// Short-lived: valid objects move into an `Arc` right away.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Document {
    /// A served kind that parsed and validated.
    Valid(ConfigObject),
    /// A kind meshpilot does not serve (listed, not an error).
    Ignored {
        /// 1-based document index.
        document: usize,
        /// `apiVersion`.
        api_version: String,
        /// `kind`.
        kind: String,
        /// `metadata.name`, if any.
        name: String,
    },
    /// A rejected document.
    Invalid(ConfigError),
}

/// Parses and validates every document of a file.
pub fn parse_file(file: &str, text: &str) -> Vec<Document> {
    split_documents(text).into_iter().enumerate().flat_map(|(i, doc)| parse_document(file, i + 1, doc)).collect()
}

/// Splits YAML text at `---` separator lines, dropping documents with no content.
fn split_documents(text: &str) -> Vec<&str> {
    let mut docs = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_end();
        if trimmed == "---" || trimmed.starts_with("--- ") || trimmed == "..." {
            docs.push(&text[start..offset]);
            start = offset + line.len();
        }
        offset += line.len();
    }
    docs.push(&text[start..]);
    docs.into_iter().filter(|d| has_content(d)).collect()
}

fn has_content(doc: &str) -> bool {
    doc.lines().any(|l| {
        let t = l.trim();
        !t.is_empty() && !t.starts_with('#')
    })
}

fn parse_document(file: &str, index: usize, text: &str) -> Vec<Document> {
    let value: Value = match serde_saphyr::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return vec![Document::Invalid(ConfigError {
                file: file.to_string(),
                document: index,
                object: None,
                error: FieldError::new("", format!("not valid YAML/JSON: {e}")),
            })]
        }
    };
    // A `kind: List` (or a bare JSON array) holds several objects in one document.
    let items = match value {
        Value::Array(items) => items,
        Value::Object(ref map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
            map.get("items").and_then(Value::as_array).cloned().unwrap_or_default()
        }
        Value::Null => return Vec::new(),
        other => vec![other],
    };
    items
        .into_iter()
        .map(|item| match object_from_value(item) {
            Ok(Some(obj)) => {
                let errors = validation::validate(&obj);
                match errors.into_iter().next() {
                    None => Document::Valid(obj),
                    Some(error) => Document::Invalid(ConfigError {
                        file: file.to_string(),
                        document: index,
                        object: Some(obj.key),
                        error,
                    }),
                }
            }
            Ok(None) => ignored(index, text),
            Err((object, error)) => {
                Document::Invalid(ConfigError { file: file.to_string(), document: index, object, error })
            }
        })
        .collect()
}

fn ignored(index: usize, text: &str) -> Document {
    let value: Value = serde_saphyr::from_str(text).unwrap_or(Value::Null);
    let s = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_string();
    Document::Ignored {
        document: index,
        api_version: s(value.get("apiVersion")),
        kind: s(value.get("kind")),
        name: s(value.pointer("/metadata/name")),
    }
}

type ParseFailure = (Option<ConfigKey>, FieldError);

/// Builds a typed object from a generic value; `Ok(None)` for kinds meshpilot does not serve.
pub fn object_from_value(value: Value) -> Result<Option<ConfigObject>, ParseFailure> {
    let Value::Object(mut map) = value else {
        return Err((None, FieldError::new("", "document is not an object")));
    };
    let api_version = map.get("apiVersion").and_then(Value::as_str).unwrap_or_default().to_string();
    let kind_name = map.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
    if api_version.is_empty() {
        return Err((None, FieldError::new("apiVersion", "Required value")));
    }
    if kind_name.is_empty() {
        return Err((None, FieldError::new("kind", "Required value")));
    }
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version.as_str()));
    let Some(kind) = Kind::from_name(&kind_name) else {
        return Ok(None);
    };
    if group != NETWORKING_GROUP {
        return Ok(None);
    }
    let metadata = map.remove("metadata").unwrap_or(Value::Null);
    let name = metadata.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
    let namespace = metadata
        .get("namespace")
        .and_then(Value::as_str)
        .filter(|ns| !ns.is_empty())
        .unwrap_or(DEFAULT_NAMESPACE)
        .to_string();
    let key = ConfigKey { kind, namespace, name };
    let fail = |field: &str, reason: String| Err((Some(key.clone()), FieldError::new(field, reason)));
    if !NETWORKING_VERSIONS.contains(&version) {
        return fail(
            "apiVersion",
            format!("unsupported version {api_version:?} for {kind_name} (v1, v1beta1 or v1alpha3)"),
        );
    }
    if key.name.is_empty() {
        return fail("metadata.name", "Required value".into());
    }
    if let Err(reason) = validation::check_dns1123_subdomain(&key.name) {
        return fail("metadata.name", reason);
    }
    if let Err(reason) = validation::check_dns1123_label(&key.namespace) {
        return fail("metadata.namespace", reason);
    }
    let string_map = |field: &str| -> Result<api::Labels, String> {
        match metadata.get(field) {
            None | Some(Value::Null) => Ok(api::Labels::new()),
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| e.to_string()),
        }
    };
    let labels = match string_map("labels") {
        Ok(l) => l,
        Err(e) => return fail("metadata.labels", e),
    };
    let annotations = match string_map("annotations") {
        Ok(l) => l,
        Err(e) => return fail("metadata.annotations", e),
    };
    let Some(spec_value) = map.remove("spec").filter(|v| !v.is_null()) else {
        return fail("spec", "Required value".into());
    };
    let spec = match kind {
        Kind::VirtualService => typed(spec_value).map(Spec::VirtualService),
        Kind::DestinationRule => typed(spec_value).map(Spec::DestinationRule),
        Kind::Gateway => typed(spec_value).map(Spec::Gateway),
        Kind::ServiceEntry => typed(spec_value).map(Spec::ServiceEntry),
        Kind::WorkloadEntry => typed(spec_value).map(Spec::WorkloadEntry),
        Kind::Sidecar => typed(spec_value).map(Spec::Sidecar),
    };
    match spec {
        Ok(spec) => Ok(Some(ConfigObject { key, meta: Meta { labels, annotations, api_version }, spec })),
        Err(e) => Err((Some(key), e)),
    }
}

/// Deserializes a spec, keeping the path of the field that failed.
fn typed<T: DeserializeOwned>(value: Value) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { "spec".to_string() } else { format!("spec.{path}") };
        FieldError::new(field, e.into_inner().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_documents_and_skips_empty_ones() {
        let text = "---\n# only a comment\n---\na: 1\n---\n\n---\nb: 2\n";
        assert_eq!(split_documents(text), vec!["a: 1\n", "b: 2\n"]);
    }

    #[test]
    fn unknown_field_is_reported_with_its_path() {
        let text = r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: r, namespace: ns}
spec:
  hosts: [a]
  http:
  - route:
    - destination: {host: a}
      wieght: 3
"#;
        let docs = parse_file("f.yaml", text);
        let Document::Invalid(err) = &docs[0] else { panic!("expected invalid: {docs:?}") };
        assert_eq!(err.error.field, "spec.http[0].route[0].wieght");
        assert!(err.error.reason.contains("wieght"), "{}", err.error.reason);
        assert_eq!(err.document, 1);
        assert_eq!(err.object.as_ref().map(|k| k.to_string()).as_deref(), Some("VirtualService ns/r"));
    }

    #[test]
    fn other_kinds_are_ignored_not_errors() {
        let docs = parse_file("f.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n");
        assert!(matches!(&docs[0], Document::Ignored { kind, .. } if kind == "ConfigMap"));
    }

    #[test]
    fn json_documents_parse() {
        let docs = parse_file(
            "f.json",
            r#"{"apiVersion":"networking.istio.io/v1beta1","kind":"Gateway","metadata":{"name":"g"},"spec":{"servers":[{"port":{"number":80,"name":"http","protocol":"HTTP"},"hosts":["*"]}]}}"#,
        );
        assert!(matches!(&docs[0], Document::Valid(o) if o.key.namespace == "default"), "{docs:?}");
    }
}
