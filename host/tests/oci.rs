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
pub(crate) mod registry;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

pub(crate) fn cli(dir: &Path, args: &[&str]) -> Output {
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
pub(crate) fn pull(dir: &Path, reference: &str, output: &str, extra: &[&str]) -> Output {
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

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The `oci://...@sha256:...` after `pin ` in push's output.
pub(crate) fn pinned_from(stdout: &str) -> String {
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
        ..PinnedPlugins::default()
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
        .block_on(
            Registry::new(&plain(registry.host()))
                .unwrap()
                .push(&tagged(registry), wasm()),
        )
        .unwrap();
    let state = tempfile::tempdir().unwrap();
    let pinned_plugins = PinnedPlugins {
        references: vec![pinned],
        store: Some(state.path().join("oci")),
        registry: plain(registry.host()),
        ..PinnedPlugins::default()
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
        .block_on(
            Registry::new(&plain(registry.host()))
                .unwrap()
                .push(&tagged(&registry), wasm()),
        )
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

/// A plugin stored while no trust rule covered it has no signatures kept
/// beside it. Once a rule requires them and the registry is down, loading
/// it is refused with a message naming the reference, the rule, and
/// `plugin pull` as the way out; nothing is returned.
#[test]
fn a_plugin_stored_before_its_rule_required_signatures_is_refused_with_the_registry_down() {
    use fixup_host::oci::signature::PublicKey;
    use fixup_host::oci::trust::{Require, TrustPolicy, TrustRule};
    use p256::pkcs8::EncodePublicKey as _;

    let Some(registry) = LocalRegistry::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (mut pinned_plugins, _state) = pushed(&runtime, &registry);
    runtime
        .block_on(pinned_plugins.files())
        .expect("stored with no trust rule");
    let host = registry.host().to_owned();
    registry.stop();

    let pem = p256::ecdsa::SigningKey::from_slice(&[7; 32])
        .unwrap()
        .verifying_key()
        .to_public_key_pem(p256::pkcs8::LineEnding::LF)
        .unwrap();
    let scope = format!("{host}/plugins");
    pinned_plugins.trust = TrustPolicy {
        rules: vec![TrustRule {
            scope: scope.clone(),
            require: Require::AnyOf,
            keys: vec![PublicKey::from_pem(Path::new("/keys/vendor.pub"), &pem).unwrap()],
        }],
    };
    let reference = pinned_plugins.references[0].to_string();
    let refused = runtime
        .block_on(pinned_plugins.verified_files())
        .expect_err("no kept signatures, no registry: nothing loads");
    assert!(
        matches!(refused, OciError::NoKeptSignatures { .. }),
        "{refused:?}"
    );
    let refused = refused.to_string();
    for says in [
        format!("{reference}: the plugin is held in the store, but no signatures were kept for it"),
        format!("`[plugin_trust.\"{scope}\"]` required them"),
        "cannot talk to the registry".to_owned(),
        format!("run `cocoon-fixup plugin pull {reference}` with the registry reachable"),
    ] {
        assert!(refused.contains(&says), "{says:?} in {refused}");
    }
    assert!(
        pinned_plugins.stored_files().files.is_empty(),
        "the store alone does not let it load either"
    );
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
    /// After `body`, this many filler bytes, written while the client
    /// reads them; `Content-Length` counts them when `declared`.
    flood: Option<(u64, bool)>,
}

impl Answer {
    fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Answer {
            status,
            headers: Vec::new(),
            body: body.into(),
            flood: None,
        }
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// `status` with a body of `len` filler bytes, its length declared or
    /// not (then the body ends when the connection does).
    fn flood(status: u16, len: u64, declared: bool) -> Self {
        Answer {
            flood: Some((len, declared)),
            ..Answer::new(status, "")
        }
    }
}

/// A stand-in registry on loopback: `GET /v2/` is 200, each path in its
/// answers gets its answer, anything else 404. One request per
/// connection, each connection on its own thread. Runs until the test
/// ends. It counts the body bytes it got written and the paths asked.
struct StandIn {
    listener: TcpListener,
    host: String,
    written: Arc<AtomicU64>,
    asked: Arc<Mutex<Vec<String>>>,
}

impl StandIn {
    fn bind() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        StandIn {
            host: listener.local_addr().unwrap().to_string(),
            listener,
            written: Arc::default(),
            asked: Arc::default(),
        }
    }

    /// Serve `answers`; with `login` (an `Authorization` value and a
    /// challenge), every request but one for `/token` without exactly that
    /// header gets 401 and the challenge.
    fn serve(self, answers: HashMap<String, Answer>, login: Option<(String, String)>) -> Served {
        let served = Served {
            host: self.host,
            written: self.written.clone(),
            asked: self.asked.clone(),
        };
        let answers = Arc::new(answers);
        let (written, asked) = (self.written, self.asked);
        let listener = self.listener;
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (answers, login) = (answers.clone(), login.clone());
                let (written, asked) = (written.clone(), asked.clone());
                std::thread::spawn(move || answer(stream, &answers, login, &written, &asked));
            }
        });
        served
    }

    /// [`serve`](Self::serve) wanting the bearer `token`, with a challenge
    /// naming the stand-in's own `/token` as realm (service `stand-in`,
    /// scope `repository:acme/net:pull`).
    fn serve_with_bearer(self, answers: HashMap<String, Answer>, token: &str) -> Served {
        let challenge = format!(
            r#"Bearer realm="http://{}/token",service="stand-in",scope="repository:acme/net:pull""#,
            self.host
        );
        self.serve(answers, Some((format!("Bearer {token}"), challenge)))
    }
}

