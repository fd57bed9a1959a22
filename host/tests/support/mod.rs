//! Test doubles shared by the host's integration tests.

#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fixup_core::facts::{PodInput, VmId, VmInspect};
use fixup_host::cocoon::{Cocoon, CocoonError, ExecOutput, ExitStatusKind};

pub mod binary;
pub mod cosign;
pub mod fake;
pub mod fake_api;
pub mod go_tool;
pub mod guest;
pub mod mock_api;
pub mod strategies;

/// The arguments of `plan` for the bundled oci-static example: its pod,
/// its VM and the examples' cocoon root.
pub fn example_plan_args() -> Vec<String> {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let path = |name: &str| examples.join(name).display().to_string();
    vec![
        "plan".into(),
        "--pod".into(),
        path("oci-static/pod.json"),
        "--vm".into(),
        path("oci-static/vm.json"),
        "--cocoon-root".into(),
        path("cocoon-root"),
    ]
}

/// What the scripted cocoon does for one `vm exec`.
#[derive(Debug, Clone)]
pub enum Reply {
    /// The guest ran the whole script: exit 0, the done marker with the
    /// nonce of the exec's argv on stderr.
    Done,
    /// Exit with this code and stderr, in which each `{nonce}` becomes the
    /// nonce of the exec's argv, as the script would write its markers (an
    /// exit 0 without the done marker is a script a step ended early). A
    /// marker written with another nonce, or none, is what a guest program
    /// forging markers would print.
    Exit(i32, &'static str),
    /// Killed by a signal.
    Signal(i32),
    /// Never answer: the caller's timeout ends it.
    Hang,
    /// Could not start.
    Spawn,
}

/// One recorded `vm exec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub vm: String,
    pub argv: Vec<String>,
    pub timeout: Duration,
    pub at: tokio::time::Instant,
}

/// An in-process `Cocoon`: replies from a script (the last one repeats),
/// inspect answers from a fixed document, every exec recorded. In-process
/// so the retry loop can run under `tokio::time::pause()`.
#[derive(Debug, Clone)]
pub struct ScriptedCocoon {
    replies: Arc<Mutex<VecDeque<Reply>>>,
    last: Arc<Mutex<Reply>>,
    inspect: Arc<String>,
    pub calls: Arc<Mutex<Vec<Call>>>,
    /// The VM references `inspect` was asked for, in order.
    pub inspects: Arc<Mutex<Vec<String>>>,
    /// This many more inspects time out before one answers.
    pub inspect_failures: Arc<Mutex<usize>>,
}

impl ScriptedCocoon {
    pub fn new(replies: Vec<Reply>, inspect_json: String) -> Self {
        let last = replies.last().cloned().unwrap_or(Reply::Done);
        ScriptedCocoon {
            replies: Arc::new(Mutex::new(replies.into())),
            last: Arc::new(Mutex::new(last)),
            inspect: Arc::new(inspect_json),
            calls: Arc::default(),
            inspects: Arc::default(),
            inspect_failures: Arc::default(),
        }
    }

    /// The VM references asked for so far.
    pub fn inspected(&self) -> Vec<String> {
        self.inspects.lock().unwrap().clone()
    }

