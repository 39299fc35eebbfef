//! Istio attribute values as Envoy matchers: `*` wildcards, SPIFFE identities, JWT claims in the
//! dynamic metadata `jwt_authn` writes.

use envoy_types::pb::envoy::config::core::v3::CidrRange;
use envoy_types::pb::envoy::config::rbac::v3::{principal, Principal};
use envoy_types::pb::envoy::config::route::v3::{header_matcher::HeaderMatchSpecifier, HeaderMatcher};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    list_matcher, metadata_matcher::path_segment::Segment, metadata_matcher::PathSegment, string_matcher::MatchPattern,
    value_matcher, ListMatcher, MetadataMatcher, OrMatcher, RegexMatcher, StringMatcher, ValueMatcher,
};

use crate::envoy::names::ext::JWT_AUTHN;
use crate::envoy::proto::u32_value;

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

/// Istio's header matcher for a value with `*` wildcards: `*` alone is presence (empty values
/// included), otherwise as [`wildcard`].
pub(super) fn header(name: &str, value: &str, ignore_case: bool) -> HeaderMatcher {
    let specifier = if value == "*" {
        HeaderMatchSpecifier::PresentMatch(true)
    } else {
        let mut m = wildcard(value);
        m.ignore_case = ignore_case;
        HeaderMatchSpecifier::StringMatch(m)
    };
    HeaderMatcher { name: name.to_string(), header_match_specifier: Some(specifier), ..Default::default() }
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

/// The SPIFFE id matcher for an Istio principal (`TD/ns/NS/sa/SA`, `*` at either end), as
/// Istio's `StringMatcherWithPrefix` builds it.
pub(super) fn spiffe_principal(value: &str) -> StringMatcher {
    if value == "*" {
        return wildcard("*");
    }
    match value.strip_prefix('*') {
        Some(suffix) => regex_matcher(&format!("{SPIFFE}.*{}", escape(suffix))),
        None => wildcard(&format!("{SPIFFE}{value}")),
    }
}

/// Peers of namespace `value` (each `*` any text): Istio's `.*/ns/NS/.*`.
pub(super) fn spiffe_namespace(value: &str) -> StringMatcher {
    let parts: Vec<String> = value.split('*').map(escape).collect();
    regex_matcher(&format!(".*/ns/{}/.*", parts.join(".*")))
}

/// Peers of service account `value` (`SA` in `policy_namespace`, or `NS/SA`), Istio's regex:
/// other key/value pairs may sit between and after the `ns` and `sa` ones.
pub(super) fn spiffe_service_account(value: &str, policy_namespace: &str) -> StringMatcher {
    let (ns, sa) = value.split_once('/').unwrap_or((policy_namespace, value));
    regex_matcher(&format!("spiffe://.+/ns/{}/(.+/|)sa/{}(/.+)?", escape(ns), escape(sa)))
}

/// Peers of trust domain `value` (`*` at either end).
pub(super) fn spiffe_trust_domain(value: &str) -> StringMatcher {
    if value == "*" {
        return prefix(SPIFFE);
    }
    match value.split_once('*') {
        None => prefix(&format!("{SPIFFE}{value}/")),
        Some((before, after)) => regex_matcher(&format!("spiffe://{}[^/]*{}/.*", escape(before), escape(after))),
    }
}

/// A principal reading the verified JWT payload at `path` (below [`PAYLOAD_KEY`]). The plain
/// `metadata` identifier (request metadata), as istiod writes it, not `sourced_metadata`.
pub(super) fn payload(path: &[&str], value: ValueMatcher) -> Principal {
    let mut segments = vec![PAYLOAD_KEY];
    segments.extend_from_slice(path);
    // Deprecated in Envoy's API for `sourced_metadata`, which reads the same dynamic metadata.
    #[allow(deprecated)]
    let identifier = principal::Identifier::Metadata(metadata(JWT_AUTHN, &segments, value));
    Principal { identifier: Some(identifier) }
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

/// Any of `values`: one matcher alone, several in an `or_match` (as istiod writes it).
pub(super) fn any_value(mut values: Vec<ValueMatcher>) -> ValueMatcher {
    if values.len() == 1 {
        if let Some(one) = values.pop() {
            return one;
        }
    }
    ValueMatcher { match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher { value_matchers: values })) }
}

/// A list holding an element `element` matches.
pub(super) fn list_holding(element: ValueMatcher) -> ValueMatcher {
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(ListMatcher {
            match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(element))),
        }))),
    }
}

