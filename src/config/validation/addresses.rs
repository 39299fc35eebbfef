//! Address rules: IP addresses, CIDR blocks and Unix domain socket (`unix://`) addresses.

use std::net::IpAddr;

/// Prefix of Unix domain socket addresses.
pub(super) const UNIX_PREFIX: &str = "unix://";

/// Whether `value` is an IPv4 or IPv6 address.
pub(super) fn is_ip(value: &str) -> bool {
    value.parse::<IpAddr>().is_ok()
}

/// Checks an IPv4 or IPv6 address.
pub(super) fn check_ip(value: &str) -> Result<(), String> {
    if is_ip(value) {
        Ok(())
    } else {
        Err(format!("{value} is not a valid IP"))
    }
}

/// Checks an IP address or a CIDR block (`10.0.0.0/8`, `2001:db8::/32`).
pub(super) fn check_ip_or_cidr(value: &str) -> Result<(), String> {
    if value.matches('/').count() != 1 {
        return check_ip(value);
    }
    let valid = value.split_once('/').is_some_and(|(ip, bits)| {
        let max_bits = match ip.parse::<IpAddr>() {
            Ok(IpAddr::V4(_)) => 32,
            Ok(IpAddr::V6(_)) => 128,
            Err(_) => return false,
        };
        !bits.is_empty() && bits.bytes().all(|b| b.is_ascii_digit()) && bits.parse::<u32>().is_ok_and(|b| b <= max_bits)
    });
    if valid {
        Ok(())
    } else {
        Err(format!("{value} is not a valid CIDR block"))
    }
}

/// Checks a `unix://` address: an absolute path or an abstract socket (`@name`), and not a directory.
///
/// The error is the bare reason; callers say which value it is about.
pub(super) fn check_unix_address(address: &str) -> Result<(), String> {
    let path = address.strip_prefix(UNIX_PREFIX).unwrap_or(address);
    if !path.starts_with('/') && !path.starts_with('@') {
        return Err("UDS must be an absolute path or abstract socket".into());
    }
    if path.ends_with('/') {
        return Err("UDS may not be a dir".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ips_of_both_families_are_accepted() {
        assert!(check_ip("1.2.3.4").is_ok());
        assert!(check_ip("001:db8::").is_ok());
        assert_eq!(check_ip("1.2.3").unwrap_err(), "1.2.3 is not a valid IP");
        assert!(check_ip("example.com").is_err());
    }

    #[test]
    fn cidr_prefix_lengths_are_bounded_by_the_family() {
        assert!(check_ip_or_cidr("1.2.3.4/16").is_ok());
        assert!(check_ip_or_cidr("1.1.1.1/32").is_ok());
        assert!(check_ip_or_cidr("2001:db8::/128").is_ok());
        assert!(check_ip_or_cidr("1.2.3.4").is_ok());
        assert_eq!(check_ip_or_cidr("1.2.3.4/99").unwrap_err(), "1.2.3.4/99 is not a valid CIDR block");
        assert!(check_ip_or_cidr("1.2.3.4/").is_err());
        assert!(check_ip_or_cidr("1.2.3.4/+8").is_err());
        assert!(check_ip_or_cidr("a/8").is_err());
        assert!(check_ip_or_cidr("1.2.3.4/8/8").is_err());
    }

    #[test]
    fn unix_sockets_are_absolute_or_abstract_files() {
        assert!(check_unix_address("unix:///var/run/x.sock").is_ok());
        assert!(check_unix_address("unix://@foo").is_ok());
        assert!(check_unix_address("unix://relative")
            .unwrap_err()
            .contains("UDS must be an absolute path or abstract socket"));
        assert!(check_unix_address("unix://").unwrap_err().contains("UDS must be an absolute path"));
        assert!(check_unix_address("unix:///dir/").unwrap_err().contains("UDS may not be a dir"));
    }
}
