//! A Go program the tests run, built from one of the repository's lab
//! modules (`lab/kube`, `lab/cosign`) with the machine's Go, modules from
//! the module cache only (`GOPROXY=off`: a test never downloads), or taken
//! from an environment variable that names an executable built already
//! (as `.ci/run` does).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// What to build, and where it comes from.
pub struct GoTool<'a> {
    /// The variable naming a ready executable (`COCOON_FIXUP_KUBE_LAB`).
    pub env: &'a str,
    /// The variable that, set to `1`, makes a missing tool a failure
    /// instead of a skip (`COCOON_FIXUP_REQUIRE_KUBE`; `.ci/run` sets it).
    pub require: &'a str,
    /// The tests that need it, for the skip's message.
    pub tests: &'a str,
    /// The module folder under the repository (`lab/kube`).
    pub module: &'a str,
    /// The package to build in it (`.`, or a tool's import path).
    pub package: &'a str,
    /// The executable's name in the test's target folder.
    pub output: &'a str,
}

impl GoTool<'_> {
    /// Whether the tests that need the tool must run ([`GoTool::require`]).
    pub fn required(&self) -> bool {
        std::env::var_os(self.require).is_some_and(|v| v == "1")
    }

    /// Say loudly that the tests cannot run (past the test harness, which
    /// shows a passing test's output only with --nocapture), or fail where
    /// they are required.
    fn skip(&self, why: &str) -> Option<PathBuf> {
        assert!(
            !self.required(),
            "{} cannot run and {}=1: {why}",
            self.tests,
            self.require
        );
        let _ = writeln!(
            std::io::stderr(),
            "\n*** SKIPPED: {}: {why}. `.ci/run` builds {} and requires them. ***\n",
            self.tests,
            self.module
        );
        None
    }

    /// The executable: from [`GoTool::env`], else built now; `Ok(None)`
    /// (said loudly) when Go or the module's modules are missing, `Err`
    /// when the build fails.
    pub fn build(&self) -> Result<Option<PathBuf>, String> {
        if let Some(path) = std::env::var_os(self.env) {
            return Ok(Some(PathBuf::from(path)));
        }
        match Command::new("go").arg("version").output() {
            Ok(out) if out.status.success() => {
                eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim())
            }
            _ => {
                return Ok(self.skip(&format!(
                    "the Go toolchain is not installed (Go 1.26, as {}/go.mod says)",
                    self.module
                )));
            }
        }
        let binary = Path::new(env!("CARGO_TARGET_TMPDIR")).join(self.output);
        let started = Instant::now();
        eprintln!(
            "building {} from {} (a first build takes several minutes)",
            self.output, self.module
        );
        let out = Command::new("go")
            .args([
                "build",
                "-trimpath",
                "-buildvcs=false",
                "-mod=readonly",
                "-o",
            ])
            .arg(&binary)
            .arg(self.package)
            .current_dir(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("..")
                    .join(self.module),
            )
            // Never a download from a test: the modules come from the
            // cache (`cd MODULE && go mod download`, as .ci/run does).
            .env("GOPROXY", "off")
            .output()
            .map_err(|e| format!("go build: {e}"))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            if stderr.contains("GOPROXY=off") || stderr.contains("missing go.sum entry") {
                return Ok(self.skip(&format!(
                    "{0}'s modules are not in the Go module cache (`cd {0} && go mod download`)",
                    self.module
                )));
            }
            return Err(format!("go build in {} failed:\n{stderr}", self.module));
        }
        eprintln!("built {} in {:.1?}", binary.display(), started.elapsed());
        Ok(Some(binary))
    }
}
