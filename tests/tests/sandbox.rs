//! Deliberately hostile plugins: each breach gets its typed error, and the
//! next call on a good plugin still works.

use std::path::Path;
use std::sync::Arc;

use fixup_core::classify::Scenario;
use fixup_core::plan::PlanError;
use fixup_core::planner::PlannerError;
use fixup_core::plugin::sandbox::{
    LOG_BYTES_PER_CALL, LOG_FUEL_PER_BYTE, LOG_FUEL_PER_MESSAGE, LOG_MAX_BYTES, LOG_MAX_MESSAGES,
};
use fixup_core::plugin::{
    Allocation, EngineOptions, Limits, LoadedPlugin, PluginError, PluginHost,
};
use fixup_tests::facts;

use crate::held;
use rstest::rstest;

/// A host with the built-ins and the plugin file at `path`, under `limits`.
fn host_loading(limits: Limits, path: &str) -> (PluginHost, Arc<LoadedPlugin>) {
    host_allocating(limits, path, Allocation::Pooling)
}

fn host_allocating(
    limits: Limits,
    path: &str,
    allocation: Allocation,
) -> (PluginHost, Arc<LoadedPlugin>) {
    let mut host = PluginHost::with_allocation(
        EngineOptions {
            limits,
            ..EngineOptions::default()
        },
        allocation,
    )
    .expect("engine");
    host.load_builtins().expect("built-ins load");
    let plugin = host
        .load_file(Path::new(path))
        .expect("the test plugin loads: it misbehaves only when called");
    (host, plugin)
}

fn host_with_hostile() -> (PluginHost, Arc<LoadedPlugin>) {
    host_loading(Limits::default(), env!("PLUGIN_HOSTILE"))
}

const NIC: [(&str, Option<&str>); 1] = [("52:54:00:aa:bb:01", Some("10.0.0.5/24"))];

/// After a hostile call, the built-in networkd plugin must still plan.
fn assert_still_serving(host: &PluginHost) {
    let facts = facts("web-0", None, &NIC);
    let selection = host
        .registry()
        .select(Scenario::OciNetworkd, None)
        .expect("built-in serves oci-networkd");
    let (plan, _) = host
        .plan(&selection.plugin, Scenario::OciNetworkd, &facts)
        .expect("a good plugin still works after a hostile call");
    assert!(plan.steps.len() >= 4, "networkd plan has its steps");
}

#[rstest]
#[case::endless_loop("spin")]
#[case::memory_bomb("balloon")]
#[case::million_steps("flood")]
#[case::too_many_steps("wide")]
#[case::oversized_content("heavy")]
#[case::hides_what_runs("hide")]
#[case::panic("panic")]
#[case::reads_a_file("snoop-file")]
#[case::reads_the_environment("snoop-env")]
#[case::reads_the_clock("snoop-clock")]
#[case::asks_for_randomness("snoop-random")]
#[case::logs_in_a_loop("babble")]
#[case::logs_too_many_bytes("shout")]
#[case::logs_one_huge_message("scream")]
fn hostile_call_is_contained(#[case] behaviour: &str) {
    let (host, hostile) = host_with_hostile();
    let facts = facts(behaviour, Some("hostile"), &NIC);
    let err = host
        .plan(&hostile, Scenario::OciNetworkd, &facts)
        .expect_err("a hostile call must fail");
    let message = err.to_string();
    assert!(
        message.contains("hostile"),
        "error names the plugin: {message}"
    );
    match (behaviour, &err) {
        ("spin", PluginError::Fuel { limit, .. }) => {
            assert_eq!(*limit, host.limits().fuel);
            assert!(message.contains("--plugin-fuel"), "{message}");
        }
        ("balloon", PluginError::Memory { limit, desired, .. }) => {
            assert_eq!(*limit, host.limits().memory_bytes);
            assert!(desired > limit);
        }
        ("flood", PluginError::Memory { .. } | PluginError::TooMuchData { .. }) => {}
        ("wide", PluginError::BadPlan { .. }) => assert!(message.contains("256"), "{message}"),
        ("heavy", PluginError::BadPlan { .. }) => assert!(message.contains("65536"), "{message}"),
        ("hide", PluginError::BadPlan { .. }) => {
            assert!(message.contains("run[2]"), "{message}");
            assert!(message.contains("control character"), "{message}");
        }
        ("babble", PluginError::LogFlood { what, limit, .. }) => {
            assert_eq!((*what, *limit), ("messages", LOG_MAX_MESSAGES));
            assert!(message.contains("1000 messages"), "{message}");
        }
        ("shout", PluginError::LogFlood { what, limit, .. }) => {
            assert_eq!((*what, *limit), ("bytes", LOG_MAX_BYTES));
        }
        ("scream", PluginError::TooMuchData { limit, .. }) => {
            assert_eq!(*limit, host.limits().hostcall_bytes());
        }
        ("panic", PluginError::Panicked { message: m, .. }) => {
            assert!(m.contains("on purpose"), "panic message is captured: {m}")
        }
        (snoop, PluginError::Denied { import, .. }) if snoop.starts_with("snoop-") => {
            let interface = match snoop {
                "snoop-file" => "wasi:filesystem/",
                "snoop-env" => "wasi:cli/environment",
                "snoop-clock" => "wasi:clocks/wall-clock",
                _ => "wasi:random/",
            };
            assert!(
                import.starts_with(interface),
                "{snoop}: denied {import}, expected {interface}*"
            );
            assert!(message.contains("denies"), "{message}");
        }
        _ => panic!("{behaviour}: unexpected error {err:?}"),
    }
    assert_still_serving(&host);
}

