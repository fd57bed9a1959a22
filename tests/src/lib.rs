//! Integration tests for cocoon-fixup live in `tests/`: the real plugin
//! components (built by `build.rs`) run through the real host. This library
//! holds the helpers they share.

use std::path::PathBuf;

pub mod registry;

/// The workspace root.
pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// A fixture path under `tests/fixtures`.
pub fn fixture(rel: &str) -> PathBuf {
    workspace().join("tests").join("fixtures").join(rel)
}

/// True when golden files should be rewritten (`BLESS=1 cargo test`).
pub fn blessing() -> bool {
    std::env::var_os("BLESS").is_some_and(|v| v != "0")
}

/// Compare `actual` with the golden file at `path`; with `BLESS=1` write it
/// instead. On mismatch the panic shows a unified diff.
pub fn assert_golden(path: &std::path::Path, actual: &str) {
    if blessing() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("create golden dir");
        }
        std::fs::write(path, actual).expect("write golden file");
        return;
    }
    let expected = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "golden file {} is missing ({e}): run `BLESS=1 cargo test` to create it",
            path.display()
        )
    });
    if expected != actual {
        let diff = similar::TextDiff::from_lines(expected.as_str(), actual)
            .unified_diff()
            .context_radius(3)
            .header("expected", "actual")
            .to_string();
        panic!(
            "{} differs from the golden file (run `BLESS=1 cargo test` if the change is intended):\n{diff}",
            path.display()
        );
    }
}

use fixup_core::facts::{ImageKind, Observation, Overrides, PodInput, VmFacts, VmInspect};

/// A pod JSON document with the given annotations.
pub fn pod_json(annotations: &[(&str, &str)]) -> String {
    let annotations: serde_json::Map<String, serde_json::Value> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
        .collect();
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "default",
            "uid": "0b7c2f3e-9a51-4c1e-8f1a-2d9e6c1b7a40",
            "annotations": annotations,
        }
    })
    .to_string()
}

/// A `cocoon vm inspect --json` document. Each NIC is `(mac, static ip)`,
/// the static ones as `ip/prefix` with gateway `.1` of the same /24.
pub fn vm_json(id: &str, nics: &[(&str, Option<&str>)]) -> String {
    let nics: Vec<serde_json::Value> = nics
        .iter()
        .enumerate()
        .map(|(i, (mac, ip))| match ip {
            Some(cidr) => {
                let (ip, prefix) = cidr.split_once('/').expect("ip/prefix");
                let gw = format!("{}.1", ip.rsplit_once('.').expect("dotted").0);
                serde_json::json!({"mac": mac, "tap": format!("tap{i}"),
                    "network": {"ip": ip, "prefix": prefix.parse::<u8>().expect("prefix"), "gateway": gw}})
            }
            None => serde_json::json!({"mac": mac, "tap": format!("tap{i}")}),
        })
        .collect();
    serde_json::json!({"id": id, "name": "web-0", "network_configs": nics}).to_string()
}

/// Observation for a managed Linux clone on Cloud Hypervisor.
pub fn observation(
    vm_name: &str,
    flavor: Option<&str>,
    nics: &[(&str, Option<&str>)],
) -> Observation {
    let mut annotations = vec![
        ("vm.cocoonstack.io/name", vm_name),
        ("cocoonset.cocoonstack.io/managed", "true"),
        ("cocoonset.cocoonstack.io/os", "linux"),
        ("vm.cocoonstack.io/backend", "cloud-hypervisor"),
    ];
    if let Some(f) = flavor {
        annotations.push(("vm.cocoonstack.io/guest-flavor", f));
    }
    let pod = PodInput::from_json(&pod_json(&annotations), "pod.json").expect("test pod parses");
    let vm =
        VmInspect::from_json(&vm_json("vm-0123abcd", nics), "vm.json").expect("test vm parses");
    Observation::new(&pod, &vm, &Overrides::default())
}

/// A managed Linux clone in `default` named `name` that asks for the
/// hostile test plugin (flavour `hostile`), pointing at its VM by name only
/// (the name the stack gives the pod's VM).
pub fn hostile_clone(name: &str) -> PodInput {
    hostile_clone_in("default", name)
}

