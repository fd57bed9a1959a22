//! The precompiled-plugin cache: compile once, load in milliseconds after a
//! restart.
//!
//! An entry is keyed by the plugin's sha256 and the engine's compatibility
//! hash (wasmtime version and every setting that changes the code), so a
//! changed plugin or a changed engine never hits a stale entry. Each
//! artifact has a sidecar with its own sha256, checked before the artifact
//! is deserialized: deserializing is only sound for artifacts this host
//! wrote, and a torn or corrupted file is rebuilt, never trusted. Writes go
//! to a temporary file that is renamed into place. The cache is an
//! optimisation: if it cannot be written the host compiles and goes on.

use std::fs;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Where the cache lives unless `--cache-dir` says otherwise.
pub const DEFAULT_CACHE_DIR: &str = "/var/cache/cocoon-fixup";

/// What happened on a lookup, for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    Hit,
    /// Not there: compiled and stored.
    Miss,
    /// There but unusable (checksum or engine mismatch): compiled again.
    Rebuilt,
}

/// A directory of precompiled plugins for one engine configuration.
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: PathBuf,
    engine_key: String,
}

impl ArtifactCache {
    pub fn new(dir: PathBuf, engine: &Engine) -> Self {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        ArtifactCache {
            dir,
            engine_key: format!("{:016x}", hasher.finish()),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The artifact path for a plugin digest.
    pub fn entry_path(&self, plugin_sha256: &str) -> PathBuf {
        self.dir
            .join(format!("{plugin_sha256}-{}.cwasm", self.engine_key))
    }

    fn sum_path(artifact: &Path) -> PathBuf {
        artifact.with_extension("cwasm.sha256")
    }

    /// The compiled component for `wasm`, from the cache when a verified
    /// entry exists, else compiled and stored.
    pub fn load_or_compile(
        &self,
        engine: &Engine,
        wasm: &[u8],
        plugin_sha256: &str,
    ) -> wasmtime::Result<Component> {
        self.lookup(engine, wasm, plugin_sha256).map(|(c, _)| c)
    }

    /// As [`load_or_compile`](Self::load_or_compile), saying what happened.
    pub fn lookup(
        &self,
        engine: &Engine,
        wasm: &[u8],
        plugin_sha256: &str,
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        let path = self.entry_path(plugin_sha256);
        let mut outcome = CacheOutcome::Miss;
        if let Ok(artifact) = fs::read(&path) {
            match self.verified(engine, &path, &artifact) {
                Some(component) => return Ok((component, CacheOutcome::Hit)),
                None => {
                    tracing::warn!(path = %path.display(), "precompiled plugin failed verification; rebuilding it");
                    outcome = CacheOutcome::Rebuilt;
                }
            }
        }
        let artifact = engine.precompile_component(wasm)?;
        if let Err(e) = self.store(&path, &artifact) {
            tracing::warn!(dir = %self.dir.display(), "cannot write the plugin cache ({e}); plugins will be compiled at every start");
        }
        #[allow(unsafe_code)]
        // SAFETY: `artifact` was produced just now by this engine's
        // `precompile_component`.
        let component = unsafe { Component::deserialize(engine, &artifact)? };
        Ok((component, outcome))
    }

    fn verified(&self, engine: &Engine, path: &Path, artifact: &[u8]) -> Option<Component> {
        let recorded = fs::read_to_string(Self::sum_path(path)).ok()?;
        let actual = hex::encode(Sha256::digest(artifact));
        if recorded.trim() != actual {
            return None;
        }
        #[allow(unsafe_code)]
        // SAFETY: the artifact's checksum matches the one this host wrote
        // beside it when it precompiled it with an engine of the same
        // compatibility hash (part of the file name); wasmtime additionally
        // checks the engine configuration recorded in the artifact.
        let component = unsafe { Component::deserialize(engine, artifact) };
        component.ok()
    }

    fn store(&self, path: &Path, artifact: &[u8]) -> std::io::Result<()> {
        create_private_dir(&self.dir)?;
        let sum = hex::encode(Sha256::digest(artifact));
        write_atomically(&Self::sum_path(path), sum.as_bytes())?;
        write_atomically(path, artifact)
    }
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map(drop).map_err(|e| e.error)
}
