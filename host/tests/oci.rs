//! Plugins as OCI artifacts: `plugin push` and `plugin pull` against a real
//! registry on loopback (Debian's `docker-registry`, started and stopped by
//! each test; the tests say "skipped" only when it is not installed), the
//! store of pinned plugins and its trust rules, and the faults a registry
//! can answer with (401, 404, 500, content that does not match its digest,
//! an artifact that is not a plugin), the ones the real registry will not
//! produce from a small stand-in server.
//!
//! The plugin pushed is a built-in's component: any component will do for
//! moving bytes; loading a pulled plugin through a planner is in
//! tests/tests/oci.rs, with a vendor plugin.

#[path = "../../tests/src/registry.rs"]
mod registry;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use fixup_core::plugin::builtin::BUILTINS;
use fixup_host::oci::{
    MANIFEST_MEDIA_TYPE, OciError, PinnedPlugins, PluginRef, Registry, RegistryOptions, Tags,
    WASM_CONFIG_MEDIA_TYPE, WASM_LAYER_MEDIA_TYPE,
};
use registry::LocalRegistry;
use sha2::{Digest, Sha256};

/// A uid no file here belongs to.
const OTHER_UID: u32 = 4242;

fn wasm() -> &'static [u8] {
    BUILTINS[0].1
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn cli(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cocoon-fixup"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir)
        .arg("--config")
        .arg(dir.join("config.toml"))
        .args(args)
        .output()
        .expect("run cocoon-fixup")
}

