//! A candidate: campaigns until elected, leads while its lease lives, then campaigns again.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use etcd_client::{Client, LeaderKey, ResignOptions};
use futures::FutureExt;
use tokio::sync::watch;
use tracing::{info, warn};

use super::{ElectionError, ElectionSettings, Leadership};
use crate::backoff::Backoff;
use crate::cluster::etcd::{revoke_lease, within, EtcdError, KeptLease};

/// A participant in the election; see the module docs.
pub struct Candidate {
    client: Client,
    settings: ElectionSettings,
    leadership: watch::Sender<Leadership>,
}

/// How a round of the election ended, other than by an error.
enum RoundEnd {
    Shutdown,
    SteppedDown,
}

impl Candidate {
    /// A candidate that will campaign with `settings` once [`Candidate::run`] is awaited.
    pub fn new(client: Client, settings: ElectionSettings) -> Self {
        let (leadership, _) = watch::channel(Leadership::Follower);
        Candidate { client, settings, leadership }
    }

    /// This node's leadership; `Follower` until elected and again once `run` has returned or
    /// been dropped.
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.subscribe()
    }

    /// Campaigns forever: until `shutdown` resolves (then resigns and revokes its lease, so a
    /// follower takes over at once) or this future is dropped (then the lease lapses after its TTL).
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let _follower_when_gone = FollowerOnDrop(&self.leadership);
        tokio::pin!(shutdown);
        let mut backoff = Backoff::new(Duration::from_millis(100), self.settings.ttl.min(Duration::from_secs(2)));
        // Lease of an abandoned campaign or term; its key may still be in etcd (which gives all
        // leases a fresh TTL when it restarts), delaying the next election until revoked.
        let mut stale_lease = None;
        loop {
            match self.round(&mut shutdown, &mut stale_lease).await {
                Ok(RoundEnd::Shutdown) => break,
                Ok(RoundEnd::SteppedDown) => backoff.reset(),
                Err(error) => {
                    self.set(Leadership::Follower);
                    let delay = backoff.next_delay();
                    warn!(id = %self.settings.id, %error, retry_in = ?delay, "election round failed");
                    tokio::select! {
                        _ = shutdown.as_mut() => break,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        info!(id = %self.settings.id, "candidate stopped");
    }

    /// One lease: campaign, lead until the lease is lost or shutdown.
    async fn round<S: Future<Output = ()>>(
        &self,
        shutdown: &mut Pin<&mut S>,
        stale_lease: &mut Option<i64>,
    ) -> Result<RoundEnd, ElectionError> {
        let limit = self.settings.ttl;
        if let Some(id) = *stale_lease {
            revoke_lease(&self.client, id, limit).await?;
            *stale_lease = None;
        }
        let mut lease = tokio::select! {
            _ = shutdown.as_mut() => return Ok(RoundEnd::Shutdown),
            granted = KeptLease::grant(&self.client, self.settings.ttl) => granted?,
        };
        let mut election = self.client.election_client();
        let campaign = election.campaign(self.settings.name.as_str(), self.settings.advertise.as_str(), lease.id());
        let won = tokio::select! {
            _ = shutdown.as_mut() => {
                self.quit(lease, None).await;
                return Ok(RoundEnd::Shutdown);
            }
            reason = lease.lost() => {
                *stale_lease = Some(lease.id());
                return Err(ElectionError::LeaseLost(reason));
            }
            answer = campaign => answer,
        };
        let key = match won.map(|mut answer| answer.take_leader()) {
            Ok(Some(key)) => key,
            Ok(None) => {
                *stale_lease = Some(lease.id());
                return Err(ElectionError::NoLeaderKey);
            }
            Err(e) => {
                *stale_lease = Some(lease.id());
                return Err(EtcdError::from(e).into());
            }
        };
        // The lease may have run out in the instant the campaign was won.
        if let Some(reason) = lease.lost().now_or_never() {
            *stale_lease = Some(lease.id());
            return Err(ElectionError::LeaseLost(reason));
        }
        let term = u64::try_from(key.rev()).unwrap_or(0);
        self.set(Leadership::Leader { term });
        info!(id = %self.settings.id, term, lease = format!("{:x}", lease.id()), "elected leader");
        tokio::select! {
            _ = shutdown.as_mut() => {
                self.set(Leadership::Follower);
                info!(id = %self.settings.id, term, "resigning: shutting down");
                self.quit(lease, Some(key)).await;
                Ok(RoundEnd::Shutdown)
            }
            reason = lease.lost() => {
                self.set(Leadership::Follower);
                warn!(id = %self.settings.id, term, %reason, "stepped down: lease lost");
                *stale_lease = Some(lease.id());
                Ok(RoundEnd::SteppedDown)
            }
        }
    }

    /// Best effort on shutdown: resign (a follower is elected at once) and revoke the lease.
    async fn quit(&self, lease: KeptLease, key: Option<LeaderKey>) {
        let limit = self.settings.ttl;
        if let Some(key) = key {
            let mut election = self.client.election_client();
            let resign = election.resign(Some(ResignOptions::new().with_leader(key)));
            if let Err(error) = within(limit, resign).await {
                warn!(id = %self.settings.id, %error, "resign failed");
            }
        }
        if let Err(error) = lease.revoke(limit).await {
            warn!(id = %self.settings.id, %error, "lease revoke failed; it lapses after its TTL");
        }
    }

    fn set(&self, new: Leadership) {
        self.leadership.send_if_modified(|current| std::mem::replace(current, new) != new);
    }
}

/// Sets `Follower` when the run future ends or is dropped: a node that is not campaigning leads nothing.
struct FollowerOnDrop<'a>(&'a watch::Sender<Leadership>);

impl Drop for FollowerOnDrop<'_> {
    fn drop(&mut self) {
        self.0.send_if_modified(|current| std::mem::replace(current, Leadership::Follower).is_leader());
    }
}
