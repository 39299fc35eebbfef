//! CUSTOM policies as the generated filters read back: the shadow RBAC filter and ext_authz (HTTP
//! and gRPC providers, HTTP and TCP chains), their order before the other security filters, and
//! every case that keeps the scope denied instead.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{grpc_service, http_uri};
use envoy_types::pb::envoy::config::listener::v3::{filter, Filter, FilterChain, Listener};
use envoy_types::pb::envoy::config::rbac::v3::{rbac, Rbac};
use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::{ext_authz::Services, ExtAuthz};
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::ext_authz::v3::ExtAuthz as NetworkExtAuthz;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_filter, HttpConnectionManager,
};
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    metadata_matcher::path_segment::Segment, string_matcher::MatchPattern, value_matcher, ListStringMatcher,
    MetadataMatcher,
};

use crate::config::parse::{parse_file, Document};
use crate::envoy::names::VIRTUAL_INBOUND_LISTENER;
use crate::envoy::testing::{find, router, sidecar_at, testdata, unpack};
use crate::envoy::{ProxyView, TypeUrl};
use crate::mesh::MeshConfig;
use crate::snapshot::{ChangeSet, Snapshot, SourceState, Version};

/// The authorizer's service, declared in `foo` (and so reachable as `foo/HOST` or `HOST`).
const AUTHZ_SERVICE: &str = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: authz, namespace: foo}\nspec:\n  hosts: [my-ext-authz.foo.svc.cluster.local]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{number: 9000, name: grpc, protocol: GRPC}]\n  endpoints: [{address: 10.7.0.1}]\n";

