//! The numbers of the apply path (spec sections 5 and 6) and the binding
//! policy, resolved once: the config file, the CLI and the C library all
//! build them here ([`SettingsBuilder`]), so no host keeps its own defaults
//! or floors.

use std::time::Duration;

use crate::binding::BindingPolicy;
use crate::planner::OptionError;

/// The shortest retry interval and exec, inspect and renew timeouts: below
/// it a failing exec would be spawned again in a tight loop for the whole
/// budget, or every call would time out before it starts; a mistake, never
/// a setting.
pub const MIN_STEP: Duration = Duration::from_millis(10);

/// The shortest retry budget and IP wait: below it the first attempt, or
/// the first look at the lease file, would have no time at all.
pub const MIN_BUDGET: Duration = Duration::from_millis(100);

/// The longest any of these settings may be. A day is far past any wait
/// the spec asks for, and it keeps every deadline a host computes from a
/// setting (its clock plus the setting) far from overflowing: a larger
/// value is a mistake, never a setting.
pub const MAX_SETTING: Duration = Duration::from_secs(24 * 60 * 60);

/// The retry budget (spec section 5). Defaults: first attempt at once, 3 s
/// between attempts, until 180 s after the first; each exec bounded by
/// 90 s and by what is left of the budget. Configured with
/// `--retry-interval`, `--retry-budget`, `--exec-timeout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryConfig {
    pub interval: Duration,
    pub budget: Duration,
    pub exec_timeout: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            interval: Duration::from_secs(3),
            budget: Duration::from_secs(180),
            exec_timeout: Duration::from_secs(90),
        }
    }
}

/// The IP wait (spec section 6). Defaults: 45 s budget, Windows renew
/// nudge once after 30 s with a 20 s timeout, DHCP recovery for an
/// all-DHCP Linux clone after 15 s. Configured with `--ip-wait`,
/// `--renew-after`, `--renew-timeout`, `--dhcp-recovery-after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyConfig {
    pub budget: Duration,
    pub renew_after: Duration,
    pub renew_timeout: Duration,
    pub dhcp_recovery_after: Duration,
    /// Timeout of the DHCP recovery exec, like every plan exec (90 s,
    /// `--exec-timeout`), never past the IP budget.
    pub recovery_timeout: Duration,
    /// Whether an all-DHCP Linux clone gets the DHCP recovery pass at all
    /// (on by default).
    pub dhcp_recovery: bool,
    /// Whether a Windows guest gets the `ipconfig /renew` nudge at all (on
    /// by default).
    pub renew: bool,
}

impl Default for ReadyConfig {
    fn default() -> Self {
        ReadyConfig {
            budget: Duration::from_secs(45),
            renew_after: Duration::from_secs(30),
            renew_timeout: Duration::from_secs(20),
            dhcp_recovery_after: Duration::from_secs(15),
            recovery_timeout: RetryConfig::default().exec_timeout,
            dhcp_recovery: true,
            renew: true,
        }
    }
}

/// How a hibernate wake is recognised (spec section 2). Defaults: a wake
/// event counts when its newest occurrence is at most 30 minutes before
/// the VM record's `created_at`; a CH+`windows` pod with no evidence
/// either way waits up to 10 s from the host's first sight of its VM for
/// a `Woken` event, looking every second; only events whose
/// `reportingController` is the stack's (`vk-cocoon`) count. Configured
/// with `--wake-event-window`, `--wake-grace` and `--wake-event-reporter`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WakeConfig {
    pub event_window: Duration,
    pub grace: Duration,
    /// How often the events are listed again during the grace.
    pub poll: Duration,
    /// The accepted reporters of wake events (each passed
    /// [`crate::memory::check_reporter`]; never empty).
    pub reporters: Vec<String>,
}

impl Default for WakeConfig {
    fn default() -> Self {
        WakeConfig {
            event_window: crate::memory::WAKE_EVENT_WINDOW,
            grace: Duration::from_secs(10),
            poll: Duration::from_secs(1),
            reporters: vec![crate::memory::STACK_REPORTER.to_owned()],
        }
    }
}

/// The serial-console pass's total deadline, every NIC included (spec
/// section 10): 120 s. Upstream's own numbers (connection tries within
/// 60 s, then 60 s for the prompt; up to 60 listings and 10 set rounds a
/// NIC, each line waiting up to 5 s) run inside it, and it cuts them
/// short: a guest that takes most of both minutes to connect and prompt
/// has little left to list its NICs. A healthy console needs a few
/// seconds for several NICs; a console that answers each line just in
/// time would otherwise hold the pass for minutes per NIC. Raise it with
/// `--sac-deadline` for guests whose console is slow to come up.
pub const DEFAULT_SAC_DEADLINE: Duration = Duration::from_secs(120);

