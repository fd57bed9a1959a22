//! The Go package (`go/cocoonfixup`) against this library and binary:
//! `go test -race -tags cocoonfixup_linked` over the linked library, the
//! conformance suite and the newer tests on both backends (the library and
//! the `cocoon-fixup embed` child); the tests whose calls race each other
//! again under `-race` without the tag, where cgo is on but the child is
//! the only backend; then `go test` built with `CGO_ENABLED=0`;
//! the conformance suite runs through `Run` on both backends
//! (`conformance-world` serves its world, `sac-sim` the serial console).
//! The package also builds without cgo for other targets, and links the
//! shared library. Needs Go 1.19 or later (`apt-get install golang-go`):
//! without it these tests say loudly that they were skipped, unless
//! `COCOON_FIXUP_REQUIRE_GO=1` (set by `.ci/run`) makes that a failure.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use support::{built, have_go, repo};

/// `go <args>` in the package's folder with the test environment: the
/// library on the link path, the binary, the world and the hostile plugin.
fn go(profile: &Path, args: &[&str], cgo: bool, env: &[(&str, &str)]) -> Output {
    let output = Command::new("go")
        .args(args)
        .envs(env.iter().copied())
        .current_dir(repo().join("go/cocoonfixup"))
        .env("CGO_ENABLED", if cgo { "1" } else { "0" })
        .env("CGO_LDFLAGS", format!("-L{}", profile.display()))
        .env("COCOON_FIXUP_BIN", profile.join("cocoon-fixup"))
        .env("COCOONFIXUP_WORLD", profile.join("conformance-world"))
        .env("COCOONFIXUP_SAC_SIM", profile.join("sac-sim"))
        .env(
            "COCOONFIXUP_HOSTILE_PLUGIN",
            fixup_tests::plugin_files::HOSTILE,
        )
        // The package has no dependencies: nothing is fetched.
        .env("GOPROXY", "off")
        .output()
        .expect("running go");
    eprintln!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn assert_passed(output: &Output, what: &str, tests: &[&str]) {
    assert!(output.status.success(), "{what} failed (output above)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    for test in tests {
        assert!(
            stdout.contains(&format!("--- PASS: {test} ")),
            "{test} did not pass (or did not run) in {what}"
        );
    }
}

const PACKAGE_TESTS: &[&str] = &[
    "TestReportsAreTheCLIs",
    "TestConcurrentPlanning",
    "TestHostilePluginErrorsAreTyped",
    "TestMemoryIsFlat",
    "TestCallersQueueForSlots",
    "TestEachExecIsJudgedByItsOwnMarkers",
    "TestCloseWhileCallsAreInFlight",
    "TestConformanceThroughRun",
    "TestProviderFlow",
    "TestDeletePodCancelsTheStep",
    "TestReconcileResumesRunningWork",
    "TestConstantsAreTheLibrarys",
    "TestLeaseFile",
    "TestAnObservedHibernationMakesTheNextVMAWake",
    "TestTheLibrarysConsoleSetsAStaticAddress",
    "TestRunKeepsWhatObserveNotedMeanwhile",
    "TestADamagedStoreIsAGap",
    "TestPrepareParent",
    "TestAnObservedHibernationSparesTheWakeItsPnP",
    "TestTypedInputsPlanAsTheirJSON",
    "TestSetupErrorsArePermanent",
    "TestAutoIsTheBuildsBackend",
    "TestAnotherReleaseWarns",
    "TestVersionIsTheWorkspaces",
    "TestCallerErrorsReachTheCaller",
    "TestAnAPIErrorNamesThePod",
    "TestTheZeroAdmissionAllowsOne",
    "TestSettingsSwitchedOff",
    "TestAnUnknownBootIsRefused",
    "TestAnUnmadePlannerIsRefused",
    "TestAnUnpublishedChangeIsTold",
    "TestAnIncompleteStreamVMIsRefused",
    "TestStreamVMExec",
    "TestStreamVMRecord",
    "TestTheLibraryJudgesTheAnswers",
    "ExamplePlanner_Run",
    "ExampleError",
    "ExampleRunOptions_lifecycle",
    "ExampleStreamVM",
    "ExampleNewPlanner_process",
];

/// The tests whose calls race each other on the default backend, run again
/// under the race detector without the tag, where the child process is that
/// backend (the conformance suite already runs on both backends in the
/// first run).
const PROCESS_RACE_TESTS: &str = "TestConcurrentPlanning|TestCallersQueueForSlots|TestCloseWhileCallsAreInFlight|TestMemoryIsFlat|TestProviderFlow|TestDeletePodCancelsTheStep|TestReconcileResumesRunningWork";

/// The runs after the first check memory over 10,000 calls, not 100,000:
/// the first run's long count is the one that finds a slow leak, and the
/// library behind the child process is the same.
const FEWER_CALLS: &[(&str, &str)] = &[("COCOONFIXUP_MEMORY_CALLS", "10000")];

#[test]
fn the_go_package_passes_its_tests_on_both_backends() {
    if !have_go("the Go package's tests") {
        return;
    }
    let profile = built();
    // 100,000 plan calls under the race detector take minutes in a debug
    // build: well past go test's default ten.
    let race = [
        "test",
        "-race",
        "-tags",
        "cocoonfixup_linked",
        "-count=1",
        "-timeout=40m",
        "-v",
        "./...",
    ];
    let linked = go(&profile, &race, true, &[]);
    assert_passed(
        &linked,
        "go test -race -tags cocoonfixup_linked",
        PACKAGE_TESTS,
    );
    assert_passed(
        &linked,
        "go test -race (linked)",
        &["ExampleNewPlanner_linked"],
    );
    let stdout = String::from_utf8_lossy(&linked.stdout);
    for backend in [
        "linked",
        "process",
        "linked-lifecycle-owned",
        "process-lifecycle-owned",
    ] {
        assert!(
            stdout.contains(&format!("--- PASS: TestConformanceThroughRun/{backend} ")),
            "the conformance suite did not pass through Run on the {backend} backend"
        );
    }
    // The child process alone under the race detector (its transport
    // multiplexes calls and restarts), for the tests that use the default
    // backend: with cgo on and no tag, the child.
    let process = go(
        &profile,
        &[
            "test",
            "-race",
            "-count=1",
            "-timeout=40m",
            "-v",
            "-run",
            PROCESS_RACE_TESTS,
            "./...",
        ],
        true,
        FEWER_CALLS,
    );
    assert_passed(
        &process,
        "go test -race (no tag: the child process only)",
        &PROCESS_RACE_TESTS.split('|').collect::<Vec<_>>(),
    );
    let pure = go(
        &profile,
        &["test", "-count=1", "-timeout=40m", "-v", "./..."],
        false,
        FEWER_CALLS,
    );
    assert_passed(&pure, "go test with CGO_ENABLED=0", PACKAGE_TESTS);
}

/// Without cgo the package, its example and a maintainer's own program
/// (`tests/go-maintainer`, a module of its own that requires the package)
/// build for every target vk-cocoon builds for, and vet clean for darwin;
/// the maintainer's program builds with cgo and `-tags
/// cocoonfixup_linked` too, linking the library.
#[test]
fn the_package_and_a_maintainers_program_build_for_other_targets() {
    if !have_go("the Go package's tests") {
        return;
    }
    for dir in ["go/cocoonfixup", "tests/go-maintainer"] {
        for (goos, goarch, args) in [
            ("linux", "amd64", &["build", "./..."][..]),
            ("linux", "arm64", &["build", "./..."][..]),
            ("darwin", "arm64", &["vet", "./..."][..]),
            ("darwin", "amd64", &["build", "./..."][..]),
        ] {
            let output = Command::new("go")
                .args(args)
                .current_dir(repo().join(dir))
                .env("CGO_ENABLED", "0")
                .env("GOOS", goos)
                .env("GOARCH", goarch)
                .env("GOPROXY", "off")
                .output()
                .expect("running go");
            assert!(
                output.status.success(),
                "go {} in {dir} for {goos}/{goarch} without cgo failed:\n{}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    let profile = built();
    let dir = tempfile::tempdir().unwrap();
    let linked = Command::new("go")
        .args(["build", "-tags", "cocoonfixup_linked", "-o"])
        .arg(dir.path().join("maintainer"))
        .arg(".")
        .current_dir(repo().join("tests/go-maintainer"))
        .env("CGO_ENABLED", "1")
        .env("CGO_LDFLAGS", format!("-L{}", profile.display()))
        .env("GOPROXY", "off")
        .output()
        .expect("running go");
    assert!(
        linked.status.success(),
        "the maintainer's program with -tags cocoonfixup_linked failed to build:\n{}",
        String::from_utf8_lossy(&linked.stderr)
    );
}

/// The shared library through the package's `cocoonfixup_dynamic` tag
/// (alone: it implies the linked backend): the example built against
/// `libcocoon_fixup.so` with a run path, and run without the binary.
#[test]
fn the_example_links_the_shared_library_too() {
    if !have_go("the Go package's tests") {
        return;
    }
    let profile = built();
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("vkcocoon");
    let built = Command::new("go")
        .args(["build", "-tags", "cocoonfixup_dynamic", "-o"])
        .arg(&program)
        .arg("./example/vkcocoon")
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
    let cache = dir.path().join("cache");
    let run = Command::new(&program)
        .arg("-examples")
        .arg(repo().join("examples"))
        .args(["-interval", "10ms", "-no-cache"])
        .env("XDG_CACHE_HOME", &cache)
        // The library linked in serves: no child to fall back to.
        .env_remove("COCOON_FIXUP_BIN")
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
