//! A throwaway stand-in guest in which rendered plans really run.
//!
//! A [`Guest`] is a temporary directory with:
//!
//! - `bin/`: stub programs (`ip`, `systemctl`, `cloud-init`, `powershell`,
//!   `cmd`, `rec`, ...) that append their argv to `stub.log` (the argument
//!   count, the program's base name and every argument, each terminated by
//!   NUL, so newlines and quotes survive) and exit 0; and `sh`, a link to
//!   the shell under test (dash or bash). `printf` is the shell's builtin
//!   and `rm` and `chmod` are the real ones: they are what write and remove
//!   files, so they are not stubbed.
//! - `root/`: where the plan's files land, seeded with files that a plan
//!   may overwrite or remove and files it must leave alone.
//! - `cocoon`: a wrapper that runs `fake-cocoon` (scenario `"run": true`,
//!   so the exec argv is run for real) inside the guest environment, for
//!   the real [`CocoonCli`].
//!
//! Everything runs with a clean environment (`env -i`, `PATH` = `bin/`
//! then `/usr/bin:/bin`), whatever the test process has.
//!
//! # Two kinds of root
//!
//! - [`Guest::direct`]: the plan's paths are absolute host paths inside
//!   `root/` (plans the test builds itself). Nothing is remapped.
//! - [`Guest::sandboxed`]: the plan is a real plugin's, with real guest
//!   paths (`/etc/hostname`, `/etc/systemd/network/...`,
//!   `/proc/sys/vm/drop_caches`). Everything runs under `unshare --mount
//!   --map-root-user` with `root/etc` bind-mounted over `/etc` and
//!   `root/proc/sys/vm/drop_caches` over `/proc/sys/vm/drop_caches`, in a
//!   mount namespace of its own: the real `/etc` is never touched. When
//!   `unshare` cannot do that here, the guest refuses to run anything
//!   (a panic naming the cause), rather than run against the real `/etc`.
//!
//! # The model
//!
//! [`Guest::expected_tree`] applies the plan's steps to the seeded files
//! the way the plan says (write: the content byte for byte and the mode;
//! remove: every file whose name matches, `*` matching any run of
//! characters but not a leading `.`); the tree after a run must equal it.
//! [`expected_calls`] is the plan's run steps' argv, in order.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use fixup_core::plan::{Plan, StepAction};
use fixup_host::cocoon::CocoonCli;
use serde_json::json;
use tempfile::TempDir;

use super::fake::fake_cocoon;

/// Programs stubbed in every guest.
pub const STUBS: &[&str] = &[
    "ip",
    "systemctl",
    "cloud-init",
    "powershell",
    "cmd",
    "rec",
    "networkctl",
];

/// The guest's own files under `root/` before a plan runs (guest paths).
/// Sandboxed guests get all of them; the `/etc/systemd/network` directory
/// must exist for networkd files to be written.
const SANDBOX_SEED: &[(&str, &str)] = &[
    ("/etc/hostname", "source-vm\n"),
    (
        "/etc/systemd/network/10-old.network",
        "[Match]\nMACAddress=52:54:00:00:00:99\n",
    ),
    ("/etc/systemd/network/10-cloud-init-eth0.network", "stale\n"),
    ("/etc/systemd/network/20-keep.network", "keep\n"),
    (
        "/etc/systemd/network/.10-hidden.network",
        "keep: * does not match a leading dot\n",
    ),
    ("/etc/netplan/50-cloud-init.yaml", "stale\n"),
    ("/etc/netplan/01-keep.yaml", "keep\n"),
    ("/etc/NetworkManager/conf.d/99-cloud-init.conf", "stale\n"),
    (
        "/etc/NetworkManager/system-connections/cloud-init-eth0.nmconnection",
        "stale\n",
    ),
    (
        "/etc/NetworkManager/system-connections/keep.nmconnection",
        "keep\n",
    ),
    ("/etc/network/interfaces.d/50-cloud-init.cfg", "stale\n"),
    ("/etc/passwd-is-not-touched", "keep\n"),
    ("/proc/sys/vm/drop_caches", "0\n"),
];

