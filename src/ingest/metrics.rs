//! Ingest's metrics: source updates received and snapshots built, with Istio's names where
//! Istio has one (`pilot_inbound_updates`, `pilot_push_triggers`, `pilot_pushcontext_init_seconds`).

use std::time::Duration;

use prometheus::{Histogram, IntCounterVec, IntGauge};

use crate::snapshot::Snapshot;
use crate::telemetry::metrics::{counter_vec, gauge, gauge_value, histogram, Registry, INIT_BUCKETS};

/// `pilot_push_triggers` type of a config change (Istio's `config` trigger).
const TRIGGER_CONFIG: &str = "config";
/// `pilot_push_triggers` type of an endpoint-only change (Istio's `endpoint` trigger).
const TRIGGER_ENDPOINT: &str = "endpoint";
/// `pilot_push_triggers` type of a full push (mesh config, new term; Istio's `global` trigger).
const TRIGGER_GLOBAL: &str = "global";
/// `pilot_inbound_updates` type of config events (Istio's `config`).
const INBOUND_CONFIG: &str = "config";

/// Metrics of the ingest loop.
#[derive(Clone, Debug)]
pub struct IngestMetrics {
    /// `pilot_inbound_updates{type}`: source events received.
    pub inbound_updates: IntCounterVec,
    /// `pilot_push_triggers{type}`: pushes by cause.
    pub push_triggers: IntCounterVec,
    /// `pilot_pushcontext_init_seconds`: snapshot build time.
    pub pushcontext_init_seconds: Histogram,
    /// `pilot_services`: services in the registry.
    pub services: IntGauge,
    /// `meshpilot_snapshot_build_seconds`.
    pub snapshot_build_seconds: Histogram,
    /// `meshpilot_config_errors`: rejected documents currently reported.
    pub config_errors: IntGauge,
}

impl IngestMetrics {
    /// Registers the ingest metrics in `r`, each labelled series created at 0.
    pub fn register(r: &Registry) -> IngestMetrics {
        let m = IngestMetrics {
            inbound_updates: counter_vec(
                r,
                "pilot_inbound_updates",
                "Total number of updates received by pilot.",
                &["type"],
            ),
            push_triggers: counter_vec(
                r,
                "pilot_push_triggers",
                "Total number of times a push was triggered, labeled by reason for the push.",
                &["type"],
            ),
            pushcontext_init_seconds: histogram(
                r,
                "pilot_pushcontext_init_seconds",
                "Total time in seconds Pilot takes to init pushContext.",
                INIT_BUCKETS,
            ),
            services: gauge(r, "pilot_services", "Total services known to pilot."),
            snapshot_build_seconds: histogram(
                r,
                "meshpilot_snapshot_build_seconds",
                "Time to build a snapshot from the sources' state.",
                INIT_BUCKETS,
            ),
            config_errors: gauge(r, "meshpilot_config_errors", "Config documents currently rejected by validation."),
        };
        for trigger in [TRIGGER_CONFIG, TRIGGER_ENDPOINT, TRIGGER_GLOBAL] {
            m.push_triggers.with_label_values(&[trigger]);
        }
        m.inbound_updates.with_label_values(&[INBOUND_CONFIG]);
        m
    }

    /// Counts config updates received from a source (`pilot_inbound_updates{type="config"}`), one per object.
    pub fn inbound_config_updates(&self, count: usize) {
        self.inbound_updates.with_label_values(&[INBOUND_CONFIG]).inc_by(u64::try_from(count).unwrap_or(u64::MAX));
    }

    /// Records a built snapshot.
    pub fn snapshot_built(&self, snapshot: &Snapshot, took: Duration) {
        self.pushcontext_init_seconds.observe(took.as_secs_f64());
        self.snapshot_build_seconds.observe(took.as_secs_f64());
        self.services.set(gauge_value(snapshot.registry.services.len()));
        self.config_errors.set(gauge_value(snapshot.errors.len()));
        let trigger = if snapshot.changes.full {
            TRIGGER_GLOBAL
        } else if snapshot.changes.endpoints_only() {
            TRIGGER_ENDPOINT
        } else {
            TRIGGER_CONFIG
        };
        self.push_triggers.with_label_values(&[trigger]).inc();
    }
}

impl Default for IngestMetrics {
    /// Metrics registered nowhere, for components built outside a process (tests, tools).
    fn default() -> Self {
        IngestMetrics::register(&Registry::new())
    }
}
