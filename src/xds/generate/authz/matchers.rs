//! Istio attribute values as Envoy matchers: `*` wildcards, SPIFFE identities, JWT claims in the
//! dynamic metadata `jwt_authn` writes.

use envoy_types::pb::envoy::config::core::v3::CidrRange;
use envoy_types::pb::envoy::config::rbac::v3::{principal, Principal, SourcedMetadata};
use envoy_types::pb::envoy::config::route::v3::{header_matcher::HeaderMatchSpecifier, HeaderMatcher};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    list_matcher, metadata_matcher::path_segment::Segment, metadata_matcher::PathSegment, string_matcher::MatchPattern,
    value_matcher, ListMatcher, MetadataMatcher, OrMatcher, RegexMatcher, StringMatcher, ValueMatcher,
};

use super::JWT_AUTHN;
use crate::xds::generate::proto::u32_value;

/// The key under which `jwt_authn` writes a verified token's payload into dynamic metadata.
pub(super) const PAYLOAD_KEY: &str = "payload";

/// The URI scheme of SPIFFE identities (peer certificate URI SANs).
pub(super) const SPIFFE: &str = "spiffe://";

/// Istio's reading of a value with at most one `*` at either end: `*` is any non-empty value,
/// `a*` a prefix, `*a` a suffix, anything else exact.
pub(super) fn wildcard(value: &str) -> StringMatcher {
    let pattern = if value == "*" {
        MatchPattern::SafeRegex(regex(".+"))
    } else if let Some(prefix) = value.strip_suffix('*') {
        MatchPattern::Prefix(prefix.to_string())
    } else if let Some(suffix) = value.strip_prefix('*') {
        MatchPattern::Suffix(suffix.to_string())
    } else {
        MatchPattern::Exact(value.to_string())
    };
    StringMatcher { match_pattern: Some(pattern), ignore_case: false }
}

/// A RE2 regex matcher (full match).
pub(super) fn regex(pattern: &str) -> RegexMatcher {
    RegexMatcher { regex: pattern.to_string(), engine_type: None }
}

/// A string matcher from a regex.
pub(super) fn regex_matcher(pattern: &str) -> StringMatcher {
    StringMatcher { match_pattern: Some(MatchPattern::SafeRegex(regex(pattern))), ignore_case: false }
}

/// Escapes RE2 metacharacters.
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A header matcher.
pub(super) fn header(name: &str, matcher: StringMatcher) -> HeaderMatcher {
    HeaderMatcher {
        name: name.to_string(),
        header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(matcher)),
        ..Default::default()
    }
}

/// An address or CIDR block (validated earlier; a bare address is a full-length prefix).
pub(super) fn cidr(value: &str) -> Option<CidrRange> {
    let (ip, len) = match value.split_once('/') {
        Some((ip, len)) => (ip, Some(len.parse::<u32>().ok()?)),
        None => (value, None),
    };
    let parsed: std::net::IpAddr = ip.parse().ok()?;
    let max = if parsed.is_ipv4() { 32 } else { 128 };
    Some(CidrRange { address_prefix: ip.to_string(), prefix_len: Some(u32_value(len.unwrap_or(max).min(max))) })
}

/// A principal matching the peer certificate's URI SAN.
pub(super) fn peer_identity(matcher: StringMatcher) -> Principal {
    Principal {
        identifier: Some(principal::Identifier::Authenticated(principal::Authenticated {
            principal_name: Some(matcher),
        })),
    }
}

/// The SPIFFE id matcher for an Istio principal (`TD/ns/NS/sa/SA`, `*` at either end).
pub(super) fn spiffe_principal(value: &str) -> StringMatcher {
    if value == "*" {
        return wildcard("*");
    }
    match value.strip_prefix('*') {
        // A suffix does not see the scheme.
        Some(suffix) => wildcard(&format!("*{suffix}")),
        None => wildcard(&format!("{SPIFFE}{value}")),
    }
}

/// A regex segment for a namespace, service account or trust domain value with `*` at one end.
fn segment_regex(value: &str) -> String {
    if value == "*" {
        "[^/]+".to_string()
    } else if let Some(prefix) = value.strip_suffix('*') {
        format!("{}[^/]*", escape(prefix))
    } else if let Some(suffix) = value.strip_prefix('*') {
        format!("[^/]*{}", escape(suffix))
    } else {
        escape(value)
    }
}

