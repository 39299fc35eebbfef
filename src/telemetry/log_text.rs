//! Text from outside (a proxy's node and NACKs, a CSR's caller, a webhook's request, a value read
//! from etcd or a file) made safe for one log line: control characters escaped, so a newline
//! cannot forge a line, and cut at [`MAX_CHARS`] characters, so a client cannot fill the log.
//!
//! Use it in a field: `warn!(node = %Untrusted(&id), "...")`, or [`untrusted_list`] for a list.

use std::fmt::{self, Display, Write};

/// Most characters of one piece of outside text put into a log line (before escaping).
pub const MAX_CHARS: usize = 256;

/// Most items of an outside list put into a log line.
pub const MAX_ITEMS: usize = 16;

/// Outside text, shown escaped and cut at [`MAX_CHARS`] characters (the original length noted).
#[derive(Clone, Copy)]
pub struct Untrusted<'a>(pub &'a str);

impl Display for Untrusted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut chars = self.0.chars();
        for c in chars.by_ref().take(MAX_CHARS) {
            write_escaped(f, c)?;
        }
        if chars.next().is_some() {
            write!(f, "…({} chars)", self.0.chars().count())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Untrusted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// A list of outside text: at most [`MAX_ITEMS`] items, each shown as an [`Untrusted`].
pub fn untrusted_list<S: Display>(items: &[S]) -> UntrustedList<'_, S> {
    UntrustedList(items)
}

/// See [`untrusted_list`].
pub struct UntrustedList<'a, S>(&'a [S]);

impl<S: Display> Display for UntrustedList<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('[')?;
        for (i, item) in self.0.iter().take(MAX_ITEMS).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", Untrusted(&item.to_string()))?;
        }
        if self.0.len() > MAX_ITEMS {
            write!(f, ", …({} items)", self.0.len())?;
        }
        f.write_char(']')
    }
}

/// `text` cut at `max` characters, unescaped: for a bounded copy kept to show elsewhere (a JSON
/// page escapes it itself).
pub fn truncated(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

/// Writes `c`, escaped when it could break or disguise a line: control characters (newlines
/// among them), Unicode line and paragraph separators and bidirectional overrides, and the
/// backslash itself, so an escape in the input cannot pass for one of ours.
fn write_escaped(f: &mut fmt::Formatter<'_>, c: char) -> fmt::Result {
    match c {
        '\n' => f.write_str("\\n"),
        '\r' => f.write_str("\\r"),
        '\t' => f.write_str("\\t"),
        '\\' => f.write_str("\\\\"),
        c if c.is_control()
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}') =>
        {
            write!(f, "{}", c.escape_unicode())
        }
        c => f.write_char(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newline_cannot_forge_a_line() {
        let shown = Untrusted("shop\n2026-11-29T00:00:00Z  INFO forged line").to_string();
        assert_eq!(shown, "shop\\n2026-11-29T00:00:00Z  INFO forged line");
        assert_eq!(Untrusted("a\r\u{1b}[31mb\\n").to_string(), "a\\r\\u{1b}[31mb\\\\n");
        assert_eq!(Untrusted("\u{202E}evil").to_string(), "\\u{202e}evil");
        assert_eq!(Untrusted("plain é text").to_string(), "plain é text");
    }

    #[test]
    fn long_text_is_cut_with_its_length() {
        let shown = Untrusted(&"x".repeat(30_000)).to_string();
        assert_eq!(shown, format!("{}…(30000 chars)", "x".repeat(MAX_CHARS)));
        assert_eq!(Untrusted(&"é".repeat(MAX_CHARS)).to_string(), "é".repeat(MAX_CHARS));
    }

    #[test]
    fn lists_are_bounded_too() {
        let many: Vec<String> = (0..100).map(|i| format!("n{i}\n")).collect();
        let shown = untrusted_list(&many).to_string();
        assert!(shown.starts_with("[n0\\n, n1\\n"), "{shown}");
        assert!(shown.ends_with("n15\\n, …(100 items)]"), "{shown}");
        assert!(!shown.contains('\n'));
    }

    #[test]
    fn truncation_respects_characters() {
        assert_eq!(truncated("héllo", 2), "hé");
        assert_eq!(truncated("hi", 10), "hi");
    }
}
