//! The calls of the library as JSON ops: one request document in, one
//! response document out, with the planners, tasks and consoles kept by
//! handle in a [`Session`]. The same ops serve two transports:
//!
//! - `cf_call` in the C ABI, over one session per process, for an embedder
//!   that links the library (the Go package with cgo);
//! - [`serve`], newline-delimited JSON over a pipe, which `cocoon-fixup
//!   embed` runs on its standard input and output, for an embedder that
//!   does not link C (the Go package's default backend): one long-lived
//!   child, many requests in flight, answered as they finish.
//!
//! # Requests
//!
//! `{"id": n, "op": "<op>", ...}`; `id` (any JSON value) is echoed in the
//! response, so a pipe's client can match answers that come out of order.
//! Text inputs (`pod`, `vm`) are JSON strings holding the document as
//! `kubectl` or `cocoon` printed it. The task ops are the one way to embed
//! the step; `plan` shows what it would run.
//!
//! | op | fields | `ok` |
//! |---|---|---|
//! | `abi` | | `{"abi", "version"}` |
//! | `planner_new` | `options` (object or null) | `{"planner": handle, "load_failures", "warnings", "slots"}` |
//! | `planner_free` | `planner` | `{}` |
//! | `plan` | `planner`, `pod`, `vm`, `overrides` | the report (`cf_plan`) |
//! | `task_start` | `planner`, `pod`, `options` (object or null) | `{"task": handle, "action": {...}}` |
//! | `task_next` | `task`, `report` (object) | the next action |
//! | `task_free` | `task` | `{}` (a console op of the task in flight ends `cancelled`) |
//! | `task_cancel` | `task` | `{}`: the task's console op in flight, and every later one, ends at once with the report `{"cancelled": true}` (`cf_task_cancel`); never waits for the task |
//! | `console_open` | `task` | the report: the task's own pending `sac_open` carried out (`cf_console_open`; refused when the task does not await one); the console stays in the task until its `sac_close` |
//! | `console_set` | `task` | the report: the task's own pending `sac_set` on its console (`cf_console_set`) |
//! | `lease` | `planner`, `mac` | `{"lease": ip or null}` or `{"lease_error": why}`: one look at the planner's lease file (option `lease_file`) |
//! | `observe` | `record` (object or null), `pod`, `live`, `watched_since_new` | `{"record", "changed", "watched_since_new"}` (and `warning` when the record given was not usable and is replaced): the pod's record after noting what the pod shows (its hibernate history, spec section 2 rule 3) |
//! | `merge` | `stored` (object or null), `task` (object) | `{"record", "changed"}` (and `warning`): a `remember` action's record kept into the stored one, each side keeping its own parts |
//!
//! # Responses
//!
//! `{"id": n, "ok": <document>}`, or `{"id": n, "error": {"status":
//! <CfStatus as a number>, "message": "..."}}`: the status and message
//! the C function of the same name gives. A request that is not a JSON
//! object with a known `op` is `CF_INVALID_ARGUMENT`.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{Map, Value, json};

use fixup_core::memory::PodMemory;

use crate::console;
use crate::ops::{self, Built, CfStatus, Failure};
use crate::task::{self, Task};

/// The longest request line [`serve`] reads: a pod with the most
/// annotations the API server allows is far smaller.
pub const REQUEST_MAX_BYTES: usize = 16 << 20;

/// Requests [`serve`] works on at once; past it, reading waits.
pub const IN_FLIGHT_MAX: usize = 256;

/// Bytes of requests [`serve`] holds at once (one request of any allowed
/// size is always taken); past it, reading waits.
pub const IN_FLIGHT_BYTES_MAX: usize = 64 << 20;

/// How long `serve` waits at the end of its input for the requests in
/// flight.
pub const DRAIN_MAX_SECS: u64 = 120;

/// A task with the planner it plans with, worked on by one call at a
/// time.
type TaskEntry = Arc<Mutex<(Arc<Built>, Task)>>;

