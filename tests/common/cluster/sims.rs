//! Simulated proxies of a scale-out [`Cluster`](super::Cluster) (the crate's `SimProxy`): proxy
//! keys chosen so that every frontend owns some, connecting, and waiting for convergence.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use meshpilot::cluster::ownership::{Ownership, ProxyHashing};
use meshpilot::sim::{SimProxy, SimProxySpec, SimState};
use meshpilot::snapshot::Version;
use meshpilot::xds::TypeUrl;

use crate::common::poll::{poll, POLL_INTERVAL};
use crate::common::xds_lb::LbPolicy;

use super::TIMEOUT;

/// The load balancer's policy: the one the frontends compute ownership with (they use
/// `ProxyHashing::default()`, Maglev).
pub const LB_POLICY: LbPolicy = LbPolicy::Maglev;

/// The frontend the load balancer sends `key` to while all of `ids` are healthy ([`LB_POLICY`]
/// over the ids; `tests/ring_vs_envoy.rs` checks the crate's tables against Envoy's). Used to
/// choose keys that spread over the frontends; where proxies land is then asked of the load
/// balancer itself ([`XdsLoadBalancer::route_of`](crate::common::xds_lb::XdsLoadBalancer::route_of)).
pub fn lb_owner(ids: &[String], key: &str) -> String {
    let mut sorted = ids.to_vec();
    sorted.sort();
    let hashing = match LB_POLICY {
        LbPolicy::Maglev => ProxyHashing::Maglev,
        LbPolicy::RingHash => ProxyHashing::RingHash,
    };
    Ownership::new(sorted, hashing).unwrap().owner(key).unwrap().to_string()
}

/// The first `{prefix}-N` such that `{ns}/{prefix}-N` is owned by `owner`.
pub fn name_owned_by(ids: &[String], ns: &str, prefix: &str, owner: &str) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|name| lb_owner(ids, &format!("{ns}/{name}")) == owner)
        .unwrap_or_else(|| panic!("no {prefix}-N in {ns} owned by {owner}"))
}

/// A group of simulated proxies sharing a proxy key `namespace/app`.
#[derive(Debug, Clone)]
pub struct SimKey {
    /// The proxies' namespace.
    pub namespace: String,
    /// Their `app` label.
    pub app: String,
    /// The frontend the load balancer's hash gives this key.
    pub owner: String,
}

impl SimKey {
    /// `namespace/app`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.app)
    }
}

/// One simulated proxy and how it was made.
pub struct Sim {
    /// What it was connected with.
    pub spec: SimProxySpec,
    /// Its proxy key.
    pub key: String,
    /// The proxy.
    pub proxy: SimProxy,
}

/// The spec of simulated proxy number `index` of `key`, connecting to `xds_url`.
pub fn sim_spec(xds_url: &str, key: &SimKey, index: usize) -> SimProxySpec {
    let ns = &key.namespace;
    let ip = format!("10.{}.{}.{}", 100 + index / 65536 % 100, index / 256 % 256, index % 256);
    let mut spec = SimProxySpec::sidecar(xds_url, ns, &format!("sim-{index}"), &ip);
    spec.labels = [("app".to_string(), key.app.clone())].into_iter().collect();
    spec
}

/// Connects a simulated proxy, retrying while the listener comes up. (A loop, not
/// [`poll`]: the future must be `Send` for `tokio::spawn`, which an async closure's is not.)
pub async fn connect_sim(spec: SimProxySpec) -> SimProxy {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match SimProxy::connect(spec.clone()).await {
            Ok(p) => return p,
            Err(e) => {
                assert!(Instant::now() < deadline, "simulated proxy {} could not connect: {e}", spec.node_id);
                tokio::time::sleep(POLL_INTERVAL).await;
            }
        }
    }
}

/// Why a simulated proxy has not converged on `at_least` (None when it has: connected, all four
/// types received and acked, some type acked at `at_least` or later).
pub fn sim_problem(state: &SimState, at_least: Option<Version>) -> Option<String> {
    if !state.connected {
        return Some(format!("disconnected: {:?}", state.error));
    }
    if state.types.len() != 4 {
        return Some(format!("has types {:?}", state.types.keys().collect::<Vec<_>>()));
    }
    if let Some((t, s)) = state.types.iter().find(|(_, s)| s.acked_version != s.version) {
        return Some(format!("{t:?}: received {} acked {}", s.version, s.acked_version));
    }
    if let Some(v) = at_least {
        let newest = state.types.values().filter_map(|s| s.acked_version.parse::<Version>().ok()).max();
        if newest.is_none_or(|n| n < v) {
            return Some(format!("newest acked {newest:?} < {v}"));
        }
    }
    None
}

/// Resource names per type a simulated proxy holds.
pub fn sim_names(state: &SimState) -> BTreeMap<TypeUrl, BTreeSet<String>> {
    state.types.iter().map(|(t, s)| (*t, s.names.clone())).collect()
}

/// Polls until every simulated proxy converged on `at_least`; panics with the first problems.
pub async fn wait_sims(sims: &[Sim], at_least: Option<Version>) {
    let mut problems = Vec::new();
    let ok = poll(TIMEOUT, async || {
        problems = sims
            .iter()
            .filter_map(|s| sim_problem(&s.proxy.state(), at_least).map(|p| format!("{}: {p}", s.spec.node_id)))
            .collect();
        problems.is_empty()
    })
    .await;
    assert!(
        ok,
        "{} of {} simulated proxies not converged on {at_least:?} after {TIMEOUT:?}; first: {:#?}",
        problems.len(),
        sims.len(),
        &problems[..problems.len().min(10)]
    );
}
