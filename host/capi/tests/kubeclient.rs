//! The Go package's client-go adapter (`go/cocoonfixup/kubeclient`, a
//! module of its own on client-go v0.35) against a real kube-apiserver:
//! `go test` in that module with the lab (`lab/kube`'s
//! `cocoon-kube-lab`), this checkout's `cocoon-fixup` (the package's
//! child process) and `fake-cocoon`. Its tests run each adapter
//! method as vk-cocoon's node identity, then the stack's three kinds of pods
//! through the package's example wiring on the adapter and through
//! `cocoon-fixup serve`, and compare what each wrote (docs/kubernetes.md).
//!
//! The lab comes from `COCOON_FIXUP_KUBE_LAB` or is built with `go build
//! -mod=readonly` and `GOPROXY=off` into the test's target folder, as
//! `host/tests/realkube.rs` builds it; the module's own dependencies come
//! from the module cache only (`GOPROXY=off`: `cd go/cocoonfixup/kubeclient
//! && go mod download` fetches them; `lab/kube`'s download holds them
//! too). Without Go, the lab or the modules these tests say loudly that
//! they were skipped, and pass, unless `COCOON_FIXUP_REQUIRE_KUBE=1` makes
//! that a failure. With `COCOON_FIXUP_COUNT_REQUESTS=<file>` the API
//! server's request counts of both paths are written there as JSON.

mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::Value;
use support::{built, repo};

/// The Go tests that must pass (not skip).
const GO_TESTS: &[&str] = &[
    "TestGetReadsThePodAsTheAPIServerReturnsIt",
    "TestPatchAnnotationsCarriesTheUIDAndResourceVersionPreconditions",
    "TestANodeIdentityWritesOnlyItsPodsStatus",
    "TestNodePodsListsOnlyTheNodesPods",
    "TestEventIsAnEventsV1EventAsTheDaemonReportsIt",
    "TestListEventsTakesThePackagesSelectors",
    "TestListEventsSaysWhenItWasCut",
    "TestTheEmbeddersIdentityMayListEventsAsShipped",
    "TestTheExampleOnTheLabWritesWhatTheDaemonWrites",
    "TestOnlyTheAuthorizersRefusalIsTriedAgain",
];

fn required() -> bool {
    std::env::var_os("COCOON_FIXUP_REQUIRE_KUBE").is_some_and(|v| v == "1")
}

/// Say loudly that the tests were skipped, or fail where they are required.
fn skip(why: &str) {
    assert!(
        !required(),
        "the kubeclient tests cannot run and COCOON_FIXUP_REQUIRE_KUBE=1: {why}"
    );
    // Past the test harness, which shows a passing test's own output only
    // with --nocapture: a skip is said whatever the flags.
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED: the Go adapter's tests against a real kube-apiserver (host/capi/tests/kubeclient.rs): {why}. `.ci/run` builds lab/kube and requires them; docs/kubernetes.md. ***\n"
    );
}

fn kubeclient_dir() -> PathBuf {
    repo().join("go/cocoonfixup/kubeclient")
}

/// `go <args>` in `dir` with the module cache only; `None` (said loudly)
/// when the modules are not there.
fn go(dir: &Path, args: &[&str]) -> Option<std::process::Output> {
    let output = Command::new("go")
        .args(args)
        .current_dir(dir)
        .env("GOPROXY", "off")
        .output()
        .expect("running go");
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() && missing_modules(&stderr) {
        skip(&format!(
            "the modules of {} are not in the Go module cache (`cd {} && go mod download`): {}",
            dir.display(),
            dir.display(),
            stderr.trim()
        ));
        return None;
    }
    Some(output)
}

fn missing_modules(text: &str) -> bool {
    text.contains("GOPROXY=off") || text.contains("missing go.sum entry")
}

/// The lab: `COCOON_FIXUP_KUBE_LAB`, or built from lab/kube into the
/// test's target folder; `None` (said loudly) when it cannot be.
fn lab_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("COCOON_FIXUP_KUBE_LAB") {
        return Some(PathBuf::from(path));
    }
    let binary = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cocoon-kube-lab");
    let started = Instant::now();
    eprintln!("building lab/kube (a first build takes several minutes; docs/kubernetes.md)");
    let dest = binary.to_str().expect("a UTF-8 target folder");
    let out = go(
        &repo().join("lab/kube"),
        &[
            "build",
            "-trimpath",
            "-buildvcs=false",
            "-mod=readonly",
            "-o",
            dest,
            ".",
        ],
    )?;
    assert!(
        out.status.success(),
        "go build in lab/kube failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("built {} in {:.1?}", binary.display(), started.elapsed());
    Some(binary)
}

