//! Istio's validation rules for the served kinds; one validator for the watcher and `meshpilot validate`.
//!
//! The rules follow istio/istio's `pkg/config/validation` and the CRD schemas of istio/api. Field paths
//! use Istio's JSON names (`spec.http[0].route[1].weight`); reasons use the Kubernetes API server's
//! words ("Required value", "Invalid value", "Duplicate value", "Unsupported value") followed by Istio's
//! message, so errors read the same as `kubectl apply` would print them.

mod addresses;
mod authorization_policy;
mod destination;
mod destination_rule;
mod durations;
mod export_to;
mod field_errors;
mod gateway;
mod gateway_binding;
mod headers;
mod hosts;
mod http_route;
mod labels;
mod peer_authentication;
mod policy_target;
mod ports;
mod re2;
mod request_authentication;
mod service_entry;
mod sidecar;
mod string_match;
mod traffic_policy;
mod virtual_service;
mod workload_entry;

pub use durations::{check_duration, check_duration_above};
pub use re2::{re2_program_size, Re2Error, ENVOY_MAX_PROGRAM_SIZE};
pub use request_authentication::{parse_jwks_uri, JwksUri};

use super::error::FieldError;
use super::object::{ConfigObject, Spec};
use field_errors::Errors;

/// Checks a mesh-wide `localityLbSetting` as a DestinationRule's is checked: the first offending
/// field (under `path`) and why.
pub fn check_locality_lb_setting(
    path: &str,
    setting: &crate::config::api::destination_rule::LocalityLbSetting,
) -> Result<(), (String, String)> {
    let mut errors = Errors::default();
    traffic_policy::check_locality_lb(&mut errors, path, setting);
    errors.found.into_iter().next().map_or(Ok(()), |e| Err((e.field, e.reason)))
}

/// Validates a parsed object; an empty result means it may be served.
pub fn validate(obj: &ConfigObject) -> Vec<FieldError> {
    check(obj).errors
}

/// What validation found in one object.
#[derive(Debug, Default)]
pub struct Findings {
    /// Why the object may not be served; empty when it may.
    pub errors: Vec<FieldError>,
    /// Parts of a servable object that are not served (unknown fields of loosely typed parts).
    pub warnings: Vec<FieldError>,
}

/// Validates a parsed object, with warnings.
pub fn check(obj: &ConfigObject) -> Findings {
    let mut errors = Errors::default();
    let namespace = obj.key.namespace.as_str();
    match &obj.spec {
        Spec::VirtualService(vs) => virtual_service::validate(vs, namespace, &mut errors),
        Spec::DestinationRule(dr) => destination_rule::validate(dr, namespace, &mut errors),
        Spec::Gateway(gw) => gateway::validate(gw, &obj.key.name, &mut errors),
        Spec::ServiceEntry(se) => service_entry::validate(se, namespace, &mut errors),
        Spec::WorkloadEntry(we) => workload_entry::validate(we, &mut errors),
        Spec::Sidecar(sc) => sidecar::validate(sc, &mut errors),
        Spec::AuthorizationPolicy(ap) => authorization_policy::validate(ap, &mut errors),
        Spec::RequestAuthentication(ra) => request_authentication::validate(ra, &mut errors),
        Spec::PeerAuthentication(pa) => peer_authentication::validate(pa, &mut errors),
    }
    Findings { errors: errors.found, warnings: errors.warnings }
}

/// Whether `labels` is a valid workload selector (no empty keys, no wildcards, label syntax).
pub fn is_valid_selector(labels: &crate::config::api::Labels) -> bool {
    let mut errors = Errors::default();
    labels::check_selector(&mut errors, "", labels);
    errors.found.is_empty()
}

/// Checks an RFC 1123 DNS subdomain (object names).
pub fn check_dns1123_subdomain(value: &str) -> Result<(), String> {
    if value.is_empty() || value.len() > 253 {
        return Err(format!("{value:?} must be 1-253 characters"));
    }
    for label in value.split('.') {
        check_dns1123_label(label)?;
    }
    Ok(())
}

