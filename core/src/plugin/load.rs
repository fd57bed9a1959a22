//! Reading plugin files: the plugin directory and its trust rules, the
//! contract check and the describe call a plugin is registered by, and
//! the load failures.

use super::*;

/// A plugin directory as the host reads it ([`read_plugin_dir`]).
#[derive(Debug)]
pub enum PluginDir {
    /// The directory breaks the rules of [`trusted`]: none of its files is
    /// read, and this is its one load failure.
    Refused(Untrusted),
    /// Its `*.wasm` files in name order (the order they load in), each with
    /// its bytes or why they could not be read.
    Files(Vec<(PathBuf, Result<Vec<u8>, PluginError>)>),
}

/// Read the `*.wasm` files of `dir` under the rules of [`trusted`], as
/// [`PluginHost::load_dir`] does before it loads them. A directory that
/// cannot be read at all is an error.
pub fn read_plugin_dir(dir: &Path) -> Result<PluginDir, PluginError> {
    let mut files = Vec::new();
    Ok(
        match each_plugin_file(dir, |path, bytes| files.push((path, bytes)))? {
            Some(refused) => PluginDir::Refused(refused),
            None => PluginDir::Files(files),
        },
    )
}

/// Whether the host can list the plugin directory `dir`: an error when it
/// cannot be read at all; no file is read.
pub fn check_plugin_dir(dir: &Path) -> Result<(), PluginError> {
    match TrustedDir::open(dir).and_then(|d| d.entries(".wasm")) {
        Err(Untrusted::Io { source, .. }) => Err(PluginError::Read {
            path: dir.to_owned(),
            cause: source,
        }),
        _ => Ok(()),
    }
}

/// Read the `*.wasm` files of `dir` in name order under the rules of
/// [`trusted`], handing each to `each` before the next is read (so only
/// one file's bytes are held at a time). `Some` when the directory breaks
/// the rules (no file is read); a directory that cannot be read at all is
/// an error.
pub(crate) fn each_plugin_file(
    dir: &Path,
    mut each: impl FnMut(PathBuf, Result<Vec<u8>, PluginError>),
) -> Result<Option<Untrusted>, PluginError> {
    let (trusted, entries) =
        match TrustedDir::open(dir).and_then(|d| d.entries(".wasm").map(|e| (d, e))) {
            Ok(found) => found,
            Err(Untrusted::Io { source, .. }) => {
                return Err(PluginError::Read {
                    path: dir.to_owned(),
                    cause: source,
                });
            }
            Err(e) => return Ok(Some(e)),
        };
    for (name, kind) in entries {
        if kind == rustix::fs::FileType::Directory {
            continue;
        }
        let path = dir.join(&name);
        match trusted.read_file(&name) {
            Ok(Some(bytes)) => each(path, Ok(bytes)),
            // Gone since the listing: nothing to load.
            Ok(None) => {}
            Err(e) => each(path, Err(PluginError::Untrusted(e))),
        }
    }
    Ok(None)
}

/// The bytes of the plugin file at `path`, read under the rules of
/// [`trusted`].
pub fn read_trusted(path: &Path) -> Result<Vec<u8>, PluginError> {
    trusted::read_file(path).map_err(|e| match e {
        Untrusted::Io { source, .. } => PluginError::Read {
            path: path.to_owned(),
            cause: source,
        },
        e => PluginError::Untrusted(e),
    })
}

/// A plugin file that could not be loaded.
#[derive(Debug)]
pub struct LoadFailure {
    pub path: PathBuf,
    pub error: LoadError,
}

impl LoadFailure {
    /// `<label>: <error>`, where `label` names the file (its path, or more):
    /// an error that opens with the path already says it once, with the
    /// label in its place.
    pub fn text(&self, label: &str) -> String {
        let error = self.error.to_string();
        let path = self.path.display().to_string();
        match error.strip_prefix(&path) {
            Some(rest) if rest.starts_with([' ', ':']) => format!("{label}{rest}"),
            _ => format!("{label}: {error}"),
        }
    }
}

/// Why a plugin was not registered.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error(transparent)]
    Conflict(#[from] registry::ConflictError),
}

