//! What differs between what a proxy holds and what it should hold: the resources to send (new,
//! or with other content) and the names to remove. Versions are content hashes, so identical
//! resources have identical versions on every frontend and across reconnects.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::isolation::{Holding, Piece};
use super::names::NameSet;

/// The resources of `next` the proxy does not hold at that content (`held` gives the hash it
/// holds of a name), in name order.
pub fn updated(next: &Holding, held: impl Fn(&str) -> Option<u64>) -> Vec<Piece> {
    next.pieces().into_iter().filter(|p| held(p.name()) != Some(p.hash())).collect()
}

/// What a delta proxy holds of one type.
#[derive(Debug, Clone)]
pub enum Held {
    /// Exactly what a response's holding carries: shared with the cache, nothing copied per
    /// stream (the common case, once a response is sent).
    Exactly(Holding),
    /// Resource name → content hash: what a reconnecting proxy declared it holds, or what it
    /// holds between a push and its deferred removals.
    Listed(BTreeMap<String, u64>),
}

impl Default for Held {
    fn default() -> Self {
        Held::Listed(BTreeMap::new())
    }
}

impl Held {
    /// The content hash held of `name`.
    pub fn get(&self, name: &str) -> Option<u64> {
        match self {
            Held::Exactly(holding) => holding.get(name).map(|p| p.hash()),
            Held::Listed(map) => map.get(name).copied(),
        }
    }

    /// Whether this is a whole generation as selected by `names`: what the proxy holds then
    /// changes only when the view's generation does.
    pub fn is_whole_under(&self, names: Option<&NameSet>) -> bool {
        matches!(self, Held::Exactly(Holding::Whole { names: n, .. }) if n.as_ref() == names)
    }

    /// Forgets `name` (the proxy dropped it).
    pub fn forget(&mut self, name: &str) {
        if self.get(name).is_some() {
            let mut map = std::mem::take(self).into_listed();
            map.remove(name);
            *self = Held::Listed(map);
        }
    }

    /// This after the proxy applied `updated` and `removed`.
    pub fn apply(&mut self, updated: &[Piece], removed: &[String]) {
        if updated.is_empty() && removed.iter().all(|n| self.get(n).is_none()) {
            return;
        }
        let mut map = std::mem::take(self).into_listed();
        for piece in updated {
            map.insert(piece.name().to_string(), piece.hash());
        }
        for name in removed {
            map.remove(name);
        }
        *self = Held::Listed(map);
    }

    /// The names and hashes held, in name order.
    fn entries(&self) -> Vec<(&str, u64)> {
        match self {
            Held::Exactly(holding) => holding.entries(),
            Held::Listed(map) => map.iter().map(|(n, h)| (n.as_str(), *h)).collect(),
        }
    }

    fn into_listed(self) -> BTreeMap<String, u64> {
        match self {
            Held::Exactly(holding) => holding.entries().into_iter().map(|(n, h)| (n.to_string(), h)).collect(),
            Held::Listed(map) => map,
        }
    }
}