/// Two CUSTOM policies on `orders` naming `provider`, one path each.
fn custom_policies(provider: &str) -> String {
    (1..=2)
        .map(|i| {
            format!(
                "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: orders-{i}, namespace: shop}}\nspec:\n  action: CUSTOM\n  provider: {{name: {provider}}}\n  selector: {{matchLabels: {{app: orders}}}}\n  rules: [{{to: [{{operation: {{paths: [/orders{i}]}}}}]}}]\n"
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// inbound.yaml, the authorizer's service and `extra`, under mesh config `mesh`.
fn snapshot_with(mesh: &str, extra: &str) -> Snapshot {
    let inbound = std::fs::read_to_string(testdata().join("inbound.yaml")).expect("testdata");
    let text = [inbound.as_str(), AUTHZ_SERVICE, extra].join("\n---\n");
    let mut state = SourceState::default();
    for doc in parse_file("test.yaml", &text) {
        match doc {
            Document::Valid(o) => {
                state.configs.insert(o.key.clone(), Arc::new(o));
            }
            other => panic!("invalid test config: {other:?}"),
        }
    }
    state.mesh = Arc::new(MeshConfig::parse("mesh.yaml", mesh).expect("mesh config"));
    Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state)
}

const HTTP_MESH: &str = r#"
extensionProviders:
- name: default
  envoyExtAuthzHttp:
    service: foo/my-ext-authz.foo.svc.cluster.local
    port: 9000
    timeout: 10s
    failOpen: true
    statusOnError: "403"
    pathPrefix: /check
    includeRequestHeadersInCheck: [x-custom-id, x-prefix-*, "*-suffix"]
    includeHeadersInCheck: [ignored-when-the-new-list-is-set]
    includeAdditionalHeadersInCheck: {x-header-2: value-2, x-header-1: value-1}
    includeRequestBodyInCheck: {maxRequestBytes: 2048, allowPartialMessage: true, packAsBytes: true}
    headersToUpstreamOnAllow: [Authorization, x-prefix-*]
    headersToDownstreamOnDeny: [Set-cookie]
    headersToDownstreamOnAllow: ["*-suffix"]
"#;

const GRPC_MESH: &str = r#"
extensionProviders:
- name: tracing
  zipkin: {service: zipkin.istio-system.svc.cluster.local, port: 9411}
- name: default
  envoyExtAuthzGrpc:
    service: my-ext-authz.foo.svc.cluster.local
    port: 9000
    timeout: 0.002s
    includeRequestBodyInCheck: {maxRequestBytes: 4096, allowPartialMessage: true}
"#;

fn orders() -> ProxyView {
    sidecar_at("shop", &[("app", "orders")], &["10.2.0.5"])
}

fn inbound(s: &Snapshot, view: &ProxyView) -> Listener {
    find(s, view, TypeUrl::Listener, VIRTUAL_INBOUND_LISTENER)
}

/// The chain `name` ending in a connection manager (`http`) or a TCP proxy.
fn chain<'a>(l: &'a Listener, name: &str, http: bool) -> &'a FilterChain {
    l.filter_chains
        .iter()
        .filter(|c| c.name == name)
        .find(|c| c.filters.last().is_some_and(|f| f.name.ends_with("http_connection_manager")) == http)
        .unwrap_or_else(|| panic!("no chain {name} (http: {http})"))
}

fn typed<T: prost::Message + Default>(f: &Filter) -> T {
    match &f.config_type {
        Some(filter::ConfigType::TypedConfig(any)) => unpack(any),
        other => panic!("no typed config: {other:?}"),
    }
}

/// A chain's HTTP filters: names and packed configs.
fn http_filters(c: &FilterChain) -> Vec<(String, envoy_types::pb::google::protobuf::Any)> {
    let hcm: HttpConnectionManager = typed(c.filters.last().expect("a filter"));
    hcm.http_filters
        .into_iter()
        .map(|f| match f.config_type {
            Some(http_filter::ConfigType::TypedConfig(any)) => (f.name, any),
            other => panic!("{other:?}"),
        })
        .collect()
}

fn names<T>(filters: &[(String, T)]) -> Vec<&str> {
    filters.iter().map(|(n, _)| n.as_str()).collect()
}

fn sorted_keys(r: &Rbac) -> Vec<&str> {
    let mut keys: Vec<&str> = r.policies.keys().map(String::as_str).collect();
    keys.sort_unstable();
    keys
}

/// `filter` / `key` → `prefix:VALUE`.
fn enabled_by(m: &MetadataMatcher) -> (String, Vec<String>, String) {
    let path = m
        .path
        .iter()
        .map(|p| match &p.segment {
            Some(Segment::Key(k)) => k.clone(),
            None => String::new(),
        })
        .collect();
    let value = match m.value.as_ref().and_then(|v| v.match_pattern.as_ref()) {
        Some(value_matcher::MatchPattern::StringMatch(s)) => match &s.match_pattern {
            Some(MatchPattern::Prefix(p)) => format!("prefix:{p}"),
            other => format!("{other:?}"),
        },
        other => format!("{other:?}"),
    };
    (m.filter.clone(), path, value)
}

fn patterns(l: &Option<ListStringMatcher>) -> Vec<String> {
    let list = l.as_ref().map(|l| l.patterns.as_slice()).unwrap_or_default();
    list.iter()
        .map(|m| {
            let p = match &m.match_pattern {
                Some(MatchPattern::Exact(v)) => format!("exact:{v}"),
                Some(MatchPattern::Prefix(v)) => format!("prefix:{v}"),
                Some(MatchPattern::Suffix(v)) => format!("suffix:{v}"),
                other => format!("{other:?}"),
            };
            assert!(m.ignore_case, "header names are case-insensitive: {p}");
            p
        })
        .collect()
}

const SHADOW_NAMES: [&str; 2] = [
    "istio-ext-authz-default-ns[shop]-policy[orders-1]-rule[0]",
    "istio-ext-authz-default-ns[shop]-policy[orders-2]-rule[0]",
];

#[test]
fn http_provider_gets_a_shadow_rbac_filter_then_ext_authz_over_http() {
    let s = snapshot_with(HTTP_MESH, &custom_policies("default"));
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    let l = inbound(&s, &orders());
    let filters = http_filters(chain(&l, "0.0.0.0_8080", true));
    assert_eq!(names(&filters)[..2], ["envoy.filters.http.rbac", "envoy.filters.http.ext_authz"], "CUSTOM goes first");
    assert!(!names(&filters)[2..].contains(&"envoy.filters.http.rbac"), "no other policy, no other RBAC filter");

    let rbac: HttpRbac = unpack(&filters[0].1);
    assert!(rbac.rules.is_none(), "the RBAC filter enforces nothing itself");
    let shadow = rbac.shadow_rules.expect("shadow rules");
    assert_eq!(shadow.action, rbac::Action::Deny as i32);
    assert_eq!(sorted_keys(&shadow), SHADOW_NAMES);
    assert_eq!(rbac.shadow_rules_stat_prefix, "istio_ext_authz_");
    let first = format!("{:?}", shadow.policies[SHADOW_NAMES[0]].permissions);
    assert!(first.contains("/orders1") && !first.contains("/orders2"), "{first}");

    let authz: ExtAuthz = unpack(&filters[1].1);
    assert!(authz.failure_mode_allow);
    assert_eq!(authz.status_on_error.map(|s| s.code), Some(403));
    assert_eq!(authz.transport_api_version, 2, "V3");
    assert_eq!(
        enabled_by(authz.filter_enabled_metadata.as_ref().expect("enabled by metadata")),
        (
            "envoy.filters.http.rbac".to_string(),
            vec!["istio_ext_authz_shadow_effective_policy_id".to_string()],
            "prefix:istio-ext-authz-default".to_string()
        )
    );
    assert_eq!(patterns(&authz.allowed_headers), ["exact:x-custom-id", "prefix:x-prefix-", "suffix:-suffix"]);
    let body = authz.with_request_body.expect("body");
    assert_eq!((body.max_request_bytes, body.allow_partial_message, body.pack_as_bytes), (2048, true, true));
    let Some(Services::HttpService(http)) = authz.services else { panic!("an HTTP service") };
    assert_eq!(http.path_prefix, "/check");
    let uri = http.server_uri.expect("server uri");
    assert_eq!(uri.uri, "http://my-ext-authz.foo.svc.cluster.local");
    assert_eq!(
        uri.http_upstream_type,
        Some(http_uri::HttpUpstreamType::Cluster("outbound|9000||my-ext-authz.foo.svc.cluster.local".into()))
    );
    assert_eq!(uri.timeout.map(|t| t.seconds), Some(10));
    let added: Vec<(String, String)> = http
        .authorization_request
        .expect("headers to add")
        .headers_to_add
        .into_iter()
        .map(|h| (h.key, h.value))
        .collect();
    assert_eq!(added, [("x-header-1".into(), "value-1".into()), ("x-header-2".into(), "value-2".into())]);
    let response = http.authorization_response.expect("response headers");
    assert_eq!(patterns(&response.allowed_upstream_headers), ["exact:Authorization", "prefix:x-prefix-"]);
    assert_eq!(patterns(&response.allowed_client_headers), ["exact:Set-cookie"]);
    assert_eq!(patterns(&response.allowed_client_headers_on_success), ["suffix:-suffix"]);
}

#[test]
fn http_provider_on_a_tcp_chain_denies_what_the_rules_match() {
    let s = snapshot_with(HTTP_MESH, &custom_policies("default"));
    let l = inbound(&s, &orders());
    let tcp = chain(&l, "0.0.0.0_5432", false);
    let filter_names: Vec<&str> = tcp.filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(filter_names, ["envoy.filters.network.rbac", "envoy.filters.network.tcp_proxy"], "no ext_authz");
    let rbac: NetworkRbac = typed(&tcp.filters[0]);
    let rules = rbac.rules.expect("enforced rules");
    assert_eq!(rules.action, rbac::Action::Deny as i32);
    let expected: Vec<String> = SHADOW_NAMES.iter().map(|n| format!("{n}-deny-due-to-bad-CUSTOM-action")).collect();
    assert_eq!(sorted_keys(&rules), expected);
    // The paths cannot apply to a TCP stream: left out, the rule matches every connection.
    let p = &rules.policies[&expected[0]];
    assert!(super::tests::is_any(&p.permissions[0]), "{p:?}");
}

#[test]
fn grpc_provider_checks_http_requests_and_tcp_connections() {
    let deny = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: deny-admin, namespace: shop}\nspec: {action: DENY, rules: [{to: [{operation: {paths: [/admin]}}]}]}\n";
    let s = snapshot_with(GRPC_MESH, &format!("{}---\n{deny}", custom_policies("default")));
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    let l = inbound(&s, &orders());
    let filters = http_filters(chain(&l, "0.0.0.0_8080", true));
    assert_eq!(
        names(&filters)[..3],
        ["envoy.filters.http.rbac", "envoy.filters.http.ext_authz", "envoy.filters.http.rbac"],
        "CUSTOM before DENY"
    );
    let deny_rbac: HttpRbac = unpack(&filters[2].1);
    assert_eq!(deny_rbac.rules.map(|r| r.action), Some(rbac::Action::Deny as i32));

    let authz: ExtAuthz = unpack(&filters[1].1);
    assert!(!authz.failure_mode_allow, "fail closed unless failOpen");
    assert_eq!(authz.status_on_error, None, "Envoy's default (403)");
    let Some(Services::GrpcService(grpc)) = authz.services else { panic!("a gRPC service") };
    let Some(grpc_service::TargetSpecifier::EnvoyGrpc(target)) = grpc.target_specifier else { panic!("envoy_grpc") };
    assert_eq!(target.cluster_name, "outbound|9000||my-ext-authz.foo.svc.cluster.local");
    assert_eq!(target.authority, "my-ext-authz.foo.svc.cluster.local");
    assert_eq!(grpc.timeout.map(|t| (t.seconds, t.nanos)), Some((0, 2_000_000)));
    assert_eq!(authz.with_request_body.map(|b| b.max_request_bytes), Some(4096));

    let tcp = chain(&l, "0.0.0.0_5432", false);
    let filter_names: Vec<&str> = tcp.filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        filter_names,
        [
            "envoy.filters.network.rbac",
            "envoy.filters.network.ext_authz",
            "envoy.filters.network.rbac",
            "envoy.filters.network.tcp_proxy"
        ]
    );
    let shadow: NetworkRbac = typed(&tcp.filters[0]);
    assert_eq!((shadow.stat_prefix.as_str(), shadow.shadow_rules_stat_prefix.as_str()), ("tcp.", "istio_ext_authz_"));
    assert!(shadow.rules.is_none());
    assert_eq!(sorted_keys(&shadow.shadow_rules.expect("shadow")), SHADOW_NAMES);
    let network: NetworkExtAuthz = typed(&tcp.filters[1]);
    assert_eq!(network.stat_prefix, "tcp.");
    assert!(!network.failure_mode_allow);
    let enabled = enabled_by(network.filter_enabled_metadata.as_ref().expect("enabled by metadata"));
    assert_eq!(enabled.0, "envoy.filters.network.rbac");
    assert_eq!(enabled.2, "prefix:istio-ext-authz-default");
}

