//! The current member set, from a watch on the membership prefix.

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, GetOptions, WatchOptions};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::{Member, Members};
use crate::backoff::Backoff;
use crate::cluster::etcd::{logged, logged_bytes, within, EtcdError};

/// How long a request may take before etcd counts as unreachable.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Member ids a "members changed" line names (the count says how many there are).
const MAX_LOGGED_MEMBERS: usize = 16;

/// Watches the members under a prefix; see the module docs.
pub struct MembersWatch {
    client: Client,
    prefix: String,
    members: watch::Sender<Members>,
}

/// Why following the members was interrupted (it resumes after a backoff).
#[derive(Debug, thiserror::Error)]
enum WatchError {
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    #[error("watch ended")]
    Ended,
    #[error("watch canceled by etcd: {0}")]
    Canceled(String),
}

impl MembersWatch {
    /// A watch of the members under `prefix` (e.g. [`super::DEFAULT_PREFIX`]), started by [`MembersWatch::run`].
    pub fn new(client: Client, prefix: impl Into<String>) -> Self {
        let (members, _) = watch::channel(Members::default());
        MembersWatch { client, prefix: prefix.into(), members }
    }

    /// The current members: empty until first read; the last known set while etcd is unreachable.
    pub fn members(&self) -> watch::Receiver<Members> {
        self.members.subscribe()
    }

    /// Follows the members until `shutdown` resolves, re-reading everything after errors.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        loop {
            let error = tokio::select! {
                _ = shutdown.as_mut() => break,
                error = self.follow(&mut backoff) => error,
            };
            let delay = backoff.next_delay();
            warn!(prefix = %self.prefix, %error, retry_in = ?delay, "members watch interrupted");
            tokio::select! {
                _ = shutdown.as_mut() => break,
                _ = tokio::time::sleep(delay) => {}
            }
        }
        debug!(prefix = %self.prefix, "members watch stopped");
    }

    /// Reads the set, then re-reads it on every change the watch reports, until the watch fails.
    async fn follow(&self, backoff: &mut Backoff) -> WatchError {
        let revision = match self.read().await {
            Ok(revision) => revision,
            Err(e) => return e.into(),
        };
        let options = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
        let mut watches = self.client.watch_client();
        let mut stream = match within(REQUEST_TIMEOUT, watches.watch(self.prefix.as_str(), Some(options))).await {
            Ok(stream) => stream,
            Err(e) => return e.into(),
        };
        backoff.reset();
        loop {
            match stream.message().await {
                Ok(Some(answer)) if answer.canceled() => {
                    return WatchError::Canceled(answer.cancel_reason().to_string())
                }
                // Members are few: reading them all again is simpler and surer than applying events.
                Ok(Some(answer)) if !answer.events().is_empty() => {
                    if let Err(e) = self.read().await {
                        return e.into();
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => return WatchError::Ended,
                Err(e) => return EtcdError::from(e).into(),
            }
        }
    }

    /// Reads and publishes the current set; returns the revision it was read at.
    async fn read(&self) -> Result<i64, EtcdError> {
        let mut kv = self.client.kv_client();
        let get = kv.get(self.prefix.as_str(), Some(GetOptions::new().with_prefix()));
        let answer = within(REQUEST_TIMEOUT, get).await?;
        let revision = answer.header().map(|h| h.revision()).unwrap_or(0);
        let members = Members::new(answer.kvs().iter().filter_map(|kv| {
            let id = kv.key().strip_prefix(self.prefix.as_bytes())?;
            let (Ok(id), Ok(addr)) = (std::str::from_utf8(id), kv.value_str()) else {
                warn!(key = %logged_bytes(kv.key()), "member key or address is not UTF-8; ignored");
                return None;
            };
            Some(Member { id: id.to_string(), addr: addr.to_string() })
        }));
        self.members.send_if_modified(|current| {
            if *current == members {
                return false;
            }
            // Ids are etcd keys anyone who can write etcd chooses: few, each capped and escaped.
            let shown: Vec<String> = members.ids().take(MAX_LOGGED_MEMBERS).map(logged).collect();
            info!(prefix = %self.prefix, count = members.len(), members = ?shown, "members changed");
            *current = members;
            true
        });
        Ok(revision)
    }
}