/// A stand-in serving, and what it saw.
struct Served {
    host: String,
    written: Arc<AtomicU64>,
    asked: Arc<Mutex<Vec<String>>>,
}

impl Served {
    fn written(&self) -> u64 {
        self.written.load(Ordering::SeqCst)
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

fn answer(
    mut stream: std::net::TcpStream,
    answers: &HashMap<String, Answer>,
    login: Option<(String, String)>,
    written: &AtomicU64,
    asked: &Mutex<Vec<String>>,
) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    let target = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
    asked.lock().unwrap().push(target.clone());
    let path = target.split('?').next().unwrap_or_default();
    let authorization = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("authorization")
            .then(|| value.trim().to_owned())
    });
    let answer = match (answers.get(path), login) {
        (_, Some((wanted, challenge)))
            if path != "/token" && authorization.as_ref() != Some(&wanted) =>
        {
            Answer::new(401, "").header("WWW-Authenticate", challenge)
        }
        (answer, _) => match answer {
            Some(answer) => answer.clone(),
            None if path == "/v2/" => Answer::new(200, "{}"),
            None => Answer::new(404, ""),
        },
    };
    let mut response = format!("HTTP/1.1 {} X\r\nConnection: close\r\n", answer.status);
    match answer.flood {
        Some((len, true)) => response.push_str(&format!(
            "Content-Length: {}\r\n",
            answer.body.len() as u64 + len
        )),
        Some((_, false)) => {}
        None => response.push_str(&format!("Content-Length: {}\r\n", answer.body.len())),
    }
    for (name, value) in &answer.headers {
        response.push_str(&format!("{name}: {value}\r\n"));
    }
    response.push_str("\r\n");
    let _ = stream.write_all(response.as_bytes());
    let _ = stream.write_all(&answer.body);
    if let Some((len, _)) = answer.flood {
        let chunk = vec![b'x'; 64 << 10];
        let mut left = len;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            if stream.write_all(&chunk[..n]).is_err() {
                break;
            }
            written.fetch_add(n as u64, Ordering::SeqCst);
            left -= n as u64;
        }
    }
}

fn stand_in(answers: HashMap<String, Answer>) -> String {
    StandIn::bind().serve(answers, None).host
}

