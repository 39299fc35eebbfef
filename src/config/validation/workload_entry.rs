//! WorkloadEntry rules, shared with ServiceEntry endpoints: address, ports and labels.

use std::collections::BTreeSet;

use crate::config::api::WorkloadEntry;

use super::addresses::{check_unix_address, is_ip, UNIX_PREFIX};
use super::field_errors::{forbidden, invalid, required, Errors};
use super::hosts::{check_fqdn, is_dns_label};
use super::labels::check_labels;
use super::ports::check_port;

/// Longest endpoint port name (the CRD's bound).
const MAX_PORT_NAME_LEN: usize = 62;

/// What the context of an endpoint allows.
pub(super) struct EndpointRules<'a> {
    /// Hostnames (resolved with DNS) may be used as addresses.
    pub(super) hostnames: bool,
    /// Unix domain sockets may be used as addresses.
    pub(super) unix_sockets: bool,
    /// Port names of the enclosing ServiceEntry, which endpoint ports must refer to.
    pub(super) service_ports: Option<&'a BTreeSet<&'a str>>,
}

/// Checks a WorkloadEntry.
pub(super) fn validate(entry: &WorkloadEntry, errors: &mut Errors) {
    let rules = EndpointRules { hostnames: true, unix_sockets: true, service_ports: None };
    check_workload_entry(errors, "spec", entry, &rules);
}

/// Checks a workload entry at `path` (`spec`, or `spec.endpoints[i]` of a ServiceEntry).
pub(super) fn check_workload_entry(errors: &mut Errors, path: &str, entry: &WorkloadEntry, rules: &EndpointRules) {
    let address = entry.address.as_str();
    let field = format!("{path}.address");
    let unix = address.starts_with(UNIX_PREFIX);
    if address.is_empty() {
        if entry.network.is_empty() {
            errors.add(field, required("Address is required (it may only be omitted when network is set)"));
        }
    } else if unix {
        errors.check(&field, check_unix_address(address).map_err(|e| invalid(address, e)));
        if !entry.ports.is_empty() {
            errors.add(format!("{path}.ports"), forbidden("UDS may not include ports"));
        }
        if !rules.unix_sockets {
            errors.add(&field, invalid(address, "unix domain socket endpoints need resolution STATIC"));
        } else if rules.service_ports.is_some_and(|ports| ports.len() != 1) {
            errors.add(&field, invalid(address, "exactly 1 service port required for unix endpoints"));
        }
    } else if !is_ip(address) {
        if !rules.hostnames {
            errors.add(field, invalid(address, "endpoint address is not a valid IP address"));
        } else if check_fqdn(address).is_err() {
            errors.add(field, invalid(address, "endpoint address is not a valid FQDN or an IP address"));
        }
    }
    check_endpoint_ports(errors, path, entry, rules);
    check_labels(errors, &format!("{path}.labels"), &entry.labels);
}

/// Checks the port map: valid names (of service ports, in a ServiceEntry) and numbers.
fn check_endpoint_ports(errors: &mut Errors, path: &str, entry: &WorkloadEntry, rules: &EndpointRules) {
    for (name, number) in &entry.ports {
        if name.len() > MAX_PORT_NAME_LEN || !is_dns_label(name) {
            errors.add(format!("{path}.ports"), invalid(name, "port name must be valid"));
            continue;
        }
        let field = format!("{path}.ports[{name}]");
        errors.check(&field, check_port(*number));
        if rules.service_ports.is_some_and(|ports| !ports.contains(name.as_str())) {
            errors.add(field, invalid(name, "endpoint port is not defined by the service entry"));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::validation::testing::{assert_error, assert_valid};

    const WE: &str = "WorkloadEntry";

    #[test]
    fn typical_entries_are_valid() {
        assert_valid(WE, "address: 1.2.3.4\nports: {http: 8080}\nlabels: {app: a}\nweight: 2\nlocality: r/z/s");
        assert_valid(WE, "address: 2001:db8::1");
        assert_valid(WE, "address: vm1.example.com");
        assert_valid(WE, "address: unix:///var/run/a.sock");
        assert_valid(WE, "address: unix://@abstract");
        assert_valid(WE, "network: net1");
    }

    #[test]
    fn an_address_or_network_is_required() {
        assert_error(WE, "labels: {app: a}", "spec.address", "Address is required");
    }

    #[test]
    fn unix_sockets_are_absolute_files_without_ports() {
        assert_error(WE, "address: unix:///dir/", "spec.address", "UDS may not be a dir");
        assert_error(WE, "address: unix://relative", "spec.address", "UDS must be an absolute path or abstract socket");
        assert_error(WE, "address: unix:///a.sock\nports: {http: 80}", "spec.ports", "UDS may not include ports");
    }

    #[test]
    fn hostnames_must_be_fqdns() {
        assert_error(WE, "address: \"a..b\"", "spec.address", "not a valid FQDN or an IP address");
        assert_error(WE, "address: \"*.example.com\"", "spec.address", "not a valid FQDN or an IP address");
    }

    #[test]
    fn ports_are_named_and_in_range() {
        assert_error(WE, "address: 1.1.1.1\nports: {http: 99999}", "spec.ports[http]", "port must be between 1-65535");
        assert_error(WE, "address: 1.1.1.1\nports: {http: 0}", "spec.ports[http]", "port must be between 1-65535");
        assert_error(WE, "address: 1.1.1.1\nports: {\"@\": 80}", "spec.ports", "Invalid value");
    }

    #[test]
    fn labels_are_checked() {
        assert_error(WE, "address: 1.1.1.1\nlabels: {\"a b\": c}", "spec.labels[a b]", "label key");
    }
}
