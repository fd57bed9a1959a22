//! Plugins as OCI artifacts: publish one to a registry, pull one pinned by
//! digest, and keep pulled plugins in a store the host trusts.
//!
//! A plugin artifact has the layout the Wasm community uses: an image
//! manifest whose config has the media type [`WASM_CONFIG_MEDIA_TYPE`] and
//! whose one layer, of media type [`WASM_LAYER_MEDIA_TYPE`], is the
//! component. The registry protocol is spoken in [`wire`], every read from
//! a registry under a bound and every redirect under a rule.
//!
//! What is believed: nothing a registry says until it matches a digest the
//! operator pinned. A pull by digest checks the manifest's bytes against the
//! pinned digest, the layout and media types, and the layer's bytes against
//! the layer digest the manifest names; only then is anything written into
//! the store. A tag is resolved to a digest only when the caller allows it
//! ([`Tags::Resolve`], `plugin pull --allow-tag`), and configured references
//! must name a digest ([`PluginRef::require_digest`]).
//!
//! The store ([`Store`]) is a directory under the trust rules of
//! [`fixup_core::plugin::trusted`] (created 0700; every directory on its path
//! root's or the host user's and not writable by others; each file a
//! regular file of theirs, not writable by others, never a link). It holds
//! each manifest under its digest and each plugin layer under its sha256,
//! and both are checked against their names whenever they are used, so a
//! plugin already pulled needs no registry at the next start. The files are
//! then loaded like any plugin file: the allow-list (`allowed_plugins`, the
//! sha256 of the wasm) and the guest policy apply unchanged.
//!
//! Whose a plugin is, is [`signature`]'s: under a trust policy
//! ([`PinnedPlugins::trust`]), a reference is verified against the cosign
//! signatures of its digest before it is pulled or handed to the loader,
//! at every start and reload; the store keeps those signatures beside the
//! manifest so that a start without the registry verifies again.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

pub mod signature;
pub mod trust;
mod wire;

pub use signature::{SignatureError, Signer};
pub use trust::TrustPolicy;
pub use wire::{LAYER_TIMEOUT, MAX_REDIRECTS, MAX_SMALL_BODY, Registry};

use sha2::{Digest, Sha256};

use fixup_core::plugin::trusted::{TrustedDir, Untrusted};

/// The media type of the layer that holds the component.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The media type of a Wasm artifact's config.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The manifest media type pushed and accepted.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// Largest plugin layer pulled, 64 MiB: a plan plugin is well under 1 MiB;
/// the limit keeps a hostile registry from filling memory.
pub const MAX_LAYER_BYTES: u64 = 64 << 20;
/// Largest manifest believed, 64 KiB (one config and one layer need < 1 KiB).
pub const MAX_MANIFEST_BYTES: usize = 64 << 10;
/// Connect and read timeout of each registry request: 30 s.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Basic-auth user name for registry requests, from the environment.
pub const USERNAME_ENV: &str = "COCOON_FIXUP_OCI_USERNAME";
/// Basic-auth password for registry requests, from the environment.
pub const PASSWORD_ENV: &str = "COCOON_FIXUP_OCI_PASSWORD";

/// What a reference pins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pin {
    /// `@sha256:HEX`: the manifest digest, 64 lowercase hex digits.
    Digest(String),
    /// `:TAG`: whatever the registry says the tag is now.
    Tag(String),
}

/// `oci://HOST[:PORT]/REPO@sha256:DIGEST` or `oci://HOST[:PORT]/REPO:TAG`.
/// The host is always written: nothing is pulled from a registry the
/// operator did not name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginRef {
    pub registry: String,
    pub repository: String,
    pub pin: Pin,
}

impl fmt::Display for PluginRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "oci://{}/{}", self.registry, self.repository)?;
        match &self.pin {
            Pin::Digest(hex) => write!(f, "@sha256:{hex}"),
            Pin::Tag(tag) => write!(f, ":{tag}"),
        }
    }
}

impl FromStr for PluginRef {
    type Err = OciError;

