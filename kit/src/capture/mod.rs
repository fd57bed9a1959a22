//! `cocoon-fixup capture`: a field pod made into `plugin test` cases, so a
//! vendor can reproduce what a node saw without the cluster.
//!
//! What a capture reads (the caller gets it: from the cluster and `cocoon`,
//! or from files): the pod, the VM record, and the pod's `PostClone*` and
//! `ResumedAfterRestart` events. What it trusts is what `plan` trusts: the
//! annotations say where to look and what kind of clone it is, and the VM
//! record must be the pod's own (spec section 2, [`bound_record`]) or
//! nothing is captured. It writes nothing to the cluster.
//!
//! # One case per plugin call
//!
//! A case file holds one scenario and runs against one plugin, and a plan
//! can be made by several calls (`fc-mac` then `oci-networkd` on
//! Firecracker): [`capture`] makes one [`CapturedCase`] per call, in plan
//! order. Each case's `expect` is that plugin's own result for the facts
//! (the plugin called alone, as `plugin test` calls it), so `plugin test
//! THAT_PLUGIN.wasm CASE` passes while nothing has changed:
//!
//! - a plan: `{"plan": ...}`;
//! - a refusal (`unsupported`, `invalid-facts`): `{"error": ...}`;
//! - a trap or a breached limit: no `expect` (`plugin test` then shows the
//!   breach), and the error in the context's `call_error`.
//!
//! The facts are the daemon's: a pod whose `post-clone-state` is `running`
//! (work that a restart interrupted) is planned as resumed work (boot kind
//! `resumed`, the source image unknown), as the daemon plans it, unless the
//! caller overrides the boot kind.
//!
//! An all-DHCP Linux clone needs no fixup plan; its one plugin call is the
//! DHCP recovery plan the daemon makes for it when no lease comes
//! (`dhcp-recovery`). A pod that needs no plugin call at all is refused.
//!
//! # The context
//!
//! Each case carries a `context` object (never compared by `plugin test`):
//!
//! - `summary`: one line, which `plugin test` prints;
//! - `captured`: `by` (cocoon-fixup and its version), `at` (RFC 3339),
//!   `from` (`cluster`, or the files read);
//! - `pod` (`namespace`, `name`, `uid`), `vm` (`name`, `id`);
//! - `rule` (`number`, `reason`), `image`, `scenarios` (every call of the
//!   pod's plan, in order), `plugin` (the one this case is for: `name`,
//!   `version`, `sha256`, `source`, `why`), `plugins` (every call's plugin);
//! - `call_error`, when the call trapped or breached a limit;
//! - `field`: what the pod recorded, when it recorded anything:
//!   `post_clone_state`, `errors` (the lines of
//!   `vm.cocoonstack.io/post-clone-errors`), `lifecycle_state`,
//!   `lifecycle_message`, `hint` (the header of the hint script: its
//!   `title` lines and the `plugins` it names), `events` (`type`, `reason`,
//!   `message`, `time`, `count`) and `plugins_named`: every plugin the hint
//!   and the events name with a version (`name`, `version`, `sha256` when
//!   given, possibly short, and `from`).
//!
//! All of it is the pod's own text and may carry anything; the JSON file is
//! data, and whoever prints it passes it through [`fixup_core::display`].

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use fixup_core::annotations::keys;
use fixup_core::binding::{BindingPolicy, Mismatch, Verdict};
use fixup_core::classify::{self, Scenario};
use fixup_core::decision::{self, Lookup, WakeConfig};
use fixup_core::facts::{
    FactError, ImageKind, Overrides, PodInput, VmFacts, VmId, VmInspect, annotations,
};
use fixup_core::lifecycle::HandsOff;
use fixup_core::memory::StackEvent;
use fixup_core::planner::Planner;
use fixup_core::plugin::registry::NoPlugin;
use fixup_core::probe::ProbeError;

mod events;
mod files;
mod mentions;
mod replay;

pub use events::*;
pub use files::*;
pub use mentions::*;
pub use replay::*;

