//! The metrics every meshpilot process has, whatever its role: build info, the snapshot version
//! held, and the heap.

use prometheus::IntGaugeVec;

use super::heap::HeapCollector;
use super::metrics::{gauge_value, gauge_vec, register, Registry};

/// Metrics every meshpilot process has, whatever its role.
#[derive(Clone, Debug)]
pub struct ProcessMetrics {
    /// `meshpilot_build_info{role,id,version}`: 1, identifying this process.
    pub build_info: IntGaugeVec,
    /// `meshpilot_snapshot_version{part}`: term and seq of the snapshot held.
    pub snapshot_version: IntGaugeVec,
}

impl ProcessMetrics {
    /// Registers the process metrics in `registry`.
    pub fn register(registry: &Registry) -> ProcessMetrics {
        register(registry, HeapCollector::new());
        ProcessMetrics {
            build_info: gauge_vec(
                registry,
                "meshpilot_build_info",
                "Always 1; identifies this process by role (standalone, ingest, frontend), id and version.",
                &["role", "id", "version"],
            ),
            snapshot_version: gauge_vec(
                registry,
                "meshpilot_snapshot_version",
                "Version of the snapshot this process holds, by part (term, seq).",
                &["part"],
            ),
        }
    }

    /// Sets `meshpilot_build_info{role,id,version}` to 1.
    pub fn set_build_info(&self, role: &str, id: &str) {
        self.build_info.with_label_values(&[role, id, env!("CARGO_PKG_VERSION")]).set(1);
    }

    /// Sets `meshpilot_snapshot_version{part}` to the version this process holds.
    pub fn set_snapshot_version(&self, term: u64, seq: u64) {
        self.snapshot_version.with_label_values(&["term"]).set(gauge_value(term));
        self.snapshot_version.with_label_values(&["seq"]).set(gauge_value(seq));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::metrics::render;

    #[test]
    fn process_metrics_render_with_their_labels() {
        let registry = Registry::new();
        let m = ProcessMetrics::register(&registry);
        m.set_build_info("standalone", "a");
        m.set_snapshot_version(3, 7);
        let text = render(&registry);
        assert!(text.contains("meshpilot_snapshot_version{part=\"term\"} 3"), "{text}");
        assert!(text.contains("meshpilot_snapshot_version{part=\"seq\"} 7"), "{text}");
        assert!(text.contains(&format!(
            "meshpilot_build_info{{id=\"a\",role=\"standalone\",version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )));
    }
}
