//! MeshConfig `extensionProviders`: the external authorizers (ext_authz, over HTTP or gRPC) that
//! CUSTOM AuthorizationPolicies name. Providers of other kinds (tracing, logging, metrics) are
//! read for their name only and otherwise left alone.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::api::Duration;
use crate::config::validation::{check_dns1123_label, check_dns1123_subdomain, check_duration};

/// Longest ext_authz provider name: it becomes part of metadata keys and RBAC policy names.
const MAX_PROVIDER_NAME_LEN: usize = 63;

/// One entry of `extensionProviders`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ExtensionProvider {
    /// The name policies refer to it by.
    pub name: String,
    /// An ext_authz service spoken to over HTTP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envoy_ext_authz_http: Option<ExtAuthzHttpProvider>,
    /// An ext_authz service spoken to over gRPC (`envoy.service.auth.v3.Authorization`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envoy_ext_authz_grpc: Option<ExtAuthzGrpcProvider>,
}

/// The ext_authz side of a provider, whichever protocol it speaks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExtAuthz<'a> {
    /// Over HTTP.
    Http(&'a ExtAuthzHttpProvider),
    /// Over gRPC.
    Grpc(&'a ExtAuthzGrpcProvider),
}

impl ExtAuthz<'_> {
    /// `service`: `host` or `namespace/host` of a service in the registry.
    pub fn service(&self) -> &str {
        match self {
            ExtAuthz::Http(p) => &p.service,
            ExtAuthz::Grpc(p) => &p.service,
        }
    }

    /// The service port checks are sent to.
    pub fn port(&self) -> u32 {
        match self {
            ExtAuthz::Http(p) => p.port,
            ExtAuthz::Grpc(p) => p.port,
        }
    }
}

impl ExtensionProvider {
    /// Its ext_authz configuration; `None` for providers of other kinds.
    pub fn ext_authz(&self) -> Option<ExtAuthz<'_>> {
        match (&self.envoy_ext_authz_http, &self.envoy_ext_authz_grpc) {
            (Some(http), _) => Some(ExtAuthz::Http(http)),
            (None, Some(grpc)) => Some(ExtAuthz::Grpc(grpc)),
            (None, None) => None,
        }
    }
}

/// Istio's `EnvoyExternalAuthorizationHttpProvider`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ExtAuthzHttpProvider {
    /// `host` or `namespace/host`.
    pub service: String,
    /// Service port.
    pub port: u32,
    /// How long a check may take (default 600s).
    pub timeout: Option<Duration>,
    /// Prefix of the check request's path.
    pub path_prefix: String,
    /// Let requests through when the authorizer cannot be reached.
    pub fail_open: bool,
    /// Clear the route cache after a check (the authorizer may change headers routes read).
    pub clear_route_cache: bool,
    /// HTTP status answered when the authorizer cannot be reached (Envoy's default: 403).
    pub status_on_error: String,
    /// Deprecated: request headers sent to the authorizer, used when the next field is empty.
    pub include_headers_in_check: Vec<String>,
    /// Request headers sent to the authorizer (exact, `prefix*` or `*suffix`, case-insensitive).
    pub include_request_headers_in_check: Vec<String>,
    /// Headers added to the check request.
    pub include_additional_headers_in_check: BTreeMap<String, String>,
    /// Send the request body too.
    pub include_request_body_in_check: Option<RequestBody>,
    /// Authorizer headers added to the request when allowed.
    pub headers_to_upstream_on_allow: Vec<String>,
    /// Authorizer headers returned to the client when denied.
    pub headers_to_downstream_on_deny: Vec<String>,
    /// Authorizer headers returned to the client when allowed.
    pub headers_to_downstream_on_allow: Vec<String>,
}

/// Istio's `EnvoyExternalAuthorizationGrpcProvider`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ExtAuthzGrpcProvider {
    /// `host` or `namespace/host`.
    pub service: String,
    /// Service port.
    pub port: u32,
    /// How long a check may take (default 600s).
    pub timeout: Option<Duration>,
    /// Let requests through when the authorizer cannot be reached.
    pub fail_open: bool,
    /// Clear the route cache after a check.
    pub clear_route_cache: bool,
    /// HTTP status answered when the authorizer cannot be reached (Envoy's default: 403).
    pub status_on_error: String,
    /// Send the request body too.
    pub include_request_body_in_check: Option<RequestBody>,
}

/// Istio's `EnvoyExternalAuthorizationRequestBody`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RequestBody {
    /// Most body bytes buffered for the check.
    pub max_request_bytes: u32,
    /// Send what was buffered when the body is larger, instead of answering 413.
    pub allow_partial_message: bool,
    /// Send the body as bytes rather than UTF-8 text.
    pub pack_as_bytes: bool,
}

