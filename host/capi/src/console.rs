//! The VM's serial console for the Windows static-IP pass (spec section
//! 10), for an embedder that carries out the task op's `sac_open` and
//! `sac_set` actions: the library carries out the action the task itself
//! handed out and awaits, and nothing else (no VM id or address comes from
//! the embedder), with the console client the daemon uses (`fixup-sac`:
//! the socket path confined to the planner's cocoon root, every read
//! bounded, lines built only from checked values), within the pass's total
//! deadline the action carries, and until the task is cancelled
//! ([`crate::task::Task::stop`]). The console lives in the task until its
//! `sac_close`. The answer is the report the task wants, ready to pass to
//! `cf_task_next` with `now_ms` added.

use std::time::{Duration, Instant};

use fixup_sac::{Budgets, ConsoleSocket, Deadline, SacError, Session, StopCheck};
use serde_json::json;

use crate::ops::{Built, Failure};
use crate::task::{ConsoleAsk, Task};

/// An open console.
#[derive(Debug)]
pub struct Console {
    session: Session,
    /// When the pass's total deadline ends on the library's own clock, as
    /// the open computed it: an embedder whose clock stands still never
    /// gives a later step more.
    ends: Instant,
}

/// A console error as the task op's reports spell it.
pub use fixup_core::decision::reports::sac_error_json as error_json;

/// The pass's deadline as an instant: what is left of it at the task's
/// last report.
fn deadline(task: &Task, until: Duration, total: Duration) -> Deadline {
    Deadline::after(until.saturating_sub(task.now), total)
}

fn not_awaited(task: &Task, op: &str) -> Failure {
    let awaits = match &task.pending {
        Some(ConsoleAsk::Open { .. }) => "sac_open",
        Some(ConsoleAsk::Set { .. }) => "sac_set",
        None => "no console action",
    };
    Failure::invalid(format!(
        "the task does not await {op} (it awaits {awaits}): carry out the action the task handed out last"
    ))
}

/// Carry out the task's pending `sac_open` with `budgets`: the report for
/// the task (`{"sac_opened": [...]}`, `{"sac_open_error": {...}}` or
/// `{"cancelled": true}`). Refused when the task does not await one.
pub fn open(built: &Built, task: &mut Task, budgets: &Budgets) -> Result<String, Failure> {
    let Some(ConsoleAsk::Open {
        vm,
        need,
        until,
        total,
    }) = task.pending.clone()
    else {
        return Err(not_awaited(task, "sac_open"));
    };
    task.pending = None;
    task.console = None;
    let stop = StopCheck::flag(task.stop_flag());
    let deadline = deadline(task, until, total);
    let ends = Instant::now() + until.saturating_sub(task.now);
    let opened =
        ConsoleSocket::new(built.planner.cocoon_root(), vm.as_str()).and_then(|mut dial| {
            let mut session = Session::open_until(&mut dial, budgets, stop, Some(deadline))?;
            let nets = session.enumerate(need)?;
            Ok((nets, session))
        });
    Ok(match opened {
        Ok((nets, session)) => {
            task.console = Some(Console { session, ends });
            json!({"sac_opened": nets}).to_string()
        }
        Err(SacError::Stopped) => json!({"cancelled": true}).to_string(),
        Err(e) => json!({"sac_open_error": error_json(&e)}).to_string(),
    })
}

