//! What an HTTP rule does: forward (clusters, retries, rewrites, mirrors), redirect, or answer.

use envoy_types::pb::envoy::config::core::v3::{data_source, DataSource, RuntimeFractionalPercent};
use envoy_types::pb::envoy::config::route::v3::{
    redirect_action::{PathRewriteSpecifier, RedirectResponseCode, SchemeRewriteSpecifier},
    retry_policy::{self, retry_host_predicate, RetryBackOff, RetryHostPredicate},
    route_action::{ClusterSpecifier, HostRewriteSpecifier, RequestMirrorPolicy},
    DirectResponseAction, RedirectAction, RetryPolicy, RouteAction,
};
use envoy_types::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use envoy_types::pb::envoy::extensions::retry::priority::previous_priorities::v3::PreviousPrioritiesConfig;
use envoy_types::pb::envoy::r#type::matcher::v3::RegexMatchAndSubstitute;

use super::destination::resolve;
use super::http_match::{regex, RouteContext};
use super::names::ext;
use super::proto::{any, bool_value, duration, percent_of_hundred, percent_of_million, u32_value, zero_duration};
use super::scope::Scope;
use crate::config::api::common::Percent;
use crate::config::api::virtual_service::{Destination, HttpDirectResponse, HttpRedirect, HttpRetry, HttpRoute};

/// Istio's default `retryOn`.
const DEFAULT_RETRY_ON: &str = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes";

/// Istio's retry policy: the default (2 attempts on connection-level failures; `retriable-status-codes`
/// with no codes, so no status is retried, as istiod sends it) when the rule has none, nothing when
/// `attempts` is 0. With consistent hashing, retries stay on the same host, so the previous-hosts
/// predicate is left out.
pub(super) fn retry_policy(retry: Option<&HttpRetry>, consistent_hash: bool) -> Option<RetryPolicy> {
    let mut out = RetryPolicy {
        num_retries: Some(u32_value(2)),
        retry_on: DEFAULT_RETRY_ON.to_string(),
        host_selection_retry_max_attempts: 5,
        retry_host_predicate: if consistent_hash { Vec::new() } else { vec![previous_hosts()] },
        ..Default::default()
    };
    let Some(retry) = retry else { return Some(out) };
    let attempts = u32::try_from(retry.attempts).ok().filter(|a| *a > 0)?;
    out.num_retries = Some(u32_value(attempts));
    if !retry.retry_on.is_empty() {
        let (policies, codes) = parse_retry_on(&retry.retry_on);
        out.retry_on = policies;
        out.retriable_status_codes = codes;
        // Appended as istiod does, even to an empty list (Envoy skips the empty entry).
        if !out.retriable_status_codes.is_empty() && !out.retry_on.contains("retriable-status-codes") {
            out.retry_on.push_str(",retriable-status-codes");
        }
    }
    out.per_try_timeout = retry.per_try_timeout.map(|d| duration(d.0));
    if let Some(ignore_previous) = retry.retry_ignore_previous_hosts {
        out.retry_host_predicate = if ignore_previous { vec![previous_hosts()] } else { Vec::new() };
    }
    if retry.retry_remote_localities == Some(true) {
        out.retry_priority = Some(previous_priorities());
    }
    out.retry_back_off = retry.backoff.map(|d| RetryBackOff { base_interval: Some(duration(d.0)), max_interval: None });
    Some(out)
}

/// Splits `retryOn` into Envoy policies and HTTP status codes: a number is a code when it names a
/// registered status (the ones Go's `net/http` knows, as istiod decides), else it stays a policy.
fn parse_retry_on(retry_on: &str) -> (String, Vec<u32>) {
    let mut policies = Vec::new();
    let mut codes = Vec::new();
    for part in retry_on.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.parse::<u32>() {
            Ok(code) if is_registered_status(code) => codes.push(code),
            _ => policies.push(part),
        }
    }
    (policies.join(","), codes)
}

/// Whether `code` is a registered HTTP status code (IANA's registry, as Go's `net/http` lists it).
fn is_registered_status(code: u32) -> bool {
    matches!(code,
        100..=103 | 200..=208 | 226 | 300..=305 | 307 | 308 | 400..=418 | 421..=426 | 428 | 429 | 431 | 451
        | 500..=508 | 510 | 511)
}

/// Retries go to another locality's priority first (`retryRemoteLocalities`), updated every two
/// attempts as istiod configures it.
fn previous_priorities() -> retry_policy::RetryPriority {
    retry_policy::RetryPriority {
        name: ext::PREVIOUS_PRIORITIES.to_string(),
        config_type: Some(retry_policy::retry_priority::ConfigType::TypedConfig(any(PreviousPrioritiesConfig {
            update_frequency: 2,
        }))),
    }
}

