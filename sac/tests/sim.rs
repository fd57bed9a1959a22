//! The SAC pass against the simulator, over a real Unix socket below a
//! temporary cocoon root, with millisecond budgets.

use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::fs::symlink;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use fixup_sac::sim::{Command, PromptMode, Script, SetMode, Sim, SimNet, console_path_in};
use fixup_sac::{
    Budgets, ConsoleSocket, Nic, Reply, SacError, Session, StaticNic, StopCheck, reasons, run_pass,
};
use rstest::rstest;

const VM: &str = "vm-a";

/// A cocoon root short enough for Unix socket paths (107 bytes).
fn root() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("s")
        .tempdir_in("/tmp")
        .unwrap()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Millisecond budgets; the counts (60 tries, 10 rounds) stay the spec's.
fn fast() -> Budgets {
    Budgets {
        dial_total: Duration::from_secs(5),
        prompt_total: Duration::from_secs(5),
        connect_try: Duration::from_secs(1),
        connect_retry: ms(5),
        prompt_read: ms(200),
        drain: ms(5),
        answer: Duration::from_secs(1),
        answer_max: 64 * 1024,
        enum_tries: 60,
        enum_interval: ms(1),
        set_rounds: 10,
        set_interval: ms(1),
        stop_poll: ms(10),
    }
}

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn static_nic(addr: &str, prefix: Option<u8>, gateway: Option<&str>) -> Nic {
    Nic::Static(StaticNic {
        ip: ip(addr),
        prefix,
        gateway: gateway.map(ip),
    })
}

/// A simulator serving `script` as `vm-a`'s console below `root`.
fn sim(root: &Path, script: Script) -> Sim {
    Sim::start(console_path_in(root, VM).unwrap(), script).unwrap()
}

fn console(root: &Path) -> ConsoleSocket {
    ConsoleSocket::new(root, VM).unwrap()
}

fn pass(root: &Path, nics: &[Nic], budgets: &Budgets) -> Result<Vec<u32>, SacError> {
    run_pass(&mut console(root), nics, budgets, StopCheck::never()).result
}

fn set_lines(sim: &Sim) -> Vec<String> {
    sim.received()
        .into_iter()
        .filter(|l| l.starts_with("i "))
        .collect()
}

#[test]
fn one_static_nic_exact_bytes() {
    let root = root();
    let sim = sim(
        root.path(),
        Script::new().net(
            SimNet::new(7, "10.88.0.12")
                .gateway("10.88.0.1")
                .ipv6("fe80::1c2d:3eff:fe4f:5061"),
        ),
    );
    let nic = static_nic("10.88.0.50", Some(24), Some("10.88.0.1"));
    let done = run_pass(
        &mut console(root.path()),
        &[nic],
        &fast(),
        StopCheck::never(),
    );
    assert_eq!(done.result, Ok(vec![7]));
    assert_eq!(sim.address(7).as_deref(), Some("10.88.0.50"));
    let lines = [
        "\r\n",
        "i\r\n",
        "i 7 10.88.0.50 255.255.255.0 10.88.0.1\r\n",
        "i\r\n",
    ];
    assert_eq!(sim.received(), lines);
    assert_eq!(sim.raw(), lines.concat().into_bytes());
    let sent: Vec<&str> = done.transcript.entries().map(|e| e.line.as_str()).collect();
    assert_eq!(
        sent,
        ["", "i", "i 7 10.88.0.50 255.255.255.0 10.88.0.1", "i"]
    );
    assert!(
        done.transcript
            .entries()
            .all(|e| matches!(e.reply, Reply::Answered { .. })),
        "{:?}",
        done.transcript
    );
}