/// The handles of one client: its planners and tasks (with the consoles
/// they open), and each task's cancel flag, kept apart so a cancel never
/// waits for the task's call in flight.
#[derive(Debug, Default)]
pub struct Session {
    next: AtomicU64,
    planners: Mutex<HashMap<u64, Arc<Built>>>,
    tasks: Mutex<HashMap<u64, TaskEntry>>,
    stops: Mutex<HashMap<u64, Arc<AtomicBool>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn field<'a>(request: &'a Map<String, Value>, key: &str) -> Result<&'a Value, Failure> {
    request
        .get(key)
        .ok_or_else(|| Failure::invalid(format!("the request has no {key:?}")))
}

fn text<'a>(request: &'a Map<String, Value>, key: &str) -> Result<&'a str, Failure> {
    field(request, key)?
        .as_str()
        .ok_or_else(|| Failure::invalid(format!("{key:?} must be a string")))
}

/// An optional object field as JSON text (`None` when absent or null).
fn object_text(request: &Map<String, Value>, key: &str) -> Result<Option<String>, Failure> {
    match request.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value @ Value::Object(_)) => Ok(Some(value.to_string())),
        Some(_) => Err(Failure::invalid(format!(
            "{key:?} must be an object or null"
        ))),
    }
}

fn required_object_text(request: &Map<String, Value>, key: &str) -> Result<String, Failure> {
    object_text(request, key)?
        .ok_or_else(|| Failure::invalid(format!("the request has no {key:?}")))
}

fn handle(request: &Map<String, Value>, key: &str) -> Result<u64, Failure> {
    field(request, key)?
        .as_u64()
        .ok_or_else(|| Failure::invalid(format!("{key:?} must be a handle")))
}

/// A document an op returned as text, as a value.
fn document(json: &str) -> Result<Value, Failure> {
    serde_json::from_str(json)
        .map_err(|e| Failure::new(CfStatus::CfPanic, format!("an answer is not JSON: {e}")))
}

fn unknown(kind: &str, id: u64) -> Failure {
    Failure::invalid(format!(
        "no {kind} {id} in this session (freed, or never made)"
    ))
}

impl Session {
    pub fn new() -> Self {
        Self::default()
    }