/// [`stand_in`] that wants `login` as a basic-auth `Authorization`.
fn stand_in_with_login(answers: HashMap<String, Answer>, login: String) -> String {
    let challenge = r#"Basic realm="stand-in""#.to_owned();
    StandIn::bind()
        .serve(answers, Some((login, challenge)))
        .host
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
        ..PinnedPlugins::default()
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
        login,
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
        .block_on(
            Registry::new(&plain(registry.host()))
                .unwrap()
                .push(&tagged, b"#!/bin/sh\n"),
        )
        .unwrap_err();
    assert!(matches!(err, OciError::NotAPlugin { .. }), "{err}");
    let err = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(
            Registry::new(&plain(registry.host()))
                .unwrap()
                .pull(&tagged, Tags::Refuse),
        )
        .unwrap_err();
    assert!(matches!(err, OciError::TagNotAllowed { .. }), "{err}");
}

/// What a hostile registry answered with in review: 256 MiB.
const FLOOD: u64 = 256 << 20;
/// Far more than any bound plus what loopback's socket buffers hold, far
/// less than [`FLOOD`]: a client that read its answers whole passes it.
const READ_AT_MOST: u64 = 32 << 20;

/// A good plugin manifest, its digest, and the paths of it and its layer.
fn good_artifact() -> (Vec<u8>, String, String, String) {
    let layer = wasm();
    let layer_digest = format!("sha256:{}", sha256_hex(layer));
    let good = manifest(WASM_CONFIG_MEDIA_TYPE, &layer_digest, layer.len());
    let hex = sha256_hex(&good);
    let manifest_path = format!("/v2/acme/net/manifests/sha256:{hex}");
    (
        good,
        hex,
        manifest_path,
        format!("/v2/acme/net/blobs/{layer_digest}"),
    )
}

/// Every answer a registry gives is read under a bound chosen before the
/// read: a manifest, an error body, a token answer and a layer of 256 MiB,
/// declared in `Content-Length` or not, are refused after at most what
/// the socket buffers hold, by the daemon's pull.
#[test]
fn a_registry_cannot_make_the_host_read_past_a_bound() {
    let (good, hex, manifest_path, blob_path) = good_artifact();
    let check = |served: &Served, err: &OciError, what: &str| {
        assert!(
            served.written() < READ_AT_MOST,
            "{what}: {} bytes of the answer were read",
            served.written()
        );
        assert!(err.to_string().len() < 4096, "{what}: {err}");
    };

    for declared in [true, false] {
        let served = StandIn::bind().serve(
            HashMap::from([(manifest_path.clone(), Answer::flood(200, FLOOD, declared))]),
            None,
        );
        let err = pull_error(&served.host, &hex);
        assert!(matches!(err, OciError::NotAPlugin { .. }), "{err}");
        assert!(err.to_string().contains("more than 65536 bytes"), "{err}");
        check(&served, &err, "manifest");

        let served = StandIn::bind().serve(
            HashMap::from([(manifest_path.clone(), Answer::flood(500, FLOOD, declared))]),
            None,
        );
        let err = pull_error(&served.host, &hex);
        assert!(
            matches!(&err, OciError::Registry { status, .. } if status == "HTTP 500"),
            "{err}"
        );
        check(&served, &err, "error body");

        let served = StandIn::bind().serve_with_bearer(
            HashMap::from([
                (manifest_path.clone(), manifest_answer(&good)),
                ("/token".to_owned(), Answer::flood(200, FLOOD, declared)),
            ]),
            "never",
        );
        let err = pull_error(&served.host, &hex);
        assert!(
            err.to_string()
                .contains("token answer is more than 65536 bytes"),
            "{err}"
        );
        check(&served, &err, "token answer");

        let mut layer = Answer::flood(200, FLOOD, declared);
        layer.body = wasm().to_vec();
        let served = StandIn::bind().serve(
            HashMap::from([
                (manifest_path.clone(), manifest_answer(&good)),
                (blob_path.clone(), layer),
            ]),
            None,
        );
        let err = pull_error(&served.host, &hex);
        let layer_refused =
            matches!(&err, OciError::DigestMismatch { what, .. } if *what == "plugin layer");
        assert!(layer_refused, "{err}");
        assert!(
            err.to_string().contains("bytes the manifest declares"),
            "{err}"
        );
        check(&served, &err, "layer");
    }
}

