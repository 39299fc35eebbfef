//! Port rules: numbers, names and protocols.

use super::field_errors::invalid;
use super::hosts::is_dns_label;

/// Protocols Istio recognises on ports (matched case-insensitively).
const KNOWN_PROTOCOLS: [&str; 12] =
    ["HTTP", "HTTPS", "HTTP2", "HTTP_PROXY", "GRPC", "GRPC-WEB", "TCP", "TLS", "UDP", "MONGO", "REDIS", "MYSQL"];

/// Protocols routed by Envoy's HTTP connection manager.
const HTTP_PROTOCOLS: [&str; 5] = ["HTTP", "HTTP2", "HTTP_PROXY", "GRPC", "GRPC-WEB"];

/// Protocols that carry TLS from the client.
const TLS_PROTOCOLS: [&str; 2] = ["HTTPS", "TLS"];

/// Checks a port number (1–65535).
pub(super) fn check_port(number: u32) -> Result<(), String> {
    if (1..=65535).contains(&number) {
        Ok(())
    } else {
        Err(invalid(number, "port must be between 1-65535"))
    }
}

/// Checks a port name (a DNS-1123 label).
pub(super) fn check_port_name(name: &str) -> Result<(), String> {
    if is_dns_label(name) {
        Ok(())
    } else {
        Err(invalid(name, "invalid port name: must be a DNS-1123 label of at most 63 characters"))
    }
}

/// Checks a port protocol; empty means "detect" and is allowed.
pub(super) fn check_protocol(protocol: &str) -> Result<(), String> {
    if protocol.is_empty() || is_known_protocol(protocol) {
        Ok(())
    } else {
        Err(invalid(protocol, format!("unsupported protocol, supported protocols are {}", KNOWN_PROTOCOLS.join(", "))))
    }
}

/// Whether Istio knows `protocol`.
pub(super) fn is_known_protocol(protocol: &str) -> bool {
    in_list(protocol, &KNOWN_PROTOCOLS)
}

/// Whether `protocol` is served by the HTTP connection manager.
pub(super) fn is_http_protocol(protocol: &str) -> bool {
    in_list(protocol, &HTTP_PROTOCOLS)
}

/// Whether `protocol` carries TLS from the client (HTTPS, TLS).
pub(super) fn is_tls_protocol(protocol: &str) -> bool {
    in_list(protocol, &TLS_PROTOCOLS)
}

fn in_list(protocol: &str, list: &[&str]) -> bool {
    list.iter().any(|p| p.eq_ignore_ascii_case(protocol))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_numbers_are_1_to_65535() {
        assert!(check_port(1).is_ok());
        assert!(check_port(65535).is_ok());
        assert_eq!(check_port(0).unwrap_err(), "Invalid value: 0: port must be between 1-65535");
        assert!(check_port(99999).unwrap_err().contains("port must be between 1-65535"));
    }

    #[test]
    fn port_names_are_dns_labels() {
        assert!(check_port_name("http-web").is_ok());
        assert!(check_port_name("a_b").unwrap_err().contains("invalid port name"));
        assert!(check_port_name("").is_err());
    }

    #[test]
    fn protocols_are_istios_case_insensitively() {
        assert!(check_protocol("").is_ok());
        assert!(check_protocol("grpc-web").is_ok());
        assert!(check_protocol("Mongo").is_ok());
        assert!(check_protocol("SMTP").unwrap_err().contains("unsupported protocol"));
        assert!(is_http_protocol("http2") && !is_http_protocol("HTTPS"));
        assert!(is_tls_protocol("https") && !is_tls_protocol("TCP"));
    }
}
