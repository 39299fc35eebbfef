//! The AdmissionReview (admission.k8s.io/v1) the API server posts, and the verdict on the Istio
//! object it carries: decoded and validated by the same parser the file and Kubernetes sources
//! use, with istiod's messages.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{debug, info};

use crate::config::error::FieldError;
use crate::config::object::{Kind, NETWORKING_GROUP};
use crate::config::parse::{object_from_value, parse_object_checked, Document};
use crate::telemetry::log_text::Untrusted;

/// The `apiVersion` of the reviews this webhook answers.
pub const ADMISSION_API_VERSION: &str = "admission.k8s.io/v1";
/// Their `kind`.
pub const ADMISSION_KIND: &str = "AdmissionReview";
/// The `source` that validation errors name (as a file name would for the file source).
const SOURCE: &str = "admission";
/// The top-level fields a Kubernetes object of an Istio kind may have (istiod rejects others).
const TOP_LEVEL_FIELDS: [&str; 5] = ["apiVersion", "kind", "metadata", "spec", "status"];

/// Istio kinds meshpilot does not serve: admitted unvalidated, with a warning, so that installing
/// meshpilot does not block them (istiod would validate them; meshpilot ignores them).
const UNSERVED_ISTIO_KINDS: [(&str, &str); 5] = [
    (NETWORKING_GROUP, "EnvoyFilter"),
    (NETWORKING_GROUP, "WorkloadGroup"),
    (NETWORKING_GROUP, "ProxyConfig"),
    ("telemetry.istio.io", "Telemetry"),
    ("extensions.istio.io", "WasmPlugin"),
];

/// An AdmissionReview as the API server sends it (only the fields the webhook reads).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    /// `admission.k8s.io/v1`.
    #[serde(default)]
    pub api_version: String,
    /// `AdmissionReview`.
    #[serde(default)]
    pub kind: String,
    /// The request; a review without one is refused.
    #[serde(default)]
    pub request: Option<AdmissionRequest>,
}

/// One admission request.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// Echoed in the response, as the API server requires.
    #[serde(default)]
    pub uid: String,
    /// The kind of the object, as the API server resolved it.
    #[serde(default)]
    pub kind: GroupVersionKind,
    /// The resource (`virtualservices`), for the metrics' labels.
    #[serde(default)]
    pub resource: GroupVersionResource,
    /// The request's namespace: the object's when its metadata names none.
    #[serde(default)]
    pub namespace: String,
    /// The object's name.
    #[serde(default)]
    pub name: String,
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    #[serde(default)]
    pub operation: String,
    /// The object as it would be stored (absent for `DELETE`).
    #[serde(default)]
    pub object: Option<Value>,
    /// Whether the request is a dry run (validated all the same).
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// A kind with its group and version.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GroupVersionKind {
    /// API group (empty for the core group).
    #[serde(default)]
    pub group: String,
    /// Version.
    #[serde(default)]
    pub version: String,
    /// Kind.
    #[serde(default)]
    pub kind: String,
}

/// A resource with its group and version.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GroupVersionResource {
    /// API group.
    #[serde(default)]
    pub group: String,
    /// Version.
    #[serde(default)]
    pub version: String,
    /// Resource (plural, lower case).
    #[serde(default)]
    pub resource: String,
}

/// The review the webhook answers with.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReviewResponse {
    /// `admission.k8s.io/v1`.
    pub api_version: String,
    /// `AdmissionReview`.
    pub kind: String,
    /// The answer.
    pub response: AdmissionResponse,
}

/// Allowed or denied, with why.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    /// The request's uid.
    pub uid: String,
    /// Whether the object may be stored.
    pub allowed: bool,
    /// Why it may not (a `metav1.Status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// Warnings the API server passes on to the client (kubectl prints them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// The part of a `metav1.Status` a denial needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    /// What the user sees after "denied the request: ".
    pub message: String,
    /// HTTP-style code (400: the object is at fault).
    pub code: u16,
}