#[test]
fn log_volume_is_bounded() {
    let (host, hostile) = host_with_hostile();
    let facts = facts("chatty", Some("hostile"), &NIC);
    let (plan, stats) = host
        .plan(&hostile, Scenario::OciNetworkd, &facts)
        .expect("a 32 KiB message is within the log budget");
    assert_eq!(plan.steps.len(), 1);
    let logged: usize = stats.logs.iter().map(|l| l.message.len()).sum();
    assert_eq!(logged, LOG_BYTES_PER_CALL, "16 KiB of the 32 KiB kept");
}

/// The host's work on a `log` call is charged to the call's fuel, by the
/// byte: `chatty` and `mute` build the same 32 KiB message, and only
/// `chatty` logs it.
#[test]
fn a_log_message_costs_fuel_by_the_byte() {
    let (host, hostile) = host_with_hostile();
    let fuel = |behaviour| {
        let facts = facts(behaviour, Some("hostile"), &NIC);
        let (_, stats) = host
            .plan(&hostile, Scenario::OciNetworkd, &facts)
            .expect("within budget");
        stats.fuel_used
    };
    let charge = LOG_FUEL_PER_MESSAGE + (32 << 10) * LOG_FUEL_PER_BYTE;
    let (chatty, mute) = (fuel("chatty"), fuel("mute"));
    assert!(
        chatty.abs_diff(mute + charge) < charge / 100,
        "logging 32 KiB costs {charge} fuel: chatty {chatty}, mute {mute}"
    );
}

/// Fuel spent on `log` is fuel the plugin no longer has: a budget that
/// covers `chatty`'s own work but not its message runs out.
#[test]
fn a_log_message_the_fuel_cannot_pay_for_traps_as_out_of_fuel() {
    let (host, hostile) = host_with_hostile();
    let (_, stats) = host
        .plan(
            &hostile,
            Scenario::OciNetworkd,
            &facts("mute", Some("hostile"), &NIC),
        )
        .expect("mute works");
    let limits = Limits {
        fuel: stats.fuel_used + LOG_FUEL_PER_MESSAGE,
        ..Limits::default()
    };
    let (tight, hostile) = host_loading(limits, env!("PLUGIN_HOSTILE"));
    let err = tight
        .plan(
            &hostile,
            Scenario::OciNetworkd,
            &facts("chatty", Some("hostile"), &NIC),
        )
        .expect_err("the message costs more than is left");
    assert!(matches!(err, PluginError::Fuel { .. }), "{err:?}");
}