    fn from_str(text: &str) -> Result<Self, OciError> {
        let bad = |reason: &'static str| OciError::BadReference {
            text: fixup_core::facts::escape_controls(text),
            reason,
        };
        let rest = text
            .strip_prefix("oci://")
            .ok_or_else(|| bad("it does not start with oci://"))?;
        let (registry, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("it has no repository after the host"))?;
        let registry_ok = !registry.is_empty()
            && registry
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b));
        if !registry_ok {
            return Err(bad(
                "the host is empty or has characters a host cannot have",
            ));
        }
        // The URL the registry is asked at lowercases the host and drops
        // a trailing dot: the reference must already be that host, or a
        // trust scope could be matched against one host and the plugin
        // fetched from another spelling of it.
        let host = match registry.rsplit_once(':') {
            Some((host, port)) if !registry.ends_with(']') => {
                if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad("the port is not digits"));
                }
                host
            }
            _ => registry,
        };
        if host.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(bad("the host has uppercase letters: write it lowercase"));
        }
        if !host.starts_with('[') && host.split('.').any(str::is_empty) {
            return Err(bad(
                "the host has an empty label (a leading, trailing or doubled `.`)",
            ));
        }
        // Over either scheme, the URL the registry is asked at must read
        // back as written: a default port, a port with leading zeros or
        // another spelling of an IP address would be fetched from a host
        // and port a trust scope, compared as written, does not name.
        let reads_back = ["https", "http"].iter().all(|scheme| {
            reqwest::Url::parse(&format!("{scheme}://{registry}/")).is_ok_and(|url| {
                let host = url.host_str().unwrap_or_default();
                match url.port() {
                    Some(port) => format!("{host}:{port}") == registry,
                    None => host == registry,
                }
            })
        });
        if !reads_back {
            return Err(bad(
                "the host or port is not written as the registry is asked at: no port 443 or 80, no leading zeros, an IP address in its usual form",
            ));
        }
        let (repository, pin) = if let Some((repository, digest)) = path.split_once('@') {
            let hex = digest
                .strip_prefix("sha256:")
                .ok_or_else(|| bad("the digest is not sha256:<64 hex digits>"))?;
            if !is_sha256_hex(hex) {
                return Err(bad("the digest is not sha256:<64 lowercase hex digits>"));
            }
            (repository, Pin::Digest(hex.to_owned()))
        } else {
            let (repository, tag) = match path.rsplit_once(':') {
                Some((repository, tag)) if !tag.contains('/') => (repository, tag),
                _ => {
                    return Err(bad(
                        "it names neither a digest (@sha256:...) nor a tag (:TAG)",
                    ));
                }
            };
            let tag_ok = !tag.is_empty()
                && tag.len() <= 128
                && !tag.starts_with(['.', '-'])
                && tag
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !tag_ok {
                return Err(bad("the tag is empty or has characters a tag cannot have"));
            }
            (repository, Pin::Tag(tag.to_owned()))
        };
        let repository_ok = !repository.is_empty()
            && !repository.starts_with('/')
            && !repository.ends_with('/')
            && repository
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b));
        if !repository_ok {
            return Err(bad(
                "the repository is empty or not lowercase letters, digits, `.`, `_`, `-` and `/`",
            ));
        }
        // Each path segment starts and ends with a letter or digit (as the
        // OCI distribution spec's repository names do): no empty segment,
        // no `.` or `..`, which the URL the registry is asked at would
        // resolve into another repository than the one trust scopes see.
        let segment_ok = |segment: &str| {
            let bytes = segment.as_bytes();
            matches!(
                (bytes.first(), bytes.last()),
                (Some(a), Some(z)) if a.is_ascii_alphanumeric() && z.is_ascii_alphanumeric()
            )
        };
        if !repository.split('/').all(segment_ok) {
            return Err(bad(
                "a segment of the repository is empty, `.` or `..`, or does not start and end with a letter or digit",
            ));
        }
        Ok(PluginRef {
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            pin,
        })
    }
}

impl PluginRef {
    /// The manifest digest (hex) when the reference pins one.
    pub fn digest(&self) -> Option<&str> {
        match &self.pin {
            Pin::Digest(hex) => Some(hex),
            Pin::Tag(_) => None,
        }
    }

    /// This reference, pinned to the manifest digest `hex`.
    pub fn pinned(&self, hex: &str) -> PluginRef {
        PluginRef {
            pin: Pin::Digest(hex.to_owned()),
            ..self.clone()
        }
    }

    /// Refuse a tag: a plugin the host loads at start is named by digest,
    /// so what runs is what the operator reviewed.
    pub fn require_digest(self) -> Result<PluginRef, OciError> {
        match self.pin {
            Pin::Digest(_) => Ok(self),
            Pin::Tag(_) => Err(OciError::NotPinned {
                reference: self.to_string(),
            }),
        }
    }
}

