//! Configuration: command-line flags > environment > file > defaults,
//! resolved once into [`Resolved`].
//!
//! Every option has a flag (`--retry-budget 180s`), an environment variable
//! (`COCOON_FIXUP_RETRY_BUDGET=180s`) and a key in the TOML file
//! (`retry_budget = "180s"`, file from `--config`, default
//! `/etc/cocoon-fixup/config.toml` when it exists). Durations are written
//! like `200ms`, `3s`, `2m`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::collections::BTreeMap;

use clap::Args;
use serde::Deserialize;

use crate::cocoon::DEFAULT_COCOON_BIN;
use crate::host::HostConfig;
use crate::oci::trust::RawTrustRule;
use crate::oci::{OciError, PinnedPlugins, PluginRef, RegistryOptions, TrustPolicy};
use crate::ready::{DEFAULT_LEASE_FILE, DEFAULT_LEASE_POLL};
use crate::reload::{
    DEFAULT_INTERVAL as DEFAULT_RELOAD_INTERVAL, DEFAULT_MAX_FAILURE_RATIO, DEFAULT_MIN_NAMESPACES,
    DEFAULT_WATCH_FIXUPS, ReloadConfig,
};
use fixup_core::decision::SettingsBuilder;
use fixup_core::plan::policy::RawPolicy;
use fixup_core::planner::{OptionError, PlannerOptions, RawPlannerOptions};
use fixup_core::plugin::DEFAULT_SLOTS;
use fixup_core::plugin::cache::{CacheOwner, CachePaths, default_cache_dir, default_paths};
use fixup_core::plugin::trusted::euid;

/// The configuration file read when `--config` is not given and it exists.
pub const DEFAULT_CONFIG_FILE: &str = "/etc/cocoon-fixup/config.toml";
pub use fixup_core::plugin::DEFAULT_PLUGIN_DIR;
/// Where `serve` answers `/metrics` and `/healthz`.
pub const DEFAULT_METRICS_ADDR: &str = "0.0.0.0:9464";
/// Pods `serve` works on at once.
pub const DEFAULT_CONCURRENCY: usize = 16;

/// Why the configuration could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("config file {path}: {reason}; the keys are in docs/settings.md")]
    Parse { path: PathBuf, reason: String },
    #[error("plugin directory {path} does not exist: create it or drop the setting")]
    PluginDir { path: PathBuf },
    #[error("plugin_policy.{plugin} in the config file: {reason}")]
    Policy { plugin: String, reason: String },
    #[error("plugins in the configuration: {0}")]
    Plugins(OciError),
    #[error("{0}; the trust policy is in docs/plugins.md, \"Signed plugins\"")]
    Trust(String),
    #[error("{what} must be {rule}, got {value}")]
    Invalid {
        what: &'static str,
        rule: &'static str,
        value: String,
    },
}

impl From<OptionError> for ConfigError {
    fn from(e: OptionError) -> Self {
        match e {
            OptionError::Invalid { what, rule, value } => {
                ConfigError::Invalid { what, rule, value }
            }
            OptionError::Policy { plugin, reason } => ConfigError::Policy { plugin, reason },
            OptionError::PluginDir { path } => ConfigError::PluginDir { path },
        }
    }
}

/// A path where an empty value means "none" (clap's own path parser
/// refuses an empty value).
fn path_or_empty(text: &str) -> Result<PathBuf, String> {
    Ok(PathBuf::from(text))
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write e.g. 200ms, 3s, 2m)"))
}

/// The options that say which plugins load and how they are cached and
/// bounded: all that `plugin test` and `plugin inspect` take besides
/// `--config`, and part of every command that plans ([`ConfigArgs`]).
/// All are optional here so that the file and the defaults can fill them
/// in; in the file they are top-level keys like the others.
#[derive(Debug, Clone, Default, Args, Deserialize)]
pub struct PluginConfigArgs {
    /// Directory of vendor plugins (`*.wasm`). It and the directories above
    /// it must be root's or the user's and not writable by others, and each
    /// plugin a regular file (not a link) of theirs, not writable by others
    /// [default: /etc/cocoon-fixup/plugins, when it exists]
    #[arg(long, value_name = "DIR", env = "COCOON_FIXUP_PLUGIN_DIR")]
    pub plugin_dir: Option<PathBuf>,
    /// Directory for precompiled plugins, created 0700. It and the
    /// directories above it must be root's or the user's and not writable by
    /// others (a root-owned sticky directory like /tmp may be above it),
    /// or it is not used: one warning, and plugins are compiled at every
    /// start. No link may be on its path [default: the user's own,
    /// $XDG_CACHE_HOME/cocoon-fixup, else ~/.cache/cocoon-fixup, even as
    /// root; for `run` and `serve` as root, /var/cache/cocoon-fixup]
    #[arg(long, value_name = "DIR", env = "COCOON_FIXUP_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Key that authenticates precompiled plugins: 32 random bytes, made
    /// on first use, mode 0600, owned by the user cocoon-fixup runs as,
    /// outside the cache directory [default: the user's own,
    /// $XDG_STATE_HOME/cocoon-fixup/cache.key, else
    /// ~/.local/state/cocoon-fixup/cache.key, even as root; for `run` and
    /// `serve` as root, /var/lib/cocoon-fixup/cache.key]
    #[arg(long, value_name = "FILE", env = "COCOON_FIXUP_CACHE_KEY")]
    pub cache_key: Option<PathBuf>,
    /// Compile plugins at every start instead of using the cache
    #[arg(long, env = "COCOON_FIXUP_NO_CACHE")]
    #[serde(default)]
    pub no_cache: bool,
    /// CPU fuel per plugin call [default: 250000000, about 10 ms]
    #[arg(long, value_name = "N", env = "COCOON_FIXUP_PLUGIN_FUEL")]
    pub plugin_fuel: Option<u64>,
    /// Wall-clock time one plugin call may take, 1ms to 60s [default: 1s]
    #[arg(long, value_name = "DURATION", env = "COCOON_FIXUP_PLUGIN_DEADLINE", value_parser = duration)]
    #[serde(default, with = "opt_duration")]
    pub plugin_deadline: Option<Duration>,
    /// Linear memory per plugin call, MiB [default: 16]
    #[arg(long, value_name = "MIB", env = "COCOON_FIXUP_PLUGIN_MEMORY_MIB")]
    pub plugin_memory_mib: Option<u32>,
    /// Most steps in a plan [default: 256]
    #[arg(long, value_name = "N", env = "COCOON_FIXUP_PLAN_MAX_STEPS")]
    pub plan_max_steps: Option<usize>,
    /// Most bytes of text in a plan [default: 65536]
    #[arg(long, value_name = "BYTES", env = "COCOON_FIXUP_PLAN_MAX_BYTES")]
    pub plan_max_bytes: Option<usize>,
    /// Only load plugin files with this sha256 (repeat for several); without
    /// it every plugin file is loaded. Built-ins are always trusted.
    #[arg(long = "allow-plugin", value_name = "SHA256", env = "COCOON_FIXUP_ALLOW_PLUGINS", value_delimiter = ',', value_parser = fixup_core::plugin::parse_sha256)]
    #[serde(default, rename = "allowed_plugins")]
    pub allowed_plugins: Vec<String>,
}

