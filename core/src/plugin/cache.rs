//! The precompiled-plugin cache: compile once, load in milliseconds after a
//! restart.
//!
//! A cache entry is native code the host deserializes and runs, so it must
//! be one this host wrote for this plugin. What makes it so:
//!
//! - **The directory is the host's own** ([`TrustedDir`]): it and every
//!   directory above it are owned by root or the effective user and not
//!   writable by others (a root-owned sticky ancestor such as `/tmp`
//!   excepted); the cache directory itself must be the effective user's.
//!   It is created 0700. Entries are opened without following links.
//! - **Every entry is authenticated** with a MAC under a key only the
//!   host's user can read ([`CacheKey`]; keyed BLAKE3 for the artifacts,
//!   HMAC-SHA256 for the describe records), over the plugin's sha256, the
//!   engine's compatibility key and the artifact bytes. An entry copied
//!   from another plugin, another engine or another key, or changed in any
//!   byte, fails the check and is compiled again; a checksum beside the
//!   artifact would only catch corruption, since whoever can swap the
//!   artifact can swap its checksum too.
//!
//! An entry is named `<plugin sha256>-<engine key>.v2.cwasm` and holds the
//! artifact, then [`MAGIC`] and the 32-byte MAC as a trailer: the artifact
//! starts at the file's first byte, so wasmtime maps the file and runs its
//! code in place instead of copying it ([`ArtifactCache::lookup`]). The
//! MAC is checked once, when the entry is loaded: from then on the code
//! and the initial memory of that plugin are read from the entry's pages,
//! so an entry is never written in place (the host writes by rename; an
//! operator deletes entries rather than copying over them). Entries of
//! the earlier format had the name without `.v2` and are removed when
//! the new entry is written. Beside it,
//! `<plugin sha256>-<engine key>.describe` holds [`RECORD_MAGIC`], its MAC
//! and what the plugin's `describe` returned (JSON), so a start from the
//! cache registers every plugin without deserializing or instantiating it,
//! and loads the artifact of only the plugins it calls. Writes go to a new
//! temporary file that is renamed into place.
//!
//! The cache is an optimisation: a directory or key that is refused, or a
//! cache that cannot be read or written, is a warning (one a process,
//! [`warn_once`]) and the host compiles instead
//! ([`PluginHost::new`](super::PluginHost::new)).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use wasmtime::Engine;
use wasmtime::component::Component;

use super::trusted::{TrustedDir, Untrusted, euid};

/// Where the cache lives unless `--cache-dir` says otherwise.
pub const DEFAULT_CACHE_DIR: &str = "/var/cache/cocoon-fixup";

/// Where root keeps the cache key unless `--cache-key` says otherwise.
/// Another user's default is `cocoon-fixup/cache.key` under
/// `$XDG_STATE_HOME`, else under `~/.local/state` ([`default_key_path`]).
pub const DEFAULT_KEY_FILE: &str = "/var/lib/cocoon-fixup/cache.key";

/// The trailer of every entry, before its MAC: the format's name and
/// version. (Version 1 put it and the MAC first.)
pub const MAGIC: &[u8; 8] = b"cfxc\0v2\0";

/// The first bytes of a describe record (`<plugin sha256>-<engine
/// key>.describe`): what the plugin's `describe` (and `policy`) returned
/// when it was first loaded, so a later start can register the plugin and
/// select it without instantiating it. Authenticated like an artifact.
pub const RECORD_MAGIC: &[u8; 8] = b"cfxd\0v1\0";

/// Length of the key, and of the MAC.
const KEY_BYTES: usize = 32;

/// The BLAKE3 key-derivation context of the entries' MAC key.
const ENTRY_KEY_CONTEXT: &str = "cocoon-fixup 2026 precompiled plugin cache entry v2";

/// What happened on a lookup, for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    Hit,
    /// Not there: compiled and stored.
    Miss,
    /// There but unusable (failed authentication, or not a file the host
    /// trusts): compiled again and replaced.
    Rebuilt,
}

