//! [`RawPlannerOptions`]: the planner's options as a person or an embedder
//! gives them (each one optional, as text where a file holds text), checked
//! and resolved to [`PlannerOptions`] in one place. The CLI and its config
//! file (`fixup-host`'s `config.rs`) and the C library's options JSON fill
//! it in and read the same defaults, floors and quarantine list.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use super::{FailurePolicy, PlannerOptions};
use crate::plan::PlanLimits;
use crate::plan::policy::{GuestPolicy, RawPolicy};
use crate::plugin::quarantine::QuarantineFile;
use crate::plugin::sandbox::{DEFAULT_DEADLINE, DEFAULT_FUEL, DEFAULT_MEMORY_BYTES};
use crate::plugin::{
    DEFAULT_PLUGIN_DIR, DEFAULT_SLOTS, EngineOptions, Limits, MEMORY_MIB_RANGE, parse_sha256,
};
use crate::probe::DEFAULT_COCOON_ROOT;

/// The shortest plugin deadline: below a millisecond it would stop every
/// plugin's `describe` before it starts, a mistake and never a setting.
pub const MIN_DEADLINE: Duration = Duration::from_millis(1);

/// The longest plugin deadline: a plugin call plans, it does not wait for
/// anything, and a longer deadline would hold an instance slot, and the
/// pods behind it, for as long.
pub const MAX_DEADLINE: Duration = Duration::from_secs(60);

/// The planner's options before they are checked; `None` (or empty) is
/// the default of each.
#[derive(Debug, Clone, Default)]
pub struct RawPlannerOptions {
    /// Fuel per plugin call (default [`DEFAULT_FUEL`]).
    pub fuel: Option<u64>,
    /// Linear memory per plugin instance in MiB, 1..=4096 (default
    /// [`DEFAULT_MEMORY_BYTES`]).
    pub memory_mib: Option<u32>,
    /// Wall-clock deadline per plugin call, at least [`MIN_DEADLINE`]
    /// (default [`DEFAULT_DEADLINE`]).
    pub deadline: Option<Duration>,
    pub plan_max_steps: Option<usize>,
    pub plan_max_bytes: Option<usize>,
    /// Where precompiled plugins are kept; `None` compiles at every start.
    /// Resolved by the caller: the default differs between a daemon run as
    /// root and a user's command.
    pub cache_dir: Option<PathBuf>,
    /// The key that authenticates the cache; the quarantine file is read
    /// beside it (or beside the default key).
    pub cache_key: Option<PathBuf>,
    /// Plugin instances kept ready (default [`DEFAULT_SLOTS`], at least 1).
    pub slots: Option<u32>,
    /// When not empty, only files with these sha256 digests load.
    pub allowed_plugins: Vec<String>,
    /// A guest policy per plugin name that narrows the declared one.
    pub plugin_policy: BTreeMap<String, RawPolicy>,
    /// `fail` or `fallback` per plugin name.
    pub plugin_failure: BTreeMap<String, String>,
    /// Vendor plugins: an existing directory; empty is none at all;
    /// `None` is [`DEFAULT_PLUGIN_DIR`] when it exists.
    pub plugin_dir: Option<PathBuf>,
    /// The cocoon root (default [`DEFAULT_COCOON_ROOT`]).
    pub cocoon_root: Option<PathBuf>,
}

/// An option that cannot be used, with the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    #[error("{what} must be {rule}, got {value}")]
    Invalid {
        what: &'static str,
        rule: &'static str,
        value: String,
    },
    #[error("plugin_policy.{plugin}: {reason}")]
    Policy { plugin: String, reason: String },
    #[error("plugin directory {} does not exist: create it or drop the setting", .path.display())]
    PluginDir { path: PathBuf },
}

