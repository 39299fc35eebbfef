//! The names a proxy follows (EDS cluster names from CDS, route names from LDS), derived once per
//! distinct resource and shared: thousands of simulated proxies receive byte-identical clusters
//! and listeners, so each is decoded once (keyed by the xxh64 of its bytes) and every proxy holds
//! an `Arc` of the same sorted name list instead of its own copy.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::{cluster::ClusterDiscoveryType, cluster::DiscoveryType, Cluster};
use envoy_types::pb::envoy::config::listener::v3::{filter::ConfigType, Listener};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::RouteSpecifier, HttpConnectionManager,
};
use prost::Message;
use xxhash_rust::xxh64::{xxh64, Xxh64};

use crate::xds::TypeUrl;

/// A sorted, deduplicated list of names, shared between proxies.
pub type Names = Arc<[Arc<str>]>;

/// The xxh64 of some bytes (seed 0), as the cache and the capture name blobs.
pub fn hash(bytes: &[u8]) -> u64 {
    xxh64(bytes, 0)
}

/// What a proxy holds of a delta-served wildcard type: resource name → the names it leads to.
/// Shared, like [`Names`], by every proxy that went through the same responses.
#[derive(Debug, Default)]
pub struct DeltaHeld {
    id: u64,
    entries: BTreeMap<Arc<str>, Names>,
    /// Union of the entries' names.
    pub names: Names,
}

/// Decoded-once results, by the hash of the bytes they came from.
#[derive(Debug, Default)]
pub struct NameCache {
    /// Resource hash → the names one CDS or LDS resource leads to.
    resources: HashMap<u64, Names>,
    /// Hash of a whole SotW response's resources → the union of their names.
    responses: HashMap<u64, Names>,
    /// (held state, delta response hash) → the state after it.
    transitions: HashMap<(u64, u64), Arc<DeltaHeld>>,
    /// One copy of every name.
    interned: HashSet<Arc<str>>,
    /// Last [`DeltaHeld`] id handed out.
    last_id: u64,
    /// Resources decoded (cache misses), for the report's curiosity and the tests.
    pub decoded: u64,
}

impl NameCache {
    /// The names a SotW CDS (EDS names) or LDS (route names) response's resources lead to.
    pub fn sotw<'a>(&mut self, type_url: TypeUrl, resources: impl Iterator<Item = &'a [u8]> + Clone) -> Names {
        let mut h = Xxh64::new(0);
        for r in resources.clone() {
            h.update(&hash(r).to_le_bytes());
        }
        let key = h.digest();
        if let Some(names) = self.responses.get(&key) {
            return names.clone();
        }
        let mut all: Vec<Arc<str>> = Vec::new();
        for r in resources {
            all.extend(self.resource(type_url, r).iter().cloned());
        }
        let names = sorted(all);
        self.responses.insert(key, names.clone());
        names
    }

    /// The state after a delta CDS/LDS response of `(name, resource bytes)` and removed names.
    pub fn delta(
        &mut self,
        type_url: TypeUrl,
        held: &Arc<DeltaHeld>,
        resources: &[(&str, &[u8])],
        removed: &[&str],
    ) -> Arc<DeltaHeld> {
        let mut h = Xxh64::new(0);
        for (name, bytes) in resources {
            h.update(name.as_bytes());
            h.update(&hash(bytes).to_le_bytes());
        }
        h.update(b"\0removed");
        for name in removed {
            h.update(name.as_bytes());
            h.update(b"\0");
        }
        let key = (held.id, h.digest());
        if let Some(next) = self.transitions.get(&key) {
            return next.clone();
        }
        let mut entries = held.entries.clone();
        for name in removed {
            entries.remove(*name);
        }
        for (name, bytes) in resources {
            let names = self.resource(type_url, bytes);
            entries.insert(self.intern(name), names);
        }
        let names = sorted(entries.values().flat_map(|n| n.iter().cloned()).collect());
        self.last_id += 1;
        let next = Arc::new(DeltaHeld { id: self.last_id, entries, names });
        self.transitions.insert(key, next.clone());
        next
    }

    fn resource(&mut self, type_url: TypeUrl, bytes: &[u8]) -> Names {
        let key = hash(bytes);
        if let Some(names) = self.resources.get(&key) {
            return names.clone();
        }
        self.decoded += 1;
        let raw = match type_url {
            TypeUrl::Cluster => eds_name(bytes).into_iter().collect(),
            TypeUrl::Listener => route_names(bytes),
            TypeUrl::Endpoint | TypeUrl::Route | TypeUrl::Secret => Vec::new(),
        };
        let names = sorted(raw.into_iter().map(|n| self.intern(&n)).collect());
        self.resources.insert(key, names.clone());
        names
    }

    fn intern(&mut self, name: &str) -> Arc<str> {
        if let Some(n) = self.interned.get(name) {
            return n.clone();
        }
        let n: Arc<str> = Arc::from(name);
        self.interned.insert(n.clone());
        n
    }
}

