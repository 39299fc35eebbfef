//! ServiceEntry rules: hosts, addresses, ports, resolution and endpoints, selector and exportTo.

use std::collections::BTreeSet;

use crate::config::api::service_entry::Resolution;
use crate::config::api::ServiceEntry;

use super::addresses::check_ip_or_cidr;
use super::export_to::{check_export_to, Exporter};
use super::field_errors::{duplicate, forbidden, invalid, required, Errors};
use super::hosts::{check_fqdn, check_wildcard_host};
use super::labels::check_selector;
use super::ports::{check_port, check_port_name, check_protocol, is_http_protocol, is_tls_protocol};
use super::workload_entry::{check_workload_entry, EndpointRules};

/// Checks a ServiceEntry in `namespace`.
pub(super) fn validate(se: &ServiceEntry, namespace: &str, errors: &mut Errors) {
    // An unset resolution is NONE.
    let resolution = se.resolution.unwrap_or(Resolution::None);
    if se.workload_selector.is_some() && !se.endpoints.is_empty() {
        errors.add("spec.workloadSelector", forbidden("only one of WorkloadSelector or Endpoints can be set"));
    }
    if let Some(selector) = &se.workload_selector {
        check_selector(errors, "spec.workloadSelector.labels", &selector.labels);
    }
    check_hosts(errors, se);
    check_addresses(errors, se, resolution);
    let port_names = check_ports(errors, se);
    check_endpoints(errors, se, resolution, &port_names);
    check_multiple_hosts(errors, se, resolution);
    for (i, san) in se.subject_alt_names.iter().enumerate().filter(|(_, san)| san.is_empty()) {
        errors.add(format!("spec.subjectAltNames[{i}]"), invalid(san, "subject alt names must not be empty"));
    }
    check_export_to(errors, "spec.exportTo", namespace, &se.export_to, Exporter::ServiceEntry);
}

/// Checks `spec.hosts`: present, not `*`, valid (wildcard) hostnames.
fn check_hosts(errors: &mut Errors, se: &ServiceEntry) {
    if se.hosts.is_empty() {
        errors.add("spec.hosts", required("service entry must have at least one host"));
    }
    for (i, host) in se.hosts.iter().enumerate() {
        let field = format!("spec.hosts[{i}]");
        if host == "*" {
            errors.add(field, invalid(host, "hostname cannot be wildcard"));
        } else {
            errors.check(field, check_wildcard_host(host).map_err(|e| invalid(host, e)));
        }
    }
}

/// Checks `spec.addresses`: IPs or CIDR blocks, CIDR only where the original destination is kept.
fn check_addresses(errors: &mut Errors, se: &ServiceEntry, resolution: Resolution) {
    let keeps_destination = matches!(resolution, Resolution::None | Resolution::Static);
    let mut cidr_reported = false;
    for (i, address) in se.addresses.iter().enumerate() {
        let field = format!("spec.addresses[{i}]");
        errors.check(&field, check_ip_or_cidr(address).map_err(|e| invalid(address, e)));
        if address.contains('/') && !keeps_destination && !cidr_reported {
            errors.add(field, invalid(address, "CIDR addresses are allowed only for NONE/STATIC resolution types"));
            cidr_reported = true;
        }
    }
}

/// Checks `spec.ports` and returns the port names.
fn check_ports<'a>(errors: &mut Errors, se: &'a ServiceEntry) -> BTreeSet<&'a str> {
    let mut names = BTreeSet::new();
    let mut numbers = BTreeSet::new();
    for (i, port) in se.ports.iter().enumerate() {
        let path = format!("spec.ports[{i}]");
        if port.name.is_empty() {
            errors.add(format!("{path}.name"), required("port name is required"));
        } else if !names.insert(port.name.as_str()) {
            errors.add(&path, duplicate(&port.name, "service entry port name already defined"));
        } else {
            errors.check(format!("{path}.name"), check_port_name(&port.name));
        }
        errors.check(format!("{path}.number"), check_port(port.number));
        if !numbers.insert(port.number) {
            errors.add(format!("{path}.number"), duplicate(port.number, "port number cannot be duplicated"));
        }
        if let Some(target) = port.target_port {
            errors.check(format!("{path}.targetPort"), check_port(target));
        }
        errors.check(format!("{path}.protocol"), check_protocol(&port.protocol));
    }
    names
}

