//! AuthorizationPolicy rules, after Istio's `ValidateAuthorizationPolicy` and the attribute checks
//! of its `pkg/config/security`. A CUSTOM policy names an extension provider of the mesh config;
//! whether that provider exists is known only against the mesh config and the registry, so it is
//! checked where the snapshot is built (a policy naming none that works keeps its scope denied).

use crate::config::api::authorization_policy::{Action, AuthorizationPolicy, Operation, Rule, Source};

use super::addresses::check_ip_or_cidr;
use super::field_errors::{forbidden, invalid, required, Errors};
use super::policy_target::check_policy_target;

/// Longest service account value (`ns/sa`), as Istio bounds it.
const MAX_SERVICE_ACCOUNT_LEN: usize = 320;

/// Most service accounts in one list, as Istio bounds it.
const MAX_SERVICE_ACCOUNTS: usize = 16;

/// Most `rules`, and most `from` entries of a rule (the CRD's `maxItems`).
const MAX_ITEMS: usize = 512;

/// Checks an AuthorizationPolicy.
pub(super) fn validate(policy: &AuthorizationPolicy, errors: &mut Errors) {
    check_policy_target(errors, policy.selector.as_ref(), policy.target_ref.as_ref(), &policy.target_refs);
    match policy.action {
        Action::Custom if policy.rules.is_none() => errors.add(
            "spec.rules",
            required(
                "CUSTOM action without `rules` is meaningless as it will never be triggered, add an empty rule `{}` \
                 if you want it be triggered for every request",
            ),
        ),
        Action::Custom if policy.provider.as_ref().is_none_or(|p| p.name.is_empty()) => {
            errors.add("spec.provider.name", required("`provider.name` must not be empty"))
        }
        Action::Custom => {}
        _ if policy.provider.is_some() => errors.add(
            "spec.provider",
            forbidden(format!("`provider` must not be with non CUSTOM action, found {}", policy.action.name())),
        ),
        Action::Deny if policy.rules.is_none() => errors.add(
            "spec.rules",
            required(
                "DENY action without `rules` is meaningless as it will never be triggered, add an empty rule `{}` \
                 if you want it be triggered for every request",
            ),
        ),
        _ => {}
    }
    let rules = policy.rules.as_deref().unwrap_or_default();
    if rules.len() > MAX_ITEMS {
        errors.add("spec.rules", super::field_errors::too_many(rules.len(), MAX_ITEMS));
    }
    for (i, rule) in rules.iter().enumerate() {
        check_rule(errors, &format!("spec.rules[{i}]"), rule);
        if policy.action == Action::Custom {
            check_custom_rule(errors, &format!("spec.rules[{i}]"), rule);
        }
    }
}

/// The attributes Istio does not support with CUSTOM: peer and request identities (the external
/// authorizer sees the request, not what mutual TLS or JWT authentication established).
fn check_custom_rule(errors: &mut Errors, path: &str, rule: &Rule) {
    let unsupported = |what: &str| forbidden(format!("{what} is currently not supported with CUSTOM action"));
    for (j, from) in rule.from.iter().flatten().enumerate() {
        let Some(s) = &from.source else { continue };
        let identities: [(&str, &str, &Vec<String>); 10] = [
            ("namespaces", "From.Namespaces", &s.namespaces),
            ("notNamespaces", "From.NotNamespaces", &s.not_namespaces),
            ("serviceAccounts", "From.ServiceAccounts", &s.service_accounts),
            ("notServiceAccounts", "From.NotServiceAccounts", &s.not_service_accounts),
            ("trustDomains", "From.TrustDomains", &s.trust_domains),
            ("notTrustDomains", "From.NotTrustDomains", &s.not_trust_domains),
            ("principals", "From.Principals", &s.principals),
            ("notPrincipals", "From.NotPrincipals", &s.not_principals),
            ("requestPrincipals", "From.RequestPrincipals", &s.request_principals),
            ("notRequestPrincipals", "From.NotRequestPrincipals", &s.not_request_principals),
        ];
        for (field, name, values) in identities {
            if !values.is_empty() {
                errors.add(format!("{path}.from[{j}].source.{field}"), unsupported(name));
            }
        }
    }
    for (j, condition) in rule.when.iter().enumerate() {
        let key = condition.key.as_str();
        let identity =
            matches!(key, "source.namespace" | "source.serviceAccount" | "source.trustDomain" | "source.principal")
                || key.starts_with("request.auth.");
        if identity {
            errors.add(format!("{path}.when[{j}].key"), unsupported(key));
        }
    }
}

