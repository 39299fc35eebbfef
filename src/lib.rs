//! meshpilot: a horizontally scalable service-mesh control plane serving Envoy over xDS.

pub mod admin;
pub mod config;
pub mod frontend;
pub mod fswatch;
pub mod ingest;
pub mod mesh;
pub mod registry;
pub mod sim;
pub mod snapshot;
pub mod standalone;
pub mod telemetry;
pub mod xds;
