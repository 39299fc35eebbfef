//! DestinationRule rules: the host, subsets, selector and exportTo (traffic policies are in `traffic_policy`).

use std::collections::BTreeSet;

use crate::config::api::DestinationRule;

use super::destination::check_subset_name;
use super::export_to::{check_export_to, Exporter};
use super::field_errors::{duplicate, invalid, required, Errors};
use super::hosts::check_wildcard_host;
use super::labels::{check_labels, check_selector};
use super::traffic_policy::check_traffic_policy;

/// Checks a DestinationRule in `namespace`.
pub(super) fn validate(dr: &DestinationRule, namespace: &str, errors: &mut Errors) {
    if dr.host.is_empty() {
        errors.add("spec.host", required("host is required"));
    } else if let Err(e) = check_wildcard_host(&dr.host) {
        errors.add("spec.host", invalid(&dr.host, e));
    }
    if let Some(policy) = &dr.traffic_policy {
        check_traffic_policy(errors, "spec.trafficPolicy", policy);
    }
    check_subsets(errors, dr);
    let exporter = if dr.workload_selector.is_some() { Exporter::SelectorDestinationRule } else { Exporter::Plain };
    check_export_to(errors, "spec.exportTo", namespace, &dr.export_to, exporter);
    if let Some(selector) = &dr.workload_selector {
        check_selector(errors, "spec.workloadSelector.matchLabels", &selector.match_labels);
    }
}

/// Checks subsets: named uniquely with DNS labels, valid labels and policies.
fn check_subsets(errors: &mut Errors, dr: &DestinationRule) {
    let mut names = BTreeSet::new();
    for (i, subset) in dr.subsets.iter().enumerate() {
        let path = format!("spec.subsets[{i}]");
        if subset.name.is_empty() {
            errors.add(format!("{path}.name"), required("subset name is required"));
        } else if !names.insert(subset.name.as_str()) {
            errors.add(format!("{path}.name"), duplicate(&subset.name, "duplicate subset names"));
        } else {
            errors.check(format!("{path}.name"), check_subset_name(&subset.name));
        }
        check_labels(errors, &format!("{path}.labels"), &subset.labels);
        if let Some(policy) = &subset.traffic_policy {
            check_traffic_policy(errors, &format!("{path}.trafficPolicy"), policy);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::validation::testing::{assert_error, assert_valid};

    const DR: &str = "DestinationRule";

    #[test]
    fn a_rule_with_subsets_is_valid() {
        assert_valid(
            DR,
            "host: reviews.prod.svc.cluster.local\nsubsets:\n- {name: v1, labels: {version: v1}}\n\
             - {name: v2, labels: {version: v2}, trafficPolicy: {loadBalancer: {simple: RANDOM}}}\nexportTo: [\".\", other]",
        );
        assert_valid(DR, "host: \"*.example.com\"");
    }

    #[test]
    fn host_is_required_and_valid() {
        assert_error(DR, "subsets: [{name: v1}]", "spec.host", "Required value");
        assert_error(DR, "host: \"a..b\"", "spec.host", "Invalid value");
        assert_error(DR, "host: \"foo*\"", "spec.host", "Invalid value");
    }

    #[test]
    fn subsets_are_named_uniquely() {
        assert_error(DR, "host: a\nsubsets: [{labels: {v: \"1\"}}]", "spec.subsets[0].name", "Required value");
        assert_error(DR, "host: a\nsubsets: [{name: v1}, {name: v1}]", "spec.subsets[1].name", "Duplicate value");
        assert_error(DR, "host: a\nsubsets: [{name: v_1}]", "spec.subsets[0].name", "subset name is invalid");
    }

    #[test]
    fn subset_labels_and_policies_are_checked() {
        assert_error(
            DR,
            "host: a\nsubsets: [{name: v1, labels: {version: \"a b\"}}]",
            "spec.subsets[0].labels[version]",
            "label value",
        );
        assert_error(
            DR,
            "host: a\nsubsets: [{name: v1, trafficPolicy: {}}]",
            "spec.subsets[0].trafficPolicy",
            "at least one field",
        );
    }

    #[test]
    fn selector_rules_stay_in_their_namespace() {
        let spec = "host: a\nworkloadSelector: {matchLabels: {app: x}}\nexportTo: [other]";
        assert_error(DR, spec, "spec.exportTo", "beyond current namespace");
        assert_valid(DR, "host: a\nworkloadSelector: {matchLabels: {app: x}}\nexportTo: [\".\"]");
    }

    #[test]
    fn selectors_reject_wildcards() {
        let spec = "host: a\nworkloadSelector: {matchLabels: {app: \"*\"}}";
        assert_error(DR, spec, "spec.workloadSelector.matchLabels[app]", "wildcard is not supported in selector");
    }

    #[test]
    fn export_to_is_checked() {
        assert_error(DR, "host: a\nexportTo: [a, a]", "spec.exportTo[1]", "Duplicate value");
    }
}