#[test]
fn static_dhcp_static_picked_by_position() {
    let root = root();
    let sim = sim(
        root.path(),
        Script::new()
            .net(SimNet::new(7, "10.1.9.9").ipv6("fe80::7"))
            .net(SimNet::new(9, "169.254.1.1").ipv6("fe80::9"))
            .net(SimNet::new(12, "10.3.9.9")),
    );
    let nics = [
        static_nic("10.1.0.5", Some(16), Some("10.1.0.1")),
        Nic::Dhcp,
        static_nic("10.3.0.5", None, None),
    ];
    assert_eq!(pass(root.path(), &nics, &fast()), Ok(vec![7, 9, 12]));
    assert_eq!(
        set_lines(&sim),
        [
            "i 7 10.1.0.5 255.255.0.0 10.1.0.1\r\n",
            "i 12 10.3.0.5 255.255.255.0 \r\n"
        ]
    );
    assert_eq!((sim.sets(7), sim.sets(9), sim.sets(12)), (1, 0, 1));
    assert_eq!(sim.address(7).as_deref(), Some("10.1.0.5"));
    assert_eq!(sim.address(9).as_deref(), Some("169.254.1.1"));
    assert_eq!(sim.address(12).as_deref(), Some("10.3.0.5"));
}

#[test]
fn delayed_interfaces_are_waited_for() {
    let root = root();
    let sim = sim(
        root.path(),
        Script::new()
            .net(SimNet::new(7, "10.0.0.9"))
            .net(SimNet::new(9, "10.0.1.9").visible_after(3)),
    );
    let nics = [
        static_nic("10.0.0.5", Some(24), None),
        static_nic("10.0.1.5", Some(24), None),
    ];
    assert_eq!(pass(root.path(), &nics, &fast()), Ok(vec![7, 9]));
    let received = sim.received();
    assert_eq!(received[..5], ["\r\n", "i\r\n", "i\r\n", "i\r\n", "i\r\n"]);
    assert_eq!(received[5], "i 7 10.0.0.5 255.255.255.0 \r\n");
    assert_eq!(sim.address(9).as_deref(), Some("10.0.1.5"));
}

#[test]
fn too_few_interfaces_exhaust_the_enumeration() {
    let root = root();
    let sim = sim(root.path(), Script::new().net(SimNet::new(7, "10.0.0.9")));
    let nics = [static_nic("10.0.0.5", Some(24), None), Nic::Dhcp];
    let err = pass(root.path(), &nics, &fast()).unwrap_err();
    assert_eq!(err.to_string(), "sac enum exhausted: found 1 need 2");
    assert_eq!(err.event_reason(), Some(reasons::ENUM_FAILED));
    assert_eq!(sim.queries(), 60);
    assert!(set_lines(&sim).is_empty());
}

#[test]
fn a_set_that_never_takes_exhausts_ten_rounds() {
    let root = root();
    let sim = sim(
        root.path(),
        Script::new().net(SimNet::new(7, "10.0.0.9").set_mode(SetMode::Never)),
    );
    let err = pass(
        root.path(),
        &[static_nic("10.0.0.5", Some(24), Some("10.0.0.1"))],
        &fast(),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "sac verify exhausted: net 7 ip 10.0.0.5 did not take effect"
    );
    assert_eq!(err.event_reason(), Some(reasons::VERIFY_FAILED));
    assert_eq!(sim.sets(7), 10);
    assert_eq!(sim.queries(), 1 + 10);
}

#[test]
fn a_set_that_takes_on_round_three() {
    let root = root();
    let sim = sim(
        root.path(),
        Script::new().net(SimNet::new(7, "10.0.0.9").set_mode(SetMode::OnRound(3))),
    );
    let nics = [static_nic("10.0.0.5", Some(24), None)];
    assert_eq!(pass(root.path(), &nics, &fast()), Ok(vec![7]));
    assert_eq!(sim.sets(7), 3);
    assert_eq!(sim.queries(), 1 + 3);
    assert_eq!(sim.address(7).as_deref(), Some("10.0.0.5"));
}

