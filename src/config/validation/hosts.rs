//! Hostname rules: FQDNs, wildcard hosts, `namespace/host` references and how hosts overlap.

use super::addresses::is_ip;

/// Longest hostname Istio accepts.
const MAX_HOST_LEN: usize = 255;

/// Longest DNS label.
const MAX_LABEL_LEN: usize = 63;

/// Whether `label` is a DNS-1123 label as Istio checks it (letters of either case, digits and '-').
pub(super) fn is_dns_label(label: &str) -> bool {
    let bytes = label.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            bytes.len() <= MAX_LABEL_LEN
                && first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-')
        }
        _ => false,
    }
}

/// Whether `label` may start a wildcard host: `*`, or a DNS label with a leading `*` or `*-`.
fn is_wildcard_label(label: &str) -> bool {
    if label == "*" {
        return true;
    }
    let rest = label.strip_prefix("*-").or_else(|| label.strip_prefix('*')).unwrap_or(label);
    label.len() <= MAX_LABEL_LEN && is_dns_label(rest)
}

/// Checks that a hostname is neither empty nor too long.
fn check_length(host: &str) -> Result<(), String> {
    if host.is_empty() {
        Err("empty domain name not allowed".into())
    } else if host.len() > MAX_HOST_LEN {
        Err(format!("domain name {host:?} too long (max {MAX_HOST_LEN})"))
    } else {
        Ok(())
    }
}

/// Checks the dot-separated labels `labels` of `host`: DNS labels, a trailing dot allowed, no numeric TLD.
fn check_labels(host: &str, labels: &str) -> Result<(), String> {
    let parts: Vec<&str> = labels.split('.').collect();
    let tld = parts.last().copied().unwrap_or_default();
    if !tld.is_empty() && tld.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("domain name {host:?} invalid (top level domain {tld:?} cannot be all-numeric)"));
    }
    for (i, label) in parts.iter().enumerate() {
        let trailing_dot = i == parts.len() - 1 && label.is_empty();
        if !trailing_dot && !is_dns_label(label) {
            return Err(format!("domain name {host:?} invalid (label {label:?} invalid)"));
        }
    }
    Ok(())
}

/// Checks a hostname without wildcards; short names (`reviews`) are allowed.
pub(super) fn check_fqdn(host: &str) -> Result<(), String> {
    check_length(host)?;
    check_labels(host, host)
}

/// Checks a hostname whose first label may be a wildcard (`*`, `*.example.com`, `*foo.example.com`).
pub(super) fn check_wildcard_host(host: &str) -> Result<(), String> {
    check_length(host)?;
    let (first, rest) = match host.split_once('.') {
        Some((first, rest)) => (first, Some(rest)),
        None => (host, None),
    };
    if !is_wildcard_label(first) {
        return Err(format!("domain name {host:?} invalid (label {first:?} invalid)"));
    }
    rest.map_or(Ok(()), |rest| check_labels(host, rest))
}

/// Checks that a wildcard, if any, is the whole host or its whole first label.
pub(super) fn check_no_partial_wildcard(host: &str) -> Result<(), String> {
    if host.contains('*') && host != "*" && !host.starts_with("*.") {
        Err(format!("partial wildcard {host:?} not allowed"))
    } else {
        Ok(())
    }
}

/// Where a `namespace/host` reference is written; gateways and sidecars accept slightly different forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HostScope {
    /// A Gateway server's `hosts` (the namespace part is optional, IPs are allowed).
    Gateway,
    /// A Sidecar egress listener's `hosts`.
    Sidecar,
}

/// Checks a `namespace/dnsName` host reference of a Gateway server or a Sidecar egress listener.
pub(super) fn check_namespaced_host(value: &str, scope: HostScope) -> Result<(), String> {
    let Some((namespace, host)) = value.split_once('/') else {
        return match scope {
            HostScope::Gateway => check_host_part(value, scope),
            HostScope::Sidecar => Err("host must be of form namespace/dnsName".into()),
        };
    };
    if namespace.is_empty() || host.is_empty() {
        return Err("config namespace and dnsName in host entry cannot be empty".into());
    }
    let special = match scope {
        HostScope::Gateway => matches!(namespace, "*" | "."),
        HostScope::Sidecar => matches!(namespace, "*" | "." | "~"),
    };
    if !special && !is_dns_label(namespace) {
        let kind = if scope == HostScope::Gateway { "gateway" } else { "sidecar" };
        return Err(format!("invalid namespace value {namespace:?} in {kind}"));
    }
    check_host_part(host, scope)
}

/// Checks the host part of a `namespace/host` reference: an FQDN or `*`-prefixed FQDN (or, in gateways, an IP).
fn check_host_part(host: &str, scope: HostScope) -> Result<(), String> {
    if host != "*" && !host.contains('.') {
        return Err(format!("short names (non FQDN) are not allowed: {host:?}"));
    }
    if let Err(e) = check_wildcard_host(host) {
        if scope == HostScope::Sidecar || !is_ip(host) {
            return Err(e);
        }
    }
    check_no_partial_wildcard(host)
}

