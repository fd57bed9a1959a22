//! The inspector: `plugin inspect`.
//!
//! This module owns the [`Inspector`], which says what a plugin file is
//! (name, version, contract, digest, scenarios, flavours, imports, policy)
//! and whether the node would load it, judged against the built-ins, the
//! plugin directory and the pinned references as the node loads them, and
//! the [`Inspection`] it returns with the text `plugin inspect` prints.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use sha2::{Digest, Sha256};

use fixup_core::classify::Scenario;
use fixup_core::facts::Flavor;
use fixup_core::plan::policy::{GuestPolicy, PolicySource};
use fixup_core::plugin::contract;
use fixup_core::plugin::registry::ConflictError;
use fixup_core::plugin::{
    EngineOptions, LoadError, LoadedPlugin, Origin, PluginDir, PluginError, PluginHost,
    check_plugin_dir, read_plugin_dir, read_trusted,
};

use super::KitError;
use super::runner::thousands;

/// How the host treats one import of a plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Linked to the host: `cocoon:fixup/host` (the bounded log) and the
    /// contract's own type interface.
    Granted,
    /// Linked to a function that traps with an error naming the import.
    Denied,
}

/// One import of a plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImportReport {
    pub name: String,
    pub access: Access,
}

/// What the bytes of a file are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    Component,
    CoreModule,
    NotWasm,
    Unreadable,
}

impl Format {
    fn of(bytes: &[u8]) -> Self {
        match bytes.get(..8) {
            Some([0, b'a', b's', b'm', _, _, 1, 0]) => Format::Component,
            Some([0, b'a', b's', b'm', 1, 0, 0, 0]) => Format::CoreModule,
            _ => Format::NotWasm,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Format::Component => "WebAssembly component",
            Format::CoreModule => "WebAssembly core module (not a component)",
            Format::NotWasm => "not WebAssembly",
            Format::Unreadable => "unreadable",
        }
    }
}

/// What `plugin inspect` found. Fields the host could not learn before it
/// refused the file are `None` (or empty).
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    pub file: String,
    pub size_bytes: Option<u64>,
    pub sha256: Option<String>,
    pub format: Format,
    pub name: Option<String>,
    pub version: Option<String>,
    /// `cocoon:fixup@<version>`.
    pub contract: Option<String>,
    pub summary: Option<String>,
    pub scenarios: Vec<&'static str>,
    /// Empty: any flavour (when the plugin loaded).
    pub flavors: Vec<String>,
    pub imports: Vec<ImportReport>,
    /// What the plugin's plans may do in the guest (when it loaded).
    pub policy: Option<PolicyReport>,
    /// Whether the node would load this file and serve everything it
    /// claims.
    pub accepted: bool,
    /// `accepted`, `accepted by itself, but ...` when other files of the
    /// plugin directory fail, or `refused: <one sentence with the fix>`.
    pub verdict: String,
    /// The plugin directory loaded with this file in it, when there is one.
    pub directory: Option<DirectoryReport>,
    /// Whether the node would load the file and the plugin directory as a
    /// whole ([`Inspection::success`]): the exit code is 0 exactly then.
    pub success: bool,
    /// The store's files of the pinned references (`plugins` in the
    /// configuration file), loaded after the directory.
    pub pinned: Vec<String>,
    /// The pinned references the store does not hold: not checked.
    pub pinned_unchecked: Vec<String>,
    /// Who signed each pinned reference the store holds, as the trust
    /// policy checked it (`REFERENCE signed by KEY ...`).
    pub pinned_signed: Vec<String>,
    /// The pinned references whose signatures do not meet the trust
    /// policy, each with the refusal: the node would not start with them.
    pub pinned_refused: Vec<String>,
}

impl Inspection {
    /// Whether the node would load the file and the plugin directory
    /// as a whole: the exit code is 0.
    pub fn success(&self) -> bool {
        self.accepted
            && self.directory.as_ref().is_none_or(|d| d.loads)
            && self.pinned_refused.is_empty()
    }
}