/// `fake-cocoon`: `COCOON_FIXUP_FAKE_COCOON`, or built into `profile`.
fn fake_cocoon(profile: &Path) -> PathBuf {
    if let Some(path) = std::env::var_os("COCOON_FIXUP_FAKE_COCOON") {
        return PathBuf::from(path);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "-p", "fake-cocoon", "--bin", "fake-cocoon"])
        .current_dir(repo());
    if profile.ends_with("release") {
        build.arg("--release");
    }
    let status = build.status().expect("running cargo");
    assert!(status.success(), "building fake-cocoon failed");
    let bin = profile.join("fake-cocoon");
    assert!(bin.exists(), "{} is missing after the build", bin.display());
    bin
}

/// Whether Go is here; `false` (said loudly) lets the test skip.
fn have_go() -> bool {
    match Command::new("go").arg("version").output() {
        Ok(version) if version.status.success() => {
            eprintln!("{}", String::from_utf8_lossy(&version.stdout).trim());
            true
        }
        _ => {
            skip("the Go toolchain is not installed (Go 1.26, as the module's go.mod says)");
            false
        }
    }
}

#[test]
fn the_go_adapter_works_against_the_real_apiserver_and_writes_what_the_daemon_writes() {
    if !have_go() {
        return;
    }
    let dir = kubeclient_dir();
    // Formatted and vetted; the vet also finds the modules missing.
    let Some(vet) = go(&dir, &["vet", "./..."]) else {
        return;
    };
    assert!(
        vet.status.success(),
        "go vet in {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&vet.stderr)
    );
    let gofmt = Command::new("gofmt")
        .args(["-l", "."])
        .current_dir(&dir)
        .output()
        .expect("running gofmt");
    assert!(
        gofmt.status.success() && gofmt.stdout.is_empty(),
        "gofmt -l in {} lists:\n{}{}",
        dir.display(),
        String::from_utf8_lossy(&gofmt.stdout),
        String::from_utf8_lossy(&gofmt.stderr)
    );
    let Some(lab) = lab_binary() else {
        return;
    };
    let profile = built();
    let fake = fake_cocoon(&profile);

    let started = Instant::now();
    let mut command = Command::new("go");
    command
        .args(["test", "-count=1", "-json", "-timeout=20m", "./..."])
        .current_dir(&dir)
        .env("GOPROXY", "off")
        .env("CGO_ENABLED", "1")
        .env("COCOON_FIXUP_KUBE_LAB", &lab)
        .env("COCOON_FIXUP_BIN", profile.join("cocoon-fixup"))
        .env("COCOON_FIXUP_FAKE_COCOON", &fake)
        // Past this point nothing may skip: the Go tests are required.
        .env("COCOON_FIXUP_REQUIRE_KUBE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("running go test");
    let stdout = child.stdout.take().expect("piped");
    // Each test's last word (pass, fail, skip), its output echoed as it
    // comes.
    let mut ended: BTreeMap<String, String> = BTreeMap::new();
    let mut other = String::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("go test's output");
        let Ok(event) = serde_json::from_str::<Value>(&line) else {
            eprintln!("{line}");
            other.push_str(&line);
            other.push('\n');
            continue;
        };
        if let Some(output) = event["Output"].as_str() {
            eprint!("{output}");
            if event["Test"].is_null() {
                other.push_str(output);
            }
        }
        if let (Some(test), Some(action)) = (event["Test"].as_str(), event["Action"].as_str())
            && matches!(action, "pass" | "fail" | "skip")
        {
            ended.insert(test.to_owned(), action.to_owned());
        }
    }
    let out = child.wait_with_output().expect("go test ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    if !out.status.success() && missing_modules(&format!("{other}{stderr}")) {
        skip(
            "the module's dependencies are not in the Go module cache (`cd go/cocoonfixup/kubeclient && go mod download`)",
        );
        return;
    }
    eprintln!(
        "go test in {} took {:.1?}",
        dir.display(),
        started.elapsed()
    );
    assert!(out.status.success(), "go test failed (output above)");
    for test in GO_TESTS {
        assert_eq!(
            ended.get(*test).map(String::as_str),
            Some("pass"),
            "{test} did not pass (it was {:?}; output above)",
            ended.get(*test)
        );
    }
}
