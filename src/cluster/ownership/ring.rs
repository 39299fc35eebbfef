//! A ring of member ids built the way Envoy's ring hash load balancer builds its ring.
//!
//! Envoy's algorithm (source/extensions/load_balancing_policies/ring_hash/ring_hash_lb.cc, the host
//! weight normalization in thread_aware_lb_impl.cc, the header hash in common/http/hash_policy.cc):
//! - each host's normalized weight is weight / total weight; here all weights are 1, so 1/n;
//! - `scale = min(ceil(min_weight * minimum_ring_size) / min_weight, maximum_ring_size)` in doubles;
//! - hosts are walked in order with running sums: the target grows by `scale * weight` per host
//!   and the host adds entries while the overall count is below the target (so rounding leftovers
//!   fall on hosts by position, which is why the order must match Envoy's endpoint order);
//! - entry `i` of a host hashes `hash_key + "_" + i` (decimal) with xxHash64, seed 0;
//! - entries are sorted by hash; a request hash goes to the first entry whose hash is >= it,
//!   wrapping around to the first entry;
//! - a header hash policy hashes the header value with xxHash64, seed 0 ([`super::key_hash`]).

use xxhash_rust::xxh64::xxh64;

use super::key_hash;

/// Ring sizes, as in Envoy's `ring_hash_lb_config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingSettings {
    /// `minimum_ring_size` (Envoy's default 1024).
    pub minimum_ring_size: u64,
    /// `maximum_ring_size` (Envoy's default 8M).
    pub maximum_ring_size: u64,
}

impl Default for RingSettings {
    fn default() -> Self {
        RingSettings { minimum_ring_size: 1024, maximum_ring_size: 8 * 1024 * 1024 }
    }
}

/// Ring settings Envoy would refuse too.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// The minimum ring size is above the maximum.
    #[error("ring hash: minimum_ring_size ({min}) > maximum_ring_size ({max})")]
    Sizes {
        /// The minimum given.
        min: u64,
        /// The maximum given.
        max: u64,
    },
    /// A member id is empty (Envoy would hash the endpoint's address instead).
    #[error("ring hash: empty member id")]
    EmptyId,
}

/// A consistent-hash ring over member ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    members: Vec<String>,
    /// (hash, index into `members`), sorted by hash.
    entries: Vec<(u64, u32)>,
}