    fn fresh(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn task(&self, request: &Map<String, Value>) -> Result<TaskEntry, Failure> {
        let id = handle(request, "task")?;
        lock(&self.tasks)
            .get(&id)
            .cloned()
            .ok_or_else(|| unknown("task", id))
    }

    /// Cancel every task's console work: the client is gone.
    pub fn cancel_all(&self) {
        for stop in lock(&self.stops).values() {
            stop.store(true, Ordering::SeqCst);
        }
    }

    fn planner(&self, request: &Map<String, Value>) -> Result<Arc<Built>, Failure> {
        let id = handle(request, "planner")?;
        lock(&self.planners)
            .get(&id)
            .cloned()
            .ok_or_else(|| unknown("planner", id))
    }

    /// One request, as a response document (`{"ok": ...}` or `{"error":
    /// ...}`, with the request's `id`). Never panics: a panic of the
    /// library is `CF_PANIC`.
    pub fn call(&self, request: &str) -> Value {
        let parsed: Result<Map<String, Value>, _> = serde_json::from_str(request);
        let (id, result) = match parsed {
            Ok(request) => {
                let id = request.get("id").cloned().unwrap_or(Value::Null);
                let result = match catch_unwind(AssertUnwindSafe(|| self.dispatch(&request))) {
                    Ok(result) => result,
                    Err(payload) => {
                        let message = crate::panic_message(payload.as_ref());
                        let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
                        Err(Failure::new(CfStatus::CfPanic, message))
                    }
                };
                (id, result)
            }
            Err(e) => (
                Value::Null,
                Err(Failure::invalid(format!(
                    "the request is not a JSON object: {e}"
                ))),
            ),
        };
        match result {
            Ok(ok) => json!({"id": id, "ok": ok}),
            Err(failure) => json!({
                "id": id,
                "error": {"status": failure.status as i32, "message": failure.message},
            }),
        }
    }

    fn dispatch(&self, request: &Map<String, Value>) -> Result<Value, Failure> {
        match text(request, "op")? {
            "abi" => Ok(json!({
                "abi": crate::CF_ABI_VERSION,
                "version": env!("CARGO_PKG_VERSION"),
            })),
            "planner_new" => {
                let options = object_text(request, "options")?.unwrap_or_else(|| "{}".into());
                let (built, answer) = ops::planner_new(&options)?;
                let mut answer = document(&answer)?;
                let id = self.fresh();
                lock(&self.planners).insert(id, Arc::new(built));
                answer["planner"] = json!(id);
                Ok(answer)
            }
            "planner_free" => {
                let id = handle(request, "planner")?;
                lock(&self.planners).remove(&id);
                Ok(json!({}))
            }
            "plan" => {
                let built = self.planner(request)?;
                let overrides = object_text(request, "overrides")?;
                let answer = ops::plan(
                    &built,
                    text(request, "pod")?.as_bytes(),
                    text(request, "vm")?.as_bytes(),
                    overrides.as_deref(),
                )?;
                document(&answer)
            }
            "task_start" => {
                let built = self.planner(request)?;
                let options = object_text(request, "options")?;
                let (task, action) =
                    task::start(&built, text(request, "pod")?.as_bytes(), options.as_deref())?;
                let action = document(&action)?;
                let id = self.fresh();
                lock(&self.stops).insert(id, task.stop_flag());
                lock(&self.tasks).insert(id, Arc::new(Mutex::new((built, task))));
                Ok(json!({"task": id, "action": action}))
            }
            "task_next" => {
                let id = handle(request, "task")?;
                let entry = lock(&self.tasks)
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| unknown("task", id))?;
                let report = required_object_text(request, "report")?;
                let mut entry = lock(&entry);
                let (built, task) = &mut *entry;
                document(&task::next(built, task, &report)?)
            }
            "task_free" => {
                let id = handle(request, "task")?;
                if let Some(stop) = lock(&self.stops).remove(&id) {
                    stop.store(true, Ordering::SeqCst);
                }
                lock(&self.tasks).remove(&id);
                Ok(json!({}))
            }
            "task_cancel" => {
                let id = handle(request, "task")?;
                let stop = lock(&self.stops)
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| unknown("task", id))?;
                stop.store(true, Ordering::SeqCst);
                Ok(json!({}))
            }
            "console_open" => {
                let entry = self.task(request)?;
                let mut entry = lock(&entry);
                let (built, task) = &mut *entry;
                document(&console::open(built, task, &fixup_sac::Budgets::default())?)
            }
            "console_set" => {
                let entry = self.task(request)?;
                let mut entry = lock(&entry);
                document(&console::set(&mut entry.1)?)
            }
            "lease" => {
                let built = self.planner(request)?;
                document(&ops::lease(&built, text(request, "mac")?)?)
            }
            "observe" => observe(request),
            "merge" => merge(request),
            other => Err(Failure::invalid(format!(
                "unknown op {other:?}: abi, planner_new, planner_free, plan, task_start, task_next, task_free, task_cancel, console_open, console_set, lease, observe, merge"
            ))),
        }
    }
}

/// A record the embedder passed back (`key`): `None` when null or absent;
/// `Err` with why when it is not a record this library wrote.
fn record_field(request: &Map<String, Value>, key: &str) -> Result<Option<PodMemory>, String> {
    match request.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(record) => PodMemory::from_json(record.to_string().as_bytes())
            .map(Some)
            .map_err(|e| format!("{key}: {e}")),
    }
}