impl RawPlannerOptions {
    /// Check every option and fill in the defaults.
    pub fn build(self) -> Result<PlannerOptions, OptionError> {
        let memory_mib = self
            .memory_mib
            .unwrap_or((DEFAULT_MEMORY_BYTES >> 20) as u32);
        if !MEMORY_MIB_RANGE.contains(&memory_mib) {
            return Err(OptionError::Invalid {
                what: "plugin_memory_mib",
                rule: "1..=4096",
                value: memory_mib.to_string(),
            });
        }
        if let Some(deadline) = self.deadline
            && !(MIN_DEADLINE..=MAX_DEADLINE).contains(&deadline)
        {
            return Err(OptionError::Invalid {
                what: "plugin_deadline",
                rule: "from 1ms to 60s",
                value: format!("{deadline:?}"),
            });
        }
        // Zero would fail every plugin call, or refuse every plan: a
        // mistake, never a limit.
        for (what, value) in [
            ("plugin_fuel", self.fuel),
            ("plan_max_steps", self.plan_max_steps.map(|n| n as u64)),
            ("plan_max_bytes", self.plan_max_bytes.map(|n| n as u64)),
        ] {
            if value == Some(0) {
                return Err(OptionError::Invalid {
                    what,
                    rule: "at least 1",
                    value: "0".to_owned(),
                });
            }
        }
        let mut allowed = BTreeSet::new();
        for digest in &self.allowed_plugins {
            allowed.insert(parse_sha256(digest).map_err(|value| OptionError::Invalid {
                what: "allowed_plugins",
                rule: "64 hex digits per entry",
                value,
            })?);
        }
        let mut narrowing = BTreeMap::new();
        for (name, raw) in &self.plugin_policy {
            let policy = GuestPolicy::parse(raw).map_err(|e| OptionError::Policy {
                plugin: name.clone(),
                reason: e.to_string(),
            })?;
            narrowing.insert(name.clone(), policy);
        }
        let mut failure = BTreeMap::new();
        for (name, value) in &self.plugin_failure {
            let policy = FailurePolicy::parse(value).ok_or_else(|| OptionError::Invalid {
                what: "plugin_failure",
                rule: "`fail` or `fallback` for each plugin name",
                value: format!("{name} = {value:?}"),
            })?;
            failure.insert(name.clone(), policy);
        }
        let plugin_dir = match self.plugin_dir {
            Some(dir) if dir.as_os_str().is_empty() => None,
            Some(dir) if dir.is_dir() => Some(dir),
            Some(path) => return Err(OptionError::PluginDir { path }),
            None => Some(PathBuf::from(DEFAULT_PLUGIN_DIR)).filter(|d| d.is_dir()),
        };
        // What a rollback took out of service stays out for every host
        // that shares the cache key.
        let quarantined = QuarantineFile::beside_key(self.cache_key.as_deref())
            .map(|q| q.read())
            .unwrap_or_default();
        let plan_default = PlanLimits::default();
        Ok(PlannerOptions {
            engine: EngineOptions {
                limits: Limits {
                    fuel: self.fuel.unwrap_or(DEFAULT_FUEL),
                    memory_bytes: (memory_mib as usize) << 20,
                    deadline: self.deadline.unwrap_or(DEFAULT_DEADLINE),
                    plan: PlanLimits {
                        max_steps: self.plan_max_steps.unwrap_or(plan_default.max_steps),
                        max_bytes: self.plan_max_bytes.unwrap_or(plan_default.max_bytes),
                    },
                },
                cache_dir: self.cache_dir,
                cache_key: self.cache_key,
                slots: self.slots.unwrap_or(DEFAULT_SLOTS).max(1),
                allowed_sha256: (!allowed.is_empty()).then_some(allowed),
                narrowing,
                quarantined,
            },
            cocoon_root: self
                .cocoon_root
                .unwrap_or_else(|| PathBuf::from(DEFAULT_COCOON_ROOT)),
            plugin_dir,
            failure,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_in_and_floors_hold() {
        let options = RawPlannerOptions::default().build().unwrap();
        assert_eq!(options.engine.limits.deadline, DEFAULT_DEADLINE);
        assert_eq!(options.engine.limits.fuel, DEFAULT_FUEL);
        assert_eq!(options.engine.slots, DEFAULT_SLOTS);
        for (deadline, refused) in [
            (0, true),
            (999, true),
            (1000, false),
            (60_000_000, false),
            (60_000_001, true),
        ] {
            let result = RawPlannerOptions {
                deadline: Some(Duration::from_micros(deadline)),
                ..Default::default()
            }
            .build();
            assert_eq!(result.is_err(), refused, "{deadline}us: {result:?}");
        }
        for (mib, refused) in [(0, true), (1, false), (4096, false), (4097, true)] {
            let result = RawPlannerOptions {
                memory_mib: Some(mib),
                ..Default::default()
            }
            .build();
            assert_eq!(result.is_err(), refused, "{mib} MiB");
        }
        for (settings, what) in [
            (
                RawPlannerOptions {
                    fuel: Some(0),
                    ..Default::default()
                },
                "plugin_fuel",
            ),
            (
                RawPlannerOptions {
                    plan_max_steps: Some(0),
                    ..Default::default()
                },
                "plan_max_steps",
            ),
            (
                RawPlannerOptions {
                    plan_max_bytes: Some(0),
                    ..Default::default()
                },
                "plan_max_bytes",
            ),
        ] {
            let e = settings.build().unwrap_err().to_string();
            assert!(e.starts_with(what) && e.contains("at least 1"), "{e}");
        }
        let slots = RawPlannerOptions {
            slots: Some(0),
            ..Default::default()
        };
        assert_eq!(slots.build().unwrap().engine.slots, 1);
    }

    #[test]
    fn bad_entries_name_the_option() {
        let cases = [
            (
                RawPlannerOptions {
                    allowed_plugins: vec!["abc".into()],
                    ..Default::default()
                },
                "allowed_plugins",
            ),
            (
                RawPlannerOptions {
                    plugin_failure: BTreeMap::from([("x".into(), "retry".into())]),
                    ..Default::default()
                },
                "plugin_failure",
            ),
            (
                RawPlannerOptions {
                    plugin_policy: BTreeMap::from([(
                        "x".into(),
                        RawPolicy {
                            writes: vec!["relative/path".into()],
                            ..Default::default()
                        },
                    )]),
                    ..Default::default()
                },
                "plugin_policy.x",
            ),
            (
                RawPlannerOptions {
                    plugin_dir: Some("/nonexistent/plugins".into()),
                    ..Default::default()
                },
                "/nonexistent/plugins",
            ),
        ];
        for (settings, named) in cases {
            let e = settings.build().unwrap_err();
            assert!(e.to_string().contains(named), "{e}");
        }
        let none = RawPlannerOptions {
            plugin_dir: Some(PathBuf::new()),
            ..Default::default()
        };
        assert_eq!(none.build().unwrap().plugin_dir, None);
    }

    #[test]
    fn the_quarantine_beside_the_key_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let digest = "ab".repeat(32);
        QuarantineFile::in_dir(dir.path())
            .add(&digest, "test")
            .unwrap();
        let read = RawPlannerOptions {
            cache_key: Some(dir.path().join("cache.key")),
            ..Default::default()
        };
        assert!(read.build().unwrap().engine.quarantined.contains(&digest));
        let elsewhere = RawPlannerOptions {
            cache_key: Some(dir.path().join("sub").join("cache.key")),
            ..Default::default()
        };
        assert!(
            !elsewhere
                .build()
                .unwrap()
                .engine
                .quarantined
                .contains(&digest)
        );
    }
}
