//! AuthorizationPolicy rules as Envoy RBAC policies, following Istio's authz model: a rule is one
//! RBAC policy whose permissions are its `to` operations (or any) and whose principals are its
//! `from` sources (or any), each ANDed with the rule's `when` conditions of that side.
//!
//! Fail closed, as Istio's builder does: a field that cannot apply to the chain (HTTP attributes
//! on a TCP chain) drops the whole rule from an ALLOW policy (it matches nothing, so allows less)
//! and is left out of a DENY or AUDIT rule (which then matches more, so denies more).

use envoy_types::pb::envoy::config::rbac::v3::{permission, rbac, Permission, Policy, Principal, Rbac};
use envoy_types::pb::envoy::config::route::v3::HeaderMatcher;

use super::matchers::{
    and_ids, any_id, any_value, cidr, header, list_holding, not_id, or_ids, payload, peer_identity, request_principal,
    spiffe_namespace, spiffe_principal, spiffe_service_account, spiffe_trust_domain, string_or_list, string_value,
    wildcard,
};
use crate::config::api::authorization_policy::{Action, AuthorizationPolicy, Condition, Operation, Rule, Source};
use crate::config::ConfigKey;
use crate::envoy::proto::{any, map_field};
use crate::snapshot::RejectedPolicy;

/// The chain a filter is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ChainKind {
    /// An HTTP connection manager: every attribute applies.
    Http,
    /// A TCP chain: only connection attributes apply.
    Tcp,
}

/// Why an attribute produced no matcher.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unsupported(String);

/// What a policy's rules are generated with.
pub(super) struct RuleContext<'a> {
    /// The chain.
    pub chain: ChainKind,
    /// The mesh trust domain (principals written for `cluster.local` also match it).
    pub trust_domain: &'a str,
}

/// An AuthorizationPolicy applying to the proxy.
pub(super) struct PolicyRef<'a> {
    /// Its identity (names its RBAC policies).
    pub key: &'a ConfigKey,
    /// Its spec.
    pub spec: &'a AuthorizationPolicy,
    /// Annotated `istio.io/dry-run`: evaluated and logged (shadow rules), not enforced.
    pub dry_run: bool,
}

/// The enforced and dry-run (shadow) RBAC rules of one action.
pub(super) struct ActionRules {
    /// Enforced rules; `None` when only dry-run policies have this action.
    pub rules: Option<Rbac>,
    /// Dry-run rules.
    pub shadow: Option<Rbac>,
}

impl ActionRules {
    /// Istio's stat prefix of shadow rules.
    pub fn shadow_stat_prefix(&self) -> String {
        let action = self.shadow.as_ref().map(|r| r.action);
        match action {
            Some(a) if a == rbac::Action::Allow as i32 => "istio_dry_run_allow_".into(),
            Some(a) if a == rbac::Action::Deny as i32 => "istio_dry_run_deny_".into(),
            // istiod reads the action of absent shadow rules as ALLOW's (the enum's zero).
            None => "istio_dry_run_allow_".into(),
            _ => String::new(),
        }
    }
}

