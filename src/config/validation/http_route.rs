//! VirtualService HTTP route rules: what a route does, its matches, and its request/response policies.

use crate::config::api::common::Percent;
use crate::config::api::virtual_service::GRPC_STATUS_NAMES;
use crate::config::api::virtual_service::{
    CorsPolicy, FaultAbort, FaultDelay, HttpDirectResponse, HttpFaultInjection, HttpMatchRequest, HttpRedirect,
    HttpRetry, HttpRewrite, HttpRoute, HttpRouteDestination,
};
use crate::config::api::StringMatch;

use super::destination::{check_destination, check_weights};
use super::durations::{check_duration, check_optional};
use super::field_errors::{check_percent_range, forbidden, invalid, required, unsupported, Errors};
use super::gateway_binding::RouteContext;
use super::headers::{
    check_cors_header_name, check_header_operations, check_header_value, check_match_header_name, is_authority_header,
    is_jwt_claim,
};
use super::hosts::is_dns_label;
use super::labels::check_labels;
use super::ports::check_port;
use super::string_match::{check_regex, check_string_match, variant, EmptyPrefix};

/// Redirect codes Envoy can send.
const REDIRECT_CODES: [u32; 5] = [301, 302, 303, 307, 308];

/// Methods allowed in CORS `allowMethods`.
const CORS_METHODS: [&str; 9] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE"];

/// Envoy's `x-envoy-retry-on` and `x-envoy-retry-grpc-on` conditions.
const RETRY_ON_POLICIES: [&str; 16] = [
    "5xx",
    "gateway-error",
    "reset",
    "reset-before-request",
    "connect-failure",
    "retriable-4xx",
    "refused-stream",
    "retriable-status-codes",
    "retriable-headers",
    "envoy-ratelimited",
    "http3-post-connect-failure",
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
];

/// HTTP status codes with a registered meaning (retryOn may name them).
const KNOWN_STATUS_CODES: [u16; 62] = [
    100, 101, 102, 103, 200, 201, 202, 203, 204, 205, 206, 207, 208, 226, 300, 301, 302, 303, 304, 305, 307, 308, 400,
    401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415, 416, 417, 418, 421, 422, 423, 424, 425,
    426, 428, 429, 431, 451, 500, 501, 502, 503, 504, 505, 506, 507, 508, 510, 511,
];

/// Largest direct response body (larger ones slow every push).
const MAX_DIRECT_RESPONSE_BYTES: usize = 1024 * 1024;

/// Checks one HTTP route at `path` (`spec.http[i]`).
pub(super) fn check_http_route(errors: &mut Errors, path: &str, route: &HttpRoute, ctx: &RouteContext) {
    if ctx.delegate && route.delegate.is_some() {
        errors.add(format!("{path}.delegate"), forbidden("delegate HTTP route cannot contain delegate"));
    }
    check_action(errors, path, route);
    for (j, m) in route.matches.iter().enumerate() {
        check_match(errors, &format!("{path}.match[{j}]"), m, ctx);
    }
    if let Some(headers) = &route.headers {
        check_header_operations(errors, &format!("{path}.headers"), headers);
    }
    check_authority_rewrite(errors, path, route);
    if let Some(cors) = &route.cors_policy {
        check_cors(errors, &format!("{path}.corsPolicy"), cors);
    }
    if let Some(fault) = &route.fault {
        check_fault(errors, &format!("{path}.fault"), fault);
    }
    check_mirrors(errors, path, route);
    if let Some(redirect) = &route.redirect {
        check_redirect(errors, &format!("{path}.redirect"), redirect);
    }
    if let Some(response) = &route.direct_response {
        check_direct_response(errors, &format!("{path}.directResponse"), response);
    }
    if let Some(retries) = &route.retries {
        check_retries(errors, &format!("{path}.retries"), retries);
    }
    if let Some(rewrite) = &route.rewrite {
        check_rewrite(errors, &format!("{path}.rewrite"), rewrite);
    }
    check_route_destinations(errors, &format!("{path}.route"), &route.route);
    errors.check(format!("{path}.timeout"), check_optional(route.timeout));
}

