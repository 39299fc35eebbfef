//! What changed in one proxy's generated config between two snapshots, resource by resource:
//! each type generated from both for the same view, compared by encoded bytes.

use std::collections::BTreeMap;

use envoy_types::pb::google::protobuf::Any;

use super::TypeUrl;
use crate::envoy::generate;
use crate::envoy::ProxyView;
use crate::snapshot::Snapshot;

/// One resource that differs.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceDiff {
    /// Its type.
    pub type_url: TypeUrl,
    /// Its name.
    pub name: String,
    /// In the older snapshot (`None`: added since).
    pub before: Option<Any>,
    /// In the newer snapshot (`None`: removed since).
    pub after: Option<Any>,
}

/// The resources of `view`'s config that differ between `from` and `to`, by type then name.
pub fn config_diff(from: &Snapshot, to: &Snapshot, view: &ProxyView) -> Vec<ResourceDiff> {
    let mut out = Vec::new();
    for type_url in TypeUrl::PUSH_ORDER {
        let by_name = |s: &Snapshot| -> BTreeMap<String, Any> {
            generate(type_url, s, view).into_iter().map(|r| (r.name, r.body)).collect()
        };
        let (mut before, after) = (by_name(from), by_name(to));
        for (name, body) in after {
            match before.remove(&name) {
                Some(old) if old == body => {}
                old => out.push(ResourceDiff { type_url, name, before: old, after: Some(body) }),
            }
        }
        out.extend(before.into_iter().map(|(name, old)| ResourceDiff {
            type_url,
            name,
            before: Some(old),
            after: None,
        }));
    }
    out.sort_by(|a, b| (a.type_url, &a.name).cmp(&(b.type_url, &b.name)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::testing::{sidecar, snapshot};

    const SE: &str = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: a, namespace: shop}\n\
                      spec:\n  hosts: [a.example.com]\n  location: MESH_EXTERNAL\n  resolution: DNS\n  \
                      ports: [{number: 80, name: http, protocol: HTTP}]\n";

    #[test]
    fn lists_added_changed_and_removed_resources() {
        let before = snapshot(SE);
        let after = snapshot(&SE.replace("a.example.com", "b.example.com"));
        let view = sidecar("shop", &[]);
        let diff = config_diff(&before, &after, &view);
        let clusters: Vec<(&str, bool, bool)> = diff
            .iter()
            .filter(|d| d.type_url == TypeUrl::Cluster)
            .map(|d| (d.name.as_str(), d.before.is_some(), d.after.is_some()))
            .collect();
        assert_eq!(
            clusters,
            [("outbound|80||a.example.com", true, false), ("outbound|80||b.example.com", false, true)]
        );
        // The port-80 route names the new host: changed, present on both sides.
        assert!(diff
            .iter()
            .any(|d| d.type_url == TypeUrl::Route && d.name == "80" && d.before.is_some() && d.after.is_some()));
        assert!(config_diff(&before, &before, &view).is_empty(), "a snapshot does not differ from itself");
    }
}
