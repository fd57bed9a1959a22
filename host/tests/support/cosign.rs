//! The real cosign for the signed-plugin tests: built from `lab/cosign`
//! ([`super::go_tool`]), run offline with its home in a test's folder.
//! `COCOON_FIXUP_REQUIRE_COSIGN=1` (set by `.ci/run`) makes its absence a
//! failure instead of a skip.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use super::go_tool::GoTool;

const COSIGN: GoTool<'static> = GoTool {
    env: "COCOON_FIXUP_COSIGN",
    require: "COCOON_FIXUP_REQUIRE_COSIGN",
    tests: "the cosign tests (host/tests/signing.rs, tests/tests/signed.rs)",
    module: "lab/cosign",
    package: "github.com/sigstore/cosign/v2/cmd/cosign",
    output: "cosign",
};

/// cosign with its home, and its key pairs, in one folder.
pub struct Cosign {
    binary: PathBuf,
    home: PathBuf,
}

impl Cosign {
    /// cosign, built once per test process, at home in `home` (which
    /// gets a `keys` folder); `None` when skipped.
    pub fn new(home: &Path) -> Option<Self> {
        static BINARY: OnceLock<Result<Option<PathBuf>, String>> = OnceLock::new();
        let binary = BINARY
            .get_or_init(|| COSIGN.build())
            .clone()
            .unwrap_or_else(|e| panic!("{e}"))?;
        std::fs::create_dir_all(home.join("keys")).expect("keys folder");
        Some(Cosign {
            binary,
            home: home.to_owned(),
        })
    }

    /// `cosign ARGS`, offline, the keys' password empty; it must succeed.
    pub fn run(&self, args: &[&str]) -> Output {
        let out = Command::new(&self.binary)
            .args(args)
            .env("HOME", &self.home)
            .env("COSIGN_PASSWORD", "")
            .env("COSIGN_EXPERIMENTAL", "1")
            .output()
            .expect("run cosign");
        assert!(
            out.status.success(),
            "cosign {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// `cosign generate-key-pair`: `keys/NAME.key` and `keys/NAME.pub`.
    pub fn generate(&self, name: &str) {
        let prefix = self.home.join("keys").join(name);
        self.run(&[
            "generate-key-pair",
            "--output-key-prefix",
            prefix.to_str().unwrap(),
        ]);
    }

    /// The public key `keys/NAME.pub`, as a configuration names it.
    pub fn public_key(&self, name: &str) -> String {
        self.home
            .join(format!("keys/{name}.pub"))
            .display()
            .to_string()
    }

    /// `cosign sign --key keys/KEY.key` of `pinned` (`oci://...@sha256:...`),
    /// with nothing uploaded to a transparency log; `extra` flags after.
    pub fn sign(&self, key: &str, pinned: &str, extra: &[&str]) {
        let key = self.home.join(format!("keys/{key}.key"));
        let image = pinned.strip_prefix("oci://").unwrap_or(pinned);
        let mut args = vec![
            "sign",
            "--key",
            key.to_str().unwrap(),
            "--tlog-upload=false",
            "--yes",
        ];
        args.extend_from_slice(extra);
        args.push(image);
        self.run(&args);
    }
}