/// Checks that the route does exactly one thing: forward (`route`), redirect, respond directly or delegate.
fn check_action(errors: &mut Errors, path: &str, route: &HttpRoute) {
    let has_route = !route.route.is_empty();
    let has_fault = route.fault.is_some();
    let has_rewrite = route.rewrite.is_some();
    let field = |name: &str| format!("{path}.{name}");
    if route.delegate.is_some() {
        // A directResponse is what the delegate's rules inherit when they set none (as istiod merges).
        let conflicts = [(route.redirect.is_some(), "redirect"), (has_route, "route")];
        for (_, name) in conflicts.iter().filter(|(set, _)| *set) {
            errors.add(field(name), forbidden(format!("root HTTP route must not specify {name} with delegate")));
        }
        return;
    }
    if route.redirect.is_some() {
        let conflicts = [
            (has_route, "route", "HTTP route cannot contain both route and redirect"),
            (has_fault, "fault", "HTTP route cannot contain both fault and redirect"),
            (has_rewrite, "rewrite", "HTTP route rule cannot contain both rewrite and redirect"),
            (
                route.direct_response.is_some(),
                "directResponse",
                "HTTP route rule cannot contain both direct_response and redirect",
            ),
        ];
        add_conflicts(errors, path, &conflicts);
    } else if route.direct_response.is_some() {
        let conflicts = [
            (has_route, "route", "HTTP route cannot contain both route and direct_response"),
            (has_fault, "fault", "HTTP route cannot contain both fault and direct_response"),
            (has_rewrite, "rewrite", "HTTP route rule cannot contain both rewrite and direct_response"),
        ];
        add_conflicts(errors, path, &conflicts);
    } else if !has_route {
        errors.add(field("route"), required("HTTP route, redirect or direct_response is required"));
    }
    if route.mirror.is_some() && !route.mirrors.is_empty() {
        errors.add(field("mirrors"), forbidden("HTTP route cannot contain both mirror and mirrors"));
    }
    // Envoy mirrors only forwarded requests; on a redirect or direct response a mirror would be dropped.
    if !has_route {
        let mirror =
            if route.mirror.is_some() { Some("mirror") } else { (!route.mirrors.is_empty()).then_some("mirrors") };
        if let Some(name) = mirror {
            errors.add(field(name), forbidden("mirroring needs a route to forward requests to"));
        }
    }
}

fn add_conflicts(errors: &mut Errors, path: &str, conflicts: &[(bool, &str, &str)]) {
    for (_, name, message) in conflicts.iter().filter(|(set, _, _)| *set) {
        errors.add(format!("{path}.{name}"), forbidden(message));
    }
}

/// Checks one match condition at `path` (`...match[j]`).
fn check_match(errors: &mut Errors, path: &str, m: &HttpMatchRequest, ctx: &RouteContext) {
    for (name, matcher) in &m.headers {
        let field = format!("{path}.headers[{name}]");
        check_claim_allowed(errors, &field, name, ctx);
        errors.check(field.clone(), check_match_header_name(name));
        errors.check(format!("{field}.{}", variant(matcher)), check_string_match(matcher, EmptyPrefix::Rejected));
    }
    for (name, matcher) in &m.without_headers {
        let field = format!("{path}.withoutHeaders[{name}]");
        check_claim_allowed(errors, &field, name, ctx);
        errors.check(field.clone(), check_match_header_name(name));
        // A regex of `*` means "header present", not an RE2 pattern.
        if !matches!(matcher, StringMatch::Regex(re) if re == "*") {
            errors.check(format!("{field}.{}", variant(matcher)), check_string_match(matcher, EmptyPrefix::Rejected));
        }
    }
    let string_fields = [
        ("uri", &m.uri, EmptyPrefix::Allowed),
        ("scheme", &m.scheme, EmptyPrefix::Rejected),
        ("method", &m.method, EmptyPrefix::Rejected),
        ("authority", &m.authority, EmptyPrefix::Rejected),
    ];
    for (name, matcher, empty_prefix) in string_fields {
        if let Some(matcher) = matcher {
            errors.check(format!("{path}.{name}.{}", variant(matcher)), check_string_match(matcher, empty_prefix));
        }
    }
    for (name, matcher) in &m.query_params {
        let field = format!("{path}.queryParams[{name}].{}", variant(matcher));
        errors.check(field, check_string_match(matcher, EmptyPrefix::Rejected));
    }
    if let Some(port) = m.port.filter(|p| *p != 0) {
        errors.check(format!("{path}.port"), check_port(port));
    }
    check_labels(errors, &format!("{path}.sourceLabels"), &m.source_labels);
    ctx.check_match_gateways(errors, &format!("{path}.gateways"), &m.gateways);
    if !m.source_namespace.is_empty() && !is_dns_label(&m.source_namespace) {
        errors.add(format!("{path}.sourceNamespace"), invalid(&m.source_namespace, "sourceNamespace match is invalid"));
    }
}

/// JWT claims exist only where a gateway authenticated the request.
fn check_claim_allowed(errors: &mut Errors, field: &str, name: &str, ctx: &RouteContext) {
    if is_jwt_claim(name) && !ctx.gateway_only {
        errors.add(field, forbidden(format!("JWT claim based routing (key: {name}) is only supported for gateway")));
    }
}

/// Checks that the authority is rewritten in at most one place.
fn check_authority_rewrite(errors: &mut Errors, path: &str, route: &HttpRoute) {
    let from_rewrite = route.rewrite.as_ref().is_some_and(|r| !r.authority.is_empty());
    let from_headers =
        route.headers.as_ref().and_then(|h| h.request.as_ref()).map_or(0, |request| {
            request.set.keys().chain(request.add.keys()).filter(|k| is_authority_header(k)).count()
        });
    if usize::from(from_rewrite) + from_headers > 1 {
        errors.add(format!("{path}.headers.request"), forbidden("authority header cannot be set multiple times"));
    }
}