#[test]
fn gateways_selected_by_a_custom_policy_get_ext_authz() {
    let policy = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: gw, namespace: istio-system}\nspec: {action: CUSTOM, provider: {name: default}, selector: {matchLabels: {istio: ingressgateway}}, rules: [{}]}\n";
    let gateway = "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: shop}\nspec:\n  selector: {istio: ingressgateway}\n  servers: [{port: {number: 8080, name: http, protocol: HTTP}, hosts: ['*']}]\n";
    let s = snapshot_with(GRPC_MESH, &format!("{policy}---\n{gateway}"));
    let gw = router("istio-system", &[("istio", "ingressgateway")]);
    let l: Listener = find(&s, &gw, TypeUrl::Listener, "0.0.0.0_8080");
    let filters = http_filters(&l.filter_chains[0]);
    assert_eq!(names(&filters)[..2], ["envoy.filters.http.rbac", "envoy.filters.http.ext_authz"]);
    let rbac: HttpRbac = unpack(&filters[0].1);
    let shadow = rbac.shadow_rules.expect("shadow");
    assert_eq!(sorted_keys(&shadow), ["istio-ext-authz-default-ns[istio-system]-policy[gw]-rule[0]"]);
}

/// The DENY filter's rejected-scope entries and the ext_authz filters of `orders`' HTTP chain.
fn denied(s: &Snapshot, view: &ProxyView) -> (Vec<String>, usize) {
    let l = inbound(s, view);
    // Port 8080's chain: a service instance's (0.0.0.0_8080) or a Sidecar ingress listener's,
    // named after the workload's address.
    let name = l.filter_chains.iter().map(|c| c.name.as_str()).find(|n| n.ends_with("_8080")).unwrap_or_default();
    let filters = http_filters(chain(&l, name, true));
    let ext_authz = filters.iter().filter(|(n, _)| n.ends_with("ext_authz")).count();
    let rejected = filters
        .iter()
        .filter(|(n, _)| n.ends_with(".rbac"))
        .filter_map(|(_, any)| unpack::<HttpRbac>(any).rules)
        .filter(|r| r.action == rbac::Action::Deny as i32)
        .flat_map(|r| r.policies.into_keys())
        .filter(|k| k.ends_with("-rejected"))
        .collect::<std::collections::BTreeSet<_>>();
    (rejected.into_iter().collect(), ext_authz)
}

