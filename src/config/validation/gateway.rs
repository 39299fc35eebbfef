//! Gateway rules: servers, their ports, hosts and binds, and server TLS settings.

use std::collections::BTreeSet;

use crate::config::api::gateway::{Server, ServerTlsSettings};
use crate::config::api::{Gateway, Port};

use super::addresses::{check_ip, check_unix_address, UNIX_PREFIX};
use super::field_errors::{duplicate, forbidden, invalid, required, unsupported, Errors};
use super::hosts::{check_namespaced_host, is_dns_label, HostScope};
use super::labels::check_labels;
use super::ports::{check_port, is_http_protocol, is_known_protocol, is_tls_protocol};

/// Server TLS modes.
const TLS_MODES: [&str; 6] = ["PASSTHROUGH", "SIMPLE", "MUTUAL", "AUTO_PASSTHROUGH", "ISTIO_MUTUAL", "OPTIONAL_MUTUAL"];

/// TLS protocol versions.
const TLS_VERSIONS: [&str; 5] = ["TLS_AUTO", "TLSV1_0", "TLSV1_1", "TLSV1_2", "TLSV1_3"];

/// Most certificates a server may name.
const MAX_CERTIFICATES: usize = 2;

/// Checks a Gateway named `name`.
pub(super) fn validate(gateway: &Gateway, name: &str, errors: &mut Errors) {
    // The name becomes part of listener and route names, which use dots as separators.
    if !is_dns_label(name) {
        errors.add("metadata.name", invalid(name, "invalid gateway name: must be a DNS-1123 label (no dots)"));
    }
    check_labels(errors, "spec.selector", &gateway.selector);
    if gateway.servers.is_empty() {
        errors.add("spec.servers", required("gateway must have at least one server"));
    }
    let mut port_names = BTreeSet::new();
    for (i, server) in gateway.servers.iter().enumerate() {
        let path = format!("spec.servers[{i}]");
        check_server(errors, &path, server);
        let name = server.port.as_ref().map_or("", |p| p.name.as_str());
        if !name.is_empty() && !port_names.insert(name) {
            errors.add(format!("{path}.port.name"), duplicate(name, "port names in servers must be unique"));
        }
    }
}

/// Checks one server at `path` (`spec.servers[i]`).
fn check_server(errors: &mut Errors, path: &str, server: &Server) {
    if server.hosts.is_empty() {
        errors.add(format!("{path}.hosts"), required("server config must contain at least one host"));
    }
    for (k, host) in server.hosts.iter().enumerate() {
        let result = check_namespaced_host(host, HostScope::Gateway).map_err(|e| invalid(host, e));
        errors.check(format!("{path}.hosts[{k}]"), result);
    }
    let port_ok = match &server.port {
        None => {
            errors.add(format!("{path}.port"), required("port is required"));
            false
        }
        Some(port) => check_server_port(errors, &format!("{path}.port"), port, &server.bind),
    };
    check_bind(errors, path, server);
    if let Some(tls) = &server.tls {
        check_server_tls(errors, &format!("{path}.tls"), tls);
    }
    if let Some(port) = server.port.as_ref().filter(|_| port_ok) {
        check_protocol_tls(errors, path, &port.protocol, server.tls.as_ref());
    }
}

/// Checks a server port at `path`; returns whether it is valid.
fn check_server_port(errors: &mut Errors, path: &str, port: &Port, bind: &str) -> bool {
    let before = errors.found.len();
    if port.protocol.is_empty() {
        errors.add(format!("{path}.protocol"), required("protocol is required"));
    } else if !is_known_protocol(&port.protocol) {
        let reason = "invalid protocol, supported protocols are HTTP, HTTPS, HTTP2, GRPC, GRPC-WEB, TCP, TLS, MONGO, REDIS, MYSQL";
        errors.add(format!("{path}.protocol"), invalid(&port.protocol, reason));
    }
    // A unix socket server listens on no port.
    if port.number > 0 || !bind.starts_with(UNIX_PREFIX) {
        errors.check(format!("{path}.number"), check_port(port.number));
    }
    if port.target_port.is_some_and(|t| t > 0) {
        errors.add(format!("{path}.targetPort"), forbidden("targetPort has no impact on Gateways"));
    }
    if port.name.is_empty() {
        errors.add(format!("{path}.name"), required("port name must be set"));
    }
    errors.found.len() == before
}

