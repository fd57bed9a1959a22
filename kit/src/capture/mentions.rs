//! The plugins a pod's hint and events name with a version.

use base64::Engine as _;
use serde::Serialize;

/// A plugin named with its version in a hint header or an event: `NAME
/// VERSION sha256:DIGEST`, `NAME VERSION (sha256:DIGEST)`, or `built-in
/// NAME VERSION`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct PluginMention {
    pub name: String,
    pub version: String,
    /// As given; the hint header gives the first 12 hex digits.
    pub sha256: Option<String>,
    /// Where it was named: `hint`, or the event's reason.
    pub from: String,
}

pub(super) fn is_plugin_name(word: &str) -> bool {
    !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Every plugin `text` names with a version (see [`PluginMention`]).
pub fn plugin_mentions(text: &str, from: &str) -> Vec<PluginMention> {
    let trim = |w: &str| {
        w.trim_matches(|c: char| matches!(c, '(' | ')' | ',' | ';' | ':'))
            .to_owned()
    };
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut found = Vec::new();
    for (i, window) in words.windows(2).enumerate() {
        let (name, version) = (trim(window[0]), trim(window[1]));
        if !is_plugin_name(&name) || !version.starts_with(|c: char| c.is_ascii_digit()) {
            continue;
        }
        let digest = words
            .get(i + 2)
            .map(|w| trim(w))
            .and_then(|w| w.strip_prefix("sha256:").map(str::to_owned))
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_hexdigit()));
        let after_builtin = i > 0 && words[i - 1] == "built-in";
        if digest.is_some() || after_builtin {
            found.push(PluginMention {
                name,
                version,
                sha256: digest,
                from: from.to_owned(),
            });
        }
    }
    found
}

/// The header of a hint script (the base64 `post-clone-hint`): its leading
/// comment lines without `# ` (the shebang left out), and the plugins they
/// name. `None` when the annotation is not base64 of UTF-8 text.
pub(super) fn hint_header(hint: &str) -> Option<(Vec<String>, Vec<PluginMention>)> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(hint.trim())
        .ok()?;
    let script = String::from_utf8(bytes).ok()?;
    let title: Vec<String> = script
        .lines()
        .filter(|l| !l.starts_with("#!"))
        .map_while(|l| l.strip_prefix('#'))
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    let plugins = title
        .iter()
        .filter_map(|l| l.strip_prefix("plugins:"))
        .flat_map(|l| plugin_mentions(l, "hint"))
        .collect();
    Some((title, plugins))
}