/// Why a push, a pull or the store failed. Each message names the
/// reference and ends with what to do.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error(
        "`{text}` is not a plugin reference: {reason}; write oci://HOST/REPO@sha256:DIGEST (or oci://HOST/REPO:TAG to push)"
    )]
    BadReference { text: String, reason: &'static str },
    #[error(
        "{reference} names a tag, and a tag can be moved to other content: pin the digest instead (`cocoon-fixup plugin pull --allow-tag {reference}` prints it) and write oci://HOST/REPO@sha256:DIGEST"
    )]
    NotPinned { reference: String },
    #[error(
        "{reference} names a tag: pass --allow-tag to resolve it to its digest (printed, so you can pin it), or give the digest"
    )]
    TagNotAllowed { reference: String },
    #[error("{reference}: pushing needs a tag (oci://HOST/REPO:TAG); the digest is printed after")]
    PushNeedsTag { reference: String },
    #[error(
        "{reference}: the registry needs authentication (401): set {USERNAME_ENV} and {PASSWORD_ENV}, or ask for anonymous pull access"
    )]
    Unauthorized { reference: String },
    #[error(
        "{reference}: no such reference in the registry (404): check the host, the repository and the digest or tag"
    )]
    NotFound { reference: String },
    #[error(
        "{reference}: the registry answered with an error ({status}): {detail}; try again later, or ask the registry's operator"
    )]
    Registry {
        reference: String,
        status: String,
        detail: String,
    },
    #[error(
        "{reference}: cannot talk to the registry: {reason}; check the host and port (a registry without TLS needs `--plain-http` for push and pull, `oci_plain_http` in the configuration)"
    )]
    Unreachable { reference: String, reason: String },
    #[error(
        "{reference}: {reason}; a registry's redirect (and its token realm, and its upload location) is followed to HTTPS, or over plain HTTP only on the registry itself, never from HTTPS to HTTP"
    )]
    Redirect { reference: String, reason: String },
    #[error(
        "{reference}: the {what} does not match its digest (expected sha256:{expected}, got sha256:{actual}): refused, nothing was stored; the registry serves other content than what was pinned"
    )]
    DigestMismatch {
        reference: String,
        what: &'static str,
        expected: String,
        actual: String,
    },
    #[error(
        "{reference} is not a Wasm plugin: {reason}; a plugin artifact has one `{WASM_LAYER_MEDIA_TYPE}` layer and config `{WASM_CONFIG_MEDIA_TYPE}` (`cocoon-fixup plugin push` makes one)"
    )]
    NotAPlugin { reference: String, reason: String },
    #[error(transparent)]
    Signature(Box<SignatureError>),
    #[error(
        "{reference}: looking for its signatures reached the cap of {cap}: the registry has more signature artifacts for this digest than a vendor's signing makes (someone with push rights may have pushed them); nothing from this reference is loaded: ask the registry's operator to remove the extra signatures"
    )]
    SignatureLookupCap { reference: String, cap: String },
    #[error(
        "{reference}: the plugin is held in the store, but no signatures were kept for it (it was stored before `[plugin_trust.\"{scope}\"]` required them), and the registry cannot be asked for them: {reason}; nothing from this reference is loaded: run `cocoon-fixup plugin pull {reference}` with the registry reachable"
    )]
    NoKeptSignatures {
        reference: String,
        scope: String,
        reason: String,
    },
    #[error("the plugin store: {0}")]
    Store(Untrusted),
    #[error("cannot write {} in the plugin store: {reason}", path.display())]
    StoreWrite { path: PathBuf, reason: String },
    #[error("no place for the plugin store: set --oci-store (HOME and XDG_STATE_HOME are unset)")]
    NoStore,
}

impl From<SignatureError> for OciError {
    fn from(e: SignatureError) -> Self {
        OciError::Signature(Box::new(e))
    }
}

/// `e` and its causes, joined by `: `.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Registry-supplied text for a message: control characters escaped, at
/// most 400 characters (a transport error's chain, URL included, fits).
fn bounded(text: &str) -> String {
    const MAX: usize = 400;
    let text = fixup_core::facts::escape_controls(text.trim());
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Whether `digest` is `sha256:` and 64 lowercase hex digits.
fn is_sha256_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(is_sha256_hex)
}

/// 64 lowercase hex digits.
fn is_sha256_hex(hex: &str) -> bool {
    hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// How the registry is reached.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Registries (`HOST` or `HOST:PORT`, as written in references) spoken
    /// to over plain HTTP; every other one over HTTPS. Content is verified
    /// by digest either way; plain HTTP only gives up privacy and, for a
    /// tag, the registry's word on which digest it names.
    pub plain_http: Vec<String>,
    /// Basic-auth credentials; `None` is anonymous.
    pub credentials: Option<(String, String)>,
}

impl RegistryOptions {
    /// Plain HTTP for `plain_http`; credentials from [`USERNAME_ENV`] and
    /// [`PASSWORD_ENV`] when both are set, else anonymous.
    pub fn from_env(plain_http: Vec<String>) -> Self {
        let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
        RegistryOptions {
            plain_http,
            credentials: var(USERNAME_ENV).zip(var(PASSWORD_ENV)),
        }
    }
}

/// Whether a pull may follow a tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tags {
    /// Only digests: a tag is refused ([`OciError::TagNotAllowed`]).
    Refuse,
    /// A tag is resolved to the digest of the manifest it names now.
    Resolve,
}

