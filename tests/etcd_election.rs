//! Leader election through a real etcd: one leader at a time, failover with a higher term,
//! stepping down when etcd goes away, re-election after it comes back, and `LeaderWatch`.

use crate::common;

use std::time::{Duration, Instant};

use common::etcd::{Etcd, ETCD_POLL_INTERVAL};
use common::poll::poll_every;
use common::task::Stoppable;
use meshpilot::cluster::election::{
    Candidate, ElectionSettings, LeaderInfo, LeaderWatch, Leadership, DEFAULT_ELECTION_NAME,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const TTL: Duration = Duration::from_secs(2);
const GENEROUS: Duration = Duration::from_secs(30);

/// A candidate running in its own task, with its own etcd client. Dropping it stops the task
/// without a shutdown: the lease lapses, as when a process dies.
struct Node {
    addr: String,
    leadership: watch::Receiver<Leadership>,
    run: Stoppable,
}

impl Node {
    async fn start(etcd: &Etcd, id: &str) -> Node {
        let client = etcd.client().await;
        let addr = format!("{id}.ingest:15020");
        let settings = ElectionSettings { ttl: TTL, ..ElectionSettings::new(id, addr.clone()) };
        let candidate = Candidate::new(client, settings);
        let leadership = candidate.leadership();
        let run = Stoppable::spawn(|shutdown| candidate.run(shutdown));
        Node { addr, leadership, run }
    }

    fn term(&self) -> Option<u64> {
        self.leadership.borrow().term()
    }

    /// Graceful stop: resign and revoke.
    async fn stop(self) {
        self.run.stop().await;
    }
}

async fn leader_watch(etcd: &Etcd) -> (watch::Receiver<Option<LeaderInfo>>, JoinHandle<()>) {
    let client = etcd.client().await;
    let w = LeaderWatch::new(client, DEFAULT_ELECTION_NAME);
    let rx = w.leader();
    (rx, tokio::spawn(w.run(std::future::pending())))
}

/// Index and term of the one leader among `nodes`; panics if two lead at once.
fn sole_leader(nodes: &[&Node]) -> Option<(usize, u64)> {
    let leaders: Vec<(usize, u64)> = nodes.iter().enumerate().filter_map(|(i, n)| Some((i, n.term()?))).collect();
    assert!(leaders.len() <= 1, "two leaders at once: {leaders:?}");
    leaders.first().copied()
}

async fn wait_for_leader(nodes: &[&Node], newer_than: u64, within: Duration) -> (usize, u64) {
    let mut found = None;
    let ok = poll_every(ETCD_POLL_INTERVAL, within, async || {
        found = sole_leader(nodes).filter(|(_, term)| *term > newer_than);
        found.is_some()
    })
    .await;
    assert!(ok, "no leader with a term above {newer_than} within {within:?}");
    found.unwrap_or_default()
}

async fn wait_for_watch(w: &watch::Receiver<Option<LeaderInfo>>, want: LeaderInfo) {
    let ok = poll_every(ETCD_POLL_INTERVAL, GENEROUS, async || w.borrow().as_ref() == Some(&want)).await;
    assert!(ok, "LeaderWatch shows {:?}, want {want:?}", *w.borrow());
}

#[tokio::test]
async fn one_leader_fails_over_with_a_higher_term_and_resigns_on_shutdown() {
    let etcd = Etcd::start().await;
    let (watched, _watch_task) = leader_watch(&etcd).await;
    let a = Node::start(&etcd, "ingest-a").await;
    let b = Node::start(&etcd, "ingest-b").await;

    let (first, term1) = wait_for_leader(&[&a, &b], 0, GENEROUS).await;
    let (leader, follower) = if first == 0 { (a, b) } else { (b, a) };
    wait_for_watch(&watched, LeaderInfo { addr: leader.addr.clone(), term: term1 }).await;
    assert_eq!(follower.term(), None);

    // The leader dies without a word: its lease lapses after the TTL and the other takes over.
    let leader_rx = leader.leadership.clone();
    let died = Instant::now();
    drop(leader);
    let stopped = poll_every(ETCD_POLL_INTERVAL, GENEROUS, async || *leader_rx.borrow() == Leadership::Follower).await;
    assert!(stopped, "a stopped candidate leads nothing");
    let (_, term2) = wait_for_leader(&[&follower], term1, 6 * TTL).await;
    assert!(term2 > term1);
    eprintln!("failover after the leader died: {:?}", died.elapsed());
    wait_for_watch(&watched, LeaderInfo { addr: follower.addr.clone(), term: term2 }).await;

    // A graceful stop resigns: the next candidate wins at once, not after a TTL.
    let c = Node::start(&etcd, "ingest-c").await;
    // c is campaigning (its key exists) once it is seen by etcd; give it a moment by polling nothing
    // but its own state, which stays Follower until the leader goes.
    assert!(!poll_every(ETCD_POLL_INTERVAL, Duration::from_millis(500), async || c.term().is_some()).await);
    let resigned = Instant::now();
    follower.stop().await;
    let (_, term3) = wait_for_leader(&[&c], term2, GENEROUS).await;
    let took = resigned.elapsed();
    assert!(took < TTL, "takeover after a resign took {took:?}, as long as a lease lapse");
    wait_for_watch(&watched, LeaderInfo { addr: c.addr.clone(), term: term3 }).await;
}

#[tokio::test]
async fn leader_steps_down_within_ttl_when_etcd_dies_and_one_is_elected_after_restart() {
    let mut etcd = Etcd::start().await;
    let (watched, _watch_task) = leader_watch(&etcd).await;
    let a = Node::start(&etcd, "ingest-a").await;
    let b = Node::start(&etcd, "ingest-b").await;
    let nodes = [&a, &b];

    let (first, term1) = wait_for_leader(&nodes, 0, GENEROUS).await;
    let before = LeaderInfo { addr: nodes[first].addr.clone(), term: term1 };
    wait_for_watch(&watched, before.clone()).await;

    let killed = Instant::now();
    etcd.kill();
    let stepped_down = poll_every(ETCD_POLL_INTERVAL, GENEROUS, async || sole_leader(&nodes).is_none()).await;
    let took = killed.elapsed();
    assert!(stepped_down && took <= TTL, "leader still leading {took:?} after etcd died (TTL {TTL:?})");
    eprintln!("stepped down {took:?} after etcd died");
    // Nobody leads while etcd is away, and followers keep the last leader they knew.
    assert!(!poll_every(ETCD_POLL_INTERVAL, TTL, async || sole_leader(&nodes).is_some()).await);
    assert_eq!(watched.borrow().as_ref(), Some(&before));

    let restarted = Instant::now();
    etcd.restart().await;
    let (second, term2) = wait_for_leader(&nodes, term1, GENEROUS).await;
    eprintln!("leader elected {:?} after etcd restarted", restarted.elapsed());
    wait_for_watch(&watched, LeaderInfo { addr: nodes[second].addr.clone(), term: term2 }).await;
    // Still exactly one leader a while later.
    assert!(!poll_every(ETCD_POLL_INTERVAL, TTL, async || sole_leader(&nodes).map(|(_, t)| t) != Some(term2)).await);
}