/// Checks endpoints against the resolution mode.
fn check_endpoints(errors: &mut Errors, se: &ServiceEntry, resolution: Resolution, port_names: &BTreeSet<&str>) {
    let dns = matches!(resolution, Resolution::Dns | Resolution::DnsRoundRobin);
    match resolution {
        Resolution::None if !se.endpoints.is_empty() => {
            errors.add("spec.endpoints", forbidden("NONE mode cannot set endpoints"));
            return;
        }
        Resolution::DnsRoundRobin if se.endpoints.len() > 1 => {
            errors.add(
                "spec.endpoints",
                invalid(se.endpoints.len(), "DNS_ROUND_ROBIN mode cannot have multiple endpoints"),
            );
        }
        _ => {}
    }
    if dns && se.endpoints.is_empty() {
        // Without endpoints the hosts themselves are resolved, so they cannot be wildcards.
        let mode = if resolution == Resolution::Dns { "DNS" } else { "DNS_ROUND_ROBIN" };
        for (i, host) in se.hosts.iter().enumerate() {
            if check_wildcard_host(host).is_ok() && host != "*" && check_fqdn(host).is_err() {
                let reason = format!("hosts must be FQDN if no endpoints are provided for resolution mode {mode}");
                errors.add(format!("spec.hosts[{i}]"), invalid(host, reason));
            }
        }
    }
    let rules = EndpointRules {
        hostnames: dns,
        unix_sockets: resolution == Resolution::Static,
        service_ports: Some(port_names),
    };
    for (i, endpoint) in se.endpoints.iter().enumerate() {
        check_workload_entry(errors, &format!("spec.endpoints[{i}]"), endpoint, &rules);
    }
}

/// Several hosts can share resolved ports only when the protocol tells them apart (HTTP Host, TLS SNI).
fn check_multiple_hosts(errors: &mut Errors, se: &ServiceEntry, resolution: Resolution) {
    if resolution == Resolution::None || se.hosts.len() < 2 {
        return;
    }
    let opaque = se.ports.iter().position(|p| !is_http_protocol(&p.protocol) && !is_tls_protocol(&p.protocol));
    if let Some(i) = opaque {
        let reason = "multiple hosts provided with non-HTTP, non-TLS ports";
        errors.add(format!("spec.ports[{i}].protocol"), invalid(&se.ports[i].protocol, reason));
    }
}

#[cfg(test)]
mod tests {
    use crate::config::validation::testing::{assert_error, assert_valid};

    const SE: &str = "ServiceEntry";

    #[test]
    fn typical_entries_are_valid() {
        assert_valid(SE, "hosts: [api.example.com]\nports: [{number: 443, name: https, protocol: TLS}]\nresolution: DNS\nlocation: MESH_EXTERNAL");
        assert_valid(
            SE,
            "hosts: [db.internal]\naddresses: [10.0.0.0/24]\nports: [{number: 5432, name: pg, protocol: TCP, targetPort: 15432}]\n\
             resolution: STATIC\nendpoints: [{address: 10.0.0.1, ports: {pg: 5433}}, {address: 10.0.0.2}]\nexportTo: [\"~\"]",
        );
        assert_valid(SE, "hosts: [a.unix.local]\nports: [{number: 80, name: http, protocol: HTTP}]\nresolution: STATIC\nendpoints: [{address: \"unix:///var/run/a.sock\"}]");
        assert_valid(SE, "hosts: [\"*.bar.com\"]\nports: [{number: 80, name: http, protocol: HTTP}]\nresolution: NONE");
        assert_valid(SE, "hosts: [a.com, b.com]\nports: [{number: 80, name: http, protocol: HTTP}]\nresolution: DNS\nsubjectAltNames: [spiffe://a]");
    }

