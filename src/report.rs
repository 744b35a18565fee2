//! Pieces shared by the jobs' run reports.

use std::borrow::Cow;

use serde::Serialize;

/// One file a job wrote (or, in a dry run, would write).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileReport {
    /// The object key (empty for a planned file).
    pub path: String,
    /// Rows in the file.
    pub rows: u64,
    /// Bytes stored.
    pub bytes: u64,
}

/// The JSON spelling of a unit enum (outcome, decision), for the human-readable tables.
pub(crate) fn label<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// `text` safe for a terminal: control characters (C0, DEL, C1) and bidirectional overrides
/// are shown as Rust escapes (`\u{1b}`), so a name or message coming from the lake or the
/// database cannot move the cursor, recolour, or reorder what the report says
/// (docs/security.md). `keep_lines` keeps `\n` and `\t` (multi-line reports); without it the
/// result is one line.
pub(crate) fn printable(text: &str, keep_lines: bool) -> Cow<'_, str> {
    let unsafe_char = |c: char| {
        (c.is_control() && !(keep_lines && (c == '\n' || c == '\t')))
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_and_bidi_overrides_are_escaped() {
        assert_eq!(printable("schema_7", false), "schema_7");
        assert_eq!(
            printable("a\u{1b}[2Jb\rc\u{202e}d\u{85}", false),
            "a\\u{1b}[2Jb\\rc\\u{202e}d\\u{85}"
        );
        assert_eq!(printable("x\n\ty", true), "x\n\ty");
        assert_eq!(printable("x\n\ty", false), "x\\n\\ty");
        assert_eq!(printable("é ü 日本", false), "é ü 日本");
    }
}
