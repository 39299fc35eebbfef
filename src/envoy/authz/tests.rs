//! The generated security filters, read back as Envoy would hold them (config-dump-like): filter
//! order, RBAC policies per rule, exact principal matchers, TCP fail-closed rules, rejected
//! policies, JWT providers and the JWKS cluster.

use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::listener::v3::{filter, Filter, FilterChain, Listener};
use envoy_types::pb::envoy::config::rbac::v3::{permission, principal, rbac, Permission, Policy, Principal, Rbac};
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    jwt_provider::JwksSourceSpecifier, jwt_requirement::RequiresType, requirement_rule::RequirementType,
    JwtAuthentication,
};
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_filter, HttpConnectionManager,
};
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use envoy_types::pb::envoy::r#type::matcher::v3::{string_matcher::MatchPattern, StringMatcher};

use crate::config::parse::{parse_file, Document};
use crate::envoy::names::VIRTUAL_INBOUND_LISTENER;
use crate::envoy::testing::{find, names, router, sidecar_at, testdata, unpack};
use crate::envoy::ProxyView;
use crate::envoy::TypeUrl;
use crate::mesh::MeshConfig;
use crate::snapshot::{ChangeSet, Snapshot, SourceState, Version};

/// inbound.yaml and security.yaml plus `extra`; invalid documents become the snapshot's errors.
fn snapshot_with(extra: &str, trust_domain: &str) -> Snapshot {
    let read = |f: &str| std::fs::read_to_string(testdata().join(f)).expect("testdata");
    let text = [read("inbound.yaml"), read("security.yaml"), extra.to_string()].join("\n---\n");
    let mut state = SourceState::default();
    let mut errors = Vec::new();
    for doc in parse_file("test.yaml", &text) {
        match doc {
            Document::Valid(o) => {
                state.configs.insert(o.key.clone(), Arc::new(o));
            }
            Document::Invalid(e) => errors.push(e),
            Document::Ignored { .. } => {}
        }
    }
    state.errors = Arc::new(errors);
    state.mesh = Arc::new(MeshConfig { trust_domain: trust_domain.into(), ..Default::default() });
    Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state)
}

fn orders() -> ProxyView {
    sidecar_at("shop", &[("app", "orders")], &["10.2.0.5"])
}

fn chain<'a>(l: &'a Listener, name: &str, http: bool) -> &'a FilterChain {
    l.filter_chains
        .iter()
        .filter(|c| c.name == name)
        .find(|c| {
            (c.filters.last().map(|f| f.name.as_str()) == Some(super::super::names::ext::HTTP_CONNECTION_MANAGER))
                == http
        })
        .unwrap_or_else(|| panic!("no {} chain {name}", if http { "HTTP" } else { "TCP" }))
}

fn typed<T: prost::Message + Default>(f: &Filter) -> T {
    match &f.config_type {
        Some(filter::ConfigType::TypedConfig(any)) => unpack(any),
        other => panic!("no typed config: {other:?}"),
    }
}

/// The HTTP filters of a chain's connection manager: (name, RBAC rules if an RBAC filter).
fn http_filters(c: &FilterChain) -> Vec<(String, Option<Rbac>, Option<JwtAuthentication>)> {
    let hcm: HttpConnectionManager = typed(c.filters.last().expect("a filter"));
    hcm.http_filters
        .iter()
        .map(|f| {
            let any = match &f.config_type {
                Some(http_filter::ConfigType::TypedConfig(any)) => any.clone(),
                other => panic!("{other:?}"),
            };
            let rbac = f.name.ends_with(".rbac").then(|| unpack::<HttpRbac>(&any).rules.expect("rules"));
            let jwt = f.name.ends_with(".jwt_authn").then(|| unpack::<JwtAuthentication>(&any));
            (f.name.clone(), rbac, jwt)
        })
        .collect()
}

fn rbac_of(filters: &[(String, Option<Rbac>, Option<JwtAuthentication>)], action: rbac::Action) -> Rbac {
    filters
        .iter()
        .filter_map(|(_, r, _)| r.clone())
        .find(|r| r.action == action as i32)
        .unwrap_or_else(|| panic!("no {action:?} RBAC filter"))
}

