//! What a delta stream subscribed to, per type: the wildcard (every resource of the type) and
//! names, changed by `resource_names_subscribe` / `resource_names_unsubscribe` as Envoy sends
//! them (an empty first subscribe of CDS or LDS, or `*`, is the wildcard).

use super::names::NameSet;

use super::TypeUrl;

/// The name that stands for every resource of a type.
pub const WILDCARD: &str = "*";

/// One type's subscription on a delta stream.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Subscription {
    wildcard: bool,
    /// Shared with what was sent under them; rebuilt only when a request changes them.
    names: NameSet,
}

/// What one request changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SubscriptionChange {
    /// Names newly subscribed (the proxy waits for an answer about each).
    pub subscribed: Vec<String>,
    /// Names no longer subscribed (and not covered by the wildcard): the proxy dropped them.
    pub dropped: Vec<String>,
    /// Whether the wildcard was turned on.
    pub wildcard_added: bool,
}

impl SubscriptionChange {
    /// Whether the proxy now waits for resources it did not ask for before.
    pub fn wants_more(&self) -> bool {
        self.wildcard_added || !self.subscribed.is_empty()
    }
}

impl Subscription {
    /// Applies a request's subscribe and unsubscribe lists; `first` is the stream's first
    /// request for `type_url`.
    pub fn apply(
        &mut self,
        type_url: TypeUrl,
        first: bool,
        subscribe: &[String],
        unsubscribe: &[String],
    ) -> SubscriptionChange {
        let mut change = SubscriptionChange::default();
        // Envoy's legacy wildcard: CDS and LDS subscribe to everything by naming nothing.
        if first && subscribe.is_empty() && !type_url.is_named() && !self.wildcard {
            self.wildcard = true;
            change.wildcard_added = true;
        }
        let mut newly = std::collections::HashSet::new();
        for name in subscribe {
            if name == WILDCARD {
                change.wildcard_added |= !self.wildcard;
                self.wildcard = true;
            } else if !self.names.contains(name) && newly.insert(name.as_str()) {
                change.subscribed.push(name.clone());
            }
        }
        let mut removed = Vec::new();
        for name in unsubscribe {
            if name == WILDCARD {
                self.wildcard = false;
            } else if self.names.contains(name) || newly.contains(name.as_str()) {
                removed.push(name.as_str());
                if !self.wildcard {
                    change.dropped.push(name.clone());
                }
            }
        }
        if !newly.is_empty() || !removed.is_empty() {
            self.names = self.names.changed(newly, removed);
        }
        change
    }

    /// The names subscribed to; `None` under the wildcard (everything).
    pub fn names(&self) -> Option<&NameSet> {
        (!self.wildcard).then_some(&self.names)
    }

    /// Whether `name` is subscribed (by name or the wildcard).
    #[cfg(test)]
    pub fn wants(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_empty_first_subscribe_of_clusters_or_listeners_is_the_wildcard() {
        for t in [TypeUrl::Cluster, TypeUrl::Listener] {
            let mut s = Subscription::default();
            let change = s.apply(t, true, &[], &[]);
            assert!(change.wildcard_added && change.wants_more());
            assert_eq!(s.names(), None);
            assert!(s.wants("anything"));
            // A later empty request (an ACK) changes nothing.
            assert_eq!(s.apply(t, false, &[], &[]), SubscriptionChange::default());
        }
        // Endpoints and routes are only ever named.
        let mut s = Subscription::default();
        assert!(!s.apply(TypeUrl::Endpoint, true, &[], &[]).wants_more());
        assert_eq!(s.names().map(|n| n.len()), Some(0));
    }

    #[test]
    fn a_star_subscribes_to_everything_and_unsubscribing_it_ends_that() {
        let mut s = Subscription::default();
        let change = s.apply(TypeUrl::Cluster, true, &names(&["*", "a"]), &[]);
        assert!(change.wildcard_added);
        assert_eq!(change.subscribed, ["a"]);
        assert_eq!(s.names(), None);
        s.apply(TypeUrl::Cluster, false, &[], &names(&["*"]));
        assert_eq!(s.names(), Some(&NameSet::new(["a"])));
        assert!(!s.wants("b"));
    }

    #[test]
    fn explicit_names_come_and_go() {
        let mut s = Subscription::default();
        let change = s.apply(TypeUrl::Endpoint, true, &names(&["a", "b"]), &[]);
        assert_eq!(change.subscribed, ["a", "b"]);
        let change = s.apply(TypeUrl::Endpoint, false, &names(&["b", "c"]), &names(&["a"]));
        assert_eq!(change.subscribed, ["c"], "b was already subscribed");
        assert_eq!(change.dropped, ["a"]);
        assert!(s.wants("b") && s.wants("c") && !s.wants("a"));
        // Unsubscribing what was never subscribed drops nothing.
        assert!(s.apply(TypeUrl::Endpoint, false, &[], &names(&["zzz"])).dropped.is_empty());
    }
}
