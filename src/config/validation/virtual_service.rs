//! VirtualService rules: hosts, gateways, TLS and TCP routes (HTTP routes are in `http_route`).

use crate::config::api::virtual_service::{RouteDestination, TcpRoute, TlsMatchAttributes, TlsRoute};
use crate::config::api::{Labels, VirtualService};

use super::addresses::{check_ip_or_cidr, is_ip};
use super::destination::{check_destination, check_weights};
use super::export_to::{check_export_to, Exporter};
use super::field_errors::{duplicate, forbidden, invalid, required, Errors};
use super::gateway_binding::{check_gateway_name, RouteContext};
use super::hosts::{check_wildcard_host, host_within, hosts_overlap, is_dns_label};
use super::http_route::check_http_route;
use super::labels::check_labels;
use super::ports::check_port;

/// Prefix of the SNI names Istio generates for cross-network passthrough (`outbound_.80_._.host`).
const AUTO_SNI_LABEL: &str = "outbound_";

/// Checks a VirtualService in `namespace`.
pub(super) fn validate(vs: &VirtualService, namespace: &str, errors: &mut Errors) {
    for (i, gateway) in vs.gateways.iter().enumerate() {
        errors.check(format!("spec.gateways[{i}]"), check_gateway_name(gateway));
    }
    let ctx = RouteContext::new(vs, namespace);
    check_hosts(errors, vs, &ctx);
    if vs.http.is_empty() && vs.tcp.is_empty() && vs.tls.is_empty() {
        errors.add("spec.http", required("http, tcp or tls must be provided in virtual service"));
    }
    for (i, route) in vs.http.iter().enumerate() {
        check_http_route(errors, &format!("spec.http[{i}]"), route, &ctx);
    }
    for (i, route) in vs.tls.iter().enumerate() {
        check_tls_route(errors, &format!("spec.tls[{i}]"), route, vs, &ctx);
    }
    for (i, route) in vs.tcp.iter().enumerate() {
        check_tcp_route(errors, &format!("spec.tcp[{i}]"), route, &ctx);
    }
    check_export_to(errors, "spec.exportTo", namespace, &vs.export_to, Exporter::Plain);
}

/// Checks `spec.hosts`: present, valid, no `*` for sidecars, and no two hosts that overlap.
fn check_hosts(errors: &mut Errors, vs: &VirtualService, ctx: &RouteContext) {
    if vs.hosts.is_empty() {
        // A delegate: only its HTTP rules are read, merged into the roots that name it.
        let delegate_fields = [
            (!vs.gateways.is_empty(), "spec.gateways", "delegate virtual service must have no gateways specified"),
            (!vs.tls.is_empty(), "spec.tls", "delegate virtual service must have no tls route specified"),
            (!vs.tcp.is_empty(), "spec.tcp", "delegate virtual service must have no tcp route specified"),
        ];
        for (_, path, reason) in delegate_fields.into_iter().filter(|(set, _, _)| *set) {
            errors.add(path, forbidden(reason));
        }
        return;
    }
    let sni = vs.tls.iter().flat_map(|t| &t.matches).any(|m| !m.sni_hosts.is_empty());
    let mut all_valid = true;
    for (i, host) in vs.hosts.iter().enumerate() {
        let result = if ctx.gateway_only { check_gateway_bound_host(host, sni) } else { check_wildcard_host(host) };
        let reason = match result {
            Err(e) if !is_ip(host) => Some(e),
            Ok(()) if !ctx.gateway_only && host == "*" => {
                Some("wildcard host * is not allowed for virtual services bound to the mesh gateway".to_string())
            }
            _ => None,
        };
        if let Some(reason) = reason {
            errors.add(format!("spec.hosts[{i}]"), invalid(host, reason));
            all_valid = false;
        }
    }
    if !all_valid {
        return;
    }
    for (i, a) in vs.hosts.iter().enumerate() {
        for (j, b) in vs.hosts.iter().enumerate().skip(i + 1) {
            if hosts_overlap(a, b) {
                errors.add(
                    format!("spec.hosts[{j}]"),
                    duplicate(b, format!("duplicate hosts in virtual service: {a} & {b}")),
                );
            }
        }
    }
}

