//! The one way text that carries plugin- or user-supplied strings reaches a
//! terminal.
//!
//! Every command that prints such text (`plan`, `plugin inspect`,
//! `plugin test`, `run`, error messages) passes its whole output through
//! [`terminal_text`] or [`terminal_json`] as the last step, so no string a
//! plugin, a pod or a VM record supplied can move the cursor, clear a line,
//! drive the terminal or reorder what a reviewer sees, whatever path it took
//! into the output. Single-line values in logs, events and annotations use
//! [`escape_controls`](crate::facts::escape_controls), which also escapes
//! line breaks.

use std::borrow::Cow;

use crate::facts::is_invisible_format;

fn needs_escape(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t') || is_invisible_format(c)
}

/// Text for a terminal: line breaks and tabs kept, every other control
/// character (CR, ESC, the C1 controls) and every invisible formatting
/// character (bidi overrides, zero-width characters) written as a Rust
/// escape (`\r`, `\u{1b}`, `\u{202e}`).
pub fn terminal_text(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if needs_escape(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// JSON for a terminal: serde_json escapes only U+0000..=U+001F; this
/// writes DEL, the C1 controls (U+009B is a one-character CSI) and every
/// invisible formatting character as `\uXXXX` too. The document means the
/// same: outside strings serde_json writes only ASCII punctuation, spaces
/// and line breaks, which are kept, and inside strings the escape is the
/// same character.
pub fn terminal_json(json: &str) -> Cow<'_, str> {
    let escaped = |c: char| (c.is_control() && c != '\n' && c != ' ') || is_invisible_format(c);
    if !json.chars().any(escaped) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if escaped(c) {
            // Every such character is in the BMP.
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_text_keeps_lines_and_tabs_and_escapes_the_rest() {
        assert!(matches!(terminal_text("a\n\tb"), Cow::Borrowed("a\n\tb")));
        assert_eq!(
            terminal_text("curl x | sh\r# ok\u{1b}[2K\u{202e}\u{85}"),
            "curl x | sh\\r# ok\\u{1b}[2K\\u{202e}\\u{85}"
        );
    }

    #[test]
    fn terminal_json_escapes_format_characters_and_keeps_the_value() {
        let value = serde_json::json!({"d": "a\u{202e}b\u{200b}c\u{1b}\u{7f}\u{9b}2J\u{85}"});
        let json = serde_json::to_string_pretty(&value).unwrap();
        let shown = terminal_json(&json);
        assert!(
            !shown
                .chars()
                .any(|c| (c.is_control() && c != '\n') || crate::facts::is_invisible_format(c)),
            "{shown:?}"
        );
        assert!(shown.contains("\\u009b2J"), "{shown}");
        let back: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back, value);
    }
}