    #[test]
    fn hosts_are_required_and_not_wildcard() {
        assert_error(SE, "ports: [{number: 80, name: http}]", "spec.hosts", "Required value");
        assert_error(SE, "hosts: [\"*\"]", "spec.hosts[0]", "hostname cannot be wildcard");
        assert_error(SE, "hosts: [\"foo*\"]", "spec.hosts[0]", "Invalid value");
        assert_valid(SE, "hosts: [\"*x\"]");
    }

    #[test]
    fn addresses_are_ips_or_cidrs_and_cidrs_need_no_dns() {
        assert_error(SE, "hosts: [a.com]\naddresses: [1.2.3.4/99]", "spec.addresses[0]", "not a valid CIDR block");
        assert_error(SE, "hosts: [a.com]\naddresses: [not-an-ip]", "spec.addresses[0]", "not a valid IP");
        assert_error(
            SE,
            "hosts: [a.com]\naddresses: [1.2.3.4/16]\nresolution: DNS",
            "spec.addresses[0]",
            "CIDR addresses are allowed only for NONE/STATIC resolution types",
        );
        assert_valid(SE, "hosts: [a.com]\naddresses: [1.1.1.1/32]");
        // Unquoted in a flow sequence, as Kubernetes' YAML reader keeps it.
        assert_valid(SE, "hosts: [a.com]\naddresses: [1.2.3.4, 001:db8::]");
    }

    #[test]
    fn ports_are_unique_and_valid() {
        assert_error(
            SE,
            "hosts: [a.com]\nports: [{name: a, number: 1}, {name: a, number: 12}]",
            "spec.ports[1]",
            "Duplicate value",
        );
        assert_error(
            SE,
            "hosts: [a.com]\nports: [{name: a, number: 1}, {name: b, number: 1}]",
            "spec.ports[1].number",
            "port number cannot be duplicated",
        );
        assert_error(
            SE,
            "hosts: [a.com]\nports: [{name: a, number: 99999}]",
            "spec.ports[0].number",
            "port must be between 1-65535",
        );
        assert_error(
            SE,
            "hosts: [a.com]\nports: [{name: a, number: 1, targetPort: 99999}]",
            "spec.ports[0].targetPort",
            "port must be between 1-65535",
        );
        assert_error(SE, "hosts: [a.com]\nports: [{number: 1}]", "spec.ports[0].name", "Required value");
        assert_error(SE, "hosts: [a.com]\nports: [{name: a_b, number: 1}]", "spec.ports[0].name", "invalid port name");
        assert_error(
            SE,
            "hosts: [a.com]\nports: [{name: a, number: 1, protocol: SMTP}]",
            "spec.ports[0].protocol",
            "unsupported protocol",
        );
    }

    #[test]
    fn selector_and_endpoints_are_exclusive() {
        assert_error(
            SE,
            "hosts: [a.com]\nworkloadSelector: {}\nendpoints: [{address: 1.2.3.4}]",
            "spec.workloadSelector",
            "only one of WorkloadSelector or Endpoints can be set",
        );
        assert_error(
            SE,
            "hosts: [a.com]\nworkloadSelector: {labels: {val: \"*\"}}",
            "spec.workloadSelector.labels[val]",
            "wildcard is not supported in selector",
        );
        assert_error(
            SE,
            "hosts: [a.com]\nworkloadSelector: {labels: {\"*\": val}}",
            "spec.workloadSelector.labels[*]",
            "wildcard is not supported in selector",
        );
        assert_valid(SE, "hosts: [a.com]\nworkloadSelector: {}\nresolution: STATIC");
    }

