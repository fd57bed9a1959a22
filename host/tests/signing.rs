//! Signed plugins with the real cosign: a plugin pushed with `plugin push`
//! to a real registry on loopback (Debian's `docker-registry`), signed by
//! `cosign sign --key` with a key `cosign generate-key-pair` made, and
//! verified by `cocoon-fixup` with the trust policy of its configuration
//! (`[plugin_trust]`), offline. Then each thing that can be tampered with
//! is, and each is refused with a message that names the plugin, the
//! reference, the key and what failed: the key (another one configured),
//! the signature (a byte changed), the pin (a signature copied from another
//! digest), the artifact (a tag moved to unsigned content), no signature at
//! all; on `plugin pull`, `plan` and `plugin inspect` alike, and after a key
//! is removed from the policy with the plugin already in the store.
//!
//! cosign is built from its Go module (`lab/cosign/go.mod` pins it) with
//! `go build` (modules from the module cache only: `GOPROXY=off`) into the
//! test's target folder, or taken from `COCOON_FIXUP_COSIGN`. Without Go
//! or without the modules these tests say loudly that they were skipped,
//! and pass, unless `COCOON_FIXUP_REQUIRE_COSIGN=1` (set by `.ci/run`)
//! makes that a failure.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::oci::registry::LocalRegistry;
use crate::oci::{cli, pinned_from, sha256_hex, text};
use crate::support::cosign::Cosign;
use base64::Engine as _;
use fixup_core::plugin::builtin::BUILTINS;

/// A registry with two plugins pushed, two cosign key pairs, and a folder
/// for the configuration, the keys and the store.
struct Bench {
    registry: LocalRegistry,
    cosign: Cosign,
    dir: tempfile::TempDir,
}

