//! Snapshot versions: `(term, seq)`, ordered by term then sequence.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// Version of a snapshot: `term` grows with each leader election, `seq` with each snapshot of a term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize)]
pub struct Version {
    /// Leader term.
    pub term: u64,
    /// Sequence within the term.
    pub seq: u64,
}

impl Version {
    /// A version.
    pub const fn new(term: u64, seq: u64) -> Self {
        Version { term, seq }
    }

    /// The next version in the same term.
    pub fn next(self) -> Self {
        Version { term: self.term, seq: self.seq + 1 }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.term, self.seq)
    }
}

impl From<Version> for crate::telemetry::trace::TraceVersion {
    fn from(v: Version) -> Self {
        crate::telemetry::trace::TraceVersion { term: v.term, seq: v.seq }
    }
}

/// A version string that is not `term.seq`.
#[derive(Debug, thiserror::Error)]
#[error("invalid snapshot version {0:?}, expected TERM.SEQ")]
pub struct ParseVersionError(String);

impl FromStr for Version {
    type Err = ParseVersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseVersionError(s.to_string());
        let (term, seq) = s.split_once('.').ok_or_else(err)?;
        Ok(Version { term: term.parse().map_err(|_| err())?, seq: seq.parse().map_err(|_| err())? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_by_term_then_seq_and_round_trips() {
        assert!(Version::new(2, 1) > Version::new(1, 99));
        assert!(Version::new(1, 2) > Version::new(1, 1));
        assert_eq!("3.14".parse::<Version>().unwrap(), Version::new(3, 14));
        assert_eq!(Version::new(3, 14).to_string(), "3.14");
        assert!("3".parse::<Version>().is_err());
    }
}
