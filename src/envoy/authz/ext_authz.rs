//! CUSTOM AuthorizationPolicies, enforced as Istio enforces them: an RBAC filter in shadow mode
//! evaluates the policies' rules and, when one matches, sets the dynamic metadata
//! `istio_ext_authz_shadow_effective_policy_id` to its name (`istio-ext-authz-PROVIDER-...`);
//! the ext_authz filter after it only runs when that metadata names its provider, and asks the
//! provider's service whether the request may pass.
//!
//! Fail closed: a CUSTOM policy that cannot be enforced (its provider is unknown or its service is
//! not in the registry, several providers apply to one workload, or the proxy has no cluster for
//! the service) keeps its scope denied, as a rejected policy does. On a TCP chain an HTTP provider
//! cannot check anything: the policies' rules deny what they match there (Istio skips them).

use envoy_types::pb::envoy::config::core::v3::{grpc_service, http_uri, ApiVersion, GrpcService, HeaderValue, HttpUri};
use envoy_types::pb::envoy::config::listener::v3::Filter;
use envoy_types::pb::envoy::config::rbac::v3::Rbac;
use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3 as http_authz;
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::ext_authz::v3::ExtAuthz as NetworkExtAuthz;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use envoy_types::pb::envoy::r#type::matcher::v3::{string_matcher::MatchPattern, ListStringMatcher, StringMatcher};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;

use super::matchers::{metadata, string_value};
use super::rbac::{custom_rules, PolicyRef, RuleContext};
use crate::config::api::authorization_policy::Action;
use crate::envoy::names::cluster_name;
use crate::envoy::names::ext::{HTTP_RBAC, NETWORK_RBAC};
use crate::envoy::network_filter::{http_filter, network_filter};
use crate::envoy::proto::duration;
use crate::envoy::scope::Scope;
use crate::mesh::{check_status, ExtAuthz, ExtAuthzHttpProvider, RequestBody};
use crate::registry::Hostname;
use crate::snapshot::{RejectedPolicy, ResolvedProvider};

/// The ext_authz HTTP filter.
const HTTP_EXT_AUTHZ: &str = "envoy.filters.http.ext_authz";
/// The ext_authz network filter.
const NETWORK_EXT_AUTHZ: &str = "envoy.filters.network.ext_authz";
/// Stat prefix of the shadow rules, and so the prefix of the metadata key they set.
const SHADOW_STAT_PREFIX: &str = "istio_ext_authz_";
/// The metadata key the shadow rules set to the matching policy's name.
const EFFECTIVE_POLICY_KEY: &str = "istio_ext_authz_shadow_effective_policy_id";
/// Prefix of the RBAC policy names of CUSTOM rules (followed by the provider's name).
const POLICY_PREFIX: &str = "istio-ext-authz";
/// Suffix of CUSTOM rules that deny what they match, on TCP chains of HTTP providers.
const DENY_SUFFIX: &str = "-deny-due-to-bad-CUSTOM-action";
/// Stat prefix of network filters (Istio's).
const TCP_STAT_PREFIX: &str = "tcp.";
/// Check timeout when the provider sets none (Istio's).
const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// What the CUSTOM policies applying to a proxy come to.
pub(super) enum Custom<'a> {
    /// No CUSTOM policy applies.
    None,
    /// The policies are enforced through this provider.
    Enforced(ResolvedProvider<'a>),
    /// The policies cannot be enforced: their scope is denied.
    Rejected(Vec<RejectedPolicy>),
}

