//! The extension providers CUSTOM AuthorizationPolicies name, resolved against the mesh config
//! and the registry as Istio's authz builder resolves them: the provider must be an ext_authz one
//! of `extensionProviders`, and its `service` (`host`, or `namespace/host`) a service of the
//! registry (with `host` alone, declared in exactly one namespace). A policy whose provider does
//! not resolve cannot be enforced: it is reported (here) and keeps its scope denied (translation).

use std::sync::Arc;

use crate::config::api::authorization_policy::{Action, AuthorizationPolicy};
use crate::config::error::FieldError;
use crate::config::{ConfigError, ConfigKey, Spec, ValidConfig};
use crate::mesh::{ExtAuthz, MeshConfig};
use crate::registry::{Hostname, Registry, Service, ServiceKey};

/// The `file` errors about CUSTOM policies' providers are reported under.
pub const SOURCE: &str = "authorization providers";

/// A CUSTOM policy's provider, resolved.
#[derive(Debug, Clone)]
pub struct ResolvedProvider<'a> {
    /// The provider's name.
    pub name: &'a str,
    /// Its ext_authz settings.
    pub ext_authz: ExtAuthz<'a>,
    /// The service checks go to.
    pub service: &'a Arc<Service>,
    /// The service port checks go to.
    pub port: u16,
}

impl ResolvedProvider<'_> {
    /// The service's hostname.
    pub fn hostname(&self) -> &Hostname {
        &self.service.hostname
    }
}

/// Resolves the provider `name` of a CUSTOM policy; the error says why it cannot be used.
pub fn resolve<'a>(mesh: &'a MeshConfig, registry: &'a Registry, name: &str) -> Result<ResolvedProvider<'a>, String> {
    let ext_authz_providers = || mesh.extension_providers.iter().filter(|p| p.ext_authz().is_some());
    let Some(provider) = ext_authz_providers().find(|p| p.name == name) else {
        let available: Vec<&str> = ext_authz_providers().map(|p| p.name.as_str()).collect();
        return Err(format!("available ext_authz providers are {available:?} but found {name:?}"));
    };
    let Some(ext_authz) = provider.ext_authz() else {
        return Err(format!("provider {name:?} is not an ext_authz provider"));
    };
    let service = lookup_service(registry, ext_authz.service())?;
    // Validated to be 1..=65535 with the mesh config.
    let port = u16::try_from(ext_authz.port()).map_err(|_| format!("bad port {}", ext_authz.port()))?;
    if !service.ports.iter().any(|p| p.number == port) {
        return Err(format!(
            "service {} of provider {name:?} has no port {port}: checks would go to a cluster that does not exist",
            service.hostname
        ));
    }
    Ok(ResolvedProvider { name: &provider.name, ext_authz, service, port })
}

/// Istio's `LookupCluster`: `namespace/host` names one declaration; `host` alone must be declared
/// in exactly one namespace.
fn lookup_service<'a>(registry: &'a Registry, service: &str) -> Result<&'a Arc<Service>, String> {
    let (namespace, host) = match service.split_once('/') {
        Some((ns, host)) => (Some(ns), host),
        None => (None, service),
    };
    let hostname = Hostname::new(host);
    let declared: Vec<&Arc<Service>> = registry
        .services
        .range(ServiceKey { hostname: hostname.clone(), namespace: String::new() }..)
        .take_while(|(k, _)| k.hostname == hostname)
        .map(|(_, s)| s)
        .collect();
    match namespace {
        Some(ns) => declared.into_iter().find(|s| s.namespace == ns),
        None if declared.len() > 1 => {
            let namespaces: Vec<&str> = declared.iter().map(|s| s.namespace.as_str()).collect();
            return Err(format!(
                "found {service} in multiple namespaces {namespaces:?}, specify the namespace explicitly in the \
                 format of <Namespace>/<Hostname>"
            ));
        }
        None => declared.into_iter().next(),
    }
    .ok_or_else(|| format!("could not find service {service} in the service registry"))
}

/// An error for every CUSTOM policy of `configs` whose provider does not resolve, or whose
/// workloads a CUSTOM policy of another provider also selects (translation denies such workloads:
/// one provider per workload).
pub(super) fn provider_errors<'a>(
    configs: impl Iterator<Item = &'a ValidConfig>,
    mesh: &MeshConfig,
    registry: &Registry,
) -> Vec<ConfigError> {
    let custom: Vec<(&ValidConfig, &AuthorizationPolicy)> = configs
        .filter_map(|c| match &c.spec {
            Spec::AuthorizationPolicy(ap) if ap.action == Action::Custom => Some((c, ap)),
            _ => None,
        })
        .collect();
    let provider = |ap: &AuthorizationPolicy| ap.provider.as_ref().map(|p| p.name.clone()).unwrap_or_default();
    let mut out = Vec::new();
    for (c, ap) in &custom {
        let name = provider(ap);
        let reason = match resolve(mesh, registry, &name) {
            Err(reason) => format!("{reason}; the policy cannot be enforced and its scope is denied"),
            Ok(_) => {
                let others: Vec<String> = custom
                    .iter()
                    .filter(|(o, oap)| {
                        provider(oap) != name && may_share_workloads(&mesh.root_namespace, c, ap, o, oap)
                    })
                    .map(|(o, oap)| format!("{}/{} ({})", o.key.namespace, o.key.name, provider(oap)))
                    .collect();
                if others.is_empty() {
                    continue;
                }
                format!(
                    "CUSTOM policies of other providers apply to the same workloads: {}; only one provider per \
                     workload is supported, and a workload where several apply is denied",
                    others.join(", ")
                )
            }
        };
        out.push(ConfigError {
            file: SOURCE.to_string(),
            document: 0,
            object: Some(ConfigKey::clone(&c.key)),
            error: FieldError::new("spec.provider.name", reason),
            policy_selector: None,
        });
    }
    out
}

/// Whether every workload one of two policies selects, the other selects too (its namespace is
/// the other's or the root namespace, and it requires a subset of the other's labels). Scopes that
/// only partly overlap are not reported (that would need the workloads); translation still denies
/// a workload where both apply.
fn may_share_workloads(
    root: &str,
    a: &ValidConfig,
    a_spec: &AuthorizationPolicy,
    b: &ValidConfig,
    b_spec: &AuthorizationPolicy,
) -> bool {
    let labels = |ap: &AuthorizationPolicy| ap.selector.as_ref().map(|s| s.match_labels.clone()).unwrap_or_default();
    let (la, lb) = (labels(a_spec), labels(b_spec));
    let contains =
        |outer_ns: &str, outer: &crate::config::api::Labels, inner_ns: &str, inner: &crate::config::api::Labels| {
            (outer_ns == root || outer_ns == inner_ns) && outer.iter().all(|(k, v)| inner.get(k) == Some(v))
        };
    contains(&a.key.namespace, &la, &b.key.namespace, &lb) || contains(&b.key.namespace, &lb, &a.key.namespace, &la)
}