/// The RBAC rules of one action from `policies` (and, for DENY, the scopes of `rejected`
/// policies, always enforced); `None` when nothing of that action applies.
pub(super) fn rbac_rules(
    action: Action,
    policies: &[PolicyRef<'_>],
    rejected: &[&RejectedPolicy],
    ctx: &RuleContext<'_>,
) -> Option<ActionRules> {
    let of_action = |dry_run: bool| -> Vec<(&ConfigKey, &AuthorizationPolicy)> {
        policies.iter().filter(|p| p.spec.action == action && p.dry_run == dry_run).map(|p| (p.key, p.spec)).collect()
    };
    let rejected: &[&RejectedPolicy] = if action == Action::Deny { rejected } else { &[] };
    let rules = rbac_of(action, &of_action(false), rejected, ctx);
    let shadow = rbac_of(action, &of_action(true), &[], ctx);
    (rules.is_some() || shadow.is_some()).then_some(ActionRules { rules, shadow })
}

fn rbac_of(
    action: Action,
    of_action: &[(&ConfigKey, &AuthorizationPolicy)],
    rejected: &[&RejectedPolicy],
    ctx: &RuleContext<'_>,
) -> Option<Rbac> {
    if of_action.is_empty() && rejected.is_empty() {
        return None;
    }
    let envoy_action = match action {
        Action::Allow => rbac::Action::Allow,
        Action::Deny => rbac::Action::Deny,
        Action::Audit => rbac::Action::Log,
        // CUSTOM policies are translated by `custom_rules`.
        Action::Custom => return None,
    };
    let mut policies_out = rule_policies(action, of_action, ctx, &|key, i| rule_name(key, i));
    for r in rejected {
        let name = format!("ns[{}]-policy[{}]-rejected", r.key.namespace, r.key.name);
        policies_out.push((name, matching_everything()));
    }
    // One process-wide hasher: the same policies encode to the same bytes (and content hash).
    Some(Rbac { action: envoy_action as i32, policies: map_field(policies_out), ..Default::default() })
}

/// The RBAC policies of `policies`' rules translated with `action`'s semantics, named by `name`
/// (policy key, rule index).
fn rule_policies(
    action: Action,
    policies: &[(&ConfigKey, &AuthorizationPolicy)],
    ctx: &RuleContext<'_>,
    name: &dyn Fn(&ConfigKey, usize) -> String,
) -> Vec<(String, Policy)> {
    let mut out = Vec::new();
    for (key, policy) in policies {
        let rules = policy.rules.as_deref().unwrap_or_default();
        if rules.is_empty() {
            // No rules: a policy that never matches (an ALLOW policy alone then denies all).
            out.push((name(key, 0), never_matching()));
        }
        for (i, rule) in rules.iter().enumerate() {
            if let Some(p) = rule_policy(rule, action, &key.namespace, ctx) {
                out.push((name(key, i), p));
            }
        }
    }
    out
}

/// CUSTOM policies' rules as one RBAC of action DENY, each rule named
/// `{prefix}ns[NS]-policy[NAME]-rule[I]{suffix}`. As Istio does, CUSTOM rules are translated with
/// DENY semantics: on a TCP chain an HTTP-only field is left out, so the rule matches more (more
/// goes to the authorizer, or is denied), never less.
pub(super) fn custom_rules(policies: &[PolicyRef<'_>], prefix: &str, suffix: &str, ctx: &RuleContext<'_>) -> Rbac {
    let of_custom: Vec<(&ConfigKey, &AuthorizationPolicy)> =
        policies.iter().filter(|p| p.spec.action == Action::Custom).map(|p| (p.key, p.spec)).collect();
    let name = |key: &ConfigKey, i: usize| format!("{prefix}{}{suffix}", rule_name(key, i));
    let policies = rule_policies(Action::Deny, &of_custom, ctx, &name);
    Rbac { action: rbac::Action::Deny as i32, policies: map_field(policies), ..Default::default() }
}

/// Istio's RBAC policy name of a rule.
fn rule_name(key: &ConfigKey, i: usize) -> String {
    format!("ns[{}]-policy[{}]-rule[{i}]", key.namespace, key.name)
}

fn never_matching() -> Policy {
    Policy { permissions: vec![not_perm(any_perm())], principals: vec![not_id(any_id())], ..Default::default() }
}

fn matching_everything() -> Policy {
    Policy { permissions: vec![any_perm()], principals: vec![any_id()], ..Default::default() }
}

/// One rule's policy; `None` when an ALLOW rule holds something this chain cannot enforce.
fn rule_policy(rule: &Rule, action: Action, namespace: &str, ctx: &RuleContext<'_>) -> Option<Policy> {
    let mut base_permissions: Vec<Permission> = Vec::new();
    let mut base_principals: Vec<Principal> = Vec::new();
    for condition in &rule.when {
        match condition_side(&condition.key) {
            Side::Permission => base_permissions.extend(keep(action, condition_permissions(condition, ctx))?),
            Side::Principal => base_principals.extend(keep(action, condition_principals(condition, namespace, ctx))?),
        }
    }
    let mut principals = Vec::new();
    let sources: Vec<Option<&Source>> = match &rule.from {
        None => vec![None],
        Some(from) => from.iter().map(|f| f.source.as_ref()).collect(),
    };
    for source in sources {
        let mut and = Vec::new();
        if let Some(s) = source {
            and.extend(keep_fields(action, source_principals(s, namespace, ctx))?);
        }
        and.extend(base_principals.iter().cloned());
        // As istiod: always an AND, of `any` when the source names nothing.
        principals.push(and_ids(if and.is_empty() { vec![any_id()] } else { and }));
    }
    let mut permissions = Vec::new();
    let operations: Vec<Option<&Operation>> = match &rule.to {
        None => vec![None],
        Some(to) => to.iter().map(|t| t.operation.as_ref()).collect(),
    };
    for operation in operations {
        let mut and = Vec::new();
        if let Some(op) = operation {
            and.extend(keep_fields(action, operation_permissions(op, ctx))?);
        }
        and.extend(base_permissions.iter().cloned());
        permissions.push(and_perms(if and.is_empty() { vec![any_perm()] } else { and }));
    }
    Some(Policy { permissions, principals, ..Default::default() })
}

/// Istio's checkError: an ALLOW rule fails as a whole (`None`: it matches nothing, which allows
/// less); DENY and AUDIT rules leave the field out (which denies more).
fn keep<T>(action: Action, result: Result<Vec<T>, Unsupported>) -> Option<Vec<T>> {
    match result {
        Ok(v) => Some(v),
        Err(Unsupported(why)) if action == Action::Allow => {
            tracing::trace!(%why, "ALLOW rule dropped on this chain");
            None
        }
        Err(_) => Some(Vec::new()),
    }
}

/// [`keep`] for each field of a source or operation: one field that cannot apply fails an ALLOW
/// rule, and is left out of a DENY or AUDIT rule while the other fields stay.
fn keep_fields<T>(action: Action, fields: Vec<Result<Vec<T>, Unsupported>>) -> Option<Vec<T>> {
    let mut out = Vec::new();
    for field in fields {
        out.extend(keep(action, field)?);
    }
    Some(out)
}

/// Which side of an RBAC policy a `when` key belongs to (Istio's model).
enum Side {
    Permission,
    Principal,
}

fn condition_side(key: &str) -> Side {
    if matches!(key, "destination.ip" | "destination.port" | "connection.sni")
        || key.starts_with("experimental.envoy.filters.")
    {
        Side::Permission
    } else {
        Side::Principal
    }
}

/// `values` ORed, then `notValues` ORed and negated: the matchers a field adds to an AND (an OR
/// even of one value, as istiod writes it).
fn field<T>(
    values: &[String],
    not_values: &[String],
    one: impl Fn(&str) -> Result<T, Unsupported>,
    or: impl Fn(Vec<T>) -> T,
    not: impl Fn(T) -> T,
) -> Result<Vec<T>, Unsupported> {
    let mut out = Vec::new();
    if !values.is_empty() {
        let matched: Result<Vec<T>, _> = values.iter().map(|v| one(v)).collect();
        out.push(or(matched?));
    }
    if !not_values.is_empty() {
        let matched: Result<Vec<T>, _> = not_values.iter().map(|v| one(v)).collect();
        out.push(not(or(matched?)));
    }
    Ok(out)
}

fn principal_field(
    values: &[String],
    not_values: &[String],
    one: impl Fn(&str) -> Result<Principal, Unsupported>,
) -> Result<Vec<Principal>, Unsupported> {
    field(values, not_values, one, or_ids, not_id)
}

fn permission_field(
    values: &[String],
    not_values: &[String],
    one: impl Fn(&str) -> Result<Permission, Unsupported>,
) -> Result<Vec<Permission>, Unsupported> {
    field(values, not_values, one, or_perms, not_perm)
}

/// Istio's "extended" attributes (request principals, JWT claims, `experimental.envoy.filters.*`):
/// all `values` become one matcher and all `notValues` one negated matcher, with no OR wrapped
/// around either (istiod's shape for them).
fn extended_field<T>(
    values: &[String],
    not_values: &[String],
    all: impl Fn(&[String]) -> T,
    not: impl Fn(T) -> T,
) -> Vec<T> {
    let mut out = Vec::new();
    if !values.is_empty() {
        out.push(all(values));
    }
    if !not_values.is_empty() {
        out.push(not(all(not_values)));
    }
    out
}

/// Any of the request principals `values`: one `iss`/`sub` pair alone, several ORed.
fn request_principals(values: &[String]) -> Principal {
    let ids: Vec<Principal> = values.iter().map(|v| request_principal(v)).collect();
    match <[Principal; 1]>::try_from(ids) {
        Ok([one]) => one,
        Err(ids) => or_ids(ids),
    }
}

/// A JWT claim at `path` holding (or being) any of `values`.
fn claim_principal(path: &[&str], values: &[String]) -> Principal {
    payload(path, string_or_list(any_value(values.iter().map(|v| string_value(wildcard(v))).collect())))
}

/// Fails on TCP chains: the attribute exists only in HTTP requests.
fn http_only(ctx: &RuleContext<'_>, what: &str) -> Result<(), Unsupported> {
    match ctx.chain {
        ChainKind::Http => Ok(()),
        ChainKind::Tcp => Err(Unsupported(format!("{what} is an HTTP attribute, not available on a TCP chain"))),
    }
}

/// The matchers of a source, field by field (ANDed by the caller), in istiod's order.
fn source_principals(s: &Source, namespace: &str, ctx: &RuleContext<'_>) -> Vec<Result<Vec<Principal>, Unsupported>> {
    let request_principals = if s.request_principals.is_empty() && s.not_request_principals.is_empty() {
        Ok(Vec::new())
    } else {
        http_only(ctx, "requestPrincipals")
            .map(|_| extended_field(&s.request_principals, &s.not_request_principals, request_principals, not_id))
    };
    vec![
        principal_field(&s.principals, &s.not_principals, |v| Ok(source_principal(v, ctx))),
        request_principals,
        principal_field(&s.service_accounts, &s.not_service_accounts, |v| {
            Ok(peer_identity(spiffe_service_account(v, namespace)))
        }),
        principal_field(&s.trust_domains, &s.not_trust_domains, |v| Ok(peer_identity(spiffe_trust_domain(v)))),
        principal_field(&s.namespaces, &s.not_namespaces, |v| Ok(peer_identity(spiffe_namespace(v)))),
        principal_field(&s.remote_ip_blocks, &s.not_remote_ip_blocks, remote_ip),
        principal_field(&s.ip_blocks, &s.not_ip_blocks, direct_remote_ip),
    ]
}

/// The matchers of an operation, field by field (ANDed by the caller), in istiod's order.
fn operation_permissions(op: &Operation, ctx: &RuleContext<'_>) -> Vec<Result<Vec<Permission>, Unsupported>> {
    // Paths, methods and hosts exist only in HTTP requests.
    let http = |values: &[String],
                not_values: &[String],
                what: &str,
                one: &dyn Fn(&str) -> Result<Permission, Unsupported>| {
        if values.is_empty() && not_values.is_empty() {
            return Ok(Vec::new());
        }
        http_only(ctx, what).and_then(|_| permission_field(values, not_values, one))
    };
    let host = |v: &str| Ok(header_perm(header(":authority", v, true)));
    vec![
        http(&op.hosts, &op.not_hosts, "hosts", &host),
        http(&op.methods, &op.not_methods, "methods", &|v| Ok(header_perm(header(":method", v, false)))),
        http(&op.paths, &op.not_paths, "paths", &path),
        permission_field(&op.ports, &op.not_ports, destination_port),
    ]
}

fn condition_permissions(c: &Condition, _ctx: &RuleContext<'_>) -> Result<Vec<Permission>, Unsupported> {
    let key = c.key.as_str();
    match key {
        "destination.ip" => permission_field(&c.values, &c.not_values, |v| {
            let range = cidr(v).ok_or_else(|| Unsupported(format!("bad address {v}")))?;
            Ok(Permission { rule: Some(permission::Rule::DestinationIp(range)) })
        }),
        "destination.port" => permission_field(&c.values, &c.not_values, destination_port),
        "connection.sni" => permission_field(&c.values, &c.not_values, |v| {
            Ok(Permission { rule: Some(permission::Rule::RequestedServerName(wildcard(v))) })
        }),
        _ => {
            let (filter, path) = envoy_filter_key(key).ok_or_else(|| Unsupported(format!("unsupported key {key}")))?;
            Ok(extended_field(&c.values, &c.not_values, |vs| envoy_filter_permission(&filter, &path, vs), not_perm))
        }
    }
}

fn condition_principals(c: &Condition, namespace: &str, ctx: &RuleContext<'_>) -> Result<Vec<Principal>, Unsupported> {
    let key = c.key.as_str();
    let (values, not_values) = (&c.values, &c.not_values);
    match key {
        "source.ip" => principal_field(values, not_values, direct_remote_ip),
        "remote.ip" => principal_field(values, not_values, remote_ip),
        "source.namespace" => principal_field(values, not_values, |v| Ok(peer_identity(spiffe_namespace(v)))),
        "source.principal" => principal_field(values, not_values, |v| Ok(source_principal(v, ctx))),
        "source.serviceAccount" => {
            principal_field(values, not_values, |v| Ok(peer_identity(spiffe_service_account(v, namespace))))
        }
        "source.trustDomain" => principal_field(values, not_values, |v| Ok(peer_identity(spiffe_trust_domain(v)))),
        _ => {
            http_only(ctx, key)?;
            if key == "request.auth.principal" {
                return Ok(extended_field(values, not_values, request_principals, not_id));
            }
            if let Some(name) = bracketed(key, "request.headers") {
                let name = name.first().cloned().unwrap_or_default();
                return principal_field(values, not_values, |v| Ok(header_id(header(&name, v, false))));
            }
            let claim: Vec<String> = match key {
                "request.auth.audiences" => vec!["aud".into()],
                "request.auth.presenter" => vec!["azp".into()],
                _ => bracketed(key, "request.auth.claims")
                    .ok_or_else(|| Unsupported(format!("unsupported key {key}")))?,
            };
            let path: Vec<&str> = claim.iter().map(String::as_str).collect();
            Ok(extended_field(values, not_values, |vs| claim_principal(&path, vs), not_id))
        }
    }
}

/// `prefix[a][b]` → `[a, b]`.
fn bracketed(key: &str, prefix: &str) -> Option<Vec<String>> {
    let rest = key.strip_prefix(prefix)?.strip_prefix('[')?.strip_suffix(']')?;
    let parts: Vec<String> = rest.split("][").map(str::to_string).collect();
    parts.iter().all(|p| !p.is_empty()).then_some(parts)
}

/// `experimental.envoy.filters.a.b[k1][k2]` → (`envoy.filters.a.b`, `[k1, k2]`). istiod reads
/// `k1][k2` as one key, which no metadata has: a DENY condition on it would never match, so
/// meshpilot reads the nested path the user wrote (the same matcher as istiod's for one key).
fn envoy_filter_key(key: &str) -> Option<(String, Vec<String>)> {
    let rest = key.strip_prefix("experimental.")?;
    let open = rest.find('[')?;
    let (filter, _) = rest.split_at(open);
    Some((filter.to_string(), bracketed(rest, filter)?))
}

/// Istio's experimental metadata condition: the filter's metadata at `path` matching any of
/// `values`, where a `[v]` value matches a list holding `v`.
fn envoy_filter_permission(filter: &str, path: &[String], values: &[String]) -> Permission {
    let path: Vec<&str> = path.iter().map(String::as_str).collect();
    let matchers = values
        .iter()
        .map(|value| match value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
            Some(inner) => list_holding(string_value(wildcard(inner))),
            None => string_value(wildcard(value)),
        })
        .collect();
    // istiod writes the deprecated `metadata` rule; Envoy reads it as `sourced_metadata` from the
    // request's dynamic metadata, the same matcher.
    #[allow(deprecated)]
    let rule = permission::Rule::Metadata(super::matchers::metadata(filter, &path, any_value(matchers)));
    Permission { rule: Some(rule) }
}

/// An Istio principal. Written for the mesh trust domain or for `cluster.local`, it stands for
/// the mesh trust domain (Istio's trust-domain migration; meshpilot knows no aliases).
fn source_principal(value: &str, ctx: &RuleContext<'_>) -> Principal {
    const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";
    let parts: Vec<&str> = value.split('/').collect();
    let migrated = match parts.as_slice() {
        [td, rest @ ..]
            if rest.len() == 4 && *td != "*" && (*td == ctx.trust_domain || *td == DEFAULT_TRUST_DOMAIN) =>
        {
            format!("{}/{}", ctx.trust_domain, rest.join("/"))
        }
        _ => value.to_string(),
    };
    peer_identity(spiffe_principal(&migrated))
}

fn direct_remote_ip(v: &str) -> Result<Principal, Unsupported> {
    use envoy_types::pb::envoy::config::rbac::v3::principal::Identifier;
    let range = cidr(v).ok_or_else(|| Unsupported(format!("bad address {v}")))?;
    Ok(Principal { identifier: Some(Identifier::DirectRemoteIp(range)) })
}

fn remote_ip(v: &str) -> Result<Principal, Unsupported> {
    use envoy_types::pb::envoy::config::rbac::v3::principal::Identifier;
    let range = cidr(v).ok_or_else(|| Unsupported(format!("bad address {v}")))?;
    Ok(Principal { identifier: Some(Identifier::RemoteIp(range)) })
}

fn destination_port(v: &str) -> Result<Permission, Unsupported> {
    let port = v.parse::<u32>().map_err(|_| Unsupported(format!("bad port {v}")))?;
    Ok(Permission { rule: Some(permission::Rule::DestinationPort(port)) })
}

/// A path (without query): `*` wildcards, or Istio's `{*}`/`{**}` templates as Envoy's URI
/// template matcher (`*` one segment, `**` any), as istiod writes them.
fn path(v: &str) -> Result<Permission, Unsupported> {
    use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
    use envoy_types::pb::envoy::extensions::path::r#match::uri_template::v3::UriTemplateMatchConfig;
    use envoy_types::pb::envoy::r#type::matcher::v3::{path_matcher, PathMatcher};
    if v.contains("{*}") || v.contains("{**}") {
        let template = UriTemplateMatchConfig { path_template: v.replace("{**}", "**").replace("{*}", "*") };
        let config = TypedExtensionConfig { name: "uri-template".into(), typed_config: Some(any(template)) };
        return Ok(Permission { rule: Some(permission::Rule::UriTemplate(config)) });
    }
    Ok(Permission {
        rule: Some(permission::Rule::UrlPath(PathMatcher { rule: Some(path_matcher::Rule::Path(wildcard(v))) })),
    })
}

fn header_perm(m: HeaderMatcher) -> Permission {
    Permission { rule: Some(permission::Rule::Header(m)) }
}

fn header_id(m: HeaderMatcher) -> Principal {
    use envoy_types::pb::envoy::config::rbac::v3::principal::Identifier;
    Principal { identifier: Some(Identifier::Header(m)) }
}

fn any_perm() -> Permission {
    Permission { rule: Some(permission::Rule::Any(true)) }
}

fn not_perm(p: Permission) -> Permission {
    Permission { rule: Some(permission::Rule::NotRule(Box::new(p))) }
}

fn and_perms(rules: Vec<Permission>) -> Permission {
    Permission { rule: Some(permission::Rule::AndRules(permission::Set { rules })) }
}

fn or_perms(rules: Vec<Permission>) -> Permission {
    Permission { rule: Some(permission::Rule::OrRules(permission::Set { rules })) }
}

#[cfg(test)]
mod path_tests {
    use envoy_types::pb::envoy::extensions::path::r#match::uri_template::v3::UriTemplateMatchConfig;
    use prost::Message;

    use super::*;

    #[test]
    fn path_templates_become_uri_template_matchers() {
        let Ok(Permission { rule: Some(permission::Rule::UriTemplate(c)) }) = path("/store/{*}/items/{**}") else {
            panic!("a URI template expected")
        };
        assert_eq!(c.name, "uri-template");
        let any = c.typed_config.expect("config");
        let t = UriTemplateMatchConfig::decode(any.value.as_slice()).expect("decodes");
        assert_eq!(t.path_template, "/store/*/items/**");
        assert!(matches!(path("/api/*"), Ok(Permission { rule: Some(permission::Rule::UrlPath(_)) })));
    }
}