/// A plugin pulled and verified.
#[derive(Debug, Clone)]
pub struct Artifact {
    /// The reference, pinned to the manifest's digest.
    pub reference: PluginRef,
    /// The manifest's bytes, as their digest covers them.
    pub manifest: Vec<u8>,
    /// The component.
    pub wasm: Vec<u8>,
    /// The component's sha256 (hex): what `allowed_plugins` lists.
    pub wasm_sha256: String,
}

/// A content descriptor: what a manifest says of its config and layers.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: String,
    digest: String,
    size: i64,
}

/// An OCI image manifest, as much of it as a plugin artifact uses.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImageManifest {
    schema_version: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    media_type: Option<String>,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

/// The one plugin layer of a manifest, checked: schema 2, the Wasm config
/// media type, exactly one `application/wasm` layer with a sha256 digest
/// and a size within [`MAX_LAYER_BYTES`]. `Err` says what is wrong.
fn plugin_layer(manifest: &[u8]) -> Result<Descriptor, String> {
    if manifest.len() > MAX_MANIFEST_BYTES {
        return Err(format!(
            "its manifest is {} bytes, more than {MAX_MANIFEST_BYTES}",
            manifest.len()
        ));
    }
    let manifest: ImageManifest = serde_json::from_slice(manifest).map_err(|e| {
        format!(
            "its manifest is not an image manifest ({})",
            bounded(&e.to_string())
        )
    })?;
    if manifest.schema_version != 2 {
        return Err(format!(
            "its manifest has schema version {}, not 2",
            manifest.schema_version
        ));
    }
    if let Some(media_type) = &manifest.media_type
        && media_type != MANIFEST_MEDIA_TYPE
    {
        return Err(format!(
            "its manifest has the media type {}",
            bounded(media_type)
        ));
    }
    if manifest.config.media_type != WASM_CONFIG_MEDIA_TYPE {
        return Err(format!(
            "its config has the media type {}",
            bounded(&manifest.config.media_type)
        ));
    }
    let [layer] = <[Descriptor; 1]>::try_from(manifest.layers)
        .map_err(|layers| format!("it has {} layers, not one", layers.len()))?;
    if layer.media_type != WASM_LAYER_MEDIA_TYPE {
        return Err(format!(
            "its layer has the media type {}",
            bounded(&layer.media_type)
        ));
    }
    if !is_sha256_digest(&layer.digest) {
        return Err(format!(
            "its layer digest {} is not sha256:<64 lowercase hex digits>",
            bounded(&layer.digest)
        ));
    }
    if layer.size < 0 || layer.size as u64 > MAX_LAYER_BYTES {
        return Err(format!(
            "its layer declares {} bytes, outside 0..={MAX_LAYER_BYTES}",
            layer.size
        ));
    }
    Ok(layer)
}

/// Pulled plugins on disk, under the trust rules of
/// [`fixup_core::plugin::trusted`] (module docs).
#[derive(Debug)]
pub struct Store {
    dir: TrustedDir,
}

/// The default store for the user the host runs as: beside the cache key,
/// `/var/lib/cocoon-fixup/oci` for root; `$XDG_STATE_HOME/cocoon-fixup/oci`,
/// else `~/.local/state/cocoon-fixup/oci`, for anyone else.
pub fn default_store_dir() -> Option<PathBuf> {
    store_dir_for(fixup_core::plugin::trusted::euid(), |v| std::env::var_os(v))
}

/// [`default_store_dir`] for a user `euid` when `var` reads the
/// environment: the directory of that user's default cache key
/// ([`default_paths`](fixup_core::plugin::cache::default_paths) of the
/// node), and `oci` in it.
pub fn store_dir_for(
    euid: u32,
    var: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    use fixup_core::plugin::cache::{CacheOwner, default_paths};
    default_paths(CacheOwner::Node, euid, var)
        .key
        .and_then(|key| key.parent().map(|dir| dir.join("oci")))
}

fn manifest_name(hex: &str) -> String {
    format!("sha256-{hex}.manifest.json")
}

fn layer_name(hex: &str) -> String {
    format!("sha256-{hex}.wasm")
}

fn signatures_name(hex: &str) -> String {
    format!("sha256-{hex}.signatures.json")
}

/// Largest signatures file read from the store, 1 MiB: room for all a
/// lookup may read ([`signature::MAX_SIGNATURE_BYTES`]), in base64.
const MAX_STORED_SIGNATURES_BYTES: u64 = 1 << 20;

impl Store {
    /// Open the store at `path`, creating it (0700) if missing; it and the
    /// directories above it must pass the trust rules.
    pub fn open(path: &Path) -> Result<Self, OciError> {
        Ok(Store {
            dir: TrustedDir::create(path).map_err(OciError::Store)?,
        })
    }