    /// The next `n` inspects time out.
    pub fn fail_inspects(&self, n: usize) {
        *self.inspect_failures.lock().unwrap() = n;
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

impl Cocoon for ScriptedCocoon {
    async fn exec(
        &self,
        vm: &VmId,
        argv: &[String],
        timeout: Duration,
    ) -> Result<ExecOutput, CocoonError> {
        self.calls.lock().unwrap().push(Call {
            vm: vm.to_string(),
            argv: argv.to_vec(),
            timeout,
            at: tokio::time::Instant::now(),
        });
        let reply = {
            let mut replies = self.replies.lock().unwrap();
            replies
                .pop_front()
                .unwrap_or_else(|| self.last.lock().unwrap().clone())
        };
        let output = |status, stderr: &str| ExecOutput {
            status,
            stdout: Vec::new(),
            stderr: stderr.as_bytes().to_vec(),
            stderr_cut: false,
        };
        // A plan run directly has no nonce; its markers would not count.
        let nonce = fixup_core::plan::exec_nonce(argv)
            .map_or_else(|| "(no nonce in argv)".to_owned(), |n| n.to_string());
        match reply {
            Reply::Done => Ok(output(
                ExitStatusKind::Code(0),
                &format!("\ncocoon-fixup: {nonce} done\n"),
            )),
            Reply::Exit(code, stderr) => Ok(output(
                ExitStatusKind::Code(code),
                &stderr.replace("{nonce}", &nonce),
            )),
            Reply::Signal(n) => Ok(output(ExitStatusKind::Signal(n), "")),
            Reply::Hang => {
                tokio::time::sleep(timeout).await;
                Err(CocoonError::Timeout {
                    what: format!("cocoon vm exec {vm}"),
                    after: timeout,
                })
            }
            Reply::Spawn => Err(CocoonError::Spawn {
                program: "/usr/local/bin/cocoon".into(),
                source_text: "No such file or directory".into(),
            }),
        }
    }

    async fn inspect(&self, vm: &VmId, timeout: Duration) -> Result<VmInspect, CocoonError> {
        self.inspects.lock().unwrap().push(vm.to_string());
        {
            let mut failures = self.inspect_failures.lock().unwrap();
            if *failures > 0 {
                *failures -= 1;
                return Err(CocoonError::Timeout {
                    what: format!("cocoon vm inspect {vm}"),
                    after: timeout,
                });
            }
        }
        Ok(VmInspect::from_json(&self.inspect, "scripted inspect").expect("test inspect JSON"))
    }
}

pub const UID: &str = "0b7c2f3e-9a51-4c1e-8f1a-2d9e6c1b7a40";

/// The name the stack gives the test pod's VM (`default/web-0`).
/// `dir/cocoon`: a `cocoon` CLI that is `fake-cocoon` playing
/// `dir/scenario.json` (which the test writes, and may rewrite by rename).
pub fn fake_cocoon_in(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let wrapper = dir.join("cocoon");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nFAKE_COCOON_SCENARIO='{}' exec '{}' \"$@\"\n",
            dir.join("scenario.json").display(),
            fake::fake_cocoon().display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
}

pub fn vm_name() -> String {
    fixup_core::binding::vm_name_for_pod("default", "web-0")
}

/// A managed Linux clone pod on Cloud Hypervisor with extra annotations.
pub fn pod(extra: &[(&str, &str)]) -> PodInput {
    let vm_name = vm_name();
    let mut annotations: BTreeMap<String, String> = [
        ("vm.cocoonstack.io/name", vm_name.as_str()),
        ("vm.cocoonstack.io/id", "vm-0123abcd"),
        ("cocoonset.cocoonstack.io/managed", "true"),
        ("cocoonset.cocoonstack.io/os", "linux"),
        ("cocoonset.cocoonstack.io/generation", "3"),
        ("vm.cocoonstack.io/backend", "cloud-hypervisor"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    for (k, v) in extra {
        annotations.insert((*k).to_owned(), (*v).to_owned());
    }
    PodInput {
        name: "web-0".into(),
        namespace: "default".into(),
        uid: Some(UID.into()),
        annotations,
        deleting: false,
        resource_version: None,
    }
}

/// `cocoon vm inspect --json` for the test VM with these NICs:
/// `(mac, Some("ip/prefix"))` static with gateway `.1`, `None` DHCP.
pub fn inspect(nics: &[(&str, Option<&str>)]) -> String {
    let nics: Vec<serde_json::Value> = nics
        .iter()
        .enumerate()
        .map(|(i, (mac, ip))| match ip {
            Some(cidr) => {
                let (ip, prefix) = cidr.split_once('/').unwrap();
                let gw = format!("{}.1", ip.rsplit_once('.').unwrap().0);
                serde_json::json!({"mac": mac, "tap": format!("tap{i}"),
                    "network": {"ip": ip, "prefix": prefix.parse::<u8>().unwrap(), "gateway": gw}})
            }
            None => serde_json::json!({"mac": mac, "tap": format!("tap{i}")}),
        })
        .collect();
    serde_json::json!({"id": "vm-0123abcd", "config": {"name": vm_name()}, "network_configs": nics})
        .to_string()
}
