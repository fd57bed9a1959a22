//! The `cocoon-fixup` binary as a user runs it: exit codes, output, and
//! error messages that name the file and the field.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn plan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cocoon-fixup"))
        .arg("plan")
        .args(["--no-cache", "--cocoon-root"])
        .arg(examples().join("cocoon-root"))
        .args(args)
        .env_remove("COCOON_FIXUP_PLUGIN_DIR")
        .output()
        .expect("binary runs")
}

fn example_args(name: &str) -> Vec<String> {
    let dir = examples().join(name);
    vec![
        "--pod".into(),
        dir.join("pod.json").display().to_string(),
        "--vm".into(),
        dir.join("vm.json").display().to_string(),
    ]
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `cocoon-fixup ARGS... --help`, which must succeed.
fn help_of(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cocoon-fixup"))
        .args(args)
        .arg("--help")
        .output()
        .expect("binary runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn json_output_has_the_documented_keys() {
    let mut args = example_args("oci-static");
    args.extend(["--output".into(), "json".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = plan(&args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    for key in [
        "needs_fixup",
        "scenario",
        "plugins",
        "steps",
        "exec",
        "script",
        "hint",
        "rule",
        "reason",
    ] {
        assert!(json.get(key).is_some(), "missing key {key}: {json}");
    }
    assert_eq!(json["scenario"], "oci-networkd");
    assert_eq!(json["exec"][0], "sh");
    assert_eq!(
        json["plugins"][0]["sha256"].as_str().map(str::len),
        Some(64)
    );
}

#[test]
fn text_output_names_rule_plugin_and_steps() {
    let args = example_args("fc-dhcp");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = plan(&args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("rule 5"), "{stdout}");
    assert!(stdout.contains("plugin: fc-mac"), "{stdout}");
    assert!(stdout.contains("plugin: oci-networkd"), "{stdout}");
    assert!(stdout.contains("ip link set dev eth0 address"), "{stdout}");
    assert!(stdout.contains("hint script:"), "{stdout}");
}

#[test]
fn no_fixup_is_said_plainly() {
    let args = example_args("no-fixup");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = plan(&args);
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("no fixup needed"));
}

#[test]
fn bad_inputs_exit_non_zero_naming_file_and_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pod = examples().join("oci-static/pod.json");
    let good_vm = std::fs::read_to_string(examples().join("oci-static/vm.json")).expect("vm");

    let bad_prefix = dir.path().join("bad-prefix.json");
    std::fs::write(
        &bad_prefix,
        good_vm.replace("\"prefix\": 24", "\"prefix\": \"24\""),
    )
    .expect("write");
    let bad_mac = dir.path().join("bad-mac.json");
    std::fs::write(
        &bad_mac,
        good_vm.replace("52:54:00:3a:91:0c", "52:54:00:3a:91"),
    )
    .expect("write");
    let malformed = dir.path().join("malformed.json");
    std::fs::write(&malformed, "{\"id\": ").expect("write");
    let missing = dir.path().join("missing.json");

    let cases: [(&Path, &[&str]); 4] = [
        (
            &bad_prefix,
            &["bad-prefix.json", "network_configs[0].network.prefix"],
        ),
        (&bad_mac, &["network_configs[0].mac", "52:54:00:3a:91"]),
        (&malformed, &["malformed.json", "line 1"]),
        (&missing, &["missing.json"]),
    ];
    for (vm, needles) in cases {
        let out = plan(&[
            "--pod",
            pod.to_str().expect("utf-8"),
            "--vm",
            vm.to_str().expect("utf-8"),
        ]);
        assert_eq!(out.status.code(), Some(1), "{}", vm.display());
        let stderr = text(&out.stderr);
        assert!(stderr.starts_with("error: "), "{stderr}");
        for needle in needles {
            assert!(
                stderr.contains(needle),
                "{} should mention {needle}: {stderr}",
                vm.display()
            );
        }
    }
}

#[test]
fn a_missing_plugin_dir_is_an_error_and_a_broken_plugin_stops_plan() {
    let args = example_args("oci-static");
    let mut with_dir: Vec<&str> = args.iter().map(String::as_str).collect();
    with_dir.extend(["--plugin-dir", "/nonexistent/cocoon-fixup-plugins"]);
    let out = plan(&with_dir);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("/nonexistent/cocoon-fixup-plugins"));

    // A `..` in the path is refused, and said once.
    let mut with_dots: Vec<&str> = args.iter().map(String::as_str).collect();
    with_dots.extend(["--plugin-dir", "../plugins"]);
    let out = plan(&with_dots);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert_eq!(
        stderr.matches("has a `..` component").count(),
        1,
        "{stderr}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("broken.wasm"), b"\0asm\x01\0\0\0").expect("write");
    let mut with_broken: Vec<&str> = args.iter().map(String::as_str).collect();
    let dir_arg = dir.path().display().to_string();
    with_broken.extend(["--plugin-dir", &dir_arg]);
    let out = plan(&with_broken);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("broken.wasm") && stderr.contains("core module"),
        "{stderr}"
    );
}

/// Classified first: a VM that needs no fixup (every NIC on DHCP) is
/// answered without loading a plugin, so the broken file that stops
/// `plan` for a VM that needs one (above) is not read (a note says so),
/// and no cache entry is written.
#[test]
fn a_vm_that_needs_no_fixup_loads_no_plugin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).expect("mkdir");
    std::fs::write(plugins.join("broken.wasm"), b"\0asm\x01\0\0\0").expect("write");
    let cache = dir.path().join("cache");
    let out = Command::new(env!("CARGO_BIN_EXE_cocoon-fixup"))
        .arg("plan")
        .args(example_args("no-fixup"))
        .arg("--cocoon-root")
        .arg(examples().join("cocoon-root"))
        .arg("--plugin-dir")
        .arg(&plugins)
        .arg("--cache-dir")
        .arg(&cache)
        .arg("--cache-key")
        .arg(dir.path().join("cache.key"))
        .env_remove("COCOON_FIXUP_PLUGIN_DIR")
        .output()
        .expect("binary runs");
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("no fixup needed"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stderr).contains("no plugin was loaded"),
        "the note that the plugins were not checked: {}",
        text(&out.stderr)
    );
    let entries = std::fs::read_dir(&cache)
        .map(|d| d.count())
        .unwrap_or_default();
    assert_eq!(entries, 0, "a plan with no fixup wrote cache entries");
}

