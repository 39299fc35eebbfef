//! Frontend membership through a real etcd: registration, deregistration (revoked at once or
//! lapsing), the watched member set across etcd restarts, re-registration into a wiped etcd.

use crate::common;

use std::time::{Duration, Instant};

use common::etcd::{Etcd, ETCD_POLL_INTERVAL};
use common::poll::poll_every;
use common::task::Stoppable;
use meshpilot::cluster::membership::{Member, Members, MembersWatch, MembershipSettings, Registration, DEFAULT_PREFIX};
use tokio::sync::watch;

const TTL: Duration = Duration::from_secs(2);
const GENEROUS: Duration = Duration::from_secs(30);

/// A frontend's registration running in its own task; dropping it stops the task without a
/// shutdown (the lease lapses).
struct Frontend {
    registered: watch::Receiver<bool>,
    run: Stoppable,
}

impl Frontend {
    async fn start(etcd: &Etcd, id: &str) -> Frontend {
        let client = etcd.client().await;
        let settings = MembershipSettings { ttl: TTL, ..MembershipSettings::new(id, addr(id)) };
        let registration = Registration::new(client, settings);
        let registered = registration.registered();
        let run = Stoppable::spawn(|shutdown| registration.run(shutdown));
        Frontend { registered, run }
    }

    /// Graceful stop: deregister (revoke the lease).
    async fn stop(self) {
        self.run.stop().await;
    }
}

fn addr(id: &str) -> String {
    format!("{id}.frontends:15010")
}

fn members(ids: &[&str]) -> Members {
    Members::new(ids.iter().map(|id| Member { id: id.to_string(), addr: addr(id) }))
}

async fn wait_for(w: &watch::Receiver<Members>, want: &Members, within: Duration) {
    let ok = poll_every(ETCD_POLL_INTERVAL, within, async || *w.borrow() == *want).await;
    assert!(ok, "members are {:?}, want {want:?}", *w.borrow());
}

#[tokio::test]
async fn members_follow_registrations_and_survive_etcd_restarts() {
    let mut etcd = Etcd::start().await;
    let client = etcd.client().await;
    let watcher = MembersWatch::new(client, DEFAULT_PREFIX);
    let seen = watcher.members();
    let _watch_task = tokio::spawn(watcher.run(std::future::pending()));

    let fe0 = Frontend::start(&etcd, "fe-0").await;
    let fe1 = Frontend::start(&etcd, "fe-1").await;
    let fe2 = Frontend::start(&etcd, "fe-2").await;
    wait_for(&seen, &members(&["fe-0", "fe-1", "fe-2"]), GENEROUS).await;

    // A graceful stop revokes the lease: gone at once.
    let stopped = Instant::now();
    fe1.stop().await;
    wait_for(&seen, &members(&["fe-0", "fe-2"]), GENEROUS).await;
    assert!(stopped.elapsed() < TTL, "deregistration took {:?}", stopped.elapsed());

    // A frontend that dies is gone once its lease lapses.
    drop(fe2);
    wait_for(&seen, &members(&["fe-0"]), 5 * TTL).await;

    // etcd goes away: the registration knows it lost its lease, the watcher keeps the last set.
    etcd.kill();
    let mut registered = fe0.registered.clone();
    assert!(poll_every(ETCD_POLL_INTERVAL, GENEROUS, async || !*registered.borrow_and_update()).await);
    assert_eq!(*seen.borrow(), members(&["fe-0"]));

    // Back with its data: registered again under a new lease, and it stays (the old lease,
    // which etcd renewed on restart, is revoked without taking the key with it).
    etcd.restart().await;
    assert!(poll_every(ETCD_POLL_INTERVAL, GENEROUS, async || *registered.borrow_and_update()).await);
    wait_for(&seen, &members(&["fe-0"]), GENEROUS).await;
    assert!(
        !poll_every(ETCD_POLL_INTERVAL, 3 * TTL, async || *seen.borrow() != members(&["fe-0"])).await,
        "members changed: {:?}",
        *seen.borrow()
    );

    // Back without its data: registered again from scratch, and a new frontend joins.
    etcd.restart_empty().await;
    wait_for(&seen, &members(&["fe-0"]), GENEROUS).await;
    let _fe3 = Frontend::start(&etcd, "fe-3").await;
    wait_for(&seen, &members(&["fe-0", "fe-3"]), GENEROUS).await;
}
