//! Following the elected leader from outside the election (followers, frontends).

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, KeyValue};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::{ElectionError, LeaderInfo};
use crate::backoff::Backoff;
use crate::cluster::etcd::{logged, logged_bytes, within, EtcdError};

/// How long a `leader` or `observe` request may take before etcd counts as unreachable.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Follows an election's leader; see the module docs.
pub struct LeaderWatch {
    client: Client,
    name: String,
    leader: watch::Sender<Option<LeaderInfo>>,
}

impl LeaderWatch {
    /// A watch of election `name` (e.g. [`super::DEFAULT_ELECTION_NAME`]), started by [`LeaderWatch::run`].
    pub fn new(client: Client, name: impl Into<String>) -> Self {
        let (leader, _) = watch::channel(None);
        LeaderWatch { client, name: name.into(), leader }
    }

    /// The current leader. `None` until one is known, or when etcd reported no leader when
    /// (re)connecting; otherwise the last leader seen, also while etcd is unreachable or between
    /// leaders (etcd's observe reports new leaders, not vacancies).
    pub fn leader(&self) -> watch::Receiver<Option<LeaderInfo>> {
        self.leader.subscribe()
    }

    /// Follows the leader until `shutdown` resolves, reconnecting after errors.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        loop {
            let error = tokio::select! {
                _ = shutdown.as_mut() => break,
                error = self.follow(&mut backoff) => error,
            };
            let delay = backoff.next_delay();
            warn!(election = %self.name, %error, retry_in = ?delay, "leader watch interrupted");
            tokio::select! {
                _ = shutdown.as_mut() => break,
                _ = tokio::time::sleep(delay) => {}
            }
        }
        debug!(election = %self.name, "leader watch stopped");
    }

    /// Reads the current leader, then follows new ones until the stream fails.
    async fn follow(&self, backoff: &mut Backoff) -> ElectionError {
        let mut election = self.client.election_client();
        match within(REQUEST_TIMEOUT, election.leader(self.name.as_str())).await {
            Ok(mut answer) => match answer.take_kv() {
                Some(kv) => self.publish(Some(&kv)),
                None => self.publish(None),
            },
            Err(e) if is_no_leader(&e) => self.publish(None),
            Err(e) => return e.into(),
        }
        let mut stream = match within(REQUEST_TIMEOUT, election.observe(self.name.as_str())).await {
            Ok(stream) => stream,
            Err(e) => return e.into(),
        };
        backoff.reset();
        loop {
            match stream.message().await {
                Ok(Some(mut answer)) => {
                    if let Some(kv) = answer.take_kv() {
                        self.publish(Some(&kv));
                    }
                }
                Ok(None) => return ElectionError::ObserveEnded,
                Err(e) => return EtcdError::from(e).into(),
            }
        }
    }

    fn publish(&self, kv: Option<&KeyValue>) {
        // The value is whatever the election key's writer put there; frontends dial it and
        // everything downstream logs it, so only a plausible address is taken (else: no leader).
        let new = kv.and_then(|kv| match std::str::from_utf8(kv.value()) {
            Ok(addr) if is_address(addr) => {
                Some(LeaderInfo { addr: addr.to_string(), term: u64::try_from(kv.create_revision()).unwrap_or(0) })
            }
            _ => {
                warn!(election = %self.name, value = %logged_bytes(kv.value()), "leader value is not an address; ignored");
                None
            }
        });
        self.leader.send_if_modified(|current| {
            if *current == new {
                return false;
            }
            match &new {
                // The address is etcd's value: whoever wrote it chose it.
                Some(l) => info!(election = %self.name, addr = %logged(&l.addr), term = l.term, "leader"),
                None => info!(election = %self.name, "no leader"),
            }
            *current = new;
            true
        });
    }
}

/// Longest leader address taken: a DNS name (253) in brackets with a port.
const MAX_ADDRESS_LEN: usize = 261;

/// `host:port`-like: not empty, bounded, printable ASCII without spaces (no control characters
/// to forge log lines with, nothing a dial could not use anyway).
fn is_address(value: &str) -> bool {
    !value.is_empty() && value.len() <= MAX_ADDRESS_LEN && value.bytes().all(|b| b.is_ascii_graphic())
}

/// etcd's answer to `leader` when nobody is campaigning ("election: no leader").
fn is_no_leader(e: &EtcdError) -> bool {
    matches!(e, EtcdError::Client(etcd_client::Error::GRpcStatus(s)) if s.message().contains("no leader"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plausible_addresses_are_leaders() {
        assert!(is_address("10.0.0.1:15020"));
        assert!(is_address("[fd00::1]:15020"));
        assert!(!is_address(""));
        assert!(!is_address("10.0.0.1:15020\n{\"level\":\"INFO\"}"));
        assert!(!is_address("a b:1"));
        assert!(!is_address(&"a".repeat(MAX_ADDRESS_LEN + 1)));
    }
}