impl Bench {
    /// `None` when cosign or the registry is not there (said by each).
    fn start() -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let cosign = Cosign::new(dir.path())?;
        let registry = LocalRegistry::start()?;
        cosign.generate("vendor");
        cosign.generate("other");
        Some(Bench {
            registry,
            cosign,
            dir,
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn key(&self, name: &str) -> String {
        self.cosign.public_key(name)
    }

    fn sign(&self, key: &str, pinned: &str, extra: &[&str]) {
        self.cosign.sign(key, pinned, extra);
    }

    /// `plugin push` of `wasm` to `plugins/net:TAG`; the pinned reference.
    fn push(&self, wasm: &[u8], tag: &str) -> String {
        let file = self.path(&format!("{tag}.wasm"));
        std::fs::write(&file, wasm).unwrap();
        let reference = format!("oci://{}/plugins/net:{tag}", self.registry.host());
        let out = cli(
            self.dir.path(),
            &[
                "plugin",
                "push",
                file.to_str().unwrap(),
                &reference,
                "--plain-http",
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        pinned_from(&text(&out.stdout))
    }

    /// The configuration file: `body`, after the registry over plain HTTP
    /// and a store in the folder.
    fn configure(&self, body: &str) {
        std::fs::write(
            self.path("config.toml"),
            format!(
                "oci_plain_http = [\"{}\"]\noci_store = \"{}\"\nno_cache = true\n{body}",
                self.registry.host(),
                self.path("oci").display()
            ),
        )
        .unwrap();
    }

    /// A trust rule for the plugins' repository.
    fn trust(&self, require: &str, keys: &[&str]) -> String {
        let keys: Vec<String> = keys
            .iter()
            .map(|k| format!("\"{}\"", self.key(k)))
            .collect();
        format!(
            "[plugin_trust.\"{}/plugins\"]\nkeys = [{}]\nrequire = \"{require}\"\n",
            self.registry.host(),
            keys.join(", ")
        )
    }

    fn pull(&self, reference: &str, output: &str, extra: &[&str]) -> Output {
        crate::oci::pull(self.dir.path(), reference, output, extra)
    }

    /// `GET` (`None`) or `PUT` of the manifest `name` in `plugins/net`.
    fn manifest(&self, name: &str, put: Option<&[u8]>) -> Vec<u8> {
        let url = format!(
            "http://{}/v2/plugins/net/manifests/{name}",
            self.registry.host()
        );
        let media_type = "application/vnd.oci.image.manifest.v1+json";
        // reqwest's TLS needs a provider even for plain HTTP: the one the
        // host installs.
        let _ = rustls::crypto::ring::default_provider().install_default();
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            let client = reqwest::Client::new();
            let request = match put {
                Some(body) => client
                    .put(&url)
                    .header("content-type", media_type)
                    .body(body.to_vec()),
                None => client.get(&url).header(
                    "accept",
                    format!("{media_type}, application/vnd.oci.image.index.v1+json"),
                ),
            };
            let response = request.send().await.unwrap();
            assert!(
                response.status().is_success(),
                "{url}: {}",
                response.status()
            );
            response.bytes().await.unwrap().to_vec()
        })
    }
}

fn hex_of(pinned: &str) -> &str {
    pinned.rsplit_once("@sha256:").unwrap().1
}

/// A refusal (exit code 1) whose message names the plugin, the reference,
/// each key and what failed.
fn assert_refused(out: &Output, reference: &str, keys: &[String], says: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}{stderr}", text(&out.stdout));
    for part in [
        "plugin `plugins/net`",
        reference,
        "is refused",
        says,
        "plugin_trust",
    ] {
        assert!(stderr.contains(part), "{part:?} in {stderr}");
    }
    for key in keys {
        assert!(stderr.contains(key.as_str()), "{key} in {stderr}");
    }
}

/// The real cosign's signature verifies with the vendor's key, and each
/// way of tampering is refused by `plugin pull`, with nothing written.
#[test]
fn a_cosign_signature_verifies_and_each_tampering_is_refused() {
    let Some(bench) = Bench::start() else {
        return;
    };
    let signed = bench.push(BUILTINS[0].1, "v1");
    bench.sign("vendor", &signed, &[]);
    let vendor = bench.key("vendor");
    let other = bench.key("other");

    // The vendor's key: it verifies, and pull says who signed.
    bench.configure(&bench.trust("any-of", &["vendor"]));
    let out = bench.pull(&signed, "ok.wasm", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "signed by {vendor} (signed as {}/plugins/net)",
            bench.registry.host()
        )),
        "{stdout}"
    );
    assert_eq!(std::fs::read(bench.path("ok.wasm")).unwrap(), BUILTINS[0].1);

    // Another key: refused, naming it.
    bench.configure(&bench.trust("any-of", &["other"]));
    let out = bench.pull(&signed, "other.wasm", &[]);
    assert_refused(
        &out,
        &signed,
        std::slice::from_ref(&other),
        "none of the 1 signature(s) found verifies with it",
    );
    assert!(!bench.path("other.wasm").exists());

    // all-of: refused until both keys have signed; any-of of both passes.
    bench.configure(&bench.trust("all-of", &["vendor", "other"]));
    let out = bench.pull(&signed, "all.wasm", &[]);
    assert_refused(
        &out,
        &signed,
        std::slice::from_ref(&other),
        "signatures by all of keys",
    );
    assert!(
        !text(&out.stderr).contains(&format!("key {vendor}:")),
        "the vendor's key signed: {}",
        text(&out.stderr)
    );
    bench.sign("other", &signed, &[]);
    let out = bench.pull(&signed, "all.wasm", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&vendor) && stdout.contains(&other),
        "{stdout}"
    );

    // The signature changed in the registry: one byte of each.
    bench.configure(&bench.trust("any-of", &["vendor"]));
    let tag = format!("sha256-{}.sig", hex_of(&signed));
    let original = bench.manifest(&tag, None);
    let mut manifest: serde_json::Value = serde_json::from_slice(&original).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    for layer in manifest["layers"].as_array_mut().unwrap() {
        let annotation = &mut layer["annotations"]["dev.cosignproject.cosign/signature"];
        let mut der = b64.decode(annotation.as_str().unwrap()).unwrap();
        let last = der.len() - 1;
        der[last] ^= 1;
        *annotation = b64.encode(der).into();
    }
    bench.manifest(&tag, Some(&serde_json::to_vec(&manifest).unwrap()));
    let out = bench.pull(&signed, "changed.wasm", &[]);
    assert_refused(
        &out,
        &signed,
        std::slice::from_ref(&vendor),
        "none of the 2 signature(s) found verifies with it",
    );
    bench.manifest(&tag, Some(&original));

    // The artifact: the tag moved to other content, which nobody signed.
    let moved = bench.push(BUILTINS[1].1, "v1");
    let tagged = format!("oci://{}/plugins/net:v1", bench.registry.host());
    let out = bench.pull(&tagged, "moved.wasm", &["--allow-tag"]);
    assert_refused(
        &out,
        &moved,
        std::slice::from_ref(&vendor),
        &format!(
            "the registry has no signature for this digest (no `sha256-{}.sig` tag, no referrer)",
            hex_of(&moved)
        ),
    );
    assert!(!bench.path("moved.wasm").exists());

    // The pin: the signed plugin's signatures copied to the other digest.
    bench.manifest(&format!("sha256-{}.sig", hex_of(&moved)), Some(&original));
    let out = bench.pull(&moved, "copied.wasm", &[]);
    assert_refused(
        &out,
        &moved,
        std::slice::from_ref(&vendor),
        &format!(
            "its signature signs sha256:{}, not the pinned digest sha256:{}",
            hex_of(&signed),
            hex_of(&moved)
        ),
    );

    // `require = "none"`: nothing refused, and pull says no key signed.
    bench.configure(&bench.trust("none", &["other"]));
    let out = bench.pull(&moved, "none.wasm", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("not signed by a key of"),
        "{}",
        text(&out.stdout)
    );
}

