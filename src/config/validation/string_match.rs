//! `StringMatch` rules: non-empty prefixes and regexes, and regexes that compile as RE2 does.

use crate::config::api::StringMatch;

use super::invalid;

/// Longest regex Istio accepts (Envoy limits RE2 program size; length is Istio's stand-in for it).
const MAX_REGEX_LEN: usize = 1024;

/// Whether an empty `prefix` is allowed (only for `uri`, where it matches every path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EmptyPrefix {
    /// An empty prefix matches everything.
    Allowed,
    /// An empty prefix is an error.
    Rejected,
}

/// Checks a `StringMatch`.
pub(super) fn check_string_match(matcher: &StringMatch, empty_prefix: EmptyPrefix) -> Result<(), String> {
    match matcher {
        StringMatch::Exact(_) => Ok(()),
        StringMatch::Prefix(p) if p.is_empty() && empty_prefix == EmptyPrefix::Rejected => {
            Err(invalid(p, "prefix string match should not be empty"))
        }
        StringMatch::Prefix(_) => Ok(()),
        StringMatch::Regex(re) if re.is_empty() => Err(invalid(re, "regex string match should not be empty")),
        StringMatch::Regex(re) => check_regex(re),
    }
}

/// Checks that `pattern` is a regex Envoy's RE2 engine accepts (no lookaround, no backreferences).
pub(super) fn check_regex(pattern: &str) -> Result<(), String> {
    if pattern.len() > MAX_REGEX_LEN {
        return Err(invalid(pattern, format!("regex is too large, max length allowed is {MAX_REGEX_LEN}")));
    }
    regex::Regex::new(pattern).map(|_| ()).map_err(|e| {
        let message = e.to_string().split_whitespace().collect::<Vec<_>>().join(" ");
        invalid(
            pattern,
            format!("{message}; Istio uses RE2 style regex-based match (https://github.com/google/re2/wiki/Syntax)"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_matches_are_always_fine() {
        assert!(check_string_match(&StringMatch::Exact(String::new()), EmptyPrefix::Rejected).is_ok());
    }

    #[test]
    fn empty_prefixes_depend_on_the_field() {
        let empty = StringMatch::Prefix(String::new());
        assert!(check_string_match(&empty, EmptyPrefix::Allowed).is_ok());
        let e = check_string_match(&empty, EmptyPrefix::Rejected).unwrap_err();
        assert!(e.contains("prefix string match should not be empty"), "{e}");
    }

    #[test]
    fn regexes_must_be_non_empty_and_re2_compatible() {
        assert!(check_string_match(&StringMatch::Regex("/v[0-9]+/.*".into()), EmptyPrefix::Rejected).is_ok());
        let e = check_string_match(&StringMatch::Regex(String::new()), EmptyPrefix::Allowed).unwrap_err();
        assert!(e.contains("regex string match should not be empty"), "{e}");
        for bad in ["(", "a(?=b)", "(a)\\1"] {
            let e = check_regex(bad).unwrap_err();
            assert!(e.contains("Istio uses RE2 style regex-based match") && !e.contains('\n'), "{e}");
        }
        assert!(check_regex(&"a".repeat(1025)).unwrap_err().contains("regex is too large"));
    }
}