impl Ring {
    /// The ring over `member_ids`, taken in the given order (the load balancer's endpoint order;
    /// pass [`crate::cluster::membership::Members::ids`] for the usual sorted order).
    pub fn new<I, S>(member_ids: I, settings: RingSettings) -> Result<Ring, RingError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        if settings.minimum_ring_size > settings.maximum_ring_size {
            return Err(RingError::Sizes { min: settings.minimum_ring_size, max: settings.maximum_ring_size });
        }
        let members: Vec<String> = member_ids.into_iter().map(Into::into).collect();
        if members.iter().any(String::is_empty) {
            return Err(RingError::EmptyId);
        }
        let mut entries = Vec::new();
        if !members.is_empty() {
            // The same double arithmetic as Envoy, so that fractional targets round alike.
            let weight = 1.0 / members.len() as f64;
            let scale =
                ((weight * settings.minimum_ring_size as f64).ceil() / weight).min(settings.maximum_ring_size as f64);
            entries.reserve(scale.ceil() as usize);
            let mut current = 0.0_f64;
            let mut target = 0.0_f64;
            let mut key = String::new();
            for (index, id) in members.iter().enumerate() {
                target += scale * weight;
                let mut i: u64 = 0;
                while current < target {
                    key.clear();
                    key.push_str(id);
                    key.push('_');
                    key.push_str(&i.to_string());
                    entries.push((xxh64(key.as_bytes(), 0), index as u32));
                    i += 1;
                    current += 1.0;
                }
            }
            entries.sort_unstable_by_key(|&(hash, _)| hash);
        }
        Ok(Ring { members, entries })
    }

    /// The member owning `key` (a [`super::ProxyKey`] value); `None` when there are no members.
    pub fn owner(&self, key: &str) -> Option<&str> {
        self.owner_of_hash(key_hash(key))
    }

    /// The member owning requests with hash `hash`.
    pub fn owner_of_hash(&self, hash: u64) -> Option<&str> {
        let at = self.entries.partition_point(|&(h, _)| h < hash);
        let (_, index) = self.entries.get(at).or_else(|| self.entries.first())?;
        self.members.get(*index as usize).map(String::as_str)
    }

    /// The member ids, in ring order of construction.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// Number of entries on the ring (Envoy's `ring_hash_lb.size` gauge).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if the ring has no members.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn ring(ids: &[&str]) -> Ring {
        Ring::new(ids.iter().copied(), RingSettings::default()).unwrap()
    }

    fn owners(ring: &Ring, keys: &[String]) -> Vec<String> {
        keys.iter().map(|k| ring.owner(k).unwrap().to_string()).collect()
    }

    #[test]
    fn xxhash64_matches_reference_values() {
        // Published test vectors of XXH64 with seed 0.
        assert_eq!(key_hash(""), 0xEF46_DB37_51D8_E999);
        assert_eq!(key_hash("a"), 0xD24E_C4F1_A98C_6E5B);
    }

    #[test]
    fn ring_size_follows_envoys_scaling() {
        assert_eq!(ring(&["a", "b", "c", "d"]).len(), 1024);
        // ceil(1024 / 3) = 342 entries per host.
        assert_eq!(ring(&["a", "b", "c"]).len(), 1026);
        let small = Ring::new(["a", "b"], RingSettings { minimum_ring_size: 4, maximum_ring_size: 6 }).unwrap();
        assert_eq!(small.len(), 4);
        let capped = Ring::new(["a", "b", "c"], RingSettings { minimum_ring_size: 5, maximum_ring_size: 5 }).unwrap();
        assert_eq!(capped.len(), 5);
    }

    #[test]
    fn lookup_takes_the_first_entry_at_or_after_the_hash_and_wraps() {
        let r = ring(&["a", "b"]);
        let (first_hash, first) = r.entries[0];
        let (last_hash, _) = r.entries[r.entries.len() - 1];
        let first = r.members[first as usize].as_str();
        assert_eq!(r.owner_of_hash(0), Some(first));
        assert_eq!(r.owner_of_hash(first_hash), Some(first));
        assert_eq!(r.owner_of_hash(last_hash.wrapping_add(1)), Some(first));
        let (h1, i1) = r.entries[1];
        assert_eq!(r.owner_of_hash(first_hash + 1), Some(r.members[i1 as usize].as_str()));
        assert_eq!(r.owner_of_hash(h1), Some(r.members[i1 as usize].as_str()));
    }

    #[test]
    fn empty_ring_has_no_owner_and_bad_settings_are_refused() {
        assert_eq!(ring(&[]).owner("ns/sa"), None);
        assert!(Ring::new(["a"], RingSettings { minimum_ring_size: 10, maximum_ring_size: 5 }).is_err());
        assert_eq!(Ring::new([""], RingSettings::default()), Err(RingError::EmptyId));
    }

    #[test]
    fn removing_a_member_moves_a_bounded_share_and_adding_it_back_restores_all() {
        let keys: Vec<String> = (0..10_000).map(|i| format!("ns-{}/sa-{}", i % 97, i)).collect();
        let four = ring(&["fe-a", "fe-b", "fe-c", "fe-d"]);
        let before = owners(&four, &keys);
        let mut per_member: HashMap<&str, usize> = HashMap::new();
        for o in &before {
            *per_member.entry(o.as_str()).or_default() += 1;
        }
        assert_eq!(per_member.len(), 4);
        assert!(per_member.values().all(|&n| n > 1_500), "unbalanced: {per_member:?}");

        // Envoy's ring gives every host ring_size/n entries, so with one host fewer each remaining
        // host gets a third more entries (342 instead of 256): besides the removed host's quarter,
        // those new entries (a quarter of the new ring) take keys from the other remaining hosts
        // half of the time. Expected share moved: 1/4 + 1/4 * 1/2 = 3/8.
        let three = ring(&["fe-a", "fe-b", "fe-d"]);
        let after = owners(&three, &keys);
        let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
        let share = moved as f64 / keys.len() as f64;
        println!("ring hash, 4 -> 3 members: {moved} of {} keys moved ({:.1}%)", keys.len(), share * 100.0);
        assert!((0.30..=0.45).contains(&share), "moved {share:.3} of the keys");
        assert!(after.iter().all(|o| o != "fe-c"));

        let back = ring(&["fe-a", "fe-b", "fe-c", "fe-d"]);
        assert_eq!(owners(&back, &keys), before);
    }
}