/// Checks `extensionProviders`: the first offending field (relative to the list) and why.
pub(super) fn validate(providers: &[ExtensionProvider]) -> Result<(), (String, String)> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, p) in providers.iter().enumerate() {
        let at = |field: &str, reason: String| (format!("extensionProviders[{i}]{field}"), reason);
        if p.name.is_empty() {
            return Err(at(".name", "empty extension provider name".into()));
        }
        if !seen.insert(p.name.as_str()) {
            return Err(at(".name", format!("duplicate extension provider name {}", p.name)));
        }
        if p.envoy_ext_authz_http.is_some() && p.envoy_ext_authz_grpc.is_some() {
            return Err(at("", "only one of envoyExtAuthzHttp or envoyExtAuthzGrpc may be set".into()));
        }
        let Some(ext_authz) = p.ext_authz() else { continue };
        check_provider_name(&p.name).map_err(|reason| at(".name", reason))?;
        let (kind, result) = match ext_authz {
            ExtAuthz::Http(http) => ("envoyExtAuthzHttp", check_http(http)),
            ExtAuthz::Grpc(grpc) => ("envoyExtAuthzGrpc", check_grpc(grpc)),
        };
        result.map_err(|(field, reason)| at(&format!(".{kind}.{field}"), reason))?;
    }
    Ok(())
}

/// Istio's rule for ext_authz provider names (they go into metadata keys and policy names).
fn check_provider_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_PROVIDER_NAME_LEN {
        return Err(format!("invalid provider name {name:?}: too long (max 63 characters): {}", name.len()));
    }
    if let Some((i, c)) =
        name.char_indices().find(|(_, c)| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(format!(
            "invalid provider name {name:?}: invalid character {c:?} at position {i} (only lowercase letters, \
             digits, and hyphens allowed)"
        ));
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err(format!("invalid provider name {name:?}: cannot start or end with hyphen"));
    }
    Ok(())
}

type FieldResult = Result<(), (String, String)>;

fn field(name: &str, result: Result<(), String>) -> FieldResult {
    result.map_err(|reason| (name.to_string(), reason))
}

fn check_common(service: &str, port: u32, timeout: Option<Duration>, status_on_error: &str) -> FieldResult {
    field("service", check_service(service))?;
    field("port", check_port(port))?;
    field("timeout", timeout.map_or(Ok(()), check_duration))?;
    field("statusOnError", check_status(status_on_error).map(|_| ()))
}

fn check_http(p: &ExtAuthzHttpProvider) -> FieldResult {
    check_common(&p.service, p.port, p.timeout, &p.status_on_error)?;
    if !p.path_prefix.is_empty() && !p.path_prefix.starts_with('/') {
        return field("pathPrefix", Err(format!("pathPrefix should begin with `/` but found {:?}", p.path_prefix)));
    }
    if p.path_prefix.chars().any(|c| c.is_control() || c == ' ' || c == '?' || c == '#') {
        return field("pathPrefix", Err(format!("invalid pathPrefix {:?}", p.path_prefix)));
    }
    let lists = [
        ("includeRequestHeadersInCheck", &p.include_request_headers_in_check),
        ("includeHeadersInCheck", &p.include_headers_in_check),
        ("headersToUpstreamOnAllow", &p.headers_to_upstream_on_allow),
        ("headersToDownstreamOnDeny", &p.headers_to_downstream_on_deny),
        ("headersToDownstreamOnAllow", &p.headers_to_downstream_on_allow),
    ];
    for (name, headers) in lists {
        if let Some(i) = headers.iter().position(|h| h == "*" || h.is_empty()) {
            let reason = "a single wildcard (\"*\") or an empty name is not supported, change it to either prefix or \
                          suffix match";
            return field(&format!("{name}[{i}]"), Err(reason.to_string()));
        }
    }
    Ok(())
}

fn check_grpc(p: &ExtAuthzGrpcProvider) -> FieldResult {
    check_common(&p.service, p.port, p.timeout, &p.status_on_error)
}

fn check_port(port: u32) -> Result<(), String> {
    if (1..=65535).contains(&port) {
        Ok(())
    } else {
        Err(format!("port number {port} must be in the range 1..65535"))
    }
}

/// `host` (a DNS name or an IP) or `namespace/host`.
fn check_service(service: &str) -> Result<(), String> {
    if service.is_empty() {
        return Err("service must not be empty".into());
    }
    match service.split_once('/') {
        Some((namespace, host)) => {
            check_dns1123_label(namespace).map_err(|e| format!("invalid namespace in {service}: {e}"))?;
            check_dns1123_subdomain(host).map_err(|e| format!("invalid service fmt {service}: {e}"))
        }
        None if service.parse::<std::net::IpAddr>().is_ok() => Ok(()),
        None => check_dns1123_subdomain(service).map_err(|e| format!("invalid service fmt {service}: {e}")),
    }
}

