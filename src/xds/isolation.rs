//! One resource a proxy rejects never blocks the rest of its updates.
//!
//! When Envoy NACKs a response, the resources that changed since its last ACK are the suspects.
//! Those its error message names are set aside at once; otherwise the suspects are bisected:
//! half of them are sent beside the versions the proxy already holds, and each ACK or NACK halves
//! what is left, until each bad one is alone. A set-aside resource is replaced by the version the
//! proxy holds (or left out if it holds none) until the resource changes again; every other
//! change keeps flowing. istiod instead stops all updates of the type until the object is fixed.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::google::protobuf::Any;

use super::cache::Generated;
use super::names::NameSet;
use super::response::resources_field_of;
use crate::telemetry::log_text;

/// One resource of a generation, shared: the generation and an index into it.
#[derive(Debug, Clone)]
pub struct Piece {
    generated: Arc<Generated>,
    index: usize,
}

impl Piece {
    /// The resource's name.
    pub fn name(&self) -> &str {
        &self.generated.resources[self.index].name
    }

    /// Hash of its encoded bytes.
    pub fn hash(&self) -> u64 {
        self.generated.hashes[self.index]
    }

    /// The resource.
    pub fn body(&self) -> &Any {
        &self.generated.resources[self.index].body
    }

    /// The resource encoded as the `Any` it is sent as (shared with the cache).
    pub fn encoded(&self) -> &Bytes {
        &self.generated.encoded[self.index]
    }
}

/// What one response of a type carried, and so what the proxy holds once it ACKs it.
#[derive(Debug, Clone)]
pub enum Holding {
    /// A whole generation, as selected by the names the proxy asked for (the common case: no
    /// per-connection copy of anything).
    Whole {
        /// The generation.
        generated: Arc<Generated>,
        /// The names asked for (`None`: all), shared with the subscription.
        names: Option<NameSet>,
    },
    /// A composition: some resources of the newest generation, some the proxy already held.
    Pieces(Arc<Vec<Piece>>),
}

impl Holding {
    /// The resources, in name order.
    pub fn pieces(&self) -> Vec<Piece> {
        match self {
            Holding::Whole { generated, names } => generated
                .select_indices(names.as_ref())
                .into_iter()
                .map(|index| Piece { generated: generated.clone(), index })
                .collect(),
            Holding::Pieces(pieces) => pieces.to_vec(),
        }
    }

    /// How many resources it carries.
    pub fn len(&self) -> usize {
        match self {
            Holding::Whole { generated, names: None } => generated.resources.len(),
            Holding::Whole { generated, names } => generated.select_indices(names.as_ref()).len(),
            Holding::Pieces(pieces) => pieces.len(),
        }
    }

    /// Whether it carries nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The names and content hashes of the resources, in name order.
    pub fn entries(&self) -> Vec<(&str, u64)> {
        match self {
            Holding::Whole { generated, names } => generated
                .select_indices(names.as_ref())
                .into_iter()
                .map(|i| (generated.resources[i].name.as_str(), generated.hashes[i]))
                .collect(),
            Holding::Pieces(pieces) => pieces.iter().map(|p| (p.name(), p.hash())).collect(),
        }
    }

    /// Whether this is all of `generated` (as selected by some names), not a composition.
    pub fn is_whole_of(&self, generated: &Arc<Generated>) -> bool {
        matches!(self, Holding::Whole { generated: g, .. } if Arc::ptr_eq(g, generated))
    }

    /// The resource named `name`, if carried.
    pub fn get(&self, name: &str) -> Option<Piece> {
        match self {
            Holding::Whole { generated, names } => {
                if names.as_ref().is_some_and(|n| !n.contains(name)) {
                    return None;
                }
                generated.find(name).map(|index| Piece { generated: generated.clone(), index })
            }
            Holding::Pieces(pieces) => pieces.binary_search_by(|p| p.name().cmp(name)).ok().map(|i| pieces[i].clone()),
        }
    }