fn check_rule(errors: &mut Errors, path: &str, rule: &Rule) {
    match rule.from.as_deref() {
        Some([]) => errors.add(format!("{path}.from"), required("`from` must not be empty")),
        Some(from) if from.len() > MAX_ITEMS => {
            errors.add(format!("{path}.from"), super::field_errors::too_many(from.len(), MAX_ITEMS))
        }
        _ => {}
    }
    for (j, from) in rule.from.iter().flatten().enumerate() {
        let path = format!("{path}.from[{j}].source");
        match &from.source {
            None => errors.add(path, required("`from.source` must not be nil")),
            Some(source) => check_source(errors, &path, source),
        }
    }
    if rule.to.as_ref().is_some_and(Vec::is_empty) {
        errors.add(format!("{path}.to"), required("`to` must not be empty"));
    }
    for (j, to) in rule.to.iter().flatten().enumerate() {
        let path = format!("{path}.to[{j}].operation");
        match &to.operation {
            None => errors.add(path, required("`to.operation` must not be nil")),
            Some(op) => check_operation(errors, &path, op),
        }
    }
    for (j, condition) in rule.when.iter().enumerate() {
        let path = format!("{path}.when[{j}]");
        if condition.key.is_empty() {
            errors.add(format!("{path}.key"), required("`key` must not be empty"));
        } else if condition.values.is_empty() && condition.not_values.is_empty() {
            errors.add(
                path,
                required(format!("at least one of `values` or `notValues` must be set for key {}", condition.key)),
            );
        } else {
            for (field, values) in [("values", &condition.values), ("notValues", &condition.not_values)] {
                if let Err(e) = check_attribute(&condition.key, values) {
                    errors.add(format!("{path}.{field}"), invalid(&condition.key, e));
                }
            }
        }
    }
}

fn check_source(errors: &mut Errors, path: &str, s: &Source) {
    let identity = [&s.principals, &s.not_principals, &s.namespaces, &s.not_namespaces];
    if identity.iter().any(|v| !v.is_empty()) && !(s.service_accounts.is_empty() && s.not_service_accounts.is_empty()) {
        errors.add(path, forbidden("cannot set serviceAccounts with namespaces or principals"));
    }
    let lists: [(&str, &Vec<String>); 14] = [
        ("principals", &s.principals),
        ("notPrincipals", &s.not_principals),
        ("requestPrincipals", &s.request_principals),
        ("notRequestPrincipals", &s.not_request_principals),
        ("namespaces", &s.namespaces),
        ("notNamespaces", &s.not_namespaces),
        ("serviceAccounts", &s.service_accounts),
        ("notServiceAccounts", &s.not_service_accounts),
        ("trustDomains", &s.trust_domains),
        ("notTrustDomains", &s.not_trust_domains),
        ("ipBlocks", &s.ip_blocks),
        ("notIpBlocks", &s.not_ip_blocks),
        ("remoteIpBlocks", &s.remote_ip_blocks),
        ("notRemoteIpBlocks", &s.not_remote_ip_blocks),
    ];
    if lists.iter().all(|(_, v)| v.is_empty()) {
        errors.add(path, required("`from.source` must not be empty"));
    }
    for (name, values) in lists {
        let field = format!("{path}.{name}");
        let result = match name {
            "serviceAccounts" | "notServiceAccounts" => check_service_accounts(values),
            "trustDomains" | "notTrustDomains" => check_trust_domains(values),
            "ipBlocks" | "notIpBlocks" | "remoteIpBlocks" | "notRemoteIpBlocks" => check_ips(values),
            _ => check_not_empty(values),
        };
        errors.check(field, result);
    }
}

