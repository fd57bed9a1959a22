//! The files in `deploy/`, tied to the code and to each other.
//!
//! - `deploy/rbac.yaml`: the real `cocoon-fixup` binary runs `serve` and
//!   `run` through a whole fixup against the fake API server
//!   (`support/fake_api.rs`) and `fake-cocoon`; every request it made is
//!   mapped to (API group, resource, verb) as the API server's authorizer
//!   does, and the set must equal the ClusterRole's rules: no verb missing,
//!   none granted that the code never uses.
//! - README.md links to the files in `deploy/` and keeps no copy of them.

mod support;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use fixup_host::facts::annotations;
use fixup_host::pods::{keys, reasons};
use rustix::process::{Pid, Signal, kill_process};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use support::binary::cocoon_fixup;
use support::fake::fake_cocoon;
use support::fake_api::{FakeApi, Request};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(relative: &str) -> String {
    let path = repo().join(relative);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Every YAML document of a file under the repository root.
fn yaml_documents(relative: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(&read(relative))
        .unwrap_or_else(|e| panic!("{relative} is not valid YAML: {e}"))
}

/// The one document of `kind` in a file.
fn document(relative: &str, kind: &str) -> Value {
    let mut found: Vec<Value> = yaml_documents(relative)
        .into_iter()
        .filter(|d| d["kind"] == kind)
        .collect();
    assert_eq!(found.len(), 1, "{relative}: expected one {kind}");
    found.remove(0)
}

fn str_list(value: &Value, what: &str) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("{what}: expected a list, got {value}"))
        .iter()
        .map(|v| {
            v.as_str()
                .unwrap_or_else(|| panic!("{what}: expected strings, got {v}"))
                .to_owned()
        })
        .collect()
}

// ---------------------------------------------------------------------------
// RBAC: what the real binary asks the API server

/// `(API group, resource, verb)`, as RBAC rules name them.
type Permission = (String, String, String);

/// What the API server's authorizer checks for a request (the request info
/// of k8s.io/apiserver): the group from `/api` or `/apis/<group>`, the
/// resource (with its subresource), and the verb from the method: GET is
/// `watch` with `watch=true`, else `get` of one object and `list` of a
/// collection; POST `create`, PUT `update`, PATCH `patch`, DELETE `delete`
/// or `deletecollection`.
fn permission(r: &Request) -> Permission {
    let parts: Vec<&str> = r.path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => panic!("not a resource request: {r:?}"),
    };
    let rest = match rest {
        ["namespaces", _namespace, rest @ ..] if !rest.is_empty() => rest,
        other => other,
    };
    let (resource, name) = match rest {
        [resource] => (resource.to_string(), None),
        [resource, name] => (resource.to_string(), Some(name)),
        [resource, name, sub] => (format!("{resource}/{sub}"), Some(name)),
        _ => panic!("not a resource request: {r:?}"),
    };
    let watch = r
        .query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    let verb = match (r.method.as_str(), name.is_some()) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => panic!("a method RBAC does not name: {r:?}"),
    };
    (group.to_owned(), resource, verb.to_owned())
}

/// Every (group, resource, verb) the ClusterRole in deploy/rbac.yaml grants.
fn granted() -> BTreeSet<Permission> {
    let role = document("deploy/rbac.yaml", "ClusterRole");
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        assert!(rule.get("resourceNames").is_none(), "{rule}");
        let groups = str_list(&rule["apiGroups"], "apiGroups");
        let resources = str_list(&rule["resources"], "resources");
        let verbs = str_list(&rule["verbs"], "verbs");
        for g in &groups {
            for r in &resources {
                for v in &verbs {
                    assert!(
                        ![g, r, v].iter().any(|x| x.contains('*')),
                        "a wildcard grants what no test sees: {rule}"
                    );
                    out.insert((g.clone(), r.clone(), v.clone()));
                }
            }
        }
    }
    out
}

fn permissions(requests: &[Request]) -> BTreeSet<Permission> {
    requests.iter().map(permission).collect()
}

fn perm(group: &str, resource: &str, verb: &str) -> Permission {
    (group.to_owned(), resource.to_owned(), verb.to_owned())
}

const NAMESPACE: &str = "default";
const POD_NAME: &str = "web-0";

/// The VM's name for the pod, as the stack names it (spec section 2):
/// `vk-<namespace>-<pod>-<first 3 bytes of sha256("<ns>/<pod>") in hex>`.
fn vm_name() -> String {
    let digest = Sha256::digest(format!("{NAMESPACE}/{POD_NAME}"));
    format!("vk-{NAMESPACE}-{POD_NAME}-{}", hex::encode(&digest[..3]))
}

/// A managed Linux clone on Cloud Hypervisor: a fixup is needed.
fn fixup_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": POD_NAME,
            "namespace": NAMESPACE,
            "uid": "3e0c6a57-2f1b-4d8e-9c4a-6b7d8e9f0a1b",
            "annotations": {
                (annotations::VM_NAME): vm_name(),
                (annotations::VM_ID): "vm-deploy",
                (annotations::MANAGED): "true",
                (annotations::OS): "linux",
                (keys::GENERATION): "1",
                (annotations::BACKEND): "cloud-hypervisor",
            },
        },
        "spec": {"nodeName": "n1", "containers": []},
    })
}