/// Why the cache cannot be used. Each is a warning: the host compiles
/// every plugin instead.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("plugin cache directory refused: {0}")]
    Dir(Untrusted),
    #[error("plugin cache key refused: {0}")]
    Key(Untrusted),
    #[error(
        "plugin cache key {} may be read or written by its group or others (mode {mode:04o}): run `chmod 600 {}`",
        path.display(),
        path.display()
    )]
    KeyMode { path: PathBuf, mode: u32 },
    #[error(
        "plugin cache key {} is owned by uid {owner}, not by uid {euid} that cocoon-fixup runs as: remove it, and a new key is made at the next start",
        path.display()
    )]
    KeyOwner {
        path: PathBuf,
        owner: u32,
        euid: u32,
    },
    #[error(
        "plugin cache key {} holds {len} bytes, not {KEY_BYTES}: remove it, and a new key is made at the next start",
        path.display()
    )]
    KeyLength { path: PathBuf, len: usize },
    #[error(
        "plugin cache key {} is inside the cache directory {}: keep it apart (--cache-key)",
        key.display(),
        dir.display()
    )]
    KeyInsideCache { key: PathBuf, dir: PathBuf },
    #[error(
        "no place for the plugin cache key: set --cache-key (HOME and XDG_STATE_HOME are unset)"
    )]
    NoKeyPath,
    #[error("cannot create the plugin cache key {}: {source}", path.display())]
    KeyWrite {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl CacheError {
    /// Whether this refusal may mean someone changed what the host trusts
    /// (a key or directory with the wrong owner, mode, size or a link on
    /// its path): such a refusal is a warning every time. The others (no
    /// place, an I/O error) are [`warn_once`].
    pub fn is_refusal(&self) -> bool {
        match self {
            CacheError::Dir(u) | CacheError::Key(u) => !u.is_io(),
            CacheError::KeyMode { .. }
            | CacheError::KeyOwner { .. }
            | CacheError::KeyLength { .. }
            | CacheError::KeyInsideCache { .. } => true,
            CacheError::NoKeyPath | CacheError::KeyWrite { .. } => false,
        }
    }
}

/// A cache entry that could not be read: a refused entry (a link, another
/// owner, a mode others may write) is a warning every time, naming it; an
/// I/O error is [`warn_once`].
fn entry_not_used(dir: &Path, name: &str, e: &Untrusted, what: &str) {
    if e.is_io() {
        warn_once(format_args!("{what} not used: {e}"));
    } else {
        tracing::warn!(path = %dir.join(name).display(), "{what} refused: {e}");
    }
}

/// Whether this process has warned about the cache yet ([`warn_once`]).
static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Report that the cache cannot be used, or not for one entry: the first
/// such report in the process is a warning, the others are logged at
/// `debug`. A cache that fails for every plugin (a directory that cannot
/// be read or written) is then one line, not one a plugin, and a daemon
/// that rebuilds its plugin host at each reload does not repeat it.
/// (An entry that fails authentication or is refused, and a key or
/// directory refused on its owner, mode or a link, are not this: they
/// are a warning each time, naming the file; see
/// [`CacheError::is_refusal`].)
pub fn warn_once(problem: std::fmt::Arguments<'_>) {
    if WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::debug!("{problem}");
    } else {
        tracing::warn!(
            "{problem} (further plugin cache problems of this process are logged at debug level)"
        );
    }
}

/// Whose cache a command uses when `--cache-dir` and `--cache-key` are
/// not given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOwner {
    /// The node's (`run`, `serve`, an embedder): [`DEFAULT_CACHE_DIR`] and
    /// [`DEFAULT_KEY_FILE`] as root, the user's own for anyone else.
    Node,
    /// The person at the terminal (`plan`, `capture`, `plugin test`,
    /// `plugin inspect`): always the user's own, root included, so that
    /// what a development build compiles never lands in the node's cache.
    User,
}

/// A cache directory and its key; either is `None` when there is no
/// place for it (HOME and the XDG variable unset).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CachePaths {
    pub dir: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// The default cache directory and key of `owner` when the effective user