/// Checks a host of a gateway-bound VirtualService, where Istio's generated SNI names are also allowed.
fn check_gateway_bound_host(host: &str, sni: bool) -> Result<(), String> {
    let first = host.split('.').next().unwrap_or_default();
    if sni && first == AUTO_SNI_LABEL {
        // `outbound_.<port>_...`: the label after `outbound_` starts with the port number.
        let after = host.as_bytes().get(AUTO_SNI_LABEL.len() + 1);
        return if after.is_some_and(|b| (b'0'..=b'8').contains(b)) {
            Ok(())
        } else {
            Err(format!("domain name {host:?} invalid (label {first:?} invalid)"))
        };
    }
    check_wildcard_host(host)
}

/// Checks a TLS route at `path` (`spec.tls[i]`).
fn check_tls_route(errors: &mut Errors, path: &str, route: &TlsRoute, vs: &VirtualService, ctx: &RouteContext) {
    if route.matches.is_empty() {
        errors.add(format!("{path}.match"), required("TLS route must have at least one match condition"));
    }
    for (j, m) in route.matches.iter().enumerate() {
        check_tls_match(errors, &format!("{path}.match[{j}]"), m, vs, ctx);
    }
    check_l4_destinations(errors, &format!("{path}.route"), &route.route, "TLS route is required");
}

fn check_tls_match(errors: &mut Errors, path: &str, m: &TlsMatchAttributes, vs: &VirtualService, ctx: &RouteContext) {
    if m.sni_hosts.is_empty() {
        errors.add(format!("{path}.sniHosts"), required("TLS match must have at least one SNI host"));
    }
    for (k, sni) in m.sni_hosts.iter().enumerate() {
        let field = format!("{path}.sniHosts[{k}]");
        let result = if ctx.gateway_only { check_gateway_bound_host(sni, true) } else { check_wildcard_host(sni) };
        match result {
            // An IP is against the SNI spec, but some clients send one.
            Err(_) if is_ip(sni) => {}
            Err(e) => errors.add(field, invalid(sni, e)),
            Ok(()) if !vs.hosts.iter().any(|h| host_within(sni, h)) => {
                let hosts = vs.hosts.join(", ");
                errors.add(
                    field,
                    invalid(
                        sni,
                        format!("SNI host is not a compatible subset of any of the virtual service hosts: [{hosts}]"),
                    ),
                );
            }
            Ok(()) => {}
        }
    }
    let l4 = L4Match {
        destination_subnets: &m.destination_subnets,
        port: m.port,
        source_labels: &m.source_labels,
        gateways: &m.gateways,
        source_namespace: &m.source_namespace,
    };
    check_l4_match(errors, path, &l4, ctx);
}

/// Checks a TCP route at `path` (`spec.tcp[i]`).
fn check_tcp_route(errors: &mut Errors, path: &str, route: &TcpRoute, ctx: &RouteContext) {
    for (j, m) in route.matches.iter().enumerate() {
        let l4 = L4Match {
            destination_subnets: &m.destination_subnets,
            port: m.port,
            source_labels: &m.source_labels,
            gateways: &m.gateways,
            source_namespace: &m.source_namespace,
        };
        check_l4_match(errors, &format!("{path}.match[{j}]"), &l4, ctx);
    }
    check_l4_destinations(errors, &format!("{path}.route"), &route.route, "TCP route is required");
}

/// The match fields TLS and TCP routes share.
struct L4Match<'a> {
    destination_subnets: &'a [String],
    port: Option<u32>,
    source_labels: &'a Labels,
    gateways: &'a [String],
    source_namespace: &'a str,
}

fn check_l4_match(errors: &mut Errors, path: &str, m: &L4Match, ctx: &RouteContext) {
    for (k, subnet) in m.destination_subnets.iter().enumerate() {
        errors
            .check(format!("{path}.destinationSubnets[{k}]"), check_ip_or_cidr(subnet).map_err(|e| invalid(subnet, e)));
    }
    if let Some(port) = m.port.filter(|p| *p != 0) {
        errors.check(format!("{path}.port"), check_port(port));
    }
    check_labels(errors, &format!("{path}.sourceLabels"), m.source_labels);
    ctx.check_match_gateways(errors, &format!("{path}.gateways"), m.gateways);
    if !m.source_namespace.is_empty() && !is_dns_label(m.source_namespace) {
        errors.add(format!("{path}.sourceNamespace"), invalid(m.source_namespace, "sourceNamespace match is invalid"));
    }
}