/// `statusOnError`: empty (Envoy's default), or a status code Envoy's `StatusCode` enum names.
pub fn check_status(status: &str) -> Result<Option<i32>, String> {
    use envoy_types::pb::envoy::r#type::v3::StatusCode;
    if status.is_empty() {
        return Ok(None);
    }
    let code: i32 = status.parse().map_err(|e| format!("invalid statusOnError value {status}: {e}"))?;
    match StatusCode::try_from(code) {
        // `Empty` (0) is in the enum but Envoy's validation refuses it.
        Ok(c) if c != StatusCode::Empty => Ok(Some(code)),
        _ => Err(format!("unsupported statusOnError value {status}: not an HTTP status code Envoy knows")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Vec<ExtensionProvider> {
        serde_saphyr::from_str(yaml).expect("providers")
    }

    #[test]
    fn ext_authz_providers_are_read_and_others_left_alone() {
        let providers = parse(
            "- name: opa\n  envoyExtAuthzGrpc: {service: opa.authz.svc.cluster.local, port: 9191, timeout: 2s, \
             failOpen: true, statusOnError: '503', includeRequestBodyInCheck: {maxRequestBytes: 4096}}\n\
             - name: oauth2\n  envoyExtAuthzHttp:\n    service: authz/oauth2-proxy.authz.svc.cluster.local\n    \
             port: 4180\n    pathPrefix: /check\n    includeRequestHeadersInCheck: [cookie, 'x-auth-*']\n    \
             includeAdditionalHeadersInCheck: {x-from: mesh}\n    headersToUpstreamOnAllow: [authorization]\n\
             - name: zipkin\n  zipkin: {service: zipkin.istio-system.svc.cluster.local, port: 9411}\n",
        );
        assert!(validate(&providers).is_ok());
        match providers[0].ext_authz() {
            Some(ExtAuthz::Grpc(g)) => {
                assert_eq!((g.port, g.fail_open, g.status_on_error.as_str()), (9191, true, "503"));
                assert_eq!(g.timeout.map(|t| t.as_std().as_secs()), Some(2));
                assert_eq!(g.include_request_body_in_check.as_ref().map(|b| b.max_request_bytes), Some(4096));
            }
            other => panic!("gRPC provider expected: {other:?}"),
        }
        match providers[1].ext_authz() {
            Some(ExtAuthz::Http(h)) => {
                assert_eq!(h.service, "authz/oauth2-proxy.authz.svc.cluster.local");
                assert_eq!(h.include_request_headers_in_check, ["cookie", "x-auth-*"]);
                assert_eq!(h.include_additional_headers_in_check["x-from"], "mesh");
                assert!(!h.fail_open, "fail closed by default");
            }
            other => panic!("HTTP provider expected: {other:?}"),
        }
        assert_eq!(providers[2].name, "zipkin");
        assert!(providers[2].ext_authz().is_none(), "a tracing provider is not an ext_authz one");
    }

    #[test]
    fn bad_fields_are_reported_with_their_path() {
        for (yaml, field, reason) in [
            ("- name: a\n  envoyExtAuthzHttp: {service: s.ns.svc, port: 0}", "[0].envoyExtAuthzHttp.port", "1..65535"),
            ("- name: a\n  envoyExtAuthzGrpc: {port: 80}", "[0].envoyExtAuthzGrpc.service", "must not be empty"),
            (
                "- name: a\n  envoyExtAuthzGrpc: {service: s, port: 80, statusOnError: '999'}",
                "[0].envoyExtAuthzGrpc.statusOnError",
                "unsupported statusOnError",
            ),
            (
                "- name: a\n  envoyExtAuthzHttp: {service: s, port: 80, pathPrefix: check}",
                "[0].envoyExtAuthzHttp.pathPrefix",
                "should begin with `/`",
            ),
            (
                "- name: a\n  envoyExtAuthzHttp: {service: s, port: 80, headersToDownstreamOnDeny: [a, '*']}",
                "[0].envoyExtAuthzHttp.headersToDownstreamOnDeny[1]",
                "single wildcard",
            ),
            (
                "- name: a\n  envoyExtAuthzHttp: {service: s, port: 80, timeout: 0s}",
                "[0].envoyExtAuthzHttp.timeout",
                "greater than 1ms",
            ),
            ("- name: Ext\n  envoyExtAuthzGrpc: {service: s, port: 80}", "[0].name", "invalid character 'E'"),
            ("- name: a\n  zipkin: {}\n- name: a\n  zipkin: {}", "[1].name", "duplicate extension provider name a"),
            ("- zipkin: {}", "[0].name", "empty extension provider name"),
        ] {
            let (f, r) = validate(&parse(yaml)).expect_err(yaml);
            assert_eq!(f, format!("extensionProviders{field}"), "{yaml}");
            assert!(r.contains(reason), "{yaml}: {r}");
        }
        // A tracing provider's name is Istio's business, not ext_authz's.
        assert!(validate(&parse("- name: My.Tracer\n  zipkin: {}")).is_ok());
    }
}