    /// Open the store at `path` when it exists, creating nothing: for
    /// readers that must leave the disk as it is.
    pub fn open_existing(path: &Path) -> Result<Self, OciError> {
        Ok(Store {
            dir: TrustedDir::open(path).map_err(OciError::Store)?,
        })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The plugin file of the manifest `hex` when the store holds the
    /// manifest and its layer, both trusted files matching their digests,
    /// each read no further than its bound (the manifest's, and the size
    /// the manifest declares for the layer);
    /// `Ok(None)` when either is absent; `Err` says why what is there is
    /// not believed.
    pub fn verified(&self, hex: &str) -> Result<Option<PathBuf>, String> {
        let read = |name: &str, max: u64| {
            self.dir
                .read_file_bounded(name, max)
                .map_err(|e| format!("{e}; it is not believed"))
        };
        let Some(manifest) = read(&manifest_name(hex), MAX_MANIFEST_BYTES as u64)? else {
            return Ok(None);
        };
        let actual = sha256_hex(&manifest);
        if actual != hex {
            return Err(format!(
                "{} holds content of digest sha256:{actual}; it is not believed",
                self.path().join(manifest_name(hex)).display()
            ));
        }
        let layer = plugin_layer(&manifest)?;
        let layer_hex = &layer.digest["sha256:".len()..];
        // The size the manifest declares, checked against the digest below.
        let Some(wasm) = read(&layer_name(layer_hex), layer.size as u64)? else {
            return Ok(None);
        };
        if sha256_hex(&wasm) != layer_hex {
            return Err(format!(
                "{} does not match its digest; it is not believed",
                self.path().join(layer_name(layer_hex)).display()
            ));
        }
        Ok(Some(self.path().join(layer_name(layer_hex))))
    }

    /// The signatures kept for the manifest `hex` (none believed: each is
    /// verified at every use); `Ok(None)` when none were kept.
    pub fn signatures(&self, hex: &str) -> Result<Option<Vec<signature::Signature>>, String> {
        let name = signatures_name(hex);
        let Some(bytes) = self
            .dir
            .read_file_bounded(&name, MAX_STORED_SIGNATURES_BYTES)
            .map_err(|e| format!("{e}; it is not used"))?
        else {
            return Ok(None);
        };
        let kept: signature::Signatures = serde_json::from_slice(&bytes).map_err(|_| {
            format!(
                "{} is not a list of signatures; it is not used",
                self.path().join(&name).display()
            )
        })?;
        Ok(Some(kept.signatures))
    }

    /// Keep the signatures the registry gave for the manifest `hex`,
    /// replacing those kept before (written whole, like the rest).
    pub fn put_signatures(
        &self,
        hex: &str,
        signatures: &[signature::Signature],
    ) -> Result<(), OciError> {
        let name = signatures_name(hex);
        let bytes = serde_json::to_vec_pretty(&signature::Signatures {
            signatures: signatures.to_vec(),
        })
        .expect("signatures serialize");
        self.dir
            .write_file(&name, &bytes, 0o600)
            .map_err(|e| OciError::StoreWrite {
                path: self.path().join(&name),
                reason: e.to_string(),
            })
    }

    /// Keep a verified artifact: the layer first, then the manifest that
    /// names it, each written whole (a temporary file renamed into place,
    /// replacing whatever was there, a link included). The plugin file's
    /// path.
    pub fn put(&self, artifact: &Artifact) -> Result<PathBuf, OciError> {
        let hex = artifact
            .reference
            .digest()
            .expect("an artifact's reference is pinned");
        for (name, bytes) in [
            (layer_name(&artifact.wasm_sha256), &artifact.wasm),
            (manifest_name(hex), &artifact.manifest),
        ] {
            self.dir
                .write_file(&name, bytes, 0o600)
                .map_err(|e| OciError::StoreWrite {
                    path: self.path().join(&name),
                    reason: e.to_string(),
                })?;
        }
        Ok(self.path().join(layer_name(&artifact.wasm_sha256)))
    }
}

/// The pinned references a host loads, and where and how it gets them.
#[derive(Debug, Clone, Default)]
pub struct PinnedPlugins {
    /// Every one pins a digest ([`PluginRef::require_digest`]).
    pub references: Vec<PluginRef>,
    /// The store; `None` when the default has no place (no HOME).
    pub store: Option<PathBuf>,
    pub registry: RegistryOptions,
    /// Whose signatures each reference needs (`[plugin_trust]`).
    pub trust: TrustPolicy,
}

/// A pinned reference's plugin file in the store, verified, and who signed
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedFile {
    pub reference: PluginRef,
    pub path: PathBuf,
    /// The configured keys whose signatures of this digest verified (empty
    /// when no trust rule covers the reference).
    pub signers: Vec<Signer>,
}

impl PinnedFile {
    /// `REFERENCE signed by KEY (signed as ...)`, or `REFERENCE (no
    /// signature checked)`: what `plugin inspect` and the log show.
    pub fn describe(&self) -> String {
        if self.signers.is_empty() {
            format!("{} (no signature checked)", self.reference)
        } else {
            let signers: Vec<String> = self.signers.iter().map(Signer::to_string).collect();
            format!("{} signed by {}", self.reference, signers.join(", "))
        }
    }
}

/// What the store holds of the pinned references, judged without a
/// registry ([`PinnedPlugins::stored_files`]).
#[derive(Debug, Clone, Default)]
pub struct StoredPins {
    /// Held, verified, and signed as the trust policy requires.
    pub files: Vec<PinnedFile>,
    /// Not held (or not believed): a start would pull them.
    pub missing: Vec<String>,
    /// Held, but their kept signatures do not meet the trust policy: a
    /// start asks the registry for signatures again, and refuses them if
    /// those do not either. Each is the refusal's message.
    pub refused: Vec<String>,
}

impl PinnedPlugins {
    /// The store's file of each reference it holds verified, in order, and
    /// the references it does not hold (or does not believe), and those
    /// whose kept signatures do not meet the trust policy: read-only, with
    /// no pull, and a missing store is not created.
    pub fn stored_files(&self) -> StoredPins {
        let store = self
            .store
            .as_deref()
            .and_then(|path| Store::open_existing(path).ok());
        let mut pins = StoredPins::default();
        for reference in &self.references {
            let found = match (&store, reference.digest()) {
                (Some(store), Some(hex)) => store
                    .verified(hex)
                    .ok()
                    .flatten()
                    .map(|path| (store, hex, path)),
                _ => None,
            };
            let Some((store, hex, path)) = found else {
                pins.missing.push(reference.to_string());
                continue;
            };
            let kept = store.signatures(hex).ok().flatten();
            match (self.trust.rule_for(reference), kept) {
                (None, _) => pins.files.push(PinnedFile {
                    reference: reference.clone(),
                    path,
                    signers: Vec::new(),
                }),
                // Pulled before its rule required signatures: a start asks
                // the registry for them.
                (Some(rule), None) if rule.required() => {
                    pins.missing.push(reference.to_string());
                }
                (Some(rule), kept) => {
                    match signature::verify(rule, reference, &kept.unwrap_or_default()) {
                        Ok(signers) => pins.files.push(PinnedFile {
                            reference: reference.clone(),
                            path,
                            signers,
                        }),
                        Err(e) => pins.refused.push(e.to_string()),
                    }
                }
            }
        }
        pins
    }