/// is `euid` and `var` reads the environment: the system paths for the
/// node as root; else `$XDG_CACHE_HOME/cocoon-fixup` (or
/// `~/.cache/cocoon-fixup`) and `$XDG_STATE_HOME/cocoon-fixup/cache.key`
/// (or `~/.local/state/cocoon-fixup/cache.key`). An empty variable counts
/// as unset.
pub fn default_paths(
    owner: CacheOwner,
    euid: u32,
    var: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> CachePaths {
    if owner == CacheOwner::Node && euid == 0 {
        return CachePaths {
            dir: Some(PathBuf::from(DEFAULT_CACHE_DIR)),
            key: Some(PathBuf::from(DEFAULT_KEY_FILE)),
        };
    }
    let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let under =
        |xdg: &str, in_home: &str| set(xdg).or_else(|| set("HOME").map(|home| home.join(in_home)));
    CachePaths {
        dir: under("XDG_CACHE_HOME", ".cache").map(|d| d.join("cocoon-fixup")),
        key: under("XDG_STATE_HOME", ".local/state")
            .map(|d| d.join("cocoon-fixup").join("cache.key")),
    }
}

/// The node's default key file for the user the host runs as
/// ([`default_paths`] of [`CacheOwner::Node`]).
pub fn default_key_path() -> Option<PathBuf> {
    default_paths(CacheOwner::Node, euid(), |v| std::env::var_os(v)).key
}

/// The node's default cache directory for the user the host runs as
/// ([`default_paths`] of [`CacheOwner::Node`]); `None` (no cache) when
/// neither HOME nor XDG_CACHE_HOME is set.
pub fn default_cache_dir() -> Option<PathBuf> {
    default_paths(CacheOwner::Node, euid(), |v| std::env::var_os(v)).dir
}

/// The secret that authenticates cache entries: 32 random bytes in a file
/// owned by the effective user with no permission for group or others
/// (0600), kept outside the cache directory, so that whoever can write
/// the cache cannot forge an entry.
pub struct CacheKey {
    path: PathBuf,
    bytes: [u8; KEY_BYTES],
}

impl std::fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheKey")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl CacheKey {
    /// Read the key at `path`, or create it (0600, its directory 0700 if
    /// missing) on first use. Its directory must pass the rules of
    /// [`TrustedDir`] and not be inside `cache_dir`; the file must be a
    /// regular file owned by the effective user with no group or other
    /// permission.
    pub fn load_or_create(path: &Path, cache_dir: &Path) -> Result<Self, CacheError> {
        let (dir, name) = match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
            (Some(dir), Some(name)) if !dir.as_os_str().is_empty() => (dir, name),
            _ => {
                return Err(CacheError::Key(Untrusted::Kind {
                    path: path.to_owned(),
                    expected: "file path with a directory",
                }));
            }
        };
        let dir = TrustedDir::create(dir).map_err(CacheError::Key)?;
        let key_path = dir.path().join(name);
        if dir.path().starts_with(cache_dir) {
            return Err(CacheError::KeyInsideCache {
                key: key_path,
                dir: cache_dir.to_owned(),
            });
        }
        if dir.open_file(name).map_err(CacheError::Key)?.is_none() {
            let mut bytes = [0u8; KEY_BYTES];
            rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()).map_err(
                |e| CacheError::KeyWrite {
                    path: key_path.clone(),
                    source: e.into(),
                },
            )?;
            // Another process may have made it meanwhile: then read theirs.
            dir.create_file(name, &bytes, 0o600)
                .map_err(|source| CacheError::KeyWrite {
                    path: key_path.clone(),
                    source,
                })?;
        }
        let (mut file, stat) = dir
            .open_file(name)
            .map_err(CacheError::Key)?
            .ok_or_else(|| CacheError::KeyWrite {
                path: key_path.clone(),
                source: std::io::ErrorKind::NotFound.into(),
            })?;
        if stat.st_uid != euid() {
            return Err(CacheError::KeyOwner {
                path: key_path,
                owner: stat.st_uid,
                euid: euid(),
            });
        }
        let mode = stat.st_mode & 0o7777;
        if mode & 0o077 != 0 {
            return Err(CacheError::KeyMode {
                path: key_path,
                mode,
            });
        }
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut bytes).map_err(|e| {
            CacheError::Key(Untrusted::Io {
                path: key_path.clone(),
                source: e,
            })
        })?;
        let bytes: [u8; KEY_BYTES] =
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| CacheError::KeyLength {
                    path: key_path.clone(),
                    len: bytes.len(),
                })?;
        Ok(CacheKey {
            path: key_path,
            bytes,
        })
    }

    /// The key file's resolved path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A directory of precompiled plugins for one engine configuration.