/// Checks a CORS policy at `path` (`...corsPolicy`).
fn check_cors(errors: &mut Errors, path: &str, cors: &CorsPolicy) {
    for (i, origin) in cors.allow_origins.iter().enumerate() {
        let field = format!("{path}.allowOrigins[{i}]");
        let value = match origin {
            StringMatch::Exact(v) | StringMatch::Prefix(v) | StringMatch::Regex(v) => v,
        };
        if value.is_empty() {
            errors.add(field, invalid(value, "'' is not a valid match type for CORS allow origins"));
        } else {
            errors.check(format!("{field}.{}", variant(origin)), check_string_match(origin, EmptyPrefix::Rejected));
        }
    }
    for (i, method) in cors.allow_methods.iter().enumerate() {
        if !CORS_METHODS.contains(&method.as_str()) {
            errors.add(format!("{path}.allowMethods[{i}]"), unsupported(method, &CORS_METHODS));
        }
    }
    for (list, name) in [(&cors.allow_headers, "allowHeaders"), (&cors.expose_headers, "exposeHeaders")] {
        for (i, header) in list.iter().enumerate() {
            errors.check(format!("{path}.{name}[{i}]"), check_cors_header_name(header));
        }
    }
    if let Some(max_age) = cors.max_age {
        let whole_seconds = max_age.as_std().subsec_nanos() == 0;
        let result = check_duration(max_age).and_then(|()| {
            if whole_seconds {
                Ok(())
            } else {
                Err(invalid(max_age.to_string(), "max_age duration is accurate only to seconds precision"))
            }
        });
        errors.check(format!("{path}.maxAge"), result);
    }
    if let Some(mode) = &cors.unmatched_preflights {
        const MODES: [&str; 3] = ["UNSPECIFIED", "FORWARD", "IGNORE"];
        if !MODES.contains(&mode.as_str()) {
            errors.add(format!("{path}.unmatchedPreflights"), unsupported(mode, &MODES));
        }
    }
}

/// Checks fault injection at `path` (`...fault`).
fn check_fault(errors: &mut Errors, path: &str, fault: &HttpFaultInjection) {
    if fault.abort.is_none() && fault.delay.is_none() {
        errors.add(path, required("HTTP fault injection must have an abort and/or a delay"));
    }
    if let Some(abort) = &fault.abort {
        check_abort(errors, &format!("{path}.abort"), abort);
    }
    if let Some(delay) = &fault.delay {
        check_delay(errors, &format!("{path}.delay"), delay);
    }
}

fn check_abort(errors: &mut Errors, path: &str, abort: &FaultAbort) {
    check_fault_percentage(errors, path, abort.percentage.as_ref());
    let kinds = [abort.http_status.is_some(), abort.grpc_status.is_some(), abort.http2_error.is_some()];
    if kinds.iter().filter(|set| **set).count() > 1 {
        errors.add(path, forbidden("only one of httpStatus, grpcStatus or http2Error can be set"));
    }
    if let Some(status) = abort.http_status {
        errors.check(format!("{path}.httpStatus"), check_http_status(status));
    }
    if let Some(status) = abort.grpc_status.as_deref().filter(|s| !GRPC_STATUS_NAMES.contains(s)) {
        errors.add(format!("{path}.grpcStatus"), unsupported(status, &GRPC_STATUS_NAMES));
    }
    if abort.http2_error.is_some() {
        errors.add(format!("{path}.http2Error"), forbidden("HTTP/2 abort fault injection not supported yet"));
    }
}

fn check_delay(errors: &mut Errors, path: &str, delay: &FaultDelay) {
    check_fault_percentage(errors, path, delay.percentage.as_ref());
    check_percent_range(errors, format!("{path}.percent"), delay.percent.map(f64::from));
    match (delay.fixed_delay, delay.exponential_delay) {
        (Some(_), Some(_)) => errors.add(path, forbidden("only one of fixedDelay or exponentialDelay can be set")),
        (Some(fixed), None) => errors.check(format!("{path}.fixedDelay"), check_duration(fixed)),
        (None, Some(_)) => {
            errors.add(format!("{path}.exponentialDelay"), forbidden("exponentialDelay not supported yet"));
        }
        (None, None) => errors.add(format!("{path}.fixedDelay"), required("a delay needs fixedDelay")),
    }
}

/// Fault percentages are 0, or 0.0001–100 (Envoy's resolution is a millionth).
fn check_fault_percentage(errors: &mut Errors, path: &str, percentage: Option<&Percent>) {
    if let Some(v) = percentage.map(|p| p.value) {
        if !(0.0..=100.0).contains(&v) || (v > 0.0 && v < 0.0001) {
            let reason = invalid(v, "percentage is neither 0.0, nor in range [0.0001, 100.0]");
            errors.add(format!("{path}.percentage.value"), reason);
        }
    }
}

fn check_http_status(status: i32) -> Result<(), String> {
    if (200..=599).contains(&status) {
        Ok(())
    } else {
        Err(invalid(status, "HTTP status is not in range 200-599"))
    }
}

/// Checks `mirror`, `mirrors` and the mirror percentages of a route at `path`.
fn check_mirrors(errors: &mut Errors, path: &str, route: &HttpRoute) {
    if let Some(v) = route.mirror_percent.filter(|v| *v > 100) {
        errors.add(format!("{path}.mirrorPercent"), invalid(v, "mirror_percent must have a max value of 100"));
    }
    check_percent_range(errors, format!("{path}.mirrorPercentage.value"), route.mirror_percentage.map(|p| p.value));
    if let Some(mirror) = &route.mirror {
        check_destination(errors, &format!("{path}.mirror"), mirror);
    }
    for (i, mirror) in route.mirrors.iter().enumerate() {
        let field = format!("{path}.mirrors[{i}]");
        match &mirror.destination {
            None => errors.add(format!("{field}.destination"), required("destination is required for mirrors")),
            Some(d) => check_destination(errors, &format!("{field}.destination"), d),
        }
        check_percent_range(errors, format!("{field}.percentage.value"), mirror.percentage.map(|p| p.value));
    }
}

