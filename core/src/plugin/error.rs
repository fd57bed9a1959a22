//! Everything that can go wrong loading or calling a plugin, and how each
//! failure reads.

use super::*;

/// Everything that can go wrong loading or calling a plugin. Each variant
/// names the plugin (its name, or its origin before the name is known).
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("plugins are not loaded from there: {0}")]
    Untrusted(Untrusted),
    /// The reason is in the message, not a source of its own: a chain
    /// printed whole says it once.
    #[error("cannot read plugin {path}: {cause}")]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error(
        "{origin} is not a WebAssembly component{detail}: build plugins with `cargo build --target wasm32-wasip2`"
    )]
    NotAComponent {
        origin: Origin,
        detail: &'static str,
    },
    #[error("{origin} could not be compiled: {reason}; rebuild the plugin from source")]
    Compile { origin: Origin, reason: String },
    #[error(
        "{origin} targets contract {found}, this host serves {}: rebuild the plugin against cocoon:fixup@{}",
        Contract::served(),
        Contract::CURRENT
    )]
    ContractMismatch { origin: Origin, found: String },
    #[error(
        "{origin} does not export `{GENERATOR_EXPORT}`: it is not a cocoon-fixup plugin (export the `plugin` world of wit/)"
    )]
    NotAPlugin { origin: Origin },
    #[error("{origin} cannot be linked: {reason}")]
    Link { origin: Origin, reason: String },
    /// A plugin registered from its describe record whose code could not
    /// be loaded at its first call: the node's cache or plugin file is at
    /// fault, not the VM, so its pods wait (a node error) instead of
    /// failing.
    #[error(
        "{origin} was registered from the plugin cache but its code could not be loaded: {reason}; remove its cache files ({}), or the whole cache directory, then restart cocoon-fixup",
        cache_files.display()
    )]
    NotLoaded {
        origin: Origin,
        reason: String,
        cache_files: PathBuf,
    },
    #[error("plugin {plugin} describes itself wrongly: {reason}")]
    BadDescription { plugin: String, reason: String },
    #[error("plugin {plugin} declares a guest policy that is not well formed: {source}")]
    BadPolicy {
        plugin: String,
        #[source]
        source: PolicyError,
    },
    #[error("plugin {plugin} planned what {by} does not allow: {breach}")]
    Policy {
        plugin: String,
        /// `its declared policy`, `the default policy of its contract
        /// version`, or the operator's narrowing.
        by: String,
        breach: Breach,
    },
    #[error(
        "plugin {plugin} called `{import}`, which the sandbox denies (plugins get no filesystem, environment, network, clock or randomness): {}",
        denied_import_fix(.import)
    )]
    Denied { plugin: String, import: String },
    #[error(
        "plugin {plugin} ran out of CPU fuel (limit {limit}, set with --plugin-fuel): it loops or does far too much work"
    )]
    Fuel { plugin: String, limit: u64 },
    #[error(
        "plugin {plugin} ran past its wall-clock deadline ({limit:?}, set with --plugin-deadline): it loops, or keeps the host busy on its behalf"
    )]
    Deadline {
        plugin: String,
        limit: std::time::Duration,
    },
    #[error(
        "plugin {plugin} exceeded its memory limit: wanted {desired} bytes, limit {limit} (set with --plugin-memory-mib)"
    )]
    Memory {
        plugin: String,
        desired: usize,
        limit: usize,
    },
    #[error(
        "plugin {plugin} logged too much: more than {limit} {what} in one call (the most a call may log): it logs in a loop"
    )]
    LogFlood {
        plugin: String,
        /// `messages` or `bytes`.
        what: &'static str,
        limit: usize,
    },
    #[error(
        "plugin {plugin} handed the host more than {limit} bytes at once (a returned plan or one log message; the limit follows the plan limits, --plan-max-bytes and --plan-max-steps): its plan is far too large"
    )]
    TooMuchData { plugin: String, limit: usize },
    #[error("plugin {plugin} panicked: {message}")]
    Panicked { plugin: String, message: String },
    #[error("plugin {plugin} trapped: {reason}")]
    Trapped { plugin: String, reason: String },
    #[error("plugin {plugin} returned an unusable plan: {source}")]
    BadPlan {
        plugin: String,
        #[source]
        source: PlanError,
    },
    #[error("plugin {plugin} does not support {scenario} here: {reason}")]
    Unsupported {
        plugin: String,
        scenario: Scenario,
        reason: String,
    },
    #[error("plugin {plugin} rejected fact `{field}`: {reason}")]
    InvalidFact {
        plugin: String,
        field: String,
        reason: String,
    },
    #[error(
        "{origin} (sha256 {sha256}) is not on the plugin allow-list: review it, then add its digest with --allow-plugin {sha256}, or remove the file"
    )]
    NotAllowed { origin: Origin, sha256: String },
    #[error(
        "{origin} (sha256 {sha256}) was rolled back by `serve` and is quarantined: replace the file with another version or restore the previous one; `cocoon-fixup plugin quarantine` lists what a rollback took out and why, `cocoon-fixup plugin quarantine --release {sha256}` loads this version again"
    )]
    Quarantined { origin: Origin, sha256: String },
    #[error("cannot set up the plugin engine: {reason}")]
    Engine { reason: String },
}