#[test]
fn a_set_without_answer_fails_the_pass_at_once() {
    let root = root();
    let sim = sim(
        root.path(),
        Script::new().net(SimNet::new(7, "10.0.0.9").set_mode(SetMode::NoAnswer)),
    );
    let budgets = Budgets {
        answer: ms(200),
        ..fast()
    };
    let nics = [static_nic("10.0.0.5", Some(24), None)];
    let err = pass(root.path(), &nics, &budgets).unwrap_err();
    assert_eq!(
        err.to_string(),
        "sac set ip net 7: no `SAC>` answer within 200ms"
    );
    assert_eq!(err.event_reason(), Some(reasons::SET_FAILED));
    assert_eq!(
        err.event_message().as_deref(),
        Some("net 7: no `SAC>` answer within 200ms")
    );
    assert_eq!(sim.sets(7), 1);
    assert_eq!(
        sim.received().last().map(String::as_str),
        Some("i 7 10.0.0.5 255.255.255.0 \r\n")
    );
}

#[test]
fn a_console_closed_at_the_set_line_fails_the_set() {
    let root = root();
    let sim = sim(
        root.path(),
        Script::new()
            .net(SimNet::new(7, "10.0.0.9"))
            .close_after_lines(3),
    );
    let err = pass(root.path(), &[static_nic("10.0.0.5", None, None)], &fast()).unwrap_err();
    assert_eq!(
        err,
        SacError::SetIp {
            net: 7,
            cause: "the console closed the connection".into()
        }
    );
    assert_eq!(sim.received().len(), 3);
    assert_eq!(sim.connections(), 1);
}

#[test]
fn a_console_closed_while_listing_ends_the_enumeration() {
    let root = root();
    let sim = sim(
        root.path(),
        Script::new()
            .net(SimNet::new(7, "10.0.0.9"))
            .close_after_lines(2),
    );
    let err = pass(root.path(), &[static_nic("10.0.0.5", None, None)], &fast()).unwrap_err();
    assert_eq!(err.to_string(), "sac enum exhausted: found 0 need 1");
    assert_eq!(sim.received(), ["\r\n", "i\r\n"]);
}

#[test]
fn a_flooded_listing_fails_each_try() {
    let root = root();
    let sim = sim(
        root.path(),
        Script::new()
            .net(SimNet::new(7, "10.0.0.9"))
            .flood(Command::Query, 4 << 20),
    );
    let budgets = Budgets {
        enum_tries: 3,
        ..fast()
    };
    let done = run_pass(
        &mut console(root.path()),
        &[static_nic("10.0.0.5", None, None)],
        &budgets,
        StopCheck::never(),
    );
    assert_eq!(
        done.result.unwrap_err().to_string(),
        "sac enum exhausted: found 0 need 1"
    );
    let causes: Vec<&Reply> = done
        .transcript
        .entries()
        .filter(|e| e.line == "i")
        .map(|e| &e.reply)
        .collect();
    assert_eq!(causes.len(), 3);
    for reply in causes {
        assert_eq!(
            reply,
            &Reply::NoAnswer {
                cause: "the answer grew past 65536 bytes without `SAC>`".into()
            }
        );
    }
    assert!(sim.queries() >= 1);
}

#[test]
fn a_flooded_set_fails_the_set() {
    let root = root();
    let _sim = sim(
        root.path(),
        Script::new()
            .net(SimNet::new(7, "10.0.0.9"))
            .flood(Command::Set, 1 << 20),
    );
    let err = pass(root.path(), &[static_nic("10.0.0.5", None, None)], &fast()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "sac set ip net 7: the answer grew past 65536 bytes without `SAC>`"
    );
}

#[test]
fn no_prompt_fails_the_dial() {
    let root = root();
    let sim = sim(root.path(), Script::new().prompt(PromptMode::Never));
    let budgets = Budgets {
        prompt_total: ms(300),
        prompt_read: ms(50),
        ..fast()
    };
    let err = pass(root.path(), &[static_nic("10.0.0.5", None, None)], &budgets).unwrap_err();
    let SacError::Dial { cause } = &err else {
        panic!("{err:?}");
    };
    let path = console(root.path()).path();
    assert!(
        cause.starts_with(&format!(
            "no `SAC>` prompt from {} within 300ms (",
            path.display()
        )),
        "{cause}"
    );
    assert!(
        cause.ends_with("enabled on its serial port (EMS)"),
        "{cause}"
    );
    assert_eq!(err.event_reason(), Some(reasons::DIAL_FAILED));
    assert_eq!(err.event_message().as_ref(), Some(cause));
    let received = sim.received();
    assert!(received.len() >= 2, "{received:?}");
    assert!(received.iter().all(|l| l == "\r\n"), "{received:?}");
    let sent: usize = cause
        .split(" within 300ms (")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert_eq!(sent, received.len());
}