#[test]
fn help_explains_the_plan_command() {
    let help = help_of(&["plan"]);
    for flag in [
        "--pod",
        "--vm",
        "--source-image",
        "--boot",
        "--cocoon-root",
        "--plugin-dir",
        "--output",
    ] {
        assert!(help.contains(flag), "--help lists {flag}");
    }
}

/// `plan` says whether the VM is the pod's (spec section 2): bound for the
/// examples; for a record named after another pod it still plans (vendors
/// plan from hand-written files) but warns and reports the mismatch.
#[test]
fn plan_shows_the_binding_verdict() {
    let args = example_args("oci-static");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut json_args = args.clone();
    json_args.extend(["--output", "json"]);
    let out = plan(&json_args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["binding"]["verdict"], "bound");
    assert_eq!(json["binding"]["form"], "hashed");
    assert!(text(&out.stderr).is_empty(), "{}", text(&out.stderr));

    let dir = tempfile::tempdir().expect("tempdir");
    let vm = std::fs::read_to_string(examples().join("oci-static/vm.json")).expect("vm");
    let other = fixup_core::binding::vm_name_for_pod("tenant-b", "db-0");
    let record: serde_json::Value = serde_json::from_str(&vm).expect("vm json");
    let own = record["config"]["name"].as_str().expect("name").to_owned();
    let foreign = dir.path().join("vm.json");
    std::fs::write(&foreign, vm.replace(&own, &other)).expect("write");
    let pod = examples().join("oci-static/pod.json");
    let mut text_args = vec![
        "--pod",
        pod.to_str().expect("utf-8"),
        "--vm",
        foreign.to_str().expect("utf-8"),
    ];
    let out = plan(&text_args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.starts_with("warning: not this pod's VM"), "{stderr}");
    assert!(stderr.contains(&other) && stderr.contains(&own), "{stderr}");
    assert!(text(&out.stdout).contains("binding: not this pod's VM"));
    text_args.extend(["--output", "json"]);
    let out = plan(&text_args);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["binding"]["verdict"], "mismatch");
    assert_eq!(json["binding"]["reason"], "other-vm");
    assert_eq!(json["binding"]["record"], other.as_str());
}

