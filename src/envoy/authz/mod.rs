//! Security policy enforcement: AuthorizationPolicy as Envoy RBAC filters and
//! RequestAuthentication as the `jwt_authn` filter, on sidecar inbound chains and gateway
//! listeners. What a proxy gets comes from the snapshot's [`SecurityIndex`] (its namespace,
//! the root namespace, and selectors matching its labels).
//!
//! Filter order follows Istio: CUSTOM policies first (a shadow RBAC filter and ext_authz, see
//! `ext_authz.rs`), then `jwt_authn` (its payload feeds RBAC), then RBAC for AUDIT (action LOG),
//! DENY, ALLOW; all before the connection manager's other filters and the router. A rejected
//! AuthorizationPolicy in the proxy's scope, and a CUSTOM one that cannot be enforced, adds a
//! deny-everything policy to the DENY filter (see [`SecurityIndex`] for why).
//!
//! [`SecurityIndex`]: crate::snapshot::SecurityIndex

mod ext_authz;
mod jwt;
mod matchers;
mod rbac;

use envoy_types::pb::envoy::config::listener::v3::Filter;
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;

use ext_authz::Custom;
use rbac::ChainKind;

use super::names::ext::{HTTP_RBAC, JWT_AUTHN, NETWORK_RBAC};
use super::network_filter::{http_filter, network_filter};
use super::resource::Resource;
use super::scope::Scope;
use crate::config::api::authorization_policy::Action;

/// Stat prefix of network RBAC filters (Istio's).
const TCP_STAT_PREFIX: &str = "tcp.";

/// Actions in filter order.
const ACTIONS: [Action; 3] = [Action::Audit, Action::Deny, Action::Allow];

/// The HTTP filters enforcing the proxy's policies, to go first in an HTTP connection manager.
pub(super) fn http_filters(scope: &Scope<'_>) -> Vec<HttpFilter> {
    let policies = policy_refs(scope);
    let custom = ext_authz::plan(scope, &policies);
    let ctx = rbac::RuleContext { chain: ChainKind::Http, trust_domain: &scope.snapshot.mesh.trust_domain };
    let mut filters = match &custom {
        Custom::Enforced(provider) => ext_authz::http_filters(provider, &policies, &ctx),
        _ => Vec::new(),
    };
    let authn = scope.snapshot.security.request_authentications_for(scope.namespace(), &scope.view.labels);
    let specs: Vec<_> = authn.iter().map(|(_, ra)| *ra).collect();
    if let Some(jwt) = jwt::jwt_authentication(&specs) {
        filters.push(http_filter(JWT_AUTHN, jwt));
    }
    for rules in rbac_rules(scope, &policies, &custom, &ctx) {
        let config = HttpRbac {
            shadow_rules_stat_prefix: rules.shadow_stat_prefix(),
            rules: rules.rules,
            shadow_rules: rules.shadow,
            ..Default::default()
        };
        filters.push(http_filter(HTTP_RBAC, config));
    }
    filters
}

/// A TCP chain's filters: the proxy's network RBAC filters, then `proxy` (a TCP proxy).
pub(super) fn secured_tcp(scope: &Scope<'_>, proxy: Filter) -> Vec<Filter> {
    let mut filters = network_filters(scope);
    filters.push(proxy);
    filters
}

/// The network filters enforcing the proxy's policies, to go before a TCP proxy.
fn network_filters(scope: &Scope<'_>) -> Vec<Filter> {
    let policies = policy_refs(scope);
    let custom = ext_authz::plan(scope, &policies);
    let ctx = rbac::RuleContext { chain: ChainKind::Tcp, trust_domain: &scope.snapshot.mesh.trust_domain };
    let mut filters = match &custom {
        Custom::Enforced(provider) => ext_authz::network_filters(provider, &policies, &ctx),
        _ => Vec::new(),
    };
    let rbac = rbac_rules(scope, &policies, &custom, &ctx).into_iter().map(|rules| {
        let config = NetworkRbac {
            stat_prefix: TCP_STAT_PREFIX.to_string(),
            shadow_rules_stat_prefix: rules.shadow_stat_prefix(),
            rules: rules.rules,
            shadow_rules: rules.shadow,
            ..Default::default()
        };
        network_filter(NETWORK_RBAC, config)
    });
    filters.extend(rbac);
    filters
}

/// The clusters Envoy fetches the proxy's remote JWKS through.
pub(super) fn jwks_clusters(scope: &Scope<'_>) -> Vec<Resource> {
    let authn = scope.snapshot.security.request_authentications_for(scope.namespace(), &scope.view.labels);
    let specs: Vec<_> = authn.iter().map(|(_, ra)| *ra).collect();
    jwt::jwks_clusters(&specs, &scope.snapshot.mesh)
}

/// The annotation that makes an AuthorizationPolicy dry-run.
const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

/// The AuthorizationPolicies applying to the proxy.
fn policy_refs<'a>(scope: &Scope<'a>) -> Vec<rbac::PolicyRef<'a>> {
    scope
        .snapshot
        .security
        .authorization_policies_for(scope.namespace(), &scope.view.labels)
        .into_iter()
        .map(|(c, spec)| rbac::PolicyRef {
            key: &c.key,
            spec,
            dry_run: c.meta.annotations.get(DRY_RUN_ANNOTATION).is_some_and(|v| parse_bool(v)),
        })
        .collect()
}

/// The RBAC rules of AUDIT, DENY and ALLOW; the DENY rules also deny the scopes of rejected
/// policies and of CUSTOM policies that cannot be enforced.
fn rbac_rules(
    scope: &Scope<'_>,
    policies: &[rbac::PolicyRef<'_>],
    custom: &Custom<'_>,
    ctx: &rbac::RuleContext<'_>,
) -> Vec<rbac::ActionRules> {
    let mut rejected = scope.snapshot.security.rejected_policies_for(scope.namespace(), &scope.view.labels);
    if let Custom::Rejected(custom) = custom {
        rejected.extend(custom.iter());
    }
    ACTIONS.into_iter().filter_map(|action| rbac::rbac_rules(action, policies, &rejected, ctx)).collect()
}

/// Go's `strconv.ParseBool` truths, as Istio reads the dry-run annotation (anything else: false).
fn parse_bool(value: &str) -> bool {
    matches!(value, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod ext_authz_tests;
