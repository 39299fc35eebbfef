//! What a frontend's subscriber reports about itself (for metrics and debug output).

use crate::cluster::election::LeaderInfo;
use crate::snapshot::Version;

/// The state and counters of a [`super::SnapshotSubscriber`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscriberStatus {
    /// The leader the subscriber follows (or last followed).
    pub leader: Option<LeaderInfo>,
    /// Whether a subscription stream is open.
    pub connected: bool,
    /// The version of the snapshot the frontend serves.
    pub held: Option<Version>,
    /// The leader's latest version, as last reported by it.
    pub leader_latest: Option<Version>,
    /// The highest term seen (from the election or from updates); lower terms are refused.
    pub highest_term: u64,
    /// Connections made after the first one.
    pub reconnects: u64,
    /// Full snapshots applied.
    pub fulls_applied: u64,
    /// Deltas applied.
    pub deltas_applied: u64,
    /// Updates refused because their term was below the highest seen.
    pub refused_lower_term: u64,
    /// Deltas that did not apply on the held version (the subscriber asked for a full snapshot).
    pub resyncs: u64,
    /// Why the last subscription stream ended.
    pub last_error: Option<String>,
}

impl SubscriberStatus {
    /// How many snapshots the frontend is behind the leader's latest: the sequence difference in the
    /// same term; the leader's whole term (its `seq`) when the frontend holds an older term or nothing.
    pub fn lag(&self) -> u64 {
        match (self.held, self.leader_latest) {
            (_, None) => 0,
            (Some(held), Some(latest)) if held >= latest => 0,
            (Some(held), Some(latest)) if held.term == latest.term => latest.seq - held.seq,
            (_, Some(latest)) => latest.seq,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_counts_snapshots_behind() {
        let s = |held, latest| SubscriberStatus { held, leader_latest: latest, ..Default::default() };
        assert_eq!(s(None, None).lag(), 0);
        assert_eq!(s(Some(Version::new(1, 3)), Some(Version::new(1, 7))).lag(), 4);
        assert_eq!(s(Some(Version::new(1, 7)), Some(Version::new(1, 7))).lag(), 0);
        assert_eq!(s(Some(Version::new(1, 7)), Some(Version::new(2, 2))).lag(), 2);
        assert_eq!(s(None, Some(Version::new(2, 5))).lag(), 5);
    }
}