/// A plugin that loops with fuel to spare is stopped by the wall-clock
/// deadline (epoch interruption), with an error naming the plugin and the
/// limit; the host goes on serving. A daemon's host and a one-shot host
/// both keep the deadline with the engine's epoch ticker thread;
/// `the_plan_command_stops_a_runaway_call_at_its_deadline` runs the real
/// `plan` process.
#[rstest]
#[case::pooling(Allocation::Pooling)]
#[case::on_demand(Allocation::OnDemand)]
fn the_wall_clock_deadline_stops_a_call_fuel_does_not(#[case] allocation: Allocation) {
    let limits = Limits {
        // Seconds of spinning: a deadline that does not hold ends the
        // call on fuel, and the test fails rather than hangs.
        fuel: 20_000_000_000,
        deadline: std::time::Duration::from_millis(50),
        ..Limits::default()
    };
    let (host, hostile) = host_allocating(limits, env!("PLUGIN_HOSTILE"), allocation);
    let err = host
        .plan(
            &hostile,
            Scenario::OciNetworkd,
            &facts("spin", Some("hostile"), &NIC),
        )
        .expect_err("a call that never ends is stopped");
    assert!(
        matches!(&err, PluginError::Deadline { plugin, limit } if plugin == "hostile" && limit.as_millis() == 50),
        "{err}"
    );
    assert!(err.to_string().contains("--plugin-deadline"), "{err}");
    // Time is the node's: the pod waits and is tried again, not failed.
    assert!(err.is_node_config(), "{err}");
    assert!(
        err.is_misbehaviour(),
        "a fallback policy still applies: {err}"
    );
    assert_still_serving(&host);
}

/// `cocoon-fixup plan` of the bundled oci-static example made a clone the
/// hostile plugin plans as `spin`, with the plugin in `dir/plugins` and
/// the deadline `deadline` over fuel for hours; stdout and stderr piped.
fn spinning_plan(dir: &Path, deadline: &str) -> std::process::Child {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let example = |name: &str| {
        std::fs::read_to_string(examples.join("oci-static").join(name))
            .expect("example")
            .replace("vm-7f3a9c21", "hostile-spin")
    };
    let pod = example("pod.json").replace(
        r#""vm.cocoonstack.io/guest-flavor": "ubuntu""#,
        r#""vm.cocoonstack.io/guest-flavor": "hostile""#,
    );
    assert!(
        pod.contains(r#""hostile""#),
        "the flavour annotation is set"
    );
    std::fs::write(dir.join("pod.json"), pod).expect("pod");
    std::fs::write(dir.join("vm.json"), example("vm.json")).expect("vm");
    let plugins = dir.join("plugins");
    std::fs::create_dir(&plugins).expect("plugins");
    std::fs::copy(env!("PLUGIN_HOSTILE"), plugins.join("hostile.wasm")).expect("copy");
    std::process::Command::new(crate::serve_reload::binary::program())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir)
        .arg("plan")
        .args([
            "--pod",
            "pod.json",
            "--vm",
            "vm.json",
            "--plugin-dir",
            "plugins",
        ])
        .arg("--cache-dir")
        .arg(dir.join("cache"))
        .arg("--cache-key")
        .arg(dir.join("key").join("cache.key"))
        .arg("--cocoon-root")
        .arg(examples.join("cocoon-root"))
        .args([
            "--plugin-deadline",
            deadline,
            "--plugin-fuel",
            "1000000000000000",
        ])
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cocoon-fixup plan")
}

/// Generous: compiling the plugins comes first. A deadline that does not
/// hold leaves the plugin spinning on its fuel for hours.
const PLAN_PATIENCE: std::time::Duration = std::time::Duration::from_secs(300);

/// The `plan` command, a process that makes a call or two and exits,
/// stops a spinning plugin with fuel for hours at its 50 ms deadline, and
/// fails naming the plugin and the limit.
#[test]
fn the_plan_command_stops_a_runaway_call_at_its_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = spinning_plan(dir.path(), "50ms");
    let patience = std::time::Instant::now() + PLAN_PATIENCE;
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > patience {
            let _ = child.kill();
            panic!("`plan` was not stopped by the plugin's deadline");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("plugin hostile ran past its wall-clock deadline (50ms"),
        "{stderr}"
    );
}

/// A planner with the built-ins and the hostile plugin from a plugin
/// directory (kept alive by the returned guard).
fn planner_with_hostile() -> (fixup_core::planner::Planner, tempfile::TempDir) {
    let plugins = tempfile::tempdir().expect("tempdir");
    std::fs::copy(env!("PLUGIN_HOSTILE"), plugins.path().join("hostile.wasm")).expect("copy");
    let (planner, failures) =
        fixup_core::planner::Planner::new(fixup_core::planner::PlannerOptions {
            plugin_dir: Some(plugins.path().to_owned()),
            ..Default::default()
        })
        .expect("planner");
    assert!(failures.is_empty(), "{failures:?}");
    (planner, plugins)
}

fn over_the_kernels_argument_limit(e: &PlanError) -> bool {
    matches!(e, PlanError::ExecArgTooLong { .. })
}