/// [`hostile_clone`] in `namespace`.
pub fn hostile_clone_in(namespace: &str, name: &str) -> PodInput {
    let vm_name = fixup_core::binding::vm_name_for_pod(namespace, name);
    let annotations = [
        ("vm.cocoonstack.io/name", vm_name.as_str()),
        ("cocoonset.cocoonstack.io/managed", "true"),
        ("cocoonset.cocoonstack.io/os", "linux"),
        ("vm.cocoonstack.io/backend", "cloud-hypervisor"),
        ("vm.cocoonstack.io/guest-flavor", "hostile"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    PodInput {
        name: name.into(),
        namespace: namespace.into(),
        uid: Some(format!("uid-{namespace}-{name}")),
        annotations,
        deleting: false,
        resource_version: None,
    }
}

/// The inspect record of VM `name` with id `id` (which selects the hostile
/// plugin's behaviour, `hostile-<behaviour>`): one static NIC.
pub fn hostile_vm_record(name: &str, id: &str) -> VmInspect {
    let record = serde_json::json!({
        "id": id,
        "config": {"name": name},
        "network_configs": [{"mac": "52:54:00:aa:bb:01", "tap": "tap0",
            "network": {"ip": "10.0.0.5", "prefix": 24, "gateway": "10.0.0.1"}}],
    });
    VmInspect::from_json(&record.to_string(), "test inspect").expect("inspect JSON")
}

/// Validated facts for a Linux OCI clone.
pub fn facts(vm_name: &str, flavor: Option<&str>, nics: &[(&str, Option<&str>)]) -> VmFacts {
    VmFacts::validate(&observation(vm_name, flavor, nics), ImageKind::Oci)
        .expect("test facts validate")
}

/// Test plugins the build script built, by path: for harnesses outside this
/// crate (the Go package's tests, run by `fixup-capi`'s `tests/go.rs`).
pub mod plugin_files {
    /// `tests/plugins/hostile`: misbehaves on request.
    pub const HOSTILE: &str = env!("PLUGIN_HOSTILE");
}

/// A `cocoon` stand-in for the hostile plugin's clones: every VM is
/// `hostile_vm_record(name, id)`, and every exec is recorded and succeeds
/// (the guest ran the whole plan) unless [`Guest::fail_execs`] is set,
/// when it exits 1.
#[derive(Clone)]
pub struct Guest {
    id: std::sync::Arc<std::sync::Mutex<String>>,
    fail: std::sync::Arc<std::sync::atomic::AtomicBool>,
    execs: std::sync::Arc<std::sync::Mutex<Vec<Vec<String>>>>,
    /// Run at the next exec, before it answers.
    at_exec: std::sync::Arc<std::sync::Mutex<Option<ExecHook>>>,
}

/// Run by [`Guest`] at an exec.
type ExecHook = Box<dyn FnOnce() + Send>;

impl std::fmt::Debug for Guest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guest")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Guest {
    /// Every VM's id is `id` (`hostile-<behaviour>` picks the behaviour).
    pub fn new(id: &str) -> Self {
        Guest {
            id: std::sync::Arc::new(std::sync::Mutex::new(id.to_owned())),
            fail: Default::default(),
            execs: Default::default(),
            at_exec: Default::default(),
        }
    }

    /// Every VM's id from now on.
    pub fn set_id(&self, id: &str) {
        *self.id.lock().unwrap() = id.to_owned();
    }

    /// Run `hook` at the next exec, before it answers.
    pub fn at_next_exec(&self, hook: impl FnOnce() + Send + 'static) {
        *self.at_exec.lock().unwrap() = Some(Box::new(hook));
    }

    pub fn fail_execs(&self, fail: bool) {
        self.fail.store(fail, std::sync::atomic::Ordering::SeqCst);
    }

    /// The argv of every exec so far.
    pub fn execs(&self) -> Vec<Vec<String>> {
        self.execs.lock().unwrap().clone()
    }
}

impl fixup_host::cocoon::Cocoon for Guest {
    async fn exec(
        &self,
        _vm: &fixup_core::facts::VmId,
        argv: &[String],
        _timeout: std::time::Duration,
    ) -> Result<fixup_host::cocoon::ExecOutput, fixup_host::cocoon::CocoonError> {
        use fixup_host::cocoon::{ExecOutput, ExitStatusKind};
        self.execs.lock().unwrap().push(argv.to_vec());
        let hook = self.at_exec.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(ExecOutput {
                status: ExitStatusKind::Code(1),
                stdout: Vec::new(),
                stderr: b"the guest refused".to_vec(),
                stderr_cut: false,
            });
        }
        let done = match fixup_core::plan::exec_nonce(argv) {
            Some(nonce) => format!("\n{}\n", fixup_core::plan::done_marker(&nonce)),
            None => String::new(),
        };
        Ok(ExecOutput {
            status: ExitStatusKind::Code(0),
            stdout: Vec::new(),
            stderr: done.into_bytes(),
            stderr_cut: false,
        })
    }

    async fn inspect(
        &self,
        vm: &fixup_core::facts::VmId,
        _timeout: std::time::Duration,
    ) -> Result<VmInspect, fixup_host::cocoon::CocoonError> {
        let id = self.id.lock().unwrap().clone();
        Ok(hostile_vm_record(vm.as_str(), &id))
    }
}