/// Peers of namespace `value` (`*` at either end): `spiffe://TD/ns/NS/...`.
pub(super) fn spiffe_namespace(value: &str) -> StringMatcher {
    regex_matcher(&format!("spiffe://[^/]+/ns/{}/.*", segment_regex(value)))
}

/// Peers of service account `value` (`SA` in `policy_namespace`, or `NS/SA`).
pub(super) fn spiffe_service_account(value: &str, policy_namespace: &str) -> StringMatcher {
    let (ns, sa) = value.split_once('/').unwrap_or((policy_namespace, value));
    regex_matcher(&format!("spiffe://[^/]+/ns/{}/sa/{}", escape(ns), escape(sa)))
}

/// Peers of trust domain `value` (`*` at either end).
pub(super) fn spiffe_trust_domain(value: &str) -> StringMatcher {
    regex_matcher(&format!("spiffe://{}/.*", segment_regex(value)))
}

/// A principal reading the verified JWT payload at `path` (below [`PAYLOAD_KEY`]).
pub(super) fn payload(path: &[&str], value: ValueMatcher) -> Principal {
    let mut segments = vec![PAYLOAD_KEY];
    segments.extend_from_slice(path);
    Principal {
        identifier: Some(principal::Identifier::SourcedMetadata(SourcedMetadata {
            metadata_matcher: Some(metadata(JWT_AUTHN, &segments, value)),
            metadata_source: 0,
        })),
    }
}

/// A dynamic metadata matcher of `filter` at `path`.
pub(super) fn metadata(filter: &str, path: &[&str], value: ValueMatcher) -> MetadataMatcher {
    MetadataMatcher {
        filter: filter.to_string(),
        path: path.iter().map(|k| PathSegment { segment: Some(Segment::Key(k.to_string())) }).collect(),
        value: Some(value),
        invert: false,
    }
}

/// A value matcher for a string.
pub(super) fn string_value(matcher: StringMatcher) -> ValueMatcher {
    ValueMatcher { match_pattern: Some(value_matcher::MatchPattern::StringMatch(matcher)) }
}

/// A value matcher for a present value.
pub(super) fn present() -> ValueMatcher {
    ValueMatcher { match_pattern: Some(value_matcher::MatchPattern::PresentMatch(true)) }
}

/// A claim is a string or a list of strings: either matches.
pub(super) fn string_or_list(matcher: StringMatcher) -> ValueMatcher {
    let one = string_value(matcher);
    let list = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(ListMatcher {
            match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(one.clone()))),
        }))),
    };
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher { value_matchers: vec![one, list] })),
    }
}

/// `iss/sub` principals matched against a payload's separate `iss` and `sub` claims. Where the
/// `/` falls is unknown (issuers contain `/`), so every split is tried: the alternatives are exact.
pub(super) fn request_principal(value: &str) -> Principal {
    let iss_sub = |iss: StringMatcher, sub: StringMatcher| {
        and_ids(vec![payload(&["iss"], string_value(iss)), payload(&["sub"], string_value(sub))])
    };
    let exact = |s: &str| wildcard_exact(s);
    let splits = |text: &str| -> Vec<(String, String)> {
        text.match_indices('/').map(|(i, _)| (text[..i].to_string(), text[i + 1..].to_string())).collect()
    };
    if value == "*" {
        return and_ids(vec![payload(&["iss"], present()), payload(&["sub"], present())]);
    }
    let mut alternatives = Vec::new();
    if let Some(prefix) = value.strip_suffix('*') {
        // "iss/sub" starts with P: the issuer starts with P, or P = ISS/REST and sub starts with REST.
        alternatives
            .push(and_ids(vec![payload(&["iss"], string_value(wildcard(value))), payload(&["sub"], present())]));
        for (iss, rest) in splits(prefix) {
            alternatives.push(iss_sub(exact(&iss), wildcard(&format!("{rest}*"))));
        }
    } else if let Some(suffix) = value.strip_prefix('*') {
        // Ends with S: sub ends with S, or S = REST/SUB and the issuer ends with REST.
        alternatives
            .push(and_ids(vec![payload(&["iss"], present()), payload(&["sub"], string_value(wildcard(value)))]));
        for (rest, sub) in splits(suffix) {
            alternatives.push(iss_sub(wildcard(&format!("*{rest}")), exact(&sub)));
        }
    } else {
        for (iss, sub) in splits(value) {
            alternatives.push(iss_sub(exact(&iss), exact(&sub)));
        }
    }
    match alternatives.len() {
        // No `/`: no token's principal can match.
        0 => not_id(any_id()),
        1 => alternatives.remove(0),
        _ => or_ids(alternatives),
    }
}