/// What a proxy holding `held` lacks of `next` (new resources, or other content, and those
/// named in `resend` whatever it holds), and the names it holds that `next` has not: both in
/// name order.
pub fn diff(held: &Held, next: &Holding, resend: &BTreeSet<String>) -> (Vec<Piece>, Vec<String>) {
    if let (Held::Exactly(Holding::Whole { generated: a, names: na }), Holding::Whole { generated: b, names: nb }) =
        (held, next)
    {
        // The very generation under the same names (most types of most pushes): only what must
        // be sent again, without walking the rest.
        if Arc::ptr_eq(a, b) && na == nb {
            let again = resend.iter().filter_map(|name| next.get(name)).collect();
            return (again, Vec::new());
        }
    }
    let (held, next) = (held.entries(), next.pieces());
    let (mut updated, mut removed) = (Vec::new(), Vec::new());
    let (mut h, mut n) = (held.iter().peekable(), next.into_iter().peekable());
    loop {
        match (h.peek(), n.peek()) {
            (Some(&&(held_name, hash)), Some(piece)) => match held_name.cmp(piece.name()) {
                Ordering::Less => {
                    removed.push(held_name.to_string());
                    h.next();
                }
                Ordering::Greater => updated.extend(n.next()),
                Ordering::Equal => {
                    let again = hash != piece.hash() || resend.contains(held_name);
                    h.next();
                    updated.extend(n.next().filter(|_| again));
                }
            },
            (Some(&&(held_name, _)), None) => {
                removed.push(held_name.to_string());
                h.next();
            }
            (None, Some(_)) => updated.extend(n.next()),
            (None, None) => return (updated, removed),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use envoy_types::pb::google::protobuf::Any;

    use super::*;
    use crate::envoy::Resource;
    use crate::xds::cache::Generated;

    fn holding(versions: &[(&str, u8)]) -> Holding {
        let resources = versions
            .iter()
            .map(|(name, v)| Resource { name: name.to_string(), body: Any { type_url: "t".into(), value: vec![*v] } })
            .collect();
        Holding::Whole { generated: Arc::new(Generated::from_resources(resources)), names: None }
    }

    fn listed(h: &Holding) -> Held {
        Held::Listed(h.entries().into_iter().map(|(n, hash)| (n.to_string(), hash)).collect())
    }

    fn names_of(pieces: &[Piece]) -> Vec<&str> {
        pieces.iter().map(|p| p.name()).collect()
    }

    #[test]
    fn only_new_and_changed_resources_are_sent_and_gone_ones_removed() {
        let v1 = holding(&[("a", 1), ("b", 1), ("c", 1)]);
        let v2 = holding(&[("a", 1), ("b", 2), ("d", 1)]);
        let none = BTreeSet::new();
        // The same answer whether the proxy's holding is shared or listed name by name.
        for held in [Held::Exactly(v1.clone()), listed(&v1)] {
            let (updated, removed) = diff(&held, &v2, &none);
            assert_eq!((names_of(&updated), removed), (vec!["b", "d"], vec!["c".to_string()]));
            let (updated, removed) = diff(&held, &v1, &none);
            assert!(updated.is_empty() && removed.is_empty(), "nothing changed, nothing sent");
            // What must be sent again is, even unchanged.
            let resend = ["a".to_string(), "gone".to_string()].into_iter().collect();
            assert_eq!(names_of(&diff(&held, &v1, &resend).0), ["a"]);
        }
        let names: Vec<String> = updated(&v2, |n| listed(&v1).get(n)).iter().map(|p| p.name().to_string()).collect();
        assert_eq!(names, ["b", "d"]);
    }

    #[test]
    fn what_is_held_under_a_subset_of_names_is_only_that() {
        let all = holding(&[("a", 1), ("b", 1), ("c", 1)]);
        let Holding::Whole { generated, .. } = &all else { unreachable!() };
        let some = Holding::Whole { generated: generated.clone(), names: Some(NameSet::new(["a", "c"])) };
        let held = Held::Exactly(some.clone());
        assert_eq!((held.get("a"), held.get("b")), (all.get("a").map(|p| p.hash()), None));
        assert!(held.is_whole_under(Some(&NameSet::new(["a", "c"]))) && !held.is_whole_under(None));
        let (updated, removed) = diff(&held, &all, &BTreeSet::new());
        assert_eq!((names_of(&updated), removed), (vec!["b"], Vec::<String>::new()));
        let (updated, removed) = diff(&Held::Exactly(all), &some, &BTreeSet::new());
        assert_eq!((names_of(&updated), removed), (Vec::<&str>::new(), vec!["b".to_string()]));
    }

    #[test]
    fn versions_round_trip_and_foreign_ones_never_match() {
        use crate::xds::resource_version::{parse_version, resource_version, FOREIGN_VERSION};
        let v = holding(&[("a", 1)]);
        let hash = v.pieces()[0].hash();
        assert_eq!(parse_version(&resource_version(hash)), hash);
        assert_eq!(resource_version(0x1f).len(), 16);
        assert_eq!(parse_version("1.2.3"), FOREIGN_VERSION);
        assert_eq!(parse_version("1f"), FOREIGN_VERSION, "not one of ours: sent again");
    }

    #[test]
    fn the_same_content_has_the_same_version_in_every_generation() {
        // Two generations (as two frontends or two snapshots build them) agree on versions.
        let (x, y) = (holding(&[("a", 7), ("b", 1)]), holding(&[("a", 7), ("b", 2)]));
        assert_eq!(x.get("a").map(|p| p.hash()), y.get("a").map(|p| p.hash()));
        assert_ne!(x.get("b").map(|p| p.hash()), y.get("b").map(|p| p.hash()));
    }

    #[test]
    fn applying_a_response_updates_what_is_held() {
        let v1 = holding(&[("a", 1), ("b", 1)]);
        let v2 = holding(&[("b", 2), ("c", 1)]);
        let mut held = Held::Exactly(v1);
        held.apply(&[v2.get("b").expect("b"), v2.get("c").expect("c")], &["a".into()]);
        held.forget("c");
        held.forget("never held");
        let Held::Listed(map) = held else { panic!("a changed holding is listed") };
        assert_eq!(map, [("b".to_string(), v2.get("b").expect("b").hash())].into_iter().collect());
    }
}
