//! How an embedder spells what happened, in the JSON of the task op's
//! reports (the C library's and the JSON ops'): the shapes of a console
//! error, an API error and an exec's output. One place, so the library
//! that parses reports, and every replay that writes them, agree.

use serde_json::{Value, json};

use super::PodError;
use crate::exec::{ExecOutput, ExitStatusKind};
use crate::lifecycle::{Lifecycle, LifecycleIntent};
use fixup_sac::{SacError, Step};

/// A console client's error: `{kind: "dial" | "enum" | "set" | "verify" |
/// "deadline" | "refused", ...}` with `cause` (dial, set), `found` and
/// `need` (enum), `net` (set, verify; deadline of a set or verify step),
/// `ip` (verify; deadline of a verify step), `step` (`dial`, `enum`, `set`
/// or `verify`) and `total_ms` (deadline: the pass's total deadline
/// passed during that step), `message` (refused and the rest).
pub fn sac_error_json(e: &SacError) -> Value {
    match e {
        SacError::Deadline { step, total } => {
            let total_ms = u64::try_from(total.as_millis()).unwrap_or(u64::MAX);
            match step {
                Step::Dial => json!({"kind": "deadline", "step": "dial", "total_ms": total_ms}),
                Step::Enum => json!({"kind": "deadline", "step": "enum", "total_ms": total_ms}),
                Step::Set { net } => {
                    json!({"kind": "deadline", "step": "set", "net": net, "total_ms": total_ms})
                }
                Step::Verify { net, ip } => json!({
                    "kind": "deadline", "step": "verify", "net": net, "ip": ip.to_string(),
                    "total_ms": total_ms,
                }),
            }
        }
        SacError::Dial { cause } => json!({"kind": "dial", "cause": cause}),
        SacError::EnumExhausted { found, need } => {
            json!({"kind": "enum", "found": found, "need": need})
        }
        SacError::SetIp { net, cause } => json!({"kind": "set", "net": net, "cause": cause}),
        SacError::VerifyExhausted { net, ip } => {
            json!({"kind": "verify", "net": net, "ip": ip.to_string()})
        }
        other => json!({"kind": "refused", "message": other.to_string()}),
    }
}

/// A read's or a patch's error: `{kind: "api" | "refused" | "gone",
/// message}`.
pub fn pod_error_json(e: &PodError) -> Value {
    let (kind, message) = match e {
        PodError::Api { reason, .. } => ("api", reason.clone()),
        PodError::Refused { reason, .. } => ("refused", reason.clone()),
        PodError::Gone { pod } => ("gone", pod.clone()),
    };
    json!({"kind": kind, "message": message})
}

/// An exec's output: `{exit | signal, stdout, stderr, stderr_cut}`.
pub fn ran_json(out: &ExecOutput) -> Value {
    let mut ran = json!({
        "stdout": String::from_utf8_lossy(&out.stdout),
        "stderr": String::from_utf8_lossy(&out.stderr),
        "stderr_cut": out.stderr_cut,
    });
    match out.status {
        ExitStatusKind::Code(code) => ran["exit"] = json!(code),
        ExitStatusKind::Signal(signal) => ran["signal"] = json!(signal),
    }
    ran
}

/// A lifecycle change handed to the embedder: `{action: "publish", uid,
/// resource_version, state, message, observed_generation, ip, ready}`,
/// each `null` when absent (`message` `null` with a state clears the
/// message); `uid` is the pod's the change is for, `resource_version` the
/// pod's version it was decided for.
pub fn publish_json(intent: &LifecycleIntent, uid: &str) -> Value {
    json!({
        "action": "publish",
        "uid": uid,
        "resource_version": intent.version,
        "state": intent.state.map(Lifecycle::as_str),
        "message": intent.message,
        "observed_generation": intent.observed_generation,
        "ip": intent.ip,
        "ready": intent.ready(),
    })
}

/// The lifecycle change of a `publish` action ([`publish_json`]).
pub fn intent_from_json(action: &Value) -> LifecycleIntent {
    let text = |key: &str| action[key].as_str().map(str::to_owned);
    LifecycleIntent {
        state: action["state"].as_str().and_then(Lifecycle::parse),
        message: text("message"),
        observed_generation: text("observed_generation"),
        ip: text("ip"),
        version: text("resource_version"),
    }
}