fn over_the_windows_command_line(e: &PlanError) -> bool {
    matches!(e, PlanError::CommandLineTooLong { units, max }
        if units > max && *max == fixup_core::plan::MAX_WINDOWS_COMMAND_LINE)
}

/// A plan within every plan limit whose rendering could never run: a plan
/// error naming the plugin, before anything runs. `quotes`: 64 KiB of `a'`
/// quotes to about 160 KiB of sh, over the 128 KiB one exec argument may
/// have. `windows-quotes`: 24 KiB of `a'` in a PowerShell plan, whose exec
/// (each `'` doubled) is over the 32,767 UTF-16 code units of a Windows
/// command line.
#[rstest]
#[case::kernel("quotes", over_the_kernels_argument_limit)]
#[case::windows("windows-quotes", over_the_windows_command_line)]
fn a_plan_that_renders_too_large_is_a_plan_error_naming_the_plugin(
    #[case] behaviour: &str,
    #[case] expected: fn(&PlanError) -> bool,
) {
    let (planner, _plugins) = planner_with_hostile();
    let err = planner
        .plan_scenarios(
            &facts(behaviour, Some("hostile"), &NIC),
            &[Scenario::OciNetworkd],
        )
        .expect_err("too large to run");
    let message = err.to_string();
    assert!(message.contains("hostile"), "names the plugin: {message}");
    assert!(
        matches!(&err, PlannerError::Compose { source, .. } if expected(source)),
        "{message}"
    );
}

/// A plugin's log line stays one line that shows what it says: a line
/// break cannot forge a host log line, nor a carriage return or a bidi
/// override rewrite one.
#[test]
fn plugin_log_lines_are_escaped() {
    let (host, hostile) = host_with_hostile();
    let facts = facts("forge", Some("hostile"), &NIC);
    let (_, stats) = host
        .plan(&hostile, Scenario::OciNetworkd, &facts)
        .expect("logging is allowed");
    let line = &stats.logs.last().expect("logged").message;
    assert!(
        !line.contains(['\n', '\r', '\u{202E}']),
        "raw control or format characters: {line:?}"
    );
    assert_eq!(
        line,
        "planning\\nINFO cocoon-fixup: fixup done\\r\\u{202e}enod"
    );
}

#[test]
fn well_behaved_call_reports_usage_within_limits() {
    let (host, hostile) = host_with_hostile();
    let facts = facts("tame", Some("hostile"), &NIC);
    let (plan, stats) = host
        .plan(&hostile, Scenario::OciNetworkd, &facts)
        .expect("tame call works");
    assert_eq!(plan.steps.len(), 1);
    assert!(stats.fuel_used > 0 && stats.fuel_used < host.limits().fuel);
    assert!(stats.peak_memory_bytes > 0 && stats.peak_memory_bytes <= host.limits().memory_bytes);
}

#[test]
fn each_call_gets_a_fresh_instance() {
    // Memory growth in one call must not be visible in the next: the
    // balloon fills its memory; a following tame call starts small again.
    let (host, hostile) = host_with_hostile();
    let _ = host.plan(
        &hostile,
        Scenario::OciNetworkd,
        &facts("balloon", Some("hostile"), &NIC),
    );
    let (_, stats) = host
        .plan(
            &hostile,
            Scenario::OciNetworkd,
            &facts("tame", Some("hostile"), &NIC),
        )
        .expect("tame call works");
    assert!(
        stats.peak_memory_bytes < host.limits().memory_bytes / 2,
        "fresh store starts small, peak {}",
        stats.peak_memory_bytes
    );
}

#[test]
fn non_components_are_refused_with_the_fix() {
    let host = PluginHost::new(EngineOptions::default()).expect("engine");
    let dir = tempfile::tempdir().expect("tempdir");
    let core = dir.path().join("core.wasm");
    // The smallest valid core module: magic and version 1.
    std::fs::write(&core, b"\0asm\x01\0\0\0").expect("write");
    let err = host
        .inspect_file(&core)
        .expect_err("a core module is not a plugin");
    assert!(matches!(err, PluginError::NotAComponent { .. }), "{err:?}");
    assert!(err.to_string().contains("wasm32-wasip2"), "{err}");

    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"#!/bin/sh\necho not wasm\n").expect("write");
    let err = host.inspect_file(&junk).expect_err("junk is not a plugin");
    assert!(matches!(err, PluginError::NotAComponent { .. }), "{err:?}");

    let truncated = dir.path().join("truncated.wasm");
    let bytes = std::fs::read(env!("PLUGIN_HOSTILE")).expect("hostile built");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).expect("write");
    let err = host
        .inspect_file(&truncated)
        .expect_err("a truncated component fails");
    assert!(matches!(err, PluginError::Compile { .. }), "{err:?}");
    assert!(err.to_string().contains("truncated.wasm"), "{err}");
}