/// Checks a server's bind address: an IP, or a unix socket with port number 0.
fn check_bind(errors: &mut Errors, path: &str, server: &Server) {
    let bind = server.bind.as_str();
    if bind.starts_with(UNIX_PREFIX) {
        errors.check(format!("{path}.bind"), check_unix_address(bind).map_err(|e| invalid(bind, e)));
        if let Some(number) = server.port.as_ref().map(|p| p.number).filter(|n| *n != 0) {
            errors.add(format!("{path}.port.number"), invalid(number, "port number must be 0 for unix domain socket"));
        }
    } else if !bind.is_empty() {
        errors.check(format!("{path}.bind"), check_ip(bind).map_err(|e| invalid(bind, e)));
    }
}

/// Checks that HTTPS/TLS servers have TLS settings and plain-text ones do not (HTTP may only redirect).
fn check_protocol_tls(errors: &mut Errors, path: &str, protocol: &str, tls: Option<&ServerTlsSettings>) {
    match tls {
        None if is_tls_protocol(protocol) => {
            errors.add(format!("{path}.tls"), required("server must have TLS settings for HTTPS/TLS protocols"));
        }
        Some(tls) if !is_tls_protocol(protocol) => {
            let passthrough = matches!(tls.mode.as_deref(), None | Some("PASSTHROUGH" | "AUTO_PASSTHROUGH"));
            let has_files =
                !tls.ca_certificates.is_empty() || !tls.private_key.is_empty() || !tls.server_certificate.is_empty();
            if !is_http_protocol(protocol) {
                errors.add(format!("{path}.tls"), forbidden("server cannot have TLS settings for non HTTPS/TLS ports"));
            } else if !passthrough || has_files {
                errors
                    .add(format!("{path}.tls"), forbidden("server cannot have TLS settings for plain text HTTP ports"));
            }
        }
        _ => {}
    }
}

/// Checks server TLS settings at `path` (`...tls`), for Gateways and Sidecar ingress listeners.
pub(super) fn check_server_tls(errors: &mut Errors, path: &str, tls: &ServerTlsSettings) {
    if let Some(mode) = tls.mode.as_deref().filter(|m| !TLS_MODES.contains(m)) {
        errors.add(format!("{path}.mode"), unsupported(mode, &TLS_MODES));
    }
    for (name, version) in
        [("minProtocolVersion", &tls.min_protocol_version), ("maxProtocolVersion", &tls.max_protocol_version)]
    {
        if let Some(version) = version.as_deref().filter(|v| !TLS_VERSIONS.contains(v)) {
            errors.add(format!("{path}.{name}"), unsupported(version, &TLS_VERSIONS));
        }
    }
    check_credential_sources(errors, path, tls);
    let mode = tls.mode.as_deref().unwrap_or("PASSTHROUGH");
    if mode == "ISTIO_MUTUAL" {
        let files = [
            ("serverCertificate", &tls.server_certificate, "server certificate"),
            ("privateKey", &tls.private_key, "private key"),
            ("caCertificates", &tls.ca_certificates, "CA bundle"),
            ("credentialName", &tls.credential_name, "credentialName"),
        ];
        for (name, _, what) in files.iter().filter(|(_, value, _)| !value.is_empty()) {
            errors.add(format!("{path}.{name}"), forbidden(format!("ISTIO_MUTUAL TLS cannot have associated {what}")));
        }
        return;
    }
    let has_credential =
        !tls.credential_name.is_empty() || !tls.credential_names.is_empty() || !tls.tls_certificates.is_empty();
    let terminates = matches!(mode, "SIMPLE" | "MUTUAL" | "OPTIONAL_MUTUAL");
    // Credentials fetched from a secret carry the certificate, key and CA themselves.
    if terminates && has_credential {
        return;
    }
    if terminates {
        let label = if mode == "SIMPLE" { "SIMPLE" } else { "MUTUAL" };
        if tls.server_certificate.is_empty() {
            errors.add(
                format!("{path}.serverCertificate"),
                required(format!("{label} TLS requires a server certificate")),
            );
        }
        if tls.private_key.is_empty() {
            errors.add(format!("{path}.privateKey"), required(format!("{label} TLS requires a private key")));
        }
        if mode != "SIMPLE" && tls.ca_certificates.is_empty() {
            errors.add(format!("{path}.caCertificates"), required("MUTUAL TLS requires a client CA bundle"));
        }
    }
    if !tls.ca_crl.is_empty() {
        if !tls.credential_name.is_empty() {
            let reason = "CRL is not supported with credentialName. CRL has to be specified in the credential";
            errors.add(format!("{path}.caCrl"), forbidden(reason));
        }
        if mode == "SIMPLE" {
            errors.add(format!("{path}.caCrl"), forbidden("CRL is not supported with SIMPLE TLS"));
        }
    }
}