/// Checks the destinations of a TLS or TCP route at `path` (`...route`).
fn check_l4_destinations(errors: &mut Errors, path: &str, destinations: &[RouteDestination], missing: &str) {
    if destinations.is_empty() {
        errors.add(path, required(missing));
    }
    for (k, d) in destinations.iter().enumerate() {
        let field = format!("{path}[{k}].destination");
        match &d.destination {
            None => errors.add(field, required("destination is required")),
            Some(dest) => check_destination(errors, &field, dest),
        }
    }
    let weights: Vec<Option<i32>> = destinations.iter().map(|d| d.weight).collect();
    check_weights(errors, path, &weights);
}

#[cfg(test)]
mod tests {
    use crate::config::validation::testing::{assert_error, assert_valid};

    const VS: &str = "VirtualService";
    const ROUTE: &str = "http: [{route: [{destination: {host: a}}]}]";

    #[test]
    fn a_mesh_virtual_service_is_valid() {
        assert_valid(VS, &format!("hosts: [a, b.ns.svc.cluster.local, \"*.example.com\", 10.0.0.1]\n{ROUTE}"));
        assert_valid(VS, &format!("hosts: [a]\ngateways: [mesh, ns/gw, gw2]\nexportTo: [\".\"]\n{ROUTE}"));
    }

    #[test]
    fn hosts_are_valid_and_a_virtual_service_without_them_is_a_delegate() {
        assert_valid(VS, ROUTE);
        assert_error(
            VS,
            &format!("gateways: [gw]\n{ROUTE}"),
            "spec.gateways",
            "delegate virtual service must have no gateways",
        );
        let tcp = "tcp: [{route: [{destination: {host: a}}]}]";
        assert_error(VS, tcp, "spec.tcp", "delegate virtual service must have no tcp route");
        let nested = "http: [{delegate: {name: d}}]";
        assert_error(VS, nested, "spec.http[0].delegate", "delegate HTTP route cannot contain delegate");
        assert_error(VS, &format!("hosts: [\"a..b\"]\n{ROUTE}"), "spec.hosts[0]", "Invalid value");
        assert_error(VS, &format!("hosts: [\"foo*.com\"]\n{ROUTE}"), "spec.hosts[0]", "label \"foo*\" invalid");
    }

    #[test]
    fn wildcard_star_needs_a_gateway() {
        assert_error(
            VS,
            &format!("hosts: [\"*\"]\n{ROUTE}"),
            "spec.hosts[0]",
            "not allowed for virtual services bound to the mesh",
        );
        assert_error(
            VS,
            &format!("hosts: [\"*\"]\ngateways: [mesh, gw]\n{ROUTE}"),
            "spec.hosts[0]",
            "bound to the mesh",
        );
        assert_valid(VS, &format!("hosts: [\"*\"]\ngateways: [gw]\n{ROUTE}"));
    }

    #[test]
    fn overlapping_hosts_are_duplicates() {
        assert_error(VS, &format!("hosts: [\"*.foo.com\", a.foo.com]\n{ROUTE}"), "spec.hosts[1]", "Duplicate value");
        assert_error(
            VS,
            &format!("hosts: [a, a]\n{ROUTE}"),
            "spec.hosts[1]",
            "duplicate hosts in virtual service: a & a",
        );
    }

    #[test]
    fn gateway_names_are_checked() {
        assert_error(VS, &format!("hosts: [a]\ngateways: [\"ns/\"]\n{ROUTE}"), "spec.gateways[0]", "cannot be empty");
        assert_error(
            VS,
            &format!("hosts: [a]\ngateways: [\"Bad_NS/gw\"]\n{ROUTE}"),
            "spec.gateways[0]",
            "invalid value for namespace",
        );
        assert_error(
            VS,
            &format!("hosts: [a]\ngateways: [\"ns/gw.x\"]\n{ROUTE}"),
            "spec.gateways[0]",
            "invalid value for gateway name",
        );
        assert_error(
            VS,
            &format!("hosts: [a]\ngateways: [\"gw_1\"]\n{ROUTE}"),
            "spec.gateways[0]",
            "invalid gateway name",
        );
    }

    #[test]
    fn match_gateways_must_be_bound() {
        let spec = |gws: &str, m: &str| {
            format!("hosts: [a]\ngateways: {gws}\nhttp: [{{match: [{{gateways: {m}}}], route: [{{destination: {{host: a}}}}]}}]")
        };
        assert_valid(VS, &spec("[gw, mesh]", "[ns/gw, mesh]"));
        assert_valid(VS, &spec("[other/gw]", "[gw.other.svc.cluster.local]"));
        assert_error(
            VS,
            &spec("[gw]", "[mesh]"),
            "spec.http[0].match[0].gateways[0]",
            "not one of the virtual service's gateways",
        );
    }