/// `\0asm`, then version 1, layer 0: a core module.
pub(crate) const CORE_MODULE_HEADER: &[u8] = b"\0asm\x01\0\0\0";

/// `\0asm`, then layer 1: a component (the version half is the component
/// encoding's own, 0x0d while the format is pre-1.0).
pub(crate) fn is_component(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && bytes.starts_with(b"\0asm") && bytes[6..8] == [0x01, 0x00]
}

/// The contract check: the component must export the generator interface
/// at a version this host serves. Returns that version; the newest when it
/// exports several.
pub(crate) fn check_contract(
    engine: &Engine,
    component: &Component,
    origin: &Origin,
) -> Result<Contract, PluginError> {
    let ty = component.component_type();
    let prefix = format!("{GENERATOR_EXPORT}@");
    let mut found = None;
    let mut served = None;
    for (name, _) in ty.exports(engine) {
        if let Some(version) = name.strip_prefix(&prefix) {
            match Contract::parse(version) {
                Some(c) => served = served.max(Some(c)),
                None => found = Some(version.to_owned()),
            }
        } else if name == GENERATOR_EXPORT {
            found = Some("(unversioned)".to_owned());
        }
    }
    if let Some(contract) = served {
        return Ok(contract);
    }
    match found {
        Some(found) => Err(PluginError::ContractMismatch {
            origin: origin.clone(),
            found: crate::facts::escape_controls(truncate_for_message(&found)),
        }),
        None => Err(PluginError::NotAPlugin {
            origin: origin.clone(),
        }),
    }
}

pub(crate) fn describe(
    raw: contract::WitPluginInfo,
    origin: &Origin,
    contract: Contract,
) -> Result<PluginInfo, PluginError> {
    let version = contract.version();
    let bad = |reason: String| PluginError::BadDescription {
        plugin: origin.to_string(),
        reason,
    };
    let name_ok = !raw.name.is_empty()
        && raw.name.len() <= 63
        && raw
            .name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !name_ok {
        return Err(bad(format!(
            "name {:?} must be 1..=63 of a-z, 0-9 and -",
            truncate_for_message(&raw.name)
        )));
    }
    if raw.contract != version {
        return Err(bad(format!(
            "it says contract {:?} but exports the generator of contract {version}",
            truncate_for_message(&raw.contract)
        )));
    }
    if raw.version.is_empty()
        || raw.version.len() > 64
        || raw
            .version
            .chars()
            .any(|c| c.is_control() || crate::facts::is_invisible_format(c))
    {
        return Err(bad(format!(
            "version {:?} must be a short semver string",
            truncate_for_message(&raw.version)
        )));
    }
    if raw.scenarios.is_empty() {
        return Err(bad("it serves no scenario".to_owned()));
    }
    let mut scenarios: Vec<Scenario> = raw
        .scenarios
        .into_iter()
        .map(contract::scenario_from_wit)
        .collect();
    scenarios.sort();
    scenarios.dedup();
    let mut flavors = Vec::new();
    for f in &raw.flavors {
        flavors.push(Flavor::parse(f).map_err(|e| bad(declared_flavor_problem(f, &e)))?);
    }
    flavors.sort();
    flavors.dedup();
    let mut summary = raw.summary;
    summary.retain(|c| !c.is_control() && !crate::facts::is_invisible_format(c));
    summary.truncate(summary.floor_char_boundary(200));
    Ok(PluginInfo {
        name: raw.name,
        version: raw.version,
        contract: raw.contract,
        summary,
        scenarios,
        flavors,
    })
}