fn pattern(m: &StringMatcher) -> String {
    let p = match &m.match_pattern {
        Some(MatchPattern::Exact(v)) => format!("exact:{v}"),
        Some(MatchPattern::Prefix(v)) => format!("prefix:{v}"),
        Some(MatchPattern::Suffix(v)) => format!("suffix:{v}"),
        Some(MatchPattern::SafeRegex(r)) => format!("regex:{}", r.regex),
        other => format!("{other:?}"),
    };
    if m.ignore_case {
        format!("{p} (ignore case)")
    } else {
        p
    }
}

/// Every peer identity matcher of a principal tree, with `!` for those under a NOT.
fn identities(p: &Principal, negated: bool, out: &mut Vec<String>) {
    match &p.identifier {
        Some(principal::Identifier::AndIds(s)) | Some(principal::Identifier::OrIds(s)) => {
            s.ids.iter().for_each(|i| identities(i, negated, out))
        }
        Some(principal::Identifier::NotId(i)) => identities(i, !negated, out),
        Some(principal::Identifier::Authenticated(a)) => {
            let m = a.principal_name.as_ref().map(pattern).unwrap_or_default();
            out.push(if negated { format!("!{m}") } else { m });
        }
        _ => {}
    }
}

fn policy_identities(p: &Policy) -> Vec<String> {
    let mut out = Vec::new();
    p.principals.iter().for_each(|pr| identities(pr, false, &mut out));
    out
}

#[test]
fn http_chains_get_jwt_then_audit_deny_allow_before_the_router() {
    let s = snapshot_with("", "cluster.local");
    let l: Listener = find(&s, &orders(), TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER);
    let filters = http_filters(chain(&l, "0.0.0.0_8080", true));
    let order: Vec<(&str, Option<i32>)> =
        filters.iter().map(|(n, r, _)| (n.as_str(), r.as_ref().map(|r| r.action))).collect();
    assert_eq!(
        order,
        [
            ("envoy.filters.http.jwt_authn", None),
            ("envoy.filters.http.rbac", Some(rbac::Action::Log as i32)),
            ("envoy.filters.http.rbac", Some(rbac::Action::Deny as i32)),
            ("envoy.filters.http.rbac", Some(rbac::Action::Allow as i32)),
            ("envoy.filters.http.grpc_stats", None),
            ("envoy.filters.http.fault", None),
            ("envoy.filters.http.cors", None),
            ("envoy.filters.http.router", None),
        ]
    );
    let allow = rbac_of(&filters, rbac::Action::Allow);
    let names: Vec<&String> = allow.policies.keys().collect();
    assert_eq!(names, ["ns[shop]-policy[orders-allow]-rule[0]"]);
    let audit = rbac_of(&filters, rbac::Action::Log);
    assert!(audit.policies.contains_key("ns[istio-system]-policy[mesh-audit]-rule[0]"), "root namespace: mesh-wide");
    // Another workload of the namespace gets only the mesh-wide policy.
    let legacy = sidecar_at("shop", &[("app", "legacy")], &["10.2.0.7"]);
    let l: Listener = find(&s, &legacy, TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER);
    let names: Vec<String> = http_filters(chain(&l, "10.2.0.7_8080", true)).into_iter().map(|(n, _, _)| n).collect();
    let istios = ["envoy.filters.http.grpc_stats", "envoy.filters.http.fault", "envoy.filters.http.cors"];
    assert_eq!(names, [&["envoy.filters.http.rbac"][..], &istios, &["envoy.filters.http.router"]].concat());
}