/// The reasons the snapshot reports for policy `name`'s provider.
fn provider_errors(s: &Snapshot, name: &str) -> Vec<String> {
    s.errors
        .iter()
        .filter(|e| e.object.as_ref().is_some_and(|k| k.name == name) && e.error.field == "spec.provider.name")
        .map(|e| e.error.reason.clone())
        .collect()
}

#[test]
fn custom_policies_that_cannot_be_enforced_keep_their_scope_denied() {
    let rejected =
        vec!["ns[shop]-policy[orders-1]-rejected".to_string(), "ns[shop]-policy[orders-2]-rejected".to_string()];

    // An unknown provider (a tracing provider is not an authorizer).
    for name in ["nope", "tracing"] {
        let s = snapshot_with(GRPC_MESH, &custom_policies(name));
        assert_eq!(denied(&s, &orders()), (rejected.clone(), 0), "{name}");
        let errors = provider_errors(&s, "orders-1");
        assert!(errors.iter().any(|e| e.contains("available ext_authz providers are [\"default\"]")), "{errors:?}");
    }

    // The provider's service is not in the registry, or not on that port.
    for (service, why) in [
        ("missing.foo.svc.cluster.local", "could not find service"),
        ("bar/my-ext-authz.foo.svc.cluster.local", "could not find service"),
    ] {
        let mesh = GRPC_MESH.replace("service: my-ext-authz.foo.svc.cluster.local", &format!("service: {service}"));
        let s = snapshot_with(&mesh, &custom_policies("default"));
        assert_eq!(denied(&s, &orders()), (rejected.clone(), 0), "{service}");
        assert!(provider_errors(&s, "orders-2").iter().any(|e| e.contains(why)), "{service}: {:?}", s.errors);
    }
    let s = snapshot_with(&GRPC_MESH.replace("port: 9000", "port: 9001"), &custom_policies("default"));
    assert_eq!(denied(&s, &orders()), (rejected.clone(), 0));
    assert!(provider_errors(&s, "orders-1").iter().any(|e| e.contains("has no port 9001")));

    // A host alone must name one declaration.
    let twin = AUTHZ_SERVICE.replace("namespace: foo", "namespace: bar").replace("name: authz", "name: twin");
    let s = snapshot_with(GRPC_MESH, &format!("{}---\n{twin}", custom_policies("default")));
    assert_eq!(denied(&s, &orders()), (rejected.clone(), 0));
    assert!(provider_errors(&s, "orders-1").iter().any(|e| e.contains("multiple namespaces")));

    // Several providers on one workload.
    let two = GRPC_MESH.to_string()
        + "- name: other\n  envoyExtAuthzGrpc: {service: my-ext-authz.foo.svc.cluster.local, port: 9000}\n";
    let one_each = custom_policies("default").replacen("name: default", "name: other", 1);
    let s = snapshot_with(&two, &one_each);
    assert_eq!(denied(&s, &orders()), (rejected.clone(), 0));
    let errors = provider_errors(&s, "orders-1");
    assert!(
        errors.iter().any(|e| e.contains("other providers apply to the same workloads: shop/orders-2 (default)")),
        "{errors:?}"
    );
    // Selectors that cannot meet are no conflict.
    let apart = one_each.replacen("{app: orders}", "{app: legacy}", 1);
    let s = snapshot_with(&two, &apart);
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    assert_eq!(denied(&s, &orders()), (vec![], 1));
    // Scopes that only partly overlap are not reported, but a workload in both is still denied.
    let partly = one_each.replacen("{app: orders}", "{tier: back}", 1);
    let s = snapshot_with(&two, &partly);
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    let both = sidecar_at("shop", &[("app", "orders"), ("tier", "back")], &["10.2.0.5"]);
    assert_eq!(denied(&s, &both), (rejected.clone(), 0));
    assert_eq!(denied(&s, &orders()), (vec![], 1));

    // The proxy has no cluster for the service: its Sidecar imports only its own namespace.
    let sidecar = "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: default, namespace: shop}\nspec:\n  egress: [{hosts: [./*]}]\n";
    let s = snapshot_with(GRPC_MESH, &format!("{}---\n{sidecar}", custom_policies("default")));
    assert_eq!(denied(&s, &orders()), (rejected.clone(), 0));

    // Workloads the policies do not select are left alone; fixed, the scope opens.
    let legacy = sidecar_at("shop", &[("app", "legacy")], &["10.2.0.7"]);
    let s = snapshot_with(GRPC_MESH, &custom_policies("nope"));
    assert_eq!(denied(&s, &legacy), (vec![], 0));
    let s = snapshot_with(GRPC_MESH, &custom_policies("default"));
    assert_eq!(denied(&s, &orders()), (vec![], 1));
}