/// Where pulled plugins are kept and which registries speak plain HTTP:
/// the options of `plugin pull`, and part of every planning command's
/// ([`ConfigArgs::oci`]).
#[derive(Debug, Clone, Default, Args, Deserialize)]
pub struct OciArgs {
    /// Where pulled plugins are kept, created 0700, under the plugin
    /// directory's trust rules [default: /var/lib/cocoon-fixup/oci as root;
    /// $XDG_STATE_HOME/cocoon-fixup/oci, else
    /// ~/.local/state/cocoon-fixup/oci, for other users]
    #[arg(long, value_name = "DIR", env = "COCOON_FIXUP_OCI_STORE")]
    pub oci_store: Option<PathBuf>,
    /// Registries (`HOST` or `HOST:PORT`, as written in references) spoken
    /// to over plain HTTP instead of HTTPS, such as a registry on loopback
    /// (repeat for several)
    #[arg(
        long = "oci-plain-http",
        value_name = "HOST[:PORT]",
        env = "COCOON_FIXUP_OCI_PLAIN_HTTP",
        value_delimiter = ','
    )]
    #[serde(default)]
    pub oci_plain_http: Vec<String>,
}

impl OciArgs {
    /// The settings of a command that takes only these options (`plugin
    /// pull`): the configuration file fills in the rest, read and checked
    /// as every command reads it.
    pub fn resolve(&self, config: Option<&Path>) -> Result<Resolved, ConfigError> {
        ConfigArgs {
            oci: self.clone(),
            ..ConfigArgs::default()
        }
        .resolve(config)
    }
}

