//! Turning file text (multi-document YAML or JSON) into typed config objects.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::api;
use super::decode::{decode, unknown_field_reason};
use super::error::{ConfigError, FieldError};
use super::object::{ConfigKey, ConfigObject, Kind, Meta, Spec, SECURITY_GROUP};
use super::validation;

/// The fields an object may have outside its spec.
const TOP_LEVEL_FIELDS: [&str; 5] = ["apiVersion", "kind", "metadata", "spec", "status"];

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

/// A parsed document and what is questionable about it without making it invalid (fields Istio's
/// decoding drops), located as errors are.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The document.
    pub document: Document,
    /// Warnings: the document is served, these parts of it are not.
    pub warnings: Vec<ConfigError>,
}

/// Parses and validates every document of a file; warnings are logged.
pub fn parse_file(file: &str, text: &str) -> Vec<Document> {
    parse_file_checked(file, text).into_iter().map(Checked::logged).collect()
}

/// Parses and validates every document of a file, returning the warnings beside each.
pub fn parse_file_checked(file: &str, text: &str) -> Vec<Checked> {
    split_documents(text).into_iter().enumerate().flat_map(|(i, doc)| parse_document(file, i + 1, doc)).collect()
}

impl Checked {
    /// The document, its warnings logged (a source serves it; the log tells the user what was not).
    pub fn logged(self) -> Document {
        for warning in &self.warnings {
            let object = warning.object.as_ref().map(ToString::to_string).unwrap_or_default();
            tracing::warn!(
                file = %warning.file,
                document = warning.document,
                %object,
                field = %warning.error.field,
                reason = %warning.error.reason,
                "config field ignored"
            );
        }
        self.document
    }
}

/// Splits YAML text at `---` separator lines, dropping documents with no content.
pub fn split_documents(text: &str) -> Vec<&str> {
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

fn parse_document(file: &str, index: usize, text: &str) -> Vec<Checked> {
    let invalid = |object: Option<ConfigKey>, error: FieldError| Checked {
        document: Document::Invalid(ConfigError {
            file: file.to_string(),
            document: index,
            object,
            error,
            policy_selector: None,
        }),
        warnings: Vec::new(),
    };
    let value: Value = match serde_saphyr::from_str(text) {
        Ok(v) => v,
        Err(e) => return vec![invalid(None, FieldError::new("", format!("not valid YAML/JSON: {e}")))],
    };
    // A `kind: List` (or a bare JSON array) holds several objects in one document. Each item is
    // parsed from the value already in hand, once: nothing here may re-read or re-serialise the
    // whole document per item, or a List of n items costs n² (it froze updates on 2,000 items).
    match value {
        Value::Null => Vec::new(),
        Value::Array(items) => {
            items.into_iter().enumerate().map(|(i, item)| parse_item(file, index, &format!("[{i}]"), item)).collect()
        }
        Value::Object(mut map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
            match map.remove("items") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(items)) => items
                    .into_iter()
                    .enumerate()
                    .map(|(i, item)| parse_item(file, index, &format!("items[{i}]"), item))
                    .collect(),
                Some(_) => vec![invalid(None, FieldError::new("items", "a List's items must be a list of objects"))],
            }
        }
        other => vec![parse_item(file, index, "", other)],
    }
}

/// Parses and validates one object read from an API (not from a file): errors name `source` and
/// document 0; warnings are logged.
pub fn parse_object(source: &str, value: Value) -> Document {
    parse_object_checked(source, value).logged()
}

/// As [`parse_object`], returning the warnings.
pub fn parse_object_checked(source: &str, value: Value) -> Checked {
    parse_item(source, 0, "", value)
}