/// A registry that wants a bearer token gets one from its own realm, asked
/// with the challenge's service and scope, and it is used for the manifest
/// and the layer.
#[test]
fn a_bearer_realm_on_the_registry_gives_the_token_used() {
    let (good, hex, manifest_path, blob_path) = good_artifact();
    let served = StandIn::bind().serve_with_bearer(
        HashMap::from([
            (manifest_path.clone(), manifest_answer(&good)),
            (blob_path.clone(), Answer::new(200, wasm())),
            (
                "/token".to_owned(),
                Answer::new(200, r#"{"token":"t0ken","expires_in":300}"#),
            ),
        ]),
        "t0ken",
    );
    let reference: PluginRef = format!("oci://{}/acme/net@sha256:{hex}", served.host)
        .parse()
        .unwrap();
    let artifact = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(
            Registry::new(&plain(&served.host))
                .unwrap()
                .pull(&reference, Tags::Refuse),
        )
        .unwrap();
    assert_eq!(artifact.wasm, wasm());
    let asked = served.asked();
    assert!(
        asked.contains(&"/token?service=stand-in&scope=repository%3Aacme%2Fnet%3Apull".to_owned()),
        "{asked:?}"
    );
    assert_eq!(
        asked
            .iter()
            .filter(|path| path.starts_with("/token"))
            .count(),
        1,
        "one token for the pull: {asked:?}"
    );
}

/// A plain-HTTP registry's redirect, token realm or upload location is
/// followed only on the registry itself or to HTTPS: another host over
/// plain HTTP is never asked, and the refusal says where it would have
/// gone. A redirect on the registry is followed and logged.
#[test]
fn redirects_stay_on_the_registry_or_go_to_https_and_are_logged() {
    let (good, hex, manifest_path, blob_path) = good_artifact();
    let elsewhere = StandIn::bind().serve(
        HashMap::from([
            (blob_path.clone(), Answer::new(200, wasm())),
            ("/token".to_owned(), Answer::new(200, r#"{"token":"t"}"#)),
            ("/upload".to_owned(), Answer::new(201, "")),
        ]),
        None,
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), "").unwrap();

    // The layer redirected to a host nobody listed, over plain HTTP.
    let registry = stand_in(HashMap::from([
        (manifest_path.clone(), manifest_answer(&good)),
        (
            blob_path.clone(),
            Answer::new(307, "")
                .header("Location", format!("http://{}{blob_path}", elsewhere.host)),
        ),
    ]));
    let reference = format!("oci://{registry}/acme/net@sha256:{hex}");
    let out = pull(dir.path(), &reference, "away.wasm", &["--plain-http"]);
    assert_refused(&out, &dir.path().join("away.wasm"), "refused");
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&elsewhere.host), "{stderr}");
    assert!(stderr.contains("over plain HTTP"), "{stderr}");

    // On the registry itself: followed, and logged.
    let registry = stand_in(HashMap::from([
        (manifest_path.clone(), manifest_answer(&good)),
        (
            blob_path.clone(),
            Answer::new(307, "").header("Location", "/moved/layer?X-Amz-Signature=s3cr3t"),
        ),
        ("/moved/layer".to_owned(), Answer::new(200, wasm())),
    ]));
    let reference = format!("oci://{registry}/acme/net@sha256:{hex}");
    let out = Command::new(env!("CARGO_BIN_EXE_cocoon-fixup"))
        .env_clear()
        .env("HOME", dir.path())
        .env(fixup_host::logging::LOG_VAR, "info")
        .arg("--config")
        .arg(dir.path().join("config.toml"))
        .args(["plugin", "pull", &reference, "--plain-http", "--output"])
        .arg(dir.path().join("moved.wasm"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read(dir.path().join("moved.wasm")).unwrap(),
        wasm()
    );
    let stderr = text(&out.stderr);
    assert!(stderr.contains("registry redirect followed"), "{stderr}");
    assert!(stderr.contains("/moved/layer"), "{stderr}");
    assert!(
        !stderr.contains("s3cr3t"),
        "a signed URL's query is not logged: {stderr}"
    );

    // A token realm on another plain-HTTP host.
    let challenge = format!(
        r#"Bearer realm="http://{}/token",service="s""#,
        elsewhere.host
    );
    let registry = StandIn::bind().serve(
        HashMap::from([(manifest_path.clone(), manifest_answer(&good))]),
        Some(("Bearer t".to_owned(), challenge)),
    );
    let err = pull_error(&registry.host, &hex);
    assert!(matches!(err, OciError::Redirect { .. }), "{err}");
    assert!(err.to_string().contains("token realm"), "{err}");

    // An upload location on another plain-HTTP host.
    let registry = stand_in(HashMap::from([(
        "/v2/acme/net/blobs/uploads/".to_owned(),
        Answer::new(202, "").header("Location", format!("http://{}/upload", elsewhere.host)),
    )]));
    let tagged: PluginRef = format!("oci://{registry}/acme/net:v1").parse().unwrap();
    let err = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(
            Registry::new(&plain(&registry))
                .unwrap()
                .push(&tagged, wasm()),
        )
        .unwrap_err();
    assert!(matches!(err, OciError::Redirect { .. }), "{err}");
    assert!(err.to_string().contains("upload location"), "{err}");

    assert_eq!(elsewhere.asked(), Vec::<String>::new(), "never asked");
}

/// A rule for `scope` requiring a signature by `key`'s public half, read
/// as if from `path`.
fn any_of(
    scope: String,
    key: &p256::ecdsa::SigningKey,
    path: &str,
) -> fixup_host::oci::trust::TrustRule {
    use p256::pkcs8::EncodePublicKey as _;
    let pem = key
        .verifying_key()
        .to_public_key_pem(p256::pkcs8::LineEnding::LF)
        .unwrap();
    fixup_host::oci::trust::TrustRule {
        scope,
        require: fixup_host::oci::trust::Require::AnyOf,
        keys: vec![fixup_host::oci::signature::PublicKey::from_pem(Path::new(path), &pem).unwrap()],
    }
}

/// Cosign's simple-signing payload for the manifest `hex`, with `optional`.
fn simple_signing_payload(hex: &str, optional: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "critical": {
            "identity": {"docker-reference": "registry.example/acme/net"},
            "image": {"docker-manifest-digest": format!("sha256:{hex}")},
            "type": fixup_host::oci::signature::PAYLOAD_TYPE,
        },
        "optional": optional,
    }))
    .unwrap()
}