/// cosign asked for the OCI 1.1 referrers (`--registry-referrers-mode
/// oci-1-1`) on a registry without the referrers API writes the
/// fallback tag's index; that signature verifies too.
#[test]
fn a_signature_attached_as_a_referrer_verifies() {
    let Some(bench) = Bench::start() else {
        return;
    };
    let pinned = bench.push(BUILTINS[2].1, "v3");
    bench.sign("vendor", &pinned, &["--registry-referrers-mode=oci-1-1"]);
    let index = bench.manifest(&format!("sha256-{}", hex_of(&pinned)), None);
    assert!(
        text(&index).contains("application/vnd.dev.cosign.artifact.sig.v1+json"),
        "cosign wrote the fallback index: {}",
        text(&index)
    );
    bench.configure(&bench.trust("any-of", &["vendor"]));
    let out = bench.pull(&pinned, "referred.wasm", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&format!("signed by {}", bench.key("vendor"))),
        "{}",
        text(&out.stdout)
    );
}

/// `plan` of the bundled oci-static example in `dir` (its configuration
/// file), with `extra` flags.
fn plan_in(dir: &Path, extra: &[&str]) -> Output {
    let mut args = crate::support::example_plan_args();
    args.extend(extra.iter().map(|arg| arg.to_string()));
    cli(dir, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// What a node loads: `plan` with the signed plugin pinned gets past the
/// signature (to where the built-in it copies keeps its claim), and
/// `plugin inspect` says who signed it; offline with the registry down,
/// from the store. Then the vendor's key is removed from the policy: the
/// plugin is in the store, but the next `plan` verifies again and refuses
/// it, so does the start of `serve`, and `plugin inspect` fails saying
/// why. An unsigned plugin pinned
/// under the policy never loads.
#[test]
fn a_node_loads_only_what_its_keys_signed_and_a_removed_key_is_refused_at_the_next_load() {
    let Some(bench) = Bench::start() else {
        return;
    };
    let signed = bench.push(BUILTINS[0].1, "v1");
    bench.sign("vendor", &signed, &[]);
    let unsigned = bench.push(BUILTINS[1].1, "v2");
    let plan = |reference: &str| plan_in(bench.dir.path(), &["--plugin-ref", reference]);
    let inspect = || {
        let file = bench.path("inspected.wasm");
        std::fs::write(&file, BUILTINS[3].1).unwrap();
        cli(
            bench.dir.path(),
            &["plugin", "inspect", file.to_str().unwrap()],
        )
    };
    let sha256 = sha256_hex(BUILTINS[0].1);
    let vendor = bench.key("vendor");
    let with_vendor = format!(
        "allowed_plugins = [\"{sha256}\"]\nplugins = [\"{signed}\"]\n{}",
        bench.trust("any-of", &["vendor", "other"])
    );
    bench.configure(&with_vendor);

    let out = plan(&signed);
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("is refused"), "{stderr}");
    assert!(
        stderr.contains("both serve"),
        "loaded, then refused: {stderr}"
    );
    let out = inspect();
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!("{signed} signed by {vendor}")),
        "{stdout}"
    );

    // Unsigned, under the same policy: refused before it is pulled.
    let out = plan(&unsigned);
    assert_refused(
        &out,
        &unsigned,
        std::slice::from_ref(&vendor),
        "the registry has no signature",
    );
    assert!(!text(&out.stderr).contains("both serve"));

    // Offline: the store's plugin and its kept signatures verify.
    let Bench {
        registry,
        cosign: _,
        dir,
    } = bench;
    let host = registry.host().to_owned();
    registry.stop();
    let offline = |config: &str| {
        std::fs::write(
            dir.path().join("config.toml"),
            format!(
                "oci_plain_http = [\"{host}\"]\noci_store = \"{}\"\nno_cache = true\nallowed_plugins = [\"{sha256}\"]\nplugins = [\"{signed}\"]\n[plugin_trust.\"{host}/plugins\"]\n{config}",
                dir.path().join("oci").display()
            ),
        )
        .unwrap();
        plan_in(dir.path(), &[])
    };
    let other = dir.path().join("keys/other.pub").display().to_string();
    let out = offline(&format!("keys = [\"{vendor}\", \"{other}\"]\n"));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("both serve"), "{stderr}");

    // The vendor's key removed: verified again, and refused.
    let out = offline(&format!("keys = [\"{other}\"]\n"));
    assert_refused(
        &out,
        &signed,
        std::slice::from_ref(&other),
        "none of the 1 signature(s) found verifies with it",
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("asking the registry for newer signatures failed"),
        "{stderr}"
    );
    assert!(!stderr.contains("both serve"), "{stderr}");
    // The daemon's start says the same, before it reaches Kubernetes.
    let out = cli(dir.path(), &["serve", "--node", "n1"]);
    assert_refused(
        &out,
        &signed,
        std::slice::from_ref(&other),
        "none of the 1 signature(s) found verifies with it",
    );
    assert!(
        !text(&out.stderr).contains("Kubernetes"),
        "{}",
        text(&out.stderr)
    );
    let file = dir.path().join("inspected.wasm");
    let out = cli(dir.path(), &["plugin", "inspect", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("refused"), "{stdout}");
    assert!(stdout.contains(&other), "{stdout}");
}

