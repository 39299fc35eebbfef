//! What a security policy attaches to: a workload selector (served), or `targetRef(s)` (Gateway
//! API attachments, which meshpilot does not serve and rejects, so the policy fails closed).

use crate::config::api::authorization_policy::PolicyTargetReference;
use crate::config::api::common::WorkloadSelector;

use super::field_errors::{forbidden, Errors};
use super::labels::check_selector;

/// Most `targetRefs` (the CRD's `maxItems`).
const MAX_TARGET_REFS: usize = 16;

/// Checks `selector`, `targetRef` and `targetRefs` of a policy at `spec`.
pub(super) fn check_policy_target(
    errors: &mut Errors,
    selector: Option<&WorkloadSelector>,
    target_ref: Option<&PolicyTargetReference>,
    target_refs: &[PolicyTargetReference],
) {
    let set =
        usize::from(selector.is_some()) + usize::from(target_ref.is_some()) + usize::from(!target_refs.is_empty());
    if set > 1 {
        errors.add("spec", forbidden("only one of targetRefs or workloadSelector can be set"));
    }
    if let Some(selector) = selector {
        check_selector(errors, "spec.selector.matchLabels", &selector.match_labels);
    }
    if target_refs.len() > MAX_TARGET_REFS {
        errors.add("spec.targetRefs", super::field_errors::too_many(target_refs.len(), MAX_TARGET_REFS));
    }
    let refs = target_ref.into_iter().map(|r| ("spec.targetRef".to_string(), r));
    let many = target_refs.iter().enumerate().map(|(i, r)| (format!("spec.targetRefs[{i}]"), r));
    for (path, r) in refs.chain(many) {
        if r.name.is_empty() {
            errors.add(format!("{path}.name"), super::field_errors::required("targetRef name must be set"));
        }
        if !r.namespace.is_empty() {
            errors.add(
                format!("{path}.namespace"),
                forbidden("targetRef namespace must not be set; cross namespace referencing is not supported"),
            );
        }
        // Istio attaches these to waypoints and Gateway API gateways, which meshpilot does not
        // program: serving the policy without its target would leave it unenforced.
        errors.add(
            path,
            forbidden("targetRef is not supported by meshpilot (it programs no waypoint or Gateway API gateway); use selector"),
        );
    }
}
