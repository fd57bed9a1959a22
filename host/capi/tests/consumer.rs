//! A module that uses the Go package as vk-cocoon does
//! (`tests/go-consumer`), built each way such a daemon is built: `go test
//! -race` (cgo on, no library on `CGO_LDFLAGS`), `go build` with cgo on and
//! off, `go vet` for darwin/arm64, and `go mod vendor` followed by vendored
//! builds without a tag and with `-tags cocoonfixup_linked`. The module is
//! copied to a temporary folder, its `replace` pointed at this checkout's
//! `go/cocoonfixup`, so no `vendor/` is left in the tree; nothing is
//! fetched. Needs Go 1.19 or later: without it these tests say loudly that
//! they were skipped, unless `COCOON_FIXUP_REQUIRE_GO=1` (set by `.ci/run`)
//! makes that a failure.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::{built, have_go, repo};

/// A copy of `tests/go-consumer` in a temporary folder, its `replace`
/// pointing at this checkout's package.
fn consumer_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let source = repo().join("tests/go-consumer");
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".go") || name == "go.mod" || name == "go.sum" {
            std::fs::copy(entry.path(), dir.path().join(&*name)).unwrap();
        }
    }
    let package = repo().join("go/cocoonfixup").canonicalize().unwrap();
    let go_mod = std::fs::read_to_string(dir.path().join("go.mod")).unwrap();
    let relative = "=> ../../go/cocoonfixup";
    assert!(
        go_mod.contains(relative),
        "tests/go-consumer/go.mod has no `replace ... {relative}`:\n{go_mod}"
    );
    let go_mod = go_mod.replace(relative, &format!("=> {}", package.display()));
    std::fs::write(dir.path().join("go.mod"), go_mod).unwrap();
    dir
}

/// `go <args>` in dir, with env over a neutral environment: no proxy, no
/// workspace, the module's own requirements only; no cgo settings, target
/// or binary unless env gives them.
fn go(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new("go")
        .args(args)
        .current_dir(dir)
        .env_remove("CGO_ENABLED")
        .env_remove("CGO_LDFLAGS")
        .env_remove("GOOS")
        .env_remove("GOARCH")
        .env_remove("COCOON_FIXUP_BIN")
        .env("GOPROXY", "off")
        .env("GOFLAGS", "-mod=mod")
        .env("GOWORK", "off")
        .env("GOTOOLCHAIN", "local")
        .envs(env.iter().copied())
        .output()
        .expect("running go")
}