    #[test]
    fn some_route_is_required() {
        assert_error(VS, "hosts: [a]", "spec.http", "http, tcp or tls must be provided");
    }

    #[test]
    fn tls_routes_match_sni_hosts_within_the_virtual_service_hosts() {
        let tls = |sni: &str| {
            format!("hosts: [\"*.example.com\"]\ntls: [{{match: [{{sniHosts: [{sni}]}}], route: [{{destination: {{host: a}}}}]}}]")
        };
        assert_valid(VS, &tls("a.example.com"));
        assert_valid(VS, &tls("1.2.3.4"));
        assert_error(VS, &tls("a.other.com"), "spec.tls[0].match[0].sniHosts[0]", "not a compatible subset");
        assert_error(VS, &tls("\"a..b\""), "spec.tls[0].match[0].sniHosts[0]", "Invalid value");
        assert_error(
            VS,
            "hosts: [a]\ntls: [{match: [{port: 443}], route: [{destination: {host: a}}]}]",
            "spec.tls[0].match[0].sniHosts",
            "at least one SNI host",
        );
        assert_error(
            VS,
            "hosts: [a]\ntls: [{route: [{destination: {host: a}}]}]",
            "spec.tls[0].match",
            "at least one match",
        );
        assert_error(VS, "hosts: [a]\ntls: [{match: [{sniHosts: [a]}]}]", "spec.tls[0].route", "TLS route is required");
    }

    #[test]
    fn generated_sni_names_are_allowed_on_gateways() {
        let spec = "hosts: [\"outbound_.80_._.a.ns.svc.cluster.local\"]\ngateways: [gw]\n\
                    tls: [{match: [{sniHosts: [\"outbound_.80_._.a.ns.svc.cluster.local\"]}], route: [{destination: {host: a}}]}]";
        assert_valid(VS, spec);
        let bad = "hosts: [\"outbound_.x\"]\ngateways: [gw]\n\
                   tls: [{match: [{sniHosts: [\"outbound_.x\"]}], route: [{destination: {host: a}}]}]";
        assert_error(VS, bad, "spec.hosts[0]", "label \"outbound_\" invalid");
    }

    #[test]
    fn tcp_routes_are_checked() {
        let tcp = |body: &str| format!("hosts: [a]\ntcp: [{body}]");
        assert_valid(
            VS,
            &tcp("{match: [{port: 27017, destinationSubnets: [10.0.0.0/8]}], route: [{destination: {host: db}}]}"),
        );
        assert_error(VS, &tcp("{match: [{port: 1}]}"), "spec.tcp[0].route", "TCP route is required");
        assert_error(VS, &tcp("{route: [{weight: 1}]}"), "spec.tcp[0].route[0].destination", "Required value");
        assert_error(
            VS,
            &tcp("{match: [{destinationSubnets: [1.2.3.4/40]}], route: [{destination: {host: a}}]}"),
            "spec.tcp[0].match[0].destinationSubnets[0]",
            "not a valid CIDR block",
        );
        assert_error(
            VS,
            &tcp("{match: [{port: 65536}], route: [{destination: {host: a}}]}"),
            "spec.tcp[0].match[0].port",
            "1-65535",
        );
        assert_error(
            VS,
            &tcp("{match: [{sourceLabels: {\"a b\": c}}], route: [{destination: {host: a}}]}"),
            "spec.tcp[0].match[0].sourceLabels[a b]",
            "label key",
        );
        assert_error(
            VS,
            &tcp("{match: [{sourceNamespace: Bad_NS}], route: [{destination: {host: a}}]}"),
            "spec.tcp[0].match[0].sourceNamespace",
            "sourceNamespace match is invalid",
        );
        assert_error(
            VS,
            &tcp("{route: [{destination: {host: a}, weight: 0}, {destination: {host: b}, weight: 0}]}"),
            "spec.tcp[0].route",
            "total destination weight = 0",
        );
    }

    #[test]
    fn export_to_is_checked() {
        assert_error(VS, &format!("hosts: [a]\nexportTo: [\"*\", ns2]\n{ROUTE}"), "spec.exportTo", "public (*)");
    }
}