/// A VM named by the pod's `vm.cocoonstack.io/name` though not derived
/// from the pod (a retired cocoon-webhook Deployment slot): without
/// `--accept-annotated-vm-names` a mismatch of its own kind; with it,
/// `plan`, which sees no other pods, says it is unproven, never bound.
#[rstest::rstest]
#[case::not_accepted(&[], "mismatch", "warning: not this pod's VM")]
#[case::accepted(&["--accept-annotated-vm-names"], "unproven", "note: not proven")]
fn plan_never_proves_an_annotated_name(
    #[case] flags: &[&str],
    #[case] verdict: &str,
    #[case] said: &str,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let read = |file: &str| -> serde_json::Value {
        let text =
            std::fs::read_to_string(examples().join("oci-static").join(file)).expect("example");
        serde_json::from_str(&text).expect("json")
    };
    let (mut pod, mut vm) = (read("pod.json"), read("vm.json"));
    let namespace = pod["metadata"]["namespace"]
        .as_str()
        .expect("namespace")
        .to_owned();
    let slot = format!("vk-{namespace}-demo-1");
    pod["metadata"]["annotations"]["vm.cocoonstack.io/name"] = serde_json::json!(slot);
    vm["config"]["name"] = serde_json::json!(slot);
    let (pod_file, vm_file) = (dir.path().join("pod.json"), dir.path().join("vm.json"));
    std::fs::write(&pod_file, pod.to_string()).expect("write");
    std::fs::write(&vm_file, vm.to_string()).expect("write");
    let mut args = vec![
        "--pod",
        pod_file.to_str().expect("utf-8"),
        "--vm",
        vm_file.to_str().expect("utf-8"),
        "--output",
        "json",
    ];
    args.extend(flags);
    let out = plan(&args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.starts_with(said), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["binding"]["verdict"], verdict, "{json}");
    if verdict == "mismatch" {
        assert_eq!(json["binding"]["reason"], "annotated-not-accepted");
        assert!(stderr.contains("--accept-annotated-vm-names"), "{stderr}");
    } else {
        assert_eq!(json["binding"]["name"], slot.as_str());
    }
}

/// `fc-mac` is generic by design: a flavoured Firecracker clone gets no
/// note that no plugin serves its flavour for `fc-mac` (which would nudge
/// a vendor into claiming it).
#[test]
fn a_flavoured_firecracker_clone_is_not_told_to_claim_fc_mac() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pod: serde_json::Value = serde_json::from_slice(
        &std::fs::read(examples().join("fc-dhcp/pod.json")).expect("the example pod"),
    )
    .expect("JSON");
    pod["metadata"]["annotations"]["vm.cocoonstack.io/guest-flavor"] = "ubuntu".into();
    let pod_path = dir.path().join("pod.json");
    std::fs::write(&pod_path, pod.to_string()).expect("write");
    let vm = examples().join("fc-dhcp/vm.json");
    let args = [
        "--pod",
        pod_path.to_str().unwrap(),
        "--vm",
        vm.to_str().unwrap(),
    ];
    let out = plan(&args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("fc-mac"), "an fc-mac plan: {stdout}");
    assert!(!stdout.contains("for fc-mac"), "{stdout}");
}