/// `plugin pull REFERENCE --output DIR/OUTPUT EXTRA...`.
fn pull(dir: &Path, reference: &str, output: &str, extra: &[&str]) -> Output {
    let output = dir.join(output);
    let mut args = vec![
        "plugin",
        "pull",
        reference,
        "--output",
        output.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    cli(dir, &args)
}

/// A pull that failed (exit code 1) saying `says`, with nothing at `output`.
fn assert_refused(out: &Output, output: &Path, says: &str) {
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains(says), "{}", text(&out.stderr));
    assert!(!output.exists(), "nothing written");
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The `oci://...@sha256:...` after `pin ` in push's output.
fn pinned_from(stdout: &str) -> String {
    stdout
        .split_whitespace()
        .find(|word| word.starts_with("oci://") && word.contains("@sha256:"))
        .unwrap_or_else(|| panic!("no pinned reference in {stdout:?}"))
        .to_owned()
}

fn plain(host: &str) -> RegistryOptions {
    RegistryOptions {
        plain_http: vec![host.to_owned()],
        credentials: None,
    }
}

#[test]
fn push_then_pull_by_digest_gives_the_same_bytes_and_a_tag_needs_allow_tag() {
    let Some(registry) = LocalRegistry::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), "").unwrap();
    let file = dir.path().join("plugin.wasm");
    std::fs::write(&file, wasm()).unwrap();
    let tagged = format!("oci://{}/plugins/net:v1", registry.host());

    let out = cli(
        dir.path(),
        &[
            "plugin",
            "push",
            file.to_str().unwrap(),
            &tagged,
            "--plain-http",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pinned = pinned_from(&text(&out.stdout));
    assert!(
        pinned.starts_with(&format!("oci://{}/plugins/net@sha256:", registry.host())),
        "{pinned}"
    );

    let out = pull(dir.path(), &pinned, "pulled.wasm", &["--plain-http"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read(dir.path().join("pulled.wasm")).unwrap(),
        wasm(),
        "the same bytes"
    );
    assert!(
        text(&out.stdout).contains(&sha256_hex(wasm())),
        "the plugin's sha256 for allowed_plugins: {}",
        text(&out.stdout)
    );

    // A tag: refused, then resolved to the digest push printed.
    let out = pull(dir.path(), &tagged, "refused.wasm", &["--plain-http"]);
    assert_refused(&out, &dir.path().join("refused.wasm"), "--allow-tag");
    let out = pull(
        dir.path(),
        &tagged,
        "by-tag.wasm",
        &["--plain-http", "--allow-tag"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&format!("is {pinned}: pin this")),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        std::fs::read(dir.path().join("by-tag.wasm")).unwrap(),
        wasm()
    );

    // HTTPS is the default: the same pull without --plain-http fails
    // (the registry speaks plain HTTP), and says what to check.
    let out = pull(dir.path(), &pinned, "https.wasm", &[]);
    assert_refused(
        &out,
        &dir.path().join("https.wasm"),
        "cannot talk to the registry",
    );

    // Without --output: into the store, where a start finds it.
    let store = dir.path().join("store");
    let out = cli(
        dir.path(),
        &[
            "plugin",
            "pull",
            &pinned,
            "--plain-http",
            "--oci-store",
            store.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stored = store.join(format!("sha256-{}.wasm", sha256_hex(wasm())));
    assert!(
        text(&out.stdout).contains(&stored.display().to_string()),
        "{}",
        text(&out.stdout)
    );
    registry.stop();
    let seeded = PinnedPlugins {
        references: vec![pinned.parse().unwrap()],
        store: Some(store),
        registry: RegistryOptions::default(),
    };
    let files = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(seeded.files())
        .expect("seeded: no registry needed");
    assert_eq!(files, [stored]);
}

/// `oci://HOST/plugins/net:v1` on `registry`.
fn tagged(registry: &LocalRegistry) -> PluginRef {
    format!("oci://{}/plugins/net:v1", registry.host())
        .parse()
        .unwrap()
}

/// The built-in's component pushed to `registry` ([`tagged`]), and its
/// pinned reference configured with a store in a fresh folder (which lives
/// as long as the folder returned).
fn pushed(
    runtime: &tokio::runtime::Runtime,
    registry: &LocalRegistry,
) -> (PinnedPlugins, tempfile::TempDir) {
    let pinned = runtime
        .block_on(Registry::new(&plain(registry.host())).push(&tagged(registry), wasm()))
        .unwrap();
    let state = tempfile::tempdir().unwrap();
    let pinned_plugins = PinnedPlugins {
        references: vec![pinned],
        store: Some(state.path().join("oci")),
        registry: plain(registry.host()),
    };
    (pinned_plugins, state)
}

#[test]
fn pull_into_the_store_then_a_restart_with_the_registry_down_still_finds_it() {
    let Some(registry) = LocalRegistry::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (pinned_plugins, state) = pushed(&runtime, &registry);
    let again = runtime
        .block_on(Registry::new(&plain(registry.host())).push(&tagged(&registry), wasm()))
        .unwrap();
    assert_eq!(
        pinned_plugins.references,
        [again],
        "the same file pushed twice: the same digest"
    );

    let files = runtime.block_on(pinned_plugins.files()).unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(std::fs::read(&files[0]).unwrap(), wasm());
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&state.path().join("oci")), 0o700);
    assert_eq!(mode(&files[0]), 0o600);

    registry.stop();
    let again = runtime
        .block_on(pinned_plugins.files())
        .expect("verified files need no registry");
    assert_eq!(again, files);
}

/// `plan` with a configuration that pins the pushed built-in: the
/// reference is pulled and then meets the loader like a plugin file. Off
/// the allow-list it is refused with its digest; on it, it gets as far as
/// registration, where the built-in it copies keeps its claim. Either way
/// `plan` refuses to run while a plugin failed to load. With the registry
/// gone and an empty store, `plan` names the reference and the cause.
#[test]
fn plan_pulls_the_configured_reference_and_applies_the_allow_list() {
    let Some(registry) = LocalRegistry::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (pinned_plugins, state) = pushed(&runtime, &registry);
    let reference = pinned_plugins.references[0].to_string();
    let host = registry.host().to_owned();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let plan = |store: &str, allowed: &str| {
        std::fs::write(
            state.path().join("config.toml"),
            format!(
                "plugins = [\"{reference}\"]\noci_plain_http = [\"{}\"]\noci_store = \"{}\"\nallowed_plugins = [\"{allowed}\"]\nno_cache = true\n",
                host,
                state.path().join(store).display(),
            ),
        )
        .unwrap();
        cli(
            state.path(),
            &[
                "plan",
                "--pod",
                examples.join("oci-static/pod.json").to_str().unwrap(),
                "--vm",
                examples.join("oci-static/vm.json").to_str().unwrap(),
                "--cocoon-root",
                examples.join("cocoon-root").to_str().unwrap(),
            ],
        )
    };
    let sha256 = sha256_hex(wasm());

    let out = plan("oci", &"0".repeat(64));
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("not on the plugin allow-list"), "{stderr}");
    assert!(stderr.contains(&sha256), "{stderr}");
    assert!(
        stderr.contains(&format!("(pinned as {reference} in `plugins`)")),
        "the store's file, named by its reference: {stderr}"
    );
    let refused = stderr
        .lines()
        .find(|l| l.contains("not on the plugin allow-list"))
        .unwrap();
    assert_eq!(
        refused.matches(".wasm").count(),
        1,
        "the path once: {refused}"
    );

    let out = plan("oci", &sha256);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("allow-list"), "{stderr}");
    assert!(
        stderr.contains("both serve"),
        "loaded, then refused: {stderr}"
    );

    registry.stop();
    let out = plan("empty-store", &sha256);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&reference), "{stderr}");
    assert!(stderr.contains("cannot talk to the registry"), "{stderr}");
}

