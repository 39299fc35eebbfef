//! meshpilot: a horizontally scalable service-mesh control plane serving Envoy over xDS.

pub mod config;
pub mod fswatch;
pub mod ingest;
pub mod mesh;
pub mod registry;
pub mod snapshot;
pub mod xds;
pub mod telemetry;
pub mod admin;
pub mod frontend;
pub mod standalone;
pub mod sim;
