//! RequestAuthentication rules, after Istio's `ValidateRequestAuthentication` and `validateJwtRule`.

use serde_json::Value;

use crate::config::api::request_authentication::{JwtRule, RequestAuthentication};

use super::durations::check_duration;
use super::field_errors::{invalid, required, Errors};
use super::headers::check_header_name;
use super::policy_target::check_policy_target;

/// Checks a RequestAuthentication.
pub(super) fn validate(ra: &RequestAuthentication, errors: &mut Errors) {
    check_policy_target(errors, ra.selector.as_ref(), ra.target_ref.as_ref(), &ra.target_refs);
    for (i, rule) in ra.jwt_rules.iter().enumerate() {
        check_jwt_rule(errors, &format!("spec.jwtRules[{i}]"), rule);
    }
}

fn check_jwt_rule(errors: &mut Errors, path: &str, rule: &JwtRule) {
    if rule.audiences.iter().any(String::is_empty) {
        errors.add(format!("{path}.audiences"), invalid("", "audience must be non-empty string"));
    }
    if rule.issuer.is_empty() && rule.jwks_uri.is_empty() {
        errors.add(format!("{path}.issuer"), required("issuer or jwksUri must be non-empty string"));
    } else if rule.jwks_uri.is_empty() && rule.jwks.is_empty() {
        // Istio's control plane would look the keys up in the issuer's OpenID discovery document;
        // meshpilot does not, and Envoy needs a key source for every provider.
        errors.add(
            format!("{path}.jwksUri"),
            required("jwks or jwksUri must be set: meshpilot does not resolve the issuer's OpenID discovery document"),
        );
    }
    if !rule.jwks_uri.is_empty() {
        errors.check(format!("{path}.jwksUri"), parse_jwks_uri(&rule.jwks_uri).map(|_| ()));
    }
    if !rule.jwks.is_empty() {
        errors.check(format!("{path}.jwks"), check_jwks(&rule.jwks));
    }
    for (j, header) in rule.from_headers.iter().enumerate() {
        if header.name.is_empty() {
            errors.add(
                format!("{path}.fromHeaders[{j}].name"),
                required("location header name must be non-empty string"),
            );
        }
    }
    if rule.from_params.iter().any(String::is_empty) {
        errors.add(format!("{path}.fromParams"), invalid("", "location query must be non-empty string"));
    }
    if rule.from_cookies.iter().any(String::is_empty) {
        errors.add(format!("{path}.fromCookies"), invalid("", "cookie name must be non-empty string"));
    }
    for (j, out) in rule.output_claim_to_headers.iter().enumerate() {
        let field = format!("{path}.outputClaimToHeaders[{j}]");
        if out.claim.is_empty() || out.header.is_empty() {
            errors.add(field, required("outputClaimToHeaders header and claim value must be non-empty string"));
        } else {
            errors.check(format!("{field}.header"), check_header_name(&out.header));
        }
    }
    if let Some(timeout) = rule.timeout {
        errors.check(format!("{path}.timeout"), check_duration(timeout));
    }
}

/// A `jwksUri`, split as Envoy's `remote_jwks` needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwksUri {
    /// `https` (TLS) or `http`.
    pub tls: bool,
    /// Host name or address (without brackets).
    pub host: String,
    /// Port (the scheme's default when absent).
    pub port: u16,
}