/// The plugin directory as the node would load it with the inspected file
/// in it.
#[derive(Debug, Clone, Serialize)]
pub struct DirectoryReport {
    pub path: String,
    /// The inspected file's path in the directory: where it lies, or
    /// where a copy of it would go (its file name in the directory).
    pub file_as: String,
    /// Whether the inspected file lies elsewhere and is judged as a copy.
    pub copy: bool,
    /// Whether that copy would replace a file of the same name.
    pub replaces: bool,
    /// Whether every file would load. `plan` refuses to start otherwise;
    /// `run` and a starting `serve` skip the files that fail and serve
    /// with the rest; a running `serve` refuses to reload such a set.
    pub loads: bool,
    /// The other files that would not load (and the directory itself,
    /// when it is refused whole), each with the node's error.
    pub problems: Vec<DirectoryProblem>,
}

/// A file of the plugin directory that would not load.
#[derive(Debug, Clone, Serialize)]
pub struct DirectoryProblem {
    pub file: String,
    pub error: String,
}

/// A plugin's guest-side policy, as `plugin inspect` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyReport {
    /// `declared` by the plugin, or the `contract-default` of a contract
    /// that cannot declare one.
    pub source: PolicySource,
    #[serde(flatten)]
    pub policy: GuestPolicy,
    /// The operator's narrowing from the configuration file, if any.
    pub narrowed_by_operator: Option<GuestPolicy>,
    /// What a reviewer must look at twice: run rules that leave a
    /// program's arguments open, patterns that cover files through which
    /// code could run ([`GuestPolicy::warnings`]).
    pub warnings: Vec<String>,
}

impl PolicyReport {
    fn of(plugin: &LoadedPlugin) -> Self {
        PolicyReport {
            source: plugin.policy_source,
            policy: plugin.policy.clone(),
            narrowed_by_operator: plugin.narrowing.clone(),
            warnings: plugin.policy.warnings(),
        }
    }
}

/// Inspects plugin files against a host set up like production: the
/// built-ins and every file of the plugin directory, loaded in the node's
/// order with the node's rules, so a plugin that would clash with any of
/// them is refused as the node would refuse it.
pub struct Inspector {
    /// The engine, with the built-ins registered.
    host: PluginHost,
    plugin_dir: Option<PathBuf>,
    /// The store's files of the pinned references, loaded after the
    /// directory ([`Inspector::with_pinned`]).
    pinned: Vec<PathBuf>,
    /// The pinned references whose files the store does not hold.
    unchecked: Vec<String>,
    /// Who signed the pinned references ([`Inspector::with_pinned_trust`]).
    signed: Vec<String>,
    /// The pinned references refused on their signatures.
    refused: Vec<String>,
}

impl fmt::Debug for Inspector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inspector")
            .field("host", &self.host)
            .field("plugin_dir", &self.plugin_dir)
            .field("pinned", &self.pinned)
            .finish()
    }
}

/// A file of the plugin directory, as the inspector loads it.
enum DirEntry {
    /// The file being inspected (where it lies, or where a copy would).
    Inspected,
    /// Another file, as read under the node's rules.
    Other(Result<Vec<u8>, PluginError>),
}

/// What loading the plugin directory with the inspected file in it gave.
struct DirLoad {
    report: Option<DirectoryReport>,
    /// Why the node would not load the inspected file, or leave one of its
    /// claims unserved.
    refusal: Option<String>,
}

impl Inspector {
    /// An engine with the built-ins; `plugin_dir`, when given, is read
    /// again for each file inspected. A plugin directory that cannot be
    /// read at all is an error here, as it is for the node.
    pub fn new(engine: EngineOptions, plugin_dir: Option<&Path>) -> Result<Self, KitError> {
        let mut host = PluginHost::new(engine)?;
        host.load_builtins().map_err(KitError::BuiltIns)?;
        if let Some(dir) = plugin_dir {
            check_plugin_dir(dir)?;
        }
        Ok(Inspector {
            host,
            plugin_dir: plugin_dir.map(Path::to_owned),
            pinned: Vec::new(),
            unchecked: Vec::new(),
            signed: Vec::new(),
            refused: Vec::new(),
        })
    }