#[test]
fn a_prompt_after_two_empty_lines_is_waited_for() {
    let root = root();
    let sim = sim(
        root.path(),
        Script::new()
            .prompt(PromptMode::AfterEmptyLines(2))
            .net(SimNet::new(7, "10.0.0.9")),
    );
    let budgets = Budgets {
        prompt_read: ms(50),
        ..fast()
    };
    let nics = [static_nic("10.0.0.5", None, None)];
    assert_eq!(pass(root.path(), &nics, &budgets), Ok(vec![7]));
    assert_eq!(sim.received()[..4], ["\r\n", "\r\n", "\r\n", "i\r\n"]);
}

#[test]
fn a_console_closed_before_the_prompt_is_dialled_again() {
    let root = root();
    let sim = sim(
        root.path(),
        Script::new()
            .net(SimNet::new(7, "10.0.0.9"))
            .close_after_lines(1),
    );
    let nics = [static_nic("10.0.0.5", None, None)];
    assert_eq!(pass(root.path(), &nics, &fast()), Ok(vec![7]));
    assert_eq!(sim.connections(), 2);
    assert_eq!(sim.address(7).as_deref(), Some("10.0.0.5"));
}

#[rstest]
#[case::no_vm_dir(false)]
#[case::no_socket(true)]
fn a_missing_socket_fails_the_dial_after_retries(#[case] make_vm_dir: bool) {
    let root = root();
    if make_vm_dir {
        console_path_in(root.path(), VM).unwrap();
    }
    let budgets = Budgets {
        dial_total: ms(300),
        connect_retry: ms(10),
        ..fast()
    };
    let err = pass(root.path(), &[static_nic("10.0.0.5", None, None)], &budgets).unwrap_err();
    let SacError::Dial { cause } = &err else {
        panic!("{err:?}");
    };
    let missing = if make_vm_dir {
        console(root.path()).path()
    } else {
        root.path().join("run")
    };
    assert!(
        cause.starts_with(&format!(
            "cannot connect to {}: {}: No such file or directory",
            console(root.path()).path().display(),
            missing.display()
        )),
        "{cause}"
    );
    let tries: u32 = cause
        .rsplit(" tries in 300ms)")
        .nth(1)
        .and_then(|head| head.rsplit('(').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(tries >= 2, "{cause}");
}

#[test]
fn a_socket_that_appears_later_is_reached() {
    let root = root();
    let path = console_path_in(root.path(), VM).unwrap();
    let starter = thread::spawn(move || {
        thread::sleep(ms(50));
        Sim::start(path, Script::new().net(SimNet::new(7, "10.0.0.9"))).unwrap()
    });
    let budgets = Budgets {
        connect_retry: ms(10),
        ..fast()
    };
    let nics = [static_nic("10.0.0.5", None, None)];
    let result = pass(root.path(), &nics, &budgets);
    let sim = starter.join().unwrap();
    assert_eq!(result, Ok(vec![7]));
    assert_eq!(sim.connections(), 1);
}

/// Builds the real layout under `root/real`, with a simulator there, and
/// links `component` of the layout under `root` to its real counterpart.
fn linked_layout(root: &Path, component: &str) -> (Sim, PathBuf) {
    let real = root.join("real");
    let sim = Sim::start(console_path_in(&real, VM).unwrap(), Script::new()).unwrap();
    let run = root.join("run");
    let ch = run.join("cloudhypervisor");
    let vm = ch.join(VM);
    let link = match component {
        "run" => run,
        "cloudhypervisor" => {
            fs::create_dir_all(&run).unwrap();
            ch
        }
        "vm" => {
            fs::create_dir_all(&ch).unwrap();
            vm
        }
        "console.sock" => {
            fs::create_dir_all(&vm).unwrap();
            vm.join("console.sock")
        }
        other => panic!("{other}"),
    };
    let target = real.join(link.strip_prefix(root).unwrap());
    symlink(&target, &link).unwrap();
    (sim, link)
}

#[rstest]
#[case::run("run")]
#[case::cloudhypervisor("cloudhypervisor")]
#[case::vm_dir("vm")]
#[case::socket("console.sock")]
fn a_symlinked_component_is_refused(#[case] component: &str) {
    let root = root();
    let (sim, link) = linked_layout(root.path(), component);
    let err = pass(root.path(), &[static_nic("10.0.0.5", None, None)], &fast()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "sac console {} refused: is a symbolic link; cocoon's VM state holds no links: remove the link, and point `--cocoon-root` at the real directory if the state was moved",
            link.display()
        )
    );
    assert_eq!(err.event_reason(), None);
    assert_eq!(sim.connections(), 0);
    // The link does lead to a live console: following it would have worked.
    UnixStream::connect(console(root.path()).path()).unwrap();
    while sim.connections() == 0 {
        thread::sleep(ms(1));
    }
}