/// A store file that another user owns, or that others may write, is not
/// believed: it is pulled again and replaced (and without a registry, the
/// start fails rather than load it).
#[test]
fn a_store_file_others_could_have_written_is_not_believed() {
    if !is_root() {
        eprintln!("skipped: handing a file to another user needs root");
        return;
    }
    let Some(registry) = LocalRegistry::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (pinned_plugins, _state) = pushed(&runtime, &registry);
    let file = runtime.block_on(pinned_plugins.files()).unwrap().remove(0);

    type Spoil = fn(&Path);
    let spoils: [(&str, Spoil); 2] = [
        ("group-writable", |path| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o664)).unwrap()
        }),
        ("another user's", |path| {
            std::os::unix::fs::chown(path, Some(OTHER_UID), None).unwrap()
        }),
    ];
    for (what, spoil) in spoils {
        spoil(&file);
        let files = runtime.block_on(pinned_plugins.files()).unwrap();
        assert_eq!(files, std::slice::from_ref(&file), "{what}");
        let meta = std::fs::metadata(&file).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{what}: replaced");
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 0, "{what}");
    }

    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
    registry.stop();
    let err = runtime.block_on(pinned_plugins.files()).unwrap_err();
    assert!(matches!(err, OciError::Unreachable { .. }), "{err}");
}

/// One canned answer of the stand-in registry.
#[derive(Clone)]
struct Answer {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Answer {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
}

/// A stand-in registry on loopback: `GET /v2/` is 200, each path in
/// `answers` gets its answer, anything else 404. One request per
/// connection. Runs until the test ends.
fn stand_in(answers: HashMap<String, Answer>) -> String {
    stand_in_with_login(answers, None)
}

/// [`stand_in`]; with `login`, every request without exactly that
/// `Authorization` header gets 401 and a basic-auth challenge.
fn stand_in_with_login(answers: HashMap<String, Answer>, login: Option<String>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&head);
            let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
            let authorization = head.lines().find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("authorization")
                    .then(|| value.trim().to_owned())
            });
            let answer = match answers.get(&path) {
                _ if login.is_some() && authorization != login => {
                    Answer::new(401, "").header("WWW-Authenticate", r#"Basic realm="stand-in""#)
                }
                Some(answer) => answer.clone(),
                None if path == "/v2/" => Answer::new(200, "{}"),
                None => Answer::new(404, ""),
            };
            let mut response = format!(
                "HTTP/1.1 {} X\r\nContent-Length: {}\r\nConnection: close\r\n",
                answer.status,
                answer.body.len()
            );
            for (name, value) in &answer.headers {
                response.push_str(&format!("{name}: {value}\r\n"));
            }
            response.push_str("\r\n");
            let _ = stream.write_all(response.as_bytes());
            let _ = stream.write_all(&answer.body);
        }
    });
    host
}

