//! A frontend's own registration, kept while it runs and renewed whenever etcd lost it.

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, PutOptions};
use tokio::sync::watch;
use tracing::{info, warn};

use super::MembershipSettings;
use crate::backoff::Backoff;
use crate::cluster::etcd::{revoke_lease, within, EtcdError, KeptLease};

/// Registers this frontend; see the module docs.
pub struct Registration {
    client: Client,
    settings: MembershipSettings,
    registered: watch::Sender<bool>,
}

impl Registration {
    /// A registration with `settings`, made by [`Registration::run`].
    pub fn new(client: Client, settings: MembershipSettings) -> Self {
        let (registered, _) = watch::channel(false);
        Registration { client, settings, registered }
    }

    /// True while the key is in etcd under a live lease, as far as this node can tell.
    pub fn registered(&self) -> watch::Receiver<bool> {
        self.registered.subscribe()
    }

    /// Keeps the registration until `shutdown` resolves (then revokes the lease: the member
    /// disappears at once) or this future is dropped (then it disappears after the TTL).
    /// Whenever the lease is lost (etcd down, restarted, or wiped) it registers again.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let key = format!("{}{}", self.settings.prefix, self.settings.id);
        let limit = self.settings.ttl;
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let mut stale_lease: Option<i64> = None;
        loop {
            let registered = tokio::select! {
                _ = shutdown.as_mut() => break,
                registered = self.register(&key, stale_lease) => registered,
            };
            let mut lease = match registered {
                Ok(lease) => lease,
                Err(error) => {
                    let delay = backoff.next_delay();
                    warn!(%key, %error, retry_in = ?delay, "registration failed");
                    tokio::select! {
                        _ = shutdown.as_mut() => break,
                        _ = tokio::time::sleep(delay) => continue,
                    }
                }
            };
            backoff.reset();
            self.registered.send_replace(true);
            info!(%key, addr = %self.settings.addr, lease = format!("{:x}", lease.id()), "registered");
            tokio::select! {
                _ = shutdown.as_mut() => {
                    self.registered.send_replace(false);
                    if let Err(error) = lease.revoke(limit).await {
                        warn!(%key, %error, "deregistration failed; the key lapses after its TTL");
                    }
                    break;
                }
                reason = lease.lost() => {
                    self.registered.send_replace(false);
                    warn!(%key, %reason, "registration lost; registering again");
                    stale_lease = Some(lease.id());
                }
            }
        }
        self.registered.send_replace(false);
    }

    /// Puts the key under a new lease, then revokes the previous lease if any. In this order the
    /// key never disappears when etcd kept it (e.g. across a restart): watchers see no flap.
    async fn register(&self, key: &str, stale_lease: Option<i64>) -> Result<KeptLease, EtcdError> {
        let limit = self.settings.ttl;
        let lease = KeptLease::grant(&self.client, self.settings.ttl).await?;
        let mut kv = self.client.kv_client();
        let put = kv.put(key, self.settings.addr.as_str(), Some(PutOptions::new().with_lease(lease.id())));
        within(limit, put).await?;
        if let Some(id) = stale_lease {
            if let Err(error) = revoke_lease(&self.client, id, limit).await {
                warn!(%key, %error, "revoking the previous lease failed; it lapses after its TTL");
            }
        }
        Ok(lease)
    }
}