/// Why no case could be captured.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(
        "pod {pod} names no VM (no {} or {} annotation): there is nothing to capture until cocoon has created its VM",
        annotations::VM_ID,
        annotations::VM_NAME
    )]
    NoVm { pod: String },
    /// The VM is not the pod's (spec section 2): the daemon would run
    /// nothing in it, so there is no plan to capture.
    #[error("pod {pod}: not this pod's VM, so the daemon runs nothing in it: {mismatch}")]
    NotThePodsVm { pod: String, mismatch: Mismatch },
    #[error("pod {pod} needs no plugin call (rule {rule}: {reason}): there is no plan to capture")]
    NothingToPlan {
        pod: String,
        rule: u8,
        reason: &'static str,
    },
    /// The daemon would leave the pod alone (spec section 8).
    #[error(
        "pod {pod}: the daemon leaves it alone ({reason}), so there is no plan of its to capture; pass --anyway to capture it regardless"
    )]
    HandsOff { pod: String, reason: HandsOff },
    #[error(transparent)]
    Facts(#[from] FactError),
    #[error(
        "{0}; capture probes the cocoon root as the daemon does: run it on the pod's node, or pass --cocoon-root (or --source-image)"
    )]
    Probe(#[from] ProbeError),
    #[error(transparent)]
    NoPlugin(#[from] NoPlugin),
    #[error("{input}: {reason}; pass `kubectl get events -o json` output")]
    Events { input: String, reason: String },
    #[error("cannot write the case: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Output(String),
    #[error("cannot write {path}; check the path and its permissions")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The VM the annotations point at (the id annotation, else the name
/// annotation), as the daemon looks it up: only where to look, never proof
/// ([`bound_record`] decides).
pub fn vm_reference(pod: &PodInput) -> Result<VmId, CaptureError> {
    match decision::lookup(pod) {
        Lookup::Inspect(vm) => Ok(vm),
        Lookup::NoVm => Err(CaptureError::NoVm {
            pod: pod.display_name(),
        }),
        Lookup::Unusable(mismatch) => Err(CaptureError::NotThePodsVm {
            pod: pod.display_name(),
            mismatch,
        }),
    }
}

/// Check that `record` is the pod's own VM, as the daemon checks it before
/// it runs anything ([`decision::bind_record`]): the verdict, bound or
/// [`Verdict::Unproven`]. A capture has no view of the node's pods, so an
/// annotated name (`--accept-annotated-vm-names`) stays unproven: the
/// caller captures it and says so, never that it is bound.
pub fn bound_record(
    pod: &PodInput,
    record: &VmInspect,
    policy: BindingPolicy,
) -> Result<Verdict, CaptureError> {
    match decision::bind_record(pod, record, policy) {
        verdict @ (Verdict::Bound { .. } | Verdict::Unproven { .. }) => Ok(verdict),
        Verdict::Mismatch(mismatch) => Err(CaptureError::NotThePodsVm {
            pod: pod.display_name(),
            mismatch,
        }),
    }
}

/// What the pod recorded of earlier work: the failure record, the hint's
/// header, the events, and the plugins they name. `None` when it recorded
/// nothing.
fn field_record(pod: &PodInput, events: &[PodEvent], events_truncated: bool) -> Option<Value> {
    let annotation = |key: &str| Some(pod.annotation(key)).filter(|v| !v.is_empty());
    let state = annotation(keys::POST_CLONE_STATE);
    let errors: Vec<&str> = annotation(keys::POST_CLONE_ERRORS)
        .map(|e| e.lines().filter(|l| !l.is_empty()).collect())
        .unwrap_or_default();
    let hint = annotation(keys::POST_CLONE_HINT);
    let lifecycle_state = annotation(keys::LIFECYCLE_STATE);
    if state.is_none()
        && errors.is_empty()
        && hint.is_none()
        && events.is_empty()
        && lifecycle_state.is_none()
        && !pod.deleting
    {
        return None;
    }
    let mut named = Vec::new();
    let hint = hint.map(|hint| match hint_header(hint) {
        Some((title, plugins)) => {
            named.extend(plugins.iter().cloned());
            json!({"title": title, "plugins": plugins})
        }
        None => json!({"unreadable": "the annotation is not base64 of a script"}),
    });
    for event in events {
        named.extend(plugin_mentions(&event.message, &event.reason));
    }
    let mut seen = std::collections::HashSet::new();
    named.retain(|m| seen.insert(m.clone()));
    Some(json!({
        "unverified": "the pod's annotations and events as read: written by the pod's owner or anyone who may create events, not checked",
        "post_clone_state": state,
        "errors": errors,
        "lifecycle_state": lifecycle_state,
        "deleting": pod.deleting,
        "lifecycle_message": annotation(keys::LIFECYCLE_MESSAGE),
        "hint": hint,
        "events": events,
        "events_truncated": events_truncated,
        "plugins_named": named,
    }))
}

/// Where the pod and its VM were read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// From the API server and `cocoon vm inspect`.
    Cluster,
    /// From files.
    Files {
        pod: PathBuf,
        vm: PathBuf,
        events: Option<PathBuf>,
    },
}

impl Source {
    fn json(&self) -> Value {
        match self {
            Source::Cluster => json!("cluster"),
            Source::Files { pod, vm, events } => json!({
                "pod": pod.display().to_string(),
                "vm": vm.display().to_string(),
                "events": events.as_ref().map(|e| e.display().to_string()),
            }),
        }
    }
}

/// What a capture is made from.
#[derive(Debug, Clone)]
pub struct CaptureInput<'a> {
    pub pod: &'a PodInput,
    /// The VM record, already checked with [`bound_record`].
    pub vm: &'a VmInspect,
    pub overrides: &'a Overrides,
    /// The pod's host events ([`is_host_reason`]).
    pub events: &'a [PodEvent],
    /// Whether events were left out ([`MAX_EVENTS`], a page limit).
    pub events_truncated: bool,
    /// Every event about the pod as the wake rule reads it (spec section
    /// 2, rule 2), and how it reads them (the window, the accepted
    /// reporters) at `now_unix_ms`: the stack's `Woken` or
    /// `HibernateSnapshotExists` makes a cloned VM a wake, as for the
    /// daemon.
    pub stack_events: &'a [StackEvent],
    pub wake: &'a WakeConfig,
    /// The capture's wall clock, in milliseconds since the Unix epoch.
    pub now_unix_ms: i64,
    pub source: Source,
    /// The capture time, RFC 3339.
    pub at: String,
    /// `cocoon-fixup <version>`.
    pub by: String,
    /// The cocoon root the overlay probe reads (the planner's).
    pub cocoon_root: &'a Path,
    /// Capture a pod the daemon would leave alone (recorded in
    /// `context.daemon`).
    pub anyway: bool,
}

