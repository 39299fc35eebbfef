//! VirtualService HTTP rules → Envoy routes (shared by sidecars and gateways).

use envoy_types::pb::envoy::config::route::v3::{
    route, route_action::ClusterSpecifier, route_action::HostRewriteSpecifier, route_match::PathSpecifier,
    weighted_cluster, Decorator, Route, RouteAction, WeightedCluster,
};

use super::destination::{hash_policy, resolve};
use super::http_action::{direct_response, forward_action, redirect, retry_policy, set_cluster, set_timeout};
use super::http_match::{applies, is_catch_all, route_match, RouteContext};
use super::http_policy::{cors, fault, header_ops, HeaderOps};
use super::names::{cluster_name, ext, trace_operation, DEFAULT_ROUTE};
use super::proto::{any, map_field, u32_value};
use super::scope::{Scope, VsRef};
use crate::config::api::virtual_service::{HttpMatchRequest, HttpRoute, HttpRouteDestination};
use crate::registry::Service;

/// The routes of one VirtualService for a listener, in rule order. Matches that cannot apply to the
/// proxy are dropped, and nothing after a catch-all route is kept (it could never match).
pub(super) fn virtual_service_routes(scope: &Scope<'_>, (ix, vs): VsRef<'_>, ctx: &RouteContext<'_>) -> Vec<Route> {
    let (vs_ns, vs_name) = (ix.config.key.namespace.as_str(), ix.config.key.name.as_str());
    let mut out = Vec::new();
    for rule in vs.http.iter().filter(|r| r.delegate.is_none()) {
        if rule.matches.is_empty() {
            out.extend(translate(scope, rule, None, ctx, (vs_ns, vs_name)));
            break;
        }
        let mut caught = false;
        for m in rule.matches.iter().filter(|m| applies(m, ctx, vs_ns)) {
            if let Some(r) = translate(scope, rule, Some(m), ctx, (vs_ns, vs_name)) {
                caught = r.r#match.as_ref().is_some_and(is_catch_all);
                out.push(r);
                if caught {
                    break;
                }
            }
        }
        if caught {
            break;
        }
    }
    out
}