/// Sets a route's timeout (zero: none) and, as istiod does for Envoy proxies, the same bound on
/// the `grpc-timeout` header (`max_grpc_timeout`; zero lets the header's value apply unbounded).
pub(super) fn set_timeout(action: &mut RouteAction, timeout: Option<envoy_types::pb::google::protobuf::Duration>) {
    let timeout = timeout.unwrap_or_else(zero_duration);
    #[allow(deprecated)] // istiod sends the deprecated field: its replacement has regressions.
    {
        action.max_grpc_timeout = Some(timeout);
    }
    action.timeout = Some(timeout);
}

fn previous_hosts() -> RetryHostPredicate {
    RetryHostPredicate {
        name: ext::PREVIOUS_HOSTS.to_string(),
        config_type: Some(retry_host_predicate::ConfigType::TypedConfig(any(PreviousHostsPredicate {}))),
    }
}

/// The forwarding part of a rule without its destinations: timeout (Istio's default is none),
/// rewrites, authority and mirrors.
pub(super) fn forward_action(
    scope: &Scope<'_>,
    rule: &HttpRoute,
    ctx: &RouteContext<'_>,
    vs_ns: &str,
    authority: Option<String>,
) -> RouteAction {
    let mut action = RouteAction::default();
    set_timeout(&mut action, rule.timeout.map(|d| duration(d.0)));
    let mut authority = authority;
    if let Some(rewrite) = &rule.rewrite {
        if let Some(rr) = &rewrite.uri_regex_rewrite {
            action.regex_rewrite =
                Some(RegexMatchAndSubstitute { pattern: Some(regex(&rr.pattern)), substitution: rr.rewrite.clone() });
        } else if !rewrite.uri.is_empty() {
            // Envoy replaces the matched prefix, or the whole path for exact and regex matches.
            action.prefix_rewrite = rewrite.uri.clone();
        }
        if !rewrite.authority.is_empty() {
            authority = Some(rewrite.authority.clone());
        }
    }
    action.host_rewrite_specifier = authority.map(HostRewriteSpecifier::HostRewriteLiteral);
    action.request_mirror_policies = mirrors(scope, rule, ctx, vs_ns);
    action
}

fn mirrors(scope: &Scope<'_>, rule: &HttpRoute, ctx: &RouteContext<'_>, vs_ns: &str) -> Vec<RequestMirrorPolicy> {
    let legacy = rule.mirror.as_ref().map(|dest| {
        let fraction = match (&rule.mirror_percentage, rule.mirror_percent) {
            (Some(p), _) => mirror_fraction(Some(p)),
            (None, Some(p)) => (p > 0).then(|| percent_of_hundred(p)),
            (None, None) => mirror_fraction(None),
        };
        (dest, fraction)
    });
    let listed =
        rule.mirrors.iter().filter_map(|m| Some((m.destination.as_ref()?, mirror_fraction(m.percentage.as_ref()))));
    legacy
        .into_iter()
        .chain(listed)
        .filter_map(|(dest, fraction)| Some(mirror_policy(scope, dest, ctx, vs_ns, fraction?)))
        .collect()
}

/// Mirror share: all requests by default, none when set to 0.
fn mirror_fraction(p: Option<&Percent>) -> Option<envoy_types::pb::envoy::r#type::v3::FractionalPercent> {
    match p {
        None => Some(percent_of_hundred(100)),
        Some(p) if p.value > 0.0 => Some(percent_of_million(p)),
        Some(_) => None,
    }
}

fn mirror_policy(
    scope: &Scope<'_>,
    dest: &Destination,
    ctx: &RouteContext<'_>,
    vs_ns: &str,
    fraction: envoy_types::pb::envoy::r#type::v3::FractionalPercent,
) -> RequestMirrorPolicy {
    RequestMirrorPolicy {
        cluster: resolve(scope, dest, vs_ns, ctx.listen_port).cluster,
        runtime_fraction: Some(RuntimeFractionalPercent { default_value: Some(fraction), ..Default::default() }),
        trace_sampled: Some(bool_value(false)),
        ..Default::default()
    }
}

/// Sets the single cluster a route forwards to.
pub(super) fn set_cluster(action: &mut RouteAction, cluster: String) {
    action.cluster_specifier = Some(ClusterSpecifier::Cluster(cluster));
}

