//! VirtualService `HTTPMatchRequest` → Envoy `RouteMatch`, and which matches apply to a proxy.

use envoy_types::pb::envoy::config::route::v3::{
    header_matcher::HeaderMatchSpecifier, query_parameter_matcher::QueryParameterMatchSpecifier,
    route_match::PathSpecifier, HeaderMatcher, QueryParameterMatcher, RouteMatch,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{string_matcher::MatchPattern, RegexMatcher, StringMatcher};

use super::proto::bool_value;
use crate::config::api::virtual_service::HttpMatchRequest;
use crate::config::api::{Labels, StringMatch};
use crate::snapshot::qualify_gateway;

/// Who the routes are built for: the listener port and the gateway (`mesh` for sidecars).
#[derive(Debug, Clone, Copy)]
pub(super) struct RouteContext<'a> {
    /// Port of the listener the route config serves.
    pub listen_port: u16,
    /// `mesh`, or the gateway as `namespace/name`.
    pub gateway: &'a str,
    /// The server terminates TLS (redirects default to https).
    pub tls: bool,
    /// Labels of the proxy's workload.
    pub labels: &'a Labels,
    /// Namespace of the proxy.
    pub namespace: &'a str,
}

/// Whether a match condition can apply to this proxy and port (port, gateways, source labels and
/// namespace), as Istio trims routes per proxy.
pub(super) fn applies(m: &HttpMatchRequest, ctx: &RouteContext<'_>, vs_ns: &str) -> bool {
    if m.port.is_some_and(|p| p != 0 && p != u32::from(ctx.listen_port)) {
        return false;
    }
    source_applies(&m.gateways, &m.source_labels, &m.source_namespace, ctx, vs_ns)
}

/// The source conditions shared by HTTP, TLS and TCP matches: listed gateways, or else the
/// client's labels and namespace.
pub(super) fn source_applies(
    gateways: &[String],
    source_labels: &Labels,
    source_namespace: &str,
    ctx: &RouteContext<'_>,
    vs_ns: &str,
) -> bool {
    if !gateways.is_empty() {
        return gateways.iter().any(|g| qualify_gateway(g, vs_ns) == ctx.gateway);
    }
    let labels_match = source_labels.iter().all(|(k, v)| ctx.labels.get(k) == Some(v));
    labels_match && (source_namespace.is_empty() || source_namespace == ctx.namespace)
}

/// The Envoy match for one condition; no condition matches every path.
pub(super) fn route_match(m: Option<&HttpMatchRequest>) -> RouteMatch {
    let mut out = RouteMatch { path_specifier: Some(PathSpecifier::Prefix("/".into())), ..Default::default() };
    let Some(m) = m else { return out };
    let mut headers: Vec<HeaderMatcher> = m.headers.iter().map(|(name, sm)| header_matcher(name, sm)).collect();
    for (name, sm) in &m.without_headers {
        let mut matcher = header_matcher(name, sm);
        matcher.invert_match = true;
        // Envoy forbids treat_missing_header_as_empty together with present_match.
        matcher.treat_missing_header_as_empty = !is_present_match(sm);
        headers.push(matcher);
    }
    headers.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(uri) = &m.uri {
        out.path_specifier = Some(match uri {
            StringMatch::Exact(p) => PathSpecifier::Path(p.clone()),
            StringMatch::Prefix(p) => PathSpecifier::Prefix(p.clone()),
            StringMatch::Regex(r) => PathSpecifier::SafeRegex(regex(r)),
        });
    }
    out.case_sensitive = Some(bool_value(!m.ignore_uri_case));
    let pseudo = [(":method", &m.method), (":authority", &m.authority), (":scheme", &m.scheme)];
    headers.extend(pseudo.into_iter().filter_map(|(name, sm)| sm.as_ref().map(|sm| header_matcher(name, sm))));
    out.headers = headers;
    out.query_parameters = m.query_params.iter().map(|(name, sm)| query_matcher(name, sm)).collect();
    out
}

