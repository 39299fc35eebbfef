//! HTTP header rules: names in matches and CORS, names and values in header operations.

use crate::config::api::virtual_service::{HeaderOperations, Headers};

use super::field_errors::{invalid, Errors};

/// Prefix of header names that match a JWT claim instead of a header (gateways only).
const JWT_CLAIM_PREFIX: &str = "@request.auth.claims";

/// Checks a header name used in a match: letters, digits, '-' and '_'.
pub(super) fn check_header_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        Err(invalid(name, "header name cannot be empty"))
    } else if name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        Ok(())
    } else {
        Err(invalid(name, "not a valid header name (letters, digits, '-' and '_')"))
    }
}

/// Checks a header name in a match, where a JWT claim reference is also allowed.
pub(super) fn check_match_header_name(name: &str) -> Result<(), String> {
    if is_jwt_claim(name) {
        Ok(())
    } else {
        check_header_name(name)
    }
}

/// Whether a match header name refers to a JWT claim (`@request.auth.claims.sub`, `@request.auth.claims[a][b]`).
pub(super) fn is_jwt_claim(name: &str) -> bool {
    name.strip_prefix(JWT_CLAIM_PREFIX).is_some_and(|rest| {
        (rest.len() > 1 && rest.starts_with('.')) || (rest.len() > 2 && rest.starts_with('[') && rest.ends_with(']'))
    })
}

/// Checks a CORS header name, where `*` is also allowed.
pub(super) fn check_cors_header_name(name: &str) -> Result<(), String> {
    if name == "*" {
        Ok(())
    } else {
        check_header_name(name)
    }
}

/// Checks the header operations of a route or destination, reporting under `path` (`...headers`).
pub(super) fn check_header_operations(errors: &mut Errors, path: &str, headers: &Headers) {
    if let Some(request) = &headers.request {
        check_operations(errors, &format!("{path}.request"), request, Direction::Request);
    }
    if let Some(response) = &headers.response {
        check_operations(errors, &format!("{path}.response"), response, Direction::Response);
    }
}

/// Which way the headers flow; only requests may rewrite the authority.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Request,
    Response,
}

fn check_operations(errors: &mut Errors, path: &str, ops: &HeaderOperations, direction: Direction) {
    for (verb, map) in [("set", &ops.set), ("add", &ops.add)] {
        for (name, value) in map {
            let field = format!("{path}.{verb}[{name}]");
            errors.check(field.clone(), check_operation_name(name, direction == Direction::Request));
            errors.check(field, check_header_value(value));
        }
    }
    for (i, name) in ops.remove.iter().enumerate() {
        errors.check(format!("{path}.remove[{i}]"), check_operation_name(name, false));
    }
}

/// Checks a header name that is set, added or removed; `:authority`/`host` may only be set on requests.
fn check_operation_name(name: &str, authority_allowed: bool) -> Result<(), String> {
    if name.is_empty() {
        return Err(invalid(name, "header name cannot be empty"));
    }
    let authority = is_authority_header(name);
    if authority && authority_allowed {
        return Ok(());
    }
    if name.eq_ignore_ascii_case("host") {
        return Err(invalid(name, "cannot set Host header"));
    }
    if name.starts_with(':') || authority {
        return Err(invalid(name, "header cannot have \":\" prefix"));
    }
    Ok(())
}

/// Whether `name` is the authority header under either of its names.
pub(super) fn is_authority_header(name: &str) -> bool {
    name.eq_ignore_ascii_case(":authority") || name.eq_ignore_ascii_case("host")
}

/// Checks a header value: no control characters, and `%` only as `%%` or around a complete `%VARIABLE%`.
pub(super) fn check_header_value(value: &str) -> Result<(), String> {
    if value.chars().any(|c| c.is_ascii_control() && c != '\t') {
        return Err(invalid(value, "header value must not contain control characters"));
    }
    check_variables(value).map_err(|e| invalid(value, format!("invalid header value: {e}")))
}

/// Where the scan of a header value is, in Envoy's `%VAR%` / `%VAR(args)%` syntax.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scan {
    Literal,
    Name,
    ArgsStart,
    StringStart,
    InString,
    AfterString,
    ArgsEnd,
    VariableEnd,
}