pub struct ArtifactCache {
    dir: TrustedDir,
    key: CacheKey,
    /// The entries' BLAKE3 key, derived from [`CacheKey`] (the describe
    /// records use the key itself, with HMAC-SHA256).
    entry_key: [u8; KEY_BYTES],
    engine_key: String,
}

impl std::fmt::Debug for ArtifactCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the keys.
        f.debug_struct("ArtifactCache")
            .field("dir", &self.dir)
            .field("key", &self.key)
            .field("engine_key", &self.engine_key)
            .finish_non_exhaustive()
    }
}

impl ArtifactCache {
    /// Open (or create, 0700) the cache at `dir` with the key at `key`
    /// (created on first use; `None` is [`default_key_path`]). Refused when
    /// the directory or the key break the rules above.
    pub fn open(dir: &Path, key: Option<&Path>, engine: &Engine) -> Result<Self, CacheError> {
        let dir = TrustedDir::create(dir).map_err(CacheError::Dir)?;
        let owner = dir.owner().map_err(CacheError::Dir)?;
        if owner != euid() {
            // Root's directory is safe, but not this user's to write.
            return Err(CacheError::Dir(Untrusted::Owner {
                path: dir.path().to_owned(),
                owner,
                euid: euid(),
            }));
        }
        let key_path = match key {
            Some(path) => path.to_owned(),
            None => default_key_path().ok_or(CacheError::NoKeyPath)?,
        };
        let key = CacheKey::load_or_create(&key_path, dir.path())?;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Ok(ArtifactCache {
            dir,
            entry_key: blake3::derive_key(ENTRY_KEY_CONTEXT, &key.bytes),
            key,
            engine_key: format!("{:016x}", hasher.finish()),
        })
    }

    /// The cache directory's resolved path.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The file name of a plugin's entry. The format is in the name, so
    /// an older binary sharing the cache (a rollback, an older `plan`)
    /// neither reads nor overwrites it.
    fn entry_name(&self, plugin_sha256: &str) -> String {
        format!("{plugin_sha256}-{}.v2.cwasm", self.engine_key)
    }

    /// The file name the earlier formats used (MAC first; before that, a
    /// checksum file beside it): removed when the entry is written.
    fn earlier_entry_name(&self, plugin_sha256: &str) -> String {
        format!("{plugin_sha256}-{}.cwasm", self.engine_key)
    }

    /// The artifact path for a plugin digest.
    pub fn entry_path(&self, plugin_sha256: &str) -> PathBuf {
        self.dir.path().join(self.entry_name(plugin_sha256))
    }

    /// The file name of a plugin's describe record.
    fn record_name(&self, plugin_sha256: &str) -> String {
        format!("{plugin_sha256}-{}.describe", self.engine_key)
    }

    /// The describe record path for a plugin digest.
    pub fn record_path(&self, plugin_sha256: &str) -> PathBuf {
        self.dir.path().join(self.record_name(plugin_sha256))
    }

    /// The MAC over what an entry stands for and holds.
    /// Keyed BLAKE3 rather than HMAC-SHA256: the artifact is 300 KB and
    /// checked on every load, and this took half the samples HMAC-SHA256
    /// did in a profile of `plan` (BENCHMARKS.md).
    fn mac(&self, plugin_sha256: &str, artifact: &[u8]) -> blake3::Hash {
        let mut mac = blake3::Hasher::new_keyed(&self.entry_key);
        for part in [
            MAGIC.as_slice(),
            plugin_sha256.as_bytes(),
            b"\0",
            self.engine_key.as_bytes(),
            b"\0",
        ] {
            mac.update(part);
        }
        mac.update(artifact);
        mac.finalize()
    }