#[test]
fn a_plugin_that_traps_in_describe_is_refused_at_load() {
    let host = PluginHost::new(EngineOptions::default()).expect("engine");
    let err = host
        .inspect_file(Path::new(env!("PLUGIN_DESCRIBE_TRAP")))
        .expect_err("describe traps");
    match &err {
        PluginError::Panicked { plugin, message } => {
            assert!(
                plugin.contains("describe-trap.wasm"),
                "names the file: {plugin}"
            );
            assert!(message.contains("describe refuses on purpose"), "{message}");
        }
        other => panic!("unexpected: {other:?}"),
    }
}

#[test]
fn a_plugin_for_another_contract_version_is_refused_naming_both() {
    let host = PluginHost::new(EngineOptions::default()).expect("engine");
    let err = host
        .inspect_file(Path::new(env!("PLUGIN_FUTURE_CONTRACT")))
        .expect_err("0.9.0 is not served");
    assert!(
        matches!(err, PluginError::ContractMismatch { .. }),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("0.9.0") && message.contains("0.4.0, 0.3.0, 0.2.0 and 0.1.0"),
        "{message}"
    );
}

#[test]
fn an_import_the_host_does_not_grant_traps_by_name() {
    let mut host = PluginHost::new(EngineOptions::default()).expect("engine");
    host.load_builtins().expect("built-ins");
    let plugin = host
        .load_file(Path::new(env!("PLUGIN_EXTRA_IMPORT")))
        .expect("loads: the extra import is linked to a trap");
    assert!(
        plugin.imports.iter().any(|i| i == "acme:smuggle/net@1.0.0"),
        "{:?}",
        plugin.imports
    );
    let err = host
        .plan(
            &plugin,
            Scenario::OciNetworkd,
            &facts("web-0", Some("smuggle"), &NIC),
        )
        .expect_err("the call reaches for the network");
    match &err {
        PluginError::Denied { import, .. } => {
            assert_eq!(import, "acme:smuggle/net@1.0.0#fetch")
        }
        other => panic!("unexpected: {other:?}"),
    }
    assert_still_serving(&host);
}

#[test]
fn one_bad_file_never_stops_the_others_from_loading() {
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = |var: &str, name: &str| {
        std::fs::copy(var, dir.path().join(name)).expect("copy plugin");
    };
    copy(env!("PLUGIN_DESCRIBE_TRAP"), "a-describe-trap.wasm");
    copy(env!("PLUGIN_FUTURE_CONTRACT"), "b-future.wasm");
    copy(env!("PLUGIN_HOSTILE"), "c-hostile.wasm");
    std::fs::write(dir.path().join("d-junk.wasm"), b"junk").expect("write");
    let bytes = std::fs::read(env!("PLUGIN_EXTRA_IMPORT")).expect("built");
    std::fs::write(
        dir.path().join("e-truncated.wasm"),
        &bytes[..bytes.len() / 3],
    )
    .expect("write");
    copy(env!("PLUGIN_EXTRA_IMPORT"), "f-extra-import.wasm");
    let mut host = PluginHost::new(EngineOptions::default()).expect("engine");
    host.load_builtins().expect("built-ins");
    let failures = host.load_dir(dir.path()).expect("dir readable");
    let failed: Vec<String> = failures
        .iter()
        .map(|f| f.path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        failed,
        [
            "a-describe-trap.wasm",
            "b-future.wasm",
            "d-junk.wasm",
            "e-truncated.wasm"
        ]
    );
    let names = plugin_names(&host);
    assert!(
        names.contains(&"hostile") && names.contains(&"extra-import"),
        "{names:?}"
    );
    assert_still_serving(&host);
}