/// Why an object was denied (istiod's `reason` label of `galley_validation_failed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The object is not a Kubernetes object.
    DecodeError,
    /// Neither meshpilot nor Istio knows the kind.
    UnknownType,
    /// The spec does not have the kind's schema.
    ConversionError,
    /// The object is not valid.
    InvalidResource,
}

impl Reason {
    /// The metric label value (istiod's).
    pub fn label(self) -> &'static str {
        match self {
            Reason::DecodeError => "yaml_decode_error",
            Reason::UnknownType => "unknown_type",
            Reason::ConversionError => "crd_conversion_error",
            Reason::InvalidResource => "invalid_resource",
        }
    }
}

/// What the webhook decided about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the object may be stored.
    pub allowed: bool,
    /// Why not (istiod's message), when denied.
    pub message: Option<String>,
    /// Why not, for the metrics.
    pub reason: Option<Reason>,
    /// Warnings for the client, allowed or not.
    pub warnings: Vec<String>,
}

impl Verdict {
    fn allow(warnings: Vec<String>) -> Verdict {
        Verdict { allowed: true, message: None, reason: None, warnings }
    }

    fn deny(reason: Reason, message: String) -> Verdict {
        Verdict { allowed: false, message: Some(message), reason: Some(reason), warnings: Vec::new() }
    }
}

/// Decides on `request`: only CREATE and UPDATE are validated; anything else is allowed.
pub fn review(request: &AdmissionRequest) -> Verdict {
    let dry_run = request.dry_run.unwrap_or(false);
    if !matches!(request.operation.as_str(), "CREATE" | "UPDATE") {
        debug!(operation = %Untrusted(&request.operation), dry_run, "operation not validated; allowed");
        return Verdict::allow(Vec::new());
    }
    let Some(object) = request.object.clone() else {
        return Verdict::deny(Reason::DecodeError, "cannot decode configuration: the request has no object".into());
    };
    let verdict = review_object(object, &request.namespace, &request.kind.kind);
    // The message is the user's (the API server shows it); the log names the object and why,
    // never its contents (a reason may quote a value).
    match verdict.reason {
        Some(reason) => info!(
            kind = %Untrusted(&request.kind.kind), namespace = %Untrusted(&request.namespace), name = %Untrusted(&request.name),
            operation = %Untrusted(&request.operation), dry_run, reason = reason.label(), "configuration denied"
        ),
        None => debug!(
            kind = %Untrusted(&request.kind.kind), namespace = %Untrusted(&request.namespace), name = %Untrusted(&request.name),
            operation = %Untrusted(&request.operation), dry_run, "configuration allowed"
        ),
    }
    verdict
}

/// The answer to `review`, echoing its request's uid (a review without a request is refused).
pub fn respond(review: &AdmissionReview) -> (AdmissionReviewResponse, Verdict) {
    let (uid, verdict) = match &review.request {
        Some(request) => (request.uid.clone(), self::review(request)),
        None => (String::new(), Verdict::deny(Reason::DecodeError, "could not decode object: no request".into())),
    };
    let response = AdmissionResponse {
        uid,
        allowed: verdict.allowed,
        status: verdict.message.clone().map(|message| Status { message, code: 400 }),
        warnings: verdict.warnings.clone(),
    };
    let review =
        AdmissionReviewResponse { api_version: ADMISSION_API_VERSION.into(), kind: ADMISSION_KIND.into(), response };
    (review, verdict)
}

