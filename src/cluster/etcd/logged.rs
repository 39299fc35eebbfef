//! Text read from etcd, made safe for one log line. Whoever can write etcd chooses the keys and
//! values (member ids, the leader's address): logged raw, they could forge log lines or flood
//! the log.

/// Longest text from etcd a log line carries (in chars); the rest is noted by its length.
pub const MAX_LOGGED_CHARS: usize = 128;

/// `text` with control characters escaped and cut at [`MAX_LOGGED_CHARS`], its full length noted.
pub fn logged(text: &str) -> String {
    let mut out = escaped_prefix(text);
    let total = text.chars().count();
    if total > MAX_LOGGED_CHARS {
        out.push_str(&format!("…({total} chars)"));
    }
    out
}

/// As [`logged`], for bytes that may not be UTF-8 (a key): invalid sequences shown as U+FFFD,
/// the full length noted in bytes.
pub fn logged_bytes(bytes: &[u8]) -> String {
    // Decoding only a prefix bounds the work on a huge value.
    let prefix = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_LOGGED_CHARS * 4)]);
    let mut out = escaped_prefix(&prefix);
    if prefix.chars().count() > MAX_LOGGED_CHARS || prefix.len() < bytes.len() {
        out.push_str(&format!("…({} bytes)", bytes.len()));
    }
    out
}

/// The first [`MAX_LOGGED_CHARS`] chars of `text`, control characters escaped.
fn escaped_prefix(text: &str) -> String {
    text.chars().take(MAX_LOGGED_CHARS).flat_map(char::escape_debug).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_so_no_line_is_forged() {
        let forged = "10.0.0.1:15020\n{\"level\":\"INFO\",\"message\":\"leader\"}";
        let out = logged(forged);
        assert!(!out.contains('\n'), "{out}");
        assert!(out.starts_with("10.0.0.1:15020\\n"), "{out}");
        assert_eq!(logged("\u{1b}[2J"), "\\u{1b}[2J");
    }

    #[test]
    fn long_text_is_capped_with_its_length() {
        let out = logged(&"x".repeat(1_000_000));
        assert!(out.chars().count() < MAX_LOGGED_CHARS + 24, "{}", out.len());
        assert!(out.ends_with("…(1000000 chars)"), "{out}");
        assert_eq!(logged("fe-a"), "fe-a");
    }

    #[test]
    fn bytes_are_capped_before_decoding() {
        let out = logged_bytes(&[0xff; 100_000]);
        assert!(out.chars().count() < MAX_LOGGED_CHARS + 48, "{}", out.len());
        assert!(out.ends_with("…(100000 bytes)"), "{out}");
        assert_eq!(logged_bytes(b"/meshpilot/members/fe-a"), "/meshpilot/members/fe-a");
    }
}