    fn mac_of(&self, magic: &[u8; 8], plugin_sha256: &str, body: &[u8]) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.key.bytes).expect("HMAC takes keys of any length");
        for part in [
            magic.as_slice(),
            plugin_sha256.as_bytes(),
            b"\0",
            self.engine_key.as_bytes(),
            b"\0",
        ] {
            mac.update(part);
        }
        mac.update(body);
        mac
    }

    /// The describe record of a plugin, when an authenticated one exists.
    /// A record that fails authentication or cannot be read is logged and
    /// ignored: the caller describes the plugin again and stores a new one.
    pub fn record(&self, plugin_sha256: &str) -> Option<Vec<u8>> {
        let name = self.record_name(plugin_sha256);
        let entry = match self.dir.read_file(&name) {
            Ok(entry) => entry?,
            Err(e) => {
                entry_not_used(
                    self.dir.path(),
                    &name,
                    &e,
                    "plugin describe record (describing it again)",
                );
                return None;
            }
        };
        let verified = entry
            .strip_prefix(RECORD_MAGIC.as_slice())
            .and_then(|rest| rest.split_at_checked(KEY_BYTES))
            .filter(|(tag, body)| {
                self.mac_of(RECORD_MAGIC, plugin_sha256, body)
                    .verify_slice(tag)
                    .is_ok()
            })
            .map(|(_, body)| body.to_vec());
        if verified.is_none() {
            tracing::warn!(path = %self.dir.path().join(&name).display(), "plugin describe record failed authentication; describing it again");
        }
        verified
    }

    /// Store a plugin's describe record. Best effort, like every write to
    /// the cache: a failure is a warning.
    pub fn store_record(&self, plugin_sha256: &str, body: &[u8]) {
        let tag = self
            .mac_of(RECORD_MAGIC, plugin_sha256, body)
            .finalize()
            .into_bytes();
        let mut entry = Vec::with_capacity(RECORD_MAGIC.len() + tag.len() + body.len());
        entry.extend_from_slice(RECORD_MAGIC);
        entry.extend_from_slice(&tag);
        entry.extend_from_slice(body);
        if let Err(e) = self
            .dir
            .write_file(&self.record_name(plugin_sha256), &entry, 0o600)
        {
            warn_once(format_args!(
                "cannot write a plugin describe record in {} ({e}); plugins are described at every start",
                self.dir.path().display()
            ));
        }
    }

    /// The compiled component for `wasm`, from the cache when an
    /// authenticated entry exists, else compiled and stored.
    pub fn load_or_compile(
        &self,
        engine: &Engine,
        wasm: &[u8],
        plugin_sha256: &str,
    ) -> wasmtime::Result<Component> {
        self.lookup(engine, wasm, plugin_sha256).map(|(c, _)| c)
    }

    /// As [`load_or_compile`](Self::load_or_compile), saying what happened.
    ///
    /// A hit is checked and loaded without copying the artifact: the entry
    /// is opened once (no link followed, a regular file of the host's user
    /// or root that no one else may write, [`TrustedDir::open_file`]), that
    /// open file is mapped read-only and its MAC checked over the mapping,
    /// and wasmtime then maps the same open file (`/proc/self/fd`), not the
    /// name again, so a file renamed into place meanwhile is not what runs.
    pub fn lookup(
        &self,
        engine: &Engine,
        wasm: &[u8],
        plugin_sha256: &str,
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        let name = self.entry_name(plugin_sha256);
        let outcome = match self.dir.open_file(&name) {
            Ok(None) => CacheOutcome::Miss,
            Ok(Some((file, stat))) => match self.verified(engine, plugin_sha256, &file, &stat) {
                Ok(component) => return Ok((component, CacheOutcome::Hit)),
                Err(why) => {
                    tracing::warn!(path = %self.dir.path().join(&name).display(), "precompiled plugin {why}; compiling it again");
                    CacheOutcome::Rebuilt
                }
            },
            Err(e) => {
                entry_not_used(
                    self.dir.path(),
                    &name,
                    &e,
                    "precompiled plugin (compiling it again)",
                );
                CacheOutcome::Rebuilt
            }
        };
        let artifact = engine.precompile_component(wasm)?;
        if let Err(e) = self.store(&name, plugin_sha256, &artifact) {
            warn_once(format_args!(
                "cannot write the plugin cache {} ({e}); plugins will be compiled at every start",
                self.dir.path().display()
            ));
        }
        #[allow(unsafe_code)]
        // SAFETY: `artifact` was produced just now by this engine's
        // `precompile_component`.
        let component = unsafe { Component::deserialize(engine, &artifact)? };
        Ok((component, outcome))
    }

    /// The component of an open entry, when its trailer and MAC hold; else
    /// why not, for the warning.
    fn verified(
        &self,
        engine: &Engine,
        plugin_sha256: &str,
        file: &std::fs::File,
        stat: &rustix::fs::Stat,
    ) -> Result<Component, &'static str> {
        let len = usize::try_from(stat.st_size)
            .ok()
            .filter(|&len| len <= MAX_ENTRY_BYTES)
            .ok_or("is too large to be an entry")?;
        let trailer = MAGIC.len() + KEY_BYTES;
        if len <= trailer {
            return Err("is too short to be an entry");
        }
        let bytes = EntryBytes::of(file, len)?;
        let (artifact, rest) = bytes.bytes().split_at(len - trailer);
        let (magic, tag) = rest.split_at(MAGIC.len());
        let tag: [u8; KEY_BYTES] = tag.try_into().map_err(|_| "is not an entry")?;
        // `blake3::Hash` compares in constant time.
        if magic != MAGIC.as_slice()
            || self.mac(plugin_sha256, artifact) != blake3::Hash::from_bytes(tag)
        {
            return Err("failed authentication");
        }
        match same_file_by_descriptor(file, stat) {
            Ok(path) => {
                #[allow(unsafe_code)]
                // SAFETY: the MAC under the host's key proves this host
                // wrote these bytes as the artifact of this plugin for an
                // engine of the same compatibility hash; wasmtime
                // additionally checks the engine configuration recorded in
                // the artifact. `path` is the open file just checked (its
                // device and inode), which only its owner (the host's user)
                // or root may write. The file holds the artifact and the
                // trailer after it, which wasmtime's reader does not look
                // at.
                let mapped = unsafe { Component::deserialize_file(engine, &path) };
                match mapped {
                    Ok(component) => return Ok(component),
                    Err(e) => not_mapped(format_args!("{e:#}")),
                }
            }
            Err(why) => not_mapped(format_args!("{why}")),
        }
        #[allow(unsafe_code)]
        // SAFETY: as above; these are the very bytes checked, copied.
        unsafe { Component::deserialize(engine, artifact) }.map_err(|e| {
            tracing::debug!("loading the checked precompiled plugin: {e:#}");
            "could not be loaded"
        })
    }

    fn store(&self, name: &str, plugin_sha256: &str, artifact: &[u8]) -> std::io::Result<()> {
        let tag = *self.mac(plugin_sha256, artifact).as_bytes();
        let mut entry = Vec::with_capacity(artifact.len() + MAGIC.len() + tag.len());
        entry.extend_from_slice(artifact);
        entry.extend_from_slice(MAGIC);
        entry.extend_from_slice(&tag);
        self.dir.write_file(name, &entry, 0o600)?;
        // What the earlier formats left under the earlier name: the entry
        // with its MAC first, and before entries were authenticated, a
        // checksum file beside it.
        let earlier = self.earlier_entry_name(plugin_sha256);
        self.dir.remove(&earlier)?;
        self.dir.remove(&format!("{earlier}.sha256"))
    }
}