    /// The encoded resources to put in a response (shared with the cache, not copied).
    pub fn encoded(&self) -> Vec<Bytes> {
        match self {
            // The common case, on every push: no pieces are built for a whole generation.
            Holding::Whole { generated, names } => {
                generated.select_indices(names.as_ref()).into_iter().map(|i| generated.encoded[i].clone()).collect()
            }
            Holding::Pieces(pieces) => pieces.iter().map(|p| p.encoded().clone()).collect(),
        }
    }

    /// The encoded resources and them laid out as a response's `resources` field: the
    /// generation's own buffer, shared, when all of it is carried; else the carried ones copied.
    pub fn encoded_with_field(&self) -> (Vec<Bytes>, Bytes) {
        let encoded = self.encoded();
        let field = match self {
            Holding::Whole { generated, .. } if encoded.len() == generated.encoded.len() => generated.field.clone(),
            _ => resources_field_of(&encoded),
        };
        (encoded, field)
    }

    /// A hash of the carried resources, to tell whether a response would change anything.
    pub fn hash(&self) -> u64 {
        let hashes: Vec<u64> = match self {
            Holding::Whole { generated, names } => {
                generated.select_indices(names.as_ref()).into_iter().map(|i| generated.hashes[i]).collect()
            }
            Holding::Pieces(pieces) => pieces.iter().map(Piece::hash).collect(),
        };
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for rh in &hashes {
            rh.hash(&mut h);
        }
        hashes.len().hash(&mut h);
        h.finish()
    }
}

/// A resource version the proxy rejected.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Rejected {
    /// Hash of the rejected bytes: a new version of the resource is tried again.
    #[serde(skip)]
    pub hash: u64,
    /// That version as delta xDS names it (a hash of the content).
    pub version: String,
    /// The proxy's error message.
    pub message: String,
}

/// What a NACK led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NackOutcome {
    /// These resources were set aside; the rest is sent again.
    Isolated(Vec<String>),
    /// No resource is known yet: a smaller set is being tried.
    Bisecting,
    /// Nothing changed since the last ACK to blame: wait for a config change (istiod's behaviour).
    Stuck,
}

#[derive(Debug, Default)]
struct Bisect {
    /// Suspects not yet sent.
    untested: BTreeSet<String>,
    /// Suspects in the response awaiting an answer.
    testing: BTreeSet<String>,
}

impl Bisect {
    /// Moves the first half of the untested suspects into the test; false when nothing is left.
    fn advance(&mut self) -> bool {
        if self.testing.is_empty() {
            let take = self.untested.len().div_ceil(2);
            let next: Vec<String> = self.untested.iter().take(take).cloned().collect();
            for name in next {
                self.untested.remove(&name);
                self.testing.insert(name);
            }
        }
        !self.testing.is_empty()
    }
}

/// The isolation state of one type on one connection.
#[derive(Debug, Default)]
pub struct Isolation {
    /// What the proxy holds: the last response it ACKed.
    acked: Option<Holding>,
    /// Resource versions it rejected, by name.
    rejected: BTreeMap<String, Rejected>,
    bisect: Option<Bisect>,
}

impl Isolation {
    /// What the proxy holds: the last response it ACKed.
    pub fn acked(&self) -> Option<&Holding> {
        self.acked.as_ref()
    }

    /// The rejected resources, by name.
    pub fn rejected(&self) -> &BTreeMap<String, Rejected> {
        &self.rejected
    }

    /// Whether nothing is set aside or being bisected: [`Isolation::compose`] then gives the
    /// whole generation.
    pub fn is_clean(&self) -> bool {
        self.rejected.is_empty() && self.bisect.is_none()
    }