/// Checks a redirect at `path` (`...redirect`).
fn check_redirect(errors: &mut Errors, path: &str, redirect: &HttpRedirect) {
    let nothing = redirect.uri.is_empty()
        && redirect.authority.is_empty()
        && redirect.scheme.is_empty()
        && redirect.port.is_none()
        && redirect.derive_port.is_none();
    if nothing {
        errors.add(path, required("redirect must specify URI, authority, scheme, or port"));
    }
    if let Some(code) = redirect.redirect_code.filter(|c| *c != 0 && !REDIRECT_CODES.contains(c)) {
        errors
            .add(format!("{path}.redirectCode"), invalid(code, "redirect code must be one of 301, 302, 303, 307, 308"));
    }
    if !matches!(redirect.scheme.as_str(), "" | "http" | "https") {
        errors.add(
            format!("{path}.scheme"),
            invalid(&redirect.scheme, "invalid redirect scheme, must be \"http\" or \"https\""),
        );
    }
    for (name, value) in [("uri", &redirect.uri), ("authority", &redirect.authority)] {
        if value.chars().any(|c| c.is_ascii_control() || c == ' ') {
            errors.add(format!("{path}.{name}"), invalid(value, "must not contain spaces or control characters"));
        }
    }
    if redirect.port.is_some() && redirect.derive_port.is_some() {
        errors.add(path, forbidden("only one of port or derivePort can be set"));
    }
    if let Some(port) = redirect.port.filter(|p| *p != 0) {
        errors.check(format!("{path}.port"), check_port(port));
    }
    if let Some(derive) = &redirect.derive_port {
        const DERIVE: [&str; 2] = ["FROM_PROTOCOL_DEFAULT", "FROM_REQUEST_PORT"];
        if !DERIVE.contains(&derive.as_str()) {
            errors.add(format!("{path}.derivePort"), unsupported(derive, &DERIVE));
        }
    }
}

/// Checks a direct response at `path` (`...directResponse`).
fn check_direct_response(errors: &mut Errors, path: &str, response: &HttpDirectResponse) {
    let status = i32::try_from(response.status).unwrap_or(i32::MAX);
    errors.check(format!("{path}.status"), check_http_status(status));
    let Some(body) = &response.body else { return };
    if body.string.is_some() && body.bytes.is_some() {
        errors.add(format!("{path}.body"), forbidden("only one of string or bytes can be set"));
    }
    // `bytes` is base64: three bytes per four characters.
    let size = body.string.as_ref().map_or(0, String::len).max(body.bytes.as_ref().map_or(0, |b| b.len() / 4 * 3));
    if size > MAX_DIRECT_RESPONSE_BYTES {
        errors.add(
            format!("{path}.body"),
            invalid(size, "large direct_responses may impact control plane performance, must be less than 1MB"),
        );
    }
}

/// Checks a retry policy at `path` (`...retries`).
fn check_retries(errors: &mut Errors, path: &str, retries: &HttpRetry) {
    if retries.attempts < 0 {
        errors.add(format!("{path}.attempts"), invalid(retries.attempts, "attempts cannot be negative"));
    }
    let configured =
        retries.per_try_timeout.is_some() || !retries.retry_on.is_empty() || retries.retry_remote_localities.is_some();
    if retries.attempts == 0 && configured {
        errors.add(path, invalid(0, "http retry policy configured when attempts are set to 0 (disabled)"));
    }
    errors.check(format!("{path}.perTryTimeout"), check_optional(retries.per_try_timeout));
    errors.check(format!("{path}.backoff"), check_optional(retries.backoff));
    if !retries.retry_on.is_empty() {
        for policy in retries.retry_on.split(',') {
            let is_status = policy.parse::<u16>().is_ok_and(|code| KNOWN_STATUS_CODES.contains(&code));
            if !is_status && !RETRY_ON_POLICIES.contains(&policy) {
                errors.add(format!("{path}.retryOn"), invalid(policy, "not a valid retryOn policy"));
            }
        }
    }
}

/// Checks a rewrite at `path` (`...rewrite`).
fn check_rewrite(errors: &mut Errors, path: &str, rewrite: &HttpRewrite) {
    if !rewrite.uri.is_empty() && rewrite.uri_regex_rewrite.is_some() {
        errors.add(path, forbidden("rewrite may only contain one of URI or UriRegexRewrite"));
    }
    if rewrite.uri.is_empty() && rewrite.uri_regex_rewrite.is_none() && rewrite.authority.is_empty() {
        errors.add(path, required("rewrite must specify at least one of URI, UriRegexRewrite, or authority"));
    }
    if let Some(regex) = &rewrite.uri_regex_rewrite {
        let field = format!("{path}.uriRegexRewrite");
        if regex.pattern.is_empty() || regex.rewrite.is_empty() {
            errors.add(field, required("UriRegexRewrite requires both Rewrite and Match fields to be specified"));
        } else {
            errors.check(format!("{field}.match"), check_regex(&regex.pattern));
        }
    }
    errors.check(format!("{path}.authority"), check_header_value(&rewrite.authority));
}