/// Scans `%` expressions the way Envoy's header formatter parses them.
fn check_variables(value: &str) -> Result<(), String> {
    let bytes = value.as_bytes();
    let mut state = Scan::Literal;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let next = bytes.get(i + 1).copied();
        state = match (state, c) {
            (Scan::Literal, b'%') => match next {
                None => return Err("un-escaped %".into()),
                Some(b'%') => {
                    i += 1;
                    Scan::Literal
                }
                Some(_) => Scan::Name,
            },
            (Scan::Literal, _) => Scan::Literal,
            (Scan::Name, b'%') => Scan::Literal,
            (Scan::Name, b'(') => Scan::ArgsStart,
            (Scan::Name, _) => Scan::Name,
            (Scan::ArgsStart, b'[') => Scan::StringStart,
            (Scan::ArgsStart, b' ') => Scan::ArgsStart,
            (Scan::ArgsStart, _) => Scan::InString,
            (Scan::StringStart, b'"') => Scan::InString,
            (Scan::StringStart, b' ') => Scan::StringStart,
            (Scan::StringStart, _) => return Err("expecting '\"'".into()),
            (Scan::InString, b'\\') if next.is_none() => return Err("un-terminated backslash in string".into()),
            (Scan::InString, b'\\') => {
                i += 1;
                Scan::InString
            }
            (Scan::InString, b')') => Scan::VariableEnd,
            (Scan::InString, b'"') => Scan::AfterString,
            (Scan::InString, _) => Scan::InString,
            (Scan::AfterString, b',') => Scan::StringStart,
            (Scan::AfterString, b']') => Scan::ArgsEnd,
            (Scan::AfterString, b' ') => Scan::AfterString,
            (Scan::AfterString, _) => return Err("expecting ',', ']', or whitespace".into()),
            (Scan::ArgsEnd, b')') => Scan::VariableEnd,
            (Scan::ArgsEnd, b' ') => Scan::ArgsEnd,
            (Scan::ArgsEnd, _) => return Err("expecting ')' or whitespace".into()),
            (Scan::VariableEnd, b'%') => Scan::Literal,
            (Scan::VariableEnd, b' ') => Scan::VariableEnd,
            (Scan::VariableEnd, _) => return Err("expecting '%' or whitespace".into()),
        };
        i += 1;
    }
    if state == Scan::Literal {
        Ok(())
    } else {
        Err("un-terminated variable expression".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn match_header_names_are_tokens_or_jwt_claims() {
        assert!(check_match_header_name("x-user_ID").is_ok());
        assert!(check_match_header_name("@request.auth.claims.sub").is_ok());
        assert!(check_match_header_name("@request.auth.claims[a][b]").is_ok());
        assert!(check_match_header_name("").unwrap_err().contains("header name cannot be empty"));
        assert!(check_match_header_name("x:y").unwrap_err().contains("not a valid header name"));
        assert!(check_match_header_name("@request.auth.claims").is_err());
        assert!(check_cors_header_name("*").is_ok());
        assert!(check_cors_header_name("a b").is_err());
    }

    #[test]
    fn operations_cannot_touch_pseudo_headers_except_request_authority() {
        assert!(check_operation_name(":authority", true).is_ok());
        assert!(check_operation_name("Host", true).is_ok());
        assert!(check_operation_name("host", false).unwrap_err().contains("cannot set Host header"));
        assert!(check_operation_name(":path", true).unwrap_err().contains("\":\" prefix"));
        assert!(check_operation_name(":authority", false).unwrap_err().contains("\":\" prefix"));
        assert!(check_operation_name("", true).unwrap_err().contains("cannot be empty"));
    }

    #[test]
    fn values_follow_envoys_formatter_syntax() {
        for ok in ["foo", "%HOSTNAME%", "100%%", "prefix %HOSTNAME% suffix", "%REQ(x-id)%", "%START_TIME(%s)%", ""] {
            assert!(check_header_value(ok).is_ok(), "{ok}");
        }
        for bad in ["abc%123", "%START_TIME%%", "%", "a\nb", "%VAR([\"a\" x])%"] {
            assert!(check_header_value(bad).is_err(), "{bad}");
        }
    }
}
