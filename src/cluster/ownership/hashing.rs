//! The choice of consistent hash: Maglev (the default) or ring hash, behind one owner lookup.

use super::{Maglev, MaglevError, MaglevSettings, Ring, RingError, RingSettings};

/// Which Envoy load balancing policy the load balancer in front of the frontends uses, and so which
/// algorithm the frontends compute ownership with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyHashing {
    /// `lb_policy: MAGLEV` with the default table size: about `1/n` of the keys move when a
    /// member leaves or joins.
    #[default]
    Maglev,
    /// `lb_policy: RING_HASH` with the default ring sizes: about 3/8 of the keys move when one of
    /// four members leaves.
    RingHash,
}

/// Either algorithm's lookup structure over the members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// A Maglev table.
    Maglev(Maglev),
    /// A hash ring.
    RingHash(Ring),
}

/// Members or settings the chosen algorithm refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnershipError {
    /// From [`Maglev::new`].
    #[error(transparent)]
    Maglev(#[from] MaglevError),
    /// From [`Ring::new`].
    #[error(transparent)]
    RingHash(#[from] RingError),
}

impl Ownership {
    /// The lookup over `member_ids` by `hashing`, with Envoy's default sizes (which the load
    /// balancer must use too). Maglev ignores the order; ring hash takes the ids in the load
    /// balancer's endpoint order (pass [`crate::cluster::membership::Members::ids`]).
    pub fn new<I, S>(member_ids: I, hashing: ProxyHashing) -> Result<Ownership, OwnershipError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Ok(match hashing {
            ProxyHashing::Maglev => Ownership::Maglev(Maglev::new(member_ids, MaglevSettings::default())?),
            ProxyHashing::RingHash => Ownership::RingHash(Ring::new(member_ids, RingSettings::default())?),
        })
    }

    /// The algorithm in use.
    pub fn hashing(&self) -> ProxyHashing {
        match self {
            Ownership::Maglev(_) => ProxyHashing::Maglev,
            Ownership::RingHash(_) => ProxyHashing::RingHash,
        }
    }

    /// The member owning `key` (a [`super::ProxyKey`] value); `None` when there are no members.
    pub fn owner(&self, key: &str) -> Option<&str> {
        match self {
            Ownership::Maglev(m) => m.owner(key),
            Ownership::RingHash(r) => r.owner(key),
        }
    }

    /// The member ids (sorted for Maglev, in the given order for ring hash).
    pub fn members(&self) -> &[String] {
        match self {
            Ownership::Maglev(m) => m.members(),
            Ownership::RingHash(r) => r.members(),
        }
    }
}

impl From<Maglev> for Ownership {
    fn from(m: Maglev) -> Self {
        Ownership::Maglev(m)
    }
}

impl From<Ring> for Ownership {
    fn from(r: Ring) -> Self {
        Ownership::RingHash(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDS: [&str; 4] = ["fe-a", "fe-b", "fe-c", "fe-d"];

    #[test]
    fn maglev_is_the_default_and_each_variant_answers_as_its_algorithm() {
        assert_eq!(ProxyHashing::default(), ProxyHashing::Maglev);
        let maglev = Maglev::new(IDS, MaglevSettings::default()).unwrap();
        let ring = Ring::new(IDS, RingSettings::default()).unwrap();
        let by_maglev = Ownership::new(IDS, ProxyHashing::default()).unwrap();
        let by_ring = Ownership::new(IDS, ProxyHashing::RingHash).unwrap();
        assert_eq!(by_maglev.hashing(), ProxyHashing::Maglev);
        assert_eq!(by_ring.hashing(), ProxyHashing::RingHash);
        assert_eq!(by_maglev, Ownership::from(maglev.clone()));
        assert_eq!(by_ring, Ownership::from(ring.clone()));
        for i in 0..500 {
            let key = format!("ns-{}/sa-{i}", i % 7);
            assert_eq!(by_maglev.owner(&key), maglev.owner(&key));
            assert_eq!(by_ring.owner(&key), ring.owner(&key));
        }
        assert_eq!(by_maglev.members(), IDS);
        assert_eq!(Ownership::new(Vec::<String>::new(), ProxyHashing::Maglev).unwrap().owner("k"), None);
        assert!(matches!(
            Ownership::new([""], ProxyHashing::Maglev),
            Err(OwnershipError::Maglev(MaglevError::EmptyId))
        ));
        assert!(matches!(
            Ownership::new([""], ProxyHashing::RingHash),
            Err(OwnershipError::RingHash(RingError::EmptyId))
        ));
    }
}