impl PluginError {
    /// Whether the node is at fault, not the VM, so its pods wait and are
    /// tried again instead of being failed: a plugin registered from the
    /// cache whose code could not be loaded, an engine that could not be
    /// set up for the call, or a call that ran past its wall-clock
    /// deadline. The deadline is time, and time is the node's: a plugin
    /// that loops burns its fuel (a limit that does not depend on load)
    /// and is failed for that, while a call cut short on a loaded node
    /// would fail a pod for a moment of contention.
    pub fn is_node_config(&self) -> bool {
        matches!(
            self,
            PluginError::NotLoaded { .. }
                | PluginError::Engine { .. }
                | PluginError::Deadline { .. }
        )
    }

    /// The plugin misbehaved in a call: it trapped or panicked, breached a
    /// limit or its guest policy, returned an unusable plan, or declined
    /// (`unsupported`) a VM it claimed. A failure policy of `fallback`
    /// applies to these; not to a plugin that rejects the facts, nor to
    /// errors of the node or of loading.
    pub fn is_misbehaviour(&self) -> bool {
        self.misbehaviour().is_some()
    }

    /// The plugin that misbehaved ([`is_misbehaviour`](Self::is_misbehaviour)),
    /// by name.
    pub fn misbehaving_plugin(&self) -> Option<&str> {
        self.misbehaviour()?;
        match self {
            PluginError::Policy { plugin, .. }
            | PluginError::Denied { plugin, .. }
            | PluginError::Fuel { plugin, .. }
            | PluginError::Deadline { plugin, .. }
            | PluginError::Memory { plugin, .. }
            | PluginError::LogFlood { plugin, .. }
            | PluginError::TooMuchData { plugin, .. }
            | PluginError::Panicked { plugin, .. }
            | PluginError::Trapped { plugin, .. }
            | PluginError::BadPlan { plugin, .. }
            | PluginError::Unsupported { plugin, .. } => Some(plugin),
            _ => None,
        }
    }

    /// The kind of [`is_misbehaviour`](Self::is_misbehaviour), as a metric
    /// label: `policy`, `denied-import`, `fuel`, `deadline`, `memory`,
    /// `log-flood`, `too-much-data`, `panic`, `trap`, `bad-plan` or
    /// `unsupported`.
    pub fn misbehaviour(&self) -> Option<&'static str> {
        Some(match self {
            PluginError::Policy { .. } => "policy",
            PluginError::Denied { .. } => "denied-import",
            PluginError::Fuel { .. } => "fuel",
            PluginError::Deadline { .. } => "deadline",
            PluginError::Memory { .. } => "memory",
            PluginError::LogFlood { .. } => "log-flood",
            PluginError::TooMuchData { .. } => "too-much-data",
            PluginError::Panicked { .. } => "panic",
            PluginError::Trapped { .. } => "trap",
            PluginError::BadPlan { .. } => "bad-plan",
            PluginError::Unsupported { .. } => "unsupported",
            _ => return None,
        })
    }
}