fn wildcard_exact(value: &str) -> StringMatcher {
    StringMatcher { match_pattern: Some(MatchPattern::Exact(value.to_string())), ignore_case: false }
}

/// Matches any principal.
pub(super) fn any_id() -> Principal {
    Principal { identifier: Some(principal::Identifier::Any(true)) }
}

/// Negates a principal.
pub(super) fn not_id(p: Principal) -> Principal {
    Principal { identifier: Some(principal::Identifier::NotId(Box::new(p))) }
}

/// All of `ids`.
pub(super) fn and_ids(ids: Vec<Principal>) -> Principal {
    Principal { identifier: Some(principal::Identifier::AndIds(principal::Set { ids })) }
}

/// Any of `ids`.
pub(super) fn or_ids(ids: Vec<Principal>) -> Principal {
    Principal { identifier: Some(principal::Identifier::OrIds(principal::Set { ids })) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(m: &StringMatcher) -> String {
        match &m.match_pattern {
            Some(MatchPattern::Exact(v)) => format!("exact:{v}"),
            Some(MatchPattern::Prefix(v)) => format!("prefix:{v}"),
            Some(MatchPattern::Suffix(v)) => format!("suffix:{v}"),
            Some(MatchPattern::SafeRegex(r)) => format!("regex:{}", r.regex),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn wildcards_follow_istio() {
        assert_eq!(pattern(&wildcard("*")), "regex:.+");
        assert_eq!(pattern(&wildcard("/api/*")), "prefix:/api/");
        assert_eq!(pattern(&wildcard("*.html")), "suffix:.html");
        assert_eq!(pattern(&wildcard("/a")), "exact:/a");
    }

    #[test]
    fn principals_are_spiffe_ids() {
        assert_eq!(
            pattern(&spiffe_principal("cluster.local/ns/default/sa/sleep")),
            "exact:spiffe://cluster.local/ns/default/sa/sleep"
        );
        assert_eq!(
            pattern(&spiffe_principal("cluster.local/ns/default/*")),
            "prefix:spiffe://cluster.local/ns/default/"
        );
        assert_eq!(pattern(&spiffe_principal("*/sa/sleep")), "suffix:/sa/sleep");
        assert_eq!(pattern(&spiffe_principal("*")), "regex:.+");
        assert_eq!(pattern(&spiffe_namespace("default")), "regex:spiffe://[^/]+/ns/default/.*");
        assert_eq!(pattern(&spiffe_namespace("dev-*")), "regex:spiffe://[^/]+/ns/dev-[^/]*/.*");
        assert_eq!(pattern(&spiffe_service_account("sleep", "shop")), "regex:spiffe://[^/]+/ns/shop/sa/sleep");
        assert_eq!(pattern(&spiffe_service_account("a/b", "shop")), "regex:spiffe://[^/]+/ns/a/sa/b");
        assert_eq!(pattern(&spiffe_trust_domain("example.org")), "regex:spiffe://example\\.org/.*");
    }

    #[test]
    fn request_principals_try_every_split() {
        let text = format!("{:?}", request_principal("https://issuer.example/alice"));
        // Splits at each `/`: "https:" + "/issuer.example/alice", "https:/" + ..., "https://issuer.example" + "alice".
        assert!(text.contains("Exact(\"https://issuer.example\")") && text.contains("Exact(\"alice\")"), "{text}");
        assert_eq!(text.matches("AndIds").count(), 3, "{text}");
        assert!(format!("{:?}", request_principal("nosplit")).contains("NotId"));
        let any = format!("{:?}", request_principal("*"));
        assert!(any.contains("PresentMatch(true)"), "{any}");
    }
}