/// Options every command that plans or applies shares: the plugin options
/// and the node's (cocoon, leases, retries, the daemon). All are optional
/// here so that the file and the defaults can fill them in.
#[derive(Debug, Clone, Default, Args, Deserialize)]
pub struct ConfigArgs {
    #[command(flatten)]
    #[serde(flatten)]
    pub plugin: PluginConfigArgs,
    /// The cocoon CLI [default: /usr/local/bin/cocoon]
    #[arg(long, value_name = "PATH", env = "COCOON_FIXUP_COCOON_BIN")]
    pub cocoon_bin: Option<PathBuf>,
    /// The cocoon root, for the overlay probe [default: /var/lib/cocoon]
    #[arg(long, value_name = "DIR", env = "COCOON_ROOT")]
    pub cocoon_root: Option<PathBuf>,
    /// The cocoon-net lease file [default: /var/lib/cocoon/net/leases.json]
    #[arg(long, value_name = "FILE", env = "COCOON_FIXUP_LEASE_FILE")]
    pub lease_file: Option<PathBuf>,
    /// The host's state directory: a record per pod uid that keeps the
    /// pod's hibernate history, the wake verdict for its VM, which VM its
    /// post-clone-state was written for, and the fixup loop's retry budget,
    /// across task retries and restarts. Empty: none (a wake is then
    /// recognised by the annotation and the stack's events alone). A record
    /// that cannot be read or kept is logged and counted
    /// (cocoon_fixup_record_errors_total), and the work goes on without it
    /// [default: /var/lib/cocoon-fixup/state as root, else
    /// $XDG_STATE_HOME/cocoon-fixup/state, else
    /// ~/.local/state/cocoon-fixup/state]
    #[arg(long, value_name = "DIR", env = "COCOON_FIXUP_STATE_DIR", value_parser = path_or_empty)]
    pub state_dir: Option<PathBuf>,
    /// Wait between fixup attempts [default: 3s]
    #[arg(long, value_name = "DURATION", env = "COCOON_FIXUP_RETRY_INTERVAL", value_parser = duration)]
    #[serde(default, with = "opt_duration")]
    pub retry_interval: Option<Duration>,
    /// Fixup retry budget from the first attempt [default: 180s]
    #[arg(long, value_name = "DURATION", env = "COCOON_FIXUP_RETRY_BUDGET", value_parser = duration)]
    #[serde(default, with = "opt_duration")]
    pub retry_budget: Option<Duration>,
    /// Timeout of one `cocoon vm exec` [default: 90s, never past the budget]
    #[arg(long, value_name = "DURATION", env = "COCOON_FIXUP_EXEC_TIMEOUT", value_parser = duration)]
    #[serde(default, with = "opt_duration")]
    pub exec_timeout: Option<Duration>,
    /// Timeout of `cocoon vm inspect` [default: 10s]
    #[arg(long, value_name = "DURATION", env = "COCOON_FIXUP_INSPECT_TIMEOUT", value_parser = duration)]
    #[serde(default, with = "opt_duration")]
    pub inspect_timeout: Option<Duration>,
    /// IP wait budget [default: 45s]
    #[arg(long, value_name = "DURATION", env = "COCOON_FIXUP_IP_WAIT", value_parser = duration)]
    #[serde(default, with = "opt_duration")]
    pub ip_wait: Option<Duration>,
    /// Lease file poll interval, the safety net behind the file watch [default: 200ms]
    #[arg(long, value_name = "DURATION", env = "COCOON_FIXUP_IP_POLL", value_parser = duration)]
    #[serde(default, with = "opt_duration")]
    pub ip_poll: Option<Duration>,
    /// Windows: nudge with `ipconfig /renew` after this long without an IP [default: 30s]
    #[arg(long, value_name = "DURATION", env = "COCOON_FIXUP_RENEW_AFTER", value_parser = duration)]
    #[serde(default, with = "opt_duration")]
    pub renew_after: Option<Duration>,
    /// Timeout of the renew nudge [default: 20s]
    #[arg(long, value_name = "DURATION", env = "COCOON_FIXUP_RENEW_TIMEOUT", value_parser = duration)]
    #[serde(default, with = "opt_duration")]
    pub renew_timeout: Option<Duration>,
    /// Linux all-DHCP clones: DHCP recovery pass after this long without a lease [default: 15s]
    #[arg(long, value_name = "DURATION", env = "COCOON_FIXUP_DHCP_RECOVERY_AFTER", value_parser = duration)]
    #[serde(default, with = "opt_duration")]
    pub dhcp_recovery_after: Option<Duration>,
    /// A `Woken` or `HibernateSnapshotExists` event of the stack marks the
    /// pod's VM as a hibernate wake when its newest occurrence is at most
    /// this long before the VM was created [default: 30m]
    #[arg(long, value_name = "DURATION", env = "COCOON_FIXUP_WAKE_EVENT_WINDOW", value_parser = duration)]
    #[serde(default, with = "opt_duration")]
    pub wake_event_window: Option<Duration>,
    /// Cloud Hypervisor Windows pods with no evidence of a wake either way,
    /// and pods the host's history says were woken or recreated: wait this
    /// long from the first sight of the VM for the stack's witness before
    /// treating it as a clone [default: 10s]
    #[arg(long, value_name = "DURATION", env = "COCOON_FIXUP_WAKE_GRACE", value_parser = duration)]
    #[serde(default, with = "opt_duration")]
    pub wake_grace: Option<Duration>,
    /// The stack's event source: only `Woken` and `HibernateSnapshotExists`
    /// events whose reportingController is one of these count as evidence
    /// of a hibernate wake (repeat the flag, or separate with commas)
    /// [default: vk-cocoon]
    #[arg(
        long = "wake-event-reporter",
        value_name = "NAME",
        env = "COCOON_FIXUP_WAKE_EVENT_REPORTERS",
        value_delimiter = ','
    )]
    #[serde(default)]
    pub wake_event_reporters: Vec<String>,
    /// Windows static IPs over the serial console: the whole pass, every
    /// NIC included, ends within this total deadline (at least 100ms), so
    /// a guest whose console answers slowly holds neither the pass nor the
    /// node for minutes [default: 120s]
    #[arg(long, value_name = "DURATION", env = "COCOON_FIXUP_SAC_DEADLINE", value_parser = duration)]
    #[serde(default, with = "opt_duration")]
    pub sac_deadline: Option<Duration>,
    /// Plugins to pull from an OCI registry and load like plugin files,
    /// each pinned by digest: `oci://HOST/REPO@sha256:DIGEST` (repeat for
    /// several; a tag is refused). Kept in --oci-store, and pulled only when
    /// not there yet
    #[arg(
        long = "plugin-ref",
        value_name = "oci://HOST/REPO@sha256:DIGEST",
        env = "COCOON_FIXUP_PLUGINS",
        value_delimiter = ','
    )]
    #[serde(default)]
    pub plugins: Vec<String>,
    #[command(flatten)]
    #[serde(flatten)]
    pub oci: OciArgs,
    /// Also accept VMs named in the legacy unhashed form `vk-<namespace>-<pod>`
    /// (ambiguous across namespaces with dashes: only for VMs created before
    /// the stack hashed names)
    #[arg(long, env = "COCOON_FIXUP_ACCEPT_LEGACY_VM_NAMES")]
    #[serde(default)]
    pub accept_legacy_vm_names: bool,
    /// Also accept a VM whose name is the pod's vm.cocoonstack.io/name
    /// though not derived from the pod (the retired cocoon-webhook's
    /// Deployment slots), when it begins with vk-<pod namespace>- and no
    /// other pod on the node claims it. It trusts that annotation: safe
    /// only where the admission policy (deploy/admission-policy.yaml) is
    /// installed
    #[arg(long, env = "COCOON_FIXUP_ACCEPT_ANNOTATED_VM_NAMES")]
    #[serde(default)]
    pub accept_annotated_vm_names: bool,
    /// `serve`: pods holding a turn at once (inspecting, planning, running
    /// the fixup); the wake grace, the serial-console pass and the IP
    /// wait hold none [default: 16]
    #[arg(long, value_name = "N", env = "COCOON_FIXUP_CONCURRENCY")]
    pub concurrency: Option<usize>,
    /// `serve`: address of /metrics and /healthz [default: 0.0.0.0:9464]
    #[arg(long, value_name = "ADDR", env = "COCOON_FIXUP_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// `serve`: look for changed plugin files and configuration this often
    /// and reload them without a restart; 0s turns it off, anything else
    /// is at least 100ms [default: 2s]
    #[arg(long, value_name = "DURATION", env = "COCOON_FIXUP_PLUGIN_RELOAD_INTERVAL", value_parser = duration)]
    #[serde(default, with = "opt_duration")]
    pub plugin_reload_interval: Option<Duration>,
    /// `serve`: pods watched after a reload puts a new plugin version in
    /// service; 0 watches none (no rollback) [default: 10]
    #[arg(long, value_name = "N", env = "COCOON_FIXUP_PLUGIN_ROLLBACK_AFTER")]
    pub plugin_rollback_after: Option<u32>,
    /// `serve`: roll a new plugin version back when it misbehaves for more
    /// than this share of its watched pods where the version it replaced
    /// planned
    /// [default: 0.5]
    #[arg(
        long,
        value_name = "RATIO",
        env = "COCOON_FIXUP_PLUGIN_ROLLBACK_FAILURE_RATIO"
    )]
    pub plugin_rollback_failure_ratio: Option<f64>,
    /// `serve`: a rollback takes failing pods in at least this many
    /// namespaces, none counting for more than its share, so that one
    /// tenant cannot roll a version back for the fleet; 1 where every pod
    /// is one tenant's [default: 2]
    #[arg(
        long,
        value_name = "N",
        env = "COCOON_FIXUP_PLUGIN_ROLLBACK_MIN_NAMESPACES"
    )]
    pub plugin_rollback_min_namespaces: Option<u32>,
    /// The operator's narrowing of plugins' guest policies, by plugin name:
    /// configuration file only (`[plugin_policy.NAME]`, keys `writes`,
    /// `removes`, `runs`, `special_modes`, `links`, as in the contract). A
    /// plan must fit both the plugin's own policy and this; a key left out
    /// allows nothing of its kind.
    #[arg(skip)]
    #[serde(default)]
    pub plugin_policy: BTreeMap<String, RawPolicy>,
    /// What happens when a plugin file traps, breaches a limit or its
    /// policy, or declines (`unsupported`) a VM it claimed, by plugin
    /// name: configuration file only (`[plugin_failure]`, `NAME = "fail"`,
    /// the default, or `"fallback"` to the built-in for the scenario).
    #[arg(skip)]
    #[serde(default)]
    pub plugin_failure: BTreeMap<String, String>,
    /// Whose signatures the plugins pinned from a registry need, by scope
    /// (`HOST[:PORT]` or `HOST[:PORT]/REPOSITORY`, the longest that covers
    /// a reference applies): configuration file only
    /// (`[plugin_trust."SCOPE"]`, `keys = ["/path/vendor.pub", ...]`,
    /// `require = "any-of"` (the default), `"all-of"` or `"none"`).
    #[arg(skip)]
    #[serde(default)]
    pub plugin_trust: BTreeMap<String, RawTrustRule>,
    /// The file's keys that no option has: refused by name when the file
    /// is read (the flattened plugin options rule out serde's own check).
    /// It must stay the last field: serde fills flattened fields in order,
    /// each taking its keys, and this one takes what is left.
    #[arg(skip)]
    #[serde(flatten)]
    unknown: BTreeMap<String, serde::de::IgnoredAny>,
}

