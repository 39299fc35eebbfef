//! Which connected proxies this frontend owns by the consistent hash, and which are foreign.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;

use crate::membership::Members;
use crate::ownership::{Ownership, ProxyHashing, ProxyKey};
use crate::telemetry::metrics::METRICS;
use crate::xds::status::ConnectionRegistry;

/// Owned and foreign proxy counts at one moment.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct OwnershipSummary {
    /// Frontends in the ring.
    pub members: usize,
    /// Connected proxies this frontend owns.
    pub owned: usize,
    /// Connected proxies another frontend owns (they still get correct config here).
    pub foreign: usize,
    /// Up to 20 foreign proxies with their owner, for debugging the load balancer.
    pub foreign_sample: Vec<(String, String)>,
}

/// Recomputes ownership every second and on membership changes, publishing counts to metrics and `summary`.
pub async fn track(
    my_id: String,
    proxy_key: ProxyKey,
    mut members: watch::Receiver<Members>,
    connections: Arc<ConnectionRegistry>,
    summary: watch::Sender<OwnershipSummary>,
) {
    loop {
        let current = members.borrow_and_update().clone();
        METRICS.members.set(i64::try_from(current.len()).unwrap_or(i64::MAX));
        let ring = Ownership::new(current.ids().map(str::to_string), ProxyHashing::default()).ok();
        let mut s = OwnershipSummary { members: current.len(), ..Default::default() };
        for conn in connections.snapshot() {
            let key = proxy_key.of(&conn.proxy);
            match ring.as_ref().and_then(|r| r.owner(&key)) {
                Some(owner) if owner != my_id => {
                    s.foreign += 1;
                    if s.foreign_sample.len() < 20 {
                        s.foreign_sample.push((conn.proxy.id.clone(), owner.to_string()));
                    }
                }
                // No ring yet (etcd unreachable at start): every proxy here counts as owned.
                _ => s.owned += 1,
            }
        }
        METRICS.proxies.with_label_values(&["owned"]).set(i64::try_from(s.owned).unwrap_or(i64::MAX));
        METRICS.proxies.with_label_values(&["foreign"]).set(i64::try_from(s.foreign).unwrap_or(i64::MAX));
        summary.send_replace(s);
        tokio::select! {
            changed = members.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