#[test]
fn principals_are_exact_spiffe_matchers() {
    let s = snapshot_with("", "cluster.local");
    let l: Listener = find(&s, &orders(), TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER);
    let allow = rbac_of(&http_filters(chain(&l, "0.0.0.0_8080", true)), rbac::Action::Allow);
    let policy = &allow.policies["ns[shop]-policy[orders-allow]-rule[0]"];
    assert_eq!(policy.principals.len(), 3, "one principal per `from` source");
    let ids = policy_identities(policy);
    for expected in [
        "exact:spiffe://cluster.local/ns/default/sa/sleep",
        "regex:spiffe://.*/sa/admin",
        "!prefix:spiffe://cluster.local/ns/evil/",
        "regex:.*/ns/default/.*",
        "regex:.*/ns/dev-.*/.*",
        "!regex:.*/ns/kube-system/.*",
        "regex:spiffe://.+/ns/shop/(.+/|)sa/reporter(/.+)?",
        "regex:spiffe://.+/ns/other/(.+/|)sa/reader(/.+)?",
        "prefix:spiffe://example.org/",
        "regex:spiffe://[^/]*\\.corp/.*",
        "!prefix:spiffe://bad.example/",
        // `when` source.serviceAccount, source.trustDomain.
        "regex:spiffe://.+/ns/default/(.+/|)sa/sleep(/.+)?",
        "prefix:spiffe://cluster.local/",
    ] {
        assert!(ids.iter().any(|i| i == expected), "{expected} missing from {ids:#?}");
    }
}

#[test]
fn cluster_local_principals_stand_for_the_mesh_trust_domain() {
    let s = snapshot_with("", "example.org");
    let l: Listener = find(&s, &orders(), TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER);
    let allow = rbac_of(&http_filters(chain(&l, "0.0.0.0_8080", true)), rbac::Action::Allow);
    let ids = policy_identities(&allow.policies["ns[shop]-policy[orders-allow]-rule[0]"]);
    assert!(ids.iter().any(|i| i == "exact:spiffe://example.org/ns/default/sa/sleep"), "{ids:#?}");
    assert!(!ids.iter().any(|i| i == "exact:spiffe://cluster.local/ns/default/sa/sleep"), "{ids:#?}");
    // Not a full SPIFFE identity, or a wildcard trust domain: left as written.
    assert!(ids.iter().any(|i| i == "!prefix:spiffe://cluster.local/ns/evil/"), "{ids:#?}");
}

#[test]
fn every_http_attribute_has_its_matcher() {
    let s = snapshot_with("", "cluster.local");
    let l: Listener = find(&s, &orders(), TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER);
    let allow = rbac_of(&http_filters(chain(&l, "0.0.0.0_8080", true)), rbac::Action::Allow);
    let text = format!("{:?}", allow.policies["ns[shop]-policy[orders-allow]-rule[0]"]);
    for needle in [
        "DirectRemoteIp(CidrRange { address_prefix: \"10.0.0.0\"",
        "RemoteIp(CidrRange { address_prefix: \"203.0.113.0\"",
        "name: \":authority\"",
        "name: \":method\"",
        "name: \"x-tenant\"",
        "UrlPath",
        "Prefix(\"/api/\")",
        "Suffix(\".json\")",
        "name: \"uri-template\"",
        "DestinationPort(8080)",
        "DestinationIp(CidrRange { address_prefix: \"10.2.0.5\"",
        "RequestedServerName",
        "filter: \"envoy.filters.http.jwt_authn\"",
        "Key(\"groups\")",
        "Key(\"realm\")",
        "Key(\"role\")",
        "Key(\"aud\")",
        "Key(\"azp\")",
        "Exact(\"https://issuer.example\")",
        "Exact(\"alice\")",
        "Key(\"scope\")",
    ] {
        assert!(text.contains(needle), "{needle} missing from the policy");
    }
}

fn network_rbacs(c: &FilterChain) -> Vec<Rbac> {
    c.filters
        .iter()
        .filter(|f| f.name == "envoy.filters.network.rbac")
        .map(|f| {
            let r: NetworkRbac = typed(f);
            assert_eq!(r.stat_prefix, "tcp.");
            r.rules.expect("rules")
        })
        .collect()
}

/// Whether `p` matches everything: `any`, or istiod's AND of `any` alone.
pub(super) fn is_any(p: &Permission) -> bool {
    match &p.rule {
        Some(permission::Rule::Any(true)) => true,
        Some(permission::Rule::AndRules(set)) => matches!(set.rules.as_slice(), [only] if is_any(only)),
        _ => false,
    }
}