mod opt_duration {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        text.map(|t| super::duration(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Everything resolved, with the numbers in force.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub cocoon_bin: PathBuf,
    pub lease_file: PathBuf,
    /// Where each pod's record is kept; `None`: no record (each fixup
    /// loop's budget starts with its task).
    pub state_dir: Option<PathBuf>,
    pub ip_poll: Duration,
    pub planner: PlannerOptions,
    pub host: HostConfig,
    pub concurrency: usize,
    pub metrics_addr: SocketAddr,
    /// Plugins pinned by OCI reference (`plugins`), the store and how the
    /// registries are reached.
    pub pinned: PinnedPlugins,
    /// The file that was read, if any.
    pub file: Option<PathBuf>,
    /// `serve`'s plugin reload and rollback.
    pub reload: ReloadConfig,
}

impl ConfigArgs {
    /// Merge: `self` (flags and environment, from clap) over the file over
    /// the defaults, with the node's cache ([`CacheOwner::Node`]: `run`,
    /// `serve`). `config` is `--config`; without it the default file is
    /// read when it exists.
    pub fn resolve(&self, config: Option<&Path>) -> Result<Resolved, ConfigError> {
        self.resolve_for(config, CacheOwner::Node)
    }

    /// As [`resolve`](Self::resolve), with the cache of `owner` when none
    /// is configured: [`CacheOwner::User`] for the commands a person runs
    /// (`plan`, `capture`, `plugin test`, `plugin inspect`).
    pub fn resolve_for(
        &self,
        config: Option<&Path>,
        owner: CacheOwner,
    ) -> Result<Resolved, ConfigError> {
        let defaults = default_paths(owner, euid(), |v| std::env::var_os(v));
        self.resolve_with(config, owner, defaults)
    }

    /// [`resolve_for`](Self::resolve_for) with the default cache paths
    /// given, so that tests need not change the environment.
    fn resolve_with(
        &self,
        config: Option<&Path>,
        owner: CacheOwner,
        defaults: CachePaths,
    ) -> Result<Resolved, ConfigError> {
        let (file, path) = match config {
            Some(p) => (Self::read(p)?, Some(p.to_owned())),
            None if Path::new(DEFAULT_CONFIG_FILE).is_file() => (
                Self::read(Path::new(DEFAULT_CONFIG_FILE))?,
                Some(PathBuf::from(DEFAULT_CONFIG_FILE)),
            ),
            None => (ConfigArgs::default(), None),
        };
        let a = self.clone().over(file);
        let (cache_dir, cache_key) = cache_paths(&a.plugin, owner, defaults);
        let references = a
            .plugins
            .iter()
            .map(|text| {
                text.parse::<PluginRef>()
                    .and_then(PluginRef::require_digest)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(ConfigError::Plugins)?;
        let trust = TrustPolicy::from_raw(&a.plugin_trust).map_err(ConfigError::Trust)?;
        if let Some(interval) = a.plugin_reload_interval
            && !interval.is_zero()
            && interval < Duration::from_millis(100)
        {
            return Err(ConfigError::Invalid {
                what: "plugin_reload_interval",
                rule: "0s (off) or at least 100ms",
                value: format!("{interval:?}"),
            });
        }
        let ratio = a
            .plugin_rollback_failure_ratio
            .unwrap_or(DEFAULT_MAX_FAILURE_RATIO);
        if !(0.0..=1.0).contains(&ratio) {
            return Err(ConfigError::Invalid {
                what: "plugin_rollback_failure_ratio",
                rule: "a number from 0 to 1",
                value: ratio.to_string(),
            });
        }
        let min_namespaces = a
            .plugin_rollback_min_namespaces
            .unwrap_or(DEFAULT_MIN_NAMESPACES);
        let watch_fixups = a.plugin_rollback_after.unwrap_or(DEFAULT_WATCH_FIXUPS);
        if min_namespaces == 0 || (watch_fixups > 0 && min_namespaces > watch_fixups) {
            return Err(ConfigError::Invalid {
                what: "plugin_rollback_min_namespaces",
                rule: "at least 1 and at most plugin_rollback_after (more could never roll back)",
                value: min_namespaces.to_string(),
            });
        }
        let concurrency = a.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
        if concurrency == 0 {
            return Err(ConfigError::Invalid {
                what: "concurrency",
                rule: "at least 1",
                value: "0".into(),
            });
        }
        let planner = RawPlannerOptions {
            fuel: a.plugin.plugin_fuel,
            memory_mib: a.plugin.plugin_memory_mib,
            deadline: a.plugin.plugin_deadline,
            plan_max_steps: a.plugin.plan_max_steps,
            plan_max_bytes: a.plugin.plan_max_bytes,
            cache_dir,
            cache_key,
            // One instance per pod in flight, plus room for the recovery
            // plans and `plan` calls beside them.
            slots: Some((concurrency as u32).saturating_mul(2).max(DEFAULT_SLOTS)),
            allowed_plugins: a.plugin.allowed_plugins.clone(),
            plugin_policy: a.plugin_policy.clone(),
            plugin_failure: a.plugin_failure.clone(),
            plugin_dir: a.plugin.plugin_dir.clone(),
            cocoon_root: a.cocoon_root.clone(),
        }
        .build()
        .map_err(ConfigError::from)?;
        Ok(Resolved {
            cocoon_bin: a
                .cocoon_bin
                .unwrap_or_else(|| PathBuf::from(DEFAULT_COCOON_BIN)),
            lease_file: a
                .lease_file
                .unwrap_or_else(|| PathBuf::from(DEFAULT_LEASE_FILE)),
            state_dir: match &a.state_dir {
                Some(dir) if dir.as_os_str().is_empty() => None,
                Some(dir) => Some(dir.clone()),
                None => fixup_core::memory::default_state_dir(),
            },
            ip_poll: a.ip_poll.unwrap_or(DEFAULT_LEASE_POLL),
            planner,
            host: HostConfig::from_settings(
                SettingsBuilder {
                    retry_interval: a.retry_interval,
                    retry_budget: a.retry_budget,
                    exec_timeout: a.exec_timeout,
                    inspect_timeout: a.inspect_timeout,
                    ip_wait: a.ip_wait,
                    renew_after: a.renew_after,
                    renew_timeout: a.renew_timeout,
                    dhcp_recovery_after: a.dhcp_recovery_after,
                    wake_event_window: a.wake_event_window,
                    wake_grace: a.wake_grace,
                    wake_event_reporters: Some(a.wake_event_reporters.clone()),
                    sac_deadline: a.sac_deadline,
                    accept_legacy_vm_names: a.accept_legacy_vm_names,
                    accept_annotated_vm_names: a.accept_annotated_vm_names,
                    ..SettingsBuilder::default()
                }
                .build()
                .map_err(ConfigError::from)?,
                // `--concurrency` bounds the pods holding a turn (from the
                // task's admit to its release), not whole tasks: the wake
                // grace, the serial-console pass and the IP wait hold none.
                concurrency,
            ),
            concurrency,
            metrics_addr: a.metrics_addr.unwrap_or_else(|| {
                DEFAULT_METRICS_ADDR
                    .parse()
                    .expect("the default address parses")
            }),
            pinned: PinnedPlugins {
                references,
                store: a.oci.oci_store.or_else(crate::oci::default_store_dir),
                registry: RegistryOptions::from_env(a.oci.oci_plain_http),
                trust,
            },
            file: path,
            reload: ReloadConfig {
                interval: a.plugin_reload_interval.unwrap_or(DEFAULT_RELOAD_INTERVAL),
                watch_fixups,
                max_failure_ratio: ratio,
                min_namespaces,
            },
        })
    }

    fn read(path: &Path) -> Result<ConfigArgs, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let file: ConfigArgs = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            reason: e.message().to_owned(),
        })?;
        match file.unknown.keys().next() {
            Some(key) => Err(ConfigError::Parse {
                path: path.to_owned(),
                reason: format!("unknown key `{key}`"),
            }),
            None => Ok(file),
        }
    }

    /// Field by field: `self` where set, else `file`.
    fn over(self, file: ConfigArgs) -> ConfigArgs {
        ConfigArgs {
            plugin: self.plugin.over(file.plugin),
            cocoon_bin: self.cocoon_bin.or(file.cocoon_bin),
            cocoon_root: self.cocoon_root.or(file.cocoon_root),
            lease_file: self.lease_file.or(file.lease_file),
            state_dir: self.state_dir.or(file.state_dir),
            retry_interval: self.retry_interval.or(file.retry_interval),
            retry_budget: self.retry_budget.or(file.retry_budget),
            exec_timeout: self.exec_timeout.or(file.exec_timeout),
            inspect_timeout: self.inspect_timeout.or(file.inspect_timeout),
            ip_wait: self.ip_wait.or(file.ip_wait),
            ip_poll: self.ip_poll.or(file.ip_poll),
            renew_after: self.renew_after.or(file.renew_after),
            renew_timeout: self.renew_timeout.or(file.renew_timeout),
            dhcp_recovery_after: self.dhcp_recovery_after.or(file.dhcp_recovery_after),
            wake_event_window: self.wake_event_window.or(file.wake_event_window),
            wake_grace: self.wake_grace.or(file.wake_grace),
            wake_event_reporters: list_or(self.wake_event_reporters, file.wake_event_reporters),
            sac_deadline: self.sac_deadline.or(file.sac_deadline),
            accept_legacy_vm_names: self.accept_legacy_vm_names || file.accept_legacy_vm_names,
            accept_annotated_vm_names: self.accept_annotated_vm_names
                || file.accept_annotated_vm_names,
            plugins: list_or(self.plugins, file.plugins),
            oci: OciArgs {
                oci_store: self.oci.oci_store.or(file.oci.oci_store),
                oci_plain_http: list_or(self.oci.oci_plain_http, file.oci.oci_plain_http),
            },
            concurrency: self.concurrency.or(file.concurrency),
            metrics_addr: self.metrics_addr.or(file.metrics_addr),
            plugin_reload_interval: self.plugin_reload_interval.or(file.plugin_reload_interval),
            plugin_rollback_after: self.plugin_rollback_after.or(file.plugin_rollback_after),
            plugin_rollback_failure_ratio: self
                .plugin_rollback_failure_ratio
                .or(file.plugin_rollback_failure_ratio),
            plugin_rollback_min_namespaces: self
                .plugin_rollback_min_namespaces
                .or(file.plugin_rollback_min_namespaces),
            // The file is their only source.
            plugin_policy: file.plugin_policy,
            plugin_failure: file.plugin_failure,
            plugin_trust: file.plugin_trust,
            unknown: BTreeMap::new(),
        }
    }
}

impl PluginConfigArgs {
    /// [`ConfigArgs::resolve_for`] with these options and the person's
    /// own cache ([`CacheOwner::User`]): the other options come from the
    /// file and the defaults.
    pub fn resolve(&self, config: Option<&Path>) -> Result<Resolved, ConfigError> {
        ConfigArgs {
            plugin: self.clone(),
            ..ConfigArgs::default()
        }
        .resolve_for(config, CacheOwner::User)
    }