/// The names of the plugins `host` has registered.
fn plugin_names(host: &PluginHost) -> Vec<&str> {
    host.registry()
        .plugins()
        .iter()
        .map(|p| p.info.name.as_str())
        .collect()
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn load_dir(dir: &Path) -> (PluginHost, Vec<fixup_core::plugin::LoadFailure>) {
    let mut host = PluginHost::new(EngineOptions::default()).expect("engine");
    host.load_builtins().expect("built-ins");
    let failures = host.load_dir(dir).expect("the directory exists");
    (host, failures)
}

/// A plugin directory others may write is refused whole, naming the
/// directory and the fix: none of its files is read, the built-ins serve,
/// and a VM that asks for a flavour waits for the node to be fixed.
#[test]
fn a_plugin_directory_others_can_write_is_refused_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(env!("PLUGIN_HOSTILE"), dir.path().join("hostile.wasm")).expect("copy");
    chmod(dir.path(), 0o777);
    let (host, failures) = load_dir(dir.path());
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].path, dir.path());
    let message = failures[0].error.to_string();
    assert!(
        message.contains(&dir.path().display().to_string()) && message.contains("chmod go-w"),
        "{message}"
    );
    assert_eq!(host.registry().plugins().len(), 4, "only the built-ins");
    let flavour = fixup_core::facts::Flavor::parse("hostile").expect("flavour");
    let waits = host
        .registry()
        .select(Scenario::OciNetworkd, Some(&flavour))
        .expect_err("no hostile plugin");
    assert!(waits.is_node_config(), "{waits}");
    assert_still_serving(&host);
}

/// In a good directory, a plugin file that is a link, is writable by
/// others, or (as root) belongs to another user is refused by name; the
/// others load.
#[test]
fn a_linked_or_writable_or_foreign_plugin_file_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = |name: &str| {
        let path = dir.path().join(name);
        std::fs::copy(env!("PLUGIN_HOSTILE"), &path).expect("copy");
        chmod(&path, 0o644);
        path
    };
    copy("a-hostile.wasm");
    std::os::unix::fs::symlink(env!("PLUGIN_ALIAS"), dir.path().join("b-link.wasm")).expect("link");
    chmod(&copy("c-open.wasm"), 0o666);
    let root = fixup_core::plugin::trusted::euid() == 0;
    if root {
        std::os::unix::fs::chown(copy("d-foreign.wasm"), Some(4242), None).expect("chown");
    }
    let (host, failures) = load_dir(dir.path());
    let refused: Vec<(String, String)> = failures
        .iter()
        .map(|f| {
            (
                f.path.file_name().unwrap().to_string_lossy().into_owned(),
                f.error.to_string(),
            )
        })
        .collect();
    let mut expected = vec![
        ("b-link.wasm", "symbolic link"),
        ("c-open.wasm", "chmod go-w"),
    ];
    if root {
        expected.push(("d-foreign.wasm", "owned by uid 4242"));
    }
    assert_eq!(refused.len(), expected.len(), "{refused:?}");
    for ((name, message), (want_name, want_text)) in refused.iter().zip(expected) {
        assert_eq!(name, want_name);
        assert!(
            message.contains(want_name) && message.contains(want_text),
            "{message}"
        );
    }
    let names = plugin_names(&host);
    assert!(
        names.contains(&"hostile") && !names.contains(&"alias"),
        "{names:?}"
    );

    let err = host
        .inspect_file(&dir.path().join("b-link.wasm"))
        .expect_err("inspect refuses a link too");
    assert!(
        matches!(
            err,
            PluginError::Untrusted(fixup_core::plugin::trusted::Untrusted::Symlink { .. })
        ),
        "{err}"
    );
}

/// The most bytes a call may make the host hold beyond a small plan's
/// call: the hostcall bound once for what is lifted, once more for the
/// host's conversion of it into its own plan types.
fn held_bound(host: &PluginHost) -> usize {
    2 * host.limits().hostcall_bytes()
}

/// The bytes the host holds during a tame call on `plugin`: Store,
/// instance, facts, a one-step plan.
fn held_by_a_small_call(host: &PluginHost, plugin: &LoadedPlugin, name: &str) -> usize {
    let facts = facts(name, plugin.info.flavors.first().map(|f| f.as_str()), &NIC);
    let (result, held) = held::peak_held(|| host.plan(plugin, Scenario::OciNetworkd, &facts));
    result.expect("a small plan");
    held
}