    /// What to send for `generated` under `names`: everything, except rejected versions and
    /// suspects not under test, which are replaced by what the proxy holds.
    pub fn compose(&mut self, generated: &Arc<Generated>, names: Option<&NameSet>) -> Holding {
        // A rejection applies to one version: a changed or removed resource is tried afresh.
        self.rejected.retain(|name, r| generated.find(name).is_some_and(|i| generated.hashes[i] == r.hash));
        if self.rejected.is_empty() && self.bisect.is_none() {
            return Holding::Whole { generated: generated.clone(), names: names.cloned() };
        }
        let mut pieces = Vec::new();
        for index in generated.select_indices(names) {
            let piece = Piece { generated: generated.clone(), index };
            let rejected = self.rejected.get(piece.name()).is_some_and(|r| r.hash == piece.hash());
            let untested = self.bisect.as_ref().is_some_and(|b| b.untested.contains(piece.name()));
            if rejected || untested {
                if let Some(held) = self.acked.as_ref().and_then(|a| a.get(piece.name())) {
                    pieces.push(held);
                }
            } else {
                pieces.push(piece);
            }
        }
        Holding::Pieces(Arc::new(pieces))
    }

    /// The proxy ACKed `sent`. Returns whether a further response is due (the next test).
    pub fn on_ack(&mut self, sent: &Holding) -> bool {
        self.acked = Some(sent.clone());
        let Some(bisect) = self.bisect.as_mut() else { return false };
        // Everything under test was accepted.
        bisect.testing.clear();
        if !bisect.advance() {
            self.bisect = None;
        }
        true
    }

    /// The proxy NACKed `sent` with `message`.
    pub fn on_nack(&mut self, sent: &Holding, message: &str) -> NackOutcome {
        if let Some(bisect) = self.bisect.as_mut() {
            if bisect.testing.len() == 1 {
                let names: Vec<String> = std::mem::take(&mut bisect.testing).into_iter().collect();
                let more = bisect.advance();
                self.reject(sent, &names, message);
                if !more {
                    self.bisect = None;
                }
                return NackOutcome::Isolated(names);
            }
            // The bad one is in the tested half: test half of that, the rest waits.
            let keep = bisect.testing.len() / 2;
            let back: Vec<String> = bisect.testing.iter().skip(keep).cloned().collect();
            for name in back {
                bisect.testing.remove(&name);
                bisect.untested.insert(name);
            }
            return NackOutcome::Bisecting;
        }
        let held = |name: &str| self.acked.as_ref().and_then(|a| a.get(name)).map(|p| p.hash());
        let suspects: Vec<String> = sent
            .pieces()
            .into_iter()
            .filter(|p| held(p.name()) != Some(p.hash()))
            .map(|p| p.name().to_string())
            .collect();
        let named: Vec<String> = suspects.iter().filter(|n| mentions(message, n)).cloned().collect();
        if !named.is_empty() {
            self.reject(sent, &named, message);
            return NackOutcome::Isolated(named);
        }
        match suspects.len() {
            0 => NackOutcome::Stuck,
            1 => {
                self.reject(sent, &suspects, message);
                NackOutcome::Isolated(suspects)
            }
            _ => {
                let mut bisect = Bisect { untested: suspects.into_iter().collect(), testing: BTreeSet::new() };
                bisect.advance();
                self.bisect = Some(bisect);
                NackOutcome::Bisecting
            }
        }
    }

    /// A new snapshot arrived: a bisection of the old one is moot (its rejections stay, per version).
    pub fn on_new_snapshot(&mut self) {
        self.bisect = None;
    }

    fn reject(&mut self, sent: &Holding, names: &[String], message: &str) {
        for name in names {
            if let Some(piece) = sent.get(name) {
                let (hash, version) = (piece.hash(), super::resource_version::resource_version(piece.hash()));
                let message = log_text::truncated(message, super::limits::MAX_NACK_DETAIL_CHARS).to_string();
                self.rejected.insert(name.clone(), Rejected { hash, version, message });
            }
        }
    }
}

