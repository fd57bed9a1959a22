//! The commands a person runs at a terminal (`plan`, `plugin test`,
//! `plugin inspect`), as the binary: what `COCOON_FIXUP_LOG` shows, whose
//! plugin cache they use, and what their `--help` lists.

use std::path::Path;
use std::process::{Command, Output};

/// `cocoon-fixup ARGS` in an environment of PATH and `vars` only (so no
/// COCOON_FIXUP_*, XDG_* or NO_COLOR of the caller's leaks in), with
/// stderr a pipe.
fn cocoon_fixup(args: &[&str], vars: &[(&str, &Path)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cocoon-fixup"));
    command.env_clear().env("PATH", "/usr/bin:/bin").args(args);
    for (name, value) in vars {
        command.env(name, value);
    }
    command.output().expect("binary runs")
}

/// `plan` of the oci-static example with `extra` options.
fn plan(extra: &[&str], vars: &[(&str, &Path)]) -> Output {
    let mut args = crate::support::example_plan_args();
    args.extend(extra.iter().map(|arg| arg.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = cocoon_fixup(&args, vars);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The lines of stderr that are warnings: log lines at WARN and the
/// binary's own `warning:` lines.
fn warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains(" WARN ") || l.starts_with("warning:"))
        .collect()
}

/// The stderr of `plan --no-cache` with `COCOON_FIXUP_LOG=value`. No
/// cache: every built-in is compiled, which is when the compiler logs.
fn plan_logging(value: &str) -> String {
    let home = tempfile::tempdir().unwrap();
    let out = plan(
        &["--no-cache"],
        &[
            ("HOME", home.path()),
            ("COCOON_FIXUP_LOG", Path::new(value)),
        ],
    );
    text(&out.stderr)
}

#[test]
fn debug_is_the_hosts_own_log_without_colour_on_a_pipe() {
    let stderr = plan_logging("debug");
    assert!(
        stderr.contains("DEBUG") && stderr.contains("fixup_core::plugin"),
        "the host's debug lines: {stderr}"
    );
    assert!(stderr.contains("oci-networkd"), "{stderr}");
    assert!(!stderr.contains("wasmtime"), "{stderr}");
    assert!(!stderr.contains("cranelift"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "no escape codes on a pipe: {stderr}"
    );
}

#[test]
fn a_written_filter_is_taken_as_written() {
    let stderr = plan_logging("warn,cranelift_codegen=debug");
    assert!(stderr.contains("cranelift_codegen"), "widened: {stderr}");
    assert!(!stderr.contains("fixup_core"), "host at warn: {stderr}");
}

#[test]
fn a_bad_log_filter_is_one_warning_naming_the_variable() {
    let stderr = plan_logging("debug,wasmtime=loud");
    let warned = warnings(&stderr);
    assert_eq!(warned.len(), 1, "{stderr}");
    assert!(warned[0].contains("COCOON_FIXUP_LOG"), "{stderr}");
}

#[test]
fn plan_keeps_its_cache_and_key_in_the_users_home() {
    let home = tempfile::tempdir().unwrap();
    let out = plan(&[], &[("HOME", home.path())]);
    assert_eq!(warnings(&text(&out.stderr)), Vec::<&str>::new());
    let cache = home.path().join(".cache/cocoon-fixup");
    let entries = std::fs::read_dir(&cache)
        .unwrap_or_else(|e| panic!("{}: {e}", cache.display()))
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".cwasm"))
        .count();
    assert!(entries >= 1, "compiled plugins in {}", cache.display());
    assert!(
        home.path()
            .join(".local/state/cocoon-fixup/cache.key")
            .is_file()
    );
}

#[test]
fn entries_that_cannot_be_replaced_are_one_warning() {
    let home = tempfile::tempdir().unwrap();
    plan(&[], &[("HOME", home.path())]);
    // Every entry the first run wrote becomes a directory: each plugin's
    // lookup fails to read it and its store fails to replace it.
    let cache = home.path().join(".cache/cocoon-fixup");
    let mut entries = 0;
    for entry in std::fs::read_dir(&cache).unwrap() {
        let path = entry.unwrap().path();
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        entries += 1;
    }
    assert!(entries >= 4, "an artifact and a record a plugin");
    let out = plan(&[], &[("HOME", home.path())]);
    let stderr = text(&out.stderr);
    let warned = warnings(&stderr);
    // Reading each is refused (not a regular file: a warning each, as
    // anything that may be someone's doing); replacing each fails alike,
    // and those failures are one warning.
    let refused = warned.iter().filter(|w| w.contains("refused")).count();
    assert_eq!(refused, entries, "{stderr}");
    let unwritable: Vec<_> = warned.iter().filter(|w| !w.contains("refused")).collect();
    assert_eq!(unwritable.len(), 1, "{stderr}");
    assert!(unwritable[0].contains("cannot write"), "{stderr}");
    assert!(unwritable[0].contains("debug level"), "{stderr}");
}

#[test]
fn a_refused_cache_entry_is_a_warning_every_time() {
    let home = tempfile::tempdir().unwrap();
    plan(&[], &[("HOME", home.path())]);
    // Every entry becomes a link to a copy of itself: the trust rules
    // refuse each one, and a refusal may be someone's doing, so none of
    // them is folded into the one warning of an unusable cache.
    let cache = home.path().join(".cache/cocoon-fixup");
    let aside = tempfile::tempdir().unwrap();
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&cache).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_owned();
        let copy = aside.path().join(&name);
        std::fs::rename(&path, &copy).unwrap();
        std::os::unix::fs::symlink(&copy, &path).unwrap();
        names.push(name.to_string_lossy().into_owned());
    }
    assert!(names.len() >= 4, "an artifact and a record a plugin");
    let out = plan(&[], &[("HOME", home.path())]);
    let stderr = text(&out.stderr);
    let warned = warnings(&stderr);
    for name in &names {
        assert!(
            warned
                .iter()
                .any(|w| w.contains(name.as_str()) && w.contains("refused")),
            "{name} not warned about:\n{stderr}"
        );
    }
    assert!(!stderr.contains("debug level"), "{stderr}");
}