/// A claim is a list of strings or a string: either matches (the list first, as istiod writes it).
pub(super) fn string_or_list(value: ValueMatcher) -> ValueMatcher {
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
            value_matchers: vec![list_holding(value.clone()), value],
        })),
    }
}

/// An `iss/sub` principal as Istio matches it against the payload's `iss` and `sub` claims: split
/// at the last `/` (issuers are URLs), `*` at either end widening the side it stands on.
pub(super) fn request_principal(value: &str) -> Principal {
    let any = || regex_matcher(".+");
    let (iss, sub, split) = match value.rfind('/') {
        Some(i) => (&value[..i], &value[i + 1..], true),
        None => (value, "", false),
    };
    let (iss_m, sub_m) = if value == "*" {
        (any(), any())
    } else if let Some(rest) = value.strip_prefix('*') {
        if split {
            let iss_m = if iss == "*" { any() } else { suffix(iss.trim_start_matches('*')) };
            (iss_m, wildcard_exact(sub))
        } else {
            (any(), suffix(rest))
        }
    } else if let Some(rest) = value.strip_suffix('*') {
        if split {
            let sub_m = if sub == "*" { any() } else { prefix(sub.trim_end_matches('*')) };
            (wildcard_exact(iss), sub_m)
        } else {
            (prefix(rest), any())
        }
    } else {
        (wildcard_exact(iss), wildcard_exact(sub))
    };
    and_ids(vec![payload(&["iss"], string_value(iss_m)), payload(&["sub"], string_value(sub_m))])
}

fn prefix(value: &str) -> StringMatcher {
    StringMatcher { match_pattern: Some(MatchPattern::Prefix(value.to_string())), ignore_case: false }
}

fn suffix(value: &str) -> StringMatcher {
    StringMatcher { match_pattern: Some(MatchPattern::Suffix(value.to_string())), ignore_case: false }
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
        assert_eq!(pattern(&spiffe_principal("*/sa/sleep")), "regex:spiffe://.*/sa/sleep");
        assert_eq!(pattern(&spiffe_principal("*")), "regex:.+");
        assert_eq!(pattern(&spiffe_namespace("default")), "regex:.*/ns/default/.*");
        assert_eq!(pattern(&spiffe_namespace("dev-*")), "regex:.*/ns/dev-.*/.*");
        assert_eq!(pattern(&spiffe_service_account("sleep", "shop")), "regex:spiffe://.+/ns/shop/(.+/|)sa/sleep(/.+)?");
        assert_eq!(pattern(&spiffe_service_account("a/b", "shop")), "regex:spiffe://.+/ns/a/(.+/|)sa/b(/.+)?");
        assert_eq!(pattern(&spiffe_trust_domain("example.org")), "prefix:spiffe://example.org/");
        assert_eq!(pattern(&spiffe_trust_domain("*")), "prefix:spiffe://");
        assert_eq!(pattern(&spiffe_trust_domain("*.corp")), "regex:spiffe://[^/]*\\.corp/.*");
    }

    /// (iss matcher, sub matcher) of a request principal.
    fn iss_sub(value: &str) -> (String, String) {
        let Some(principal::Identifier::AndIds(set)) = request_principal(value).identifier else { panic!() };
        let side = |p: &Principal| match &p.identifier {
            #[allow(deprecated)]
            Some(principal::Identifier::Metadata(m)) => match m.value.as_ref().and_then(|v| v.match_pattern.as_ref()) {
                Some(value_matcher::MatchPattern::StringMatch(s)) => pattern(s),
                other => format!("{other:?}"),
            },
            other => format!("{other:?}"),
        };
        (side(&set.ids[0]), side(&set.ids[1]))
    }

    #[test]
    fn request_principals_split_at_the_last_slash_as_istio_does() {
        let s = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(iss_sub("https://issuer.example/alice"), s("exact:https://issuer.example", "exact:alice"));
        assert_eq!(iss_sub("*"), s("regex:.+", "regex:.+"));
        assert_eq!(iss_sub("https://issuer.example/*"), s("exact:https://issuer.example", "regex:.+"));
        assert_eq!(iss_sub("https://issuer.example/a*"), s("exact:https://issuer.example", "prefix:a"));
        assert_eq!(iss_sub("*/alice"), s("regex:.+", "exact:alice"));
        assert_eq!(iss_sub("*.example/alice"), s("suffix:.example", "exact:alice"));
        assert_eq!(iss_sub("*alice"), s("regex:.+", "suffix:alice"));
        assert_eq!(iss_sub("issuer*"), s("prefix:issuer", "regex:.+"));
    }
}
