//! istiod's validation metrics, with its names and labels, so its dashboards and alerts work.

use prometheus::IntCounterVec;

use crate::telemetry::metrics::{counter_vec, Registry};

/// The webhook's counters.
#[derive(Clone)]
pub struct WebhookMetrics {
    /// `galley_validation_passed{group,version,resource}`.
    pub passed: IntCounterVec,
    /// `galley_validation_failed{group,version,resource,reason}` (dry runs are not counted).
    pub failed: IntCounterVec,
    /// `galley_validation_http_error{status}`: requests refused before any review.
    pub http_error: IntCounterVec,
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
        }
    }
}