    /// Also load `files`, the store's copies of the pinned references, after
    /// the plugin directory, as the node does; `unchecked` names the pinned
    /// references the store does not hold (the node would pull them; the
    /// inspector does not), listed in each inspection.
    pub fn with_pinned(mut self, files: Vec<PathBuf>, unchecked: Vec<String>) -> Self {
        self.pinned = files;
        self.unchecked = unchecked;
        self
    }

    /// What the trust policy says of the pinned references: `signed`, who
    /// signed each (one line a reference), and `refused`, the refusal of
    /// each whose signatures do not meet it (the node would not start:
    /// the inspection fails).
    pub fn with_pinned_trust(mut self, signed: Vec<String>, refused: Vec<String>) -> Self {
        self.signed = signed;
        self.refused = refused;
        self
    }

    /// Inspect one file. Never fails: what cannot be learned stays empty
    /// and the verdict says why.
    pub fn inspect(&self, path: &Path) -> Inspection {
        let mut out = self.judge(path);
        out.pinned = self
            .pinned
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        out.pinned_unchecked.clone_from(&self.unchecked);
        out.pinned_signed.clone_from(&self.signed);
        out.pinned_refused.clone_from(&self.refused);
        out.success = out.success();
        out
    }

    fn judge(&self, path: &Path) -> Inspection {
        let mut out = Inspection {
            file: path.display().to_string(),
            size_bytes: None,
            sha256: None,
            format: Format::Unreadable,
            name: None,
            version: None,
            contract: None,
            summary: None,
            scenarios: Vec::new(),
            flavors: Vec::new(),
            imports: Vec::new(),
            policy: None,
            accepted: false,
            verdict: String::new(),
            directory: None,
            success: false,
            pinned: Vec::new(),
            pinned_unchecked: Vec::new(),
            pinned_signed: Vec::new(),
            pinned_refused: Vec::new(),
        };
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) => {
                out.verdict = format!(
                    "refused: cannot read {}: {e}; check the path",
                    path.display()
                );
                return out;
            }
        };
        // What the host would refuse on where the file lies (a link, an
        // owner or a mode that lets another user change it), beside what
        // the file is.
        let untrusted = fixup_core::plugin::trusted::read_file(path)
            .err()
            .filter(|e| !e.is_io());
        out.size_bytes = Some(bytes.len() as u64);
        out.sha256 = Some(hex::encode(Sha256::digest(&bytes)));
        out.format = Format::of(&bytes);
        let prepared = self
            .host
            .prepare(Origin::File(path.to_owned()), &bytes)
            .and_then(|plugin| plugin.link().map(|()| Arc::new(plugin)));
        let plugin = match prepared {
            Ok(plugin) => plugin,
            Err(e) => {
                let refusal = refusal(&e);
                out.directory = self.load_dir(path, None).report;
                out.verdict = format!("refused: {refusal}");
                return out;
            }
        };
        out.name = Some(plugin.info.name.clone());
        out.version = Some(plugin.info.version.clone());
        out.contract = Some(format!("cocoon:fixup@{}", plugin.info.contract));
        out.summary = Some(plugin.info.summary.clone());
        out.scenarios = plugin.info.scenarios.iter().map(|s| s.as_str()).collect();
        out.flavors = plugin
            .info
            .flavors
            .iter()
            .map(|f| f.as_str().to_owned())
            .collect();
        out.imports = plugin
            .imports
            .iter()
            .map(|name| ImportReport {
                access: import_access(&plugin.granted_imports(), name),
                name: name.clone(),
            })
            .collect();
        out.policy = Some(PolicyReport::of(&plugin));
        let loaded = self.load_dir(path, Some(&plugin));
        out.directory = loaded.report;
        match (untrusted, loaded.refusal) {
            (Some(e), _) => out.verdict = format!("refused: {e}"),
            (None, Some(refusal)) => out.verdict = format!("refused: {refusal}"),
            (None, None) => {
                out.accepted = true;
                out.verdict = match &out.directory {
                    Some(dir) if !dir.loads => format!(
                        "accepted by itself, but the plugin directory {} does not load as a whole ({} other file(s) fail, listed under `directory`): `plan` refuses to start until they are fixed or removed, `run` and a starting `serve` skip them and load this file, and a running `serve` refuses to reload until they are fixed (this check does not run the `NAME.cases/` gate of a reload)",
                        dir.path,
                        dir.problems.len()
                    ),
                    _ => "accepted".to_owned(),
                };
            }
        }
        out
    }

    /// Load the built-ins, the plugin directory and then the pinned
    /// references' files into a registry of their own, in the node's
    /// order, with the inspected file in place: the file itself when it
    /// lies in the directory, else a copy of it under its file name
    /// (replacing a file of that name). `plugin` is the inspected plugin,
    /// or why it does not load. Without a plugin directory, the plugin is
    /// judged against the built-ins and the pinned files alone.
    fn load_dir(&self, path: &Path, plugin: Option<&Arc<LoadedPlugin>>) -> DirLoad {
        let mut registry = self.host.registry().clone();
        let name = path.file_name().unwrap_or(path.as_os_str());
        let inside = self
            .plugin_dir
            .as_deref()
            .is_some_and(|dir| lies_in(path, dir));
        // A pinned reference's own file, or the same bytes (a pulled copy
        // of that digest): judged in that reference's place, not as a
        // second file beside it.
        // Each pinned reference's file, read once under the node's rules.
        let pinned: Vec<(PathBuf, Result<Vec<u8>, PluginError>)> = self
            .pinned
            .iter()
            .map(|file| (file.clone(), read_trusted(file)))
            .collect();
        let twin = plugin.filter(|_| !inside).and_then(|plugin| {
            pinned.iter().position(|(file, bytes)| {
                file == path
                    || bytes
                        .as_ref()
                        .is_ok_and(|bytes| hex::encode(Sha256::digest(bytes)) == plugin.sha256)
            })
        });
        // The node reads only `*.wasm` files of its directory; a pinned
        // file is read whatever its name.
        let wasm_name = twin.is_some() || name.as_encoded_bytes().ends_with(b".wasm");
        let here = match (twin, &self.plugin_dir) {
            (Some(i), _) => self.pinned[i].clone(),
            (None, Some(dir)) => dir.join(name),
            (None, None) => path.to_owned(),
        };
        let mut report = self.plugin_dir.as_ref().map(|dir| DirectoryReport {
            path: dir.display().to_string(),
            file_as: here.display().to_string(),
            copy: !inside,
            replaces: false,
            loads: true,
            problems: Vec::new(),
        });
        let files = match self.plugin_dir.as_deref().map(read_plugin_dir) {
            None => Vec::new(),
            Some(Ok(PluginDir::Files(files))) => files,
            Some(Ok(PluginDir::Refused(e))) => {
                let report = report.expect("a directory");
                let problem = PluginError::Untrusted(e).to_string();
                return DirLoad {
                    refusal: Some(format!(
                        "the plugin directory {} is refused whole, so the node reads none of its files: {problem}",
                        report.path
                    )),
                    report: Some(DirectoryReport {
                        loads: false,
                        problems: vec![DirectoryProblem {
                            file: report.path.clone(),
                            error: problem,
                        }],
                        ..report
                    }),
                };
            }
            Some(Err(e)) => {
                let report = report.expect("a directory");
                return DirLoad {
                    refusal: Some(format!("{e}; the node cannot start with it")),
                    report: Some(DirectoryReport {
                        loads: false,
                        problems: vec![DirectoryProblem {
                            file: report.path.clone(),
                            error: e.to_string(),
                        }],
                        ..report
                    }),
                };
            }
        };
        let mut entries: Vec<(PathBuf, DirEntry)> = files
            .into_iter()
            .map(|(file, bytes)| (file, DirEntry::Other(bytes)))
            .collect();
        // Why the node cannot read the inspected file where it lies.
        let mut unreadable = None;
        match entries.iter().position(|(file, _)| *file == here) {
            // In a pinned reference's place (below).
            _ if twin.is_some() => {}
            // The file itself: judged as the node reads it there.
            Some(i) if inside => match &entries[i].1 {
                DirEntry::Other(Err(e)) => unreadable = Some(e.to_string()),
                _ => entries[i].1 = DirEntry::Inspected,
            },
            Some(i) => {
                if let Some(report) = &mut report {
                    report.replaces = true;
                }
                entries[i].1 = DirEntry::Inspected;
            }
            // A file the node would not read stays out.
            None if !wasm_name && self.plugin_dir.is_some() => {}
            None => {
                let at = entries.partition_point(|(file, _)| *file < here);
                entries.insert(at, (here.clone(), DirEntry::Inspected));
            }
        }
        // The pinned references' files load after the directory.
        entries.extend(pinned.into_iter().enumerate().map(|(i, (file, bytes))| {
            let entry = if twin == Some(i) {
                DirEntry::Inspected
            } else {
                DirEntry::Other(bytes)
            };
            (file, entry)
        }));
        let mut own = None;
        let mut inspected_fails = false;
        // The files the inspected one shares a claim with: the other file,
        // the claim, and whether the other file loads first.
        let mut others: Vec<(Origin, Scenario, Option<Flavor>, bool)> = Vec::new();
        for (file, entry) in entries {
            let loaded = match (entry, plugin) {
                (DirEntry::Inspected, Some(plugin)) => {
                    let added = registry.add(plugin.clone());
                    if let Err(conflict) = &added {
                        own = Some(conflict.clone());
                    }
                    added.map_err(LoadError::from)
                }
                (DirEntry::Inspected, None) => {
                    inspected_fails = true;
                    continue;
                }
                (DirEntry::Other(bytes), _) => bytes
                    .and_then(|bytes| self.host.prepare(Origin::File(file.clone()), &bytes))
                    .map_err(LoadError::from)
                    .and_then(|other| Ok(registry.add(other)?)),
            };
            let Err(error) = loaded else { continue };
            if let (LoadError::Conflict(c), Some(plugin)) = (&error, plugin)
                && c.existing == plugin.origin
            {
                others.push((c.new.clone(), c.scenario, c.flavor.clone(), false));
            }
            // The inspected file's own failure is its verdict.
            if file == here && (inside || wasm_name) {
                inspected_fails = true;
                continue;
            }
            if let Some(report) = &mut report {
                report.problems.push(DirectoryProblem {
                    file: file.display().to_string(),
                    error: fixup_core::facts::escape_controls(&error.to_string()),
                });
            }
        }
        if let Some(report) = &mut report {
            report.loads = report.problems.is_empty() && !inspected_fails;
        }
        let report = report.filter(|_| self.plugin_dir.is_some());
        if let Some(e) = unreadable {
            return DirLoad {
                report,
                refusal: Some(format!("the node cannot read it there: {e}")),
            };
        }
        if !wasm_name && self.plugin_dir.is_some() {
            return DirLoad {
                report,
                refusal: Some(
                    "the node does not load this file (its name does not end in `.wasm`), so the directory was judged without it; give it a name ending in `.wasm` to have it loaded, or leave it out"
                        .to_owned(),
                ),
            };
        }
        let Some(plugin) = plugin else {
            return DirLoad {
                report,
                refusal: None,
            };
        };
        others.extend(
            registry
                .contested_with(&plugin.origin)
                .into_iter()
                .map(|(scenario, flavor, other, first)| (other, scenario, flavor, first)),
        );
        let refusal = match own {
            Some(c) if matches!(c.existing, Origin::BuiltIn(_)) => {
                Some(self.conflict_sentence(&c, plugin))
            }
            Some(c) => {
                others.push((c.existing, c.scenario, c.flavor, true));
                None
            }
            None => None,
        };
        others.sort();
        others.dedup();
        let refusal = refusal.or_else(|| (!others.is_empty()).then(|| shared_claims(&others)));
        DirLoad { report, refusal }
    }
}