/// A node's directory: the fake `cocoon` (a link to fake-cocoon, which
/// plays `cocoon.json` beside it: a static NIC, so the IP is known at once,
/// and exec succeeds), an empty config and plugin directory.
fn node_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::os::unix::fs::symlink(fake_cocoon(), d.join("cocoon")).unwrap();
    let scenario = json!({
        "exec": [{"exit": 0}],
        "inspect": {"json": {
            "id": "vm-deploy",
            "hypervisor": "cloud-hypervisor",
            "config": {"name": vm_name()},
            "network_configs": [
                {"mac": "52:54:00:12:34:56", "tap": "tap0",
                 "network": {"ip": "10.0.0.5", "prefix": 24, "gateway": "10.0.0.1"}}]}},
    });
    fs::write(d.join("cocoon.json"), scenario.to_string()).unwrap();
    fs::create_dir(d.join("plugins")).unwrap();
    fs::write(d.join("config.toml"), "").unwrap();
    dir
}

/// The pod ended ready after a successful fixup, and every request was
/// one the server serves.
fn assert_fixed(api: &FakeApi, log: &str) {
    assert_eq!(
        api.annotation(keys::LIFECYCLE_STATE).as_deref(),
        Some("ready"),
        "log:\n{log}"
    );
    assert_eq!(
        api.annotation(keys::POST_CLONE_STATE).as_deref(),
        Some("done")
    );
    assert_eq!(api.annotation(keys::IP).as_deref(), Some("10.0.0.5"));
    assert!(
        api.events()
            .iter()
            .any(|(reason, _)| reason == reasons::SUCCEEDED),
        "{:#?}",
        api.events()
    );
    api.with(|s| assert!(s.unexpected.is_empty(), "{:?}", s.unexpected));
}

/// The requests of `serve --node n1` through one fixup, until the pod is
/// ready; then SIGTERM.
async fn serve_requests() -> Vec<Request> {
    let dir = node_dir();
    let api = FakeApi::start(fixup_pod(), false).await;
    let log = dir.path().join("serve.log");
    let mut daemon = cocoon_fixup(
        dir.path(),
        &api.kubeconfig(dir.path()),
        &["serve", "--node", "n1"],
    )
    .args(["--metrics-addr", "127.0.0.1:0"])
    .stdout(Stdio::null())
    .stderr(fs::File::create(&log).unwrap())
    .spawn()
    .expect("the daemon starts");
    let start = std::time::Instant::now();
    while api.annotation(keys::LIFECYCLE_STATE).as_deref() != Some("ready") {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "gave up waiting for the fixup; daemon log:\n{}",
            fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = Pid::from_raw(i32::try_from(daemon.id().unwrap()).unwrap()).unwrap();
    kill_process(pid, Signal::TERM).unwrap();
    let status = daemon.wait().await.unwrap();
    let log = fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{status}; log:\n{log}");
    assert_fixed(&api, &log);
    api.with(|s| s.requests.clone())
}

/// The requests of `run --namespace default --pod web-0` through one fixup.
async fn run_requests() -> Vec<Request> {
    let dir = node_dir();
    let api = FakeApi::start(fixup_pod(), false).await;
    let out = cocoon_fixup(
        dir.path(),
        &api.kubeconfig(dir.path()),
        &["run", "--namespace", NAMESPACE, "--pod", POD_NAME],
    )
    .output()
    .await
    .expect("run runs");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{}; stdout:\n{}\nstderr:\n{log}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    assert_fixed(&api, &log);
    api.with(|s| s.requests.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_grants_exactly_what_serve_and_run_use() {
    let serve = permissions(&serve_requests().await);
    let run = permissions(&run_requests().await);

    // `run` handles one pod: read it, patch it, record events.
    let one_pod: BTreeSet<Permission> = [
        perm("", "pods", "get"),
        perm("", "pods", "patch"),
        perm("events.k8s.io", "events", "create"),
    ]
    .into();
    assert_eq!(run, one_pod, "the requests of `run`");
    // `serve` also lists and watches the node's pods.
    let mut node: BTreeSet<Permission> = one_pod;
    node.extend([perm("", "pods", "list"), perm("", "pods", "watch")]);
    assert_eq!(serve, node, "the requests of `serve`");

    let used: BTreeSet<Permission> = serve.union(&run).cloned().collect();
    let granted = granted();
    let missing: Vec<_> = used.difference(&granted).collect();
    let unused: Vec<_> = granted.difference(&used).collect();
    assert!(
        missing.is_empty() && unused.is_empty(),
        "deploy/rbac.yaml and the code disagree: used but not granted {missing:?}; \
         granted but never used {unused:?}"
    );
}

// ---------------------------------------------------------------------------
// README.md and deploy/

/// README.md's "Deployment" section, up to the next heading.
fn readme_deployment() -> String {
    let readme = read("README.md");
    let start = readme
        .find("### Deployment")
        .expect("README.md has a Deployment section");
    readme[start..]
        .lines()
        .enumerate()
        .take_while(|(i, line)| *i == 0 || !line.starts_with('#'))
        .map(|(_, line)| format!("{line}\n"))
        .collect()
}

#[test]
fn readme_links_the_deploy_files_and_keeps_no_copies() {
    let section = readme_deployment();
    for file in [
        "deploy/cocoon-fixup.service",
        "deploy/rbac.yaml",
        "deploy/README.md",
    ] {
        assert!(
            repo().join(file).is_file(),
            "{file} is missing from the repository"
        );
        assert!(
            section.contains(&format!("]({file})")),
            "README.md's Deployment section does not link {file}"
        );
    }
    let readme = read("README.md");
    for copied in ["kind: ClusterRole", "[Service]", "ExecStart="] {
        assert!(
            !readme.contains(copied),
            "README.md inlines `{copied}`: link the file in deploy/ instead, so the two cannot drift"
        );
    }
}

/// deploy/README.md describes every file beside it.
#[test]
fn deploy_readme_names_every_file() {
    let readme = read("deploy/README.md");
    for entry in fs::read_dir(repo().join("deploy")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name != "README.md" {
            assert!(
                readme.contains(&name),
                "deploy/README.md does not mention {name}"
            );
        }
    }
}