/// One file: content and permission bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileState {
    pub content: Vec<u8>,
    /// `None` in a model: any mode will do (a file the plan created
    /// without naming a mode gets the umask's).
    pub mode: Option<u32>,
}

/// Guest path -> file.
pub type Tree = BTreeMap<String, FileState>;

/// Which shell plays `/bin/sh` in the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shell {
    Dash,
    Bash,
}

impl Shell {
    fn path(self) -> &'static str {
        match self {
            Shell::Dash => "/bin/dash",
            Shell::Bash => "/bin/bash",
        }
    }
}

#[derive(Debug)]
pub struct Guest {
    dir: TempDir,
    pub bin: PathBuf,
    pub root: PathBuf,
    pub log: PathBuf,
    sandboxed: bool,
    seed: Tree,
}

/// `'text'` for sh, for the harness's own scripts (not the code under
/// test's quoting).
pub fn q(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Whether `unshare --mount --map-root-user` can bind-mount here; the
/// reason when it cannot.
fn sandbox_works() -> Result<(), String> {
    static WORKS: OnceLock<Result<(), String>> = OnceLock::new();
    WORKS
        .get_or_init(|| {
            let out = Command::new("unshare")
                .args(["--mount", "--map-root-user", "--", "/bin/sh", "-c"])
                .arg("d=$(mktemp -d) && mount --bind \"$d\" /etc && touch /etc/probe && rm -r \"$d\"")
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("cannot run unshare: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "unshare --mount --map-root-user cannot bind-mount over /etc ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        })
        .clone()
}

impl Guest {
    /// A guest for plans whose paths point into [`Guest::root`] already.
    pub fn direct(shell: Shell) -> Guest {
        Guest::new(shell, false)
    }

    /// A guest for real plugin plans: `/etc` and the page-cache knob are
    /// redirected into `root/` in a mount namespace of their own.
    pub fn sandboxed(shell: Shell) -> Guest {
        if let Err(why) = sandbox_works() {
            panic!(
                "{why}; the corpus runs real plans against a private /etc and refuses to run them any other way (needs user namespaces, or root)"
            );
        }
        let mut guest = Guest::new(shell, true);
        for (path, content) in SANDBOX_SEED {
            guest.seed_file(path, content.as_bytes(), 0o644);
        }
        guest.reseed();
        guest
    }

    fn new(shell: Shell, sandboxed: bool) -> Guest {
        let dir = tempfile::tempdir().expect("temp dir");
        let bin = dir.path().join("bin");
        let root = dir.path().join("root");
        let log = dir.path().join("stub.log");
        fs::create_dir(&bin).unwrap();
        fs::create_dir(&root).unwrap();
        for name in STUBS {
            let script = format!(
                "#!/bin/sh\n{{ printf '%s\\0' \"$#\" \"${{0##*/}}\" \"$@\"; }} >> {}\nexit 0\n",
                q(log.to_str().unwrap())
            );
            let path = bin.join(name);
            fs::write(&path, script).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        }
        symlink(shell.path(), bin.join("sh")).unwrap();
        // The launcher: run "$@" in the guest environment.
        let mounts = if sandboxed {
            format!(
                "mount --bind {etc} /etc && mount --bind {drop} /proc/sys/vm/drop_caches || exit 125; ",
                etc = q(root.join("etc").to_str().unwrap()),
                drop = q(root.join("proc/sys/vm/drop_caches").to_str().unwrap()),
            )
        } else {
            String::new()
        };
        let inner = format!(
            "{mounts}exec env -i PATH={path} LC_ALL=C.UTF-8 \"$@\"",
            path = q(&format!("{}:/usr/bin:/bin", bin.display()))
        );
        let launcher = if sandboxed {
            format!(
                "#!/bin/sh\nexec unshare --mount --map-root-user -- /bin/sh -c {} in-guest \"$@\"\n",
                q(&inner)
            )
        } else {
            format!("#!/bin/sh\n{inner}\n")
        };
        let launcher_path = dir.path().join("in-guest");
        fs::write(&launcher_path, launcher).unwrap();
        fs::set_permissions(&launcher_path, fs::Permissions::from_mode(0o755)).unwrap();
        // The `cocoon` CocoonCli runs: fake-cocoon, in the guest.
        let scenario = dir.path().join("cocoon.json");
        let scenario_json = json!({
            "log": dir.path().join("calls.jsonl"),
            "exec": [{ "run": true }],
            "inspect": { "json": { "id": "vm-1" } },
        });
        fs::write(&scenario, scenario_json.to_string()).unwrap();
        let cocoon = format!(
            "#!/bin/sh\nexec {launcher} env FAKE_COCOON_SCENARIO={scenario} {fake} \"$@\"\n",
            launcher = q(launcher_path.to_str().unwrap()),
            scenario = q(scenario.to_str().unwrap()),
            fake = q(fake_cocoon().to_str().unwrap()),
        );
        let cocoon_path = dir.path().join("cocoon");
        fs::write(&cocoon_path, cocoon).unwrap();
        fs::set_permissions(&cocoon_path, fs::Permissions::from_mode(0o755)).unwrap();
        Guest {
            dir,
            bin,
            root,
            log,
            sandboxed,
            seed: Tree::new(),
        }
    }

    /// The real cocoon runner, pointed at this guest's fake `cocoon`.
    pub fn cocoon(&self) -> CocoonCli {
        CocoonCli::new(self.dir.path().join("cocoon"))
    }

    /// The argv of every call the fake `cocoon` got (after the program).
    pub fn cocoon_calls(&self) -> Vec<Vec<String>> {
        let text = fs::read_to_string(self.dir.path().join("calls.jsonl")).unwrap_or_default();
        text.lines()
            .map(|line| {
                let call: serde_json::Value = serde_json::from_str(line).expect("log line is JSON");
                serde_json::from_value(call["argv"].clone()).expect("argv is strings")
            })
            .collect()
    }

    /// Where a guest path lands on the host.
    pub fn host_path(&self, guest: &str) -> PathBuf {
        if self.sandboxed {
            let rel = guest.strip_prefix('/').expect("guest paths are absolute");
            self.root.join(rel)
        } else {
            PathBuf::from(guest)
        }
    }

    /// The guest path of a host path under `root/`.
    fn guest_path(&self, host: &Path) -> String {
        if self.sandboxed {
            format!("/{}", host.strip_prefix(&self.root).unwrap().display())
        } else {
            host.display().to_string()
        }
    }

    /// A guest path for `name` directly under `root/` (direct guests).
    pub fn path_in_root(&self, name: &str) -> String {
        self.root.join(name).to_str().unwrap().to_owned()
    }

    /// Create a file the plan finds in place (call [`Guest::reseed`] after
    /// the last one).
    pub fn seed_file(&self, guest: &str, content: &[u8], mode: u32) {
        let host = self.host_path(guest);
        fs::create_dir_all(host.parent().unwrap()).unwrap();
        fs::write(&host, content).unwrap();
        fs::set_permissions(&host, fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Remember the current tree as the state before the plan.
    pub fn reseed(&mut self) -> &mut Self {
        self.seed = self.tree();
        self
    }

    /// Every file under `root/`, by guest path.
    pub fn tree(&self) -> Tree {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            for entry in fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, out);
                } else {
                    out.push(path);
                }
            }
        }
        let mut files = Vec::new();
        walk(&self.root, &mut files);
        files
            .into_iter()
            .map(|host| {
                let meta = fs::metadata(&host).unwrap();
                (
                    self.guest_path(&host),
                    FileState {
                        content: fs::read(&host).unwrap(),
                        mode: Some(meta.permissions().mode() & 0o7777),
                    },
                )
            })
            .collect()
    }

    /// The tree the plan must leave, from the seeded one.
    pub fn expected_tree(&self, plan: &Plan) -> Tree {
        let mut tree = self.seed.clone();
        for step in &plan.steps {
            match &step.action {
                StepAction::Run(_) | StepAction::NameLink(_) => {}
                StepAction::WriteFile(w) => {
                    let old_mode = tree.get(&w.path).and_then(|f| f.mode);
                    tree.insert(
                        w.path.clone(),
                        FileState {
                            content: w.content.as_bytes().to_vec(),
                            mode: w.mode.or(old_mode),
                        },
                    );
                }
                StepAction::RemoveFiles(patterns) => {
                    for pattern in patterns {
                        tree.retain(|path, _| !matches_pattern(pattern, path));
                    }
                }
            }
        }
        tree
    }

    /// Run `argv` in the guest environment (sandboxed when the guest is).
    pub fn run(&self, argv: &[&str]) -> Output {
        Command::new(self.dir.path().join("in-guest"))
            .args(argv)
            .stdin(Stdio::null())
            .output()
            .expect("the launcher runs")
    }

    /// Run a hint script with the guest's `sh`, as a file.
    pub fn run_script(&self, script: &str) -> Output {
        let path = self.dir.path().join("hint.sh");
        fs::write(&path, script).unwrap();
        self.run(&["sh", path.to_str().unwrap()])
    }

    /// Every stub call so far: `[program, args...]`.
    pub fn calls(&self) -> Vec<Vec<String>> {
        let bytes = fs::read(&self.log).unwrap_or_default();
        let mut fields = bytes
            .split(|b| *b == 0)
            .map(|f| String::from_utf8(f.to_vec()).expect("stub log is UTF-8"));
        let mut calls = Vec::new();
        while let Some(count) = fields.next() {
            if count.is_empty() {
                break;
            }
            let count: usize = count.parse().expect("argument count");
            let call: Vec<String> = fields.by_ref().take(count + 1).collect();
            assert_eq!(call.len(), count + 1, "truncated stub log");
            calls.push(call);
        }
        calls
    }

    /// Forget the stub calls and the `cocoon` calls so far.
    pub fn clear_calls(&self) {
        let _ = fs::remove_file(&self.log);
        let _ = fs::remove_file(self.dir.path().join("calls.jsonl"));
    }

    /// Put the seeded tree back and forget the calls.
    pub fn restore(&self) {
        let seed = self.seed.clone();
        for path in self.tree().keys() {
            fs::remove_file(self.host_path(path)).unwrap();
        }
        for (path, file) in &seed {
            self.seed_file(path, &file.content, file.mode.unwrap_or(0o644));
        }
        self.clear_calls();
    }
}

