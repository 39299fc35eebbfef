//! Which config objects a proxy view's resources are generated from. A change made only of
//! objects a view does not depend on (before or after it) leaves every resource of that view as
//! it was, so the cache keeps them instead of generating them again: a VirtualService edit costs
//! the views that import it, not the whole mesh (Istio's `SidecarScope.DependsOnConfig`).

use super::scope::Scope;
use crate::config::{ConfigKey, Kind};
use crate::registry::host_matches;
use crate::snapshot::Snapshot;
use crate::xds::proxy::{ProxyKind, ProxyView};

/// Whether `view`'s resources in `snapshot` may read the object `key` (true when unsure).
pub fn depends_on(snapshot: &Snapshot, view: &ProxyView, key: &ConfigKey) -> bool {
    // Gateways bind VirtualServices by gateway name and read rules for every server: not worth
    // narrowing, as there are few gateway views.
    if view.kind != ProxyKind::Sidecar {
        return true;
    }
    let view = &view.resolve(snapshot);
    let scope = Scope::new(snapshot, view);
    match key.kind {
        // Sidecars read VirtualServices only through what their egress listeners import.
        Kind::VirtualService => scope
            .all_imports()
            .into_iter()
            .any(|imports| scope.mesh_virtual_services(imports).iter().any(|(ix, _)| ix.config.key == *key)),
        // Rules are read for the services the proxy has clusters (or routes) for and for its
        // inbound services; a rule whose hosts match none of them is read by nothing here.
        Kind::DestinationRule => {
            let Some(hosts) = snapshot.destination_rule_hosts(key) else {
                return false;
            };
            let matches = |host: &str| hosts.iter().any(|h| host_matches(h.as_str(), host));
            scope.cluster_services().iter().any(|s| matches(s.hostname.as_str()))
                || view.inbound.iter().any(|p| matches(p.service.hostname.as_str()))
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::generate::testing::{sidecar, snapshot};

    fn key(kind: Kind, namespace: &str, name: &str) -> ConfigKey {
        ConfigKey { kind, namespace: namespace.into(), name: name.into() }
    }

    fn service(name: &str, ns: &str) -> String {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  \
             hosts: [{name}.{ns}.svc.cluster.local]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  \
             ports: [{{number: 80, name: http}}]\n---\n"
        )
    }

    const SCOPED: &str = r#"
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: a}
spec:
  egress:
  - hosts: ["./*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ex, namespace: a}
spec:
  hosts: [ex]
  http:
  - route: [{destination: {host: why.b.svc.cluster.local}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: why, namespace: b}
spec:
  hosts: [why]
  http:
  - route: [{destination: {host: why}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: why, namespace: b}
spec:
  host: why
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: zed, namespace: c}
spec:
  host: zed.c.svc.cluster.local
"#;

    #[test]
    fn a_scoped_sidecar_depends_only_on_what_it_imports() {
        let yaml = [service("ex", "a"), service("why", "b"), service("zed", "c")].concat();
        let s = snapshot(&format!("{yaml}{SCOPED}"));
        let scoped = sidecar("a", &[]);
        assert!(depends_on(&s, &scoped, &key(Kind::VirtualService, "a", "ex")));
        assert!(!depends_on(&s, &scoped, &key(Kind::VirtualService, "b", "why")), "b is not imported");
        // why is a destination of ex: its rule shapes a cluster of a.
        assert!(depends_on(&s, &scoped, &key(Kind::DestinationRule, "b", "why")));
        assert!(!depends_on(&s, &scoped, &key(Kind::DestinationRule, "c", "zed")));
        assert!(!depends_on(&s, &scoped, &key(Kind::DestinationRule, "c", "gone")), "not in this snapshot");
        // Without a Sidecar everything visible is imported.
        let open = sidecar("c", &[]);
        assert!(depends_on(&s, &open, &key(Kind::VirtualService, "b", "why")));
        assert!(depends_on(&s, &open, &key(Kind::DestinationRule, "c", "zed")));
        // Kinds it does not narrow count as read.
        assert!(depends_on(&s, &scoped, &key(Kind::Sidecar, "c", "default")));
    }
}