    /// The plugin file of each reference, in order: from the store when it
    /// holds the reference verified, else pulled, verified and stored
    /// first. A reference that can be neither is an error, and nothing is
    /// returned: a pinned plugin the operator asked for is not skipped.
    pub async fn files(&self) -> Result<Vec<PathBuf>, OciError> {
        Ok(self
            .verified_files()
            .await?
            .into_iter()
            .map(|file| file.path)
            .collect())
    }

    /// As [`files`](Self::files), with who signed each. A reference a
    /// trust rule covers that requires a signature is verified before its
    /// file is returned: with the signatures the store kept, else with
    /// those the registry has now (then kept); a reference whose signatures
    /// do not meet its rule is an error ([`OciError::Signature`]) and
    /// nothing is returned. The verification is not remembered: every
    /// start and reload verifies under the policy in force then.
    pub async fn verified_files(&self) -> Result<Vec<PinnedFile>, OciError> {
        if self.references.is_empty() {
            return Ok(Vec::new());
        }
        let store = Store::open(self.store.as_deref().ok_or(OciError::NoStore)?)?;
        let mut registry = None;
        let mut files = Vec::with_capacity(self.references.len());
        for reference in &self.references {
            let hex = reference.digest().ok_or_else(|| OciError::NotPinned {
                reference: reference.to_string(),
            })?;
            let stored = match store.verified(hex) {
                Ok(found) => found,
                Err(why) => {
                    tracing::warn!(%reference, "{why}; pulling it again");
                    None
                }
            };
            let signers = match self.trust.rule_for(reference) {
                Some(rule) => {
                    self.signers(rule, reference, &store, &mut registry, stored.is_none())
                        .await?
                }
                None => Vec::new(),
            };
            let path = match stored {
                Some(path) => path,
                None => {
                    let artifact = Self::registry(&self.registry, &mut registry)?
                        .pull(reference, Tags::Refuse)
                        .await?;
                    tracing::info!(%reference, sha256 = %artifact.wasm_sha256, "plugin pulled and verified");
                    store.put(&artifact)?
                }
            };
            let file = PinnedFile {
                reference: reference.clone(),
                path,
                signers,
            };
            if !file.signers.is_empty() {
                tracing::info!("{}", file.describe());
            }
            files.push(file);
        }
        Ok(files)
    }