/// A registry with the referrers API: its index lists cosign's signature
/// manifest, which is fetched by digest and verifies. A referrer whose
/// bytes do not match its digest, and a referrer of another artifact type,
/// are not used; nor is a payload other than its digest says.
#[test]
fn signatures_are_found_through_the_referrers_api_and_checked_against_their_digests() {
    use base64::Engine as _;
    use fixup_host::oci::signature::{
        self, SIGNATURE_ANNOTATION, SIGNATURE_ARTIFACT_TYPE, SIMPLE_SIGNING_MEDIA_TYPE,
    };
    use p256::ecdsa::signature::Signer as _;

    let hex = sha256_hex(b"the plugin's manifest");
    let key = p256::ecdsa::SigningKey::from_slice(&[9; 32]).unwrap();
    let payload = simple_signing_payload(&hex, serde_json::Value::Null);
    let signed: p256::ecdsa::Signature = key.sign(&payload);
    let b64 = base64::engine::general_purpose::STANDARD;
    let payload_digest = format!("sha256:{}", sha256_hex(&payload));
    let signature_manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": SIGNATURE_ARTIFACT_TYPE,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": format!("sha256:{}", sha256_hex(b"{}")), "size": 2},
        "layers": [{
            "mediaType": SIMPLE_SIGNING_MEDIA_TYPE,
            "digest": payload_digest,
            "size": payload.len(),
            "annotations": {SIGNATURE_ANNOTATION: b64.encode(signed.to_der().as_bytes())},
        }],
    }))
    .unwrap();
    let signature_digest = format!("sha256:{}", sha256_hex(&signature_manifest));
    // A second signature, valid too, served under a digest that is not
    // its manifest's: it must not count.
    let mut noted: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    noted["optional"] = serde_json::json!({"note": "served under another digest"});
    let noted = serde_json::to_vec(&noted).unwrap();
    let noted_signature: p256::ecdsa::Signature = key.sign(&noted);
    let noted_digest = format!("sha256:{}", sha256_hex(&noted));
    let mismatched = serde_json::to_vec_pretty(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": format!("sha256:{}", sha256_hex(b"{}")), "size": 2},
        "layers": [{
            "mediaType": SIMPLE_SIGNING_MEDIA_TYPE,
            "digest": noted_digest,
            "size": noted.len(),
            "annotations": {SIGNATURE_ANNOTATION: b64.encode(noted_signature.to_der().as_bytes())},
        }],
    }))
    .unwrap();
    let claimed = format!("sha256:{}", sha256_hex(b"what the index claims"));
    let other_type = format!("sha256:{}", sha256_hex(b"an SBOM"));
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": MANIFEST_MEDIA_TYPE, "digest": claimed, "size": 10, "artifactType": SIGNATURE_ARTIFACT_TYPE},
            {"mediaType": MANIFEST_MEDIA_TYPE, "digest": other_type, "size": 10, "artifactType": "application/spdx+json"},
            {"mediaType": MANIFEST_MEDIA_TYPE, "digest": signature_digest, "size": signature_manifest.len(), "artifactType": SIGNATURE_ARTIFACT_TYPE},
        ],
    }))
    .unwrap();
    let answers = |blob: Vec<u8>| {
        HashMap::from([
            (
                format!("/v2/acme/net/referrers/sha256:{hex}"),
                Answer::new(200, &index[..])
                    .header("Content-Type", "application/vnd.oci.image.index.v1+json"),
            ),
            (
                format!("/v2/acme/net/manifests/{signature_digest}"),
                manifest_answer(&signature_manifest),
            ),
            (
                format!("/v2/acme/net/manifests/{claimed}"),
                manifest_answer(&mismatched),
            ),
            (
                format!("/v2/acme/net/blobs/{noted_digest}"),
                Answer::new(200, &noted[..]),
            ),
            (
                format!("/v2/acme/net/manifests/{other_type}"),
                manifest_answer(&signature_manifest),
            ),
            (
                format!("/v2/acme/net/blobs/{payload_digest}"),
                Answer::new(200, &blob[..]),
            ),
        ])
    };
    let signatures_from = |host: &str| {
        let pinned: PluginRef = format!("oci://{host}/acme/net@sha256:{hex}")
            .parse()
            .unwrap();
        let found = tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(Registry::new(&plain(host)).unwrap().signatures(&pinned))
            .unwrap();
        (pinned, found)
    };

    let served = StandIn::bind().serve(answers(payload.clone()), None);
    let (pinned, found) = signatures_from(&served.host);
    assert!(!found.bundle);
    let found = found.signatures;
    assert_eq!(found.len(), 1, "{found:?}");
    let asked = served.asked();
    assert!(
        !asked.iter().any(|path| path.ends_with(&other_type)),
        "another artifact type is not fetched: {asked:?}"
    );
    let rule = any_of(format!("{}/acme", served.host), &key, "/keys/acme.pub");
    let signers = signature::verify(&rule, &pinned, &found).unwrap();
    assert_eq!(signers[0].key, "/keys/acme.pub");

    let mut longer = payload.clone();
    longer.extend_from_slice(b"          ");
    let (_, found) = signatures_from(&stand_in(answers(longer)));
    assert!(found.signatures.is_empty(), "{found:?}");

    // A registry without the referrers API that answers 405 (or 400, 501)
    // rather than 404: the fallback tag's index is read, as after a 404.
    for status in [400, 405, 501] {
        let mut fallback = answers(payload.clone());
        fallback.insert(
            format!("/v2/acme/net/referrers/sha256:{hex}"),
            Answer::new(status, ""),
        );
        fallback.insert(
            format!("/v2/acme/net/manifests/sha256-{hex}"),
            Answer::new(200, &index[..])
                .header("Content-Type", "application/vnd.oci.image.index.v1+json"),
        );
        let (_, found) = signatures_from(&stand_in(fallback));
        assert_eq!(found.signatures.len(), 1, "{status}: {found:?}");
    }
    // A refusal (403), a server error (500) or a rate limit (429) is not an
    // absent API: the lookup fails, and a signature behind it is never
    // taken as missing.
    for status in [403, 500, 429] {
        let mut denied = answers(payload.clone());
        denied.insert(
            format!("/v2/acme/net/referrers/sha256:{hex}"),
            Answer::new(status, ""),
        );
        let host = stand_in(denied);
        let pinned: PluginRef = format!("oci://{host}/acme/net@sha256:{hex}")
            .parse()
            .unwrap();
        let asked = tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(Registry::new(&plain(&host)).unwrap().signatures(&pinned));
        assert!(asked.is_err(), "{status}: {asked:?}");
    }
    // An answer of the referrers API that is no list of referrers: the
    // fallback tag is read too.
    let mut garbled = answers(payload.clone());
    garbled.insert(
        format!("/v2/acme/net/referrers/sha256:{hex}"),
        Answer::new(200, &b"{\"manifests\": 7}"[..])
            .header("Content-Type", "application/vnd.oci.image.index.v1+json"),
    );
    garbled.insert(
        format!("/v2/acme/net/manifests/sha256-{hex}"),
        Answer::new(200, &index[..])
            .header("Content-Type", "application/vnd.oci.image.index.v1+json"),
    );
    let (_, found) = signatures_from(&stand_in(garbled));
    assert_eq!(found.signatures.len(), 1, "{found:?}");

    // Only a Sigstore bundle (cosign v3's default): no signature, and the
    // refusal names the bundle.
    let bundle_index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": MANIFEST_MEDIA_TYPE, "digest": other_type, "size": 10, "artifactType": signature::BUNDLE_ARTIFACT_TYPE},
        ],
    }))
    .unwrap();
    let host = stand_in(HashMap::from([(
        format!("/v2/acme/net/referrers/sha256:{hex}"),
        Answer::new(200, &bundle_index[..])
            .header("Content-Type", "application/vnd.oci.image.index.v1+json"),
    )]));
    let (pinned, found) = signatures_from(&host);
    assert!(found.signatures.is_empty() && found.bundle, "{found:?}");
    let refused = found.verify(&rule, &pinned).unwrap_err().to_string();
    assert!(
        refused.contains("only a Sigstore bundle signature"),
        "{refused}"
    );
}

