//! SIGTERM to the ingest leader: it resigns and revokes its lease before it exits, so a standby
//! leads at once, long before the lease's TTL would have run out. Real etcd, real processes.

use crate::common;

use std::time::{Duration, Instant};

use common::etcd::Etcd;
use common::files::temp_dir_with;
use common::meshpilot::{wait_leader, Meshpilot};

/// Far longer than the handover may take: only a resignation can make it this fast.
const LEASE_TTL_SECS: u64 = 60;
/// The standby must lead within this after the SIGTERM (the drain deadline is 5 s).
const HANDOVER_LIMIT: Duration = Duration::from_secs(10);

const SE: &str = "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: a, namespace: default}
spec: {hosts: [a.example.com], location: MESH_EXTERNAL, resolution: STATIC, ports: [{number: 80, name: http}], endpoints: [{address: 10.0.0.1}]}
";

#[tokio::test]
async fn sigterm_to_the_leader_hands_over_before_the_lease_ttl() {
    let etcd = Etcd::start().await;
    let dir = temp_dir_with(&[("se.yaml", SE)]);
    let first = Meshpilot::ingest(&etcd.endpoint(), dir.path()).id("in-first").lease_ttl(LEASE_TTL_SECS).start();
    first.wait_ready(Duration::from_secs(60)).await;
    let mut nodes = vec![first];
    let (_, first_term) = wait_leader(&nodes, Duration::from_secs(30), |_| true).await;
    let standby = Meshpilot::ingest(&etcd.endpoint(), dir.path()).id("in-standby").lease_ttl(LEASE_TTL_SECS).start();
    standby.wait_ready(Duration::from_secs(60)).await;
    nodes.push(standby);
    assert_eq!(wait_leader(&nodes, Duration::from_secs(10), |_| true).await.0, 0, "the first node stays leader");

    let sent = Instant::now();
    let exited = nodes[0].terminate(Duration::from_secs(15)).await;
    assert!(exited, "the leader did not exit within 15 s of SIGTERM:\n{}", nodes[0].log_tail(40));
    let (leader, term) = wait_leader(&nodes, HANDOVER_LIMIT, |t| t > first_term).await;
    let took = sent.elapsed();
    assert_eq!(leader, 1, "the standby leads");
    assert!(term > first_term, "a new term: {term} after {first_term}");
    assert!(
        took < HANDOVER_LIMIT,
        "handover took {took:?}; the lease TTL is {LEASE_TTL_SECS} s, so the old leader did not resign"
    );
    let logs = nodes[0].logs();
    assert!(logs.contains("resigning: shutting down"), "the leader's log shows no resignation:\n{logs}");
}