/// Whether `p` matches every peer: `any`, or istiod's AND of `any` alone.
fn is_any_id(p: &Principal) -> bool {
    match &p.identifier {
        Some(principal::Identifier::Any(true)) => true,
        Some(principal::Identifier::AndIds(set)) => matches!(set.ids.as_slice(), [only] if is_any_id(only)),
        _ => false,
    }
}

#[test]
fn tcp_chains_drop_allow_rules_with_http_fields_and_widen_deny_rules() {
    let s = snapshot_with("", "cluster.local");
    let l: Listener = find(&s, &orders(), TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER);
    let tcp = chain(&l, "0.0.0.0_5432", false);
    assert_eq!(tcp.filters.last().map(|f| f.name.as_str()), Some("envoy.filters.network.tcp_proxy"));
    let rbacs = network_rbacs(tcp);
    let allow = rbacs.iter().find(|r| r.action == rbac::Action::Allow as i32).expect("ALLOW");
    assert!(allow.policies.is_empty(), "the ALLOW rule needs HTTP attributes: dropped, so TCP is denied: {allow:?}");
    let deny = rbacs.iter().find(|r| r.action == rbac::Action::Deny as i32).expect("DENY");
    let rule0 = &deny.policies["ns[shop]-policy[orders-deny]-rule[0]"];
    let kept = format!("{:?}", rule0.permissions);
    assert!(kept.contains("DestinationPort(5432)") && !kept.contains("UrlPath"), "paths left out, port kept: {kept}");
    let audit = rbacs.iter().find(|r| r.action == rbac::Action::Log as i32).expect("AUDIT");
    let audit_rule = &audit.policies["ns[istio-system]-policy[mesh-audit]-rule[0]"];
    assert!(is_any(&audit_rule.permissions[0]), "AUDIT methods left out on TCP: {audit_rule:?}");
    // HTTP chains keep the path.
    let http = rbac_of(&http_filters(chain(&l, "0.0.0.0_8080", true)), rbac::Action::Deny);
    assert!(format!("{:?}", http.policies["ns[shop]-policy[orders-deny]-rule[0]"]).contains("Exact(\"/admin\")"));
}

#[test]
fn empty_cases_follow_istio() {
    let extra = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: allow-nothing, namespace: shop}\nspec: {selector: {matchLabels: {app: legacy}}}\n---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: allow-all, namespace: other}\nspec: {rules: [{}]}\n";
    let s = snapshot_with(extra, "cluster.local");
    let legacy = sidecar_at("shop", &[("app", "legacy")], &["10.2.0.7"]);
    let l: Listener = find(&s, &legacy, TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER);
    let allow = rbac_of(&http_filters(chain(&l, "10.2.0.7_8080", true)), rbac::Action::Allow);
    let never = &allow.policies["ns[shop]-policy[allow-nothing]-rule[0]"];
    assert!(matches!(&never.permissions[0].rule, Some(permission::Rule::NotRule(p)) if is_any(p)), "{never:?}");
    let other = sidecar_at("other", &[("app", "x")], &["10.9.9.9"]);
    let s = snapshot_with(&format!("{extra}---\n{}", service_in_other()), "cluster.local");
    let l: Listener = find(&s, &other, TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER);
    let allow = rbac_of(&http_filters(chain(&l, "0.0.0.0_8080", true)), rbac::Action::Allow);
    let all = &allow.policies["ns[other]-policy[allow-all]-rule[0]"];
    assert!(is_any(&all.permissions[0]) && is_any_id(&all.principals[0]));
}

fn service_in_other() -> &'static str {
    "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: x, namespace: other}\nspec:\n  hosts: [x.other.svc.cluster.local]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{number: 8080, name: http}]\n  endpoints: [{address: 10.9.9.9, labels: {app: x}}]\n"
}

