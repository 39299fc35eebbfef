//! The integration-test harness shared by the test binaries (`tests/main.rs`, and each binary of
//! its own that declares `mod common;` at its root and uses only the modules it needs, hence
//! `dead_code` is allowed here).
//!
//! Everything a test starts listens on 127.0.0.1 (or another loopback address, or an address in a
//! network namespace the test made) on a port from [`ports`], and is stopped when dropped;
//! processes print the tail of their log when dropped by a failing test. `MESHPILOT_KEEP_TEMP=1`
//! keeps their temp dirs (bootstraps, logs).
#![allow(dead_code)]

/// meshpilot's ADS server in the test process, serving snapshots the test builds.
pub mod ads;
/// HTTP backends (axum) that tell which backend answered and echo the request.
pub mod backend;
/// Test certificates: a mesh root and SPIFFE workload leaves (rcgen).
pub mod certs;
/// The scale-out system: etcd, ingest nodes, frontends, load balancer, Envoys, simulated proxies.
pub mod cluster;
/// Readers of Envoy's `/config_dump`.
pub mod config_dump;
/// Istio's validation corpus, read as documents.
pub mod corpus;
/// The `deploy/` artefacts as the deploy tests read them.
pub mod deploy;
/// A stub DNS server.
pub mod dns;
/// A real Envoy: locator, bootstrap, admin API.
pub mod envoy;
/// A real etcd.
pub mod etcd;
/// Config files and how they are edited.
pub mod files;
/// Floods of idle TCP connections, as an attacker holding a listener's sockets opens them.
pub mod flood;
/// HTTP clients and requests.
pub mod http;
/// A client aimed at one proxy listener.
pub mod ingress;
/// Istio YAML builders.
pub mod istio;
/// Istio's real istioctl.
pub mod istioctl;
/// The differential judge: istiod and meshpilot on the same inputs, compared.
pub mod judge;
/// A real kube-apiserver on a real etcd, and applying objects to it.
pub mod kube;
/// A standalone meshpilot with a gateway and a sidecar Envoy.
pub mod mesh;
/// The meshpilot binary in any mode.
pub mod meshpilot;
/// A network namespace with routable pod addresses.
pub mod netns;
/// What simulated proxies hold, compared with what new connections to a new server get.
pub mod oracle;
/// An in-test OTLP receiver.
pub mod otlp;
/// The one poll helper and the default timeouts.
pub mod poll;
/// The one port allocator.
pub mod ports;
/// The one process handle.
pub mod process;
/// Prometheus text and a real Prometheus.
pub mod prometheus;
/// gRPC channels to meshpilot's secure port, and its CA as a test reads it.
pub mod secure;
/// A pod with Istio's real sidecar (pilot-agent + Envoy) behind Istio's iptables rules.
pub mod sidecar;
/// In-process meshpilot parts in their own task, stopped gracefully or dropped.
pub mod task;
/// An HTTPS client of the validating webhook, as the API server talks to it.
pub mod webhook;
/// The hashing load balancer in front of the frontends.
pub mod xds_lb;