/// Validates one object of a CREATE or UPDATE in `namespace` (the request's, used when the
/// object's metadata has none); `request_kind` names the kind in the unknown-field message.
pub fn review_object(mut object: Value, namespace: &str, request_kind: &str) -> Verdict {
    let Value::Object(map) = &mut object else {
        return Verdict::deny(
            Reason::DecodeError,
            "cannot decode configuration: the object is not a JSON object".into(),
        );
    };
    let (api_version, kind) = match (type_field(map, "apiVersion"), type_field(map, "kind")) {
        (Ok(a), Ok(k)) => (a, k),
        (Err(e), _) | (_, Err(e)) => {
            return Verdict::deny(Reason::DecodeError, format!("cannot decode configuration: {e}"))
        }
    };
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version.as_str()));
    // As istiod: the version is not looked at here (every version of a kind shares its schema).
    let served = Kind::from_name(&kind).is_some_and(|k| k.group().0 == group);
    if !served {
        if UNSERVED_ISTIO_KINDS.contains(&(group, kind.as_str())) {
            return Verdict::allow(vec![format!(
                "meshpilot does not serve {kind} ({group}): it was not validated and has no effect on meshpilot's proxies"
            )]);
        }
        return Verdict::deny(Reason::UnknownType, format!("unrecognized type {group}/{version}, Kind={kind}"));
    }
    let metadata = map.entry("metadata").or_insert_with(|| Value::Object(Default::default()));
    let Value::Object(metadata) = metadata else {
        return Verdict::deny(Reason::DecodeError, "cannot decode configuration: metadata is not an object".into());
    };
    let name = metadata.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
    if metadata.get("namespace").and_then(Value::as_str).is_none_or(str::is_empty) && !namespace.is_empty() {
        metadata.insert("namespace".into(), Value::String(namespace.to_string()));
    }
    // Istio judges the spec first and the other fields after, so they are taken out here (the
    // parser would refuse them before looking at the spec) and reported last.
    let unknown = map.keys().find(|k| !TOP_LEVEL_FIELDS.contains(&k.as_str())).cloned();
    map.retain(|k, _| TOP_LEVEL_FIELDS.contains(&k.as_str()));
    let object_namespace =
        map.get("metadata").and_then(|m| m.get("namespace")).and_then(Value::as_str).unwrap_or(namespace).to_string();

    // A conversion error (the spec does not have the schema) is told apart from a validation
    // error by converting alone, from this copy (an object is at most a few MiB, reviews are rare).
    let conversion = object.clone();
    // The validator the sources use; its warnings (fields Istio drops) go back to the client.
    let checked = parse_object_checked(SOURCE, object);
    let (document, warnings) = (checked.document, checked.warnings.iter().map(|w| w.error.to_string()).collect());
    let denied = |reason, message| Verdict { warnings: Vec::clone(&warnings), ..Verdict::deny(reason, message) };
    match document {
        Document::Valid(_) => {}
        Document::Invalid(e) if object_from_value(conversion).is_err() => {
            return denied(Reason::ConversionError, format!("error decoding configuration: {}", describe(&e.error)));
        }
        Document::Invalid(e) => {
            return denied(Reason::InvalidResource, format!("configuration is invalid: {}", describe(&e.error)));
        }
        // Not reached: the kind was checked above; refused rather than let through unchecked.
        Document::Ignored { .. } => {
            return denied(Reason::UnknownType, format!("unrecognized type {group}/{version}, Kind={kind}"));
        }
    }
    if let Some(field) = unknown {
        let kind = if request_kind.is_empty() { kind.as_str() } else { request_kind };
        return denied(
            Reason::InvalidResource,
            format!("unknown field {field:?} on {kind} resource {object_namespace}/{name}"),
        );
    }
    Verdict::allow(warnings)
}

/// `field: reason`, or the reason alone for the object as a whole.
fn describe(error: &FieldError) -> String {
    match error.field.is_empty() {
        true => error.reason.clone(),
        false => error.to_string(),
    }
}

/// `apiVersion` or `kind`: a string, possibly empty.
fn type_field(map: &serde_json::Map<String, Value>, field: &str) -> Result<String, String> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!("{field} must be a string, not {other}")),
    }
}

#[cfg(test)]
#[path = "review_tests.rs"]
mod tests;
