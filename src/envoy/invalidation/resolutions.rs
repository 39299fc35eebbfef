//! Which views a change leaves resolved as they were: a resolution (see
//! [`ProxyView::resolve`]) reads the selectors' label keys, the Sidecars and the endpoints at
//! the proxy's IPs, so a change that touches none of them for a view need not resolve it again.
//! With a thousand connections, resolving every view on every snapshot was 13% of a
//! VirtualService edit's CPU.

use std::collections::HashSet;
use std::net::IpAddr;

use super::table::{row, Resolves};
use crate::envoy::ProxyView;
use crate::registry::{Hostname, Registry};
use crate::snapshot::Snapshot;

/// The views whose resolution against the previous snapshot still holds in the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeptResolutions {
    /// None: every view is resolved again.
    None,
    /// Every view but those with an IP where a changed host had or has an endpoint.
    ExceptAt(HashSet<IpAddr>),
}

impl KeptResolutions {
    /// What the change from `previous` to `next` (its direct successor) leaves resolved.
    pub fn between(previous: &Snapshot, next: &Snapshot) -> KeptResolutions {
        let changes = &next.changes;
        if previous.version.next() != next.version || changes.full || !previous.reads_same_labels(next) {
            return KeptResolutions::None;
        }
        let mut stale = HashSet::new();
        for key in &changes.keys {
            match row(key).resolves {
                Resolves::Keeps => {}
                Resolves::At(host) => {
                    stale.extend(addresses_of(&previous.registry, host));
                    stale.extend(addresses_of(&next.registry, host));
                }
                Resolves::Everything => return KeptResolutions::None,
            }
        }
        KeptResolutions::ExceptAt(stale)
    }

    /// Whether `view` (unresolved, as a connection holds it) keeps its resolution.
    pub fn keeps(&self, view: &ProxyView) -> bool {
        match self {
            KeptResolutions::None => false,
            KeptResolutions::ExceptAt(stale) => {
                stale.is_empty()
                    || view.ips.iter().filter_map(|ip| ip.parse::<IpAddr>().ok()).all(|ip| !stale.contains(&ip))
            }
        }
    }
}

/// The IP addresses of `host`'s endpoints, in every namespace declaring it.
fn addresses_of<'a>(registry: &'a Registry, host: &'a Hostname) -> impl Iterator<Item = IpAddr> + 'a {
    registry
        .endpoints
        .iter()
        .filter(move |(key, _)| key.hostname == *host)
        .flat_map(|(_, endpoints)| endpoints.iter())
        .filter_map(|ep| ep.address.parse::<IpAddr>().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Kind;
    use crate::envoy::testing::{sidecar_at, snapshot};
    use crate::snapshot::{ChangeSet, ChangedKey, Version};

    const SERVICE: &str = "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: a, namespace: ns}
spec:
  hosts: [a.example.com]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: ENDPOINT}]
";

    const ROUTE: &str = "apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: a, namespace: ns}
spec:
  hosts: [a.example.com]
  http: [{route: [{destination: {host: a.example.com}, weight: WEIGHT}]}]
";

    const SIDECAR: &str = "apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: ns}
spec:
  egress: [{hosts: [\"./*\"]}]
";

    const SELECTING: &str = "apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: p, namespace: ns}
spec:
  selector: {matchLabels: {tier: web}}
  action: ALLOW
  rules: [{}]
";

    /// `yaml` as snapshot `seq` of term 1, with `changes`.
    fn at(seq: u64, yaml: &str, changes: ChangeSet) -> Snapshot {
        let mut s = snapshot(yaml);
        s.version = Version::new(1, seq);
        s.changes = changes;
        s
    }

    /// The two snapshots of a change from `before` to `after`, the second with the change's keys.
    fn change(before: &str, after: &str, keys: &[ChangedKey]) -> (Snapshot, Snapshot) {
        let changes = ChangeSet { full: false, keys: keys.iter().cloned().collect() };
        (at(1, before, ChangeSet::full()), at(2, after, changes))
    }

    fn config(kind: Kind, name: &str) -> ChangedKey {
        ChangedKey::Config(crate::config::ConfigKey { kind, namespace: "ns".into(), name: name.into() })
    }

    fn kept(previous: &Snapshot, next: &Snapshot, ip: &str) -> bool {
        let view = sidecar_at("ns", &[], &[ip]);
        let kept = KeptResolutions::between(previous, next);
        // What is kept must be what resolving again gives.
        if kept.keeps(&view) {
            assert_eq!(view.resolve(previous), view.resolve(next), "a kept resolution differs at {ip}");
        }
        kept.keeps(&view)
    }

    #[test]
    fn a_route_edit_keeps_every_resolution() {
        let service = SERVICE.replace("ENDPOINT", "10.0.0.1");
        let before = format!("{service}---\n{}", ROUTE.replace("WEIGHT", "100"));
        let after = format!("{service}---\n{}", ROUTE.replace("WEIGHT", "99"));
        let (previous, next) = change(&before, &after, &[config(Kind::VirtualService, "a")]);
        assert!(kept(&previous, &next, "10.0.0.1"));
        assert!(kept(&previous, &next, "10.0.0.7"));
    }

    #[test]
    fn an_endpoint_change_resolves_again_only_the_views_at_its_addresses() {
        let before = SERVICE.replace("ENDPOINT", "10.0.0.1");
        let after = SERVICE.replace("ENDPOINT", "10.0.0.2");
        let (previous, next) = change(&before, &after, &[ChangedKey::Endpoints(Hostname::new("a.example.com"))]);
        assert!(!kept(&previous, &next, "10.0.0.1"), "the endpoint left this proxy");
        assert!(!kept(&previous, &next, "10.0.0.2"), "the endpoint came to this proxy");
        assert!(kept(&previous, &next, "10.0.0.3"));
    }

    #[test]
    fn sidecars_services_selectors_and_skipped_versions_resolve_everything_again() {
        let service = SERVICE.replace("ENDPOINT", "10.0.0.1");
        let with = |extra: &str| format!("{service}---\n{extra}");
        let (previous, next) = change(&service, &with(SIDECAR), &[config(Kind::Sidecar, "default")]);
        assert!(!kept(&previous, &next, "10.0.0.7"));
        let (previous, next) = change(&service, &service, &[config(Kind::ServiceEntry, "a")]);
        assert!(!kept(&previous, &next, "10.0.0.7"));
        // A policy selecting a label no selector read before: labels resolve differently.
        let (previous, next) = change(&service, &with(SELECTING), &[config(Kind::AuthorizationPolicy, "p")]);
        assert!(!kept(&previous, &next, "10.0.0.7"));
        let (previous, next) = change(&service, &service, &[ChangedKey::Mesh]);
        assert!(!kept(&previous, &next, "10.0.0.7"));
        let (previous, later) = (at(1, &service, ChangeSet::full()), at(3, &service, ChangeSet::default()));
        assert_eq!(KeptResolutions::between(&previous, &later), KeptResolutions::None, "a version was skipped");
    }
}
