//! meshpilot: a horizontally scalable service-mesh control plane serving Envoy over xDS.

pub mod admin;
pub mod config;
pub mod election;
pub mod etcd;
pub mod frontend;
pub mod fswatch;
pub mod ingest;
pub mod membership;
pub mod mesh;
pub mod ownership;
pub mod registry;
pub mod sim;
pub mod snapshot;
pub mod standalone;
pub mod telemetry;
pub mod xds;