/// Checks the weighted destinations of a route at `path` (`...route`).
fn check_route_destinations(errors: &mut Errors, path: &str, destinations: &[HttpRouteDestination]) {
    for (k, d) in destinations.iter().enumerate() {
        let field = format!("{path}[{k}]");
        match &d.destination {
            None => errors.add(format!("{field}.destination"), required("destination is required")),
            Some(dest) => check_destination(errors, &format!("{field}.destination"), dest),
        }
        if let Some(headers) = &d.headers {
            check_header_operations(errors, &format!("{field}.headers"), headers);
        }
    }
    let weights: Vec<Option<i32>> = destinations.iter().map(|d| d.weight).collect();
    check_weights(errors, path, &weights);
}

#[cfg(test)]
mod tests {
    use crate::config::validation::testing::{assert_error, assert_valid};

    const VS: &str = "VirtualService";

    /// A VirtualService for host `a` with one HTTP route whose body is `route` (YAML at route level).
    fn with_route(route: &str) -> String {
        let route: String = route.lines().map(|l| format!("    {l}\n")).collect();
        format!("hosts: [a]\nhttp:\n  - name: r\n{route}")
    }

    fn err(route: &str, field: &str, reason: &str) {
        assert_error(VS, &with_route(route), field, reason);
    }

    fn ok(route: &str) {
        assert_valid(VS, &with_route(route));
    }