    #[test]
    fn resolution_limits_endpoints() {
        assert_error(
            SE,
            "hosts: [a.com]\nendpoints: [{address: 1.2.3.4}]",
            "spec.endpoints",
            "NONE mode cannot set endpoints",
        );
        assert_error(
            SE,
            "hosts: [a.com]\nresolution: DNS_ROUND_ROBIN\nendpoints: [{address: a.example.com}, {address: b.example.com}]",
            "spec.endpoints",
            "DNS_ROUND_ROBIN mode cannot have multiple endpoints",
        );
        assert_error(
            SE,
            "hosts: [\"*.a.com\"]\nresolution: DNS",
            "spec.hosts[0]",
            "hosts must be FQDN if no endpoints are provided",
        );
    }

    #[test]
    fn static_endpoints_are_ips_or_unix_sockets() {
        let spec = |address: &str| {
            format!("hosts: [a.com]\nports: [{{number: 80, name: http}}]\nresolution: STATIC\nendpoints: [{{address: \"{address}\"}}]")
        };
        assert_error(SE, &spec("a.example.com"), "spec.endpoints[0].address", "not a valid IP address");
        assert_error(SE, &spec("unix:///dir/"), "spec.endpoints[0].address", "UDS may not be a dir");
        assert_error(
            SE,
            "hosts: [a.com]\nports: [{number: 80, name: http}, {number: 81, name: h2}]\nresolution: STATIC\nendpoints: [{address: \"unix:///s\"}]",
            "spec.endpoints[0].address",
            "exactly 1 service port required for unix endpoints",
        );
        assert_error(
            SE,
            "hosts: [a.com]\nresolution: STATIC\nendpoints: [{labels: {a: b}}]",
            "spec.endpoints[0].address",
            "Address is required",
        );
    }

    #[test]
    fn dns_endpoints_are_fqdns_or_ips() {
        let spec = |address: &str| {
            format!("hosts: [a.com]\nports: [{{number: 80, name: http}}]\nresolution: DNS\nendpoints: [{{address: \"{address}\"}}]")
        };
        assert_valid(SE, &spec("b.example.com"));
        assert_valid(SE, &spec("10.1.1.1"));
        assert_error(SE, &spec("a..b"), "spec.endpoints[0].address", "not a valid FQDN or an IP address");
        assert_error(SE, &spec("unix:///s"), "spec.endpoints[0].address", "need resolution STATIC");
    }

    #[test]
    fn endpoint_ports_name_service_ports() {
        let spec = |ports: &str| {
            format!("hosts: [a.com]\nports: [{{number: 80, name: http}}]\nresolution: DNS\nendpoints: [{{address: b.com, ports: {ports}}}]")
        };
        assert_valid(SE, &spec("{http: 8080}"));
        assert_error(SE, &spec("{grpc: 8080}"), "spec.endpoints[0].ports[grpc]", "not defined by the service entry");
        assert_error(SE, &spec("{http: 0}"), "spec.endpoints[0].ports[http]", "port must be between 1-65535");
    }

    #[test]
    fn several_hosts_need_a_distinguishing_protocol() {
        assert_error(
            SE,
            "hosts: [a.com, b.com]\nports: [{number: 3306, name: db, protocol: TCP}]\nresolution: DNS",
            "spec.ports[0].protocol",
            "multiple hosts provided with non-HTTP, non-TLS ports",
        );
        assert_valid(SE, "hosts: [a.com, b.com]\nports: [{number: 3306, name: db, protocol: TCP}]\nresolution: NONE");
    }

    #[test]
    fn subject_alt_names_and_export_to_are_checked() {
        assert_error(SE, "hosts: [a.com]\nsubjectAltNames: [\"\"]", "spec.subjectAltNames[0]", "must not be empty");
        assert_error(SE, "hosts: [a.com]\nexportTo: [\"~\", a]", "spec.exportTo", "no one (~) and someone");
    }
}