/// A plugin manifest naming a layer of `layer_digest`, `layer_size` bytes,
/// with `config_type` as the config media type.
fn manifest(config_type: &str, layer_digest: &str, layer_size: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": config_type, "digest": format!("sha256:{}", sha256_hex(b"{}")), "size": 2},
        "layers": [{"mediaType": WASM_LAYER_MEDIA_TYPE, "digest": layer_digest, "size": layer_size}],
    }))
    .unwrap()
}

fn manifest_answer(body: &[u8]) -> Answer {
    Answer::new(200, body).header("Content-Type", MANIFEST_MEDIA_TYPE)
}

/// The error of pulling `reference` (pinned to `hex`) from `host`, into a
/// fresh store; the store must be left without any plugin.
fn pull_error(host: &str, hex: &str) -> OciError {
    let reference: PluginRef = format!("oci://{host}/acme/net@sha256:{hex}")
        .parse()
        .unwrap();
    let state = tempfile::tempdir().unwrap();
    let store = state.path().join("oci");
    let pinned = PinnedPlugins {
        references: vec![reference],
        store: Some(store.clone()),
        registry: plain(host),
    };
    let err = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(pinned.files())
        .expect_err("refused");
    let stored: Vec<_> = std::fs::read_dir(&store)
        .map(|entries| entries.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(stored.is_empty(), "nothing stored: {stored:?}");
    err
}

#[test]
fn faults_are_named_and_nothing_is_stored() {
    let layer = wasm();
    let layer_digest = format!("sha256:{}", sha256_hex(layer));
    let good = manifest(WASM_CONFIG_MEDIA_TYPE, &layer_digest, layer.len());
    let good_hex = sha256_hex(&good);
    let manifest_path = |hex: &str| format!("/v2/acme/net/manifests/sha256:{hex}");
    let blob_path = format!("/v2/acme/net/blobs/{layer_digest}");

    // 401: the registry wants credentials.
    let host = stand_in(HashMap::from([(
        manifest_path(&good_hex),
        Answer::new(
            401,
            r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#,
        )
        .header("Content-Type", "application/json"),
    )]));
    let err = pull_error(&host, &good_hex);
    assert!(matches!(err, OciError::Unauthorized { .. }), "{err}");
    assert!(
        err.to_string().contains("COCOON_FIXUP_OCI_USERNAME"),
        "{err}"
    );

    // 404: no such manifest (the stand-in answers 404 for anything else).
    let host = stand_in(HashMap::new());
    let err = pull_error(&host, &good_hex);
    assert!(matches!(err, OciError::NotFound { .. }), "{err}");

    // 500: the registry failed.
    let host = stand_in(HashMap::from([(
        manifest_path(&good_hex),
        Answer::new(500, "database on fire"),
    )]));
    let err = pull_error(&host, &good_hex);
    assert!(
        matches!(&err, OciError::Registry { status, .. } if status == "HTTP 500"),
        "{err}"
    );
    assert!(err.to_string().contains("database on fire"), "{err}");

    // The manifest served for a digest is other content.
    let pinned_hex = "ab".repeat(32);
    let host = stand_in(HashMap::from([(
        manifest_path(&pinned_hex),
        manifest_answer(&good),
    )]));
    let err = pull_error(&host, &pinned_hex);
    assert!(matches!(err, OciError::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains("nothing was stored"), "{err}");

    // The manifest is right, the layer served is other bytes.
    let mut other = layer.to_vec();
    other[100] ^= 1;
    let host = stand_in(HashMap::from([
        (manifest_path(&good_hex), manifest_answer(&good)),
        (blob_path.clone(), Answer::new(200, other)),
    ]));
    let err = pull_error(&host, &good_hex);
    assert!(
        matches!(
            err,
            OciError::DigestMismatch {
                what: "plugin layer",
                ..
            }
        ),
        "{err}"
    );

    // An artifact that is not a Wasm plugin (an image config).
    let image = manifest(
        "application/vnd.oci.image.config.v1+json",
        &layer_digest,
        layer.len(),
    );
    let image_hex = sha256_hex(&image);
    let host = stand_in(HashMap::from([
        (manifest_path(&image_hex), manifest_answer(&image)),
        (blob_path, Answer::new(200, layer)),
    ]));
    let err = pull_error(&host, &image_hex);
    assert!(matches!(err, OciError::NotAPlugin { .. }), "{err}");
    assert!(err.to_string().contains(WASM_CONFIG_MEDIA_TYPE), "{err}");
}

/// Credentials from the environment reach a registry that wants a login;
/// without them the pull is a 401 that names the variables.
#[test]
fn credentials_come_from_the_environment() {
    use base64::Engine;
    let layer = wasm();
    let layer_digest = format!("sha256:{}", sha256_hex(layer));
    let good = manifest(WASM_CONFIG_MEDIA_TYPE, &layer_digest, layer.len());
    let hex = sha256_hex(&good);
    let login = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("vendor:s3cret")
    );
    let host = stand_in_with_login(
        HashMap::from([
            (
                format!("/v2/acme/net/manifests/sha256:{hex}"),
                manifest_answer(&good),
            ),
            (
                format!("/v2/acme/net/blobs/{layer_digest}"),
                Answer::new(200, layer),
            ),
        ]),
        Some(login),
    );
    let reference = format!("oci://{host}/acme/net@sha256:{hex}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), "").unwrap();

    let out = pull(dir.path(), &reference, "anonymous.wasm", &["--plain-http"]);
    assert_refused(
        &out,
        &dir.path().join("anonymous.wasm"),
        "COCOON_FIXUP_OCI_USERNAME",
    );

    let output = dir.path().join("logged-in.wasm");
    let out = Command::new(env!("CARGO_BIN_EXE_cocoon-fixup"))
        .env_clear()
        .env("HOME", dir.path())
        .env("COCOON_FIXUP_OCI_USERNAME", "vendor")
        .env("COCOON_FIXUP_OCI_PASSWORD", "s3cret")
        .arg("--config")
        .arg(dir.path().join("config.toml"))
        .args(["plugin", "pull", &reference, "--plain-http", "--output"])
        .arg(&output)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(&output).unwrap(), layer);
}

/// The real registry's own 404, for a digest it never had; and a push of
/// a file that is not WebAssembly is refused before anything is sent.
#[test]
fn the_real_registry_answers_404_and_push_refuses_what_is_not_wasm() {
    let Some(registry) = LocalRegistry::start() else {
        return;
    };
    let err = pull_error(registry.host(), &"cd".repeat(32));
    assert!(matches!(err, OciError::NotFound { .. }), "{err}");
    let tagged: PluginRef = format!("oci://{}/acme/net:v1", registry.host())
        .parse()
        .unwrap();
    let err = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(Registry::new(&plain(registry.host())).push(&tagged, b"#!/bin/sh\n"))
        .unwrap_err();
    assert!(matches!(err, OciError::NotAPlugin { .. }), "{err}");
    let err = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(Registry::new(&plain(registry.host())).pull(&tagged, Tags::Refuse))
        .unwrap_err();
    assert!(matches!(err, OciError::TagNotAllowed { .. }), "{err}");
}