/// The `observe` op: what a watch of the embedder's saw of a pod, noted in
/// the pod's record as the daemon notes what its own watch sees
/// ([`PodMemory::observe`]): the hibernate history by which a VM is a wake
/// (spec section 2, rule 3). `record` is the pod's stored record (null:
/// none, so this is the host's first sight of the pod); `live` says the
/// pod came in a watch event with no gap before it (not a list or a
/// re-list); `watched_since_new` is what the last `observe` of the pod
/// answered (not durable: false after the embedder's restart). The
/// embedder stores the record it gets back when `changed` (always after a
/// first sight), and passes it as a task's `memory.record`. A stored record
/// that is not usable is replaced by a new one (not a first sight: its
/// history is lost, which is a gap), with a `warning`.
fn observe(request: &Map<String, Value>) -> Result<Value, Failure> {
    let flag = |key: &str| match request.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(Failure::invalid(format!("{key} must be true or false"))),
    };
    let (live, watched) = (flag("live")?, flag("watched_since_new")?);
    let pod = ops::read_pod(text(request, "pod")?.as_bytes())?;
    let (mut record, first, warning) = match record_field(request, "record") {
        Ok(Some(record)) => (record, false, None),
        Ok(None) => (PodMemory::new(), true, None),
        Err(e) => (PodMemory::new(), false, Some(e)),
    };
    if watched || !first {
        // Watched since new holds only beside the record that noted the
        // watch: with none, or one that was not usable, there was a gap.
        record.set_watched_since_new(watched && !first && warning.is_none());
    }
    let changed = record.observe(&pod, live) || first || warning.is_some();
    let watched = record.watched_since_new();
    let mut answer = json!({
        "record": encode(&record)?,
        "changed": changed,
        "watched_since_new": watched,
    });
    if let Some(e) = warning {
        answer["warning"] = json!(format!(
            "the stored record was not usable ({e}): a new one replaces it, and the pod's hibernate history starts again"
        ));
    }
    Ok(answer)
}

/// The `merge` op: the record of a task's `remember` action kept into the
/// stored one as the daemon keeps it ([`PodMemory::take_task_parts`]): the
/// task's parts (the wake verdict, the marker's VM, the budget, when a VM
/// was first seen) when its copy is newer, what `observe` noted as
/// stored, so that neither loses the other's changes. The embedder stores
/// the record it gets back when `changed`, with no `observe` of the same
/// pod in between.
fn merge(request: &Map<String, Value>) -> Result<Value, Failure> {
    let task = match record_field(request, "task") {
        Ok(Some(task)) => task,
        Ok(None) => {
            return Err(Failure::invalid(
                "task is the record a remember action gave",
            ));
        }
        Err(e) => {
            return Err(Failure::invalid(format!(
                "{e}; pass the record the remember action gave"
            )));
        }
    };
    let (record, changed, warning) = match record_field(request, "stored") {
        Ok(Some(mut stored)) => {
            let changed = stored.take_task_parts(&task);
            (stored, changed, None)
        }
        Ok(None) => (task, true, None),
        Err(e) => (task, true, Some(e)),
    };
    let mut answer = json!({"record": encode(&record)?, "changed": changed});
    if let Some(e) = warning {
        answer["warning"] = json!(format!(
            "the stored record was not usable ({e}): the task's replaces it"
        ));
    }
    Ok(answer)
}

fn encode(record: &PodMemory) -> Result<Value, Failure> {
    serde_json::to_value(record)
        .map_err(|e| Failure::invalid(format!("cannot encode the record: {e}")))
}

/// Requests in flight and their bytes, bounded by [`IN_FLIGHT_MAX`] and
/// [`IN_FLIGHT_BYTES_MAX`].
#[derive(Default)]
struct InFlight {
    held: Mutex<(usize, usize)>,
    changed: Condvar,
}

impl InFlight {
    fn enter(&self, bytes: usize) {
        let mut held = lock(&self.held);
        while held.0 >= IN_FLIGHT_MAX || (held.0 > 0 && held.1 + bytes > IN_FLIGHT_BYTES_MAX) {
            held = self
                .changed
                .wait(held)
                .unwrap_or_else(PoisonError::into_inner);
        }
        held.0 += 1;
        held.1 += bytes;
    }

    fn leave(&self, bytes: usize) {
        let mut held = lock(&self.held);
        held.0 -= 1;
        held.1 -= bytes;
        drop(held);
        self.changed.notify_all();
    }