/// Everything the decision for one pod reads besides what it observes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub retry: RetryConfig,
    pub ready: ReadyConfig,
    pub wake: WakeConfig,
    /// Timeout for `cocoon vm inspect` (default 10 s, `--inspect-timeout`).
    pub inspect_timeout: Duration,
    /// The serial-console pass's total deadline ([`DEFAULT_SAC_DEADLINE`],
    /// `--sac-deadline`).
    pub sac_deadline: Duration,
    /// Which VM names bind a VM to its pod (spec section 2).
    pub binding: BindingPolicy,
    /// The embedder owns the lifecycle keys (`lifecycle-state`, its
    /// message, the observed generation and the IP): the task writes none
    /// of them and hands each change to the host as a
    /// [`LifecycleIntent`](crate::decision::LifecycleIntent) instead, right
    /// after the write it belongs to landed (off by default; the daemon
    /// never turns it on).
    pub lifecycle_intents: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            retry: RetryConfig::default(),
            ready: ReadyConfig::default(),
            wake: WakeConfig::default(),
            inspect_timeout: Duration::from_secs(10),
            sac_deadline: DEFAULT_SAC_DEADLINE,
            binding: BindingPolicy::default(),
            lifecycle_intents: false,
        }
    }
}

/// The one place where settings get their values: each option is `None`
/// for its default. The config file and the CLI (through `fixup-host`'s
/// config resolution) and the C library fill it from their own spellings
/// and call [`SettingsBuilder::build`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SettingsBuilder {
    pub retry_interval: Option<Duration>,
    pub retry_budget: Option<Duration>,
    pub exec_timeout: Option<Duration>,
    pub inspect_timeout: Option<Duration>,
    pub ip_wait: Option<Duration>,
    pub renew_after: Option<Duration>,
    pub renew_timeout: Option<Duration>,
    pub dhcp_recovery_after: Option<Duration>,
    pub wake_event_window: Option<Duration>,
    pub wake_grace: Option<Duration>,
    /// The accepted reporters of wake events; `None` or empty: the stack's
    /// own, `vk-cocoon`.
    pub wake_event_reporters: Option<Vec<String>>,
    pub sac_deadline: Option<Duration>,
    pub accept_legacy_vm_names: bool,
    pub accept_annotated_vm_names: bool,
    /// `Some(false)` switches the DHCP recovery pass off.
    pub dhcp_recovery: Option<bool>,
    /// `Some(false)` switches the Windows renew nudge off.
    pub windows_renew: Option<bool>,
    /// [`Settings::lifecycle_intents`].
    pub lifecycle_intents: bool,
}

