//! An etcd lease kept alive in the background, with a conservative local view of when it expires.

use std::time::Duration;

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};
use tracing::{debug, warn};

use super::{within, EtcdError};

/// Why a lease can no longer be counted on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseLost {
    /// Its TTL passed since the last keepalive etcd confirmed.
    #[error("no keepalive confirmed for the lease's TTL")]
    Expired,
    /// etcd answered a keepalive saying the lease no longer exists.
    #[error("etcd says the lease is gone")]
    Gone,
    /// A keepalive could not be sent or its stream failed.
    #[error("keepalive failed: {0}")]
    KeepAliveFailed(String),
    /// A keepalive got no answer in time.
    #[error("keepalive not answered within {0:?}")]
    NoAnswer(Duration),
    /// The keepalive task ended without saying why (it panicked or the runtime is shutting down).
    #[error("keepalive task ended")]
    TaskEnded,
}

/// A granted lease, kept alive every TTL/3 by a background task until it is lost, revoked or
/// dropped. Dropping it stops the keepalives: etcd then expires it after its TTL.
pub struct KeptLease {
    id: i64,
    ttl: Duration,
    client: Client,
    lost: oneshot::Receiver<LeaseLost>,
    lost_reason: Option<LeaseLost>,
    task: JoinHandle<()>,
}

impl KeptLease {
    /// Grants a lease of `ttl` (whole seconds, rounded up; etcd may raise it to its minimum)
    /// and starts keeping it alive. Gives up after `ttl` without an answer.
    pub async fn grant(client: &Client, ttl: Duration) -> Result<KeptLease, EtcdError> {
        let mut leases = client.lease_client();
        let secs = ttl.as_secs_f64().ceil().max(1.0) as i64;
        // Counted from before the request: etcd's expiry is later than anything measured from here.
        let asked = Instant::now();
        let granted = within(ttl, leases.grant(secs, None)).await?;
        if !granted.error().is_empty() {
            return Err(EtcdError::Protocol(format!("lease grant: {}", granted.error())));
        }
        let (id, granted_secs) = (granted.id(), granted.ttl());
        if granted_secs <= 0 {
            return Err(EtcdError::Protocol(format!("lease {id:x} granted with TTL {granted_secs}")));
        }
        let ttl = Duration::from_secs(granted_secs as u64);
        let remaining = (asked + ttl).saturating_duration_since(Instant::now());
        let (keeper, stream) = within(remaining, leases.keep_alive(id)).await?;
        let (tx, lost) = oneshot::channel();
        let task = tokio::spawn(keep_alive(id, ttl, asked, keeper, stream, tx));
        debug!(lease = format!("{id:x}"), ?ttl, "lease granted");
        Ok(KeptLease { id, ttl, client: client.clone(), lost, lost_reason: None, task })
    }

    /// The lease id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The TTL etcd granted.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Resolves when the lease is lost: at the first failed keepalive, or when its TTL has
    /// passed since the last confirmed one, whichever comes first. Cancel-safe.
    pub async fn lost(&mut self) -> LeaseLost {
        if let Some(reason) = &self.lost_reason {
            return reason.clone();
        }
        let reason = (&mut self.lost).await.unwrap_or(LeaseLost::TaskEnded);
        self.lost_reason = Some(reason.clone());
        reason
    }

    /// Stops the keepalives and revokes the lease, deleting every key attached to it.
    pub async fn revoke(self, limit: Duration) -> Result<(), EtcdError> {
        self.task.abort();
        revoke_lease(&self.client, self.id, limit).await
    }
}

impl std::fmt::Debug for KeptLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptLease").field("id", &format_args!("{:x}", self.id)).field("ttl", &self.ttl).finish()
    }
}

impl Drop for KeptLease {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Revokes lease `id`, deleting the keys attached to it; a lease etcd no longer knows counts as revoked.
pub async fn revoke_lease(client: &Client, id: i64, limit: Duration) -> Result<(), EtcdError> {
    match within(limit, client.lease_client().revoke(id)).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Sends a keepalive every TTL/3 and reports the first sign that the lease may be gone.
/// `asked` is when the grant was requested: the lease lives at least a TTL from then.
async fn keep_alive(
    id: i64,
    ttl: Duration,
    asked: Instant,
    mut keeper: LeaseKeeper,
    mut stream: LeaseKeepAliveStream,
    tx: oneshot::Sender<LeaseLost>,
) {
    let interval = ttl / 3;
    let mut expires = asked + ttl;
    // Counted from the request too: a grant that waited for a connection gets its first
    // keepalive at once, instead of running out while waiting for a full interval.
    let mut next = asked + interval;
    let reason = loop {
        tokio::select! {
            _ = sleep_until(expires) => break LeaseLost::Expired,
            _ = sleep_until(next) => {}
            // Only answers to our keepalives come on this stream; between them, an item here
            // is the stream failing (etcd went away): report it now, not at the next keepalive.
            msg = stream.message() => match msg {
                Err(e) => break LeaseLost::KeepAliveFailed(e.to_string()),
                Ok(None) => break LeaseLost::KeepAliveFailed("stream closed".into()),
                Ok(Some(_)) => continue,
            },
        }
        let sent = Instant::now();
        if let Err(e) = keeper.keep_alive().await {
            break LeaseLost::KeepAliveFailed(e.to_string());
        }
        let wait = interval.min(expires.saturating_duration_since(sent));
        match tokio::time::timeout(wait, stream.message()).await {
            Err(_) => break LeaseLost::NoAnswer(wait),
            Ok(Err(e)) => break LeaseLost::KeepAliveFailed(e.to_string()),
            Ok(Ok(None)) => break LeaseLost::KeepAliveFailed("stream closed".into()),
            Ok(Ok(Some(answer))) if answer.ttl() <= 0 => break LeaseLost::Gone,
            Ok(Ok(Some(answer))) => {
                // etcd restarted the TTL when it received the keepalive, after `sent`.
                expires = sent + Duration::from_secs(answer.ttl() as u64);
                next = sent + interval;
            }
        }
    };
    warn!(lease = format!("{id:x}"), %reason, "lease lost");
    let _ = tx.send(reason);
}