    /// Wait for the requests in flight to finish, for at most `within`:
    /// how many are left.
    fn drain(&self, within: Duration) -> usize {
        let end = std::time::Instant::now() + within;
        let mut held = lock(&self.held);
        while held.0 > 0 {
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            held = self
                .changed
                .wait_timeout(held, left.min(Duration::from_millis(100)))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        held.0
    }
}

/// Read one line of at most `max` bytes (without its newline) into `line`;
/// `Ok(false)` at the end of input. A longer line is read to its end and
/// dropped: `Err(length read)`.
fn read_line(
    input: &mut impl BufRead,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Result<bool, usize>> {
    line.clear();
    let mut over = 0usize;
    loop {
        let buf = input.fill_buf()?;
        if buf.is_empty() {
            return Ok(if over > 0 {
                Err(over)
            } else {
                Ok(!line.is_empty())
            });
        }
        let (chunk, found) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if over > 0 || line.len() + chunk.len() > max {
            over = over.max(line.len()) + chunk.len();
            line.clear();
        } else {
            line.extend_from_slice(chunk);
        }
        let used = found.unwrap_or(buf.len());
        input.consume(used);
        if found.is_some() {
            return Ok(if over > 0 { Err(over) } else { Ok(true) });
        }
    }
}

/// Serve requests from `input`, one JSON document per line, until its
/// end; each response is one line on `output`, written whole, in the order
/// the requests finish. Requests run at once on threads of their own (at
/// most [`IN_FLIGHT_MAX`]); at the end of input the ones in flight finish
/// first, for at most [`DRAIN_MAX_SECS`] (each op is bounded on its own;
/// this bounds the whole). Blank lines are ignored.
pub fn serve<R: BufRead, W: Write + Send + 'static>(
    mut input: R,
    output: W,
) -> std::io::Result<()> {
    let session = Arc::new(Session::new());
    let output = Arc::new(Mutex::new(output));
    let in_flight = Arc::new(InFlight::default());
    let write = |output: &Mutex<W>, response: &Value| {
        let mut line = response.to_string();
        line.push('\n');
        let mut out = lock(output);
        // A client that went away ends the work at the next read.
        let _ = out.write_all(line.as_bytes()).and_then(|()| out.flush());
    };
    let mut line = Vec::new();
    loop {
        match read_line(&mut input, &mut line, REQUEST_MAX_BYTES)? {
            Ok(false) => break,
            Ok(true) => {}
            Err(length) => {
                let failure = Failure::invalid(format!(
                    "a request of {length} bytes is longer than {REQUEST_MAX_BYTES}: it was not read"
                ));
                write(
                    &output,
                    &json!({"id": null, "error": {"status": failure.status as i32, "message": failure.message}}),
                );
                continue;
            }
        }
        let Ok(request) = std::str::from_utf8(&line).map(str::trim) else {
            write(
                &output,
                &json!({"id": null, "error": {"status": CfStatus::CfInvalidArgument as i32, "message": "the request is not UTF-8"}}),
            );
            continue;
        };
        if request.is_empty() {
            continue;
        }
        let request = request.to_owned();
        let bytes = request.len();
        in_flight.enter(bytes);
        let (session, out, leaving) = (
            Arc::clone(&session),
            Arc::clone(&output),
            Arc::clone(&in_flight),
        );
        let spawned = std::thread::Builder::new()
            .name("cocoon-fixup-op".into())
            .spawn(move || {
                let response = session.call(&request);
                write(&out, &response);
                leaving.leave(bytes);
            });
        if let Err(e) = spawned {
            in_flight.leave(bytes);
            return Err(e);
        }
    }
    // The client is gone: no console it asked for is worth waiting for.
    session.cancel_all();
    let left = in_flight.drain(Duration::from_secs(DRAIN_MAX_SECS));
    if left > 0 {
        eprintln!(
            "embed: {left} request(s) still in flight {DRAIN_MAX_SECS} s after the end of input: exiting without their answers"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    #[test]
    fn the_drain_after_the_input_is_bounded() {
        let in_flight = InFlight::default();
        in_flight.enter(10);
        assert_eq!(in_flight.drain(Duration::from_millis(30)), 1, "one is left");
        in_flight.leave(10);
        assert_eq!(in_flight.drain(Duration::from_secs(60)), 0);
    }

    fn ask(session: &Session, request: Value) -> Value {
        session.call(&request.to_string())
    }

    #[test]
    fn an_unknown_op_or_a_bad_request_is_an_invalid_argument() {
        let session = Session::new();
        for (request, has) in [
            ("[]", "not a JSON object"),
            ("{\"id\": 3}", "no \"op\""),
            ("{\"id\": 3, \"op\": \"fly\"}", "unknown op"),
            (
                "{\"id\": 3, \"op\": \"task_next\", \"task\": 9, \"report\": {}}",
                "no task 9",
            ),
        ] {
            let response = session.call(request);
            assert_eq!(response["error"]["status"], 1, "{response}");
            assert!(
                response["error"]["message"].as_str().unwrap().contains(has),
                "{response}"
            );
        }
        assert_eq!(session.call("{\"id\": 3, \"op\": \"fly\"}")["id"], 3);
    }

    /// A hibernation and a wake seen through `observe` make the record
    /// the daemon's own watch would make: a task started with it takes the
    /// new VM for a wake by the history at once (spec section 2, rule 3),
    /// where a task without it asks for the stack's events first.
    #[test]
    fn a_hibernate_history_observed_through_the_op_makes_the_vm_a_wake() {
        use fixup_core::annotations::keys;
        use fixup_core::facts::annotations as a;
        let session = Session::new();
        let root = tempfile::tempdir().unwrap();
        let made = ask(
            &session,
            json!({"op": "planner_new", "options": {"cocoon_root": root.path(), "plugin_dir": "", "no_cache": true}}),
        );
        let planner = made["ok"]["planner"].as_u64().expect("a handle");
        let name = fixup_core::binding::vm_name_for_pod("desktops", "desk-0");
        let pod = |id: &str, lifecycle: &str| {
            let mut annotations = json!({
                a::MANAGED: "true", a::OS: "windows", a::BACKEND: "cloud-hypervisor",
                a::VM_NAME: name,
            });
            if !id.is_empty() {
                annotations[a::VM_ID] = json!(id);
            }
            if !lifecycle.is_empty() {
                annotations[keys::LIFECYCLE_STATE] = json!(lifecycle);
            }
            json!({"metadata": {"name": "desk-0", "namespace": "desktops", "uid": "u-1",
                "resourceVersion": "7", "annotations": annotations}})
            .to_string()
        };
        let observe = |record: &Value, pod: String, live: bool| {
            let answer = ask(
                &session,
                json!({"op": "observe", "record": record, "pod": pod, "live": live}),
            );
            assert!(answer.get("error").is_none(), "{answer}");
            answer["ok"].clone()
        };
        let listed = observe(&Value::Null, pod("vm-a", "running"), false);
        assert_eq!(listed["changed"], true, "{listed}");
        let hibernated = observe(&listed["record"], pod("", "hibernated"), true);
        assert_eq!(hibernated["changed"], true, "{hibernated}");
        let woken = observe(&hibernated["record"], pod("vm-b", ""), true);
        assert_eq!(woken["record"]["wake_vm"], "vm-b", "{woken}");
        let again = observe(&woken["record"], pod("vm-b", ""), true);
        assert_eq!(again["changed"], false, "{again}");
        // A task's copy read before the hibernation, kept late: its own
        // part lands, the hibernation noted since stays.
        let mut late = listed["record"].clone();
        late["revision"] = json!(1);
        late["marker_vm"] = json!("vm-a");
        let merged = ask(
            &session,
            json!({"op": "merge", "stored": hibernated["record"], "task": late}),
        );
        assert_eq!(merged["ok"]["changed"], true, "{merged}");
        assert_eq!(merged["ok"]["record"]["marker_vm"], "vm-a", "{merged}");
        assert_eq!(merged["ok"]["record"]["hibernated"], true, "{merged}");
        // An older copy still than what is stored changes nothing.
        let stale = ask(
            &session,
            json!({"op": "merge", "stored": merged["ok"]["record"], "task": late}),
        );
        assert_eq!(stale["ok"]["changed"], false, "{stale}");
        // A first sight is always stored, even when it noted nothing.
        let first = observe(&Value::Null, pod("", ""), false);
        assert_eq!(first["changed"], true, "{first}");
        // A stored record that is not one is replaced, with a warning and
        // as a gap in the watch.
        let bad = observe(&json!({"version": 99}), pod("vm-b", ""), true);
        assert_eq!(bad["changed"], true, "{bad}");
        assert_eq!(bad["watched_since_new"], false, "{bad}");
        assert!(
            bad["warning"]
                .as_str()
                .is_some_and(|m| m.contains("not usable")),
            "{bad}"
        );

        // Bytes a damaged store gave, passed as a string: replaced too.
        let damaged = observe(&json!("{\"version\": 1, \"hib"), pod("vm-b", ""), true);
        assert!(damaged["warning"].is_string(), "{damaged}");
        assert_eq!(damaged["changed"], true, "{damaged}");
        assert_eq!(damaged["watched_since_new"], false, "{damaged}");
        let replaced = ask(
            &session,
            json!({"op": "merge", "stored": "{\"version\": 1, \"hib", "task": woken["record"]}),
        );
        assert!(replaced["ok"]["warning"].is_string(), "{replaced}");
        assert_eq!(replaced["ok"]["record"], woken["record"], "{replaced}");
        // A caller that says it watched the pod but has no record for it
        // had a gap: the claim is not taken.
        let claimed = ask(
            &session,
            json!({"op": "observe", "record": null, "pod": pod("vm-b", "running"),
                "live": true, "watched_since_new": true}),
        );
        assert_eq!(claimed["ok"]["watched_since_new"], false, "{claimed}");
        let kept = ask(
            &session,
            json!({"op": "observe", "record": woken["record"], "pod": pod("vm-b", "running"),
                "live": true, "watched_since_new": true}),
        );
        assert_eq!(kept["ok"]["watched_since_new"], true, "{kept}");

        let vm = json!({"id": "vm-b", "hypervisor": "cloud-hypervisor", "state": "running",
            "config": {"name": name}, "created_at": "2025-11-30T10:50:00Z",
            "network_configs": [{"mac": "52:54:00:9a:24:d6", "network": {"ip": ""}}]});
        // The action after the inspect, and after the stack's `events`
        // when given and asked for.
        let after_inspect_with = |record: &Value, events: Option<Value>| {
            let options =
                json!({"memory": {"record": record, "now_unix_ms": 1_764_500_000_000u64}});
            let started = ask(
                &session,
                json!({"op": "task_start", "planner": planner, "pod": pod("vm-b", ""), "options": options}),
            );
            let task = started["ok"]["task"].as_u64().expect("a task");
            assert_eq!(started["ok"]["action"]["action"], "admit", "{started}");
            let next = |report: Value| {
                ask(
                    &session,
                    json!({"op": "task_next", "task": task, "report": report}),
                )["ok"]
                    .clone()
            };
            let inspect = next(json!({"now_ms": 0, "go": true}));
            assert_eq!(inspect["action"], "inspect", "{inspect}");
            let mut action = next(json!({"now_ms": 0, "inspected": vm}));
            let skip = |mut action: Value| {
                // Fire-and-forget actions first (the record's first sight).
                while matches!(action["action"].as_str(), Some("remember" | "note")) {
                    action = next(json!({"now_ms": 0, "go": true}));
                }
                action
            };
            action = skip(action);
            if let Some(events) = events
                && action["action"] == "wake_events"
            {
                action = skip(next(json!({"now_ms": 0, "events": events})));
            }
            action["action"].as_str().unwrap_or_default().to_owned()
        };
        let after_inspect = |record: &Value| after_inspect_with(record, None);
        assert_eq!(after_inspect(&Value::Null), "wake_events");
        // A record the library did not write starts the task on a new one.
        assert_eq!(after_inspect(&json!({"version": 99})), "wake_events");
        // History says "a wake or a recreate": the stack's witness is
        // asked for first.
        assert_eq!(after_inspect(&woken["record"]), "wake_events");
        let woken_event = json!([{"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "reason": "Woken", "type": "Normal", "reportingController": "vk-cocoon",
            "regarding": {"kind": "Pod", "uid": "u-1"},
            "eventTime": "2025-11-30T10:53:20Z"}]);
        let by_history = after_inspect_with(&woken["record"], Some(woken_event));
        // Rule 3 witnessed, no PnP: the IP wait at once, which gives the
        // turn back.
        assert_eq!(by_history, "release");
    }

    #[test]
    fn a_planner_plans_and_is_freed() {
        let session = Session::new();
        let root = tempfile::tempdir().unwrap();
        let leases = root.path().join("leases.json");
        let made = ask(
            &session,
            json!({"id": 1, "op": "planner_new", "options": {"cocoon_root": root.path(), "plugin_dir": "", "no_cache": true, "lease_file": leases}}),
        );
        let planner = made["ok"]["planner"].as_u64().expect("a handle");
        // The lease op: one look at the lease file, whatever it holds.
        let lease = |mac: &str| {
            ask(
                &session,
                json!({"op": "lease", "planner": planner, "mac": mac}),
            )
        };
        // No file yet holds no lease, as the daemon's watcher reads it.
        let missing = lease("52:54:00:aa:bb:01");
        assert_eq!(missing["ok"], json!({"lease": null}), "{missing}");
        // cocoon-net writes `null` when its lease table is empty.
        std::fs::write(&leases, "null").unwrap();
        let none = lease("52:54:00:aa:bb:01");
        assert_eq!(none["ok"], json!({"lease": null}), "{none}");
        std::fs::write(&leases, "{\"not\": \"rows\"}").unwrap();
        let unusable = lease("52:54:00:aa:bb:01");
        assert!(
            unusable["ok"]["lease_error"]
                .as_str()
                .unwrap()
                .contains("not a JSON array"),
            "{unusable}"
        );
        std::fs::write(
            &leases,
            json!([
                {"mac": "52:54:00:AA:BB:01", "ip": "10.0.0.9", "expiry": "2999-01-01T00:00:00Z"},
                {"mac": "52:54:00:aa:bb:02", "ip": "10.0.0.8", "expiry": "2001-01-01T00:00:00Z"},
            ])
            .to_string(),
        )
        .unwrap();
        assert_eq!(
            lease("52:54:00:aa:bb:01")["ok"],
            json!({"lease": "10.0.0.9"})
        );
        assert_eq!(
            lease("52:54:00:aa:bb:02")["ok"],
            json!({"lease": null}),
            "expired"
        );
        assert_eq!(lease("nonsense")["error"]["status"], 1);
        let started = ask(
            &session,
            json!({"op": "task_start", "planner": planner, "pod": "{\"kind\": \"Pod\""}),
        );
        assert_eq!(
            started["error"]["status"],
            CfStatus::CfBadInput as i32,
            "{started}"
        );
        ask(&session, json!({"op": "planner_free", "planner": planner}));
        let gone = ask(
            &session,
            json!({"op": "plan", "planner": planner, "pod": "{}", "vm": "{}"}),
        );
        assert!(
            gone["error"]["message"]
                .as_str()
                .unwrap()
                .contains("no planner"),
            "{gone}"
        );
    }

    #[test]
    fn a_pipe_answers_every_request_by_id_and_refuses_an_overlong_line() {
        let mut input = String::new();
        for id in 0..20 {
            input.push_str(&json!({"id": id, "op": "abi"}).to_string());
            input.push('\n');
        }
        input.push('\n');
        input.push_str(&"x".repeat(REQUEST_MAX_BYTES + 10));
        input.push('\n');
        input.push_str("{\"id\": \"last\", \"op\": \"abi\"}");
        #[derive(Clone, Default)]
        struct Shared(Arc<Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                lock(&self.0).extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let out = Shared::default();
        serve(Cursor::new(input.into_bytes()), out.clone()).unwrap();
        let text = String::from_utf8(lock(&out.0).clone()).unwrap();
        let responses: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(responses.len(), 22, "{text}");
        let mut ids: Vec<String> = responses.iter().map(|r| r["id"].to_string()).collect();
        ids.sort();
        assert!(ids.contains(&"\"last\"".to_owned()));
        assert!((0..20).all(|i| ids.contains(&i.to_string())));
        let refused = responses.iter().find(|r| r["id"].is_null()).unwrap();
        assert!(
            refused["error"]["message"]
                .as_str()
                .unwrap()
                .contains("longer than"),
            "{refused}"
        );
        for r in responses.iter().filter(|r| !r["id"].is_null()) {
            assert_eq!(r["ok"]["abi"], crate::CF_ABI_VERSION);
        }
    }
}