/// `plugin push --sign-key` signs as `cosign sign --key` does: the real
/// cosign verifies its signature with the public key, a second key's
/// signature is added beside the first, `plugin pull` names both, and
/// cosign's own encrypted key is refused before anything is pushed, with
/// the cosign command to use instead.
#[test]
fn plugin_push_signs_as_cosign_does_and_cosign_verifies_it() {
    use p256::pkcs8::{EncodePrivateKey as _, EncodePublicKey as _, LineEnding};
    let Some(bench) = Bench::start() else {
        return;
    };
    let mut keys = Vec::new();
    for (name, seed) in [("first", 3u8), ("second", 4u8)] {
        let key = p256::ecdsa::SigningKey::from_slice(&[seed; 32]).unwrap();
        let private = bench.path(&format!("keys/{name}.pem"));
        std::fs::write(
            &private,
            key.to_pkcs8_pem(LineEnding::LF).unwrap().as_bytes(),
        )
        .unwrap();
        std::fs::write(
            bench.path(&format!("keys/{name}.pub")),
            key.verifying_key()
                .to_public_key_pem(LineEnding::LF)
                .unwrap(),
        )
        .unwrap();
        keys.push((private.display().to_string(), bench.key(name)));
    }
    let file = bench.path("signed.wasm");
    std::fs::write(&file, BUILTINS[0].1).unwrap();
    let reference = format!("oci://{}/plugins/net:v1", bench.registry.host());
    let push = |key: &str| {
        cli(
            bench.dir.path(),
            &[
                "plugin",
                "push",
                file.to_str().unwrap(),
                &reference,
                "--plain-http",
                "--sign-key",
                key,
            ],
        )
    };

    let out = push(&keys[0].0);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pinned = pinned_from(&text(&out.stdout));
    assert!(
        text(&out.stdout).contains(&format!("signed {pinned} with {}", keys[0].0)),
        "{}",
        text(&out.stdout)
    );
    let image = pinned.strip_prefix("oci://").unwrap();
    let verified = bench.cosign.run(&[
        "verify",
        "--key",
        &keys[0].1,
        "--insecure-ignore-tlog=true",
        image,
    ]);
    assert!(
        text(&verified.stdout).contains(&format!(
            "\"docker-manifest-digest\":\"sha256:{}\"",
            hex_of(&pinned)
        )),
        "{}",
        text(&verified.stdout)
    );

    let out = push(&keys[1].0);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let keys_toml: Vec<String> = keys
        .iter()
        .map(|(_, public)| format!("\"{public}\""))
        .collect();
    bench.configure(&format!(
        "[plugin_trust.\"{}/plugins\"]\nkeys = [{}]\nrequire = \"all-of\"\n",
        bench.registry.host(),
        keys_toml.join(", ")
    ));
    let out = bench.pull(&pinned, "both.wasm", &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&format!("signed by {}", keys[0].1))
            && text(&out.stdout).contains(&keys[1].1),
        "{}",
        text(&out.stdout)
    );

    let encrypted = bench.path("keys/vendor.key").display().to_string();
    let out = cli(
        bench.dir.path(),
        &[
            "plugin",
            "push",
            file.to_str().unwrap(),
            &format!("oci://{}/plugins/other:v1", bench.registry.host()),
            "--plain-http",
            "--sign-key",
            &encrypted,
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&encrypted) && stderr.contains("cosign sign --key"),
        "{stderr}"
    );
    assert!(
        !text(&out.stdout).contains("pushed"),
        "nothing pushed: {}",
        text(&out.stdout)
    );
}
