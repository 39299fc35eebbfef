//! `StringMatch` rules: non-empty prefixes and regexes, and regexes that compile as RE2 does,
//! within the program size Envoy accepts.

use crate::config::api::StringMatch;

use super::field_errors::invalid;
use super::re2::{re2_program_size, ENVOY_MAX_PROGRAM_SIZE};

/// Longest regex Istio accepts; also bounds the work of the program size computation.
const MAX_REGEX_LEN: usize = 1024;

/// Whether an empty `prefix` is allowed (only for `uri`, where it matches every path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EmptyPrefix {
    /// An empty prefix matches everything.
    Allowed,
    /// An empty prefix is an error.
    Rejected,
}

/// The JSON name of the matcher's kind (`exact`, `prefix`, `regex`): the last part of the field
/// path of its errors, e.g. `spec.http[0].match[0].uri.regex`.
pub(super) fn variant(matcher: &StringMatch) -> &'static str {
    match matcher {
        StringMatch::Exact(_) => "exact",
        StringMatch::Prefix(_) => "prefix",
        StringMatch::Regex(_) => "regex",
    }
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

/// Checks that `pattern` is a regex Envoy's RE2 engine accepts (no lookaround, no backreferences)
/// and compiles to at most [`ENVOY_MAX_PROGRAM_SIZE`] instructions: Envoy refuses a larger one and
/// with it the whole route (or listener) update.
pub(super) fn check_regex(pattern: &str) -> Result<(), String> {
    if pattern.len() > MAX_REGEX_LEN {
        return Err(invalid(pattern, format!("regex is too large, max length allowed is {MAX_REGEX_LEN}")));
    }
    // Parsing is the syntax check; building a matcher (what `regex::Regex::new` adds) cost ~4 ms per
    // regex in a debug build and nothing here matches with it: 2,400 regexes in one List took 12 s.
    regex_syntax::Parser::new().parse(pattern).map_err(|e| {
        let message = e.to_string().split_whitespace().collect::<Vec<_>>().join(" ");
        invalid(
            pattern,
            format!("{message}; Istio uses RE2 style regex-based match (https://github.com/google/re2/wiki/Syntax)"),
        )
    })?;
    match re2_program_size(pattern) {
        Ok(size) if size <= ENVOY_MAX_PROGRAM_SIZE => Ok(()),
        Ok(size) => Err(invalid(
            pattern,
            format!(
                "regex is too complex for Envoy: its RE2 program size is {size}, above Envoy's limit of {ENVOY_MAX_PROGRAM_SIZE} (re2.max_program_size.error_level); simplify it (fewer repetitions, classes or alternatives)"
            ),
        )),
        Err(e) => Err(invalid(pattern, format!("Envoy's RE2 refuses this regex: {e}"))),
    }
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

    #[test]
    fn regexes_above_envoys_program_size_are_refused() {
        // `[a-z]{500}` is short, valid RE2, and 504 instructions: Envoy refuses it.
        let e = check_regex("[a-z]{500}").unwrap_err();
        assert!(e.contains("RE2 program size is 504") && e.contains("limit of 100"), "{e}");
        // The boundary: x{96} is 100 instructions, x{97} is 101 (both confirmed by Envoy).
        assert!(check_regex("x{96}").is_ok());
        assert!(check_regex("x{97}").unwrap_err().contains("program size is 101"));
        assert!(check_regex("^/api/v[0-9]+/users/[0-9]+/orders(/.*)?$").is_ok());
        // What RE2 (Latin-1, as Envoy runs it) does not read as Rust does is refused too.
        assert!(check_regex("[a-z&&[^aeiou]]").unwrap_err().contains("Envoy's RE2 refuses"));
        assert!(check_regex("a{1001}").unwrap_err().contains("Envoy's RE2 refuses"));
    }
}