/// Checks that certificates come from one source: `credentialName`, `credentialNames` or `tlsCertificates`.
fn check_credential_sources(errors: &mut Errors, path: &str, tls: &ServerTlsSettings) {
    let sources = [!tls.credential_name.is_empty(), !tls.credential_names.is_empty(), !tls.tls_certificates.is_empty()];
    if sources.iter().filter(|set| **set).count() > 1 {
        errors.add(path, forbidden("only one of credentialName, credentialNames or tlsCertificates can be set"));
    }
    for (name, count) in
        [("credentialNames", tls.credential_names.len()), ("tlsCertificates", tls.tls_certificates.len())]
    {
        if count > MAX_CERTIFICATES {
            errors.add(format!("{path}.{name}"), invalid(count, format!("must have at most {MAX_CERTIFICATES} items")));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::validation::testing::{assert_error, assert_valid, document, first_error_of};

    const GW: &str = "Gateway";

    fn server(s: &str) -> String {
        format!("selector: {{istio: ingressgateway}}\nservers:\n- {s}")
    }

    fn err(s: &str, field: &str, reason: &str) {
        assert_error(GW, &server(s), field, reason);
    }

    fn ok(s: &str) {
        assert_valid(GW, &server(s));
    }

    #[test]
    fn typical_servers_are_valid() {
        ok("{port: {number: 80, name: http, protocol: HTTP}, hosts: [\"*\"], tls: {httpsRedirect: true}}");
        ok("{port: {number: 443, name: https, protocol: HTTPS}, hosts: [ns/a.com], tls: {mode: SIMPLE, credentialName: cert}}");
        ok("{port: {number: 443, name: tls, protocol: TLS}, hosts: [\"*/*.a.com\"], tls: {mode: PASSTHROUGH}}");
        ok("{port: {number: 15443, name: tls, protocol: TLS}, hosts: [\"*.local\"], tls: {mode: AUTO_PASSTHROUGH}}");
        ok("{port: {number: 8080, name: http, protocol: HTTP}, hosts: [10.0.0.1], bind: 127.0.0.1}");
        ok("{port: {number: 0, name: uds, protocol: HTTP}, hosts: [a.com], bind: \"unix:///var/run/gw.sock\"}");
        ok("{port: {number: 443, name: m, protocol: HTTPS}, hosts: [a.com], tls: {mode: MUTUAL, serverCertificate: /c, privateKey: /k, caCertificates: /ca}}");
    }

    #[test]
    fn gateway_names_have_no_dots() {
        let text = document(GW, "my.gw", &server("{port: {number: 80, name: http, protocol: HTTP}, hosts: [\"*\"]}"));
        let e = first_error_of(&text).unwrap();
        assert_eq!(e.field, "metadata.name");
        assert!(e.reason.contains("invalid gateway name"), "{e}");
    }

    #[test]
    fn servers_are_required() {
        assert_error(GW, "selector: {app: gw}", "spec.servers", "at least one server");
        assert_error(GW, "selector: {\"a b\": gw}\nservers: []", "spec.selector[a b]", "label key");
    }

    #[test]
    fn hosts_are_required_and_valid() {
        err("{port: {number: 80, name: http, protocol: HTTP}}", "spec.servers[0].hosts", "at least one host");
        err(
            "{port: {number: 80, name: http, protocol: HTTP}, hosts: [foo]}",
            "spec.servers[0].hosts[0]",
            "short names",
        );
        err(
            "{port: {number: 80, name: http, protocol: HTTP}, hosts: [\"Bad_NS/a.com\"]}",
            "spec.servers[0].hosts[0]",
            "invalid namespace",
        );
        err(
            "{port: {number: 80, name: http, protocol: HTTP}, hosts: [\"*a.com\"]}",
            "spec.servers[0].hosts[0]",
            "partial wildcard",
        );
    }

    #[test]
    fn ports_are_required_and_complete() {
        err("{hosts: [a.com]}", "spec.servers[0].port", "port is required");
        err(
            "{port: {number: 70000, name: http, protocol: HTTP}, hosts: [a.com]}",
            "spec.servers[0].port.number",
            "1-65535",
        );
        err(
            "{port: {number: 80, name: http, protocol: FTP}, hosts: [a.com]}",
            "spec.servers[0].port.protocol",
            "invalid protocol",
        );
        err("{port: {number: 80, name: http}, hosts: [a.com]}", "spec.servers[0].port.protocol", "Required value");
        err(
            "{port: {number: 80, protocol: HTTP}, hosts: [a.com]}",
            "spec.servers[0].port.name",
            "port name must be set",
        );
        err(
            "{port: {number: 80, name: h, protocol: HTTP, targetPort: 8080}, hosts: [a.com]}",
            "spec.servers[0].port.targetPort",
            "no impact",
        );
    }

    #[test]
    fn port_names_are_unique_across_servers() {
        let s = "{port: {number: 80, name: http, protocol: HTTP}, hosts: [a.com]}\n- {port: {number: 81, name: http, protocol: HTTP}, hosts: [b.com]}";
        err(s, "spec.servers[1].port.name", "port names in servers must be unique");
    }

    #[test]
    fn binds_are_ips_or_unix_sockets() {
        err(
            "{port: {number: 80, name: h, protocol: HTTP}, hosts: [a.com], bind: localhost}",
            "spec.servers[0].bind",
            "not a valid IP",
        );
        err(
            "{port: {number: 80, name: h, protocol: HTTP}, hosts: [a.com], bind: \"unix:///s\"}",
            "spec.servers[0].port.number",
            "must be 0 for unix domain socket",
        );
        err(
            "{port: {number: 0, name: h, protocol: HTTP}, hosts: [a.com], bind: \"unix://s\"}",
            "spec.servers[0].bind",
            "UDS must be an absolute path",
        );
    }

    #[test]
    fn tls_matches_the_protocol() {
        err(
            "{port: {number: 443, name: h, protocol: HTTPS}, hosts: [a.com]}",
            "spec.servers[0].tls",
            "must have TLS settings",
        );
        err(
            "{port: {number: 80, name: h, protocol: HTTP}, hosts: [a.com], tls: {mode: SIMPLE, credentialName: c}}",
            "spec.servers[0].tls",
            "plain text HTTP ports",
        );
        err(
            "{port: {number: 80, name: h, protocol: HTTP}, hosts: [a.com], tls: {httpsRedirect: true, privateKey: /k}}",
            "spec.servers[0].tls",
            "plain text HTTP ports",
        );
        err(
            "{port: {number: 9000, name: t, protocol: TCP}, hosts: [a.com], tls: {mode: SIMPLE, credentialName: c}}",
            "spec.servers[0].tls",
            "non HTTPS/TLS ports",
        );
    }

    #[test]
    fn tls_settings_are_checked() {
        let https =
            |tls: &str| format!("{{port: {{number: 443, name: h, protocol: HTTPS}}, hosts: [a.com], tls: {tls}}}");
        let path = "spec.servers[0].tls";
        err(
            &https("{mode: SIMPLE, privateKey: /k}"),
            &format!("{path}.serverCertificate"),
            "SIMPLE TLS requires a server certificate",
        );
        err(
            &https("{mode: SIMPLE, serverCertificate: /c}"),
            &format!("{path}.privateKey"),
            "SIMPLE TLS requires a private key",
        );
        err(
            &https("{mode: MUTUAL, serverCertificate: /c, privateKey: /k}"),
            &format!("{path}.caCertificates"),
            "client CA bundle",
        );
        err(
            &https("{mode: ISTIO_MUTUAL, serverCertificate: /c}"),
            &format!("{path}.serverCertificate"),
            "ISTIO_MUTUAL TLS cannot have",
        );
        err(
            &https("{mode: ISTIO_MUTUAL, credentialName: c}"),
            &format!("{path}.credentialName"),
            "ISTIO_MUTUAL TLS cannot have",
        );
        err(&https("{mode: SOMETIMES}"), &format!("{path}.mode"), "Unsupported value");
        err(
            &https("{mode: SIMPLE, credentialName: c, minProtocolVersion: TLSV9}"),
            &format!("{path}.minProtocolVersion"),
            "Unsupported value",
        );
        err(&https("{mode: SIMPLE, credentialName: c, credentialNames: [d]}"), path, "only one of credentialName");
        err(&https("{mode: SIMPLE, credentialNames: [a, b, c]}"), &format!("{path}.credentialNames"), "at most 2");
        err(
            &https("{mode: SIMPLE, serverCertificate: /c, privateKey: /k, caCrl: /crl}"),
            &format!("{path}.caCrl"),
            "not supported with SIMPLE",
        );
        err(
            &https("{mode: PASSTHROUGH, credentialName: c, caCrl: /crl}"),
            &format!("{path}.caCrl"),
            "not supported with credentialName",
        );
    }
}
