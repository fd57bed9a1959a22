//! Why facts are refused, naming the input, the field and what to fix.

use super::*;

/// Why facts could not be read or validated. Every message is one line
/// that names the input or pod, the field and the value, and ends with what
/// to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FactError {
    /// The text is not JSON at all.
    #[error(
        "{input}: malformed JSON at line {line} column {column}: {reason}; pass the complete, unmodified output of {kind}"
    )]
    Json {
        input: String,
        kind: InputKind,
        line: usize,
        column: usize,
        reason: String,
    },
    /// A field has the wrong JSON type (or a required one is missing).
    #[error(
        "{input}: {path}: expected {expected}, got {found}; pass the unmodified output of {kind}"
    )]
    Shape {
        input: String,
        kind: InputKind,
        /// Field path, for example `network_configs[1].network.prefix`.
        path: String,
        expected: &'static str,
        /// The found value, escaped and cut.
        found: String,
    },
    /// The pod file holds some other object, typically a `List`.
    #[error("{input}: kind is {kind}, not \"Pod\"; pass one pod: `kubectl get pod <name> -o json`")]
    NotAPod { input: String, kind: String },
    /// Validation was asked for a VM that needs no fixup.
    #[error(
        "pod {pod}: not a cloned boot (mode run without fork-from or clone-from-dir), so no fixup applies; classify the pod before validating its facts"
    )]
    NotCloned { pod: String },
    /// A required value is absent or empty.
    #[error("{}{field} is missing or empty; {fix}", pod_prefix(pod))]
    Missing {
        pod: Option<String>,
        field: String,
        fix: &'static str,
    },
    /// A value breaks a rule.
    #[error("{}{field} {value}: {rule}; {fix}", pod_prefix(pod))]
    Invalid {
        pod: Option<String>,
        /// What the value is, for example `network_configs[1].mac`.
        field: String,
        /// The value, escaped and cut so control characters are visible.
        value: String,
        rule: &'static str,
        fix: &'static str,
    },
    /// Two NICs claim one MAC: one networkd `[Match]` would catch both.
    #[error(
        "pod {pod}: network_configs[{first}] and network_configs[{second}] both have MAC {mac}; give every NIC its own MAC in cocoon's network config"
    )]
    DuplicateMac {
        pod: String,
        mac: MacAddr,
        first: usize,
        second: usize,
    },
    #[error(
        "pod {pod}: network_configs: {count} NICs, more than the {max} a fixup handles; check the inspect output (a cocoon VM has a handful of NICs)",
        max = MAX_NICS
    )]
    TooManyNics { pod: String, count: usize },
}
