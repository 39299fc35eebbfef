//! meshpilot: a horizontally scalable service-mesh control plane serving Envoy over xDS.
//!
//! The modules follow the data flow (see `ARCHITECTURE.md`): [`source`] → [`ingest`] →
//! [`snapshot`] → [`replication`] → [`envoy`] (translation) → [`xds`] (serving) → proxies, beside the shared model ([`config`],
//! [`mesh`], [`registry`]), the [`cluster`] (etcd, election, membership, ownership), [`security`] (CA, identities,
//! authentication), Istio's validating [`webhook`], [`admin`],
//! [`telemetry`], and one composition root per role in [`app`].

pub mod admin;
pub mod allocator;
pub mod app;
pub mod backoff;
pub mod cluster;
pub mod config;
pub mod ctl;
pub mod drain;
pub mod envoy;
pub mod ingest;
pub mod mesh;
pub mod readiness;
pub mod registry;
pub mod replication;
pub mod security;
pub mod sim;
pub mod snapshot;
pub mod source;
pub mod telemetry;
pub mod webhook;
pub mod xds;
