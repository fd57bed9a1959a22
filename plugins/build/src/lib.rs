//! Build-script helper: builds plugin crates as `wasm32-wasip2` components
//! with a nested `cargo build`, so `cargo build` and `cargo test` at the
//! workspace root need no extra step.
//!
//! Two kinds of plugin crate: workspace members ([`build_plugins`], by
//! `-p`), and crates that are their own workspace the way a vendor's plugin
//! is ([`build_external_plugin`], by `--manifest-path`, for example
//! `examples/plugins/nm-keyfile`).
//!
//! Rules learned the hard way, each handled here:
//!
//! - the nested cargo gets its own target directory
//!   (`<workspace>/target/plugin-wasm` for members, shared by every profile;
//!   `<workspace>/target/plugin-wasm-external/<package>` for each external
//!   crate, which resolves its own dependencies), or it waits forever on the
//!   outer build's lock;
//! - one nested invocation per plugin, so features never unify across
//!   plugins;
//! - inherited flags and wrappers (`RUSTFLAGS`, coverage, `clippy-driver`)
//!   are removed: they are for the host target and break or leak into the
//!   wasm build;
//! - `rerun-if-changed` names source folders only, never a folder that
//!   contains the nested target directory (nor a crate folder, where a
//!   vendor's own `cargo build` leaves a `target/`).

use std::env;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The target every plugin is built for.
pub const TARGET: &str = "wasm32-wasip2";

/// Environment variables that must not reach the nested cargo.
const SCRUBBED_ENV: &[&str] = &[
    "CARGO_ENCODED_RUSTFLAGS",
    "RUSTFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "CARGO_BUILD_RUSTC_WRAPPER",
    "CARGO_BUILD_RUSTC_WORKSPACE_WRAPPER",
    "CLIPPY_ARGS",
    "CLIPPY_CONF_DIR",
    "CARGO_PRIMARY_PACKAGE",
    "RUSTDOCFLAGS",
    "CARGO_LLVM_COV",
    "LLVM_PROFILE_FILE",
];

/// One plugin crate to build.
#[derive(Debug, Clone)]
pub struct PluginCrate {
    /// The cargo package name, for example `fixup-plugin-cloudimg`.
    pub package: String,
    /// The crate folder, watched for changes.
    pub dir: PathBuf,
}

/// Why a plugin could not be built.
#[derive(Debug)]
pub enum BuildError {
    TargetMissing,
    Cargo {
        package: String,
        status: String,
        stderr_tail: String,
        /// The command that shows the whole output.
        rerun: String,
    },
    Io(String),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::TargetMissing => write!(
                f,
                "the {TARGET} target is missing: run `rustup target add {TARGET}`"
            ),
            BuildError::Cargo {
                package,
                status,
                stderr_tail,
                rerun,
            } => write!(
                f,
                "building plugin {package} for {TARGET} failed ({status}):\n{stderr_tail}\nrun `{rerun}` to see the whole output"
            ),
            BuildError::Io(e) => write!(f, "building plugins: {e}"),
        }
    }
}

impl std::error::Error for BuildError {}

/// The workspace root, found from a build script's `CARGO_MANIFEST_DIR`
/// (the nearest ancestor whose Cargo.toml has a `[workspace]` table).
pub fn workspace_root() -> PathBuf {
    let start = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("run from a build script"));
    start
        .ancestors()
        .find(|d| {
            std::fs::read_to_string(d.join("Cargo.toml"))
                .is_ok_and(|s| s.lines().any(|l| l.trim() == "[workspace]"))
        })
        .unwrap_or(&start)
        .to_path_buf()
}

/// True when the active toolchain has the plugin target installed.
pub fn target_installed() -> bool {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let Ok(out) = Command::new(rustc).args(["--print", "sysroot"]).output() else {
        return false;
    };
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    Path::new(&sysroot)
        .join("lib/rustlib")
        .join(TARGET)
        .is_dir()
}