/// An HTTP redirect; `None` for status codes Envoy cannot send (the route is dropped).
pub(super) fn redirect(r: &HttpRedirect, ctx: &RouteContext<'_>) -> Option<RedirectAction> {
    let code = match r.redirect_code.unwrap_or(301) {
        301 => RedirectResponseCode::MovedPermanently,
        302 => RedirectResponseCode::Found,
        303 => RedirectResponseCode::SeeOther,
        307 => RedirectResponseCode::TemporaryRedirect,
        308 => RedirectResponseCode::PermanentRedirect,
        _ => return None,
    };
    let mut out = RedirectAction {
        host_redirect: r.authority.clone(),
        response_code: code as i32,
        path_rewrite_specifier: (!r.uri.is_empty()).then(|| PathRewriteSpecifier::PathRedirect(r.uri.clone())),
        scheme_rewrite_specifier: (!r.scheme.is_empty())
            .then(|| SchemeRewriteSpecifier::SchemeRedirect(r.scheme.clone())),
        ..Default::default()
    };
    let port = match (r.port, r.derive_port.as_deref()) {
        (Some(p), _) => Some(p),
        (None, Some("FROM_REQUEST_PORT")) => Some(u32::from(ctx.listen_port)),
        _ => None,
    };
    if let Some(port) = port {
        let scheme = if !r.scheme.is_empty() {
            r.scheme.as_str()
        } else if ctx.tls {
            "https"
        } else {
            "http"
        };
        // The scheme's default port is left implicit, as Istio does.
        let default_port = (port == 80 && scheme == "http") || (port == 443 && scheme == "https");
        out.port_redirect = if default_port { 0 } else { port };
    }
    Some(out)
}

/// A direct response with an optional inline body.
pub(super) fn direct_response(d: &HttpDirectResponse) -> DirectResponseAction {
    let body = d.body.as_ref().and_then(|b| {
        let specifier = match (&b.string, &b.bytes) {
            (Some(s), _) => data_source::Specifier::InlineString(s.clone()),
            (None, Some(encoded)) => data_source::Specifier::InlineBytes(decode_base64(encoded)?),
            (None, None) => return None,
        };
        Some(DataSource { specifier: Some(specifier), ..Default::default() })
    });
    DirectResponseAction { status: d.status, body, ..Default::default() }
}

/// Decodes standard base64 (protobuf JSON's `bytes` form); `None` if it is not base64.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        } as u32)
    };
    let digits: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=').collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= value(*c)? << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::api::Labels;

    #[test]
    fn retry_on_keeps_policies_and_collects_codes() {
        assert_eq!(parse_retry_on("5xx, 503,reset,429"), ("5xx,reset".to_string(), vec![503, 429]));
        let only_codes = HttpRetry { attempts: 2, retry_on: "503".into(), ..Default::default() };
        let policy = retry_policy(Some(&only_codes), false).expect("policy");
        // As istiod appends it (Envoy skips the empty entry).
        assert_eq!(policy.retry_on, ",retriable-status-codes");
        assert!(retry_policy(Some(&HttpRetry::default()), false).is_none(), "attempts 0 disables retries");
        // Only registered statuses are codes.
        assert_eq!(parse_retry_on("599,504"), ("599".to_string(), vec![504]));
    }

    #[test]
    fn the_default_policy_retries_connection_failures_and_no_status() {
        let default = retry_policy(None, false).expect("default policy");
        assert_eq!(default.retry_on, DEFAULT_RETRY_ON);
        assert!(default.retriable_status_codes.is_empty(), "istiod no longer retries 503 by default");
        assert_eq!(default.retry_host_predicate.len(), 1);
        assert!(retry_policy(None, true).expect("hashed").retry_host_predicate.is_empty());
        let remote = HttpRetry { attempts: 3, retry_remote_localities: Some(true), ..Default::default() };
        let priority = retry_policy(Some(&remote), false).and_then(|p| p.retry_priority).expect("priority");
        assert_eq!(priority.name, ext::PREVIOUS_PRIORITIES);
    }

    #[test]
    fn redirect_omits_the_schemes_default_port() {
        let labels = Labels::new();
        let ctx = RouteContext { listen_port: 443, gateway: "mesh", tls: true, labels: &labels, namespace: "ns" };
        let r = HttpRedirect { derive_port: Some("FROM_REQUEST_PORT".into()), ..Default::default() };
        let out = redirect(&r, &ctx).expect("redirect");
        assert_eq!((out.port_redirect, out.response_code), (0, RedirectResponseCode::MovedPermanently as i32));
        assert!(redirect(&HttpRedirect { redirect_code: Some(305), ..Default::default() }, &ctx).is_none());
    }

    #[test]
    fn base64_bodies_decode() {
        assert_eq!(decode_base64("aGk="), Some(b"hi".to_vec()));
        assert_eq!(decode_base64("aGVsbG8gd29ybGQ="), Some(b"hello world".to_vec()));
        assert_eq!(decode_base64("**"), None);
    }
}
