//! The resource names a proxy subscribed to, as a shared set of name hashes. An EDS
//! subscription names every cluster of the mesh (thousands per proxy); the names themselves
//! are held once, in the generation cache, so each proxy keeps 8 bytes per name instead of a
//! copy of every string.

use std::sync::Arc;

use xxhash_rust::xxh64::xxh64;

/// A set of resource names, held as sorted 64-bit hashes; cheap to clone (shared).
#[derive(Debug, Clone, Default, Eq)]
pub struct NameSet {
    hashes: Arc<[u64]>,
}

impl PartialEq for NameSet {
    /// By pointer first: a subscription and what was sent under it share one set.
    fn eq(&self, other: &NameSet) -> bool {
        Arc::ptr_eq(&self.hashes, &other.hashes) || self.hashes == other.hashes
    }
}

/// The hash a name is held as.
fn hash(name: &str) -> u64 {
    xxh64(name.as_bytes(), 0)
}

impl NameSet {
    /// The set of `names`.
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> NameSet {
        let mut hashes: Vec<u64> = names.into_iter().map(hash).collect();
        hashes.sort_unstable();
        hashes.dedup();
        NameSet { hashes: hashes.into() }
    }

    /// The set of `names`, sharing `held` when it is the same set (an ACK repeats the names).
    pub fn same_or_new(held: Option<&NameSet>, names: &[String]) -> NameSet {
        let fresh = NameSet::new(names.iter().map(String::as_str));
        match held {
            Some(held) if *held == fresh => held.clone(),
            _ => fresh,
        }
    }

    /// Whether `name` is in the set.
    pub fn contains(&self, name: &str) -> bool {
        self.hashes.binary_search(&hash(name)).is_ok()
    }

    /// Names in the set.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// The set with `added` in and `removed` out.
    pub fn changed<'a>(
        &self,
        added: impl IntoIterator<Item = &'a str>,
        removed: impl IntoIterator<Item = &'a str>,
    ) -> NameSet {
        let removed: Vec<u64> = removed.into_iter().map(hash).collect();
        let mut hashes: Vec<u64> =
            self.hashes.iter().copied().chain(added.into_iter().map(hash)).filter(|h| !removed.contains(h)).collect();
        hashes.sort_unstable();
        hashes.dedup();
        NameSet { hashes: hashes.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn membership_order_and_duplicates() {
        let set = NameSet::new(["b", "a", "b"]);
        assert_eq!(set.len(), 2);
        assert!(set.contains("a") && set.contains("b") && !set.contains("c"));
        assert_eq!(set, NameSet::new(["a", "b"]), "order does not matter");
        let changed = set.changed(["c"], ["a"]);
        assert!(!changed.contains("a") && changed.contains("b") && changed.contains("c"));
        assert!(NameSet::default().is_empty());
    }

    #[test]
    fn the_same_names_share_the_held_set() {
        let names: Vec<String> = (0..1000).map(|i| format!("outbound|80||svc-{i}.ns.svc.cluster.local")).collect();
        let held = NameSet::same_or_new(None, &names);
        let mut reordered = names.clone();
        reordered.reverse();
        let again = NameSet::same_or_new(Some(&held), &reordered);
        assert!(Arc::ptr_eq(&held.hashes, &again.hashes), "an ACK's names reuse the set");
        let fewer = NameSet::same_or_new(Some(&held), &names[1..]);
        assert!(!fewer.contains(&names[0]) && fewer.len() == 999);
    }
}
