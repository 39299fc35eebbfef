//! The integration tests, as one binary: each file in this folder is a module, and `common` is
//! the harness they share. One binary is linked once and stored once (each separate binary held
//! its own copy of the crate, and together they filled a CI machine's disk).
//! `cargo test --test integration <file>::` runs one file's tests.
//!
//! `snapshot_stream.rs` stays a binary of its own: it measures its own process's resident
//! memory, which the other files' tests, running beside it in one process, would disturb.

mod common;

mod architecture;
mod authorization;
mod authorization_ext_authz;
mod authorization_mtls;
mod conformance;
mod dashboards;
mod deploy_config;
mod deploy_load_balancers;
mod deploy_manifests;
mod differential;
mod envoy_live_changes;
mod envoy_regex_limits;
mod envoy_routing;
mod envoy_sniffing;
mod etcd_election;
mod etcd_membership;
mod etcd_tls;
mod file_source_hardening;
mod gateway_credentials;
mod gateway_secrets;
mod harness_smoke;
mod idle_connections;
mod ingest_handover;
mod istioctl;
mod kubernetes;
mod load_replay;
mod metrics;
mod operator_tools;
mod otlp;
mod ring_vs_envoy;
mod scale_out;
mod secure_xds;
mod sidecar_istio;
mod sidecar_mtls;
mod sidecar_secure;
mod snapshot_mtls;
mod snapshot_rogue_leader;
mod staleness_oracle;
mod validation_agreement;
mod webhook;
mod xds_delta;
mod xds_hardening;
mod xds_stream;