impl SettingsBuilder {
    /// The settings, defaults filled in, or the first one below its floor
    /// ([`MIN_STEP`], [`MIN_BUDGET`]) or above [`MAX_SETTING`]. The DHCP
    /// recovery exec is bounded like every plan exec (`exec_timeout`).
    pub fn build(&self) -> Result<Settings, OptionError> {
        const STEP: (Duration, &str) = (MIN_STEP, "at least 10ms");
        const BUDGET: (Duration, &str) = (MIN_BUDGET, "at least 100ms");
        const ANY: (Duration, &str) = (Duration::ZERO, "");
        for (what, value, (floor, rule)) in [
            ("retry_interval", self.retry_interval, STEP),
            ("exec_timeout", self.exec_timeout, STEP),
            ("inspect_timeout", self.inspect_timeout, STEP),
            ("renew_timeout", self.renew_timeout, STEP),
            ("retry_budget", self.retry_budget, BUDGET),
            ("ip_wait", self.ip_wait, BUDGET),
            ("sac_deadline", self.sac_deadline, BUDGET),
            ("renew_after", self.renew_after, ANY),
            ("dhcp_recovery_after", self.dhcp_recovery_after, ANY),
            ("wake_event_window", self.wake_event_window, ANY),
            ("wake_grace", self.wake_grace, ANY),
        ] {
            let Some(value) = value else { continue };
            let rule = if value < floor {
                rule
            } else if value > MAX_SETTING {
                "at most 24h"
            } else {
                continue;
            };
            return Err(OptionError::Invalid {
                what,
                rule,
                value: format!("{value:?}"),
            });
        }
        let retry_default = RetryConfig::default();
        let ready_default = ReadyConfig::default();
        let wake_default = WakeConfig::default();
        let reporters = match &self.wake_event_reporters {
            Some(reporters) if !reporters.is_empty() => {
                for reporter in reporters {
                    crate::memory::check_reporter(reporter).map_err(|e| OptionError::Invalid {
                        what: "wake_event_reporters",
                        rule: "names of the stack's event sources: 1 to 128 letters, digits, `.`, `_`, `-`, `:` or `/`, never cocoon-fixup",
                        value: e.to_string(),
                    })?;
                }
                reporters.clone()
            }
            _ => wake_default.reporters.clone(),
        };
        let exec_timeout = self.exec_timeout.unwrap_or(retry_default.exec_timeout);
        Ok(Settings {
            retry: RetryConfig {
                interval: self.retry_interval.unwrap_or(retry_default.interval),
                budget: self.retry_budget.unwrap_or(retry_default.budget),
                exec_timeout,
            },
            ready: ReadyConfig {
                budget: self.ip_wait.unwrap_or(ready_default.budget),
                renew_after: self.renew_after.unwrap_or(ready_default.renew_after),
                renew_timeout: self.renew_timeout.unwrap_or(ready_default.renew_timeout),
                dhcp_recovery_after: self
                    .dhcp_recovery_after
                    .unwrap_or(ready_default.dhcp_recovery_after),
                recovery_timeout: exec_timeout,
                dhcp_recovery: self.dhcp_recovery.unwrap_or(true),
                renew: self.windows_renew.unwrap_or(true),
            },
            wake: WakeConfig {
                event_window: self.wake_event_window.unwrap_or(wake_default.event_window),
                grace: self.wake_grace.unwrap_or(wake_default.grace),
                poll: wake_default.poll,
                reporters,
            },
            inspect_timeout: self
                .inspect_timeout
                .unwrap_or(Settings::default().inspect_timeout),
            sac_deadline: self.sac_deadline.unwrap_or(DEFAULT_SAC_DEADLINE),
            binding: BindingPolicy {
                accept_legacy_names: self.accept_legacy_vm_names,
                accept_annotated_names: self.accept_annotated_vm_names,
            },
            lifecycle_intents: self.lifecycle_intents,
        })
    }
}

/// The settings as JSON spells them, before they are checked: durations
/// in milliseconds, absent for the default. The conformance suite's
/// `settings` and the C library's task option `settings`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawSettings {
    pub retry_interval_ms: Option<u64>,
    pub retry_budget_ms: Option<u64>,
    pub exec_timeout_ms: Option<u64>,
    pub inspect_timeout_ms: Option<u64>,
    pub ip_wait_ms: Option<u64>,
    pub renew_after_ms: Option<u64>,
    pub renew_timeout_ms: Option<u64>,
    pub dhcp_recovery_after_ms: Option<u64>,
    pub wake_event_window_ms: Option<u64>,
    pub wake_grace_ms: Option<u64>,
    pub sac_deadline_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_event_reporters: Option<Vec<String>>,
    #[serde(default)]
    pub accept_legacy_vm_names: bool,
    #[serde(default)]
    pub accept_annotated_vm_names: bool,
    /// `false` switches the DHCP recovery pass off (absent: on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhcp_recovery: Option<bool>,
    /// `false` switches the Windows renew nudge off (absent: on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows_renew: Option<bool>,
    /// The embedder owns the lifecycle keys ([`Settings::lifecycle_intents`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lifecycle_intents: bool,
}

