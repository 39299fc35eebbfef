//! Service hostnames.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A fully qualified service hostname (`reviews.default.svc.cluster.local`) or wildcard (`*.example.com`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Hostname(Arc<str>);

impl Hostname {
    /// Wraps a hostname as written (lower-cased, as DNS names compare).
    pub fn new(name: &str) -> Self {
        Hostname(Arc::from(name.to_ascii_lowercase()))
    }

    /// Qualifies a short name the way Istio does: `reviews` in namespace `ns` becomes
    /// `reviews.ns.svc.<domain>`; names with a dot and wildcards stay as written.
    pub fn qualify(name: &str, namespace: &str, domain: &str) -> Self {
        if name.contains('.') || name == "*" {
            Hostname::new(name)
        } else {
            Hostname::new(&format!("{name}.{namespace}.svc.{domain}"))
        }
    }

    /// The hostname text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is a wildcard (`*` or `*.suffix`).
    pub fn is_wildcard(&self) -> bool {
        self.0.starts_with('*')
    }

    /// Whether `self` (possibly a wildcard) covers `other` (possibly a wildcard).
    pub fn matches(&self, other: &Hostname) -> bool {
        host_matches(self.as_str(), other.as_str())
    }
}

/// Whether pattern `a` covers `b`: equal, `*`, or `*.suffix` covering names (and narrower wildcards) under it.
pub fn host_matches(a: &str, b: &str) -> bool {
    if a == b || a == "*" {
        return true;
    }
    match a.strip_prefix('*') {
        Some(suffix) => {
            let b_rest = b.strip_prefix('*').unwrap_or(b);
            b_rest.ends_with(suffix) && b_rest.len() >= suffix.len()
        }
        None => false,
    }
}

/// Whether two host patterns overlap (either covers the other).
pub fn hosts_overlap(a: &str, b: &str) -> bool {
    host_matches(a, b) || host_matches(b, a)
}

impl fmt::Display for Hostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualifies_short_names() {
        assert_eq!(Hostname::qualify("reviews", "ns", "cluster.local").as_str(), "reviews.ns.svc.cluster.local");
        assert_eq!(Hostname::qualify("a.b", "ns", "cluster.local").as_str(), "a.b");
    }

    #[test]
    fn wildcards_cover_suffixes() {
        assert!(host_matches("*.example.com", "a.example.com"));
        assert!(host_matches("*.example.com", "*.b.example.com"));
        assert!(!host_matches("*.example.com", "example.org"));
        assert!(host_matches("*", "anything"));
        assert!(hosts_overlap("a.example.com", "*.example.com"));
    }
}