/// One plugin call of the pod's plan, as a case.
#[derive(Debug, Clone)]
pub struct CapturedCase {
    pub plugin: String,
    /// The plugin's file; `None` for a built-in, which has none.
    pub file: Option<std::path::PathBuf>,
    pub scenario: Scenario,
    /// `plan`, `error` (the plugin declined) or `none` (it breached).
    pub expect: &'static str,
    /// The case file's text.
    pub text: String,
}

impl CapturedCase {
    /// `<plugin>-<scenario>.json`.
    pub fn file_name(&self) -> String {
        format!("{}-{}.json", self.plugin, self.scenario)
    }
}

/// The pod's plugin calls, as cases (see the module documentation).
pub fn capture(
    planner: &Planner,
    input: &CaptureInput<'_>,
) -> Result<Vec<CapturedCase>, CaptureError> {
    let pod = input.pod;
    let (daemon, obs, assumed) = daemon_view(input)?;
    let decision = classify::classify(&obs);
    let (image, scenarios) = match decision.fixup {
        Some(_) => {
            let image = if decision.needs_image_kind() {
                fixup_core::planner::image_kind::<CaptureError>(&obs, input.cocoon_root)?
            } else {
                ImageKind::Unknown
            };
            (image, decision.scenarios(image))
        }
        None if decision.dhcp_recovery(obs.os) => {
            (ImageKind::Unknown, vec![Scenario::DhcpRecovery])
        }
        None => {
            return Err(CaptureError::NothingToPlan {
                pod: pod.display_name(),
                rule: decision.rule.number(),
                reason: decision.rule.reason(),
            });
        }
    };
    let facts = VmFacts::validate(&obs, image)?;
    let registry = planner.plugins().registry();
    let selections = scenarios
        .iter()
        .map(|&s| registry.select(s, facts.flavor.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    let plugins: Vec<Value> = selections
        .iter()
        .map(|s| {
            json!({
                "name": s.plugin.info.name,
                "version": s.plugin.info.version,
                "sha256": s.plugin.sha256,
                "source": s.plugin.origin.to_string(),
                "scenario": s.scenario.as_str(),
                "why": s.reason,
            })
        })
        .collect();
    // The plan as the daemon composes it: every call, the failure policy's
    // fallbacks, composition and the plan limits.
    let composed = match planner.plan_scenarios(&facts, &scenarios) {
        Ok(composed) => {
            let fallbacks: Vec<Value> = composed
                .parts
                .iter()
                .filter_map(|part| {
                    let fallback = part.fallback.as_ref()?;
                    let scenario = part.selection.scenario;
                    Some(json!({
                        "scenario": scenario.as_str(),
                        "kind": fallback.kind,
                        "message": fallback.message(scenario, &part.selection.plugin),
                    }))
                })
                .collect();
            json!({"result": "ok", "fallbacks": fallbacks})
        }
        Err(error) => json!({"result": error.to_string(), "fallbacks": []}),
    };
    let engine = planner.plugins().limits();
    let mut limits = serde_json::to_value(crate::LimitsReport::from(engine))?;
    if let Value::Object(limits) = &mut limits {
        let deadline = u64::try_from(engine.deadline.as_millis()).unwrap_or(u64::MAX);
        limits.insert("deadline_ms".into(), json!(deadline));
    }
    let field = field_record(pod, input.events, input.events_truncated);
    let failed = pod.annotation(keys::POST_CLONE_STATE) == "failed";
    let mut cases = Vec::new();
    for (selection, plugin) in selections.iter().zip(&plugins) {
        let scenario = selection.scenario;
        let result = planner
            .plugins()
            .plan(&selection.plugin, scenario, &facts)
            .map(|(plan, _)| plan);
        let breach = result
            .as_ref()
            .err()
            .filter(|e| !crate::is_refusal(e))
            .map(ToString::to_string);
        let name = &selection.plugin.info.name;
        let mut summary = format!(
            "captured from pod {} (uid {}), VM {} (id {}), at {} by {}: {scenario} by {name} {}",
            pod.display_name(),
            pod.uid.as_deref().unwrap_or("none"),
            facts.name,
            facts.id,
            input.at,
            input.by,
            selection.plugin.info.version,
        );
        if failed {
            let last = pod
                .annotation(keys::POST_CLONE_ERRORS)
                .lines()
                .rfind(|l| !l.is_empty())
                .unwrap_or("no error recorded");
            summary.push_str(&format!("; the pod records: failed, {last}"));
        }
        let mut context = Map::new();
        context.insert("summary".into(), json!(summary));
        context.insert(
            "captured".into(),
            json!({"by": input.by, "at": input.at, "from": input.source.json()}),
        );
        context.insert(
            "pod".into(),
            json!({"namespace": pod.namespace, "name": pod.name, "uid": pod.uid}),
        );
        context.insert(
            "vm".into(),
            json!({"name": facts.name.as_str(), "id": facts.id.as_str()}),
        );
        context.insert(
            "rule".into(),
            json!({"number": decision.rule.number(), "reason": decision.rule.reason()}),
        );
        context.insert("daemon".into(), json!(daemon));
        if let Some(why) = &assumed {
            context.insert("boot_assumed".into(), json!(why));
        }
        context.insert("image".into(), json!(image.as_str()));
        context.insert(
            "scenarios".into(),
            json!(scenarios.iter().map(|s| s.as_str()).collect::<Vec<_>>()),
        );
        context.insert("plugin".into(), plugin.clone());
        context.insert("plugins".into(), json!(plugins));
        context.insert("composed".into(), composed.clone());
        context.insert("limits".into(), limits.clone());
        if let Some(breach) = &breach {
            context.insert("call_error".into(), json!(breach));
        }
        if let Some(field) = &field {
            context.insert("field".into(), field.clone());
        }
        let description = format!(
            "{scenario} for pod {} ({})",
            pod.display_name(),
            if failed {
                "failed in the field"
            } else {
                "captured"
            }
        );
        // Escaped as for a terminal, so the file shows what it holds when
        // it is read with `cat` too.
        let text = fixup_core::display::terminal_json(&crate::case_text(
            Some(&description),
            scenario,
            &facts,
            &result,
            Some(&context),
        )?)
        .into_owned();
        cases.push(CapturedCase {
            plugin: name.clone(),
            file: match &selection.plugin.origin {
                fixup_core::plugin::Origin::File(path) => Some(path.clone()),
                _ => None,
            },
            scenario,
            expect: match (&result, &breach) {
                (Ok(_), _) => "plan",
                (Err(_), None) => "error",
                (Err(_), Some(_)) => "none",
            },
            text,
        });
    }
    Ok(cases)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fixup_core::facts::BootKind;

    #[rstest::rstest]
    #[case::hint_header(
        " fc-mac 0.1.0 sha256:0123456789ab, oci-networkd 0.2.0 sha256:ba9876543210",
        &[("fc-mac", "0.1.0", Some("0123456789ab")), ("oci-networkd", "0.2.0", Some("ba9876543210"))]
    )]
    #[case::fallback_event(
        "plugin acme 1.2.0 (sha256:abc123) failed for oci-networkd: plugin acme trapped: x; planned with the built-in oci-networkd 0.1.0 instead",
        &[("acme", "1.2.0", Some("abc123")), ("oci-networkd", "0.1.0", None)]
    )]
    #[case::no_versions("attempt 2: step 4/5 failed exit 1: plugin acme 3 times", &[])]
    #[case::not_a_digest("acme 1.0 sha256:not-hex", &[])]
    fn plugins_named_with_a_version(
        #[case] text: &str,
        #[case] expected: &[(&str, &str, Option<&str>)],
    ) {
        let found: Vec<(String, String, Option<String>)> = plugin_mentions(text, "x")
            .into_iter()
            .map(|m| (m.name, m.version, m.sha256))
            .collect();
        let expected: Vec<(String, String, Option<String>)> = expected
            .iter()
            .map(|(n, v, d)| ((*n).into(), (*v).into(), d.map(str::to_owned)))
            .collect();
        assert_eq!(found, expected);
    }

    /// The boot kind capture assumes, in the daemon's order: `--boot`,
    /// then a wake (annotation or the stack's event; a wake stays one for
    /// work left `running`), then `resumed` for work left `running`.
    #[rstest::rstest]
    #[case::nothing(false, false, false, None)]
    #[case::running(false, false, true, Some(BootKind::Resumed))]
    #[case::annotated_wake(true, false, false, None)]
    #[case::annotated_wake_running(true, false, true, Some(BootKind::Wake))]
    #[case::event_wake(false, true, false, Some(BootKind::Wake))]
    #[case::event_wake_running(false, true, true, Some(BootKind::Wake))]
    fn a_wake_comes_before_resumed_work(
        #[case] annotated: bool,
        #[case] event: bool,
        #[case] running: bool,
        #[case] expected: Option<BootKind>,
    ) {
        // A managed Cloud Hypervisor Linux clone with a DHCP NIC, as the
        // daemon's decision sees it.
        let mut pod = PodInput {
            name: "desk-0".into(),
            namespace: "desktops".into(),
            uid: Some("u-1".into()),
            ..PodInput::default()
        };
        let name = fixup_core::binding::vm_name_for_pod("desktops", "desk-0");
        for (key, value) in [
            (annotations::VM_ID, "vm-0123abcd"),
            (annotations::VM_NAME, name.as_str()),
            ("cocoonset.cocoonstack.io/managed", "true"),
            ("cocoonset.cocoonstack.io/os", "linux"),
            ("cocoonset.cocoonstack.io/generation", "3"),
            ("vm.cocoonstack.io/backend", "cloud-hypervisor"),
        ] {
            pod.annotations.insert(key.into(), value.into());
        }
        if annotated {
            pod.annotations
                .insert(annotations::RESTORE_FROM_HIBERNATE.into(), "true".into());
        }
        if running {
            pod.annotations
                .insert(keys::POST_CLONE_STATE.into(), "running".into());
        }
        let vm = VmInspect::from_json(
            &json!({"id": "vm-0123abcd", "config": {"name": name},
                "network_configs": [{"mac": "52:54:00:aa:bb:01", "tap": "tap0"}]})
            .to_string(),
            "cocoon vm inspect",
        )
        .unwrap();
        let events = [StackEvent {
            reason: "Woken".into(),
            type_: "Normal".into(),
            reporting_controller: "vk-cocoon".into(),
            regarding_uid: "u-1".into(),
            newest_unix_ms: Some(1_000),
        }];
        let events: &[StackEvent] = if event { &events } else { &[] };
        let replayed = replay(&pod, &vm, events, &WakeConfig::default(), 2_000);
        let observed = replayed
            .observed
            .expect("the daemon's decision classifies the VM");
        let why = assumed_why(&pod, &vm, &observed);
        assert_eq!(why.is_some(), expected.is_some(), "{why:?}");
        if let Some(expected) = expected {
            assert_eq!(observed.boot, Some(expected));
        }
    }

    fn case(plugin: &str, scenario: Scenario) -> CapturedCase {
        CapturedCase {
            plugin: plugin.into(),
            file: None,
            scenario,
            expect: "plan",
            text: "{}\n".into(),
        }
    }

    fn two() -> Vec<CapturedCase> {
        vec![
            case("fc-mac", Scenario::FcMac),
            case("oci-networkd", Scenario::OciNetworkd),
        ]
    }

    #[test]
    fn one_case_goes_to_stdout_or_the_file_several_need_a_folder_or_a_plugin() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("case.json");
        let one = || vec![case("oci-networkd", Scenario::OciNetworkd)];
        assert_eq!(place(one(), None, None, false).unwrap()[0].1, None);
        assert_eq!(
            place(one(), Some(&file), None, false).unwrap()[0].1,
            Some(file.clone())
        );
        let into_dir = place(one(), Some(dir.path()), None, false).unwrap();
        assert_eq!(
            into_dir[0].1,
            Some(dir.path().join("oci-networkd-oci-networkd.json"))
        );

        let err = place(two(), None, None, false).unwrap_err().to_string();
        assert!(
            err.contains("--output DIR") && err.contains("--plugin NAME"),
            "{err}"
        );
        std::fs::write(&file, "x").unwrap();
        let err = place(two(), Some(&file), None, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("is a file"), "{err}");
        let picked = place(two(), None, Some("fc-mac"), false).unwrap();
        assert_eq!(picked.len(), 1);
        assert_eq!(picked[0].0.scenario, Scenario::FcMac);
        let err = place(two(), None, Some("acme"), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("fc-mac (fc-mac), oci-networkd (oci-networkd)"),
            "{err}"
        );
    }

    #[test]
    fn a_trailing_slash_makes_a_folder_and_a_new_name_without_one_is_refused_for_several() {
        let dir = tempfile::tempdir().unwrap();
        // One case into a folder that does not exist yet.
        let cases = dir.path().join("cases/");
        let one = vec![case("oci-networkd", Scenario::OciNetworkd)];
        let placed = place(one, Some(&cases), None, false).unwrap();
        assert!(cases.is_dir(), "created");
        assert_eq!(
            placed[0].1.as_deref(),
            Some(cases.join("oci-networkd-oci-networkd.json").as_path())
        );
        // Several into a new name without the slash: refused, nothing made.
        let web = dir.path().join("web.json");
        let err = place(two(), Some(&web), None, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not end with /"), "{err}");
        assert!(!web.exists(), "no folder made");
        let each = place(two(), Some(&dir.path().join("new/")), None, false).unwrap();
        assert_eq!(
            each[1].1.as_deref(),
            Some(
                dir.path()
                    .join("new/oci-networkd-oci-networkd.json")
                    .as_path()
            )
        );
    }

    #[test]
    fn several_cases_of_one_plugin_suggest_only_a_folder() {
        let same = vec![
            case("oci-networkd", Scenario::OciNetworkd),
            case("oci-networkd", Scenario::FcMac),
        ];
        let err = place(same, None, Some("oci-networkd"), false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--output DIR/"), "{err}");
        assert!(!err.contains("--plugin NAME"), "{err}");
    }

    #[test]
    fn an_existing_target_is_refused_without_force_and_a_link_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, "keep").unwrap();
        let link = dir.path().join("case.json");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let one = || vec![case("oci-networkd", Scenario::OciNetworkd)];

        let err = place(one(), Some(&link), None, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--force"), "{err}");
        // A file that appears after the check is not replaced either.
        let placed = vec![(
            case("oci-networkd", Scenario::OciNetworkd),
            Some(link.clone()),
        )];
        assert!(write(&placed, false).is_err());
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "keep");

        let placed = place(one(), Some(&link), None, true).unwrap();
        write(&placed, true).unwrap();
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "keep");
        assert!(!link.symlink_metadata().unwrap().is_symlink(), "replaced");
        assert_eq!(std::fs::read_to_string(&link).unwrap(), "{}\n");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 2, "no temporary file left");
    }

    #[test]
    fn with_several_cases_every_target_is_checked_before_any_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let second = dir.path().join("oci-networkd-oci-networkd.json");
        std::fs::write(&second, "old").unwrap();
        let err = place(two(), Some(dir.path()), None, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("oci-networkd-oci-networkd.json exists"),
            "{err}"
        );
        assert!(!dir.path().join("fc-mac-fc-mac.json").exists());
        assert_eq!(std::fs::read_to_string(&second).unwrap(), "old");
    }

    #[test]
    fn a_write_error_names_its_cause_once() {
        let err = CaptureError::Write {
            path: "/x/case.json".into(),
            source: std::io::Error::other("disk on fire"),
        };
        // As `{:#}` shows an error: each link of the chain, joined.
        let mut shown = err.to_string();
        let mut cause = std::error::Error::source(&err);
        while let Some(c) = cause {
            shown = format!("{shown}: {c}");
            cause = c.source();
        }
        assert_eq!(shown.matches("disk on fire").count(), 1, "{shown}");
        assert!(shown.starts_with("cannot write /x/case.json"), "{shown}");
    }

    fn event_at(time: &str, reason: &str, message: &str) -> PodEvent {
        PodEvent {
            kind: "Warning".into(),
            reason: reason.into(),
            message: message.into(),
            time: Some(time.into()),
            count: None,
        }
    }

    #[test]
    fn the_newest_events_are_kept() {
        let mut events: Vec<PodEvent> = (0..MAX_EVENTS + 5)
            .rev()
            .map(|i| {
                event_at(
                    &format!("2026-12-01T10:{:02}:{:02}Z", i / 60, i % 60),
                    "PostCloneX",
                    "m",
                )
            })
            .collect();
        assert!(keep_newest(&mut events));
        assert_eq!(events.len(), MAX_EVENTS);
        assert_eq!(events[0].time.as_deref(), Some("2026-12-01T10:00:05Z"));
        let mut few = vec![
            event_at("b", "PostCloneX", "m"),
            event_at("a", "PostCloneX", "m"),
        ];
        assert!(!keep_newest(&mut few));
        assert_eq!(few[0].time.as_deref(), Some("a"));
    }

    #[test]
    fn plugins_named_are_listed_once_even_when_not_adjacent() {
        let fallback = "plugin acme 1.2.0 (sha256:abc123) failed for oci-networkd: x; planned with the built-in oci-networkd 0.1.0 instead";
        let other = "plugin other 2.0.0 (sha256:def456) failed";
        let events = [
            event_at("1", "PostClonePluginFallback", fallback),
            event_at("2", "PostClonePluginFallback", other),
            event_at("3", "PostClonePluginFallback", fallback),
        ];
        let field = field_record(&PodInput::default(), &events, true).expect("recorded");
        let named: Vec<&str> = field["plugins_named"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap())
            .collect();
        assert_eq!(named, ["acme", "oci-networkd", "other"]);
        assert_eq!(field["events_truncated"], true);
    }
}