    #[test]
    fn a_full_route_is_valid() {
        ok(r#"match:
  - uri: {prefix: /api}
    method: {exact: GET}
    headers: {x-user: {regex: "u[0-9]+"}}
    queryParams: {q: {exact: "1"}}
    withoutHeaders: {x-skip: {regex: "*"}}
    port: 8080
    sourceLabels: {app: web}
    sourceNamespace: front
route:
  - destination: {host: a, subset: v1, port: {number: 9080}}
    weight: 90
    headers: {request: {set: {x-a: "1"}}}
  - destination: {host: b.ns.svc.cluster.local}
    weight: 10
timeout: 5s
retries: {attempts: 3, perTryTimeout: 2s, retryOn: "5xx,connect-failure,503"}
fault: {delay: {fixedDelay: 1s, percentage: {value: 0.5}}, abort: {httpStatus: 503, percentage: {value: 1}}}
mirror: {host: shadow}
mirrorPercentage: {value: 10}
corsPolicy: {allowOrigins: [{exact: "https://x.com"}], allowMethods: [GET], allowHeaders: ["*"], maxAge: 24h}
headers: {request: {add: {x-b: "%HOSTNAME%"}, remove: [x-c]}, response: {set: {x-d: v}}}
rewrite: {uri: /v2}"#);
    }

    #[test]
    fn a_route_needs_an_action() {
        err("match: [{uri: {prefix: /}}]", "spec.http[0].route", "HTTP route, redirect or direct_response is required");
    }

    #[test]
    fn redirect_excludes_route_fault_rewrite_and_direct_response() {
        let redirect = "redirect: {uri: /x}\n";
        err(
            &format!("{redirect}route: [{{destination: {{host: a}}}}]"),
            "spec.http[0].route",
            "both route and redirect",
        );
        err(
            &format!("{redirect}fault: {{abort: {{httpStatus: 500}}}}"),
            "spec.http[0].fault",
            "both fault and redirect",
        );
        err(&format!("{redirect}rewrite: {{uri: /y}}"), "spec.http[0].rewrite", "both rewrite and redirect");
        err(
            &format!("{redirect}directResponse: {{status: 200}}"),
            "spec.http[0].directResponse",
            "direct_response and redirect",
        );
    }

    #[test]
    fn direct_response_excludes_route_fault_and_rewrite() {
        let direct = "directResponse: {status: 404}\n";
        ok(direct);
        err(
            &format!("{direct}route: [{{destination: {{host: a}}}}]"),
            "spec.http[0].route",
            "both route and direct_response",
        );
        err(
            &format!("{direct}fault: {{abort: {{httpStatus: 500}}}}"),
            "spec.http[0].fault",
            "both fault and direct_response",
        );
        err(&format!("{direct}rewrite: {{uri: /y}}"), "spec.http[0].rewrite", "both rewrite and direct_response");
        err("directResponse: {status: 99}", "spec.http[0].directResponse.status", "not in range 200-599");
        err(
            "directResponse: {status: 200, body: {string: a, bytes: YQ==}}",
            "spec.http[0].directResponse.body",
            "only one of string or bytes",
        );
        let big = "a".repeat(1024 * 1024 + 1);
        err(
            &format!("directResponse: {{status: 200, body: {{string: {big}}}}}"),
            "spec.http[0].directResponse.body",
            "less than 1MB",
        );
    }

    #[test]
    fn delegating_routes_cannot_also_forward() {
        ok("delegate: {name: d, namespace: ns}");
        err("delegate: {name: d}\nroute: [{destination: {host: a}}]", "spec.http[0].route", "must not specify route");
        err("delegate: {name: d}\nredirect: {uri: /x}", "spec.http[0].redirect", "must not specify redirect");
        // The delegate's rules inherit it when they set none, as istiod merges them.
        ok("delegate: {name: d}\ndirectResponse: {status: 200}");
    }

    #[test]
    fn mirrors_need_a_route_and_cannot_be_doubled() {
        err(
            "route: [{destination: {host: a}}]\nmirror: {host: m1}\nmirrors: [{destination: {host: m2}}]",
            "spec.http[0].mirrors",
            "both mirror and mirrors",
        );
        err("redirect: {uri: /x}\nmirror: {host: m}", "spec.http[0].mirror", "mirroring needs a route");
        let route = "route: [{destination: {host: a}}]\n";
        err(&format!("{route}mirror: {{host: \"*\"}}"), "spec.http[0].mirror.host", "invalid destination host *");
        err(
            &format!("{route}mirrors: [{{percentage: {{value: 5}}}}]"),
            "spec.http[0].mirrors[0].destination",
            "Required value",
        );
        err(
            &format!("{route}mirrors: [{{destination: {{host: m}}, percentage: {{value: 101}}}}]"),
            "spec.http[0].mirrors[0].percentage.value",
            "must be between 0 and 100",
        );
        err(
            &format!("{route}mirrorPercentage: {{value: -1}}"),
            "spec.http[0].mirrorPercentage.value",
            "between 0 and 100",
        );
        err(&format!("{route}mirrorPercent: 101"), "spec.http[0].mirrorPercent", "max value of 100");
    }

    #[test]
    fn destinations_are_required_and_checked() {
        err("route: [{weight: 100}]", "spec.http[0].route[0].destination", "Required value");
        err("route: [{destination: {subset: v1}}]", "spec.http[0].route[0].destination.host", "Required value");
        err(
            "route: [{destination: {host: a, subset: V_1}}]",
            "spec.http[0].route[0].destination.subset",
            "subset name is invalid",
        );
        err(
            "route: [{destination: {host: a, port: {number: 70000}}}]",
            "spec.http[0].route[0].destination.port.number",
            "port must be between 1-65535",
        );
        err(
            "route: [{destination: {host: a}, weight: -5}, {destination: {host: b}, weight: 10}]",
            "spec.http[0].route[0].weight",
            "weight must not be negative",
        );
        err(
            "route: [{destination: {host: a}, weight: 0}, {destination: {host: b}}]",
            "spec.http[0].route",
            "total destination weight = 0",
        );
        ok("route: [{destination: {host: a}, weight: 30}, {destination: {host: b}, weight: 30}]");
    }

    #[test]
    fn string_matches_are_checked_per_field() {
        let route = "route: [{destination: {host: a}}]\n";
        ok(&format!("{route}match: [{{uri: {{prefix: \"\"}}}}]"));
        err(&format!("{route}match: [{{uri: {{regex: \"(\"}}}}]"), "spec.http[0].match[0].uri.regex", "RE2");
        err(
            &format!("{route}match: [{{uri: {{regex: \"\"}}}}]"),
            "spec.http[0].match[0].uri.regex",
            "should not be empty",
        );
        err(
            &format!("{route}match: [{{scheme: {{prefix: \"\"}}}}]"),
            "spec.http[0].match[0].scheme.prefix",
            "prefix string match",
        );
        err(&format!("{route}match: [{{method: {{regex: \"a(?!b)\"}}}}]"), "spec.http[0].match[0].method.regex", "RE2");
        err(
            &format!("{route}match: [{{authority: {{prefix: \"\"}}}}]"),
            "spec.http[0].match[0].authority.prefix",
            "should not be empty",
        );
        err(
            &format!("{route}match: [{{queryParams: {{q: {{regex: \"[\"}}}}}}]"),
            "spec.http[0].match[0].queryParams[q].regex",
            "RE2",
        );
        err(
            &format!("{route}match: [{{headers: {{x-a: {{prefix: \"\"}}}}}}]"),
            "spec.http[0].match[0].headers[x-a].prefix",
            "should not be empty",
        );
        err(
            &format!("{route}match: [{{withoutHeaders: {{x-a: {{regex: \"(\"}}}}}}]"),
            "spec.http[0].match[0].withoutHeaders[x-a].regex",
            "RE2",
        );
    }

    #[test]
    fn every_regex_field_is_held_to_envoys_program_size() {
        // [a-z]{500}: valid RE2, 504 instructions; Envoy refuses any regex above 100.
        let big = "[a-z]{500}";
        let route = "route: [{destination: {host: a}}]\n";
        for (spec, field) in [
            (format!("{route}match: [{{uri: {{regex: \"{big}\"}}}}]"), "spec.http[0].match[0].uri.regex"),
            (format!("{route}match: [{{scheme: {{regex: \"{big}\"}}}}]"), "spec.http[0].match[0].scheme.regex"),
            (format!("{route}match: [{{method: {{regex: \"{big}\"}}}}]"), "spec.http[0].match[0].method.regex"),
            (format!("{route}match: [{{authority: {{regex: \"{big}\"}}}}]"), "spec.http[0].match[0].authority.regex"),
            (
                format!("{route}match: [{{headers: {{x-a: {{regex: \"{big}\"}}}}}}]"),
                "spec.http[0].match[0].headers[x-a].regex",
            ),
            (
                format!("{route}match: [{{withoutHeaders: {{x-a: {{regex: \"{big}\"}}}}}}]"),
                "spec.http[0].match[0].withoutHeaders[x-a].regex",
            ),
            (
                format!("{route}match: [{{queryParams: {{q: {{regex: \"{big}\"}}}}}}]"),
                "spec.http[0].match[0].queryParams[q].regex",
            ),
            (
                format!("{route}corsPolicy: {{allowOrigins: [{{regex: \"{big}\"}}]}}"),
                "spec.http[0].corsPolicy.allowOrigins[0].regex",
            ),
            (
                format!("{route}rewrite: {{uriRegexRewrite: {{match: \"{big}\", rewrite: /x}}}}"),
                "spec.http[0].rewrite.uriRegexRewrite.match",
            ),
        ] {
            err(&spec, field, "RE2 program size is 504, above Envoy's limit of 100");
        }
        // At the limit: accepted.
        ok(&format!("{route}match: [{{uri: {{regex: \"x{{96}}\"}}}}]"));
    }

    #[test]
    fn match_headers_ports_labels_and_namespaces_are_checked() {
        let route = "route: [{destination: {host: a}}]\n";
        err(
            &format!("{route}match: [{{headers: {{\"x y\": {{exact: a}}}}}}]"),
            "spec.http[0].match[0].headers[x y]",
            "not a valid header name",
        );
        err(
            &format!("{route}match: [{{headers: {{\"@request.auth.claims.sub\": {{exact: a}}}}}}]"),
            "spec.http[0].match[0].headers[@request.auth.claims.sub]",
            "only supported for gateway",
        );
        err(&format!("{route}match: [{{port: 70000}}]"), "spec.http[0].match[0].port", "port must be between 1-65535");
        err(
            &format!("{route}match: [{{sourceLabels: {{\"a b\": c}}}}]"),
            "spec.http[0].match[0].sourceLabels[a b]",
            "label key",
        );
        err(
            &format!("{route}match: [{{sourceNamespace: Bad_NS}}]"),
            "spec.http[0].match[0].sourceNamespace",
            "is invalid",
        );
        err(
            &format!("{route}match: [{{gateways: [gw]}}]"),
            "spec.http[0].match[0].gateways[0]",
            "not one of the virtual service's gateways",
        );
    }

    #[test]
    fn header_operations_are_checked() {
        let route = "route: [{destination: {host: a}}]\n";
        err(
            &format!("{route}headers: {{request: {{set: {{\":path\": x}}}}}}"),
            "spec.http[0].headers.request.set[:path]",
            "\":\" prefix",
        );
        err(
            &format!("{route}headers: {{request: {{remove: [host]}}}}"),
            "spec.http[0].headers.request.remove[0]",
            "cannot set Host header",
        );
        err(
            &format!("{route}headers: {{response: {{add: {{x-a: \"50%\"}}}}}}"),
            "spec.http[0].headers.response.add[x-a]",
            "un-escaped %",
        );
        err(
            "route: [{destination: {host: a}, headers: {request: {set: {\"\": x}}}}]",
            "spec.http[0].route[0].headers.request.set[]",
            "header name cannot be empty",
        );
        err(
            &format!("{route}rewrite: {{authority: b}}\nheaders: {{request: {{set: {{\":authority\": c}}}}}}"),
            "spec.http[0].headers.request",
            "authority header cannot be set multiple times",
        );
    }

    #[test]
    fn cors_is_checked() {
        let route = "route: [{destination: {host: a}}]\n";
        let cors = |c: &str| format!("{route}corsPolicy: {c}");
        err(
            &cors("{allowOrigins: [{exact: \"\"}]}"),
            "spec.http[0].corsPolicy.allowOrigins[0]",
            "not a valid match type for CORS",
        );
        err(&cors("{allowOrigins: [{regex: \"(\"}]}"), "spec.http[0].corsPolicy.allowOrigins[0].regex", "RE2");
        err(&cors("{allowMethods: [FETCH]}"), "spec.http[0].corsPolicy.allowMethods[0]", "Unsupported value");
        err(&cors("{allowHeaders: [\"a b\"]}"), "spec.http[0].corsPolicy.allowHeaders[0]", "not a valid header name");
        err(&cors("{exposeHeaders: [\"\"]}"), "spec.http[0].corsPolicy.exposeHeaders[0]", "cannot be empty");
        err(&cors("{maxAge: 500us}"), "spec.http[0].corsPolicy.maxAge", "greater than 1ms");
        err(&cors("{maxAge: 1500ms}"), "spec.http[0].corsPolicy.maxAge", "seconds precision");
        err(&cors("{unmatchedPreflights: DROP}"), "spec.http[0].corsPolicy.unmatchedPreflights", "Unsupported value");
    }

    #[test]
    fn faults_are_checked() {
        let route = "route: [{destination: {host: a}}]\n";
        let fault = |f: &str| format!("{route}fault: {f}");
        err(&fault("{}"), "spec.http[0].fault", "must have an abort and/or a delay");
        err(&fault("{abort: {httpStatus: 700}}"), "spec.http[0].fault.abort.httpStatus", "not in range 200-599");
        err(&fault("{abort: {grpcStatus: NOPE}}"), "spec.http[0].fault.abort.grpcStatus", "Unsupported value");
        err(&fault("{abort: {http2Error: x}}"), "spec.http[0].fault.abort.http2Error", "not supported yet");
        err(&fault("{abort: {httpStatus: 500, grpcStatus: INTERNAL}}"), "spec.http[0].fault.abort", "only one of");
        err(
            &fault("{abort: {httpStatus: 500, percentage: {value: 101}}}"),
            "spec.http[0].fault.abort.percentage.value",
            "[0.0001, 100.0]",
        );
        err(
            &fault("{delay: {percentage: {value: 0.00001}, fixedDelay: 1s}}"),
            "spec.http[0].fault.delay.percentage.value",
            "neither 0.0",
        );
        err(&fault("{delay: {percentage: {value: 50}}}"), "spec.http[0].fault.delay.fixedDelay", "Required value");
        err(&fault("{delay: {fixedDelay: 0s}}"), "spec.http[0].fault.delay.fixedDelay", "greater than 1ms");
        err(
            &fault("{delay: {exponentialDelay: 1s}}"),
            "spec.http[0].fault.delay.exponentialDelay",
            "not supported yet",
        );
        err(&fault("{delay: {fixedDelay: 1s, percent: 150}}"), "spec.http[0].fault.delay.percent", "between 0 and 100");
        ok(&fault("{abort: {grpcStatus: UNAVAILABLE}}"));
    }

    #[test]
    fn redirects_are_checked() {
        err("redirect: {}", "spec.http[0].redirect", "must specify URI, authority, scheme, or port");
        err("redirect: {uri: /x, redirectCode: 300}", "spec.http[0].redirect.redirectCode", "301, 302, 303, 307, 308");
        err("redirect: {scheme: ftp}", "spec.http[0].redirect.scheme", "invalid redirect scheme");
        err("redirect: {uri: \"/a b\"}", "spec.http[0].redirect.uri", "spaces or control characters");
        err("redirect: {port: 70000}", "spec.http[0].redirect.port", "port must be between 1-65535");
        err(
            "redirect: {port: 8080, derivePort: FROM_REQUEST_PORT}",
            "spec.http[0].redirect",
            "only one of port or derivePort",
        );
        err("redirect: {derivePort: FROM_NOWHERE}", "spec.http[0].redirect.derivePort", "Unsupported value");
        ok("redirect: {authority: b.com, redirectCode: 308, scheme: https, port: 8443}");
    }

    #[test]
    fn retries_are_checked() {
        let route = "route: [{destination: {host: a}}]\n";
        let retries = |r: &str| format!("{route}retries: {r}");
        err(&retries("{attempts: -1}"), "spec.http[0].retries.attempts", "attempts cannot be negative");
        err(&retries("{attempts: 0, retryOn: 5xx}"), "spec.http[0].retries", "attempts are set to 0");
        err(&retries("{attempts: 2, perTryTimeout: 0s}"), "spec.http[0].retries.perTryTimeout", "greater than 1ms");
        err(
            &retries("{attempts: 2, retryOn: \"5xx,sometimes\"}"),
            "spec.http[0].retries.retryOn",
            "not a valid retryOn policy",
        );
        err(&retries("{attempts: 2, retryOn: \"999\"}"), "spec.http[0].retries.retryOn", "not a valid retryOn policy");
        err(&retries("{attempts: 2, backoff: 0s}"), "spec.http[0].retries.backoff", "greater than 1ms");
        ok(&retries("{attempts: 2, retryOn: \"gateway-error,429,unavailable\"}"));
    }

    #[test]
    fn rewrites_are_checked() {
        let route = "route: [{destination: {host: a}}]\n";
        let rewrite = |r: &str| format!("{route}rewrite: {r}");
        err(&rewrite("{}"), "spec.http[0].rewrite", "must specify at least one of URI, UriRegexRewrite, or authority");
        err(
            &rewrite("{uri: /a, uriRegexRewrite: {match: a, rewrite: b}}"),
            "spec.http[0].rewrite",
            "only contain one of URI",
        );
        err(
            &rewrite("{uriRegexRewrite: {match: a}}"),
            "spec.http[0].rewrite.uriRegexRewrite",
            "both Rewrite and Match",
        );
        err(
            &rewrite("{uriRegexRewrite: {match: \"(\", rewrite: b}}"),
            "spec.http[0].rewrite.uriRegexRewrite.match",
            "RE2",
        );
        err(&rewrite("{authority: \"50%\"}"), "spec.http[0].rewrite.authority", "un-escaped %");
        ok(&rewrite("{uriRegexRewrite: {match: \"^/v1/(.*)\", rewrite: \"/v2/\\\\1\"}}"));
    }

    #[test]
    fn timeouts_are_at_least_1ms() {
        err("route: [{destination: {host: a}}]\ntimeout: 0s", "spec.http[0].timeout", "greater than 1ms");
    }
}