#[test]
fn rejected_policies_deny_their_scope_on_every_chain() {
    let custom = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: ext, namespace: shop}\nspec: {action: CUSTOM, provider: {name: x}, rules: [{}], selector: {matchLabels: {app: legacy}}}\n";
    let s = snapshot_with(custom, "cluster.local");
    let legacy = sidecar_at("shop", &[("app", "legacy")], &["10.2.0.7"]);
    let l: Listener = find(&s, &legacy, TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER);
    let deny = rbac_of(&http_filters(chain(&l, "10.2.0.7_8080", true)), rbac::Action::Deny);
    let p = &deny.policies["ns[shop]-policy[ext]-rejected"];
    assert!(is_any(&p.permissions[0]) && matches!(p.principals[0].identifier, Some(principal::Identifier::Any(true))));
    let tcp = network_rbacs(chain(&l, VIRTUAL_INBOUND_LISTENER, false));
    assert!(tcp
        .iter()
        .any(|r| r.action == rbac::Action::Deny as i32 && r.policies.contains_key("ns[shop]-policy[ext]-rejected")));
    // Its selector is readable: orders is not in its scope.
    let l: Listener = find(&s, &orders(), TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER);
    let deny = rbac_of(&http_filters(chain(&l, "0.0.0.0_8080", true)), rbac::Action::Deny);
    assert!(!deny.policies.keys().any(|k| k.contains("rejected")));
}

#[test]
fn jwt_rules_become_providers_with_istio_requirements() {
    let s = snapshot_with("", "cluster.local");
    let l: Listener = find(&s, &orders(), TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER);
    let filters = http_filters(chain(&l, "0.0.0.0_8080", true));
    let jwt = filters[0].2.clone().expect("jwt_authn first");
    let inline = &jwt.providers["origins-0"];
    assert_eq!(inline.issuer, "https://issuer.example");
    assert_eq!(inline.audiences, ["orders"]);
    assert!(inline.forward);
    assert_eq!(inline.payload_in_metadata, "payload");
    assert_eq!(inline.forward_payload_header, "x-jwt-payload");
    assert_eq!(inline.from_headers[0].name, "x-jwt");
    assert_eq!(inline.from_headers[0].value_prefix, "Bearer ");
    assert_eq!(
        (inline.from_params.clone(), inline.from_cookies.clone()),
        (vec!["token".into()], vec!["session".into()])
    );
    assert_eq!(inline.claim_to_headers[0].header_name, "x-sub");
    assert!(matches!(inline.jwks_source_specifier, Some(JwksSourceSpecifier::LocalJwks(_))));
    let remote = &jwt.providers["origins-1"];
    let Some(JwksSourceSpecifier::RemoteJwks(r)) = &remote.jwks_source_specifier else { panic!("remote: {remote:?}") };
    let uri = r.http_uri.clone().expect("uri");
    assert_eq!(uri.uri, "https://keys.example.com/oauth2/v3/certs");
    let cluster_name = match uri.http_upstream_type {
        Some(envoy_types::pb::envoy::config::core::v3::http_uri::HttpUpstreamType::Cluster(c)) => c,
        other => panic!("{other:?}"),
    };
    assert_eq!(cluster_name, "jwks|https|443|keys.example.com");
    assert_eq!(uri.timeout.map(|d| d.seconds), Some(3));
    // Any provider, or no token at all: an invalid token fails, a missing one passes.
    let Some(RequirementType::Requires(req)) = &jwt.rules[0].requirement_type else { panic!() };
    let Some(RequiresType::RequiresAny(any)) = &req.requires_type else { panic!("{req:?}") };
    let kinds: Vec<String> = any.requirements.iter().map(|r| format!("{:?}", r.requires_type)).collect();
    assert_eq!(kinds.len(), 3);
    assert!(kinds[2].contains("AllowMissing("), "{kinds:?}");
    // The JWKS cluster, with TLS to the key server's name.
    let c: Cluster = find(&s, &orders(), TypeUrl::Cluster, &cluster_name);
    let ts = format!("{:?}", c.transport_socket);
    assert!(ts.contains("envoy.transport_sockets.tls"), "{ts}");
    assert!(
        !names(&s, &sidecar_at("shop", &[("app", "legacy")], &["10.2.0.7"]), TypeUrl::Cluster)
            .iter()
            .any(|n| n.starts_with("jwks|")),
        "only proxies with the rule get the cluster"
    );
}

