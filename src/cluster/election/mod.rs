//! Leader election among ingest nodes through etcd's v3 election API.
//!
//! - [`Candidate`] (ingest nodes): campaigns with a lease kept alive every TTL/3 and reports
//!   [`Leadership`]. The term of a leader is the create revision of its election key, so it
//!   grows with every new leader. A leader steps down (flips to `Follower`) at the first failed
//!   keepalive or once a TTL has passed since the last confirmed one, i.e. before etcd could let
//!   anyone else win; then it campaigns again with a new lease.
//! - [`LeaderWatch`] (followers, frontends): the current leader's advertised address and term,
//!   from `leader()` then `observe()`; the last known value is kept while etcd is unreachable.
//!
//! ```ignore
//! let client = meshpilot::cluster::etcd::connect_with_tls(&["https://127.0.0.1:2379".into()], &tls).await?;
//! let candidate = Candidate::new(client.clone(), ElectionSettings::new("ingest-0", "10.0.0.1:15020"));
//! let mut leadership = candidate.leadership();
//! tokio::spawn(candidate.run(shutdown_signal)); // resigns and revokes its lease on shutdown
//! let watch = LeaderWatch::new(client, DEFAULT_ELECTION_NAME);
//! let leader = watch.leader(); // watch::Receiver<Option<LeaderInfo>>
//! tokio::spawn(watch.run(std::future::pending()));
//! ```

mod candidate;
mod leader_watch;

use std::time::Duration;

pub use candidate::Candidate;
pub use leader_watch::LeaderWatch;

/// The election name (etcd key prefix) the ingest nodes campaign under.
pub const DEFAULT_ELECTION_NAME: &str = "/meshpilot/ingest-leader";

/// Default lease TTL of a candidate.
pub const DEFAULT_TTL: Duration = Duration::from_secs(5);

/// This node's role in the election.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Leadership {
    /// Not the leader (also while campaigning, and while etcd is unreachable).
    #[default]
    Follower,
    /// The leader, for `term` (the create revision of its election key in etcd).
    Leader {
        /// Grows with every new leader, also across re-elections of the same node.
        term: u64,
    },
}

impl Leadership {
    /// True for `Leader`.
    pub fn is_leader(&self) -> bool {
        matches!(self, Leadership::Leader { .. })
    }

    /// The term while leader.
    pub fn term(&self) -> Option<u64> {
        match self {
            Leadership::Leader { term } => Some(*term),
            Leadership::Follower => None,
        }
    }
}

/// The current leader, as followers and frontends see it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaderInfo {
    /// The address the leader advertised (its snapshot endpoint).
    pub addr: String,
    /// Its term (create revision of its election key).
    pub term: u64,
}

/// How a [`Candidate`] campaigns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionSettings {
    /// Election name (etcd key prefix); [`DEFAULT_ELECTION_NAME`] by default.
    pub name: String,
    /// This node's id (for logs).
    pub id: String,
    /// The value proclaimed when leader: the snapshot address followers and frontends dial.
    pub advertise: String,
    /// Lease TTL ([`DEFAULT_TTL`]); keepalives go every TTL/3. Whole seconds; etcd's minimum is 2 s.
    pub ttl: Duration,
}

impl ElectionSettings {
    /// Settings with the default name and TTL.
    pub fn new(id: impl Into<String>, advertise: impl Into<String>) -> Self {
        ElectionSettings {
            name: DEFAULT_ELECTION_NAME.to_string(),
            id: id.into(),
            advertise: advertise.into(),
            ttl: DEFAULT_TTL,
        }
    }
}

/// Why an election round failed (the candidate or watch retries after a backoff).
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// An etcd request failed.
    #[error(transparent)]
    Etcd(#[from] crate::cluster::etcd::EtcdError),
    /// The lease was lost while campaigning.
    #[error("lease lost while campaigning: {0}")]
    LeaseLost(crate::cluster::etcd::LeaseLost),
    /// etcd answered a campaign or leader request without the leader's key.
    #[error("etcd answered without a leader key")]
    NoLeaderKey,
    /// The observe stream ended.
    #[error("observe stream ended")]
    ObserveEnded,
}