/// What to do about a call to a denied import, by the kind of import (the
/// fixes of docs/plugins.md, section 4).
pub(crate) fn denied_import_fix(import: &str) -> &'static str {
    let interface = import.split(['#', '@']).next().unwrap_or(import);
    match interface {
        "wasi:random/random" | "wasi:random/insecure" | "wasi:random/insecure-seed" => {
            "use `BTreeMap`/`BTreeSet` instead of `HashMap`/`HashSet` (whose default hasher asks for a random seed), and derive anything that must be unique from the facts"
        }
        "wasi:clocks/wall-clock" | "wasi:clocks/monotonic-clock" => {
            "do not read a clock (`SystemTime::now`, `Instant::now`): a plan must depend on the facts alone"
        }
        "wasi:cli/stdout"
        | "wasi:cli/stderr"
        | "wasi:cli/stdin"
        | "wasi:cli/terminal-stdout"
        | "wasi:cli/terminal-stderr"
        | "wasi:cli/terminal-stdin"
        | "wasi:io/streams" => {
            "log with `cocoon_fixup_sdk::log` instead of `println!`, `eprintln!` or `dbg!`"
        }
        "wasi:filesystem/preopens" | "wasi:filesystem/types" | "wasi:cli/environment" => {
            "do not touch files or the environment (`std::fs`, `std::env`): take what differs per VM from the facts"
        }
        _ => {
            "drop the code or dependency that calls it (`cargo tree` shows which crate pulls it in; the SDK's plugins need no WASI), and build with the SDK's settings, as `cocoon-fixup plugin new` sets them up: see docs/plugins.md, section 4"
        }
    }
}

/// Why a flavour a plugin's `describe` declares is refused, with advice
/// for the plugin's author: the rule is the annotation's, the fix is in
/// the plugin's code.
pub(crate) fn declared_flavor_problem(flavor: &str, error: &FactError) -> String {
    let rule = match error {
        FactError::Invalid { rule, .. } => *rule,
        _ => "is empty",
    };
    format!(
        "flavour `{}` in its flavour list {rule}: a flavour is what pods name in annotation {}, 1..=63 of a-z, 0-9, '-', '.' and '_' (like `alpine` or `ubuntu-24.04`); fix the flavours `describe` returns (`FLAVORS` in a plugin made by `cocoon-fixup plugin new`, `PluginInfo::with_flavors` in the SDK), or return none to serve any flavour",
        crate::facts::escape_controls(truncate_for_message(flavor)),
        crate::facts::annotations::GUEST_FLAVOR,
    )
}

/// The version of this host, in describe records.
pub(crate) const HOST_VERSION: &str = env!("CARGO_PKG_VERSION");

/// What a describe record holds (JSON, authenticated by the cache).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DescribeRecord {
    /// The host version that wrote it: another version describes the
    /// plugin again (it may read contracts, policies or flavours
    /// differently).
    pub(crate) host: String,
    /// The contract version of the generator export.
    pub(crate) contract: String,
    pub(crate) imports: Vec<String>,
    pub(crate) name: String,
    pub(crate) version: String,
    /// The contract the plugin's `describe` named.
    pub(crate) info_contract: String,
    pub(crate) summary: String,
    pub(crate) scenarios: Vec<String>,
    pub(crate) flavors: Vec<String>,
    pub(crate) policy: Option<crate::plan::policy::RawPolicy>,
}

pub(crate) fn record_of(
    version: Contract,
    imports: &[String],
    described: &contract::Described,
) -> Vec<u8> {
    let info = &described.info;
    let record = DescribeRecord {
        host: HOST_VERSION.to_owned(),
        contract: version.version().to_owned(),
        imports: imports.to_vec(),
        name: info.name.clone(),
        version: info.version.clone(),
        info_contract: info.contract.clone(),
        summary: info.summary.clone(),
        scenarios: info
            .scenarios
            .iter()
            .map(|s| contract::scenario_from_wit(*s).as_str().to_owned())
            .collect(),
        flavors: info.flavors.clone(),
        policy: described.policy.clone(),
    };
    serde_json::to_vec(&record).expect("a describe record serializes")
}

/// Most bytes of a plugin's own reason or field name that messages keep.
pub(crate) const PLUGIN_TEXT_MAX: usize = 512;

/// A plugin-supplied string bound for messages, logs, events and
/// annotations: cut to [`PLUGIN_TEXT_MAX`] bytes, one line, every control
/// and invisible formatting character escaped.
pub(crate) fn plugin_text(s: &str) -> String {
    let cut = &s[..s.floor_char_boundary(PLUGIN_TEXT_MAX)];
    let mut out = crate::facts::escape_controls(cut);
    if cut.len() < s.len() {
        out.push_str("...");
    }
    out
}

pub(crate) fn truncate_for_message(s: &str) -> &str {
    &s[..s.floor_char_boundary(80)]
}