/// The route a service gets without VirtualService: everything to its cluster, Istio's default
/// retries, no timeout, and the DestinationRule's hash policy.
pub(super) fn default_route(scope: &Scope<'_>, service: &Service, port: u16) -> Route {
    let hash = hash_policy(scope, service, "", port);
    let mut action = RouteAction::default();
    set_timeout(&mut action, None);
    set_cluster(&mut action, cluster_name(port, "", service.hostname.as_str()));
    action.retry_policy = retry_policy(None, hash.is_some());
    action.hash_policy = hash.into_iter().collect();
    Route {
        name: DEFAULT_ROUTE.to_string(),
        r#match: Some(route_match(None)),
        action: Some(route::Action::Route(action)),
        decorator: Some(Decorator {
            operation: trace_operation(service.hostname.as_str(), port),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn translate(
    scope: &Scope<'_>,
    rule: &HttpRoute,
    m: Option<&HttpMatchRequest>,
    ctx: &RouteContext<'_>,
    (vs_ns, vs_name): (&str, &str),
) -> Option<Route> {
    let mut name = rule.name.clone();
    if let Some(match_name) = m.map(|m| m.name.as_str()).filter(|n| !n.is_empty()) {
        name = format!("{name}.{match_name}");
    }
    let mut out = Route { name, r#match: Some(route_match(m)), ..Default::default() };
    let ops = rule.headers.as_ref().map(header_ops).unwrap_or_default();
    let authority = ops.authority.clone();
    add_headers(&mut out, ops);
    let action = if let Some(r) = &rule.redirect {
        route::Action::Redirect(redirect(r, ctx)?)
    } else if let Some(d) = &rule.direct_response {
        route::Action::DirectResponse(direct_response(d))
    } else {
        route::Action::Route(forward(scope, rule, ctx, vs_ns, authority, &mut out)?)
    };
    out.action = Some(action);
    out.decorator =
        Some(Decorator { operation: route_operation(&out, vs_name, ctx.listen_port), ..Default::default() });
    // Inserted in name order so equal routes encode identically (see `map_field`).
    let cors = rule.cors_policy.as_ref().map(|c| (ext::CORS.to_string(), any(cors(c))));
    let fault = rule.fault.as_ref().and_then(fault).map(|f| (ext::FAULT.to_string(), any(f)));
    out.typed_per_filter_config = map_field(cors.into_iter().chain(fault));
    Some(out)
}

/// istiod's trace operation of a VirtualService route: `HOST:PORT` of its one destination cluster
/// (else `VIRTUAL_SERVICE:LISTEN_PORT`), followed by the path it matches.
fn route_operation(route: &Route, vs_name: &str, listen_port: u16) -> String {
    let path = match route.r#match.as_ref().and_then(|m| m.path_specifier.as_ref()) {
        Some(PathSpecifier::Prefix(p)) => format!("{p}*"),
        Some(PathSpecifier::Path(p)) => p.clone(),
        Some(PathSpecifier::SafeRegex(r)) => r.regex.clone(),
        _ => "/*".to_string(),
    };
    let cluster = match &route.action {
        Some(route::Action::Route(RouteAction { cluster_specifier: Some(ClusterSpecifier::Cluster(c)), .. })) => {
            Some(c)
        }
        _ => None,
    };
    // A subset key: `DIRECTION|PORT|SUBSET|HOST`.
    let host_port = cluster.and_then(|c| match c.split('|').collect::<Vec<_>>()[..] {
        [_, port, _, host] => Some(format!("{host}:{port}")),
        _ => None,
    });
    format!("{}{path}", host_port.unwrap_or_else(|| format!("{vs_name}:{listen_port}")))
}

fn add_headers(route: &mut Route, ops: HeaderOps) {
    route.request_headers_to_add.extend(ops.request_add);
    route.request_headers_to_remove.extend(ops.request_remove);
    route.response_headers_to_add.extend(ops.response_add);
    route.response_headers_to_remove.extend(ops.response_remove);
}

/// Forwarding to the rule's destinations: one cluster, or weighted clusters (zero weights dropped).
fn forward(
    scope: &Scope<'_>,
    rule: &HttpRoute,
    ctx: &RouteContext<'_>,
    vs_ns: &str,
    authority: Option<String>,
    route: &mut Route,
) -> Option<RouteAction> {
    let dests: Vec<&HttpRouteDestination> = rule.route.iter().filter(|d| d.destination.is_some()).collect();
    let first = *dests.first()?;
    let mut action = forward_action(scope, rule, ctx, vs_ns, authority);
    let mut consistent_hash = false;
    if dests.len() == 1 {
        let dest = first.destination.as_ref()?;
        let target = resolve(scope, dest, vs_ns, ctx.listen_port);
        set_cluster(&mut action, target.cluster);
        if let Some(ops) = first.headers.as_ref().map(header_ops) {
            if action.host_rewrite_specifier.is_none() {
                action.host_rewrite_specifier = ops.authority.clone().map(HostRewriteSpecifier::HostRewriteLiteral);
            }
            add_headers(route, ops);
        }
        if let Some(hash) = target.service.and_then(|s| hash_policy(scope, s, &dest.subset, target.port)) {
            action.hash_policy.push(hash);
            consistent_hash = true;
        }
    } else {
        let weighted: Vec<&HttpRouteDestination> = dests.iter().copied().filter(|d| weight(d) > 0).collect();
        // Envoy needs a positive total; all-zero weights (invalid in Istio) split evenly.
        let (list, even) = if weighted.is_empty() { (dests, true) } else { (weighted, false) };
        let mut clusters = Vec::with_capacity(list.len());
        for d in list {
            let dest = d.destination.as_ref()?;
            let target = resolve(scope, dest, vs_ns, ctx.listen_port);
            if let Some(hash) = target.service.and_then(|s| hash_policy(scope, s, &dest.subset, target.port)) {
                action.hash_policy.push(hash);
            }
            clusters.push(cluster_weight(target.cluster, if even { 1 } else { weight(d) }, d));
        }
        action.cluster_specifier =
            Some(ClusterSpecifier::WeightedClusters(WeightedCluster { clusters, ..Default::default() }));
    }
    action.retry_policy = retry_policy(rule.retries.as_ref(), consistent_hash);
    Some(action)
}

fn weight(d: &HttpRouteDestination) -> u32 {
    d.weight.and_then(|w| u32::try_from(w).ok()).unwrap_or(0)
}

fn cluster_weight(name: String, weight: u32, d: &HttpRouteDestination) -> weighted_cluster::ClusterWeight {
    let mut out = weighted_cluster::ClusterWeight { name, weight: Some(u32_value(weight)), ..Default::default() };
    if let Some(ops) = d.headers.as_ref().map(header_ops) {
        out.host_rewrite_specifier =
            ops.authority.map(weighted_cluster::cluster_weight::HostRewriteSpecifier::HostRewriteLiteral);
        out.request_headers_to_add = ops.request_add;
        out.request_headers_to_remove = ops.request_remove;
        out.response_headers_to_add = ops.response_add;
        out.response_headers_to_remove = ops.response_remove;
    }
    out
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::route::v3::{
        header_matcher::HeaderMatchSpecifier, redirect_action::RedirectResponseCode, route_match::PathSpecifier,
        RouteConfiguration,
    };
    use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;
    use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
    use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;

    use super::*;
    use crate::envoy::testing::{find, route_action, route_named, sidecar, testdata_snapshot, unpack, vhost};
    use crate::envoy::TypeUrl;

    const REVIEWS: &str = "reviews.bookinfo.svc.cluster.local:9080";
    const RATINGS: &str = "ratings.bookinfo.svc.cluster.local:9080";

    fn bookinfo_9080() -> RouteConfiguration {
        let s = testdata_snapshot("bookinfo.yaml");
        find(&s, &sidecar("bookinfo", &[("app", "productpage")]), TypeUrl::Route, "9080")
    }

    fn web_8080() -> RouteConfiguration {
        let s = testdata_snapshot("features.yaml");
        find(&s, &sidecar("shop", &[("app", "web")]), TypeUrl::Route, "8080")
    }

    #[test]
    fn weighted_route_becomes_weighted_clusters() {
        let rc = bookinfo_9080();
        let action = route_action(route_named(vhost(&rc, REVIEWS), "split"));
        let Some(ClusterSpecifier::WeightedClusters(w)) = &action.cluster_specifier else {
            panic!("not weighted: {action:?}")
        };
        let got: Vec<(&str, u32)> =
            w.clusters.iter().map(|c| (c.name.as_str(), c.weight.as_ref().map_or(0, |v| v.value))).collect();
        assert_eq!(
            got,
            [
                ("outbound|9080|v1|reviews.bookinfo.svc.cluster.local", 50),
                ("outbound|9080|v3|reviews.bookinfo.svc.cluster.local", 50)
            ]
        );
        // Destination headers go on the weighted cluster entry.
        assert_eq!(w.clusters[1].request_headers_to_add[0].header.as_ref().map(|h| h.key.as_str()), Some("x-canary"));
        assert_eq!(action.timeout.as_ref().map(|t| t.seconds), Some(5));
    }

    #[test]
    fn match_name_is_appended_and_header_matches_exactly() {
        let rc = bookinfo_9080();
        let route = route_named(vhost(&rc, REVIEWS), "jason.user");
        let m = route.r#match.as_ref().expect("match");
        let header = &m.headers[0];
        assert_eq!(header.name, "end-user");
        let Some(HeaderMatchSpecifier::StringMatch(sm)) = &header.header_match_specifier else { panic!("{header:?}") };
        assert_eq!(sm.match_pattern, Some(MatchPattern::Exact("jason".into())));
        let Some(ClusterSpecifier::Cluster(c)) = &route_action(route).cluster_specifier else { panic!() };
        assert_eq!(c, "outbound|9080|v2|reviews.bookinfo.svc.cluster.local");
    }

    #[test]
    fn regex_uri_becomes_safe_regex_and_ignore_case() {
        let rc = bookinfo_9080();
        let route = &vhost(&rc, RATINGS).routes[0];
        let m = route.r#match.as_ref().expect("match");
        let Some(PathSpecifier::SafeRegex(r)) = &m.path_specifier else { panic!("{m:?}") };
        assert_eq!((r.regex.as_str(), r.engine_type.is_none()), ("/ratings/[0-9]+", true));
        assert_eq!(m.case_sensitive.as_ref().map(|b| b.value), Some(false));
    }

    #[test]
    fn retry_on_status_codes_are_split_out() {
        let rc = bookinfo_9080();
        let retry = route_action(route_named(vhost(&rc, REVIEWS), "split")).retry_policy.clone().expect("retry");
        assert_eq!(retry.retry_on, "gateway-error,retriable-status-codes");
        assert_eq!(retry.retriable_status_codes, [503]);
        assert_eq!(retry.num_retries.map(|n| n.value), Some(3));
        assert_eq!(retry.per_try_timeout.map(|d| d.seconds), Some(2));
        // attempts: 0 disables retries.
        let rc = web_8080();
        let api = route_action(route_named(vhost(&rc, "web.shop.svc.cluster.local:8080"), "api.beta"));
        assert!(api.retry_policy.is_none());
    }

    #[test]
    fn fault_and_cors_are_per_route_filter_configs() {
        let rc = bookinfo_9080();
        let route = &vhost(&rc, RATINGS).routes[0];
        let fault: HttpFault = unpack(&route.typed_per_filter_config[ext::FAULT]);
        let delay = fault.delay.expect("delay");
        assert_eq!(delay.percentage.map(|p| p.numerator), Some(125_000), "12.5% of a million");
        let abort = fault.abort.expect("abort");
        assert_eq!(abort.percentage.map(|p| p.numerator), Some(10_000));
        let cors: CorsPolicy = unpack(&route.typed_per_filter_config[ext::CORS]);
        assert_eq!((cors.allow_methods.as_str(), cors.max_age.as_str()), ("GET,POST", "86400"));
    }

    #[test]
    fn routes_carry_istiods_trace_operation() {
        let rc = bookinfo_9080();
        let operations: Vec<String> = vhost(&rc, REVIEWS)
            .routes
            .iter()
            .map(|r| r.decorator.as_ref().map(|d| d.operation.clone()).unwrap_or_default())
            .collect();
        // One destination (jason's, subset v2): its host and port; several (the weighted split):
        // the VirtualService's name and the listener's port. Both match every path.
        assert_eq!(operations, ["reviews.bookinfo.svc.cluster.local:9080/*", "reviews:9080/*"]);
    }

    #[test]
    fn consistent_hash_goes_on_the_route_and_drops_previous_hosts() {
        let rc = bookinfo_9080();
        let action = route_action(&vhost(&rc, RATINGS).routes[0]);
        assert_eq!(action.hash_policy.len(), 1);
        let retry = action.retry_policy.as_ref().expect("default retries");
        assert!(retry.retry_host_predicate.is_empty(), "hashing must retry on the same host");
    }

    #[test]
    fn mirror_percentage_and_default() {
        let rc = bookinfo_9080();
        let mirror = &route_action(&vhost(&rc, RATINGS).routes[1]).request_mirror_policies[0];
        assert_eq!(mirror.cluster, "outbound|9080||details.bookinfo.svc.cluster.local");
        let fraction = mirror.runtime_fraction.as_ref().and_then(|f| f.default_value);
        assert_eq!(fraction.map(|f| f.numerator), Some(100_000));
    }

    #[test]
    fn redirect_maps_code_and_derives_port() {
        let rc = web_8080();
        let route = route_named(vhost(&rc, "web.shop.svc.cluster.local:8080"), "old");
        let Some(route::Action::Redirect(r)) = &route.action else { panic!("{route:?}") };
        assert_eq!(r.response_code, RedirectResponseCode::PermanentRedirect as i32);
        assert_eq!((r.host_redirect.as_str(), r.port_redirect), ("web.shop.example", 8080));
    }

    #[test]
    fn direct_response_decodes_base64_bodies() {
        let rc = web_8080();
        let route = route_named(vhost(&rc, "web.shop.svc.cluster.local:8080"), "bytes");
        let Some(route::Action::DirectResponse(d)) = &route.action else { panic!("{route:?}") };
        let body = d.body.as_ref().and_then(|b| b.specifier.clone());
        assert_eq!(
            body,
            Some(envoy_types::pb::envoy::config::core::v3::data_source::Specifier::InlineBytes(
                b"hello world".to_vec()
            ))
        );
    }

    #[test]
    fn source_labels_filter_routes_per_proxy() {
        let s = testdata_snapshot("features.yaml");
        let other: RouteConfiguration = find(&s, &sidecar("shop", &[("app", "other")]), TypeUrl::Route, "8080");
        let names: Vec<&str> =
            vhost(&other, "web.shop.svc.cluster.local:8080").routes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["old", "teapot", "bytes", "api.beta", "rest"], "canary matches only app=web");
    }
}