/// Beyond the step and byte limits: a million steps are stopped by the
/// plugin's own memory limit; a 12 MiB argument fits in the plugin's 16 MiB
/// but not in what the host copies out of it at once, so the host never
/// holds more than a few times the plan limit.
#[rstest]
#[case::a_million_steps("million")]
#[case::megabytes_of_text("giant")]
fn oversized_returns_are_stopped(#[case] behaviour: &str) {
    let (host, hostile) = host_with_hostile();
    let baseline = held_by_a_small_call(&host, &hostile, "tame");
    let facts = facts(behaviour, Some("hostile"), &NIC);
    let (result, held) = held::peak_held(|| host.plan(&hostile, Scenario::OciNetworkd, &facts));
    let err = result.expect_err("too big");
    match (behaviour, &err) {
        ("million", PluginError::Memory { .. }) => {}
        ("giant", PluginError::TooMuchData { plugin, limit }) => {
            assert_eq!(plugin, "hostile");
            assert_eq!(*limit, host.limits().hostcall_bytes());
        }
        _ => panic!("{behaviour}: unexpected error {err:?}"),
    }
    assert!(
        held <= baseline + held_bound(&host),
        "{behaviour}: the host held {held} bytes (a small call {baseline})"
    );
    assert_still_serving(&host);
}

fn host_with_alias() -> (PluginHost, Arc<LoadedPlugin>) {
    host_loading(Limits::default(), env!("PLUGIN_ALIAS"))
}

/// The alias plugin's hand-written canonical ABI is what it says: strings
/// and lists that share guest memory lift to the plan they describe.
#[test]
fn a_plan_whose_strings_share_guest_memory_lifts_as_written() {
    let (host, alias) = host_with_alias();
    let (plan, _) = host
        .plan(
            &alias,
            Scenario::OciNetworkd,
            &facts("small", Some("alias"), &NIC),
        )
        .expect("a small aliased plan is a plan");
    let step = fixup_core::plan::Step {
        description: "sync".into(),
        phase: fixup_core::plan::Phase::Configure,
        best_effort: false,
        action: fixup_core::plan::StepAction::Run(vec!["sync".into()]),
    };
    assert_eq!(plan.steps, vec![step.clone(), step]);
}

/// 256 steps of 64 arguments, every string the same 64 KiB of guest memory
/// (about 80 KiB in the guest, about 1 GiB if the host lifted it all;
/// wasmtime's default bound would have let the host hold 128 MiB): the
/// host stops after the hostcall bound, a small multiple of the plan limit,
/// with an error naming the plugin and the limit.
#[test]
fn aliased_strings_stop_at_the_hostcall_bound() {
    let (host, alias) = host_with_alias();
    let baseline = held_by_a_small_call(&host, &alias, "small");
    let facts = facts("alias", Some("alias"), &NIC);
    let (result, held) = held::peak_held(|| host.plan(&alias, Scenario::OciNetworkd, &facts));
    let err = result.expect_err("far too large");
    match &err {
        PluginError::TooMuchData { plugin, limit } => {
            assert_eq!(plugin, "alias");
            assert_eq!(
                *limit,
                256 << 10,
                "twice 64 KiB, plus 512 bytes for each of 256 steps"
            );
        }
        other => panic!("unexpected: {other:?}"),
    }
    assert!(err.to_string().contains("--plan-max-bytes"), "{err}");
    assert!(
        held <= baseline + held_bound(&host),
        "the host held {held} bytes (a small call {baseline}), bound {}",
        held_bound(&host)
    );
    assert_still_serving(&host);
}

/// A component holding one core module: the module's header, then
/// `sections`. The smallest file the engine validates as a component,
/// written by hand as `non_components_are_refused_with_the_fix` writes its
/// core module (each section here is under 128 bytes, one LEB128 byte).
fn component_with_module(sections: &[u8]) -> Vec<u8> {
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    module.extend_from_slice(sections);
    let mut component = b"\0asm\x0d\0\x01\0".to_vec();
    // Section 1 of a component: a core module.
    component.push(1);
    component.push(u8::try_from(module.len()).expect("under 128 bytes"));
    component.extend(module);
    component
}

/// `(memory 1 1 shared)`: threads.
const SHARED_MEMORY: &[u8] = b"\x05\x04\x01\x03\x01\x01";
/// `(memory 1 1) (func i32.const 0 i32.const 0 memory.atomic.notify drop)`:
/// an atomic instruction on an unshared memory, threads still.
const ATOMIC_NOTIFY: &[u8] = b"\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\x05\x04\x01\x01\x01\x01\
\x0a\x0d\x01\x0b\x00\x41\x00\x41\x00\xfe\x00\x02\x00\x1a\x0b";
/// `(type (struct))`: a GC type.
const GC_STRUCT: &[u8] = b"\x01\x03\x01\x5f\x00";
/// `(type (func)) (tag (type 0))`: exceptions.
const EXCEPTION_TAG: &[u8] = b"\x01\x04\x01\x60\x00\x00\x0d\x03\x01\x00\x00";
/// `(memory i64 1)`: a 64-bit memory.
const MEMORY64: &[u8] = b"\x05\x03\x01\x04\x01";