fn check_operation(errors: &mut Errors, path: &str, op: &Operation) {
    let lists: [(&str, &Vec<String>); 8] = [
        ("hosts", &op.hosts),
        ("notHosts", &op.not_hosts),
        ("ports", &op.ports),
        ("notPorts", &op.not_ports),
        ("methods", &op.methods),
        ("notMethods", &op.not_methods),
        ("paths", &op.paths),
        ("notPaths", &op.not_paths),
    ];
    if lists.iter().all(|(_, v)| v.is_empty()) {
        errors.add(path, required("`to.operation` must not be empty"));
    }
    for (name, values) in lists {
        let field = format!("{path}.{name}");
        let result = match name {
            "ports" | "notPorts" => check_not_empty(values).and_then(|_| check_ports(values)),
            "paths" | "notPaths" => check_not_empty(values).and_then(|_| check_path_templates(values)),
            _ => check_not_empty(values),
        };
        errors.check(field, result);
    }
}

fn check_not_empty(values: &[String]) -> Result<(), String> {
    match values.iter().position(String::is_empty) {
        Some(i) => Err(invalid("", format!("empty value not allowed (item {i})"))),
        None => Ok(()),
    }
}

fn check_ips(values: &[String]) -> Result<(), String> {
    check_not_empty(values)?;
    for v in values {
        check_ip_or_cidr(v).map_err(|e| invalid(v, e))?;
    }
    Ok(())
}

fn check_ports(values: &[String]) -> Result<(), String> {
    for v in values {
        if !v.parse::<u32>().is_ok_and(|p| p <= 65535) {
            return Err(invalid(v, "bad port: must be a number between 0 and 65535"));
        }
    }
    Ok(())
}

fn check_wildcards(values: &[String]) -> Result<(), String> {
    check_not_empty(values)?;
    for v in values {
        let count = v.matches('*').count();
        if count > 1 {
            return Err(invalid(v, "at most one wildcard is allowed"));
        }
        if count == 1 && v != "*" && !v.starts_with('*') && !v.ends_with('*') {
            return Err(invalid(v, "wildcard is only allowed at the start or end"));
        }
    }
    Ok(())
}

fn check_trust_domains(values: &[String]) -> Result<(), String> {
    check_wildcards(values)?;
    match values.iter().find(|v| v.contains('/')) {
        Some(v) => Err(invalid(v, "trust domain must not contain '/'")),
        None => Ok(()),
    }
}

fn check_service_accounts(values: &[String]) -> Result<(), String> {
    if values.len() > MAX_SERVICE_ACCOUNTS {
        return Err(invalid(values.len(), "may not have more than 16 values"));
    }
    check_not_empty(values)?;
    for v in values {
        if v.contains('*') {
            return Err(invalid(v, "wildcard not allowed"));
        }
        if v.len() > MAX_SERVICE_ACCOUNT_LEN {
            return Err(invalid(v, "value cannot exceed 320 characters"));
        }
        let parts: Vec<&str> = v.split('/').collect();
        if parts.len() > 2 || parts.iter().any(|p| p.is_empty()) {
            return Err(invalid(v, "expected format 'serviceAccount' or 'namespace/serviceAccount'"));
        }
    }
    Ok(())
}