/// Parses and validates one object; `path` locates it in its document (`items[3]` in a List,
/// empty for a document that is the object), and prefixes the field paths of its errors.
fn parse_item(file: &str, index: usize, path: &str, item: Value) -> Checked {
    let policy_selector = rejected_policy_selector(&item);
    let located = |object: Option<ConfigKey>, error: FieldError| {
        let field = join_path(path, &error.field);
        let policy_selector =
            policy_selector.clone().filter(|_| object.as_ref().is_some_and(|k| k.kind == Kind::AuthorizationPolicy));
        ConfigError {
            file: file.to_string(),
            document: index,
            object,
            error: FieldError { field, reason: error.reason },
            policy_selector,
        }
    };
    let invalid = |object, error| Checked { document: Document::Invalid(located(object, error)), warnings: Vec::new() };
    // What an ignored item is reported as is read from the item itself, before it is consumed.
    let text = |pointer: &str| item.pointer(pointer).and_then(Value::as_str).unwrap_or_default().to_string();
    let (api_version, kind, name) = (text("/apiVersion"), text("/kind"), text("/metadata/name"));
    match object_with_warnings(item) {
        Ok(Some((obj, mut warnings))) => {
            let findings = validation::check(&obj);
            match findings.errors.into_iter().next() {
                None => {
                    warnings.extend(findings.warnings);
                    let warnings = warnings.into_iter().map(|w| located(Some(obj.key.clone()), w)).collect();
                    Checked { document: Document::Valid(obj), warnings }
                }
                Some(error) => invalid(Some(obj.key), error),
            }
        }
        Ok(None) => {
            Checked { document: Document::Ignored { document: index, api_version, kind, name }, warnings: Vec::new() }
        }
        Err((object, error)) => invalid(object, error),
    }
}

/// The `spec.selector.matchLabels` of an AuthorizationPolicy document, read leniently (a rejected
/// policy keeps its scope denied, and this narrows the scope to what its author selected). `None`
/// when absent, not a map of strings, or not a valid selector (`app: "*"` would select only the
/// literal value, narrower than meant): then the scope is the whole namespace.
fn rejected_policy_selector(item: &Value) -> Option<api::Labels> {
    if item.get("kind").and_then(Value::as_str) != Some(Kind::AuthorizationPolicy.name()) {
        return None;
    }
    let labels = item.pointer("/spec/selector/matchLabels")?;
    let labels: api::Labels = serde_json::from_value(labels.clone()).ok()?;
    (!labels.is_empty() && validation::is_valid_selector(&labels)).then_some(labels)
}

/// `items[3]` + `spec.hosts[0]` = `items[3].spec.hosts[0]`; either part may be empty.
fn join_path(prefix: &str, field: &str) -> String {
    match (prefix.is_empty(), field.is_empty()) {
        (true, _) => field.to_string(),
        (false, true) => prefix.to_string(),
        (false, false) => format!("{prefix}.{field}"),
    }
}

type ParseFailure = (Option<ConfigKey>, FieldError);

/// Builds a typed object from a generic value; `Ok(None)` for kinds meshpilot does not serve.
pub fn object_from_value(value: Value) -> Result<Option<ConfigObject>, ParseFailure> {
    object_with_warnings(value).map(|object| object.map(|(object, _)| object))
}