fn sorted(mut names: Vec<Arc<str>>) -> Names {
    names.sort();
    names.dedup();
    names.into()
}

/// The EDS service name of an EDS cluster (the cluster's name unless `service_name` is set).
fn eds_name(bytes: &[u8]) -> Option<String> {
    let c = Cluster::decode(bytes).ok()?;
    let eds = matches!(c.cluster_discovery_type, Some(ClusterDiscoveryType::Type(t)) if t == DiscoveryType::Eds as i32);
    eds.then(|| c.eds_cluster_config.map(|e| e.service_name).filter(|n| !n.is_empty()).unwrap_or(c.name))
}

/// The RDS route config names a listener's HTTP connection managers name.
pub(crate) fn route_names(bytes: &[u8]) -> Vec<String> {
    let Ok(listener) = Listener::decode(bytes) else { return Vec::new() };
    let mut names = Vec::new();
    for chain in listener.filter_chains.iter().chain(listener.default_filter_chain.iter()) {
        for filter in &chain.filters {
            let Some(ConfigType::TypedConfig(any)) = &filter.config_type else { continue };
            if !any.type_url.ends_with(".HttpConnectionManager") {
                continue;
            }
            let Ok(hcm) = HttpConnectionManager::decode(any.value.as_slice()) else { continue };
            if let Some(RouteSpecifier::Rds(rds)) = hcm.route_specifier {
                names.push(rds.route_config_name);
            }
        }
    }
    names
}

/// The secrets a listener's TLS contexts ask of the control plane over ADS (a gateway's
/// credentials), not those pilot-agent serves.
pub(crate) fn secret_names(bytes: &[u8]) -> Vec<String> {
    use envoy_types::pb::envoy::config::core::v3::{config_source::ConfigSourceSpecifier, transport_socket};
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        common_tls_context::ValidationContextType, DownstreamTlsContext, SdsSecretConfig,
    };
    let Ok(listener) = Listener::decode(bytes) else { return Vec::new() };
    let over_ads = |c: &SdsSecretConfig| {
        matches!(
            c.sds_config.as_ref().and_then(|s| s.config_source_specifier.as_ref()),
            Some(ConfigSourceSpecifier::Ads(_))
        )
    };
    let mut names = Vec::new();
    for chain in listener.filter_chains.iter().chain(listener.default_filter_chain.iter()) {
        let Some(transport_socket::ConfigType::TypedConfig(any)) =
            chain.transport_socket.as_ref().and_then(|t| t.config_type.as_ref())
        else {
            continue;
        };
        let Ok(tls) = DownstreamTlsContext::decode(any.value.as_slice()) else { continue };
        let Some(common) = tls.common_tls_context else { continue };
        let validation = match common.validation_context_type {
            Some(ValidationContextType::ValidationContextSdsSecretConfig(c)) => Some(c),
            Some(ValidationContextType::CombinedValidationContext(c)) => c.validation_context_sds_secret_config,
            _ => None,
        };
        let configs = common.tls_certificate_sds_secret_configs.into_iter().chain(validation);
        names.extend(configs.filter(over_ads).map(|c| c.name));
    }
    names
}

/// Which of a shared name list have been received; a proxy's EDS or RDS progress.
#[derive(Debug, Clone)]
pub struct Coverage {
    names: Names,
    bits: Vec<u64>,
    missing: usize,
}

impl Default for Coverage {
    fn default() -> Self {
        Coverage { names: Arc::from(Vec::new()), bits: Vec::new(), missing: 0 }
    }
}

impl Coverage {
    /// The names followed.
    pub fn names(&self) -> &Names {
        &self.names
    }

