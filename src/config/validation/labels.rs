//! Label rules: Kubernetes label keys and values, and workload selectors.

use crate::config::api::Labels;

use super::field_errors::{invalid, Errors};
use super::hosts::is_dns_label;

/// Longest name part of a key, and longest value.
const MAX_NAME_LEN: usize = 63;

/// Longest DNS prefix of a key.
const MAX_PREFIX_LEN: usize = 253;

/// Checks a Kubernetes label key: an optional DNS subdomain and `/`, then a qualified name.
pub(super) fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.len() > MAX_PREFIX_LEN || !prefix.split('.').all(is_dns_label) {
            return Err(invalid(key, "label key prefix must be a DNS subdomain of at most 253 characters"));
        }
    }
    if name.len() > MAX_NAME_LEN || !is_qualified_name(name) {
        return Err(invalid(
            key,
            "label key name must be at most 63 alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric",
        ));
    }
    Ok(())
}

/// Checks a Kubernetes label value: empty, or a qualified name of at most 63 characters.
pub(super) fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || (value.len() <= MAX_NAME_LEN && is_qualified_name(value)) {
        Ok(())
    } else {
        Err(invalid(
            value,
            "label value must be at most 63 alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric",
        ))
    }
}

/// Whether `name` starts and ends with an alphanumeric and holds only alphanumerics, '-', '_' and '.'.
fn is_qualified_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// Checks every label of `labels`, reporting at `path[key]`.
pub(super) fn check_labels(errors: &mut Errors, path: &str, labels: &Labels) {
    for (key, value) in labels {
        let field = format!("{path}[{key}]");
        errors.check(field.clone(), check_label_key(key));
        errors.check(field, check_label_value(value));
    }
}

/// Checks the labels of a workload selector: no empty keys, no wildcards, valid label syntax.
pub(super) fn check_selector(errors: &mut Errors, path: &str, labels: &Labels) {
    for (key, value) in labels {
        let field = format!("{path}[{key}]");
        if key.is_empty() {
            errors.add(field, invalid(format!("{key}={value}"), "empty key is not supported in selector"));
        } else if key.contains('*') || value.contains('*') {
            errors.add(field, invalid(format!("{key}={value}"), "wildcard is not supported in selector"));
        } else {
            errors.check(field.clone(), check_label_key(key));
            errors.check(field, check_label_value(value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn keys_may_carry_a_dns_prefix() {
        assert!(check_label_key("app").is_ok());
        assert!(check_label_key("app.kubernetes.io/name").is_ok());
        assert!(check_label_key("My_Key.1").is_ok());
        assert!(check_label_key("a/b/c").unwrap_err().contains("label key name"));
        assert!(check_label_key("-a").unwrap_err().contains("label key name"));
        assert!(check_label_key(&"a".repeat(64)).is_err());
        assert!(check_label_key("bad_prefix/a").unwrap_err().contains("prefix"));
        assert!(check_label_key("/a").unwrap_err().contains("prefix"));
    }

    #[test]
    fn values_may_be_empty_but_not_malformed() {
        assert!(check_label_value("").is_ok());
        assert!(check_label_value("v1.2_3").is_ok());
        assert!(check_label_value("a b").unwrap_err().contains("label value"));
        assert!(check_label_value(&"a".repeat(64)).is_err());
    }

    #[test]
    fn label_errors_name_the_key() {
        let mut errors = Errors::default();
        check_labels(&mut errors, "spec.labels", &labels(&[("ok", "v"), ("bad key", "v")]));
        assert_eq!(errors.found.len(), 1);
        assert_eq!(errors.found[0].field, "spec.labels[bad key]");
    }

    #[test]
    fn selectors_reject_wildcards_and_empty_keys() {
        let mut errors = Errors::default();
        check_selector(&mut errors, "s", &labels(&[("*", "v"), ("a", "*"), ("", "v"), ("b", "ok")]));
        let reasons: Vec<&str> = errors.found.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(reasons.len(), 3, "{reasons:?}");
        assert!(reasons[0].contains("empty key is not supported in selector"));
        assert!(reasons[1].contains("wildcard is not supported in selector"));
        assert!(reasons[2].contains("wildcard is not supported in selector"));
    }
}
