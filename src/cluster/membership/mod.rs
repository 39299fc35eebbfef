//! Frontend membership through etcd: each frontend registers `/meshpilot/frontends/<id>` =
//! its advertised xDS address under a kept-alive lease ([`Registration`]); anyone watches the
//! prefix for the current member set ([`MembersWatch`]).
//!
//! ```ignore
//! let client = meshpilot::cluster::etcd::connect_with_tls(&endpoints, &tls).await?;
//! let registration = Registration::new(client.clone(), MembershipSettings::new("fe-0", "10.0.0.5:15010"));
//! tokio::spawn(registration.run(shutdown_signal)); // revokes (deregisters at once) on shutdown
//! let watch = MembersWatch::new(client, DEFAULT_PREFIX);
//! let members = watch.members(); // watch::Receiver<Members>
//! tokio::spawn(watch.run(std::future::pending()));
//! ```

mod members_watch;
mod registration;

use std::time::Duration;

pub use members_watch::MembersWatch;
pub use registration::Registration;

/// The etcd prefix frontends register under.
pub const DEFAULT_PREFIX: &str = "/meshpilot/frontends/";

/// Default lease TTL of a registration.
pub const DEFAULT_TTL: Duration = Duration::from_secs(5);

/// A registered frontend.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Member {
    /// Member id (the key below the prefix; also the `hash_key` of its endpoint in the load balancer).
    pub id: String,
    /// Its advertised xDS address.
    pub addr: String,
}

/// A member set, sorted by id, ids unique.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Members(Vec<Member>);

impl Members {
    /// The set of `members`, sorted by id; of duplicate ids the last one is kept.
    pub fn new(members: impl IntoIterator<Item = Member>) -> Self {
        let mut all: Vec<Member> = members.into_iter().collect();
        // Stable sort keeps input order among equal ids, so reversing before dedup keeps the last.
        all.reverse();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all.dedup_by(|a, b| a.id == b.id);
        Members(all)
    }

    /// The members, sorted by id.
    pub fn as_slice(&self) -> &[Member] {
        &self.0
    }

    /// The ids, sorted.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|m| m.id.as_str())
    }

    /// The address of member `id`.
    pub fn addr(&self, id: &str) -> Option<&str> {
        self.0.binary_search_by(|m| m.id.as_str().cmp(id)).ok().map(|i| self.0[i].addr.as_str())
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True if there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// How a frontend registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipSettings {
    /// Key prefix ([`DEFAULT_PREFIX`]); the key is prefix + id.
    pub prefix: String,
    /// Member id: unique among frontends, no `/`.
    pub id: String,
    /// The xDS address proxies (or the load balancer) reach this frontend at.
    pub addr: String,
    /// Lease TTL ([`DEFAULT_TTL`]): how long a frontend that died stays listed.
    pub ttl: Duration,
}

impl MembershipSettings {
    /// Settings with the default prefix and TTL.
    pub fn new(id: impl Into<String>, addr: impl Into<String>) -> Self {
        MembershipSettings { prefix: DEFAULT_PREFIX.to_string(), id: id.into(), addr: addr.into(), ttl: DEFAULT_TTL }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: &str, addr: &str) -> Member {
        Member { id: id.into(), addr: addr.into() }
    }

    #[test]
    fn members_are_sorted_and_unique() {
        let ms = Members::new([m("b", "2"), m("a", "1"), m("b", "3")]);
        assert_eq!(ms.as_slice(), &[m("a", "1"), m("b", "3")]);
        assert_eq!(ms.addr("b"), Some("3"));
        assert_eq!(ms.addr("c"), None);
        assert_eq!(ms.ids().collect::<Vec<_>>(), ["a", "b"]);
    }
}
