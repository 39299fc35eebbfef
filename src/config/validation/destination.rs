//! Route destination rules: the target host, subset and port, and destination weights.

use crate::config::api::virtual_service::Destination;

use super::field_errors::{invalid, required, Errors};
use super::hosts::{check_wildcard_host, is_dns_label};
use super::ports::check_port;

/// Checks a destination (`host`, `subset`, `port`) reported under `path`.
pub(super) fn check_destination(errors: &mut Errors, path: &str, destination: &Destination) {
    let host = destination.host.as_str();
    if host.is_empty() {
        errors.add(format!("{path}.host"), required("destination host is required"));
    } else if host == "*" {
        errors.add(format!("{path}.host"), invalid(host, "invalid destination host *"));
    } else if let Err(e) = check_wildcard_host(host) {
        errors.add(format!("{path}.host"), invalid(host, e));
    }
    if !destination.subset.is_empty() {
        errors.check(format!("{path}.subset"), check_subset_name(&destination.subset));
    }
    if let Some(port) = destination.port {
        errors.check(format!("{path}.port.number"), check_port(port.number));
    }
}

/// Checks a DestinationRule subset name (a DNS-1123 label).
pub(super) fn check_subset_name(name: &str) -> Result<(), String> {
    if is_dns_label(name) {
        Ok(())
    } else {
        Err(invalid(name, "subset name is invalid: must be a DNS-1123 label"))
    }
}

/// Checks the weights of one rule's destinations under `path` (`...route`): none negative, not all zero.
pub(super) fn check_weights(errors: &mut Errors, path: &str, weights: &[Option<i32>]) {
    let mut total: i64 = 0;
    for (i, weight) in weights.iter().enumerate() {
        let weight = weight.unwrap_or(0);
        if weight < 0 {
            errors.add(format!("{path}[{i}].weight"), invalid(weight, "weight must not be negative"));
        }
        total += i64::from(weight);
    }
    if weights.len() > 1 && total == 0 {
        errors.add(path, invalid(total, "total destination weight = 0"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::api::common::PortSelector;

    fn errors_of(destination: &Destination) -> Vec<String> {
        let mut errors = Errors::default();
        check_destination(&mut errors, "d", destination);
        errors.found.iter().map(|e| e.to_string()).collect()
    }

    fn dest(host: &str, subset: &str, port: Option<u32>) -> Destination {
        Destination { host: host.into(), subset: subset.into(), port: port.map(|number| PortSelector { number }) }
    }

    #[test]
    fn a_destination_needs_a_valid_host() {
        assert!(errors_of(&dest("reviews", "v1", Some(9080))).is_empty());
        assert!(errors_of(&dest("", "", None))[0].starts_with("d.host: Required value"));
        assert!(errors_of(&dest("*", "", None))[0].contains("invalid destination host *"));
        assert!(errors_of(&dest("a..b", "", None))[0].starts_with("d.host: Invalid value"));
    }

    #[test]
    fn subsets_and_ports_are_checked() {
        assert!(errors_of(&dest("a", "v_1", None))[0].starts_with("d.subset: Invalid value"));
        assert!(errors_of(&dest("a", "", Some(0)))[0].starts_with("d.port.number: Invalid value: 0"));
    }

    #[test]
    fn weights_are_non_negative_and_not_all_zero() {
        let check = |w: &[Option<i32>]| {
            let mut errors = Errors::default();
            check_weights(&mut errors, "r", w);
            errors.found.iter().map(|e| e.to_string()).collect::<Vec<_>>()
        };
        assert!(check(&[Some(75), Some(25)]).is_empty());
        assert!(check(&[Some(30), Some(30)]).is_empty());
        assert!(check(&[None]).is_empty());
        assert!(check(&[Some(-1), Some(10)])[0].starts_with("r[0].weight: Invalid value: -1"));
        assert!(check(&[None, Some(0)])[0].contains("total destination weight = 0"));
    }
}