#[test]
fn a_vm_dir_linked_out_of_the_root_is_refused() {
    let root = root();
    let outside = self::root();
    let sim = Sim::start(console_path_in(outside.path(), VM).unwrap(), Script::new()).unwrap();
    let ch = root.path().join("run/cloudhypervisor");
    fs::create_dir_all(&ch).unwrap();
    symlink(
        outside.path().join("run/cloudhypervisor").join(VM),
        ch.join(VM),
    )
    .unwrap();
    let err = pass(root.path(), &[static_nic("10.0.0.5", None, None)], &fast()).unwrap_err();
    assert!(
        matches!(&err, SacError::Refused { problem, .. } if problem == "is a symbolic link"),
        "{err:?}"
    );
    assert_eq!(sim.connections(), 0);
}

#[rstest]
#[case::regular_file("console.sock", false, "is a regular file, not a socket")]
#[case::directory("console.sock", true, "is a directory, not a socket")]
#[case::vm_dir_is_a_file("", false, "is a regular file, not a directory")]
fn a_non_socket_is_refused(#[case] name: &str, #[case] dir: bool, #[case] problem: &str) {
    let root = root();
    let ch = root.path().join("run/cloudhypervisor");
    fs::create_dir_all(&ch).unwrap();
    let at = if name.is_empty() {
        ch.join(VM)
    } else {
        fs::create_dir(ch.join(VM)).unwrap();
        ch.join(VM).join(name)
    };
    if dir {
        fs::create_dir(&at).unwrap();
    } else {
        fs::write(&at, b"").unwrap();
    }
    let err = pass(root.path(), &[static_nic("10.0.0.5", None, None)], &fast()).unwrap_err();
    let SacError::Refused {
        path, problem: got, ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(path, &at);
    assert_eq!(got, problem);
    assert!(err.is_failure());
}

#[rstest]
#[case::empty("")]
#[case::slash("/")]
#[case::dotdot("..")]
#[case::escape("../../etc")]
#[case::nested("a/b")]
#[case::nul("vm\0a")]
fn bad_vm_ids_are_refused(#[case] id: &str) {
    let root = root();
    let err = ConsoleSocket::new(root.path(), id).unwrap_err();
    assert!(matches!(err, SacError::Invalid { .. }), "{err:?}");
    assert!(
        err.to_string().starts_with("sac invalid input: VM id "),
        "{err}"
    );
}

#[rstest]
#[case::missing(None, "255.255.255.0")]
#[case::zero(Some(0), "255.255.255.0")]
#[case::one(Some(1), "128.0.0.0")]
#[case::thirty_two(Some(32), "255.255.255.255")]
fn the_prefix_becomes_the_mask(#[case] prefix: Option<u8>, #[case] mask: &str) {
    let root = root();
    let sim = sim(root.path(), Script::new().net(SimNet::new(7, "10.0.0.9")));
    let nics = [static_nic("10.0.0.5", prefix, Some("10.0.0.1"))];
    assert_eq!(pass(root.path(), &nics, &fast()), Ok(vec![7]));
    assert_eq!(
        set_lines(&sim),
        [format!("i 7 10.0.0.5 {mask} 10.0.0.1\r\n")]
    );
}

#[rstest]
#[case::only(&[static_nic("10.0.0.5", Some(33), None)], 0)]
#[case::after_a_good_one(
    &[static_nic("10.0.0.5", Some(24), None), Nic::Dhcp, static_nic("10.0.2.5", Some(64), None)],
    2
)]
fn an_invalid_prefix_sends_nothing(#[case] nics: &[Nic], #[case] position: usize) {
    let root = root();
    let sim = sim(root.path(), Script::new().net(SimNet::new(7, "10.0.0.9")));
    let err = pass(root.path(), nics, &fast()).unwrap_err();
    let SacError::Invalid { problem, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(
        problem.starts_with(&format!("network_configs[{position}]: prefix ")),
        "{problem}"
    );
    assert!(problem.ends_with(" is outside 1..=32"), "{problem}");
    assert_eq!(sim.connections(), 0);
    assert!(sim.raw().is_empty());
}

#[test]
fn an_invalid_prefix_sends_nothing_step_wise() {
    let root = root();
    let sim = sim(root.path(), Script::new().net(SimNet::new(7, "10.0.0.9")));
    let mut session =
        Session::open(&mut console(root.path()), &fast(), StopCheck::never()).unwrap();
    assert_eq!(session.enumerate(1), Ok(vec![7]));
    let before = sim.raw();
    let err = session
        .set_static(
            7,
            &StaticNic {
                ip: ip("10.0.0.5"),
                prefix: Some(33),
                gateway: None,
            },
        )
        .unwrap_err();
    assert!(matches!(err, SacError::Invalid { .. }), "{err:?}");
    drop(session);
    assert_eq!(sim.raw(), before);
}

#[test]
fn no_gateway_ends_the_set_line_in_a_space() {
    let root = root();
    let sim = sim(
        root.path(),
        Script::new().net(SimNet::new(7, "10.0.0.9").gateway("10.0.0.1")),
    );
    let nics = [static_nic("10.0.0.5", Some(24), None)];
    assert_eq!(pass(root.path(), &nics, &fast()), Ok(vec![7]));
    assert_eq!(set_lines(&sim), ["i 7 10.0.0.5 255.255.255.0 \r\n"]);
    assert!(sim.raw().ends_with(b"i 7 10.0.0.5 255.255.255.0 \r\ni\r\n"));
}

#[test]
fn stopping_ends_a_dial_to_a_missing_socket() {
    let root = root();
    let flag = Arc::new(AtomicBool::new(false));
    let setter = {
        let flag = flag.clone();
        thread::spawn(move || {
            thread::sleep(ms(50));
            flag.store(true, Ordering::SeqCst);
        })
    };
    // The spec's budgets: without the stop this would take 60 s.
    let err = Session::open(
        &mut console(root.path()),
        &Budgets::default(),
        StopCheck::flag(flag),
    )
    .unwrap_err();
    setter.join().unwrap();
    assert_eq!(err, SacError::Stopped);
    assert!(!err.is_failure());
    assert_eq!(err.event_reason(), None);
}

#[test]
fn stopping_ends_a_wait_for_the_prompt() {
    let root = root();
    let sim = sim(root.path(), Script::new().prompt(PromptMode::Never));
    let flag = Arc::new(AtomicBool::new(false));
    let setter = {
        let flag = flag.clone();
        thread::spawn(move || {
            thread::sleep(ms(50));
            flag.store(true, Ordering::SeqCst);
        })
    };
    // The spec's budgets: without the stop this would take 60 s.
    let err = Session::open(
        &mut console(root.path()),
        &Budgets::default(),
        StopCheck::flag(flag),
    )
    .unwrap_err();
    setter.join().unwrap();
    assert_eq!(err, SacError::Stopped);
    assert_eq!(sim.received(), ["\r\n"]);
}

#[test]
fn stopping_before_a_set_line_sends_none() {
    let root = root();
    let sim = sim(root.path(), Script::new().net(SimNet::new(7, "10.0.0.9")));
    let flag = Arc::new(AtomicBool::new(false));
    let mut session = Session::open(
        &mut console(root.path()),
        &fast(),
        StopCheck::flag(flag.clone()),
    )
    .unwrap();
    assert_eq!(session.enumerate(1), Ok(vec![7]));
    flag.store(true, Ordering::SeqCst);
    let nic = StaticNic {
        ip: ip("10.0.0.5"),
        prefix: None,
        gateway: None,
    };
    assert_eq!(session.set_static(7, &nic), Err(SacError::Stopped));
    drop(session);
    assert!(set_lines(&sim).is_empty());
    assert_eq!(sim.address(7).as_deref(), Some("10.0.0.9"));
}

#[test]
fn unsolicited_output_is_drained() {
    let root = root();
    let sim = sim(
        root.path(),
        Script::new()
            .net(SimNet::new(7, "10.0.0.9"))
            .noise_before("EVENT: A new console channel has been created.\r\n")
            .noise_after(ms(1), "Net: 99, Ip=9.9.9.9\r\n\r\nSAC>"),
    );
    let budgets = Budgets {
        drain: ms(200),
        ..fast()
    };
    let nics = [static_nic("10.0.0.5", None, None)];
    assert_eq!(pass(root.path(), &nics, &budgets), Ok(vec![7]));
    assert_eq!(sim.sets(99), 0);
    assert_eq!(sim.address(7).as_deref(), Some("10.0.0.5"));
}

#[test]
fn slow_answers_within_the_budget_are_waited_for() {
    let root = root();
    let sim = sim(
        root.path(),
        Script::new().net(SimNet::new(7, "10.0.0.9")).delay(ms(30)),
    );
    let nics = [static_nic("10.0.0.5", None, None)];
    assert_eq!(pass(root.path(), &nics, &fast()), Ok(vec![7]));
    assert_eq!(sim.address(7).as_deref(), Some("10.0.0.5"));
}

#[test]
fn step_wise_session() {
    let root = root();
    let sim = sim(
        root.path(),
        Script::new()
            .net(SimNet::new(3, "10.0.0.9"))
            .net(SimNet::new(4, "10.0.1.9")),
    );
    let mut session =
        Session::open(&mut console(root.path()), &fast(), StopCheck::never()).unwrap();
    let nets = session.enumerate(2).unwrap();
    assert_eq!(nets, [3, 4]);
    let nic = StaticNic {
        ip: ip("10.0.1.5"),
        prefix: Some(24),
        gateway: Some(ip("10.0.1.1")),
    };
    session.set_static(nets[1], &nic).unwrap();
    let transcript = session.into_transcript();
    let sent: Vec<String> = transcript.entries().map(|e| e.line.clone()).collect();
    assert_eq!(sent, ["", "i", "i 4 10.0.1.5 255.255.255.0 10.0.1.1", "i"]);
    assert_eq!(transcript.dropped(), 0);
    assert_eq!(sim.connections(), 1);
    assert_eq!(sim.address(4).as_deref(), Some("10.0.1.5"));
}

#[test]
fn a_dhcp_only_record_dials_nothing() {
    let root = root();
    let sim = sim(root.path(), Script::new().net(SimNet::new(7, "10.0.0.9")));
    assert_eq!(pass(root.path(), &[Nic::Dhcp], &fast()), Ok(vec![]));
    assert_eq!(sim.connections(), 0);
}