/// Carry out the task's pending `sac_set` on its open console: the report
/// for the task (`{"sac_set": true}`, `{"sac_set_error": {...}}` or
/// `{"cancelled": true}`). Refused when the task does not await one.
pub fn set(task: &mut Task) -> Result<String, Failure> {
    let Some(ConsoleAsk::Set {
        net,
        nic,
        until,
        total,
    }) = task.pending.clone()
    else {
        return Err(not_awaited(task, "sac_set"));
    };
    let left = until.saturating_sub(task.now);
    let Some(console) = task.console.as_mut() else {
        return Err(Failure::invalid("the task has no open console"));
    };
    task.pending = None;
    let left = left.min(console.ends.saturating_duration_since(Instant::now()));
    console
        .session
        .set_deadline(Some(Deadline::after(left, total)));
    Ok(match console.session.set_static(net, &nic) {
        Ok(()) => json!({"sac_set": true}).to_string(),
        Err(SacError::Stopped) => json!({"cancelled": true}).to_string(),
        Err(e) => json!({"sac_set_error": error_json(&e)}).to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fixup_sac::sim::{Script, SetMode, Sim, SimNet, console_path_in};
    use serde_json::Value;

    fn built(root: &std::path::Path) -> Built {
        let options = json!({"cocoon_root": root, "plugin_dir": "", "no_cache": true});
        crate::ops::planner_new(&options.to_string()).unwrap().0
    }

    fn quick() -> Budgets {
        Budgets {
            dial_total: Duration::from_millis(500),
            connect_try: Duration::from_millis(100),
            connect_retry: Duration::from_millis(20),
            prompt_read: Duration::from_millis(100),
            drain: Duration::from_millis(5),
            answer: Duration::from_millis(200),
            enum_interval: Duration::from_millis(10),
            set_interval: Duration::from_millis(10),
            ..Budgets::default()
        }
    }

    /// A task (a preparation's: any task will do) awaiting `ask`.
    fn awaiting(built: &Built, ask: Option<ConsoleAsk>) -> Task {
        let pod = json!({"metadata": {"name": "demo-2", "namespace": "prod", "uid": "u-1",
            "resourceVersion": "7"}});
        let options = json!({"trigger": "prepare"}).to_string();
        let (mut task, _) =
            crate::task::start(built, pod.to_string().as_bytes(), Some(&options)).expect("a task");
        task.pending = ask;
        task
    }

    fn open_ask(vm: &str, need: usize, until_ms: u64) -> Option<ConsoleAsk> {
        Some(ConsoleAsk::Open {
            vm: fixup_core::facts::VmId::parse(vm).unwrap(),
            need,
            until: Duration::from_millis(until_ms),
            total: Duration::from_millis(until_ms),
        })
    }

    fn set_ask(net: u32, ip: &str, prefix: Option<u8>) -> Option<ConsoleAsk> {
        Some(ConsoleAsk::Set {
            net,
            nic: fixup_sac::StaticNic {
                ip: ip.parse().unwrap(),
                prefix,
                gateway: None,
            },
            until: Duration::from_secs(60),
            total: Duration::from_secs(60),
        })
    }

    fn root() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("c")
            .tempdir_in("/tmp")
            .unwrap()
    }

    /// The task's own console actions, carried out against the simulator
    /// on the VM's console socket: the reports the task wants; an action
    /// the task does not await is refused, before anything is dialled.
    #[test]
    fn only_the_tasks_pending_console_actions_are_carried_out() {
        let root = root();
        let built = built(root.path());
        let sim = Sim::start(
            console_path_in(root.path(), "vm-1").unwrap(),
            Script::new()
                .net(SimNet::new(7, "169.254.1.1"))
                .net(SimNet::new(9, "169.254.1.2").set_mode(SetMode::Never)),
        )
        .unwrap();
        let mut task = awaiting(&built, None);
        let e = open(&built, &mut task, &quick()).unwrap_err();
        assert!(
            e.message.contains("does not await sac_open"),
            "{}",
            e.message
        );
        task.pending = set_ask(7, "10.0.0.5", Some(24));
        let e = open(&built, &mut task, &quick()).unwrap_err();
        assert!(e.message.contains("it awaits sac_set"), "{}", e.message);
        assert_eq!(sim.connections(), 0);
        task.pending = open_ask("vm-1", 2, 60_000);
        let e = set(&mut task).unwrap_err();
        assert!(
            e.message.contains("does not await sac_set"),
            "{}",
            e.message
        );
        let report = open(&built, &mut task, &quick()).unwrap();
        assert_eq!(report, r#"{"sac_opened":[7,9]}"#);
        // Carried out once: the task must hand out its next action.
        assert!(open(&built, &mut task, &quick()).is_err());
        task.pending = set_ask(7, "10.0.0.5", Some(24));
        assert_eq!(set(&mut task).unwrap(), r#"{"sac_set":true}"#);
        assert!(
            sim.received()
                .contains(&"i 7 10.0.0.5 255.255.255.0 \r\n".to_owned()),
            "{:?}",
            sim.received()
        );
        task.pending = set_ask(9, "10.0.0.6", None);
        let report = set(&mut task).unwrap();
        let value: Value = serde_json::from_str(&report).unwrap();
        assert_eq!(value["sac_set_error"]["kind"], "verify", "{report}");
        // The report is one the task takes.
        let reported = format!(
            r#"{{"now_ms": 0, "sac_set_error": {}}}"#,
            value["sac_set_error"]
        );
        assert!(crate::task::read_report(&reported).is_ok(), "{reported}");
    }

    /// A console that is not there: the dial error the task wants.
    #[test]
    fn a_missing_console_is_a_dial_error() {
        let root = root();
        let built = built(root.path());
        let mut task = awaiting(&built, open_ask("vm-2", 1, 60_000));
        let report = open(&built, &mut task, &quick()).unwrap();
        assert!(task.console.is_none());
        let value: Value = serde_json::from_str(&report).unwrap();
        assert_eq!(value["sac_open_error"]["kind"], "dial", "{report}");
    }

    /// A console that never shows the prompt: the pass's total deadline
    /// ends the open long before the prompt's own budget, as a dial
    /// failure the task takes; a cancel from another thread ends it at
    /// once, as `cancelled`.
    #[test]
    fn the_deadline_and_a_cancel_end_an_open() {
        let root = root();
        let built = built(root.path());
        let _sim = Sim::start(
            console_path_in(root.path(), "vm-1").unwrap(),
            Script::new()
                .prompt(fixup_sac::sim::PromptMode::Never)
                .net(SimNet::new(7, "169.254.1.1")),
        )
        .unwrap();
        let slow = Budgets {
            dial_total: Duration::from_secs(60),
            prompt_total: Duration::from_secs(60),
            ..quick()
        };
        let mut task = awaiting(&built, open_ask("vm-1", 1, 300));
        let report = open(&built, &mut task, &slow).unwrap();
        let value: Value = serde_json::from_str(&report).unwrap();
        assert_eq!(
            value["sac_open_error"],
            json!({"kind": "deadline", "step": "dial", "total_ms": 300}),
            "{report}"
        );
        let reported = format!(
            r#"{{"now_ms": 300, "sac_open_error": {}}}"#,
            value["sac_open_error"]
        );
        assert!(crate::task::read_report(&reported).is_ok(), "{reported}");
        task.pending = open_ask("vm-1", 1, 60_000);
        let stop = task.stop_flag();
        let canceller = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let report = open(&built, &mut task, &slow).unwrap();
        canceller.join().unwrap();
        assert_eq!(report, r#"{"cancelled":true}"#);
    }
}
