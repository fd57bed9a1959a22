//! The Go package (`go/cocoonfixup`) against this library: `go test -race`
//! with the static archive built for this checkout, the `cocoon-fixup`
//! binary to compare reports with, and the hostile test plugin. Needs Go
//! 1.19 or later (`apt-get install golang-go`); `.ci/run` installs it.

mod support;

use std::process::Command;

use support::{built, repo};

#[test]
fn the_go_package_passes_its_tests_under_the_race_detector() {
    let profile = built();
    let version = Command::new("go").arg("version").output();
    let Ok(version) = version else {
        panic!(
            "the Go toolchain is needed for the Go package's tests (Go 1.19 or later; on Debian `apt-get install golang-go`)"
        );
    };
    eprintln!("{}", String::from_utf8_lossy(&version.stdout).trim());
    let output = Command::new("go")
        // 100,000 plan calls under the race detector take minutes in a
        // debug build: well past go test's default ten.
        .args(["test", "-race", "-count=1", "-timeout=40m", "-v", "./..."])
        .current_dir(repo().join("go/cocoonfixup"))
        .env("CGO_ENABLED", "1")
        .env("CGO_LDFLAGS", format!("-L{}", profile.display()))
        .env("COCOON_FIXUP_BIN", profile.join("cocoon-fixup"))
        .env(
            "COCOONFIXUP_HOSTILE_PLUGIN",
            fixup_tests::plugin_files::HOSTILE,
        )
        // The package has no dependencies: nothing is fetched.
        .env("GOPROXY", "off")
        .output()
        .expect("running go test");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(
        output.status.success(),
        "go test -race failed (output above)"
    );
    for test in [
        "TestReportsAreTheCLIs",
        "TestConcurrentPlanning",
        "TestHostilePluginErrorsAreTyped",
        "TestMemoryIsFlat",
        "TestCallersQueueForSlots",
        "TestAttemptsTakeOnlySealedPlans",
        "TestCloseWhileCallsAreInFlight",
        "TestExampleLoop",
        "TestExampleFlowEdges",
    ] {
        assert!(
            stdout.contains(&format!("--- PASS: {test} ")),
            "{test} did not pass (or did not run)"
        );
    }
}

/// The shared library through the package's `cocoonfixup_dynamic` tag: the
/// example built against `libcocoon_fixup.so` with a run path, and run.
#[test]
fn the_example_links_the_shared_library_too() {
    let profile = built();
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("postclone");
    let built = Command::new("go")
        .args(["build", "-tags", "cocoonfixup_dynamic", "-o"])
        .arg(&program)
        .arg("./example/postclone")
        .current_dir(repo().join("go/cocoonfixup"))
        .env("CGO_ENABLED", "1")
        .env(
            "CGO_LDFLAGS",
            format!("-L{0} -Wl,-rpath,{0}", profile.display()),
        )
        .env("GOPROXY", "off")
        .output()
        .expect("running go build (Go 1.19 or later is needed)");
    assert!(
        built.status.success(),
        "go build -tags cocoonfixup_dynamic failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let run = Command::new(&program)
        .arg("-examples")
        .arg(repo().join("examples"))
        .args(["-interval", "10ms", "-no-cache"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains(r#""reason":"PostCloneSucceeded""#) && stdout.contains(r#""fixup":"done""#),
        "{stdout}"
    );
}