#[test]
fn a_cache_directory_that_cannot_be_made_is_one_warning() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join(".cache"), b"").unwrap();
    let out = plan(&[], &[("HOME", home.path())]);
    let stderr = text(&out.stderr);
    let warned = warnings(&stderr);
    assert_eq!(warned.len(), 1, "{stderr}");
    assert!(
        warned[0].contains("plugin cache directory refused"),
        "{stderr}"
    );
}

#[test]
fn no_home_is_no_cache_and_one_warning() {
    let out = plan(&[], &[]);
    let stderr = text(&out.stderr);
    let warned = warnings(&stderr);
    assert_eq!(warned.len(), 1, "{stderr}");
    assert!(warned[0].contains("--cache-dir"), "{stderr}");
}

#[test]
fn plugin_test_and_inspect_help_lists_only_what_plans() {
    for command in ["test", "inspect"] {
        let out = cocoon_fixup(&["plugin", command, "--help"], &[]);
        assert!(out.status.success());
        let help = text(&out.stdout);
        for daemon in [
            "--cocoon-bin",
            "--lease-file",
            "--concurrency",
            "--metrics-addr",
            "--retry-budget",
            "--ip-wait",
        ] {
            assert!(!help.contains(daemon), "plugin {command}: {daemon}\n{help}");
        }
        for planning in [
            "--config",
            "--plugin-dir",
            "--cache-dir",
            "--cache-key",
            "--no-cache",
            "--plugin-fuel",
            "--plan-max-steps",
            "--allow-plugin",
        ] {
            assert!(
                help.contains(planning),
                "plugin {command}: {planning}\n{help}"
            );
        }
    }
    let plan = text(&cocoon_fixup(&["plan", "--help"], &[]).stdout);
    assert!(plan.contains("--cache-dir") && plan.contains("--cocoon-root"));
}