/// Build each plugin (release, one nested cargo per plugin) and copy the
/// component to `out_dir/<file_name>.wasm`. Prints the `rerun-if-changed`
/// lines for the build script. Returns the copied paths in input order.
pub fn build_plugins(
    workspace: &Path,
    plugins: &[(PluginCrate, &str)],
    out_dir: &Path,
) -> Result<Vec<PathBuf>, BuildError> {
    watch_contract(workspace);
    if !target_installed() {
        return Err(BuildError::TargetMissing);
    }
    let target_dir = workspace.join("target").join("plugin-wasm");
    let mut built = Vec::new();
    for (plugin, file_name) in plugins {
        watch_crate(plugin, false);
        let mut cmd = nested_cargo();
        cmd.current_dir(workspace)
            .args(["build", "--release", "--quiet", "--target", TARGET, "-p"])
            .arg(&plugin.package)
            .arg("--target-dir")
            .arg(&target_dir);
        let rerun = format!(
            "cargo build --release --target {TARGET} -p {}",
            plugin.package
        );
        built.push(run_and_copy(
            cmd,
            plugin,
            rerun,
            &target_dir,
            out_dir,
            file_name,
        )?);
    }
    Ok(built)
}

/// Build a plugin crate that is its own workspace (a `[workspace]` table in
/// its Cargo.toml, depending on the SDK by path), the way a vendor builds
/// one: `cargo build --release --target wasm32-wasip2 --manifest-path
/// <dir>/Cargo.toml`, into `<workspace>/target/plugin-wasm-external/<package>`.
/// Its own `Cargo.lock` is used (and created when missing). Copies the
/// component to `out_dir/<file_name>.wasm`, prints the `rerun-if-changed`
/// lines and returns the copied path.
pub fn build_external_plugin(
    workspace: &Path,
    plugin: &PluginCrate,
    file_name: &str,
    out_dir: &Path,
) -> Result<PathBuf, BuildError> {
    watch_contract(workspace);
    watch_crate(plugin, true);
    if !target_installed() {
        return Err(BuildError::TargetMissing);
    }
    let target_dir = workspace
        .join("target")
        .join("plugin-wasm-external")
        .join(&plugin.package);
    let manifest = plugin.dir.join("Cargo.toml");
    let mut cmd = nested_cargo();
    cmd.current_dir(&plugin.dir)
        .args(["build", "--release", "--quiet", "--target", TARGET])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir);
    let rerun = format!(
        "cargo build --release --target {TARGET} --manifest-path {}",
        manifest.display()
    );
    run_and_copy(cmd, plugin, rerun, &target_dir, out_dir, file_name)
}

/// The contract and the SDK: every plugin is rebuilt when they change.
fn watch_contract(workspace: &Path) {
    for watched in [
        "wit",
        "plugins/sdk/src",
        "plugins/sdk/Cargo.toml",
        "Cargo.lock",
    ] {
        println!(
            "cargo:rerun-if-changed={}",
            workspace.join(watched).display()
        );
    }
}

/// The crate's sources and manifest; never the crate folder itself, which
/// may hold a `target/` of its own.
fn watch_crate(plugin: &PluginCrate, own_lock: bool) {
    let mut watched = vec!["src", "Cargo.toml"];
    if own_lock {
        watched.push("Cargo.lock");
    }
    for rel in watched {
        println!("cargo:rerun-if-changed={}", plugin.dir.join(rel).display());
    }
}

/// `cargo`, as the outer build runs it, without the environment meant for
/// the host target.
fn nested_cargo() -> Command {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut cmd = Command::new(cargo);
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    cmd
}

/// Runs one nested build and copies its component to
/// `out_dir/<file_name>.wasm`.
fn run_and_copy(
    mut cmd: Command,
    plugin: &PluginCrate,
    rerun: String,
    target_dir: &Path,
    out_dir: &Path,
    file_name: &str,
) -> Result<PathBuf, BuildError> {
    let out = cmd.output().map_err(|e| {
        BuildError::Io(format!(
            "cannot run {}: {e}",
            cmd.get_program().to_string_lossy()
        ))
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("target may not be installed") {
            return Err(BuildError::TargetMissing);
        }
        let lines: Vec<&str> = stderr.lines().collect();
        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
        return Err(BuildError::Cargo {
            package: plugin.package.clone(),
            status: out.status.to_string(),
            stderr_tail: tail,
            rerun,
        });
    }
    let artifact = target_dir
        .join(TARGET)
        .join("release")
        .join(format!("{}.wasm", plugin.package.replace('-', "_")));
    let dest = out_dir.join(format!("{file_name}.wasm"));
    std::fs::copy(&artifact, &dest).map_err(|e| {
        BuildError::Io(format!(
            "cannot copy {} to {}: {e}",
            artifact.display(),
            dest.display()
        ))
    })?;
    Ok(dest)
}