/// A stand-in whose cosign signature tag lists `junk` signature layers
/// before the vendor's: each a payload that matches its digest (padded
/// with `padding` bytes), signed by a key no rule names, as someone with
/// push rights and no vendor key could push. The pinned reference, the
/// vendor's rule, and the stand-in.
fn junk_before_the_signature(
    junk: usize,
    padding: usize,
    overrun: usize,
) -> (PluginRef, fixup_host::oci::trust::TrustRule, Served) {
    use base64::Engine as _;
    use fixup_host::oci::signature::{SIGNATURE_ANNOTATION, SIMPLE_SIGNING_MEDIA_TYPE};
    use p256::ecdsa::signature::Signer as _;

    let stand_in = StandIn::bind();
    let hex = sha256_hex(b"the plugin's manifest");
    let pinned: PluginRef = format!("oci://{}/acme/net@sha256:{hex}", stand_in.host)
        .parse()
        .unwrap();
    let vendor = p256::ecdsa::SigningKey::from_slice(&[9; 32]).unwrap();
    let pusher = p256::ecdsa::SigningKey::from_slice(&[5; 32]).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut answers = HashMap::new();
    let mut layers = Vec::new();
    // `overrun` bytes served past a junk payload's declared size: the
    // answer is over its cap, dropped, and counted as read that far.
    let mut layer = |key: &p256::ecdsa::SigningKey, note: serde_json::Value, overrun: usize| {
        let payload = simple_signing_payload(&hex, note);
        let signed: p256::ecdsa::Signature = key.sign(&payload);
        let digest = format!("sha256:{}", sha256_hex(&payload));
        layers.push(serde_json::json!({
            "mediaType": SIMPLE_SIGNING_MEDIA_TYPE,
            "digest": digest,
            "size": payload.len(),
            "annotations": {SIGNATURE_ANNOTATION: b64.encode(signed.to_der().as_bytes())},
        }));
        let mut served = payload;
        served.resize(served.len() + overrun, b' ');
        answers.insert(
            format!("/v2/acme/net/blobs/{digest}"),
            Answer::new(200, served),
        );
    };
    for i in 0..junk {
        layer(
            &pusher,
            serde_json::json!({"junk": i, "padding": "x".repeat(padding)}),
            overrun,
        );
    }
    layer(&vendor, serde_json::Value::Null, 0);
    let signature_manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": format!("sha256:{}", sha256_hex(b"{}")), "size": 2},
        "layers": layers,
    }))
    .unwrap();
    answers.insert(
        format!("/v2/acme/net/manifests/sha256-{hex}.sig"),
        manifest_answer(&signature_manifest),
    );
    let rule = any_of(
        format!("{}/acme", stand_in.host),
        &vendor,
        "/keys/vendor.pub",
    );
    (pinned, rule, stand_in.serve(answers, None))
}