    /// As [`resolve`](Self::resolve), with the node's cache and key
    /// (those of `run` and `serve`) where none is configured: for the
    /// commands that look at what the daemon keeps beside its key.
    pub fn resolve_for_node(&self, config: Option<&Path>) -> Result<Resolved, ConfigError> {
        ConfigArgs {
            plugin: self.clone(),
            ..ConfigArgs::default()
        }
        .resolve_for(config, CacheOwner::Node)
    }

    /// Field by field: `self` where set, else `file`.
    fn over(self, file: PluginConfigArgs) -> PluginConfigArgs {
        PluginConfigArgs {
            plugin_dir: self.plugin_dir.or(file.plugin_dir),
            cache_dir: self.cache_dir.or(file.cache_dir),
            cache_key: self.cache_key.or(file.cache_key),
            no_cache: self.no_cache || file.no_cache,
            plugin_fuel: self.plugin_fuel.or(file.plugin_fuel),
            plugin_memory_mib: self.plugin_memory_mib.or(file.plugin_memory_mib),
            plugin_deadline: self.plugin_deadline.or(file.plugin_deadline),
            plan_max_steps: self.plan_max_steps.or(file.plan_max_steps),
            plan_max_bytes: self.plan_max_bytes.or(file.plan_max_bytes),
            allowed_plugins: list_or(self.allowed_plugins, file.allowed_plugins),
        }
    }
}

/// The cache directory and key in force. `--no-cache` turns the cache
/// off. A configured directory or key is used as given, with the node's
/// default for the other: a directory and key always come as a pair, so
/// a person's `plan` pointed at the node's cache directory (in the
/// configuration file, say) keys its entries with the node's key and
/// never rewrites them under another. With neither configured, the node
/// takes its defaults (the key left to the engine, whose default is the
/// same place) and a person takes `defaults`, both of them: a person's
/// key may not be left to the engine, or a root shell would key its own
/// cache with the node's key. Where a person has no place for either,
/// there is no cache, and one warning says which is missing.
fn cache_paths(
    p: &PluginConfigArgs,
    owner: CacheOwner,
    defaults: CachePaths,
) -> (Option<PathBuf>, Option<PathBuf>) {
    if p.no_cache {
        return (None, p.cache_key.clone());
    }
    if owner == CacheOwner::Node {
        return (p.cache_dir.clone().or(defaults.dir), p.cache_key.clone());
    }
    if p.cache_dir.is_some() || p.cache_key.is_some() {
        let dir = p.cache_dir.clone().or_else(default_cache_dir);
        return (dir, p.cache_key.clone());
    }
    match (defaults.dir, defaults.key) {
        (Some(dir), Some(key)) => {
            // `sudo` may keep the caller's HOME: root must not make its
            // cache in another user's home (the trust rules would refuse
            // it anyway, with advice to hand that home to root).
            let theirs = [&dir, &key]
                .into_iter()
                .find_map(|path| other_owner(path).map(|uid| (path, uid)));
            if let Some((path, uid)) = theirs {
                tracing::warn!(
                    "no plugin cache: {} is under a directory of uid {uid}, not of uid {} this runs as (HOME kept by sudo?); plugins are compiled at every run; run with `sudo -H`, or give --cache-dir and --cache-key",
                    path.display(),
                    euid()
                );
                return (None, None);
            }
            (Some(dir), Some(key))
        }
        (dir, _) => {
            let missing = if dir.is_none() {
                "a cache directory (set HOME or XDG_CACHE_HOME)"
            } else {
                "a cache key (set HOME or XDG_STATE_HOME)"
            };
            tracing::warn!(
                "no place for this user's plugin cache: {missing}; plugins are compiled at every run; --cache-dir with --cache-key keeps them"
            );
            (None, None)
        }
    }
}

/// The owner of the nearest existing directory at or above `path` when it
/// is neither root nor the user this runs as.
fn other_owner(path: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt as _;
    let owner = path
        .ancestors()
        .find_map(|p| std::fs::metadata(p).ok())?
        .uid();
    (owner != 0 && owner != euid()).then_some(owner)
}

/// A list option: the flag's or environment's list when given, else the
/// file's (lists are replaced, not merged).
fn list_or(mine: Vec<String>, file: Vec<String>) -> Vec<String> {
    if mine.is_empty() { file } else { mine }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use fixup_core::planner::FailurePolicy;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        config: ConfigArgs,
    }

