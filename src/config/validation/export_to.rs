//! `exportTo` rules: `.` (own namespace), `*` (all), `~` (none, ServiceEntry only) or namespace names.

use std::collections::BTreeSet;

use super::field_errors::{duplicate, invalid, Errors};
use super::hosts::is_dns_label;

/// What kind of object the `exportTo` belongs to; the kinds differ in what they allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Exporter {
    /// VirtualService, or DestinationRule without a workload selector.
    Plain,
    /// ServiceEntry: may be exported to no one (`~`).
    ServiceEntry,
    /// DestinationRule with a workload selector: only its own namespace.
    SelectorDestinationRule,
}

/// Checks `exportTo` of an object in `namespace`, reporting at `path`.
pub(super) fn check_export_to(
    errors: &mut Errors,
    path: &str,
    namespace: &str,
    export_to: &[String],
    exporter: Exporter,
) {
    let mut seen = BTreeSet::new();
    for (i, entry) in export_to.iter().enumerate() {
        let field = format!("{path}[{i}]");
        // `.` and the object's own namespace name the same thing.
        let key = if entry == "." { namespace } else { entry.as_str() };
        if seen.contains(key) {
            let detail = if key == entry {
                format!("duplicate entries in exportTo for entry {entry}")
            } else {
                format!("duplicate entries in exportTo: . and current namespace {namespace}")
            };
            errors.add(field, duplicate(entry, detail));
            continue;
        }
        match check_entry(entry, exporter) {
            Ok(()) => {
                seen.insert(key);
            }
            Err(reason) => errors.add(field, reason),
        }
    }
    if seen.contains("*") && export_to.len() > 1 {
        errors
            .add(path, invalid(export_to, "cannot have both public (*) and non-public exportTo values for a resource"));
    }
    if seen.contains("~") && export_to.len() > 1 {
        errors.add(path, invalid(export_to, "cannot export service entry to no one (~) and someone"));
    }
    if exporter == Exporter::SelectorDestinationRule && !seen.is_empty() {
        if !seen.contains(namespace) {
            errors.add(
                path,
                invalid(
                    export_to,
                    "destination rule with workload selector cannot have exportTo beyond current namespace",
                ),
            );
        } else if seen.len() > 1 {
            errors.add(
                path,
                invalid(export_to, "destination rule with workload selector cannot have multiple entries in exportTo"),
            );
        }
    }
}

/// Checks one `exportTo` entry.
fn check_entry(entry: &str, exporter: Exporter) -> Result<(), String> {
    match entry {
        "." | "*" => Ok(()),
        "~" if exporter == Exporter::ServiceEntry => Ok(()),
        "~" => Err(invalid(entry, "exportTo ~ (none) is not allowed for Istio configuration objects")),
        _ if is_dns_label(entry) => Ok(()),
        _ => Err(invalid(entry, "only ., *, or a valid DNS 1123 label is allowed as exportTo entry")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(export_to: &[&str], exporter: Exporter) -> Vec<String> {
        let mut errors = Errors::default();
        let list: Vec<String> = export_to.iter().map(|s| s.to_string()).collect();
        check_export_to(&mut errors, "spec.exportTo", "ns", &list, exporter);
        errors.found.iter().map(|e| format!("{}: {}", e.field, e.reason)).collect()
    }

    #[test]
    fn valid_lists_pass() {
        assert!(fields(&[".", "other"], Exporter::Plain).is_empty());
        assert!(fields(&["*"], Exporter::Plain).is_empty());
        assert!(fields(&["~"], Exporter::ServiceEntry).is_empty());
        assert!(fields(&["."], Exporter::SelectorDestinationRule).is_empty());
    }

    #[test]
    fn duplicates_include_dot_and_own_namespace() {
        let e = fields(&["a", "a"], Exporter::Plain);
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with("spec.exportTo[1]: Duplicate value"), "{e:?}");
        let e = fields(&["ns", "."], Exporter::Plain);
        assert!(e[0].contains(". and current namespace ns"), "{e:?}");
        let e = fields(&[".", "ns"], Exporter::Plain);
        assert!(e[0].contains("duplicate entries in exportTo for entry ns"), "{e:?}");
    }

    #[test]
    fn entries_must_be_namespaces_or_reserved_values() {
        let e = fields(&["Not_A_Namespace"], Exporter::Plain);
        assert!(e[0].starts_with("spec.exportTo[0]: Invalid value"), "{e:?}");
        let e = fields(&["~"], Exporter::Plain);
        assert!(e[0].contains("not allowed for Istio configuration objects"), "{e:?}");
    }

    #[test]
    fn public_and_none_cannot_be_combined() {
        let e = fields(&["*", "a"], Exporter::Plain);
        assert!(e[0].starts_with("spec.exportTo: Invalid value") && e[0].contains("public (*)"), "{e:?}");
        let e = fields(&["~", "a"], Exporter::ServiceEntry);
        assert!(e[0].contains("no one (~) and someone"), "{e:?}");
    }

    #[test]
    fn selector_destination_rules_stay_in_their_namespace() {
        let e = fields(&["other"], Exporter::SelectorDestinationRule);
        assert!(e[0].contains("beyond current namespace"), "{e:?}");
        let e = fields(&[".", "other"], Exporter::SelectorDestinationRule);
        assert!(e[0].contains("multiple entries"), "{e:?}");
    }
}