impl RawSettings {
    /// The builder these values fill.
    pub fn builder(&self) -> SettingsBuilder {
        let ms = |v: Option<u64>| v.map(Duration::from_millis);
        SettingsBuilder {
            retry_interval: ms(self.retry_interval_ms),
            retry_budget: ms(self.retry_budget_ms),
            exec_timeout: ms(self.exec_timeout_ms),
            inspect_timeout: ms(self.inspect_timeout_ms),
            ip_wait: ms(self.ip_wait_ms),
            renew_after: ms(self.renew_after_ms),
            renew_timeout: ms(self.renew_timeout_ms),
            dhcp_recovery_after: ms(self.dhcp_recovery_after_ms),
            wake_event_window: ms(self.wake_event_window_ms),
            wake_grace: ms(self.wake_grace_ms),
            sac_deadline: ms(self.sac_deadline_ms),
            wake_event_reporters: self.wake_event_reporters.clone(),
            accept_legacy_vm_names: self.accept_legacy_vm_names,
            accept_annotated_vm_names: self.accept_annotated_vm_names,
            dhcp_recovery: self.dhcp_recovery,
            windows_renew: self.windows_renew,
            lifecycle_intents: self.lifecycle_intents,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_below_the_floor_are_refused_naming_the_option() {
        for what in [
            "retry_interval",
            "exec_timeout",
            "inspect_timeout",
            "renew_timeout",
        ] {
            for (ms, refused) in [(0, true), (9, true), (10, false)] {
                let value = Some(Duration::from_millis(ms));
                let mut builder = SettingsBuilder::default();
                match what {
                    "retry_interval" => builder.retry_interval = value,
                    "exec_timeout" => builder.exec_timeout = value,
                    "inspect_timeout" => builder.inspect_timeout = value,
                    _ => builder.renew_timeout = value,
                }
                match builder.build() {
                    Err(e) => {
                        assert!(refused, "{what} {ms}ms: {e}");
                        assert!(e.to_string().starts_with(what), "{e}");
                    }
                    Ok(_) => assert!(!refused, "{what} {ms}ms was taken"),
                }
            }
        }
        for (what, ms, refused) in [
            ("retry_budget", 0, true),
            ("retry_budget", 99, true),
            ("retry_budget", 100, false),
            ("ip_wait", 0, true),
            ("ip_wait", 100, false),
            ("sac_deadline", 99, true),
            ("sac_deadline", 100, false),
        ] {
            let value = Some(Duration::from_millis(ms));
            let builder = if what == "retry_budget" {
                SettingsBuilder {
                    retry_budget: value,
                    ..Default::default()
                }
            } else if what == "sac_deadline" {
                SettingsBuilder {
                    sac_deadline: value,
                    ..Default::default()
                }
            } else {
                SettingsBuilder {
                    ip_wait: value,
                    ..Default::default()
                }
            };
            assert_eq!(builder.build().is_err(), refused, "{what} {ms}ms");
        }
    }

    #[test]
    fn wake_event_reporters_are_checked_and_default_to_the_stack() {
        let built = SettingsBuilder::default().build().unwrap();
        assert_eq!(built.wake.reporters, ["vk-cocoon"]);
        let empty = SettingsBuilder {
            wake_event_reporters: Some(vec![]),
            ..Default::default()
        };
        assert_eq!(empty.build().unwrap().wake.reporters, ["vk-cocoon"]);
        let two = SettingsBuilder {
            wake_event_reporters: Some(vec!["vk-cocoon".into(), "vk-cocoon-eu".into()]),
            ..Default::default()
        };
        assert_eq!(two.build().unwrap().wake.reporters.len(), 2);
        for bad in ["cocoon-fixup", "a,b", ""] {
            let e = SettingsBuilder {
                wake_event_reporters: Some(vec![bad.into()]),
                ..Default::default()
            }
            .build()
            .unwrap_err()
            .to_string();
            assert!(e.starts_with("wake_event_reporters"), "{e}");
        }
    }

    /// A setting past a day would put a host's deadlines (its clock plus
    /// the setting) near overflow: refused, naming the option; a day is
    /// taken.
    #[test]
    fn settings_above_a_day_are_refused_naming_the_option() {
        let day = MAX_SETTING;
        let over = day + Duration::from_millis(1);
        for what in [
            "retry_interval",
            "retry_budget",
            "exec_timeout",
            "inspect_timeout",
            "ip_wait",
            "renew_after",
            "renew_timeout",
            "dhcp_recovery_after",
            "wake_event_window",
            "wake_grace",
            "sac_deadline",
        ] {
            let with = |value: Duration| {
                let ms = Some(u64::try_from(value.as_millis()).unwrap());
                let mut json = RawSettings::default();
                match what {
                    "retry_interval" => json.retry_interval_ms = ms,
                    "retry_budget" => json.retry_budget_ms = ms,
                    "exec_timeout" => json.exec_timeout_ms = ms,
                    "inspect_timeout" => json.inspect_timeout_ms = ms,
                    "ip_wait" => json.ip_wait_ms = ms,
                    "renew_after" => json.renew_after_ms = ms,
                    "renew_timeout" => json.renew_timeout_ms = ms,
                    "wake_event_window" => json.wake_event_window_ms = ms,
                    "wake_grace" => json.wake_grace_ms = ms,
                    "sac_deadline" => json.sac_deadline_ms = ms,
                    _ => json.dhcp_recovery_after_ms = ms,
                }
                json.builder().build()
            };
            assert!(with(day).is_ok(), "{what} of a day");
            let e = with(over).unwrap_err().to_string();
            assert!(e.starts_with(what) && e.contains("at most 24h"), "{e}");
        }
        let huge = RawSettings {
            ip_wait_ms: Some(u64::MAX),
            ..RawSettings::default()
        };
        assert!(huge.builder().build().is_err());
    }
}