/// Whether some name is matched by both `a` and `b` (either may be a wildcard), as Istio decides host overlap.
pub(super) fn hosts_overlap(a: &str, b: &str) -> bool {
    match (a.strip_prefix('*'), b.strip_prefix('*')) {
        (Some(a_suffix), Some(b_suffix)) => a_suffix.ends_with(b_suffix) || b_suffix.ends_with(a_suffix),
        (Some(a_suffix), None) => b.ends_with(a_suffix),
        (None, Some(b_suffix)) => a.ends_with(b_suffix),
        (None, None) => a == b,
    }
}

/// Whether every name matched by `narrow` is also matched by `wide`.
pub(super) fn host_within(narrow: &str, wide: &str) -> bool {
    match (narrow.strip_prefix('*'), wide.strip_prefix('*')) {
        (Some(narrow_suffix), Some(wide_suffix)) => narrow_suffix.ends_with(wide_suffix),
        (Some(_), None) => false,
        (None, Some(wide_suffix)) => narrow.ends_with(wide_suffix),
        (None, None) => narrow == wide,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels_allow_either_case_but_not_edge_dashes() {
        assert!(is_dns_label("Foo-1"));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label("a-"));
        assert!(!is_dns_label(""));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(!is_dns_label("a_b"));
    }

    #[test]
    fn fqdns_allow_short_names_and_trailing_dots() {
        assert!(check_fqdn("reviews").is_ok());
        assert!(check_fqdn("istio.io.").is_ok());
        assert!(check_fqdn("a.b.svc.cluster.local").is_ok());
        assert_eq!(check_fqdn("").unwrap_err(), "empty domain name not allowed");
        assert!(check_fqdn(&"a.".repeat(130)).unwrap_err().contains("too long"));
        assert!(check_fqdn("a..b").unwrap_err().contains("label \"\" invalid"));
        assert!(check_fqdn("1.2.3.4").unwrap_err().contains("cannot be all-numeric"));
        assert!(check_fqdn("*.example.com").is_err());
    }

    #[test]
    fn wildcards_are_allowed_only_in_the_first_label() {
        for ok in ["*", "*.example.com", "*foo.example.com", "*-foo.example.com", "*x", "example.com"] {
            assert!(check_wildcard_host(ok).is_ok(), "{ok}");
        }
        for bad in ["foo*", "foo.*.com", "**", "a.*", "*.1"] {
            assert!(check_wildcard_host(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn partial_wildcards_are_rejected() {
        assert!(check_no_partial_wildcard("*").is_ok());
        assert!(check_no_partial_wildcard("*.a.com").is_ok());
        assert!(check_no_partial_wildcard("*a.com").unwrap_err().contains("partial wildcard"));
    }

    #[test]
    fn sidecar_hosts_need_a_namespace() {
        let s = HostScope::Sidecar;
        assert!(check_namespaced_host("abc/*", s).is_ok());
        assert!(check_namespaced_host("~/*", s).is_ok());
        assert!(check_namespaced_host("./foo.com", s).is_ok());
        assert!(check_namespaced_host("*/*.foo.com", s).is_ok());
        assert_eq!(check_namespaced_host("foo.com", s).unwrap_err(), "host must be of form namespace/dnsName");
        assert!(check_namespaced_host("/foo.com", s).unwrap_err().contains("cannot be empty"));
        assert!(check_namespaced_host("a_b/foo.com", s).unwrap_err().contains("invalid namespace value"));
        assert!(check_namespaced_host("ns/foo", s).unwrap_err().contains("short names"));
        assert!(check_namespaced_host("ns/*foo.com", s).unwrap_err().contains("partial wildcard"));
        assert!(check_namespaced_host("ns/1.2.3.4", s).is_err());
    }

    #[test]
    fn gateway_hosts_may_omit_the_namespace_and_use_ips() {
        let g = HostScope::Gateway;
        assert!(check_namespaced_host("foo.com", g).is_ok());
        assert!(check_namespaced_host("*", g).is_ok());
        assert!(check_namespaced_host("ns/1.2.3.4", g).is_ok());
        assert!(check_namespaced_host("~/foo.com", g).unwrap_err().contains("invalid namespace value"));
        assert!(check_namespaced_host("foo", g).unwrap_err().contains("short names"));
    }

    #[test]
    fn overlap_and_containment_follow_wildcards() {
        assert!(hosts_overlap("*.foo.com", "*.com"));
        assert!(hosts_overlap("a.foo.com", "*.foo.com"));
        assert!(hosts_overlap("a.com", "a.com"));
        assert!(!hosts_overlap("a.com", "b.com"));
        assert!(host_within("a.foo.com", "*.foo.com"));
        assert!(host_within("*.a.foo.com", "*.foo.com"));
        assert!(!host_within("*.foo.com", "a.foo.com"));
        assert!(!host_within("b.com", "a.com"));
    }
}