    #[derive(Debug, Parser)]
    struct PluginCli {
        #[command(flatten)]
        config: PluginConfigArgs,
    }

    #[test]
    fn flags_beat_the_file_and_the_file_beats_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        std::fs::write(
            &file,
            "retry_budget = \"60s\"\nretry_interval = \"500ms\"\nconcurrency = 4\n",
        )
        .unwrap();
        let cli = Cli::parse_from(["x", "--retry-budget", "90s"]);
        let s = cli.config.resolve(Some(&file)).unwrap();
        assert_eq!(s.host.retry.budget, Duration::from_secs(90), "flag wins");
        assert_eq!(
            s.host.retry.interval,
            Duration::from_millis(500),
            "file fills in"
        );
        assert_eq!(s.concurrency, 4);
        assert_eq!(
            s.host.retry.exec_timeout,
            Duration::from_secs(90),
            "default"
        );
        assert_eq!(s.host.ready.budget, Duration::from_secs(45));
        assert_eq!(s.file.as_deref(), Some(file.as_path()));
    }

    #[test]
    fn rollback_namespaces_must_be_reachable() {
        for (args, refused) in [
            (&["x", "--plugin-rollback-min-namespaces", "0"][..], true),
            (&["x", "--plugin-rollback-min-namespaces", "11"][..], true),
            (&["x", "--plugin-rollback-min-namespaces", "10"][..], false),
            (
                &[
                    "x",
                    "--plugin-rollback-after",
                    "0",
                    "--plugin-rollback-min-namespaces",
                    "11",
                ][..],
                false,
            ),
        ] {
            let result = Cli::parse_from(args).config.resolve(None);
            match result {
                Err(e) => {
                    assert!(refused, "{args:?}: {e}");
                    assert!(
                        e.to_string().contains("plugin_rollback_min_namespaces"),
                        "{e}"
                    );
                }
                Ok(s) => assert!(!refused && s.reload.min_namespaces > 0, "{args:?}"),
            }
        }
    }

    #[test]
    fn a_plugin_deadline_under_a_millisecond_or_over_a_minute_is_refused() {
        for (deadline, refused) in [("0s", true), ("999us", true), ("1ms", false), ("61s", true)] {
            let cli = Cli::parse_from(["x", "--plugin-deadline", deadline]);
            match cli.config.resolve(None) {
                Err(e) => {
                    assert!(refused, "{deadline}: {e}");
                    assert!(e.to_string().contains("plugin_deadline"), "{e}");
                    assert!(e.to_string().contains("from 1ms to 60s"), "{e}");
                }
                Ok(s) => {
                    assert!(!refused, "{deadline} is refused");
                    assert_eq!(s.planner.engine.limits.deadline, Duration::from_millis(1));
                }
            }
        }
    }

    #[test]
    fn the_file_narrows_plugin_policies() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        std::fs::write(
            &file,
            r#"
[plugin_policy.oci-networkd]
writes = ["/etc/systemd/network/10-*.network"]
runs = [["systemctl", "restart", "systemd-networkd"]]
links = ["eth0"]
"#,
        )
        .unwrap();
        let s = ConfigArgs::default().resolve(Some(&file)).unwrap();
        let narrowing = &s.planner.engine.narrowing["oci-networkd"];
        assert_eq!(narrowing.writes.len(), 1);
        assert!(narrowing.removes.is_empty() && !narrowing.special_modes);
        assert_eq!(
            narrowing.runs[0].argv(),
            ["systemctl", "restart", "systemd-networkd"]
        );
        assert_eq!(narrowing.links.len(), 1);
        assert!(narrowing.links[0].matches("eth0") && !narrowing.links[0].matches("eth1"));

        std::fs::write(&file, "[plugin_policy.x]\nlinks = [\"eth/0\"]\n").unwrap();
        let err = ConfigArgs::default().resolve(Some(&file)).unwrap_err();
        assert!(err.to_string().contains("plugin_policy.x"), "{err}");
        assert!(err.to_string().contains("links[0]"), "{err}");
        std::fs::write(&file, "[plugin_policy.x]\nwrites = [\"/etc/../shadow\"]\n").unwrap();
        let err = ConfigArgs::default().resolve(Some(&file)).unwrap_err();
        assert!(matches!(err, ConfigError::Policy { .. }), "{err:?}");
        assert!(err.to_string().contains("plugin_policy.x"), "{err}");
        assert!(err.to_string().contains("writes[0]"), "{err}");
        std::fs::write(&file, "[plugin_policy.x]\nwrite = []\n").unwrap();
        let err = ConfigArgs::default().resolve(Some(&file)).unwrap_err();
        assert!(err.to_string().contains("write"), "{err}");
    }

    #[test]
    fn the_file_sets_failure_policies_by_plugin_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        std::fs::write(&file, "[plugin_failure]\nacme-net = \"fallback\"\n").unwrap();
        let s = ConfigArgs::default().resolve(Some(&file)).unwrap();
        assert_eq!(s.planner.failure["acme-net"], FailurePolicy::Fallback);
        assert_eq!(s.planner.failure.len(), 1);

        std::fs::write(&file, "[plugin_failure]\nacme-net = \"ignore\"\n").unwrap();
        let err = ConfigArgs::default().resolve(Some(&file)).unwrap_err();
        assert!(err.to_string().contains("plugin_failure"), "{err}");
        assert!(err.to_string().contains("acme-net"), "{err}");
    }

    #[test]
    fn bad_files_say_where_and_what() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        std::fs::write(&file, "retry_budget = \"soon\"\n").unwrap();
        let err = ConfigArgs::default().resolve(Some(&file)).unwrap_err();
        assert!(err.to_string().contains("config.toml"), "{err}");
        std::fs::write(&file, "retry_budgett = \"5s\"\n").unwrap();
        let err = ConfigArgs::default().resolve(Some(&file)).unwrap_err();
        assert!(err.to_string().contains("retry_budgett"), "{err}");
        let err = ConfigArgs::default()
            .resolve(Some(&dir.path().join("missing.toml")))
            .unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }));
    }

    #[test]
    fn the_cache_key_is_a_flag_or_the_default() {
        let cli = Cli::parse_from(["x", "--cache-key", "/etc/cocoon-fixup/cache.key"]);
        let s = cli.config.resolve(None).unwrap();
        assert_eq!(
            s.planner.engine.cache_key.as_deref(),
            Some(Path::new("/etc/cocoon-fixup/cache.key"))
        );
        let s = Cli::parse_from(["x"]).config.resolve(None).unwrap();
        assert_eq!(s.planner.engine.cache_key, None, "the engine's default");
    }

    #[test]
    fn the_state_dir_is_a_flag_an_empty_flag_for_none_or_the_default() {
        let s = Cli::parse_from(["x", "--state-dir", "/srv/state"])
            .config
            .resolve(None)
            .unwrap();
        assert_eq!(s.state_dir.as_deref(), Some(Path::new("/srv/state")));
        let s = Cli::parse_from(["x", "--state-dir", ""])
            .config
            .resolve(None)
            .unwrap();
        assert_eq!(s.state_dir, None);
        let s = Cli::parse_from(["x"]).config.resolve(None).unwrap();
        assert_eq!(s.state_dir, fixup_core::memory::default_state_dir());
    }

    #[test]
    fn plugin_references_must_pin_a_digest() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        let digest = "ab".repeat(32);
        std::fs::write(
            &file,
            format!(
                "plugins = [\"oci://127.0.0.1:5000/acme/net@sha256:{digest}\"]\noci_plain_http = [\"127.0.0.1:5000\"]\n"
            ),
        )
        .unwrap();
        let s = ConfigArgs::default().resolve(Some(&file)).unwrap();
        assert_eq!(s.pinned.references.len(), 1);
        assert_eq!(s.pinned.references[0].digest(), Some(digest.as_str()));
        assert_eq!(s.pinned.registry.plain_http, ["127.0.0.1:5000"]);

        std::fs::write(&file, "plugins = [\"oci://127.0.0.1:5000/acme/net:v1\"]\n").unwrap();
        let err = ConfigArgs::default().resolve(Some(&file)).unwrap_err();
        assert!(matches!(err, ConfigError::Plugins(_)), "{err:?}");
        assert!(err.to_string().contains("pin the digest"), "{err}");
        std::fs::write(&file, "plugins = [\"/etc/plugins/a.wasm\"]\n").unwrap();
        let err = ConfigArgs::default().resolve(Some(&file)).unwrap_err();
        assert!(err.to_string().contains("oci://"), "{err}");
    }

    /// `[plugin_trust]`: each scope's keys are read and checked when the
    /// configuration is, and each mistake is refused naming the table.
    #[test]
    fn the_trust_policy_is_read_and_each_mistake_named() {
        use p256::pkcs8::EncodePublicKey as _;
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        let key = dir.path().join("vendor.pub");
        let pem = p256::ecdsa::SigningKey::from_slice(&[7; 32])
            .unwrap()
            .verifying_key()
            .to_public_key_pem(p256::pkcs8::LineEnding::LF)
            .unwrap();
        std::fs::write(&key, pem).unwrap();
        let key = key.display().to_string();
        let resolve = |table: &str| {
            std::fs::write(&file, table).unwrap();
            ConfigArgs::default().resolve(Some(&file))
        };

        let s = resolve(&format!(
            "[plugin_trust.\"registry.example/acme\"]\nkeys = [\"{key}\"]\nrequire = \"all-of\"\n[plugin_trust.\"127.0.0.1:5000\"]\nkeys = [\"{key}\"]\n"
        ))
        .unwrap();
        let rules = &s.pinned.trust.rules;
        assert_eq!(rules.len(), 2);
        let acme = rules
            .iter()
            .find(|r| r.scope == "registry.example/acme")
            .unwrap();
        assert_eq!(acme.require, crate::oci::trust::Require::AllOf);
        assert_eq!(acme.keys[0].path, Path::new(&key));
        let local = rules.iter().find(|r| r.scope == "127.0.0.1:5000").unwrap();
        assert_eq!(local.require, crate::oci::trust::Require::AnyOf);

        let not_pem = dir.path().join("not.pub");
        std::fs::write(&not_pem, "ssh-ed25519 AAAA").unwrap();
        let open = dir.path().join("open.pub");
        std::fs::copy(&key, &open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o666)).unwrap();
        for (table, says) in [
            (
                format!("[plugin_trust.\"Registry.example/Acme:v1\"]\nkeys = [\"{key}\"]\n"),
                "the scope is not",
            ),
            (
                "[plugin_trust.\"registry.example\"]\nkeys = []\n".to_owned(),
                "no keys",
            ),
            (
                "[plugin_trust.\"registry.example\"]\nkeys = [\"/nonexistent/vendor.pub\"]\n"
                    .to_owned(),
                "/nonexistent",
            ),
            (
                format!(
                    "[plugin_trust.\"registry.example\"]\nkeys = [\"{}\"]\n",
                    not_pem.display()
                ),
                "is not an ECDSA P-256 public key in PEM",
            ),
            (
                format!(
                    "[plugin_trust.\"registry.example\"]\nkeys = [\"{}\"]\n",
                    open.display()
                ),
                "writable by its group or by others",
            ),
        ] {
            let err = resolve(&table).unwrap_err();
            assert!(matches!(err, ConfigError::Trust(_)), "{table}: {err:?}");
            let text = err.to_string();
            assert!(text.contains(says), "{says:?} in {text}");
            assert!(text.contains("plugin_trust."), "{text}");
        }
        for (table, says) in [
            (
                format!("[plugin_trust.\"registry.example\"]\nkey = [\"{key}\"]\n"),
                "unknown field `key`",
            ),
            (
                format!(
                    "[plugin_trust.\"registry.example\"]\nkeys = [\"{key}\"]\nrequire = \"some\"\n"
                ),
                "some",
            ),
        ] {
            let err = resolve(&table).unwrap_err();
            assert!(matches!(err, ConfigError::Parse { .. }), "{table}: {err:?}");
            assert!(err.to_string().contains(says), "{says:?} in {err}");
        }
    }

    /// The OCI options (their own group, for `plugin pull`) are read from
    /// the file like the others, a flag overrides the file, and a misspelt
    /// one is still refused by name.
    #[test]
    fn oci_options_come_from_the_file_or_a_flag() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        std::fs::write(
            &file,
            "oci_store = \"/srv/oci\"\noci_plain_http = [\"127.0.0.1:5000\"]\n",
        )
        .unwrap();
        let s = OciArgs::default().resolve(Some(&file)).unwrap();
        assert_eq!(s.pinned.store.as_deref(), Some(Path::new("/srv/oci")));
        assert_eq!(s.pinned.registry.plain_http, ["127.0.0.1:5000"]);
        let flag = OciArgs {
            oci_store: Some("/srv/other".into()),
            ..OciArgs::default()
        };
        let s = flag.resolve(Some(&file)).unwrap();
        assert_eq!(s.pinned.store.as_deref(), Some(Path::new("/srv/other")));
        assert_eq!(s.pinned.registry.plain_http, ["127.0.0.1:5000"]);

        std::fs::write(&file, "oci_stor = \"/srv/oci\"\n").unwrap();
        let err = OciArgs::default().resolve(Some(&file)).unwrap_err();
        assert!(err.to_string().contains("oci_stor"), "{err}");
    }

    #[test]
    fn plugin_options_and_node_options_share_one_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        std::fs::write(
            &file,
            "plugin_fuel = 1000\nplan_max_steps = 9\nno_cache = true\nretry_budget = \"60s\"\n\
             [plugin_failure]\nacme-net = \"fallback\"\n",
        )
        .unwrap();
        let s = ConfigArgs::default().resolve(Some(&file)).unwrap();
        assert_eq!(s.planner.engine.limits.fuel, 1000);
        assert_eq!(s.planner.engine.limits.plan.max_steps, 9);
        assert_eq!(s.planner.engine.cache_dir, None);
        assert_eq!(s.host.retry.budget, Duration::from_secs(60));
        let cli = PluginCli::parse_from(["x", "--plugin-fuel", "2000"]);
        let s = cli.config.resolve(Some(&file)).unwrap();
        assert_eq!(s.planner.engine.limits.fuel, 2000, "the flag wins");
        assert_eq!(s.planner.engine.limits.plan.max_steps, 9, "from the file");
        assert_eq!(s.planner.failure["acme-net"], FailurePolicy::Fallback);
        assert_eq!(s.host.retry.budget, Duration::from_secs(60), "the file's");

        std::fs::write(&file, "plugin_fuel = 1000\nplugin_fuell = 5\n").unwrap();
        let err = PluginConfigArgs::default()
            .resolve(Some(&file))
            .unwrap_err();
        assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");
        assert!(err.to_string().contains("`plugin_fuell`"), "{err}");
        std::fs::write(&file, "plugin_fuel = \"lots\"\n").unwrap();
        let err = ConfigArgs::default().resolve(Some(&file)).unwrap_err();
        assert!(err.to_string().contains("config.toml"), "{err}");
    }

    fn paths(dir: &str, key: &str) -> CachePaths {
        CachePaths {
            dir: Some(PathBuf::from(dir)),
            key: Some(PathBuf::from(key)),
        }
    }

    /// The cache directory and key a command ends up with.
    fn cache_of(args: &ConfigArgs, owner: CacheOwner, defaults: CachePaths) -> CachePaths {
        let s = args.resolve_with(None, owner, defaults).unwrap();
        CachePaths {
            dir: s.planner.engine.cache_dir,
            key: s.planner.engine.cache_key,
        }
    }

    #[test]
    fn each_command_gets_its_cache() {
        let node = paths("/var/cache/cocoon-fixup", "/var/lib/cocoon-fixup/cache.key");
        let own = paths("/root/.cache/cocoon-fixup", "/root/.local/state/k");
        let none = ConfigArgs::default();
        // The node leaves its key to the engine, whose default is the same.
        assert_eq!(
            cache_of(&none, CacheOwner::Node, node.clone()),
            CachePaths {
                dir: node.dir.clone(),
                key: None
            }
        );
        assert_eq!(cache_of(&none, CacheOwner::User, own.clone()), own);
        // No place for the key: no cache, rather than the node's key.
        let no_key = CachePaths {
            dir: own.dir.clone(),
            key: None,
        };
        assert_eq!(
            cache_of(&none, CacheOwner::User, no_key),
            CachePaths::default()
        );
        let set = Cli::parse_from(["x", "--cache-dir", "/srv/c", "--cache-key", "/srv/k"]);
        for owner in [CacheOwner::Node, CacheOwner::User] {
            assert_eq!(
                cache_of(&set.config, owner, own.clone()),
                paths("/srv/c", "/srv/k"),
                "{owner:?}: as configured"
            );
        }
        let dir_only = Cli::parse_from(["x", "--cache-dir", "/srv/c"]);
        assert_eq!(
            cache_of(&dir_only.config, CacheOwner::User, own.clone()),
            CachePaths {
                dir: Some(PathBuf::from("/srv/c")),
                key: None,
            },
            "a configured directory keeps the node's key (the engine's default), not the person's"
        );
        let off = Cli::parse_from(["x", "--no-cache"]);
        assert_eq!(
            cache_of(&off.config, CacheOwner::User, own).dir,
            None,
            "--no-cache"
        );
    }

    #[test]
    fn a_person_never_caches_in_another_users_home() {
        if euid() != 0 {
            eprintln!("skipped: needs root to give a directory to another user");
            return;
        }
        let home = tempfile::tempdir().unwrap();
        std::os::unix::fs::chown(home.path(), Some(4242), Some(4242)).unwrap();
        let theirs = CachePaths {
            dir: Some(home.path().join(".cache/cocoon-fixup")),
            key: Some(home.path().join(".local/state/cocoon-fixup/cache.key")),
        };
        assert_eq!(other_owner(theirs.dir.as_deref().unwrap()), Some(4242));
        assert_eq!(
            cache_of(&ConfigArgs::default(), CacheOwner::User, theirs),
            CachePaths::default(),
            "no cache rather than one in uid 4242's home"
        );
        let own = tempfile::tempdir().unwrap();
        let mine = CachePaths {
            dir: Some(own.path().join(".cache/cocoon-fixup")),
            key: Some(own.path().join(".local/state/cocoon-fixup/cache.key")),
        };
        assert_eq!(
            cache_of(&ConfigArgs::default(), CacheOwner::User, mine.clone()),
            mine
        );
    }

    #[test]
    fn limits_are_checked() {
        let cli = Cli::parse_from(["x", "--concurrency", "0"]);
        assert!(cli.config.resolve(None).is_err());
        let cli = Cli::parse_from(["x", "--plugin-memory-mib", "0"]);
        assert!(cli.config.resolve(None).is_err());
    }
}
