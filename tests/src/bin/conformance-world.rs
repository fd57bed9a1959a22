//! The world of one conformance scenario (`tests/conformance/`), served
//! over standard input and output, for executors that are not written in
//! Rust: the Go package's `Run` replays every scenario through fakes of its
//! VM, Pods, Leases, Clock and console that ask this program what the
//! world does, then this program checks what the executor did against the
//! scenario's expectations with the same check the Rust replays use.
//!
//! `conformance-world <scenario.json> <cocoon root>`; the scenario's
//! overlay, when it has one, is made in the cocoon root first. One JSON
//! request per line, one response per line:
//!
//! - `{"op": "start"}`: `{"pod", "trigger", "settings", "accept_legacy",
//!   "accept_annotated", "memory" (null, or {"record", "now_unix_ms",
//!   "watched_since_new"}), "knows" (null, or what the embedder knows of
//!   the VM: {"boot", "source_image", "record_lacks"}), "wall_ms",
//!   "down"}`.
//! - A `publish` action is the embedder publishing a lifecycle change.
//! - `{"op": "act", "now_ms", "action": {...}}`: the action as the task
//!   op hands it out, carried out against the world:
//!   `{"report": {...}, "now_ms", "down"}`.
//! - `{"op": "finish", "action": {finish action}}`: `{"passed": true}` or
//!   `{"passed": false, "why": "..."}`; the program ends.

use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Duration;

use fixup_kit::conformance::{Scenario, World, answer, pod_json, task_options};
use serde_json::{Value, json};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, scenario_path, root] = args.as_slice() else {
        eprintln!("usage: conformance-world <scenario.json> <cocoon root>");
        std::process::exit(2);
    };
    let scenario = Scenario::read(Path::new(scenario_path)).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2);
    });
    if scenario.overlay {
        let id = scenario
            .vm
            .as_ref()
            .and_then(|vm| vm["id"].as_str())
            .expect("an overlay's VM has an id");
        let dir = Path::new(root).join("run/cloudhypervisor").join(id);
        std::fs::create_dir_all(&dir).expect("the overlay's folder");
        std::fs::write(dir.join("overlay.qcow2"), b"").expect("the overlay");
    }
    let mut world = World::new(&scenario);
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line.expect("reading a request");
        if line.trim().is_empty() {
            continue;
        }
        let request: Value = serde_json::from_str(&line).expect("a request is JSON");
        let response = match request["op"].as_str() {
            Some("start") => {
                let options = task_options(&world, &scenario);
                json!({
                    "pod": pod_json(&world.first_read()),
                    "trigger": options["trigger"],
                    "settings": options["settings"],
                    "accept_legacy": scenario.settings.accept_legacy_vm_names,
                    "accept_annotated": scenario.settings.accept_annotated_vm_names,
                    "memory": options.get("memory").cloned().unwrap_or(Value::Null),
                    "knows": options.get("knows").cloned().unwrap_or(Value::Null),
                    "wall_ms": scenario.wall_start_ms,
                    "down": world.down(Duration::ZERO),
                })
            }
            Some("act") => {
                let mut now = Duration::from_millis(request["now_ms"].as_u64().expect("now_ms"));
                match answer(&mut world, &mut now, &request["action"]) {
                    Ok(report) => json!({
                        "report": report,
                        "now_ms": u64::try_from(now.as_millis()).expect("ms"),
                        "down": world.down(now),
                    }),
                    Err(_) => {
                        json!({"error": "finish is not an action to carry out: send op finish"})
                    }
                }
            }
            Some("finish") => {
                let mut now = Duration::ZERO;
                let response = match answer(&mut world, &mut now, &request["action"]) {
                    Err(ended) => match scenario.check(&world, &ended) {
                        Ok(()) => json!({"passed": true}),
                        Err(why) => {
                            json!({"passed": false, "why": format!("{}\n{why}", scenario.about)})
                        }
                    },
                    Ok(_) => json!({"passed": false, "why": "the last action was not finish"}),
                };
                writeln!(out, "{response}").expect("writing");
                return;
            }
            other => json!({"error": format!("unknown op {other:?}")}),
        };
        writeln!(out, "{response}").expect("writing");
        out.flush().expect("flushing");
    }
}