/// Istio's path templates: `{*}` (one segment) and `{**}` (the rest, last), in whole segments of
/// literal characters.
fn check_path_templates(paths: &[String]) -> Result<(), String> {
    for path in paths {
        let templated = path.contains("{*}") || path.contains("{**}");
        let mut any_seen = false;
        for glob in path.trim_matches('/').split('/') {
            match glob {
                "{*}" | "{**}" if any_seen => {
                    return Err(invalid(path, "invalid or unsupported path: {**} is not the last operator"));
                }
                "{*}" => {}
                "{**}" => any_seen = true,
                _ if glob.contains(['{', '}']) => {
                    return Err(invalid(
                        path,
                        "invalid or unsupported path: contains '{' or '}' beyond a supported path template",
                    ));
                }
                _ if templated && !is_valid_literal(glob) => {
                    return Err(invalid(path, format!("invalid or unsupported path: invalid string literal {glob:?}")));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

fn is_valid_literal(glob: &str) -> bool {
    !glob.is_empty() && glob.chars().all(|c| c.is_ascii_alphanumeric() || "-._~%!$&'()+,;:@=".contains(c))
}

/// Checks the key and values of a `when` condition; Istio's `ValidateAttribute`.
fn check_attribute(key: &str, values: &[String]) -> Result<(), String> {
    check_not_empty(values)?;
    let map_key = || {
        let open = key.find('[');
        if key.ends_with(']') && open.is_some_and(|o| o > 0 && o < key.len() - 2) {
            Ok(())
        } else {
            Err(format!("bad key ({key}): should have format a[b]"))
        }
    };
    match key {
        _ if key.starts_with("request.headers") => map_key(),
        "source.ip" | "remote.ip" | "destination.ip" => check_ips(values),
        "source.serviceAccount" => check_service_accounts(values),
        "source.trustDomain" => check_wildcards(values),
        "source.namespace"
        | "source.principal"
        | "request.auth.principal"
        | "request.auth.audiences"
        | "request.auth.presenter"
        | "connection.sni" => Ok(()),
        _ if key.starts_with("request.auth.claims") => map_key(),
        "destination.port" => check_ports(values),
        _ if key.starts_with("experimental.envoy.filters.") => map_key(),
        "destination.namespace" => Err(format!("attribute {key} is replaced by the metadata.namespace")),
        _ if key.starts_with("destination.labels") => {
            Err(format!("attribute {key} is replaced by the workload selector"))
        }
        "destination.name" | "destination.user" => {
            Err(format!("deprecated attribute {key}: only supported in v1alpha1"))
        }
        _ => Err(format!("unknown attribute: {key}")),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::validation::testing::{assert_error, document, first_error, first_error_of};

    const KIND: &str = "AuthorizationPolicy";

    fn doc(spec: &str) -> String {
        document(KIND, "p", spec)
    }

    fn error(spec: &str) -> Option<(String, String)> {
        first_error(KIND, spec).map(|e| (e.field, e.reason))
    }

    #[track_caller]
    fn assert_rejected(spec: &str, field: &str, reason: &str) {
        assert_error(KIND, spec, field, reason);
    }

    #[test]
    fn istio_documented_policies_are_valid() {
        for spec in [
            "{}",
            "action: ALLOW",
            "action: DENY\nrules: [{}]",
            "rules: [{}]",
            "selector: {matchLabels: {app: httpbin}}\nrules:\n- from: [{source: {principals: [cluster.local/ns/default/sa/sleep]}}]\n  to: [{operation: {methods: [GET], paths: [/info*]}}]\n  when: [{key: 'request.auth.claims[iss]', values: ['https://accounts.google.com']}]",
            "action: DENY\nrules:\n- from: [{source: {notNamespaces: [foo]}}]\n  to: [{operation: {notPaths: [/healthz], ports: ['8080']}}]",
            "rules:\n- from: [{source: {requestPrincipals: ['*'], remoteIpBlocks: [10.0.0.0/8], notIpBlocks: ['1.2.3.4']}}]",
            "rules:\n- when:\n  - {key: 'request.headers[x-user]', values: [alice]}\n  - {key: source.ip, notValues: [10.0.0.1]}\n  - {key: destination.port, values: ['80']}\n  - {key: connection.sni, values: [a.example.com]}\n  - {key: 'request.auth.claims[groups][admin]', values: [x]}\n  - {key: 'experimental.envoy.filters.network.mysql_proxy[db.table]', values: ['[update]']}",
            "rules:\n- to: [{operation: {paths: ['/store/{*}/items/{**}']}}]",
            "action: AUDIT\nrules: [{to: [{operation: {methods: [POST]}}]}]",
        ] {
            assert_eq!(error(spec), None, "{spec}");
        }
    }

    #[test]
    fn custom_needs_a_provider_and_rules_as_in_istio() {
        for spec in [
            "action: CUSTOM\nprovider: {name: ext}\nrules: [{}]",
            "action: CUSTOM\nprovider: {name: ext}\nrules: []",
            "action: CUSTOM\nprovider: {name: ext}\nrules:\n- to: [{operation: {paths: [/admin]}}]\n  from: [{source: {ipBlocks: [10.0.0.0/8]}}]\n  when: [{key: 'request.headers[x-a]', values: [b]}]",
        ] {
            assert_eq!(error(spec), None, "{spec}");
        }
        assert_rejected("action: CUSTOM\nprovider: {name: ext}", "spec.rules", "CUSTOM action without `rules`");
        assert_rejected("action: CUSTOM\nrules: [{}]", "spec.provider.name", "`provider.name` must not be empty");
        assert_rejected("action: CUSTOM\nprovider: {}\nrules: [{}]", "spec.provider.name", "must not be empty");
        assert_rejected("provider: {name: ext}\nrules: [{}]", "spec.provider", "must not be with non CUSTOM action");
        assert_rejected(
            "action: DENY\nprovider: {name: ext}\nrules: [{}]",
            "spec.provider",
            "must not be with non CUSTOM action, found DENY",
        );
    }

    #[test]
    fn custom_refuses_identity_attributes_as_in_istio() {
        assert_rejected(
            "action: CUSTOM\nprovider: {name: ext}\nrules: [{from: [{source: {principals: [a]}}]}]",
            "spec.rules[0].from[0].source.principals",
            "From.Principals is currently not supported with CUSTOM action",
        );
        assert_rejected(
            "action: CUSTOM\nprovider: {name: ext}\nrules: [{from: [{source: {requestPrincipals: ['*']}}]}]",
            "spec.rules[0].from[0].source.requestPrincipals",
            "From.RequestPrincipals is currently not supported",
        );
        assert_rejected(
            "action: CUSTOM\nprovider: {name: ext}\nrules: [{when: [{key: 'request.auth.claims[iss]', values: [x]}]}]",
            "spec.rules[0].when[0].key",
            "request.auth.claims[iss] is currently not supported with CUSTOM action",
        );
        assert_rejected(
            "action: CUSTOM\nprovider: {name: ext}\nrules: [{when: [{key: source.namespace, values: [x]}]}]",
            "spec.rules[0].when[0].key",
            "not supported with CUSTOM",
        );
    }

    #[test]
    fn deny_without_rules_is_rejected() {
        assert_rejected("action: DENY", "spec.rules", "DENY action without `rules` is meaningless");
    }

    #[test]
    fn empty_lists_and_entries_are_rejected_with_their_path() {
        assert_rejected("rules: [{from: []}]", "spec.rules[0].from", "`from` must not be empty");
        assert_rejected("rules: [{to: []}]", "spec.rules[0].to", "`to` must not be empty");
        assert_rejected("rules: [{from: [{}]}]", "spec.rules[0].from[0].source", "must not be nil");
        assert_rejected("rules: [{from: [{source: {}}]}]", "spec.rules[0].from[0].source", "must not be empty");
        assert_rejected("rules: [{to: [{operation: {}}]}]", "spec.rules[0].to[0].operation", "must not be empty");
        assert_rejected(
            "rules: [{to: [{operation: {paths: ['']}}]}]",
            "spec.rules[0].to[0].operation.paths",
            "empty value not allowed",
        );
    }

    #[test]
    fn addresses_ports_and_accounts_are_checked() {
        assert_rejected(
            "rules: [{from: [{source: {ipBlocks: [10.0.0.0/33]}}]}]",
            "spec.rules[0].from[0].source.ipBlocks",
            "not a valid CIDR",
        );
        assert_rejected(
            "rules: [{from: [{source: {remoteIpBlocks: [nope]}}]}]",
            "spec.rules[0].from[0].source.remoteIpBlocks",
            "not a valid IP",
        );
        assert_rejected(
            "rules: [{to: [{operation: {ports: ['70000']}}]}]",
            "spec.rules[0].to[0].operation.ports",
            "bad port",
        );
        assert_rejected(
            "rules: [{from: [{source: {serviceAccounts: [a/b/c]}}]}]",
            "spec.rules[0].from[0].source.serviceAccounts",
            "expected format",
        );
        assert_rejected(
            "rules: [{from: [{source: {serviceAccounts: [a], namespaces: [b]}}]}]",
            "spec.rules[0].from[0].source",
            "cannot set serviceAccounts with namespaces or principals",
        );
        assert_rejected(
            "rules: [{from: [{source: {trustDomains: [a/b]}}]}]",
            "spec.rules[0].from[0].source.trustDomains",
            "must not contain '/'",
        );
    }

    #[test]
    fn conditions_follow_istio_attributes() {
        assert_rejected("rules: [{when: [{key: 'request.headers[a]'}]}]", "spec.rules[0].when[0]", "at least one of");
        assert_rejected("rules: [{when: [{key: '', values: [a]}]}]", "spec.rules[0].when[0].key", "must not be empty");
        assert_rejected(
            "rules: [{when: [{key: foo.bar, values: [a]}]}]",
            "spec.rules[0].when[0].values",
            "unknown attribute",
        );
        assert_rejected(
            "rules: [{when: [{key: request.headers, values: [a]}]}]",
            "spec.rules[0].when[0].values",
            "should have format a[b]",
        );
        assert_rejected(
            "rules: [{when: [{key: 'destination.labels[app]', values: [a]}]}]",
            "spec.rules[0].when[0].values",
            "replaced by the workload selector",
        );
        assert_rejected(
            "rules: [{when: [{key: source.ip, notValues: [x]}]}]",
            "spec.rules[0].when[0].notValues",
            "not a valid IP",
        );
    }

    #[test]
    fn list_sizes_follow_the_crd() {
        let many: Vec<String> = (0..513).map(|_| "{}".to_string()).collect();
        assert_rejected(&format!("rules: [{}]", many.join(", ")), "spec.rules", "Too many: 513");
        let from: Vec<String> = (0..513).map(|_| "{source: {namespaces: [a]}}".to_string()).collect();
        assert_rejected(&format!("rules: [{{from: [{}]}}]", from.join(", ")), "spec.rules[0].from", "Too many");
    }

    #[test]
    fn path_templates_are_checked() {
        assert_rejected(
            "rules: [{to: [{operation: {paths: ['/a/{**}/b/{*}']}}]}]",
            "spec.rules[0].to[0].operation.paths",
            "{**} is not the last operator",
        );
        assert_rejected(
            "rules: [{to: [{operation: {notPaths: ['/a/{x}']}}]}]",
            "spec.rules[0].to[0].operation.notPaths",
            "beyond a supported path template",
        );
    }

    #[test]
    fn selectors_and_target_refs() {
        assert_rejected("selector: {matchLabels: {app: '*'}}", "spec.selector.matchLabels[app]", "wildcard");
        assert_rejected(
            "targetRef: {kind: Gateway, group: gateway.networking.k8s.io, name: gw}",
            "spec.targetRef",
            "not supported by meshpilot",
        );
        assert_rejected(
            "selector: {matchLabels: {app: a}}\ntargetRefs: [{kind: Service, name: a}]",
            "spec",
            "only one of targetRefs or workloadSelector",
        );
    }

    #[test]
    fn unknown_fields_and_versions_are_rejected() {
        assert_rejected(
            "rules: [{from: [{source: {principles: [a]}}]}]",
            "spec.rules[0].from[0].source.principles",
            "unknown field",
        );
        let v1alpha1 = doc("{}").replace("security.istio.io/v1", "security.istio.io/v1alpha1");
        let e = first_error_of(&v1alpha1).expect("rejected");
        assert_eq!(e.field, "apiVersion");
        let networking = doc("{}").replace("security.istio.io", "networking.istio.io");
        let docs = crate::config::parse::parse_file("t.yaml", &networking);
        assert!(matches!(&docs[0], crate::config::parse::Document::Ignored { .. }), "{docs:?}");
    }
}