/// Runs `go <args>` and fails, naming the build and showing go's output,
/// unless it succeeds.
fn must(what: &str, dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let output = go(dir, args, env);
    assert!(
        output.status.success(),
        "{what} failed: `go {}` ({})\n--- stderr\n{}\n--- stdout\n{}",
        args.join(" "),
        show(env),
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    output
}

fn show(env: &[(&str, &str)]) -> String {
    env.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs a program the module built and returns what it printed.
fn run(what: &str, program: &Path, bin: Option<&Path>) -> String {
    let mut command = Command::new(program);
    command.env_remove("COCOON_FIXUP_BIN");
    if let Some(bin) = bin {
        command.env("COCOON_FIXUP_BIN", bin);
    }
    let output = command.output().expect("running the consumer");
    assert!(
        output.status.success(),
        "{what}: the program failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn binary(profile: &Path) -> PathBuf {
    profile.join("cocoon-fixup")
}

/// `go test -race` as vk-cocoon's CI runs it (cgo on, no library on
/// the link path), `go build` with cgo on and off, `go vet` for
/// darwin/arm64; and the linked tag without cgo fails, saying why.
#[test]
fn the_consumer_builds_and_tests_as_vk_cocoon_does() {
    if !have_go("the Go consumer module's builds") {
        return;
    }
    let profile = built();
    let bin = binary(&profile);
    let bin = bin.to_str().unwrap();
    let module = consumer_copy();
    let dir = module.path();

    let test = must(
        "go test -race (cgo on, no library)",
        dir,
        &["test", "-race", "-count=1", "-v", "./..."],
        &[("CGO_ENABLED", "1"), ("COCOON_FIXUP_BIN", bin)],
    );
    let stdout = String::from_utf8_lossy(&test.stdout);
    for name in ["TestWithoutTheBinary", "TestWithTheBinary"] {
        assert!(
            stdout.contains(&format!("--- PASS: {name} ")),
            "{name} did not pass (or did not run) in go test -race:\n{stdout}"
        );
    }
    for cgo in ["1", "0"] {
        must(
            &format!("go build with CGO_ENABLED={cgo}"),
            dir,
            &["build", "./..."],
            &[("CGO_ENABLED", cgo)],
        );
    }
    must(
        "go vet for darwin/arm64",
        dir,
        &["vet", "./..."],
        &[("GOOS", "darwin"), ("GOARCH", "arm64")],
    );
    let out = tempfile::tempdir().unwrap();
    let target = format!("{}/", out.path().display());
    must(
        "go build with CGO_ENABLED=0 (a program)",
        dir,
        &["build", "-o", &target, "./..."],
        &[("CGO_ENABLED", "0")],
    );
    let printed = run(
        "built with CGO_ENABLED=0",
        &out.path().join("go-consumer"),
        Some(Path::new(bin)),
    );
    assert_eq!(printed, "process nothing not-managed");

    let refused = go(
        dir,
        &["build", "-tags", "cocoonfixup_linked", "./..."],
        &[("CGO_ENABLED", "0")],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("cgo is off: build with CGO_ENABLED=1"),
        "go build -tags cocoonfixup_linked with CGO_ENABLED=0 did not fail saying why:\n{stderr}"
    );
}

/// `go mod vendor` copies the header (the package's `include/`), and the
/// vendored module builds without a tag (the child process) and with
/// `-tags cocoonfixup_linked` against the static archive, which then
/// serves without the binary.
#[test]
fn the_vendored_consumer_builds_with_and_without_the_library() {
    if !have_go("the Go consumer module's builds") {
        return;
    }
    let profile = built();
    let module = consumer_copy();
    let dir = module.path();
    must("go mod vendor", dir, &["mod", "vendor"], &[]);
    let header = dir
        .join("vendor/github.com/cocoonstack/cocoon-fixup/go/cocoonfixup/include/cocoon_fixup.h");
    assert!(
        header.exists(),
        "go mod vendor left out the header: {} is missing",
        header.display()
    );

    let out = tempfile::tempdir().unwrap();
    let untagged = out.path().join("untagged/");
    let untagged_dir = format!("{}/", untagged.display());
    must(
        "go build -mod=vendor (cgo on, no tag)",
        dir,
        &["build", "-mod=vendor", "-o", &untagged_dir, "./..."],
        &[("CGO_ENABLED", "1")],
    );
    let printed = run(
        "built -mod=vendor without a tag",
        &untagged.join("go-consumer"),
        Some(&binary(&profile)),
    );
    assert_eq!(printed, "process nothing not-managed");

    let linked = out.path().join("linked/");
    let linked_dir = format!("{}/", linked.display());
    let ldflags = format!("-L{}", profile.display());
    must(
        "go build -mod=vendor -tags cocoonfixup_linked (the static archive)",
        dir,
        &[
            "build",
            "-mod=vendor",
            "-tags",
            "cocoonfixup_linked",
            "-o",
            &linked_dir,
            "./...",
        ],
        &[("CGO_ENABLED", "1"), ("CGO_LDFLAGS", &ldflags)],
    );
    let printed = run(
        "built -mod=vendor -tags cocoonfixup_linked",
        &linked.join("go-consumer"),
        None,
    );
    assert_eq!(printed, "linked nothing not-managed");
}