/// The run steps' argv, in order: what the stubs must have recorded.
pub fn expected_calls(plan: &Plan) -> Vec<Vec<String>> {
    plan.steps
        .iter()
        .filter_map(|s| match &s.action {
            StepAction::Run(argv) => Some(argv.clone()),
            _ => None,
        })
        .collect()
}

/// Whether `pattern` (`*` only in its last component) matches `path` as
/// sh globbing does: `*` matches any run of characters, but no leading
/// `.` of a file name.
pub fn matches_pattern(pattern: &str, path: &str) -> bool {
    let (Some((pdir, pname)), Some((dir, name))) =
        (pattern.rsplit_once('/'), path.rsplit_once('/'))
    else {
        return false;
    };
    if pdir != dir {
        return false;
    }
    if !pname.contains('*') {
        return pname == name;
    }
    if name.starts_with('.') && !pname.starts_with('.') {
        return false;
    }
    glob(pname.as_bytes(), name.as_bytes())
}

fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|i| glob(rest, &text[i..])),
        Some((c, rest)) => text.first() == Some(c) && glob(rest, &text[1..]),
    }
}

/// Compare a tree with the model, modes only where the model names one.
pub fn assert_tree(found: &Tree, expected: &Tree, context: &str) {
    let found_paths: Vec<&String> = found.keys().collect();
    let expected_paths: Vec<&String> = expected.keys().collect();
    assert_eq!(
        found_paths, expected_paths,
        "{context}: the files in the guest"
    );
    for (path, want) in expected {
        let got = &found[path];
        assert_eq!(
            String::from_utf8_lossy(&got.content),
            String::from_utf8_lossy(&want.content),
            "{context}: content of {path}"
        );
        assert_eq!(got.content, want.content, "{context}: bytes of {path}");
        if let Some(mode) = want.mode {
            assert_eq!(got.mode, Some(mode), "{context}: mode of {path}");
        }
    }
}