/// Decides how the CUSTOM policies among `policies` are enforced for the proxy of `scope`.
pub(super) fn plan<'a>(scope: &Scope<'a>, policies: &[PolicyRef<'_>]) -> Custom<'a> {
    let custom: Vec<&PolicyRef<'_>> = policies.iter().filter(|p| p.spec.action == Action::Custom).collect();
    if custom.is_empty() {
        return Custom::None;
    }
    let reject = |reason: String| {
        Custom::Rejected(custom.iter().map(|p| RejectedPolicy { key: p.key.clone(), reason: reason.clone() }).collect())
    };
    let mut names: Vec<&str> =
        custom.iter().map(|p| p.spec.provider.as_ref().map(|x| x.name.as_str()).unwrap_or_default()).collect();
    names.sort_unstable();
    names.dedup();
    let [name] = names.as_slice() else {
        return reject(format!(
            "several CUSTOM providers apply to this workload ({names:?}); only one per workload is supported"
        ));
    };
    let provider = match scope.snapshot.ext_authz_provider(name) {
        Ok(p) => p,
        Err(reason) => return reject(reason),
    };
    if !has_cluster(scope, provider.hostname(), provider.port) {
        let cluster = cluster_name(provider.port, "", provider.hostname().as_str());
        return reject(format!("the proxy has no cluster {cluster} for provider {name:?} (not visible or imported)"));
    }
    Custom::Enforced(provider)
}

/// Whether the proxy gets the outbound cluster of `host`'s `port` (else checks would fail, and a
/// fail-open provider let everything through).
fn has_cluster(scope: &Scope<'_>, host: &Hostname, port: u16) -> bool {
    let hosts = std::iter::once(host.clone()).collect();
    scope.cluster_services_of(&hosts).iter().any(|s| s.ports.iter().any(|p| p.number == port))
}

/// The RBAC policy name prefix of a provider's rules, which its ext_authz filter matches.
fn policy_prefix(provider: &str) -> String {
    format!("{POLICY_PREFIX}-{provider}")
}

/// The HTTP filters of an enforced provider: the shadow RBAC filter, then ext_authz.
pub(super) fn http_filters(
    p: &ResolvedProvider<'_>,
    policies: &[PolicyRef<'_>],
    ctx: &RuleContext<'_>,
) -> Vec<HttpFilter> {
    let prefix = policy_prefix(p.name);
    let rbac = HttpRbac {
        shadow_rules: Some(custom_rules(policies, &format!("{prefix}-"), "", ctx)),
        shadow_rules_stat_prefix: SHADOW_STAT_PREFIX.to_string(),
        ..Default::default()
    };
    vec![http_filter(HTTP_RBAC, rbac), http_filter(HTTP_EXT_AUTHZ, http_ext_authz(p))]
}

/// The network filters of an enforced provider: for a gRPC provider the shadow RBAC filter, then
/// ext_authz; an HTTP provider cannot check a TCP stream, so there its rules deny what they match.
pub(super) fn network_filters(
    p: &ResolvedProvider<'_>,
    policies: &[PolicyRef<'_>],
    ctx: &RuleContext<'_>,
) -> Vec<Filter> {
    let prefix = policy_prefix(p.name);
    match p.ext_authz {
        ExtAuthz::Grpc(grpc) => {
            let rbac = NetworkRbac {
                stat_prefix: TCP_STAT_PREFIX.to_string(),
                shadow_rules: Some(custom_rules(policies, &format!("{prefix}-"), "", ctx)),
                shadow_rules_stat_prefix: SHADOW_STAT_PREFIX.to_string(),
                ..Default::default()
            };
            let ext_authz = NetworkExtAuthz {
                stat_prefix: TCP_STAT_PREFIX.to_string(),
                grpc_service: Some(grpc_service(p, grpc.timeout)),
                failure_mode_allow: grpc.fail_open,
                transport_api_version: ApiVersion::V3 as i32,
                filter_enabled_metadata: Some(enabled_metadata(NETWORK_RBAC, p.name)),
                ..Default::default()
            };
            vec![network_filter(NETWORK_RBAC, rbac), network_filter(NETWORK_EXT_AUTHZ, ext_authz)]
        }
        ExtAuthz::Http(_) => {
            let rules: Rbac = custom_rules(policies, &format!("{prefix}-"), DENY_SUFFIX, ctx);
            let rbac =
                NetworkRbac { stat_prefix: TCP_STAT_PREFIX.to_string(), rules: Some(rules), ..Default::default() };
            vec![network_filter(NETWORK_RBAC, rbac)]
        }
    }
}

/// Runs the filter only when the shadow rules matched a policy of `provider`.
fn enabled_metadata(filter: &str, provider: &str) -> envoy_types::pb::envoy::r#type::matcher::v3::MetadataMatcher {
    let prefix =
        StringMatcher { match_pattern: Some(MatchPattern::Prefix(policy_prefix(provider))), ignore_case: false };
    metadata(filter, &[EFFECTIVE_POLICY_KEY], string_value(prefix))
}

fn timeout(t: Option<crate::config::api::Duration>) -> envoy_types::pb::google::protobuf::Duration {
    duration(t.map_or(DEFAULT_TIMEOUT, |d| d.as_std()))
}

fn grpc_service(p: &ResolvedProvider<'_>, t: Option<crate::config::api::Duration>) -> GrpcService {
    GrpcService {
        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(grpc_service::EnvoyGrpc {
            cluster_name: cluster_name(p.port, "", p.hostname().as_str()),
            authority: p.hostname().to_string(),
            ..Default::default()
        })),
        timeout: Some(timeout(t)),
        ..Default::default()
    }
}

/// `statusOnError`, validated with the mesh config (an unparsable one is left to Envoy's 403).
fn status_on_error(status: &str) -> Option<HttpStatus> {
    check_status(status).ok().flatten().map(|code| HttpStatus { code })
}

fn buffer(body: &Option<RequestBody>) -> Option<http_authz::BufferSettings> {
    body.as_ref().map(|b| http_authz::BufferSettings {
        max_request_bytes: b.max_request_bytes,
        allow_partial_message: b.allow_partial_message,
        pack_as_bytes: b.pack_as_bytes,
    })
}

/// Header names as case-insensitive matchers: `prefix*`, `*suffix`, or exact.
fn header_list(headers: &[String]) -> Option<ListStringMatcher> {
    if headers.is_empty() {
        return None;
    }
    let patterns = headers
        .iter()
        .map(|h| {
            let pattern = if let Some(suffix) = h.strip_prefix('*') {
                MatchPattern::Suffix(suffix.to_string())
            } else if let Some(prefix) = h.strip_suffix('*') {
                MatchPattern::Prefix(prefix.to_string())
            } else {
                MatchPattern::Exact(h.clone())
            };
            StringMatcher { match_pattern: Some(pattern), ignore_case: true }
        })
        .collect();
    Some(ListStringMatcher { patterns })
}

/// The ext_authz HTTP filter's configuration for an enforced provider.
fn http_ext_authz(p: &ResolvedProvider<'_>) -> http_authz::ExtAuthz {
    let common =
        |fail_open: bool, clear_route_cache: bool, status: &str, body: &Option<RequestBody>| http_authz::ExtAuthz {
            transport_api_version: ApiVersion::V3 as i32,
            failure_mode_allow: fail_open,
            clear_route_cache,
            status_on_error: status_on_error(status),
            with_request_body: buffer(body),
            filter_enabled_metadata: Some(enabled_metadata(HTTP_RBAC, p.name)),
            ..Default::default()
        };
    match p.ext_authz {
        ExtAuthz::Http(http) => http_authz::ExtAuthz {
            services: Some(http_authz::ext_authz::Services::HttpService(http_service(p, http))),
            // The deprecated list counts only when the new one is empty (Istio's rule).
            allowed_headers: header_list(&http.include_request_headers_in_check)
                .or_else(|| header_list(&http.include_headers_in_check)),
            ..common(http.fail_open, http.clear_route_cache, &http.status_on_error, &http.include_request_body_in_check)
        },
        ExtAuthz::Grpc(grpc) => http_authz::ExtAuthz {
            services: Some(http_authz::ext_authz::Services::GrpcService(grpc_service(p, grpc.timeout))),
            ..common(grpc.fail_open, grpc.clear_route_cache, &grpc.status_on_error, &grpc.include_request_body_in_check)
        },
    }
}

/// The HTTP service of an HTTP provider: where checks go and which headers travel.
fn http_service(p: &ResolvedProvider<'_>, http: &ExtAuthzHttpProvider) -> http_authz::HttpService {
    let headers_to_add: Vec<HeaderValue> = http
        .include_additional_headers_in_check
        .iter()
        .map(|(k, v)| HeaderValue { key: k.clone(), value: v.clone(), ..Default::default() })
        .collect();
    let answers =
        [&http.headers_to_upstream_on_allow, &http.headers_to_downstream_on_deny, &http.headers_to_downstream_on_allow];
    let authorization_response = answers.iter().any(|h| !h.is_empty()).then(|| http_authz::AuthorizationResponse {
        allowed_upstream_headers: header_list(&http.headers_to_upstream_on_allow),
        allowed_client_headers: header_list(&http.headers_to_downstream_on_deny),
        allowed_client_headers_on_success: header_list(&http.headers_to_downstream_on_allow),
        ..Default::default()
    });
    http_authz::HttpService {
        server_uri: Some(HttpUri {
            // Required, though the filter sends to the cluster.
            uri: format!("http://{}", p.hostname()),
            timeout: Some(timeout(http.timeout)),
            http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(cluster_name(
                p.port,
                "",
                p.hostname().as_str(),
            ))),
        }),
        path_prefix: http.path_prefix.clone(),
        authorization_request: (!headers_to_add.is_empty())
            .then(|| http_authz::AuthorizationRequest { headers_to_add, ..Default::default() }),
        authorization_response,
        ..Default::default()
    }
}