/// Whether `message` names `name` as a whole word (so resource `a` is not named by "adding").
fn mentions(message: &str, name: &str) -> bool {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_');
    message
        .match_indices(name)
        .any(|(at, _)| !word(message[..at].chars().next_back()) && !word(message[at + name.len()..].chars().next()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::Resource;

    fn generation(versions: &[(&str, u8)]) -> Arc<Generated> {
        let resources = versions
            .iter()
            .map(|(name, v)| Resource { name: name.to_string(), body: Any { type_url: "t".into(), value: vec![*v] } })
            .collect();
        Arc::new(Generated::from_resources(resources))
    }

    fn names(h: &Holding) -> Vec<(String, u8)> {
        h.pieces().iter().map(|p| (p.name().to_string(), p.body().value[0])).collect()
    }

    #[test]
    fn a_named_resource_is_set_aside_and_the_rest_flows() {
        let mut iso = Isolation::default();
        let v1 = generation(&[("a", 1), ("b", 1), ("c", 1)]);
        let sent = iso.compose(&v1, None);
        iso.on_ack(&sent);
        let v2 = generation(&[("a", 2), ("b", 2), ("c", 1)]);
        let sent = iso.compose(&v2, None);
        assert_eq!(
            iso.on_nack(&sent, "Error adding/updating cluster(s) b: bad"),
            NackOutcome::Isolated(vec!["b".into()])
        );
        let next = iso.compose(&v2, None);
        assert_eq!(names(&next), [("a".into(), 2), ("b".into(), 1), ("c".into(), 1)], "b stays at the held version");
        iso.on_ack(&next);
        // A new version of b is tried again.
        let v3 = generation(&[("a", 2), ("b", 3), ("c", 1)]);
        assert_eq!(names(&iso.compose(&v3, None)), [("a".into(), 2), ("b".into(), 3), ("c".into(), 1)]);
        assert!(iso.rejected().is_empty());
    }

    #[test]
    fn an_unnamed_bad_resource_is_found_by_bisection() {
        let mut iso = Isolation::default();
        let v1 = generation(&[("a", 1)]);
        let first = iso.compose(&v1, None);
        iso.on_ack(&first);
        let v2 = generation(&[("a", 1), ("n1", 1), ("n2", 1), ("n3", 1), ("n4", 1), ("n5", 1)]);
        let bad = "n4";
        let mut sent = iso.compose(&v2, None);
        let mut rounds = 0;
        // A proxy that rejects any response carrying n4, without saying which.
        loop {
            rounds += 1;
            assert!(rounds < 20, "bisection does not end");
            if sent.get(bad).is_some() {
                let outcome = iso.on_nack(&sent, "something is wrong");
                if outcome == NackOutcome::Isolated(vec![bad.into()]) && iso.bisect.is_none() {
                    break;
                }
            } else if !iso.on_ack(&sent) {
                break;
            }
            sent = iso.compose(&v2, None);
        }
        let last = iso.compose(&v2, None);
        assert_eq!(last.get(bad).map(|p| p.name().to_string()), None, "n4 is left out: the proxy never held it");
        assert_eq!(names(&last).len(), 5, "{:?}", names(&last));
        assert!(iso.rejected().contains_key(bad));
    }

    #[test]
    fn names_count_as_whole_words() {
        assert!(mentions(
            "Error adding/updating cluster(s) outbound|80||b.ns.svc.cluster.local: x",
            "outbound|80||b.ns.svc.cluster.local"
        ));
        assert!(!mentions("Error adding/updating cluster(s) b2: x", "b"));
        assert!(!mentions("Error adding", "a"));
        assert!(mentions("route config 80 rejected", "80"));
    }

    #[test]
    fn nothing_to_blame_waits_for_a_change() {
        let mut iso = Isolation::default();
        let v1 = generation(&[("a", 1)]);
        let sent = iso.compose(&v1, None);
        iso.on_ack(&sent);
        assert_eq!(iso.on_nack(&sent, "flaky"), NackOutcome::Stuck);
    }
}