/// The most an entry may hold (the built-ins' are about 300 KB): a larger
/// file is refused before it is read.
const MAX_ENTRY_BYTES: usize = 64 << 20;

/// `/proc/self/fd/N` of `file`, when that path is `file` (its device and
/// inode): wasmtime 48 maps a component by path only, and a `/proc` that
/// is not the kernel's must not hand it another file.
fn same_file_by_descriptor(
    file: &std::fs::File,
    opened: &rustix::fs::Stat,
) -> Result<String, String> {
    let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(file));
    let found = rustix::fs::stat(path.as_str()).map_err(|e| format!("{path}: {e}"))?;
    if (found.st_dev, found.st_ino) == (opened.st_dev, opened.st_ino) {
        Ok(path)
    } else {
        Err(format!("{path} is not the entry opened"))
    }
}

/// Say once, at info, why checked entries are copied rather than mapped
/// (no `/proc`, a `noexec` cache mount): slower starts, nothing unsafe.
fn not_mapped(why: std::fmt::Arguments<'_>) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::debug!("a checked precompiled plugin is copied, not mapped: {why}");
    } else {
        tracing::info!(
            "checked precompiled plugins are copied, not mapped ({why}); starts are slower, nothing else changes"
        );
    }
}

/// The bytes of an open entry: mapped, or read where the file system
/// cannot map it.
enum EntryBytes {
    Mapped(Mapping),
    Read(Vec<u8>),
}