/// How a refusal names the threads proposal.
const THREADS: &str = "threads (shared memory, atomic instructions)";

/// What the refusal of a plugin using `feature` says, after its name.
fn not_supported(feature: &str) -> String {
    format!(
        "could not be compiled: it uses {feature}, a WebAssembly feature this host does not support"
    )
}

/// A directory holding only `name`, as `bytes`, loaded as the daemon loads
/// its plugin directory: the file is one failure, a compile error naming
/// it and the feature, and the built-ins still serve.
fn refused_from_a_directory(name: &str, bytes: &[u8], feature: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).expect("write");
    let (host, failures) = load_dir(dir.path());
    let [failure] = failures.as_slice() else {
        panic!("one failure: {failures:?}");
    };
    assert_eq!(failure.path, path);
    assert!(
        matches!(
            &failure.error,
            fixup_core::plugin::LoadError::Plugin(PluginError::Compile { .. })
        ),
        "{:?}",
        failure.error
    );
    let message = failure.error.to_string();
    assert!(
        message.starts_with(&path.display().to_string())
            && message.contains(&not_supported(feature)),
        "{message}"
    );
    assert_eq!(host.registry().plugins().len(), 4, "only the built-ins");
    assert_still_serving(&host);
    message
}

/// A plugin using a WebAssembly proposal the engine switches off (SECURITY.md,
/// "The engine") is refused at load, by the daemon and by `plugin inspect`,
/// with an error naming the file and the feature: never a panic, never an
/// abort of the host.
#[rstest]
#[case::shared_memory(SHARED_MEMORY, THREADS)]
#[case::atomic_instruction(ATOMIC_NOTIFY, THREADS)]
#[case::gc_struct(GC_STRUCT, "garbage collection (GC struct, array or i31 types)")]
#[case::exceptions(EXCEPTION_TAG, "exceptions")]
#[case::memory64(MEMORY64, "64-bit memory (memory64)")]
fn a_plugin_using_a_switched_off_feature_is_refused_at_load(
    #[case] sections: &[u8],
    #[case] feature: &str,
) {
    let bytes = component_with_module(sections);
    refused_from_a_directory("feature.wasm", &bytes, feature);

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("feature.wasm");
    std::fs::write(&path, &bytes).expect("write");
    let inspector =
        fixup_kit::Inspector::new(fixup_kit::engine_options(&EngineOptions::default()), None)
            .expect("inspector starts");
    let found = inspector.inspect(&path);
    assert!(!found.accepted, "{found}");
    assert!(found.name.is_none(), "{found}");
    assert!(
        found.verdict.starts_with("refused: ") && found.verdict.contains(&not_supported(feature)),
        "{found}"
    );
}

/// The relaxed-simd test plugin, built from source as every plugin is, is
/// a good plugin but for its relaxed SIMD: refused at load, naming it.
#[test]
fn a_plugin_built_with_relaxed_simd_is_refused_at_load() {
    let bytes = std::fs::read(env!("PLUGIN_RELAXED_SIMD")).expect("built");
    let message = refused_from_a_directory("relaxed-simd.wasm", &bytes, "relaxed SIMD");
    assert!(message.contains("relaxed-simd.wasm"), "{message}");
}

/// `cocoon-fixup plugin inspect` of a plugin with a shared memory: refused,
/// exit status 1, the file and the feature named.
#[test]
fn plugin_inspect_refuses_a_shared_memory_naming_the_feature() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("shared.wasm");
    std::fs::write(&path, component_with_module(SHARED_MEMORY)).expect("write");
    std::fs::write(dir.path().join("config.toml"), "").expect("an empty config");
    let out = std::process::Command::new(crate::serve_reload::binary::program())
        .args(["plugin", "inspect"])
        .arg(&path)
        .arg("--config")
        .arg(dir.path().join("config.toml"))
        .env("HOME", dir.path())
        .output()
        .expect("inspect runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("shared.wasm") && stdout.contains(&not_supported(THREADS)),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