    fn registry<'a>(
        options: &RegistryOptions,
        slot: &'a mut Option<Registry>,
    ) -> Result<&'a Registry, OciError> {
        match slot {
            Some(registry) => Ok(registry),
            None => Ok(slot.insert(Registry::new(options)?)),
        }
    }

    /// The keys of `rule` that signed `reference`: from the signatures the
    /// store kept, unless they do not meet the rule, or `fresh` (the
    /// plugin is being pulled) asks for the registry's; then from the
    /// registry's, which are kept. A rule that requires signatures and is
    /// not met is an error.
    async fn signers(
        &self,
        rule: &trust::TrustRule,
        reference: &PluginRef,
        store: &Store,
        registry: &mut Option<Registry>,
        fresh: bool,
    ) -> Result<Vec<Signer>, OciError> {
        let hex = reference.digest().unwrap_or_default();
        let kept = match store.signatures(hex) {
            Ok(kept) => kept,
            Err(why) => {
                tracing::warn!(%reference, "{why}; asking the registry for its signatures");
                None
            }
        };
        let from_store = kept
            .as_deref()
            .map(|kept| signature::verify(rule, reference, kept));
        match from_store {
            Some(Ok(signers)) if !fresh => return Ok(signers),
            Some(Err(_)) | None if !rule.required() && !fresh => return Ok(Vec::new()),
            _ => {}
        }
        let asked = match Self::registry(&self.registry, registry) {
            Ok(registry) => registry.signatures(reference).await,
            Err(e) => Err(e),
        };
        let fetched = match asked {
            Ok(fetched) => fetched,
            Err(e) => {
                // The registry cannot be asked: what the store kept decides.
                return match from_store {
                    Some(Ok(signers)) => Ok(signers),
                    _ if !rule.required() => Ok(Vec::new()),
                    Some(Err(mut refused)) => {
                        refused.failed.push_str(&format!(
                            "; asking the registry for newer signatures failed: {e}"
                        ));
                        Err(refused.into())
                    }
                    None if !fresh => Err(OciError::NoKeptSignatures {
                        reference: reference.to_string(),
                        scope: rule.scope.clone(),
                        reason: e.to_string(),
                    }),
                    None => Err(e),
                };
            }
        };
        store.put_signatures(hex, &fetched.signatures)?;
        Ok(fetched.verify(rule, reference)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// `stored_files` only reads: a missing store is not created, and a
    /// reference it does not hold is returned as unchecked.
    #[test]
    fn stored_files_reads_the_store_and_creates_nothing() {
        let parent = tempfile::tempdir().unwrap();
        let store = parent.path().join("oci");
        let reference: PluginRef = format!("oci://h/r@sha256:{HEX}").parse().unwrap();
        let pinned = PinnedPlugins {
            references: vec![reference.clone()],
            store: Some(store.clone()),
            ..PinnedPlugins::default()
        };
        let pins = pinned.stored_files();
        assert!(pins.files.is_empty());
        assert_eq!(pins.missing, vec![reference.to_string()]);
        assert!(!store.exists(), "the store is not created");
    }

    /// A stored manifest past its bound is refused before it is read.
    #[test]
    fn a_stored_file_past_its_bound_is_not_believed() {
        let parent = tempfile::tempdir().unwrap();
        let store = Store::open(&parent.path().join("oci")).unwrap();
        let name = manifest_name(HEX);
        std::fs::write(store.path().join(&name), vec![b' '; MAX_MANIFEST_BYTES + 1]).unwrap();
        let err = store.verified(HEX).unwrap_err();
        assert!(err.contains(&name), "{err}");
        assert!(
            err.contains(&format!("more than the {MAX_MANIFEST_BYTES}")),
            "{err}"
        );
    }

    #[test]
    fn references_parse_and_print_back() {
        for text in [
            format!("oci://127.0.0.1:5000/acme/net@sha256:{HEX}"),
            "oci://registry.example/acme/net:v1.2".to_owned(),
            "oci://localhost:5000/net:latest".to_owned(),
            "oci://[::1]:5000/net:latest".to_owned(),
            "oci://[::1]/acme/a.b_c-d:latest".to_owned(),
        ] {
            let reference: PluginRef = text.parse().unwrap();
            assert_eq!(reference.to_string(), text);
        }
        let pinned: PluginRef = format!("oci://h/r@sha256:{HEX}").parse().unwrap();
        assert_eq!(pinned.digest(), Some(HEX));
        assert_eq!(pinned.repository, "r");
    }

    #[test]
    fn bad_references_say_what_is_wrong() {
        for (text, says) in [
            ("registry.example/acme:v1".to_owned(), "oci://"),
            ("oci://registry.example".to_owned(), "no repository"),
            ("oci://registry.example/acme".to_owned(), "neither a digest"),
            (
                "oci://registry.example/acme@sha256:abc".to_owned(),
                "64 lowercase",
            ),
            ("oci://registry.example/acme@md5:abc".to_owned(), "sha256"),
            ("oci://registry.example/Acme:v1".to_owned(), "repository"),
            ("oci://registry.example/acme:-v1".to_owned(), "tag"),
            ("oci:///acme:v1".to_owned(), "host"),
            // What the URL the registry is asked at would rewrite into
            // another repository or host than trust scopes see.
            (format!("oci://reg/other/../acme/net@sha256:{HEX}"), "`..`"),
            (format!("oci://reg/acme/./net@sha256:{HEX}"), "`..`"),
            (format!("oci://reg/acme//net@sha256:{HEX}"), "empty"),
            ("oci://reg/acme/-net:v1".to_owned(), "segment"),
            (format!("oci://REG/acme/x@sha256:{HEX}"), "uppercase"),
            (
                format!("oci://Reg.Example:5000/acme/x@sha256:{HEX}"),
                "uppercase",
            ),
            (
                format!("oci://reg.example./acme/x@sha256:{HEX}"),
                "empty label",
            ),
            (
                format!("oci://reg.example.:5000/acme/x@sha256:{HEX}"),
                "empty label",
            ),
            (format!("oci://.reg/acme/x@sha256:{HEX}"), "empty label"),
            ("oci://reg:50x0/acme/x:v1".to_owned(), "port"),
            // Other spellings of the host and port the registry is asked at.
            (
                format!("oci://registry.example:443/acme/x@sha256:{HEX}"),
                "no port 443",
            ),
            (format!("oci://reg:80/acme/x@sha256:{HEX}"), "no port 443"),
            (
                format!("oci://reg:05000/acme/x@sha256:{HEX}"),
                "leading zeros",
            ),
            (
                format!("oci://127.1:5000/acme/x@sha256:{HEX}"),
                "usual form",
            ),
            (
                format!("oci://2130706433/acme/x@sha256:{HEX}"),
                "usual form",
            ),
            (
                format!("oci://[0:0::1]:5000/acme/x@sha256:{HEX}"),
                "usual form",
            ),
        ] {
            let err = text.parse::<PluginRef>().unwrap_err();
            assert!(err.to_string().contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn a_tag_is_refused_where_a_digest_is_required() {
        let tagged: PluginRef = "oci://h/acme:v1".parse().unwrap();
        let err = tagged.require_digest().unwrap_err();
        assert!(matches!(err, OciError::NotPinned { .. }));
        assert!(err.to_string().contains("--allow-tag"), "{err}");
    }

    fn manifest(config: &str, layers: &[(&str, &str, i64)]) -> Vec<u8> {
        let layers: Vec<_> = layers
            .iter()
            .map(|(media_type, digest, size)| {
                serde_json::json!({"mediaType": media_type, "digest": digest, "size": size})
            })
            .collect();
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": config, "digest": format!("sha256:{HEX}"), "size": 2},
            "layers": layers,
        }))
        .unwrap()
    }

    #[test]
    fn only_the_wasm_layout_is_a_plugin() {
        let digest = format!("sha256:{HEX}");
        let layer = plugin_layer(&manifest(
            WASM_CONFIG_MEDIA_TYPE,
            &[(WASM_LAYER_MEDIA_TYPE, &digest, 10)],
        ))
        .unwrap();
        assert_eq!(layer.digest, digest);
        for (bytes, says) in [
            (
                manifest(
                    "application/vnd.oci.image.config.v1+json",
                    &[(WASM_LAYER_MEDIA_TYPE, &digest, 10)],
                ),
                "config has the media type",
            ),
            (
                manifest(
                    WASM_CONFIG_MEDIA_TYPE,
                    &[("application/vnd.oci.image.layer.v1.tar+gzip", &digest, 10)],
                ),
                "layer has the media type",
            ),
            (manifest(WASM_CONFIG_MEDIA_TYPE, &[]), "0 layers"),
            (
                manifest(
                    WASM_CONFIG_MEDIA_TYPE,
                    &[(WASM_LAYER_MEDIA_TYPE, "sha512:00", 10)],
                ),
                "layer digest",
            ),
            (
                manifest(
                    WASM_CONFIG_MEDIA_TYPE,
                    &[(WASM_LAYER_MEDIA_TYPE, &digest, 1 << 40)],
                ),
                "declares",
            ),
            (b"{}".to_vec(), "not an image manifest"),
        ] {
            let err = plugin_layer(&bytes).unwrap_err();
            assert!(err.contains(says), "{says}: {err}");
        }
    }
}