/// Whether an Envoy route matches every request (only `/` prefix, no header or query condition).
pub(super) fn is_catch_all(m: &RouteMatch) -> bool {
    let path_all = match &m.path_specifier {
        Some(PathSpecifier::Prefix(p)) => p == "/",
        Some(PathSpecifier::SafeRegex(r)) => r.regex == ".*",
        _ => false,
    };
    path_all && m.headers.is_empty() && m.query_parameters.is_empty()
}

/// Istio's StringMatch → Envoy StringMatcher.
pub(super) fn string_matcher(sm: &StringMatch) -> StringMatcher {
    let pattern = match sm {
        StringMatch::Exact(v) => MatchPattern::Exact(v.clone()),
        StringMatch::Prefix(v) => MatchPattern::Prefix(v.clone()),
        StringMatch::Regex(v) => MatchPattern::SafeRegex(regex(v)),
    };
    StringMatcher { match_pattern: Some(pattern), ..Default::default() }
}

/// An RE2 regex matcher; Envoy's default engine is RE2, so the engine stays unset.
pub(super) fn regex(pattern: &str) -> RegexMatcher {
    RegexMatcher { regex: pattern.to_string(), engine_type: None }
}

/// Istio reads regex `*` (not valid RE2) as "present".
fn is_present_match(sm: &StringMatch) -> bool {
    matches!(sm, StringMatch::Regex(r) if r == "*")
}

fn header_matcher(name: &str, sm: &StringMatch) -> HeaderMatcher {
    let specifier = if is_present_match(sm) {
        HeaderMatchSpecifier::PresentMatch(true)
    } else {
        HeaderMatchSpecifier::StringMatch(string_matcher(sm))
    };
    HeaderMatcher { name: name.to_string(), header_match_specifier: Some(specifier), ..Default::default() }
}

fn query_matcher(name: &str, sm: &StringMatch) -> QueryParameterMatcher {
    let specifier = if is_present_match(sm) {
        QueryParameterMatchSpecifier::PresentMatch(true)
    } else {
        QueryParameterMatchSpecifier::StringMatch(string_matcher(sm))
    };
    QueryParameterMatcher { name: name.to_string(), query_parameter_match_specifier: Some(specifier) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(yaml: &str) -> HttpMatchRequest {
        let value: serde_json::Value = serde_saphyr::from_str(yaml).expect("yaml");
        serde_json::from_value(value).expect("match request")
    }

    #[test]
    fn star_regex_means_present_and_pseudo_headers_follow_sorted_headers() {
        let m = matcher(
            "{headers: {b: {regex: '*'}, a: {exact: x}}, method: {exact: GET}, withoutHeaders: {c: {regex: '*'}}}",
        );
        let out = route_match(Some(&m));
        let names: Vec<&str> = out.headers.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", ":method"]);
        assert_eq!(out.headers[1].header_match_specifier, Some(HeaderMatchSpecifier::PresentMatch(true)));
        assert!(out.headers[2].invert_match && !out.headers[2].treat_missing_header_as_empty);
        assert!(!is_catch_all(&out));
    }

    #[test]
    fn no_condition_is_a_catch_all() {
        let out = route_match(None);
        assert_eq!(out.path_specifier, Some(PathSpecifier::Prefix("/".into())));
        assert!(is_catch_all(&out));
    }

    #[test]
    fn gateways_in_a_match_replace_source_conditions() {
        let labels = Labels::from([("app".to_string(), "web".to_string())]);
        let ctx = RouteContext { listen_port: 80, gateway: "edge/gw", tls: false, labels: &labels, namespace: "shop" };
        assert!(applies(&matcher("{gateways: [gw], sourceLabels: {app: other}}"), &ctx, "edge"));
        assert!(!applies(&matcher("{gateways: [mesh]}"), &ctx, "edge"));
        assert!(!applies(&matcher("{port: 8080}"), &ctx, "edge"));
        assert!(applies(&matcher("{sourceLabels: {app: web}, sourceNamespace: shop}"), &ctx, "edge"));
        assert!(!applies(&matcher("{sourceNamespace: other}"), &ctx, "edge"));
    }
}
