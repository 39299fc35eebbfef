//! The gateways a VirtualService is bound to (`mesh` for sidecars), and what its routes need to
//! know about them: a match may only name a gateway the VirtualService is bound to.

use std::collections::BTreeSet;

use crate::config::api::VirtualService;

use super::field_errors::{invalid, Errors};
use super::hosts::{check_fqdn, is_dns_label};

/// The reserved gateway name for sidecars.
const MESH: &str = "mesh";

/// What routes need to know about their VirtualService.
pub(super) struct RouteContext<'a> {
    /// Bound to gateways only (not `mesh`), so requests were authenticated by a gateway.
    pub(super) gateway_only: bool,
    /// A delegate (no hosts): its rules are merged into the roots that name it.
    pub(super) delegate: bool,
    /// Namespace of the VirtualService (short gateway names live there).
    namespace: &'a str,
    /// The gateways the VirtualService is bound to, as `namespace/name` or `mesh`.
    bound: BTreeSet<String>,
}

impl<'a> RouteContext<'a> {
    pub(super) fn new(vs: &VirtualService, namespace: &'a str) -> Self {
        let bound = if vs.gateways.is_empty() {
            BTreeSet::from([MESH.to_string()])
        } else {
            vs.gateways.iter().map(|g| gateway_key(g, namespace)).collect()
        };
        let gateway_only = !vs.gateways.is_empty() && !vs.gateways.iter().any(|g| g == MESH);
        RouteContext { gateway_only, delegate: vs.hosts.is_empty(), namespace, bound }
    }

    /// Checks the `gateways` of a match: valid names, each one the VirtualService is bound to.
    pub(super) fn check_match_gateways(&self, errors: &mut Errors, path: &str, gateways: &[String]) {
        for (k, gateway) in gateways.iter().enumerate() {
            let field = format!("{path}[{k}]");
            match check_gateway_name(gateway) {
                Err(reason) => errors.add(field, reason),
                // A match on a gateway the VirtualService is not bound to could never apply.
                Ok(()) if !self.bound.contains(&gateway_key(gateway, self.namespace)) => {
                    errors.add(field, invalid(gateway, "not one of the virtual service's gateways"));
                }
                Ok(()) => {}
            }
        }
    }
}

/// Checks a gateway reference: `mesh`, `name`, `namespace/name` or the legacy `name.namespace.svc...`.
pub(super) fn check_gateway_name(name: &str) -> Result<(), String> {
    let Some((namespace, gateway)) = name.split_once('/') else {
        return check_fqdn(name).map_err(|e| invalid(name, format!("invalid gateway name: {e}")));
    };
    if namespace.is_empty() || gateway.is_empty() {
        Err(invalid(name, "config namespace and gateway name cannot be empty"))
    } else if !is_dns_label(namespace) {
        Err(invalid(name, format!("invalid value for namespace: {namespace:?}")))
    } else if !is_dns_label(gateway) {
        Err(invalid(name, format!("invalid value for gateway name: {gateway:?}")))
    } else {
        Ok(())
    }
}

/// The `namespace/name` a gateway reference resolves to from `namespace` (`mesh` stays `mesh`).
fn gateway_key(name: &str, namespace: &str) -> String {
    if name == MESH || name.contains('/') {
        return name.to_string();
    }
    match name.split_once('.') {
        Some((gateway, rest)) => {
            format!("{}/{gateway}", rest.split('.').next().unwrap_or_default())
        }
        None => format!("{namespace}/{name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_keys_resolve_short_and_legacy_names() {
        assert_eq!(gateway_key("gw", "ns"), "ns/gw");
        assert_eq!(gateway_key("other/gw", "ns"), "other/gw");
        assert_eq!(gateway_key("gw.other.svc.cluster.local", "ns"), "other/gw");
        assert_eq!(gateway_key("mesh", "ns"), "mesh");
    }
}