/// Checks an RFC 1123 DNS label (namespaces, label parts of names).
pub fn check_dns1123_label(value: &str) -> Result<(), String> {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{value:?} is not a valid DNS-1123 label (lower case alphanumerics and '-', at most 63 characters)"
        ))
    }
}

#[cfg(test)]
mod testing {
    //! Helpers that run YAML snippets through the real parser and validator.

    use crate::config::error::FieldError;
    use crate::config::parse::{parse_file, Document};

    /// A full document of `kind` (in its API group, version v1) named `name` in namespace `ns`,
    /// with `spec` (YAML, unindented).
    pub fn document(kind: &str, name: &str, spec: &str) -> String {
        let group = crate::config::Kind::from_name(kind).map_or("networking.istio.io", |k| k.group().0);
        let spec: String = spec.lines().map(|l| format!("  {l}\n")).collect();
        format!("apiVersion: {group}/v1\nkind: {kind}\nmetadata:\n  name: {name}\n  namespace: ns\nspec:\n{spec}")
    }

    /// The first error reported for a `kind` with `spec`, or `None` when it is valid.
    pub fn first_error(kind: &str, spec: &str) -> Option<FieldError> {
        first_error_of(&document(kind, "obj", spec))
    }

    /// The first error reported for a whole document, or `None` when it is valid.
    pub fn first_error_of(text: &str) -> Option<FieldError> {
        let docs = parse_file("test.yaml", text);
        match docs.into_iter().next() {
            Some(Document::Valid(_)) => None,
            Some(Document::Invalid(e)) => Some(e.error),
            other => panic!("unexpected parse result: {other:?}"),
        }
    }

    /// Every error reported for a `kind` with `spec` (for rules that only fire after another one).
    pub fn all_errors(kind: &str, spec: &str) -> Vec<FieldError> {
        let value = serde_saphyr::from_str(&document(kind, "obj", spec)).expect("test YAML parses");
        match crate::config::parse::object_from_value(value) {
            Ok(Some(obj)) => crate::config::validation::validate(&obj),
            other => panic!("test document did not parse to an object: {other:?}"),
        }
    }

    /// Asserts that `spec` is accepted.
    #[track_caller]
    pub fn assert_valid(kind: &str, spec: &str) {
        if let Some(e) = first_error(kind, spec) {
            panic!("expected valid {kind}, got {e}\n{spec}");
        }
    }

    /// Asserts that `spec` is accepted with a warning at `field` whose reason contains `reason`.
    #[track_caller]
    pub fn assert_warning(kind: &str, spec: &str, field: &str, reason: &str) {
        let checked = crate::config::parse::parse_file_checked("test.yaml", &document(kind, "obj", spec));
        let Some(first) = checked.into_iter().next() else { panic!("no document\n{spec}") };
        assert!(matches!(first.document, Document::Valid(_)), "expected valid {kind}: {:?}\n{spec}", first.document);
        let found = first.warnings.iter().any(|w| w.error.field == field && w.error.reason.contains(reason));
        assert!(found, "no warning {field}: {reason} in {:?}\n{spec}", first.warnings);
    }

    /// Asserts that the first error is at `field` and its reason contains `reason`.
    #[track_caller]
    pub fn assert_error(kind: &str, spec: &str, field: &str, reason: &str) {
        match first_error(kind, spec) {
            None => panic!("expected {field}: {reason}, but {kind} was accepted\n{spec}"),
            Some(e) => {
                assert_eq!(e.field, field, "wrong field for {e}\n{spec}");
                assert!(e.reason.contains(reason), "reason {:?} lacks {reason:?}\n{spec}", e.reason);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names_follow_rfc_1123() {
        assert!(check_dns1123_label("a-1").is_ok());
        assert!(check_dns1123_label("A").is_err());
        assert!(check_dns1123_label("-a").is_err());
        assert!(check_dns1123_subdomain("a.b-c").is_ok());
        assert!(check_dns1123_subdomain("a..b").is_err());
    }
}