impl Inspector {
    /// Why `plugin` is refused for a claim a built-in makes: a copy of
    /// the built-in itself is named as such.
    fn conflict_sentence(&self, c: &ConflictError, plugin: &LoadedPlugin) -> String {
        let same = self
            .host
            .registry()
            .plugins()
            .iter()
            .find(|b| b.sha256 == plugin.sha256);
        match same {
            Some(builtin) => format!(
                "it is {} itself (the same sha256), which this binary serves already: a copy in the plugin directory is refused as a second claim of {}; leave it out",
                builtin.origin, c.scenario
            ),
            None => conflict_sentence(c),
        }
    }
}

/// Whether `path` is a file directly in `dir` (compared as real paths).
fn lies_in(path: &Path, dir: &Path) -> bool {
    let parent = match path.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new("."),
        Some(p) => p,
        None => return false,
    };
    match (parent.canonicalize(), dir.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The refusal for claims the inspected plugin shares with other files:
/// each names the other file, what both claim and which of the two keeps
/// its other claims (the node loads files in name order: the earlier one
/// loads, the later one is refused whole), then the fix.
fn shared_claims(others: &[(Origin, Scenario, Option<Flavor>, bool)]) -> String {
    let each: Vec<String> = others
        .iter()
        .map(|(other, scenario, flavor, first)| {
            let flavor = match flavor {
                Some(f) => format!("flavour `{f}`"),
                None => "any flavour".to_owned(),
            };
            let (kept, lost) = if *first {
                (other.to_string(), "this file".to_owned())
            } else {
                ("this file".to_owned(), other.to_string())
            };
            format!(
                "{other} also serves {scenario} for {flavor}: {kept} loads first and keeps its other claims, {lost} does not load and serves none of its claims, and neither serves {scenario} for {flavor}"
            )
        })
        .collect();
    format!(
        "{} (`plan` refuses to start with this directory); remove one of them, or make one of them serve a narrower flavour",
        each.join("; ")
    )
}

fn conflict_sentence(c: &ConflictError) -> String {
    match (&c.existing, &c.flavor) {
        (Origin::BuiltIn(name), None) => format!(
            "it serves {} for any flavour, as built-in {name} does, and a plugin file cannot replace a built-in for every flavour: declare the guest flavours it serves (`PluginInfo::with_flavors`)",
            c.scenario
        ),
        _ => c.to_string(),
    }
}

fn import_access(granted: &[String], name: &str) -> Access {
    if granted.iter().any(|g| g == name) {
        Access::Granted
    } else {
        Access::Denied
    }
}

/// Why the host refuses a plugin, as one sentence ending in the fix. The
/// host's own messages carry the fix where the cause implies it; the rest
/// get one here.
fn refusal(e: &PluginError) -> String {
    match e {
        PluginError::Read { .. } => format!("{e}; check the path"),
        PluginError::Link { .. } => format!(
            "{e}; build the plugin with cocoon-fixup-sdk for wasm32-wasip2, which imports only what the host can link"
        ),
        PluginError::BadDescription { .. } => {
            format!("{e}; fix what the plugin's `describe` returns")
        }
        PluginError::BadPolicy { .. } => format!(
            "{e}; fix what the plugin's `policy` returns (the rules are in the contract's `policy` interface and docs/plugins.md)"
        ),
        PluginError::Denied { .. } => {
            format!("{e}; remove that call from the plugin's `describe`")
        }
        PluginError::Panicked { .. } | PluginError::Trapped { .. } => {
            format!("{e}; fix the plugin's `describe` so that it returns")
        }
        _ => e.to_string(),
    }
}

impl fmt::Display for Inspection {
    /// The text `plugin inspect` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let row =
            |f: &mut fmt::Formatter<'_>, key: &str, value: &str| writeln!(f, "{key:<10} {value}");
        let size = self
            .size_bytes
            .map(|n| format!(" ({} bytes)", thousands(n)))
            .unwrap_or_default();
        row(f, "file", &format!("{}{size}", self.file))?;
        if let Some(sha) = &self.sha256 {
            row(f, "sha256", sha)?;
        }
        row(f, "format", self.format.describe())?;
        for (key, value) in [
            ("name", &self.name),
            ("version", &self.version),
            ("contract", &self.contract),
            ("summary", &self.summary),
        ] {
            if let Some(value) = value {
                row(f, key, value)?;
            }
        }
        if self.name.is_some() {
            row(f, "scenarios", &self.scenarios.join(", "))?;
            let flavors = if self.flavors.is_empty() {
                "any".to_owned()
            } else {
                self.flavors.join(", ")
            };
            row(f, "flavours", &flavors)?;
            if self.imports.is_empty() {
                row(f, "imports", "none")?;
            }
            let width = self.imports.iter().map(|i| i.name.len()).max().unwrap_or(0);
            for (i, import) in self.imports.iter().enumerate() {
                let access = match import.access {
                    Access::Granted
                        if import.name.starts_with("cocoon:fixup/types@")
                            || import.name.starts_with("cocoon:fixup/policy@") =>
                    {
                        "granted (types only)"
                    }
                    Access::Granted => "granted",
                    Access::Denied => "denied (traps)",
                };
                let line = format!("{:<width$}  {access}", import.name);
                row(f, if i == 0 { "imports" } else { "" }, &line)?;
            }
        }
        if let Some(policy) = &self.policy {
            let source = match policy.source {
                PolicySource::Declared => "declared by the plugin".to_owned(),
                PolicySource::ContractDefault => format!(
                    "the default for its contract, which cannot declare one (rebuild against cocoon:fixup@{} to declare a tighter one)",
                    contract::Contract::CURRENT
                ),
            };
            row(f, "policy", &source)?;
            write!(f, "{}", policy.policy)?;
            for warning in &policy.warnings {
                writeln!(f, "  warning: {warning}")?;
            }
            match &policy.narrowed_by_operator {
                Some(narrowing) => {
                    row(
                        f,
                        "operator",
                        "narrowed in the configuration file; plans must fit both",
                    )?;
                    write!(f, "{narrowing}")?;
                }
                None => row(f, "operator", "no narrowing in the configuration file")?,
            }
        }
        if let Some(dir) = &self.directory {
            let loads = if dir.loads {
                "every file loads"
            } else {
                "does not load as a whole"
            };
            row(f, "directory", &format!("{}: {loads}", dir.path))?;
            let place = match (dir.copy, dir.replaces) {
                (false, _) => format!("this file is {}", dir.file_as),
                (true, false) => format!("judged as a copy at {}", dir.file_as),
                (true, true) => format!(
                    "judged as a copy at {}, replacing the file there",
                    dir.file_as
                ),
            };
            row(f, "", &place)?;
            for problem in &dir.problems {
                row(
                    f,
                    "",
                    &format!("fails: {}: {}", problem.file, problem.error),
                )?;
            }
        }
        for file in &self.pinned {
            row(f, "pinned", &format!("{file} (loaded after the directory)"))?;
        }
        if !self.pinned_unchecked.is_empty() {
            row(
                f,
                "pinned",
                &format!(
                    "pinned references not checked: {} (not in the store: {}; `plugin pull` them)",
                    self.pinned_unchecked.len(),
                    self.pinned_unchecked.join(", ")
                ),
            )?;
        }
        for signed in &self.pinned_signed {
            row(f, "signed", signed)?;
        }
        for refused in &self.pinned_refused {
            row(f, "refused", refused)?;
        }
        row(f, "verdict", &self.verdict)
    }
}