/// As [`object_from_value`], with the fields of the spec that were dropped (see [`typed`]).
fn object_with_warnings(value: Value) -> Result<Option<(ConfigObject, Vec<FieldError>)>, ParseFailure> {
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
    let (kind_group, versions) = kind.group();
    if group != kind_group {
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
    if !versions.contains(&version) {
        return fail(
            "apiVersion",
            format!("unsupported version {api_version:?} for {kind_name} ({})", versions.join(", ")),
        );
    }
    // As Istio's webhook and istioctl do: only the spec's own fields may be unknown.
    if let Some(field) = map.keys().find(|k| !TOP_LEVEL_FIELDS.contains(&k.as_str())) {
        return fail(field, format!("unknown field {field:?} (an object has {})", TOP_LEVEL_FIELDS.join(", ")));
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
    let security = kind_group == SECURITY_GROUP;
    let spec = match kind {
        Kind::VirtualService => typed(spec_value, Spec::VirtualService),
        Kind::DestinationRule => typed(spec_value, Spec::DestinationRule),
        Kind::Gateway => typed(spec_value, Spec::Gateway),
        Kind::ServiceEntry => typed(spec_value, Spec::ServiceEntry),
        Kind::WorkloadEntry => typed(spec_value, Spec::WorkloadEntry),
        Kind::Sidecar => typed(spec_value, Spec::Sidecar),
        Kind::AuthorizationPolicy => typed(spec_value, Spec::AuthorizationPolicy),
        Kind::RequestAuthentication => typed(spec_value, Spec::RequestAuthentication),
        Kind::PeerAuthentication => typed(spec_value, Spec::PeerAuthentication),
    };
    let (spec, unknown) = match spec {
        Ok(spec) => spec,
        Err(e) => return Err((Some(key), e)),
    };
    let unknown = unknown.into_iter().map(|field| {
        let reason = unknown_field_reason(&field);
        FieldError::new(field, reason)
    });
    let warnings = if security {
        // A protection meshpilot cannot read whole is refused, never half-enforced (fail closed).
        if let Some(mut error) = unknown.into_iter().next() {
            error.reason.push_str(": a security policy with a field meshpilot does not know is refused");
            return Err((Some(key), error));
        }
        Vec::new()
    } else {
        unknown
            .map(|mut w| {
                w.reason.push_str(", ignored as Istio ignores it");
                w
            })
            .collect()
    };
    Ok(Some((ConfigObject { key, meta: Meta { labels, annotations, api_version }, spec }, warnings)))
}

/// Deserializes a spec, keeping the path of the field that failed; fields the type does not have
/// are dropped (as Istio's decoding drops them) and their paths returned.
fn typed<T: DeserializeOwned, S>(value: Value, spec: fn(T) -> S) -> Result<(S, Vec<String>), FieldError> {
    decode(value, "spec").map(|d| (spec(d.value), d.unknown))
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
    fn unknown_networking_field_is_a_warning_with_its_path() {
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
        let checked = parse_file_checked("f.yaml", text);
        let Document::Valid(obj) = &checked[0].document else { panic!("expected valid: {checked:?}") };
        let Spec::VirtualService(vs) = &obj.spec else { panic!("a VirtualService") };
        assert_eq!(vs.http[0].route[0].destination.as_ref().map(|d| d.host.as_str()), Some("a"));
        let [warning] = &checked[0].warnings[..] else { panic!("one warning: {checked:?}") };
        assert_eq!(warning.error.field, "spec.http[0].route[0].wieght");
        assert_eq!(warning.error.reason, "unknown field `wieght`, ignored as Istio ignores it");
        assert_eq!(warning.document, 1);
        assert_eq!(warning.object.as_ref().map(|k| k.to_string()).as_deref(), Some("VirtualService ns/r"));
        // The logging form serves the same object.
        assert!(matches!(&parse_file("f.yaml", text)[0], Document::Valid(o) if o == obj));
    }

    #[test]
    fn unknown_top_level_field_is_an_error() {
        let text = "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: g}\nspec: {}\nspecs: {}\n";
        let checked = parse_file_checked("f.yaml", text);
        let Document::Invalid(err) = &checked[0].document else { panic!("expected invalid: {checked:?}") };
        assert_eq!(err.error.field, "specs");
        assert!(err.error.reason.starts_with("unknown field \"specs\""), "{}", err.error.reason);
    }

    #[test]
    fn unknown_security_field_rejects_the_policy() {
        let text = "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: p, namespace: ns}\nspec:\n  mtls: {mode: STRICT, strictness: high}\n";
        let checked = parse_file_checked("f.yaml", text);
        let Document::Invalid(err) = &checked[0].document else { panic!("expected invalid: {checked:?}") };
        assert_eq!(err.error.field, "spec.mtls.strictness");
        assert!(err.error.reason.starts_with("unknown field `strictness`: a security policy"), "{}", err.error.reason);
    }

    #[test]
    fn other_kinds_are_ignored_not_errors() {
        let docs = parse_file("f.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n");
        assert!(matches!(&docs[0], Document::Ignored { kind, .. } if kind == "ConfigMap"));
    }

    /// A `kind: List` of `n` items: VirtualServices with a regex route (validation cost included),
    /// every fifth a ConfigMap (an ignored kind, the path that re-parsed the whole document per
    /// item), and item 3 with an invalid host.
    fn list_document(n: usize) -> String {
        let mut text = String::from("apiVersion: v1\nkind: List\nmetadata: {name: big}\nitems:\n");
        for i in 0..n {
            if i % 5 == 4 {
                text.push_str(&format!("- {{apiVersion: v1, kind: ConfigMap, metadata: {{name: cm-{i}}}}}\n"));
            } else {
                let host = if i == 3 { "bad host".to_string() } else { format!("svc-{i}.ns.svc.cluster.local") };
                text.push_str(&format!(
                    "- apiVersion: networking.istio.io/v1\n  kind: VirtualService\n  metadata: {{name: vs-{i}, namespace: ns-{}}}\n  spec:\n    hosts: [\"{host}\"]\n    http:\n    - match: [{{uri: {{regex: \"/v[0-9]+/{i}/.*\"}}}}]\n      route:\n      - destination: {{host: \"svc-{i}\"}}\n",
                    i % 7
                ));
            }
        }
        text
    }

    /// The fastest of three parses of `text` (the machine is shared: the minimum is the least noisy).
    fn parse_time(text: &str) -> std::time::Duration {
        (0..3)
            .map(|_| {
                let start = std::time::Instant::now();
                std::hint::black_box(parse_file("list.yaml", text));
                start.elapsed()
            })
            .min()
            .unwrap_or_default()
    }

    #[test]
    fn list_items_are_reported_as_themselves_with_their_path() {
        let docs = parse_file("list.yaml", &list_document(10));
        assert_eq!(docs.len(), 10);
        let Document::Invalid(err) = &docs[3] else { panic!("item 3 should be invalid: {:?}", docs[3]) };
        assert_eq!(err.object.as_ref().map(ToString::to_string).as_deref(), Some("VirtualService ns-3/vs-3"));
        assert_eq!(err.error.field, "items[3].spec.hosts[0]");
        assert_eq!(err.document, 1);
        assert!(matches!(&docs[4], Document::Ignored { kind, name, .. } if kind == "ConfigMap" && name == "cm-4"));
        assert!(matches!(&docs[5], Document::Valid(o) if o.key.name == "vs-5" && o.key.namespace == "ns-5"));
    }

    #[test]
    fn list_item_parse_errors_carry_the_item_path() {
        let text = "kind: List\napiVersion: v1\nitems:\n- {kind: VirtualService, metadata: {name: a}}\n- {apiVersion: networking.istio.io/v1, kind: Gateway, metadata: {name: g}, spec: {servers: [{port: {number: x}}]}}\n";
        let docs = parse_file("l.yaml", text);
        let fields: Vec<&str> = docs
            .iter()
            .map(|d| match d {
                Document::Invalid(e) => e.error.field.as_str(),
                other => panic!("expected invalid items: {other:?}"),
            })
            .collect();
        assert_eq!(fields, ["items[0].apiVersion", "items[1].spec.servers[0].port.number"]);
        let docs = parse_file("l.yaml", "kind: List\napiVersion: v1\nitems: {a: 1}\n");
        assert!(matches!(&docs[..], [Document::Invalid(e)] if e.error.field == "items"), "{docs:?}");
        // A bare JSON array: items are `[i]`.
        let docs = parse_file("a.json", r#"[{"apiVersion":"v1","kind":"ConfigMap"},{"kind":"Gateway"}]"#);
        assert!(matches!(&docs[0], Document::Ignored { kind, .. } if kind == "ConfigMap"), "{docs:?}");
        assert!(matches!(&docs[1], Document::Invalid(e) if e.error.field == "[1].apiVersion"), "{docs:?}");
    }

    #[test]
    fn a_list_of_3000_items_parses_in_linear_time() {
        let big = list_document(3000);
        let start = std::time::Instant::now();
        let docs = parse_file("list.yaml", &big);
        let elapsed = start.elapsed();
        assert_eq!(docs.len(), 3000);
        // Generous: ~0.1 s in a debug build; the quadratic parser took over a minute.
        assert!(elapsed < std::time::Duration::from_secs(20), "3,000 items took {elapsed:?}");
        // Four times the items must cost about four times the time: linear is 4x, quadratic 16x;
        // 8x separates them with room for a noisy, shared machine.
        let (small, large) = (parse_time(&list_document(1000)), parse_time(&list_document(4000)));
        assert!(large < small * 8, "1,000 items: {small:?}, 4,000 items: {large:?} (not linear)");
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
