//! Workload identities: SPIFFE ids `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`,
//! as Istio issues and checks them.

use std::fmt;

/// Why a trust domain or a SPIFFE id is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The trust domain is empty or holds characters a SPIFFE trust domain may not.
    #[error("trust domain {0:?} is not a valid SPIFFE trust domain (lowercase letters, digits, '.', '-', '_')")]
    TrustDomain(String),
    /// A namespace or service account is empty or holds a '/'.
    #[error("{what} {value:?} is not a valid name")]
    Name {
        /// Namespace or service account.
        what: &'static str,
        /// The value.
        value: String,
    },
    /// The URI is not `spiffe://TD/ns/NS/sa/SA`.
    #[error("{0:?} is not a SPIFFE id of the form spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT")]
    NotSpiffe(String),
}

/// A SPIFFE trust domain (mesh config `trustDomain`, e.g. `cluster.local`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrustDomain(String);

impl TrustDomain {
    /// A trust domain, checked against SPIFFE's character set.
    pub fn new(name: &str) -> Result<TrustDomain, IdentityError> {
        let valid = !name.is_empty()
            && name.len() <= 255
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_'));
        if valid {
            Ok(TrustDomain(name.to_string()))
        } else {
            Err(IdentityError::TrustDomain(name.to_string()))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TrustDomain {
    fn default() -> Self {
        TrustDomain("cluster.local".into())
    }
}

impl fmt::Display for TrustDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The mesh's current trust domain, shared by the CA and the authenticators; the composition
/// root follows the mesh config's `trustDomain` into it.
#[derive(Debug, Clone, Default)]
pub struct SharedTrustDomain(std::sync::Arc<arc_swap::ArcSwap<TrustDomain>>);

impl SharedTrustDomain {
    /// Starts at `trust_domain`.
    pub fn new(trust_domain: TrustDomain) -> SharedTrustDomain {
        SharedTrustDomain(std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(trust_domain)))
    }

    /// The trust domain now.
    pub fn get(&self) -> TrustDomain {
        TrustDomain::clone(&self.0.load())
    }

    /// Changes it (a mesh config edit).
    pub fn set(&self, trust_domain: TrustDomain) {
        self.0.store(std::sync::Arc::new(trust_domain));
    }
}

/// A workload identity: a Kubernetes service account in a namespace, in a trust domain.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    trust_domain: TrustDomain,
    namespace: String,
    service_account: String,
}

/// A path segment of a SPIFFE id: non-empty, no '/', printable ASCII.
fn check_name(what: &'static str, value: &str) -> Result<String, IdentityError> {
    if value.is_empty() || value.len() > 253 || !value.bytes().all(|b| b.is_ascii_graphic() && b != b'/') {
        return Err(IdentityError::Name { what, value: value.to_string() });
    }
    Ok(value.to_string())
}

impl Identity {
    /// The identity of `service_account` in `namespace`.
    pub fn new(trust_domain: TrustDomain, namespace: &str, service_account: &str) -> Result<Identity, IdentityError> {
        Ok(Identity {
            trust_domain,
            namespace: check_name("namespace", namespace)?,
            service_account: check_name("service account", service_account)?,
        })
    }

    /// Parses `spiffe://TD/ns/NS/sa/SA`.
    pub fn parse(uri: &str) -> Result<Identity, IdentityError> {
        let not_spiffe = || IdentityError::NotSpiffe(uri.chars().take(256).collect());
        let rest = uri.strip_prefix("spiffe://").ok_or_else(not_spiffe)?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            [td, "ns", ns, "sa", sa] => {
                Identity::new(TrustDomain::new(td).map_err(|_| not_spiffe())?, ns, sa).map_err(|_| not_spiffe())
            }
            _ => Err(not_spiffe()),
        }
    }

    /// The trust domain.
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.trust_domain
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The service account.
    pub fn service_account(&self) -> &str {
        &self.service_account
    }

    /// Whether both name the same service account in the same namespace, whatever the trust
    /// domain (Istio's xDS identity check compares only these two).
    pub fn same_workload(&self, other: &Identity) -> bool {
        self.namespace == other.namespace && self.service_account == other.service_account
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spiffe://{}/ns/{}/sa/{}", self.trust_domain, self.namespace, self.service_account)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spiffe_ids_round_trip_and_bad_ones_are_refused() {
        let id = Identity::parse("spiffe://cluster.local/ns/bookinfo/sa/reviews").expect("valid");
        assert_eq!(
            (id.trust_domain().as_str(), id.namespace(), id.service_account()),
            ("cluster.local", "bookinfo", "reviews")
        );
        assert_eq!(id.to_string(), "spiffe://cluster.local/ns/bookinfo/sa/reviews");
        for bad in [
            "spiffe://cluster.local/ns/bookinfo",
            "spiffe://cluster.local/ns//sa/x",
            "spiffe://Cluster.Local/ns/a/sa/b",
            "https://cluster.local/ns/a/sa/b",
            "spiffe://cluster.local/ns/a/sa/b/extra",
        ] {
            assert!(Identity::parse(bad).is_err(), "{bad}");
        }
        assert!(TrustDomain::new("").is_err());
    }
}
