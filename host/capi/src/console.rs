//! The VM's serial console for the Windows static-IP pass (spec section
//! 10), for an embedder that carries out the task op's `sac_open` and
//! `sac_set` actions: the library opens the console below the planner's
//! cocoon root with the console client the daemon uses (`fixup-sac`: the
//! socket path confined to the cocoon root, every read bounded, lines
//! built only from checked values), and answers with the report the task
//! wants, ready to pass to `cf_task_next` with `now_ms` added.

use std::net::Ipv4Addr;

use fixup_core::facts::VmId;
use fixup_sac::{Budgets, ConsoleSocket, Session, StaticNic, Stop};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::ops::{Built, Failure};

/// An open console.
#[derive(Debug)]
pub struct Console {
    session: Session,
}

/// The fields of a `sac_open` action.
#[derive(Debug, Deserialize)]
struct OpenRequest {
    vm: String,
    need: usize,
}

/// The fields of a `sac_set` action.
#[derive(Debug, Deserialize)]
struct SetRequest {
    net: u32,
    ip: Ipv4Addr,
    #[serde(default)]
    prefix: Option<u8>,
    #[serde(default)]
    gateway: Option<Ipv4Addr>,
}

fn parse<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T, Failure> {
    serde_json::from_str(text).map_err(|e| Failure::invalid(format!("{what}: {e}")))
}

/// A console error as the task op's reports spell it.
pub use fixup_core::decision::reports::sac_error_json as error_json;

/// Carry out a `sac_open` action (`action_json`: the action as the task
/// returned it, or just `{vm, need}`) with `budgets`: the open console, if
/// it opened, and the report for the task (`{"sac_opened": [...]}` or
/// `{"sac_open_error": {...}}`).
pub fn open(
    built: &Built,
    action_json: &str,
    budgets: &Budgets,
) -> Result<(Option<Console>, String), Failure> {
    let value: Value = parse("action_json", action_json)?;
    let request: OpenRequest =
        serde_json::from_value(value).map_err(|e| Failure::invalid(format!("action_json: {e}")))?;
    let vm =
        VmId::parse(&request.vm).map_err(|e| Failure::invalid(format!("action_json: vm: {e}")))?;
    let opened =
        ConsoleSocket::new(built.planner.cocoon_root(), vm.as_str()).and_then(|mut dial| {
            let mut session = Session::open(&mut dial, budgets, Stop::never())?;
            let nets = session.enumerate(request.need)?;
            Ok((nets, session))
        });
    Ok(match opened {
        Ok((nets, session)) => (
            Some(Console { session }),
            json!({"sac_opened": nets}).to_string(),
        ),
        Err(e) => (None, json!({"sac_open_error": error_json(&e)}).to_string()),
    })
}

/// Carry out a `sac_set` action on `console`: the report for the task
/// (`{"sac_set": true}` or `{"sac_set_error": {...}}`).
pub fn set(console: &mut Console, action_json: &str) -> Result<String, Failure> {
    let request: SetRequest = parse("action_json", action_json)?;
    let nic = StaticNic {
        ip: request.ip,
        prefix: request.prefix,
        gateway: request.gateway,
    };
    Ok(match console.session.set_static(request.net, &nic) {
        Ok(()) => json!({"sac_set": true}).to_string(),
        Err(e) => json!({"sac_set_error": error_json(&e)}).to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fixup_sac::sim::{Script, SetMode, Sim, SimNet, console_path_in};
    use std::time::Duration;

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

    /// The actions as the task returns them, carried out against the
    /// simulator on the VM's console socket: the reports the task wants.
    #[test]
    fn the_task_ops_console_actions_are_carried_out() {
        let root = tempfile::Builder::new()
            .prefix("c")
            .tempdir_in("/tmp")
            .unwrap();
        let built = built(root.path());
        let sim = Sim::start(
            console_path_in(root.path(), "vm-1").unwrap(),
            Script::new()
                .net(SimNet::new(7, "169.254.1.1"))
                .net(SimNet::new(9, "169.254.1.2").set_mode(SetMode::Never)),
        )
        .unwrap();
        let (console, report) = open(
            &built,
            r#"{"action": "sac_open", "vm": "vm-1", "need": 2}"#,
            &quick(),
        )
        .unwrap();
        assert_eq!(report, r#"{"sac_opened":[7,9]}"#);
        let mut console = console.expect("open");
        let report = set(
            &mut console,
            r#"{"action": "sac_set", "net": 7, "ip": "10.0.0.5", "prefix": 24, "gateway": null}"#,
        )
        .unwrap();
        assert_eq!(report, r#"{"sac_set":true}"#);
        assert!(
            sim.received()
                .contains(&"i 7 10.0.0.5 255.255.255.0 \r\n".to_owned()),
            "{:?}",
            sim.received()
        );
        let report = set(&mut console, r#"{"net": 9, "ip": "10.0.0.6"}"#).unwrap();
        let value: Value = serde_json::from_str(&report).unwrap();
        assert_eq!(value["sac_set_error"]["kind"], "verify", "{report}");
        // The report is one the task takes.
        let reported = format!(
            r#"{{"now_ms": 0, "sac_set_error": {}}}"#,
            value["sac_set_error"]
        );
        assert!(crate::task::read_report(&reported).is_ok(), "{reported}");
    }

    /// A console that is not there: the dial error the task wants; a VM
    /// id that is no VM id is the caller's mistake.
    #[test]
    fn a_missing_console_is_a_dial_error_and_a_bad_id_a_caller_error() {
        let root = tempfile::Builder::new()
            .prefix("c")
            .tempdir_in("/tmp")
            .unwrap();
        let built = built(root.path());
        let (console, report) = open(&built, r#"{"vm": "vm-2", "need": 1}"#, &quick()).unwrap();
        assert!(console.is_none());
        let value: Value = serde_json::from_str(&report).unwrap();
        assert_eq!(value["sac_open_error"]["kind"], "dial", "{report}");
        let e = open(&built, r#"{"vm": "../x", "need": 1}"#, &quick()).unwrap_err();
        assert!(e.message.contains("vm"), "{}", e.message);
    }
}
