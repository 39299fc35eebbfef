//! A Maglev lookup table over member ids, built the way Envoy's Maglev load balancer builds it.
//!
//! Envoy's algorithm (source/extensions/load_balancing_policies/maglev/maglev_lb.cc, the host weight
//! normalization in source/common/upstream/thread_aware_lb_impl.cc), itself listing 1 of the Maglev
//! paper (Eisenbud et al., NSDI 2016, section 3.4) with weights added:
//! - each host is hashed by its key (here the member id: Envoy's `envoy.lb` `hash_key`);
//! - hosts are sorted by that key (bytewise), so the endpoint order does not matter;
//! - a host's preference list is `(offset + skip * j) % table_size` for j = 0, 1, ..., with
//!   `offset = xxHash64(key, seed 0) % table_size` and `skip = xxHash64(key, seed 1) % (table_size - 1) + 1`
//!   (the table size is prime, so every list visits every slot);
//! - weights are normalized to `weight / total weight` (doubles) and `max` is the largest of them;
//! - rounds 1, 2, ... go over the hosts in sorted order until the table is full; in round `r` a host
//!   whose running target exceeds `r * weight` sits out, otherwise its target grows by `max` and it
//!   takes the next free slot of its preference list (so a host of the largest weight takes a slot
//!   every round, one of a third of that weight every third round);
//! - a request hash `h` goes to `table[h % table_size]`; a header hash policy hashes the header value
//!   with xxHash64, seed 0 ([`super::key_hash`]).
//!
//! Envoy may store the table compactly (host indexes in a bit array) or as host pointers; both are
//! filled by the same procedure and choose the same hosts.

use xxhash_rust::xxh64::xxh64;

use super::key_hash;

/// Table settings, as in Envoy's `maglev_lb_config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaglevSettings {
    /// `table_size`: a prime, at most [`MaglevSettings::MAX_TABLE_SIZE`] (Envoy's default 65537).
    pub table_size: u64,
}

impl MaglevSettings {
    /// Envoy's default table size (the paper's recommendation).
    pub const DEFAULT_TABLE_SIZE: u64 = 65_537;
    /// The largest table size Envoy accepts.
    pub const MAX_TABLE_SIZE: u64 = 5_000_011;
}

impl Default for MaglevSettings {
    fn default() -> Self {
        MaglevSettings { table_size: MaglevSettings::DEFAULT_TABLE_SIZE }
    }
}

/// Members or settings Envoy would refuse (or hash ambiguously).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaglevError {
    /// The table size is not a prime, or is above [`MaglevSettings::MAX_TABLE_SIZE`].
    #[error("maglev: table_size {0} is not a prime of at most 5000011")]
    TableSize(u64),
    /// A member id is empty (Envoy would hash the endpoint's address instead).
    #[error("maglev: empty member id")]
    EmptyId,
    /// Two members have the same id: Envoy would order them arbitrarily (by pointer).
    #[error("maglev: member id {0:?} given twice")]
    DuplicateId(String),
    /// A weight is 0 (Envoy requires at least 1), or the weights add up to more than `u32::MAX`.
    #[error("maglev: weights must be at least 1 and add up to at most 4294967295")]
    Weight,
}

/// A Maglev lookup table over member ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Maglev {
    /// Member ids, sorted (Envoy's table building order).
    members: Vec<String>,
    /// Slot → index into `members`; empty when there are no members.
    table: Vec<u32>,
    /// Slots each member holds (Envoy's `min/max_entries_per_host` gauges are their extremes).
    counts: Vec<u64>,
}

/// One host while the table is being filled.
struct Build {
    offset: u64,
    skip: u64,
    weight: f64,
    target: f64,
    next: u64,
}

const EMPTY: u32 = u32::MAX;

fn is_prime(n: u64) -> bool {
    n >= 2 && (2..).take_while(|d| d * d <= n).all(|d| !n.is_multiple_of(d))
}

