//! The sources' metrics: what they currently cannot read.
//!
//! A file the sources cannot use does not take the mesh out of service (`/ready` stays 200 and the
//! last good config keeps being served); it is reported here, in `/debug/configz` `errors`, and in
//! the log, which is where alerts should look.

use std::collections::BTreeMap;

use prometheus::{IntCounterVec, IntGaugeVec};

use super::files::REASONS;
use super::SourceId;
use crate::telemetry::metrics::{counter_vec, gauge_value, gauge_vec, Registry};

/// Mesh config problems that are not read problems: an empty file, and one that does not parse.
pub const MESH_REASONS: &[&str] = &["empty", "invalid"];
/// Why a Kubernetes kind is not being read: RBAC, a missing CRD, credentials, or the API server.
pub const KUBE_REASONS: &[&str] = &["forbidden", "not_installed", "unauthorized", "unreachable"];

/// Metrics of the config sources.
#[derive(Clone, Debug)]
pub struct SourceMetrics {
    /// `meshpilot_config_source_errors{source,reason}`: files and directories a source currently
    /// cannot use (`reason`: unreadable, not_regular_file, too_large, not_utf8, limit, missing,
    /// and for the mesh config empty, invalid).
    pub source_errors: IntGaugeVec,
    /// `meshpilot_kubernetes_lists_total{kind}`: complete lists of a Kubernetes kind, the first
    /// and every relist after a 410 Gone or a watch that could not resume.
    pub kube_lists: IntCounterVec,
}

impl SourceMetrics {
    /// Registers the source metrics in `r`, each labelled series created at 0.
    pub fn register(r: &Registry) -> SourceMetrics {
        let m = SourceMetrics {
            source_errors: gauge_vec(
                r,
                "meshpilot_config_source_errors",
                "Files and directories a config source currently cannot use, by source and reason; the last good config stays in force.",
                &["source", "reason"],
            ),
            kube_lists: counter_vec(
                r,
                "meshpilot_kubernetes_lists_total",
                "Complete lists of a Kubernetes kind: the initial one and each relist (410 Gone, a watch that could not resume).",
                &["kind"],
            ),
        };
        m.set_problems(SourceId::ConfigDir, &BTreeMap::new());
        m.set_problems(SourceId::MeshConfig, &BTreeMap::new());
        m
    }

    /// Sets the counts of `source`'s current problems by reason; reasons not in `counts` go to 0.
    pub fn set_problems(&self, source: SourceId, counts: &BTreeMap<&'static str, usize>) {
        let (files, extra): (&[&str], &[&str]) = match source {
            SourceId::MeshConfig => (REASONS, MESH_REASONS),
            SourceId::ConfigDir => (REASONS, &[]),
            SourceId::Kubernetes => (&[], KUBE_REASONS),
        };
        let source = source.to_string();
        for reason in files.iter().chain(extra) {
            let count = counts.get(reason).copied().unwrap_or(0);
            self.source_errors.with_label_values(&[source.as_str(), *reason]).set(gauge_value(count));
        }
    }
}

impl Default for SourceMetrics {
    /// Metrics registered nowhere, for sources started outside a process (tests, tools).
    fn default() -> Self {
        SourceMetrics::register(&Registry::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_exists_at_zero_and_counts_are_replaced() {
        let registry = Registry::new();
        let m = SourceMetrics::register(&registry);
        let text = crate::telemetry::metrics::render(&registry);
        assert!(text.contains("meshpilot_config_source_errors{reason=\"missing\",source=\"config-dir\"} 0"), "{text}");
        m.set_problems(SourceId::ConfigDir, &BTreeMap::from([("not_utf8", 2)]));
        assert_eq!(m.source_errors.with_label_values(&["config-dir", "not_utf8"]).get(), 2);
        m.set_problems(SourceId::ConfigDir, &BTreeMap::new());
        assert_eq!(m.source_errors.with_label_values(&["config-dir", "not_utf8"]).get(), 0);
    }
}
