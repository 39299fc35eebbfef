//! What differs between what a proxy holds and what it should hold: the resources to send (new,
//! or with other content) and the names to remove. Versions are content hashes, so identical
//! resources have identical versions on every frontend and across reconnects.

use std::collections::BTreeMap;

use super::isolation::{Holding, Piece};

/// What a proxy holds of one type: resource name → content hash.
pub type Held = BTreeMap<String, u64>;

/// The hash standing for a version the proxy sent that is not one of ours: matches nothing
/// real (save a 2^-64 chance), so that resource is sent again.
const FOREIGN_VERSION: u64 = u64::MAX;

/// The delta `version` of a resource with content hash `hash`.
pub fn resource_version(hash: u64) -> String {
    format!("{hash:016x}")
}

/// The content hash a delta `version` stands for.
pub fn parse_version(version: &str) -> u64 {
    match u64::from_str_radix(version, 16) {
        Ok(hash) if version.len() == 16 => hash,
        _ => FOREIGN_VERSION,
    }
}

/// The resources of `next` the proxy does not hold at that content (`held` gives the hash it
/// holds of a name), in name order.
pub fn updated(next: &Holding, held: impl Fn(&str) -> Option<u64>) -> Vec<Piece> {
    next.pieces().into_iter().filter(|p| held(p.name()) != Some(p.hash())).collect()
}

/// Names in `held` that `next` no longer has, in name order.
pub fn removed(held: &Held, next: &Holding) -> Vec<String> {
    held.keys().filter(|name| next.get(name).is_none()).cloned().collect()
}

/// `held` after the proxy applied `updated` and `removed`.
pub fn apply(held: &mut Held, updated: &[(String, u64)], removed: &[String]) {
    for (name, hash) in updated {
        held.insert(name.clone(), *hash);
    }
    for name in removed {
        held.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use envoy_types::pb::google::protobuf::Any;

    use super::*;
    use crate::xds::cache::Generated;
    use crate::xds::generate::Resource;

    fn holding(versions: &[(&str, u8)]) -> Holding {
        let resources = versions
            .iter()
            .map(|(name, v)| Resource { name: name.to_string(), body: Any { type_url: "t".into(), value: vec![*v] } })
            .collect();
        Holding::Whole { generated: Arc::new(Generated::from_resources(resources)), names: None }
    }

    fn held_of(h: &Holding) -> Held {
        h.pieces().iter().map(|p| (p.name().to_string(), p.hash())).collect()
    }

    #[test]
    fn only_new_and_changed_resources_are_sent_and_gone_ones_removed() {
        let v1 = holding(&[("a", 1), ("b", 1), ("c", 1)]);
        let held = held_of(&v1);
        let v2 = holding(&[("a", 1), ("b", 2), ("d", 1)]);
        let names: Vec<String> = updated(&v2, |n| held.get(n).copied()).iter().map(|p| p.name().to_string()).collect();
        assert_eq!(names, ["b", "d"]);
        assert_eq!(removed(&held, &v2), ["c"]);
        assert!(updated(&v1, |n| held.get(n).copied()).is_empty(), "nothing changed, nothing sent");
    }

    #[test]
    fn versions_round_trip_and_foreign_ones_never_match() {
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
        let mut held: Held = [("a".to_string(), 1), ("b".to_string(), 1)].into_iter().collect();
        apply(&mut held, &[("b".into(), 2), ("c".into(), 1)], &["a".into()]);
        assert_eq!(held, [("b".to_string(), 2), ("c".to_string(), 1)].into_iter().collect());
    }
}