impl Maglev {
    /// The table over `member_ids`, all of weight 1 (as the frontends' endpoints are). The order
    /// does not matter: members are sorted by id, as Envoy sorts hosts by hash key.
    pub fn new<I, S>(member_ids: I, settings: MaglevSettings) -> Result<Maglev, MaglevError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Maglev::weighted(member_ids.into_iter().map(|id| (id, 1)), settings)
    }

    /// The table over `(member id, endpoint load_balancing_weight)` pairs.
    pub fn weighted<I, S>(members: I, settings: MaglevSettings) -> Result<Maglev, MaglevError>
    where
        I: IntoIterator<Item = (S, u32)>,
        S: Into<String>,
    {
        let size = settings.table_size;
        if size > MaglevSettings::MAX_TABLE_SIZE || !is_prime(size) {
            return Err(MaglevError::TableSize(size));
        }
        let mut members: Vec<(String, u32)> = members.into_iter().map(|(id, w)| (id.into(), w)).collect();
        if members.iter().any(|(id, _)| id.is_empty()) {
            return Err(MaglevError::EmptyId);
        }
        members.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        if let Some(pair) = members.windows(2).find(|p| p[0].0 == p[1].0) {
            return Err(MaglevError::DuplicateId(pair[0].0.clone()));
        }
        let total: u64 = members.iter().map(|&(_, w)| u64::from(w)).sum();
        if members.iter().any(|&(_, w)| w == 0) || total > u64::from(u32::MAX) {
            return Err(MaglevError::Weight);
        }
        Ok(Maglev::fill(&members, total, size))
    }

    /// Fills the table taking `members` (valid, weights adding up to `total`) in the given order.
    fn fill(members: &[(String, u32)], total: u64, size: u64) -> Maglev {
        let ids: Vec<String> = members.iter().map(|(id, _)| id.clone()).collect();
        if members.is_empty() {
            return Maglev { members: ids, table: Vec::new(), counts: Vec::new() };
        }

        // Normalized weights in the same double arithmetic as Envoy (one priority, no localities).
        let mut max_weight = 0.0_f64;
        let mut hosts: Vec<Build> = members
            .iter()
            .map(|(id, w)| {
                let weight = f64::from(*w) * 1.0 / total as f64;
                max_weight = max_weight.max(weight);
                let offset = xxh64(id.as_bytes(), 0) % size;
                let skip = xxh64(id.as_bytes(), 1) % (size - 1) + 1;
                Build { offset, skip, weight, target: 0.0, next: 0 }
            })
            .collect();

        let slots = usize::try_from(size).expect("table size fits in memory");
        let mut table = vec![EMPTY; slots];
        let mut counts = vec![0_u64; hosts.len()];
        let mut filled = 0_usize;
        let mut round: u32 = 1;
        while filled < slots {
            for (index, host) in hosts.iter_mut().enumerate() {
                if filled == slots {
                    break;
                }
                if f64::from(round) * host.weight < host.target {
                    continue;
                }
                host.target += max_weight;
                let slot = loop {
                    let slot = (host.offset.wrapping_add(host.skip.wrapping_mul(host.next)) % size) as usize;
                    if table[slot] == EMPTY {
                        break slot;
                    }
                    host.next += 1;
                };
                table[slot] = index as u32;
                host.next += 1;
                counts[index] += 1;
                filled += 1;
            }
            round += 1;
        }
        Maglev { members: ids, table, counts }
    }

    /// The member owning `key` (a [`super::ProxyKey`] value); `None` when there are no members.
    pub fn owner(&self, key: &str) -> Option<&str> {
        self.owner_of_hash(key_hash(key))
    }

    /// The member owning requests with hash `hash`.
    pub fn owner_of_hash(&self, hash: u64) -> Option<&str> {
        if self.table.is_empty() {
            return None;
        }
        let index = self.table[(hash % self.table.len() as u64) as usize];
        self.members.get(index as usize).map(String::as_str)
    }

    /// The member ids, sorted.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// Table slots held by each member, in [`Maglev::members`] order.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// The table size (0 when there are no members).
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// True if the table has no members.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn maglev(ids: &[&str]) -> Maglev {
        Maglev::new(ids.iter().copied(), MaglevSettings::default()).unwrap()
    }

    fn owners(m: &Maglev, keys: &[String]) -> Vec<String> {
        keys.iter().map(|k| m.owner(k).unwrap().to_string()).collect()
    }

    fn keys() -> Vec<String> {
        (0..10_000).map(|i| format!("ns-{}/sa-{}", i % 97, i)).collect()
    }

    #[test]
    fn removing_a_member_moves_about_its_share_and_adding_it_back_restores_all() {
        let keys = keys();
        let four = maglev(&["fe-a", "fe-b", "fe-c", "fe-d"]);
        let before = owners(&four, &keys);
        for id in four.members() {
            let n = before.iter().filter(|o| *o == id).count();
            assert!((2_000..=3_000).contains(&n), "{id} owns {n} of 10000 keys");
        }

        let three = maglev(&["fe-a", "fe-b", "fe-d"]);
        let after = owners(&three, &keys);
        assert!(after.iter().all(|o| o != "fe-c"));
        let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
        let from_removed = before.iter().filter(|o| *o == "fe-c").count();
        let share = moved as f64 / keys.len() as f64;
        println!(
            "maglev, 4 -> 3 members: {moved} of {} keys moved ({:.1}%), {from_removed} of them from the removed member",
            keys.len(),
            share * 100.0
        );
        // At least the removed member's quarter must move; Maglev moves little beyond it.
        assert!((0.15..=0.35).contains(&share), "moved {:.1}% of the keys", share * 100.0);

        let back = maglev(&["fe-d", "fe-c", "fe-b", "fe-a"]);
        assert_eq!(owners(&back, &keys), before);
    }

    #[test]
    fn the_table_is_deterministic_and_independent_of_member_order() {
        let a = maglev(&["fe-a", "fe-b", "fe-c"]);
        let b = maglev(&["fe-c", "fe-a", "fe-b"]);
        assert_eq!(a, b);
        assert_eq!(a.members(), ["fe-a", "fe-b", "fe-c"]);
        assert_eq!(a, maglev(&["fe-a", "fe-b", "fe-c"]));
        let keys = keys();
        assert_eq!(owners(&a, &keys), owners(&b, &keys));
    }

    #[test]
    fn hosts_are_taken_in_id_order_which_decides_contested_slots() {
        // The members and endpoint order of the 3-host Maglev case in tests/ring_vs_envoy.rs, which
        // routes these keys through Envoy too: filled in endpoint order, they would change owner.
        let order = ["frontend-2", "frontend-0", "frontend-1"];
        let order_sensitive = ["ns-5/sa-22062", "ns-3/sa-34870", "ns-4/sa-35508", "ns-6/sa-44876"];
        let sorted = maglev(&order);
        let members: Vec<(String, u32)> = order.iter().map(|id| (id.to_string(), 1)).collect();
        let unsorted = Maglev::fill(&members, 3, MaglevSettings::DEFAULT_TABLE_SIZE);
        let slots = (0..sorted.len() as u64).filter(|&s| sorted.owner_of_hash(s) != unsorted.owner_of_hash(s)).count();
        println!("maglev, 3 members filled in endpoint order instead of id order: {slots} slots change owner");
        assert!((1..100).contains(&slots), "{slots}");
        for key in order_sensitive {
            assert_ne!(sorted.owner(key), unsorted.owner(key), "{key}");
        }
    }

    #[test]
    fn equal_weights_fill_the_table_evenly() {
        for ids in [&["a", "b"][..], &["fe-a", "fe-b", "fe-c"], &["fe-a", "fe-b", "fe-c", "fe-d"]] {
            let m = maglev(ids);
            assert_eq!(m.len(), 65_537);
            assert_eq!(m.counts().iter().sum::<u64>(), 65_537);
            // Hosts take a slot each in turn: counts differ by at most one.
            let (min, max) = (m.counts().iter().min().unwrap(), m.counts().iter().max().unwrap());
            assert!(max - min <= 1, "{ids:?}: {:?}", m.counts());
            for (i, id) in m.members().iter().enumerate() {
                let held = m.table.iter().filter(|&&s| s as usize == i).count() as u64;
                assert_eq!(held, m.counts()[i], "{id}");
            }
        }
    }

    #[test]
    fn weights_scale_the_slots() {
        let m = Maglev::weighted([("a", 1), ("b", 2), ("c", 3)], MaglevSettings { table_size: 65_537 }).unwrap();
        let c = m.counts();
        assert_eq!(c.iter().sum::<u64>(), 65_537);
        // c takes a slot every round, b two rounds in three, a one in three: 1/6, 2/6, 3/6.
        for (count, weight) in c.iter().zip([1.0, 2.0, 3.0]) {
            let expected = 65_537.0 * weight / 6.0;
            assert!((*count as f64 - expected).abs() <= 2.0, "{c:?}");
        }
    }

    #[test]
    fn lookup_takes_the_hash_modulo_the_table_size() {
        let m = Maglev::new(["a", "b", "c"], MaglevSettings { table_size: 13 }).unwrap();
        assert_eq!(m.counts(), [5, 4, 4]);
        for slot in 0..13_u64 {
            let expected = m.members()[m.table[slot as usize] as usize].as_str();
            assert_eq!(m.owner_of_hash(slot), Some(expected));
            assert_eq!(m.owner_of_hash(slot + 13 * 1_000_003), Some(expected));
        }
        let h = key_hash("ns/sa");
        assert_eq!(m.owner("ns/sa"), m.owner_of_hash(h % 13));
    }

    #[test]
    fn empty_table_has_no_owner_and_bad_input_is_refused() {
        let empty = maglev(&[]);
        assert!(empty.is_empty());
        assert_eq!(empty.owner("ns/sa"), None);
        for size in [0, 1, 65_536, 5_000_011 + 2 * 3 * 5 * 7] {
            assert_eq!(Maglev::new(["a"], MaglevSettings { table_size: size }), Err(MaglevError::TableSize(size)));
        }
        assert!(Maglev::new(["a"], MaglevSettings { table_size: 5_000_011 }).is_ok());
        assert_eq!(Maglev::new(["a", ""], MaglevSettings::default()), Err(MaglevError::EmptyId));
        assert_eq!(Maglev::new(["b", "a", "b"], MaglevSettings::default()), Err(MaglevError::DuplicateId("b".into())));
        assert_eq!(Maglev::weighted([("a", 0)], MaglevSettings::default()), Err(MaglevError::Weight));
        assert_eq!(Maglev::weighted([("a", u32::MAX), ("b", 1)], MaglevSettings::default()), Err(MaglevError::Weight));
    }
}