#[test]
fn gateways_get_policies_of_the_root_namespace_and_their_selectors() {
    let extra = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: gw, namespace: istio-system}\nspec: {action: DENY, selector: {matchLabels: {istio: ingressgateway}}, rules: [{to: [{operation: {paths: [/admin]}}]}]}\n";
    let s = snapshot_with(&format!("{extra}---\n{}", bookinfo_gateway()), "cluster.local");
    let gw = router("bookinfo", &[("istio", "ingressgateway")]);
    let l: Listener = find(&s, &gw, TypeUrl::Listener, "0.0.0.0_8080");
    let filters = http_filters(&l.filter_chains[0]);
    let deny = rbac_of(&filters, rbac::Action::Deny);
    assert!(deny.policies.contains_key("ns[istio-system]-policy[gw]-rule[0]"));
    let names: Vec<&str> = filters.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(names.last(), Some(&"envoy.filters.http.router"));
    let istios = ["envoy.filters.http.grpc_stats", "envoy.filters.http.fault", "envoy.filters.http.cors"];
    assert_eq!(names[names.len() - 4..names.len() - 1], istios, "Istio's filters after the security ones");
}

fn bookinfo_gateway() -> &'static str {
    "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: bookinfo}\nspec:\n  selector: {istio: ingressgateway}\n  servers: [{port: {number: 8080, name: http, protocol: HTTP}, hosts: ['*']}]\n"
}

#[test]
fn regenerating_reproduces_the_same_bytes() {
    let s = snapshot_with("", "cluster.local");
    let first = crate::envoy::generate(TypeUrl::Listener, &s, &orders());
    for _ in 0..5 {
        assert_eq!(crate::envoy::generate(TypeUrl::Listener, &s, &orders()), first, "policy maps encode stably");
    }
}

#[test]
fn dry_run_policies_are_shadow_rules_not_enforced() {
    let extra = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: try-deny\n  namespace: shop\n  annotations: {istio.io/dry-run: \"true\"}\nspec: {selector: {matchLabels: {app: legacy}}, action: DENY, rules: [{to: [{operation: {paths: [/x]}}]}]}\n";
    let s = snapshot_with(extra, "cluster.local");
    let legacy = sidecar_at("shop", &[("app", "legacy")], &["10.2.0.7"]);
    let l: Listener = find(&s, &legacy, TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER);
    let hcm: HttpConnectionManager = typed(chain(&l, "10.2.0.7_8080", true).filters.last().expect("hcm"));
    let rbacs: Vec<HttpRbac> = hcm
        .http_filters
        .iter()
        .filter(|f| f.name == "envoy.filters.http.rbac")
        .map(|f| match &f.config_type {
            Some(http_filter::ConfigType::TypedConfig(any)) => unpack(any),
            other => panic!("{other:?}"),
        })
        .collect();
    let deny = rbacs
        .iter()
        .find(|r| r.shadow_rules.as_ref().is_some_and(|s| s.action == rbac::Action::Deny as i32))
        .expect("a DENY filter with shadow rules");
    assert_eq!(deny.rules, None, "nothing of it is enforced");
    assert!(deny.shadow_rules.as_ref().is_some_and(|s| s.policies.contains_key("ns[shop]-policy[try-deny]-rule[0]")));
    assert_eq!(deny.shadow_rules_stat_prefix, "istio_dry_run_deny_");
}

#[test]
fn a_custom_policy_naming_no_provider_of_the_mesh_config_closes_its_scope() {
    // The mesh config has no provider `x` (built past validation, as a snapshot from elsewhere could hold it).
    let text = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: ext, namespace: shop}\nspec: {action: CUSTOM, provider: {name: x}, rules: [{}]}\n";
    let value = serde_saphyr::from_str(text).expect("yaml");
    let obj = crate::config::parse::object_from_value(value).expect("parses").expect("served kind");
    let mut state = SourceState::default();
    state.configs.insert(obj.key.clone(), Arc::new(obj));
    let s = Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state);
    let rbacs = network_rbacs(chain(
        &find::<Listener>(&s, &orders(), TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER),
        VIRTUAL_INBOUND_LISTENER,
        false,
    ));
    assert!(rbacs
        .iter()
        .any(|r| r.action == rbac::Action::Deny as i32 && r.policies.contains_key("ns[shop]-policy[ext]-rejected")));
}