/// The requests a lookup made of the stand-in's repository.
fn repository_requests(served: &Served) -> usize {
    served
        .asked()
        .iter()
        .filter(|path| path.starts_with("/v2/acme/net/"))
        .count()
}

/// Signature layers that do not verify, pushed ahead of the vendor's,
/// do not hide it while the lookup is within its request cap; more than
/// the cap allows, or more bytes, and the lookup is refused, naming the
/// reference and the cap, with no request past it.
#[test]
fn junk_signature_layers_cannot_hide_the_vendors_and_a_lookup_stops_at_its_caps() {
    use fixup_host::oci::signature::{self, MAX_SIGNATURE_BYTES, MAX_SIGNATURE_REQUESTS};

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let lookup = |pinned: &PluginRef, host: &str| {
        runtime.block_on(Registry::new(&plain(host)).unwrap().signatures(pinned))
    };

    // The tag's manifest, the referrers API and its fallback tag, and one
    // request a payload: 40 junk payloads and the vendor's fit.
    let junk = MAX_SIGNATURE_REQUESTS - 3 - 1 - 20;
    let (pinned, rule, served) = junk_before_the_signature(junk, 0, 0);
    let found = lookup(&pinned, &served.host).expect("within the cap");
    assert_eq!(found.signatures.len(), junk + 1);
    let signers = signature::verify(&rule, &pinned, &found.signatures).unwrap();
    assert_eq!(signers[0].key, "/keys/vendor.pub");
    assert_eq!(repository_requests(&served), junk + 4);

    // One payload more than the cap leaves room for: refused.
    let (pinned, _, served) = junk_before_the_signature(MAX_SIGNATURE_REQUESTS - 3, 0, 0);
    let refused = lookup(&pinned, &served.host).expect_err("past the request cap");
    assert!(
        matches!(refused, OciError::SignatureLookupCap { .. }),
        "{refused:?}"
    );
    let refused = refused.to_string();
    assert!(
        refused.starts_with(&format!(
            "{pinned}: looking for its signatures reached the cap of {MAX_SIGNATURE_REQUESTS} registry requests"
        )),
        "{refused}"
    );
    assert_eq!(repository_requests(&served), MAX_SIGNATURE_REQUESTS);

    // Few layers, large payloads: the byte cap.
    let padding = 15 << 10;
    let junk = (MAX_SIGNATURE_BYTES / padding as u64) as usize;
    let (pinned, _, served) = junk_before_the_signature(junk, padding, 0);
    let refused = lookup(&pinned, &served.host)
        .expect_err("past the byte cap")
        .to_string();
    assert!(
        refused.starts_with(&format!(
            "{pinned}: looking for its signatures reached the cap of {MAX_SIGNATURE_BYTES} bytes read"
        )),
        "{refused}"
    );
    // The same payloads served past their declared size are dropped, but
    // were read: they count against the byte cap as well.
    let (pinned, _, served) = junk_before_the_signature(junk, padding, 1);
    let refused = lookup(&pinned, &served.host)
        .expect_err("past the byte cap, the answers dropped")
        .to_string();
    assert!(
        refused.starts_with(&format!(
            "{pinned}: looking for its signatures reached the cap of {MAX_SIGNATURE_BYTES} bytes read"
        )),
        "{refused}"
    );
}