impl EntryBytes {
    fn of(file: &std::fs::File, len: usize) -> Result<Self, &'static str> {
        if let Ok(map) = Mapping::of(file, len) {
            return Ok(EntryBytes::Mapped(map));
        }
        let mut bytes = Vec::with_capacity(len);
        std::io::Read::read_to_end(&mut std::io::Read::take(file, len as u64), &mut bytes)
            .map_err(|_| "could not be read")?;
        if bytes.len() != len {
            return Err("changed while it was read");
        }
        Ok(EntryBytes::Read(bytes))
    }

    fn bytes(&self) -> &[u8] {
        match self {
            EntryBytes::Mapped(map) => map.bytes(),
            EntryBytes::Read(bytes) => bytes,
        }
    }
}

/// An open file mapped read-only and private, unmapped when dropped.
struct Mapping {
    ptr: std::ptr::NonNull<std::ffi::c_void>,
    len: usize,
}

impl Mapping {
    /// Map the first `len` bytes (non-zero) of `file`.
    fn of(file: &std::fs::File, len: usize) -> std::io::Result<Self> {
        debug_assert!(len > 0, "an empty mapping");
        #[allow(unsafe_code)]
        // SAFETY: a new mapping at an address the kernel picks, read-only;
        // nothing else refers to it.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ,
                rustix::mm::MapFlags::PRIVATE,
                file,
                0,
            )?
        };
        let ptr = std::ptr::NonNull::new(ptr).ok_or(std::io::ErrorKind::InvalidData)?;
        Ok(Mapping { ptr, len })
    }

    fn bytes(&self) -> &[u8] {
        #[allow(unsafe_code)]
        // SAFETY: `len` readable bytes are mapped at `ptr` until drop. (A
        // file shortened meanwhile makes reading past its end fault: the
        // entry's owner can do that, no one else may write it.)
        unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr().cast::<u8>(), self.len)
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        #[allow(unsafe_code)]
        // SAFETY: mapped by `of` with this length, and no slice of it
        // outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    /// An environment of these variables only.
    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let vars: Vec<(String, OsString)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    fn paths(dir: &str, key: &str) -> CachePaths {
        CachePaths {
            dir: Some(PathBuf::from(dir)),
            key: Some(PathBuf::from(key)),
        }
    }

    #[test]
    fn the_node_as_root_uses_the_system_paths() {
        let home = env(&[("HOME", "/root")]);
        assert_eq!(
            default_paths(CacheOwner::Node, 0, &home),
            paths(DEFAULT_CACHE_DIR, DEFAULT_KEY_FILE)
        );
    }

    #[test]
    fn a_person_uses_their_own_even_as_root() {
        let home = env(&[("HOME", "/root")]);
        let own = paths(
            "/root/.cache/cocoon-fixup",
            "/root/.local/state/cocoon-fixup/cache.key",
        );
        assert_eq!(default_paths(CacheOwner::User, 0, &home), own);
        let home = env(&[("HOME", "/home/ada")]);
        for owner in [CacheOwner::User, CacheOwner::Node] {
            assert_eq!(
                default_paths(owner, 1000, &home),
                paths(
                    "/home/ada/.cache/cocoon-fixup",
                    "/home/ada/.local/state/cocoon-fixup/cache.key"
                ),
                "{owner:?} as another user"
            );
        }
    }

    #[test]
    fn xdg_variables_win_and_empty_ones_count_as_unset() {
        let vars = env(&[
            ("HOME", "/home/ada"),
            ("XDG_CACHE_HOME", "/fast/cache"),
            ("XDG_STATE_HOME", ""),
        ]);
        assert_eq!(
            default_paths(CacheOwner::User, 0, &vars),
            paths(
                "/fast/cache/cocoon-fixup",
                "/home/ada/.local/state/cocoon-fixup/cache.key"
            )
        );
    }

    #[test]
    fn no_home_is_no_place() {
        assert_eq!(
            default_paths(CacheOwner::User, 0, env(&[("HOME", "")])),
            CachePaths::default()
        );
        let only_cache = default_paths(CacheOwner::User, 1000, env(&[("XDG_CACHE_HOME", "/c")]));
        assert_eq!(
            only_cache.dir.as_deref(),
            Some(Path::new("/c/cocoon-fixup"))
        );
        assert_eq!(only_cache.key, None);
    }
}