/// A guest-flavour annotation no plugin serves: `plan` says so in text and
/// JSON, naming the flavour, the scenario and the plugin that planned it
/// instead.
#[test]
fn plan_says_when_no_plugin_serves_the_annotated_flavour() {
    let args = example_args("oci-static");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = plan(&args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for needle in [
        "\nnote: annotation vm.cocoonstack.io/guest-flavor names flavour `ubuntu`, but no plugin serves `ubuntu` for oci-networkd: oci-networkd ",
        " (built-in:oci-networkd), which serves any flavour, planned it instead",
    ] {
        assert!(stdout.contains(needle), "{needle}: {stdout}");
    }

    let mut json_args = args.clone();
    json_args.extend(["--output", "json"]);
    let out = plan(&json_args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!(json["flavor"], "ubuntu");
    let unmatched = &json["flavor_unmatched"];
    assert_eq!(unmatched.as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!(unmatched[0]["flavor"], "ubuntu");
    assert_eq!(unmatched[0]["scenario"], "oci-networkd");
    assert_eq!(unmatched[0]["planned_by"], "oci-networkd");
    assert_eq!(unmatched[0]["source"], "built-in:oci-networkd");
    assert!(
        unmatched[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no plugin serves `ubuntu`")),
        "{json}"
    );
}

/// `plugin test --render` prints each case's hint script, or why there is
/// none, in text and JSON.
#[test]
fn plugin_test_renders_each_cases_hint_script() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = dir.path().join("oci-networkd.wasm");
    let (_, bytes) = fixup_core::plugin::builtin::BUILTINS
        .iter()
        .find(|(n, _)| *n == "oci-networkd")
        .expect("built-in");
    std::fs::write(&plugin, bytes).expect("write");
    let cases = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/oci-networkd/cases");
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_cocoon-fixup"))
            .args(["plugin", "test"])
            .arg(&plugin)
            .arg(&cases)
            .args(["--no-cache"])
            .args(extra)
            .output()
            .expect("binary runs")
    };
    let out = run(&["--render"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("        hint script:\n"), "{stdout}");
    assert!(
        stdout.contains("dhcp-recovery plan for VM web-3 (id vm-web-3)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("no script: the plugin declined"),
        "{stdout}"
    );
    let out = run(&["--render", "--output", "json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert!(
        json["cases"]
            .as_array()
            .expect("cases")
            .iter()
            .any(|c| c["script"]
                .as_str()
                .is_some_and(|s| s.contains("dhcp-recovery plan"))),
        "{json}"
    );
}

/// `plugin inspect --help` says when the exit code is 1: a refused file,
/// or a plugin directory that would not load as a whole (`success`).
#[test]
fn plugin_inspect_help_says_when_it_exits_1() {
    let help = help_of(&["plugin", "inspect"])
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        help.contains("Exit code 1 when refused or when the plugin directory would not load as a whole (JSON: `success`)"),
        "{help}"
    );
}

/// `plugin pull --help` lists what a pull uses (the store, the registries
/// over plain HTTP), not the daemon's or the planner's options.
#[test]
fn plugin_pull_help_lists_only_what_a_pull_uses() {
    let help = help_of(&["plugin", "pull"]);
    let flags: Vec<&str> = help
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| w.starts_with("--"))
        .collect();
    for flag in [
        "--output",
        "--allow-tag",
        "--plain-http",
        "--oci-store",
        "--oci-plain-http",
        "--config",
    ] {
        assert!(flags.contains(&flag), "--help lists {flag}: {help}");
    }
    for flag in [
        "--retry-budget",
        "--concurrency",
        "--plugin-dir",
        "--cache-dir",
        "--plugin-ref",
        "--cocoon-bin",
    ] {
        assert!(!flags.contains(&flag), "--help lists {flag}: {help}");
    }
}

/// Work a daemon left `running` is planned as resumed work, as the daemon
/// plans it: the source image is unknown, so the overlay probe decides the
/// flavour. The cloudimg example's record names an http(s) image and has no
/// overlay, so the same pod plans cloudimg fresh and oci-networkd resumed.
#[test]
fn plan_takes_running_work_as_resumed() {
    let pod = example_pod("cloudimg-static");
    let mut running = pod.clone();
    running["metadata"]["annotations"]["vm.cocoonstack.io/post-clone-state"] = "running".into();
    let mut scenarios = Vec::new();
    for (name, pod) in [("fresh", &pod), ("running", &running)] {
        let out = plan_example("cloudimg-static", pod, &["--output", "json"]);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        scenarios.push(json["scenario"].as_str().unwrap_or_default().to_owned());
    }
    assert_eq!(scenarios, ["cloudimg", "oci-networkd"]);
}

/// The pod of an example.
fn example_pod(example: &str) -> serde_json::Value {
    let path = examples().join(example).join("pod.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// `plan` of `pod` (written to a file) with the example's VM record.
fn plan_example(example: &str, pod: &serde_json::Value, more: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pod.json");
    std::fs::write(&path, pod.to_string()).unwrap();
    let vm = examples().join(example).join("vm.json");
    let mut args = vec![
        "--pod",
        path.to_str().unwrap(),
        "--vm",
        vm.to_str().unwrap(),
    ];
    args.extend_from_slice(more);
    plan(&args)
}

/// A macOS pod is hands-off (behaviour section 8): `plan` refuses it
/// instead of planning it as Linux, whatever the case of `macos`.
#[test]
fn plan_refuses_a_macos_pod() {
    let mut pod = example_pod("oci-static");
    pod["metadata"]["annotations"]["cocoonset.cocoonstack.io/os"] = " MacOS ".into();
    let out = plan_example("oci-static", &pod, &[]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("hands-off (macos)"), "{stderr}");
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
}

/// `embed` answers the JSON ops line by line, outlives a SIGTERM sent to
/// its process group (its embedder ends its steps first), and ends with
/// its input, after what is in flight.
#[test]
fn embed_answers_ignores_sigterm_and_ends_with_its_input() {
    use std::io::{BufRead, BufReader, Write};
    let mut child = Command::new(env!("CARGO_BIN_EXE_cocoon-fixup"))
        .arg("embed")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("binary runs");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut ask = |request: &str| {
        writeln!(stdin, "{request}").unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        serde_json::from_str::<serde_json::Value>(&line).unwrap()
    };
    assert_eq!(
        ask(r#"{"id": 1, "op": "abi"}"#)["ok"]["abi"],
        cocoon_fixup::CF_ABI_VERSION
    );
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let answer = ask(r#"{"id": 2, "op": "fly"}"#);
    assert_eq!(answer["id"], 2, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown op"),
        "{answer}"
    );
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

/// A plugin file that describes itself with a built-in's name is refused
/// (built-in names are reserved: its hint, events, metrics and
/// configuration keys would be the built-in's); the built-in's own
/// component, byte for byte, is still recognised as itself.
#[test]
fn a_file_may_not_take_a_built_ins_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, bytes) = fixup_core::plugin::builtin::BUILTINS
        .iter()
        .find(|(n, _)| *n == "fc-mac")
        .expect("built-in");
    let inspect = |path: &Path| {
        Command::new(env!("CARGO_BIN_EXE_cocoon-fixup"))
            .args(["plugin", "inspect"])
            .arg(path)
            .args(["--no-cache"])
            .output()
            .expect("binary runs")
    };
    let same = dir.path().join("fc-mac.wasm");
    std::fs::write(&same, bytes).expect("write");
    let out = inspect(&same);
    assert!(
        text(&out.stdout).contains("it is built-in:fc-mac itself"),
        "stdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );

    // The same component with a custom section appended: other bytes, the
    // same describe.
    let mut other = bytes.to_vec();
    let name = b"cocoon-fixup-test";
    other.extend([0x00, u8::try_from(1 + name.len() + 1).unwrap()]);
    other.push(u8::try_from(name.len()).unwrap());
    other.extend(name);
    other.push(b'x');
    let impostor = dir.path().join("acme.wasm");
    std::fs::write(&impostor, &other).expect("write");
    let out = inspect(&impostor);
    assert!(!out.status.success(), "stdout: {}", text(&out.stdout));
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        said.contains("fc-mac is the name of a built-in plugin, and built-in names are reserved"),
        "{said}"
    );
}