    /// Follows `names` instead, keeping what was received of names in both.
    pub fn set(&mut self, names: Names) {
        let mut bits = vec![0u64; names.len().div_ceil(64)];
        let mut missing = names.len();
        for (i, name) in names.iter().enumerate() {
            if self.has(name) {
                bits[i / 64] |= 1 << (i % 64);
                missing -= 1;
            }
        }
        *self = Coverage { names, bits, missing };
    }

    /// Whether `name` is followed and was received.
    pub fn has(&self, name: &str) -> bool {
        match self.names.binary_search_by(|n| (**n).cmp(name)) {
            Ok(i) => self.bits[i / 64] & (1 << (i % 64)) != 0,
            Err(_) => false,
        }
    }

    /// Records that `name` arrived.
    pub fn cover(&mut self, name: &str) {
        if let Ok(i) = self.names.binary_search_by(|n| (**n).cmp(name)) {
            let bit = 1 << (i % 64);
            if self.bits[i / 64] & bit == 0 {
                self.bits[i / 64] |= bit;
                self.missing -= 1;
            }
        }
    }

    /// Whether every followed name was received.
    pub fn complete(&self) -> bool {
        self.missing == 0
    }
}

/// Names in `new` not in `old`, and in `old` not in `new` (both sorted).
pub fn diff(old: &[Arc<str>], new: &[Arc<str>]) -> (Vec<String>, Vec<String>) {
    let added = new.iter().filter(|n| old.binary_search(n).is_err()).map(|n| n.to_string()).collect();
    let removed = old.iter().filter(|n| new.binary_search(n).is_err()).map(|n| n.to_string()).collect();
    (added, removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::cluster::v3::cluster::EdsClusterConfig;

    fn eds_cluster(name: &str, service: &str) -> Vec<u8> {
        Cluster {
            name: name.into(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
            eds_cluster_config: Some(EdsClusterConfig { service_name: service.into(), ..Default::default() }),
            ..Default::default()
        }
        .encode_to_vec()
    }

    fn static_cluster(name: &str) -> Vec<u8> {
        Cluster { name: name.into(), ..Default::default() }.encode_to_vec()
    }

    #[test]
    fn identical_resources_are_decoded_once_and_shared() {
        let mut cache = NameCache::default();
        let a = [eds_cluster("a", ""), eds_cluster("b", "svc-b"), static_cluster("c")];
        let first = cache.sotw(TypeUrl::Cluster, a.iter().map(Vec::as_slice));
        let second = cache.sotw(TypeUrl::Cluster, a.iter().map(Vec::as_slice));
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(first.iter().map(|n| &**n).collect::<Vec<_>>(), ["a", "svc-b"]);
        assert_eq!(cache.decoded, 3);
        // A response sharing resources decodes only the new one.
        let b = [eds_cluster("a", ""), eds_cluster("d", "")];
        let names = cache.sotw(TypeUrl::Cluster, b.iter().map(Vec::as_slice));
        assert_eq!(names.len(), 2);
        assert_eq!(cache.decoded, 4);
    }

    #[test]
    fn delta_states_follow_adds_and_removals_and_are_shared() {
        let mut cache = NameCache::default();
        let empty = Arc::new(DeltaHeld::default());
        let (a, b) = (eds_cluster("a", ""), eds_cluster("b", ""));
        let one = cache.delta(TypeUrl::Cluster, &empty, &[("a", &a), ("b", &b)], &[]);
        let again = cache.delta(TypeUrl::Cluster, &empty, &[("a", &a), ("b", &b)], &[]);
        assert!(Arc::ptr_eq(&one, &again));
        let two = cache.delta(TypeUrl::Cluster, &one, &[], &["a"]);
        assert_eq!(two.names.iter().map(|n| &**n).collect::<Vec<_>>(), ["b"]);
        assert_eq!(diff(&one.names, &two.names), (vec![], vec!["a".to_string()]));
    }

    #[test]
    fn coverage_keeps_what_was_received_across_changes() {
        let names = |n: &[&str]| -> Names { n.iter().map(|s| Arc::from(*s)).collect::<Vec<_>>().into() };
        let mut c = Coverage::default();
        assert!(c.complete());
        c.set(names(&["a", "b"]));
        assert!(!c.complete());
        c.cover("a");
        c.cover("a");
        c.cover("zzz");
        assert!(!c.complete());
        c.set(names(&["a", "c"]));
        assert!(c.has("a") && !c.has("c"));
        c.cover("c");
        assert!(c.complete());
    }
}