/// Parses a `jwksUri`: `http` or `https`, a host, an optional port.
pub fn parse_jwks_uri(uri: &str) -> Result<JwksUri, String> {
    let (scheme, rest) = uri.split_once("://").ok_or_else(|| invalid(uri, "not an absolute URI"))?;
    let tls = match scheme.to_ascii_lowercase().as_str() {
        "https" => true,
        "http" => false,
        other => return Err(invalid(uri, format!("URI scheme {other:?} is not supported"))),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6.split_once(']').ok_or_else(|| invalid(uri, "unclosed IPv6 address"))?;
            (host, after.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    if host.is_empty() {
        return Err(invalid(uri, "URI has no host"));
    }
    let port = match port {
        None | Some("") => {
            if tls {
                443
            } else {
                80
            }
        }
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| invalid(uri, format!("bad port {p:?}")))?,
    };
    Ok(JwksUri { tls, host: host.to_string(), port })
}

/// A JWKS document: a JSON object with a `keys` list of keys, or a single key, each with `kty`.
fn check_jwks(jwks: &str) -> Result<(), String> {
    let fail = |detail: &str| Err(invalid("<jwks>", format!("jwks parse error: {detail}")));
    let value: Value = match serde_json::from_str(jwks) {
        Ok(v) => v,
        Err(e) => return fail(&e.to_string()),
    };
    let keys = match value.get("keys") {
        Some(Value::Array(keys)) => keys.clone(),
        Some(_) => return fail("`keys` must be a list"),
        None => vec![value],
    };
    if keys.is_empty() {
        return fail("no keys");
    }
    for key in &keys {
        if !key.get("kty").is_some_and(Value::is_string) {
            return fail("every key needs a `kty`");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::validation::testing::{assert_error, first_error};

    const KIND: &str = "RequestAuthentication";

    fn error(spec: &str) -> Option<(String, String)> {
        first_error(KIND, spec).map(|e| (e.field, e.reason))
    }

    #[track_caller]
    fn assert_rejected(spec: &str, field: &str, reason: &str) {
        assert_error(KIND, spec, field, reason);
    }

    #[test]
    fn typical_rules_are_valid() {
        let spec = "selector: {matchLabels: {app: a}}\njwtRules:\n- issuer: https://issuer.example\n  jwksUri: https://issuer.example:8443/keys\n  audiences: [a]\n  fromHeaders: [{name: x-jwt, prefix: 'Bearer '}]\n  fromParams: [token]\n  fromCookies: [session]\n  outputPayloadToHeader: x-payload\n  forwardOriginalToken: true\n  outputClaimToHeaders: [{header: x-sub, claim: sub}]\n  timeout: 5s\n- issuer: inline\n  jwks: '{\"keys\": [{\"kty\": \"RSA\", \"n\": \"x\", \"e\": \"AQAB\"}]}'";
        assert_eq!(error(spec), None);
        assert_eq!(error("{}"), None);
    }

    #[test]
    fn istio_rejections() {
        assert_rejected("jwtRules: [{audiences: [a]}]", "spec.jwtRules[0].issuer", "issuer or jwksUri");
        assert_rejected("jwtRules: [{issuer: https://a.example}]", "spec.jwtRules[0].jwksUri", "OpenID discovery");
        assert_rejected(
            "jwtRules: [{issuer: a, jwksUri: 'http://k/keys', audiences: ['']}]",
            "spec.jwtRules[0].audiences",
            "audience must be non-empty",
        );
        assert_rejected(
            "jwtRules: [{issuer: a, jwksUri: 'ftp://x/keys'}]",
            "spec.jwtRules[0].jwksUri",
            "not supported",
        );
        assert_rejected(
            "jwtRules: [{issuer: a, jwksUri: 'http://k/keys', jwks: 'nope'}]",
            "spec.jwtRules[0].jwks",
            "jwks parse error",
        );
        assert_rejected(
            "jwtRules: [{issuer: a, jwksUri: 'http://k/keys', fromHeaders: [{prefix: x}]}]",
            "spec.jwtRules[0].fromHeaders[0].name",
            "non-empty",
        );
        assert_rejected(
            "jwtRules: [{issuer: a, jwksUri: 'http://k/keys', fromParams: ['']}]",
            "spec.jwtRules[0].fromParams",
            "non-empty",
        );
        assert_rejected(
            "jwtRules: [{issuer: a, jwksUri: 'http://k/keys', fromCookies: ['']}]",
            "spec.jwtRules[0].fromCookies",
            "non-empty",
        );
        assert_rejected(
            "jwtRules: [{issuer: a, jwksUri: 'http://k/keys', outputClaimToHeaders: [{header: x}]}]",
            "spec.jwtRules[0].outputClaimToHeaders[0]",
            "must be non-empty",
        );
        assert_rejected(
            "jwtRules: [{issuer: a, jwksUri: 'http://k/keys', outputClaimToHeaders: [{header: 'a b', claim: c}]}]",
            "spec.jwtRules[0].outputClaimToHeaders[0].header",
            "not a valid header name",
        );
        assert_rejected(
            "jwtRules: [{issuer: a, jwksUri: 'http://k/keys', timeout: 0s}]",
            "spec.jwtRules[0].timeout",
            "greater than 1ms",
        );
        assert_rejected("selector: {matchLabels: {'': a}}", "spec.selector.matchLabels[]", "empty key");
    }

    #[test]
    fn jwks_uris_split_into_host_and_port() {
        assert_eq!(
            parse_jwks_uri("https://a.example/keys"),
            Ok(JwksUri { tls: true, host: "a.example".into(), port: 443 })
        );
        assert_eq!(
            parse_jwks_uri("http://127.0.0.1:8080/k?x=1"),
            Ok(JwksUri { tls: false, host: "127.0.0.1".into(), port: 8080 })
        );
        assert_eq!(parse_jwks_uri("http://[::1]:81/k"), Ok(JwksUri { tls: false, host: "::1".into(), port: 81 }));
        assert!(parse_jwks_uri("http:///k").is_err());
        assert!(parse_jwks_uri("http://a:0/k").is_err());
    }
}
