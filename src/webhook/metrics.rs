//! istiod's validation metrics, with its names and labels, so its dashboards and alerts work.
//!
//! Every label value comes from a fixed set: the API server is not the only one that can reach the
//! webhook, and a caller naming a new resource in every request must not grow `/metrics` (each
//! series lives as long as the process). A resource meshpilot does not validate is `unknown`, and
//! a cap on series backs that up.

use prometheus::IntCounterVec;

use super::review::GroupVersionResource;
use crate::config::object::{Kind, NETWORKING_GROUP};
use crate::telemetry::metrics::{counter_vec, Registry, SeriesCap};

/// The label value of a group, version, resource or status outside the known set.
pub const UNKNOWN: &str = "unknown";

/// Most series a webhook counter holds; label sets beyond count under [`UNKNOWN`] labels.
pub const MAX_SERIES: usize = 256;

/// API versions a known resource is labelled with (every version Istio has served its kinds in).
const VERSIONS: [&str; 4] = ["v1", "v1beta1", "v1alpha3", "v1alpha1"];

/// Istio resources the webhook may be asked about but does not validate (admitted with a
/// warning), so they keep their own labels.
const UNSERVED_RESOURCES: [(&str, &str); 5] = [
    (NETWORKING_GROUP, "envoyfilters"),
    (NETWORKING_GROUP, "workloadgroups"),
    (NETWORKING_GROUP, "proxyconfigs"),
    ("telemetry.istio.io", "telemetries"),
    ("extensions.istio.io", "wasmplugins"),
];

/// HTTP statuses the webhook refuses requests with.
const STATUSES: [&str; 4] = ["400", "413", "415", "500"];

/// The plural resource name of a kind, as the API server sends it.
fn plural(kind: Kind) -> &'static str {
    match kind {
        Kind::VirtualService => "virtualservices",
        Kind::DestinationRule => "destinationrules",
        Kind::Gateway => "gateways",
        Kind::ServiceEntry => "serviceentries",
        Kind::WorkloadEntry => "workloadentries",
        Kind::Sidecar => "sidecars",
        Kind::AuthorizationPolicy => "authorizationpolicies",
        Kind::RequestAuthentication => "requestauthentications",
        Kind::PeerAuthentication => "peerauthentications",
    }
}

/// The labels of a request's resource: its own when it is an Istio resource the webhook knows,
/// else `unknown` for all three (so a request can never create a new label value).
pub fn resource_labels(r: &GroupVersionResource) -> [&'static str; 3] {
    let served = Kind::ALL.into_iter().map(|k| (k.group().0, plural(k)));
    let known = served.chain(UNSERVED_RESOURCES).find(|(group, resource)| *group == r.group && *resource == r.resource);
    let version = VERSIONS.into_iter().find(|v| *v == r.version);
    match (known, version) {
        (Some((group, resource)), Some(version)) => [group, version, resource],
        _ => [UNKNOWN; 3],
    }
}

/// The webhook's counters.
#[derive(Clone)]
pub struct WebhookMetrics {
    /// `galley_validation_passed{group,version,resource}`.
    pub passed: IntCounterVec,
    /// `galley_validation_failed{group,version,resource,reason}` (dry runs are not counted).
    pub failed: IntCounterVec,
    /// `galley_validation_http_error{status}`: requests refused before any review.
    pub http_error: IntCounterVec,
    /// Series caps of the three counters, in that order.
    caps: [SeriesCap; 3],
}

impl WebhookMetrics {
    /// Registers the counters in `registry`.
    pub fn register(registry: &Registry) -> WebhookMetrics {
        WebhookMetrics {
            passed: counter_vec(
                registry,
                "galley_validation_passed",
                "Resource is valid",
                &["group", "version", "resource"],
            ),
            failed: counter_vec(
                registry,
                "galley_validation_failed",
                "Resource validation failed",
                &["group", "version", "resource", "reason"],
            ),
            http_error: counter_vec(
                registry,
                "galley_validation_http_error",
                "Resource validation http serve errors",
                &["status"],
            ),
            caps: [SeriesCap::new(MAX_SERIES), SeriesCap::new(MAX_SERIES), SeriesCap::new(MAX_SERIES)],
        }
    }

    /// Counts a review that passed (`galley_validation_passed`).
    pub fn record_passed(&self, resource: &GroupVersionResource) {
        let labels = self.caps[0].admit(&resource_labels(resource), UNKNOWN);
        self.passed.with_label_values(&labels).inc();
    }

    /// Counts a review that failed for `reason`, a label from the webhook's own set
    /// (`galley_validation_failed`).
    pub fn record_failed(&self, resource: &GroupVersionResource, reason: &'static str) {
        let [group, version, resource] = resource_labels(resource);
        let labels = self.caps[1].admit(&[group, version, resource, reason], UNKNOWN);
        self.failed.with_label_values(&labels).inc();
    }

    /// Counts a request refused before any review (`galley_validation_http_error`).
    pub fn record_http_error(&self, status: u16) {
        let status = status.to_string();
        let label = STATUSES.into_iter().find(|s| *s == status).unwrap_or(UNKNOWN);
        let labels = self.caps[2].admit(&[label], UNKNOWN);
        self.http_error.with_label_values(&labels).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::metrics::render;

    fn gvr(group: &str, version: &str, resource: &str) -> GroupVersionResource {
        GroupVersionResource { group: group.into(), version: version.into(), resource: resource.into() }
    }

    #[test]
    fn known_resources_keep_their_labels_and_others_are_unknown() {
        assert_eq!(
            resource_labels(&gvr("networking.istio.io", "v1", "virtualservices")),
            ["networking.istio.io", "v1", "virtualservices"]
        );
        assert_eq!(
            resource_labels(&gvr("security.istio.io", "v1beta1", "authorizationpolicies")),
            ["security.istio.io", "v1beta1", "authorizationpolicies"]
        );
        // A served resource named under the wrong group, an unknown version, made-up names.
        assert_eq!(resource_labels(&gvr("networking.istio.io", "v1", "authorizationpolicies")), [UNKNOWN; 3]);
        assert_eq!(resource_labels(&gvr("networking.istio.io", "v9", "gateways")), [UNKNOWN; 3]);
        assert_eq!(resource_labels(&gvr("evil.example", "v1", "x\"}\n")), [UNKNOWN; 3]);
    }

    #[test]
    fn distinct_bogus_resources_make_one_series() {
        let registry = Registry::new();
        let m = WebhookMetrics::register(&registry);
        for i in 0..5000 {
            m.record_failed(&gvr(&format!("g{i}.example"), &format!("v{i}"), &format!("r{i}")), "unknown_type");
            m.record_passed(&gvr("x", &format!("v{i}"), "virtualservices"));
        }
        m.record_http_error(418);
        let text = render(&registry);
        let series = text.lines().filter(|l| l.starts_with("galley_validation_")).count();
        assert_eq!(series, 3, "{text}");
        assert!(text.contains(
            "galley_validation_failed{group=\"unknown\",reason=\"unknown_type\",resource=\"unknown\",version=\"unknown\"} 5000"
        ));
    }
}
