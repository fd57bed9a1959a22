//! The world of a scenario: the simulated cocoon, API server and lease
//! file every replay meets, and its answer to each of the task op's
//! actions.

use super::*;

/// The simulated cocoon, API server and lease file of a scenario.
#[derive(Debug)]
pub struct World {
    pub(super) scenario: Scenario,
    /// The pod as the API server holds it now; `None` when deleted.
    pod: Option<PodInput>,
    version: u64,
    /// Changes not made yet, soonest first.
    changes: Vec<Change>,
    execs_done: usize,
    sac_sets_done: usize,
    requests: BTreeMap<&'static str, u32>,
    /// What the host did that others see.
    pub seen: Vec<Seen>,
    /// What the host told its operator (for a failing scenario's report).
    pub notes: Vec<String>,
    /// The host's record of the pod, as last kept; `None` when the host
    /// keeps no records ([`Scenario::record`]).
    pub record: Option<PodMemory>,
    /// The host's last request was a write that landed: a lifecycle
    /// change published now belongs to it ([`World::publish`]).
    just_wrote: bool,
}

/// The report (JSON, without `now_ms`) of a task-op action (JSON, as the
/// C library and the JSON ops hand it out) carried out against `world`
/// from `*now`, as an embedder would; `*now` moves to the action's end.
/// `None` for `finish`, with how the task ended. The C op's replay and the
/// Go package's (through `conformance-world`) both answer with it.
pub fn answer(world: &mut World, now: &mut Duration, action: &Value) -> Result<Value, Ended> {
    use fixup_core::decision::reports::{
        intent_from_json, pod_error_json, ran_json, sac_error_json,
    };
    use serde_json::json;
    let a = action;
    let str_of = |key: &str| a[key].as_str().unwrap_or_default().to_owned();
    let ms_of = |key: &str| Duration::from_millis(a[key].as_u64().expect("a time in ms"));
    let kind = str_of("action");
    let interruptible = matches!(
        kind.as_str(),
        "admit" | "checkpoint" | "exec" | "wait_lease" | "sleep" | "sac_open" | "sac_set"
    );
    fn waited<T>(waited: Waited<T>, report: impl FnOnce(T) -> Value) -> Value {
        match waited {
            Waited::Done(value) => report(value),
            Waited::Cancelled => json!({"cancelled": true}),
        }
    }
    if kind == "publish" {
        let intent = intent_from_json(a);
        world.publish(*now, &intent.patch());
        return Ok(json!({"go": true}));
    }
    world.not_publishing();
    if kind == "finish" {
        return Err(match a.get("stop") {
            Some(stop) => Ended::Stop {
                kind: Box::leak(
                    stop["kind"]
                        .as_str()
                        .expect("a stop has a kind")
                        .to_owned()
                        .into_boxed_str(),
                ),
                retryable: stop["retryable"].as_bool().expect("a stop says retryable"),
                again: stop.get("again").cloned().unwrap_or(Value::Null),
            },
            None => Ended::Summary(a["summary"].clone()),
        });
    }
    if interruptible && world.down(*now) {
        return Ok(json!({"cancelled": true}));
    }
    Ok(match kind.as_str() {
        "admit" | "release" | "checkpoint" | "note" | "sac_close" => json!({"go": true}),
        "remember" => {
            let record = a["record"].to_string();
            world.remember(PodMemory::from_json(record.as_bytes()).expect("a record"));
            json!({"go": true})
        }
        "sac_open" => {
            let need = usize::try_from(a["need"].as_u64().expect("need")).expect("need");
            let deadline = (ms_of("until_ms"), ms_of("total_ms"));
            waited(
                world.sac_open_until(now, &str_of("vm"), need, deadline),
                |result| match result {
                    Ok(nets) => json!({"sac_opened": nets}),
                    Err(e) => json!({"sac_open_error": sac_error_json(&e)}),
                },
            )
        }
        "sac_set" => {
            let net = u32::try_from(a["net"].as_u64().expect("net")).expect("net");
            let ip = str_of("ip").parse().expect("an address");
            let deadline = (ms_of("until_ms"), ms_of("total_ms"));
            waited(
                world.sac_set_until(now, net, ip, deadline),
                |result| match result {
                    Ok(()) => json!({"sac_set": true}),
                    Err(e) => json!({"sac_set_error": sac_error_json(&e)}),
                },
            )
        }
        "tell" => {
            let _ = world.event(*now, &str_of("reason"), &str_of("message"));
            json!({"go": true})
        }
        "inspect" => match world.inspect(*now, &VmId::parse(&str_of("vm")).expect("a VM id")) {
            Ok(_) => json!({"inspected": world.scenario.vm.clone().expect("a record")}),
            Err(e) => json!({"inspect_error": e}),
        },
        "wake_events" => match world.events_of(
            *now,
            &serde_json::from_value::<Vec<String>>(a["field_selectors"].clone())
                .expect("wake_events names its field selectors"),
        ) {
            Ok(listed) => {
                let events: Vec<Value> = listed.events.iter().map(StackEvent::to_value).collect();
                // A listing cut short says so under its own key.
                if listed.truncated {
                    json!({ "events_truncated": events })
                } else {
                    json!({ "events": events })
                }
            }
            Err(e) => json!({"events_error": e}),
        },
        "other_pods" => match world.other_pods() {
            Ok(pods) => json!({"other_pods": pods.iter().map(pod_json).collect::<Vec<_>>()}),
            Err(e) => json!({"other_pods_error": e}),
        },
        "read" => match world.read(*now) {
            Ok(pod) => json!({"read": pod.as_ref().map(pod_json)}),
            Err(e) => json!({"read_error": pod_error_json(&e)}),
        },
        "patch" => {
            let patch = serde_json::from_value(a["annotations"].clone()).expect("a patch");
            let version = a["resource_version"].as_str();
            match world.patch(*now, &str_of("uid"), &patch, version) {
                Ok(Guarded::Written(pod)) => json!({"patched": pod.as_ref().map(pod_json)}),
                Ok(Guarded::Changed(pod)) => json!({"changed": pod_json(&pod)}),
                Err(e) => json!({"patch_error": pod_error_json(&e)}),
            }
        }
        "exec" => {
            let argv: Vec<String> = serde_json::from_value(a["argv"].clone()).expect("an argv");
            let purpose: ExecPurpose = match a.get("purpose") {
                Some(purpose) => serde_json::from_value(purpose.clone()).expect("a purpose"),
                None => world.purpose_of(&argv),
            };
            let timeout = ms_of("timeout_ms");
            waited(
                world.exec_until(now, &str_of("vm"), purpose, &argv, timeout),
                |result| match result {
                    Ok(out) => json!({"ran": ran_json(&out)}),
                    Err(e) => json!({"exec_error": e}),
                },
            )
        }
        "sleep" => waited(
            world.sleep_until(now, ms_of("until_ms")),
            |()| json!({"go": true}),
        ),
        "wait_lease" => {
            let mac = MacAddr::parse(&str_of("mac")).expect("a MAC");
            waited(
                world.lease_until(now, &mac, ms_of("until_ms")),
                |found| match found {
                    Ok(ip) => json!({"lease": ip.map(|ip| ip.to_string())}),
                    Err(why) => json!({"lease_error": why}),
                },
            )
        }
        other => panic!("unknown action {other:?}"),
    })
}

/// The options a task of the C library's op (`cf_task_start`'s
/// `options_json`) starts with for `scenario` in `world`: its trigger, its
/// settings (the binding policy is the planner's, so not among them) and,
/// when the host keeps records, the record and the wall clock. Shared by
/// the C op's replay and `conformance-world`.
pub fn task_options(world: &World, scenario: &Scenario) -> Value {
    let mut options = serde_json::json!({
        "trigger": scenario.trigger.as_str(),
        "settings": RawSettings {
            accept_legacy_vm_names: false,
            accept_annotated_vm_names: false,
            ..scenario.settings.clone()
        },
        "now_unix_ms": scenario.wall_start_ms,
    });
    if let Some(knows) = &scenario.knows {
        options["knows"] = serde_json::to_value(knows).expect("what the embedder knows is JSON");
    }
    if let Some((record, wall)) = world.start_record() {
        options["memory"] = serde_json::json!({
            "record": record,
            "now_unix_ms": wall,
            "watched_since_new": scenario.watched_since_new,
        });
    }
    options
}

/// Milliseconds of a duration, for traces.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl World {
    pub fn new(scenario: &Scenario) -> World {
        let mut pod = scenario.pod_input();
        pod.resource_version = Some("1".to_owned());
        let mut changes = scenario.changes.clone();
        changes.sort_by_key(|c| c.at_ms);
        World {
            scenario: scenario.clone(),
            pod: Some(pod),
            version: 1,
            changes,
            execs_done: 0,
            sac_sets_done: 0,
            requests: BTreeMap::new(),
            seen: Vec::new(),
            notes: Vec::new(),
            record: scenario.record.as_ref().map(|record| {
                let mut memory = match record {
                    Value::Null => PodMemory::new(),
                    record => PodMemory::from_json(record.to_string().as_bytes())
                        .expect("a scenario's record is a record"),
                };
                memory.set_watched_since_new(scenario.watched_since_new);
                memory
            }),
            just_wrote: false,
        }
    }

    /// The record and the wall clock a task starts with, when the host
    /// keeps records.
    pub fn start_record(&self) -> Option<(PodMemory, u64)> {
        let record = self.record.clone()?;
        Some((record, self.scenario.wall_start_ms))
    }

    /// The host kept `record`.
    pub fn remember(&mut self, record: PodMemory) {
        self.record = Some(record);
    }

    /// The pod as the host first read it (not counted as a request: an
    /// embedder may hand the task a pod it already holds).
    pub fn first_read(&self) -> PodInput {
        self.pod.clone().expect("the pod exists at the start")
    }

    /// Make every change due at `now`.
    pub fn advance(&mut self, now: Duration) {
        let now = ms(now);
        while self.changes.first().is_some_and(|c| c.at_ms <= now) {
            let change = self.changes.remove(0);
            let Some(pod) = self.pod.as_mut() else {
                continue;
            };
            for (k, v) in &change.annotations {
                match v {
                    Some(v) => pod.annotations.insert(k.clone(), v.clone()),
                    None => pod.annotations.remove(k),
                };
            }
            if change.deleting {
                pod.deleting = true;
            }
            if change.recreated {
                let uid = pod.uid.clone().unwrap_or_default();
                pod.uid = Some(format!("{uid}-again"));
                pod.annotations = self.scenario.pod_input().annotations;
                pod.deleting = false;
            }
            self.version += 1;
            pod.resource_version = Some(self.version.to_string());
            if change.deleted {
                self.pod = None;
            }
        }
    }

    fn fault(&mut self, kind: RequestKind) -> Option<PodError> {
        let key = match kind {
            RequestKind::Read => "read",
            RequestKind::Patch => "patch",
            RequestKind::Event => "event",
        };
        let n = self.requests.entry(key).or_default();
        *n += 1;
        let n = *n;
        let pod = self.label();
        self.scenario
            .faults
            .iter()
            .find(|f| f.request == kind && n >= f.nth && n < f.nth + f.count)
            .map(|f| match f.answer {
                FaultAnswer::Unavailable => PodError::Api {
                    pod,
                    reason: "the API server is unavailable".to_owned(),
                },
                FaultAnswer::Refused => PodError::Refused {
                    pod,
                    reason: "403 Forbidden".to_owned(),
                },
            })
    }

    fn label(&self) -> String {
        let pod = self.scenario.pod_input();
        format!("{}/{}", pod.namespace, pod.name)
    }

    /// The pod by name, now.
    pub fn read(&mut self, now: Duration) -> Result<Option<PodInput>, PodError> {
        self.advance(now);
        if let Some(e) = self.fault(RequestKind::Read) {
            return Err(e);
        }
        Ok(self.pod.clone())
    }

    /// A merge patch of annotations under the uid precondition of `uid`,
    /// and the `resource_version` one when given.
    pub fn patch(
        &mut self,
        now: Duration,
        uid: &str,
        patch: &AnnotationPatch,
        resource_version: Option<&str>,
    ) -> Result<Guarded, PodError> {
        self.advance(now);
        if let Some(e) = self.fault(RequestKind::Patch) {
            return Err(e);
        }
        let gone = PodError::Gone { pod: self.label() };
        let Some(pod) = self.pod.as_mut() else {
            return Err(gone);
        };
        if pod.uid.as_deref() != Some(uid) {
            return Err(gone);
        }
        if let Some(version) = resource_version
            && Some(version) != pod.resource_version.as_deref()
        {
            return Ok(Guarded::Changed(pod.clone()));
        }
        merge(pod, &mut self.version, patch);
        self.seen.push(Seen::Write {
            at_ms: ms(now),
            patch: patch.clone(),
        });
        self.just_wrote = true;
        Ok(Guarded::Written(Some(pod.clone())))
    }

    /// The embedder publishing a lifecycle change (`patch`: its keys), as
    /// an embedder that owns the lifecycle does: written as it is, without
    /// preconditions. Seen as part of the host's write it goes with when
    /// that write was the host's last request, else as a write of its own:
    /// so the same expected trace holds whoever writes the lifecycle.
    pub fn publish(&mut self, now: Duration, patch: &AnnotationPatch) {
        self.advance(now);
        let with_last = std::mem::take(&mut self.just_wrote);
        let Some(pod) = self.pod.as_mut() else {
            return;
        };
        merge(pod, &mut self.version, patch);
        match self.seen.last_mut() {
            Some(Seen::Write { patch: last, .. }) if with_last => last.extend(patch.clone()),
            _ => self.seen.push(Seen::Write {
                at_ms: ms(now),
                patch: patch.clone(),
            }),
        }
    }

    /// Any request but a publish: a lifecycle change published after it
    /// is a write of its own.
    pub fn not_publishing(&mut self) {
        self.just_wrote = false;
    }

    /// An event about the pod; a failure is the host's to log.
    pub fn event(&mut self, now: Duration, reason: &str, message: &str) -> Result<(), PodError> {
        self.advance(now);
        if let Some(e) = self.fault(RequestKind::Event) {
            return Err(e);
        }
        self.seen.push(Seen::Event {
            at_ms: ms(now),
            reason: reason.to_owned(),
            message: message.to_owned(),
        });
        Ok(())
    }

    /// What an exec is for, as a stand-in for `cocoon` that sees only the
    /// argv tells it: the renew nudge by its command, the recovery pass by
    /// the event told just before it, else a fixup attempt.
    pub fn purpose_of(&self, argv: &[String]) -> ExecPurpose {
        if self.scenario.trigger == TriggerName::Prepare {
            return ExecPurpose::Prepare;
        }
        // Written out, not taken from the decision: a change of the
        // nudge's argv must show in the replays.
        if argv == ["cmd", "/c", "ipconfig /renew"] {
            return ExecPurpose::Renew;
        }
        match self.seen.last() {
            Some(Seen::Event { reason, .. })
                if reason == fixup_core::annotations::reasons::DHCP_RECOVERY =>
            {
                ExecPurpose::Recovery
            }
            _ => ExecPurpose::Fixup,
        }
    }

    /// The pods the host sees on its node: the scenario's pod as it is
    /// now (a watch sees it too) unless `pod_off_node`, then `other_pods`;
    /// or why it sees none.
    pub fn other_pods(&self) -> Result<Vec<PodInput>, String> {
        let others = self
            .scenario
            .other_pods
            .as_ref()
            .ok_or_else(|| "the host has no view of its node's pods".to_owned())?;
        let mut pods: Vec<PodInput> = if self.scenario.pod_off_node {
            Vec::new()
        } else {
            self.pod.iter().cloned().collect()
        };
        for (i, pod) in others.iter().enumerate() {
            let input = format!("other_pods[{i}]");
            pods.push(PodInput::from_value(pod, &input).unwrap_or_else(|e| panic!("{e}")));
        }
        Ok(pods)
    }

    /// The events the API server holds at `now` that `selector` (a field
    /// selector of events.k8s.io/v1) selects, first created first and at
    /// most [`LISTED_AT_MOST`], and whether more matched; or why they
    /// cannot be listed.
    pub fn events(&self, now: Duration, selector: &str) -> Result<Listed, String> {
        if self.scenario.events_unreadable {
            return Err("events.k8s.io \"events\" is forbidden: cannot list resource \"events\" in the namespace".to_owned());
        }
        let now = ms(now);
        let wall = i64::try_from(self.scenario.wall_start_ms).unwrap_or(i64::MAX);
        let own = self
            .pod
            .as_ref()
            .and_then(|p| p.uid.clone())
            .unwrap_or_default();
        let mut listed = Vec::new();
        for e in self.scenario.events.iter().filter(|e| e.at_ms <= now) {
            let event = StackEvent {
                reason: e.reason.clone(),
                type_: e.type_.clone(),
                reporting_controller: e.reporting_controller.clone(),
                regarding_uid: e.regarding_uid.clone().unwrap_or_else(|| own.clone()),
                newest_unix_ms: Some(
                    e.newest_unix_ms
                        .unwrap_or(wall.saturating_add(i64::try_from(e.at_ms).unwrap_or(0))),
                ),
            };
            if fixup_core::memory::evidence::selects(selector, &event)? {
                listed.extend(std::iter::repeat_n(event, e.count));
            }
        }
        let truncated = listed.len() > LISTED_AT_MOST;
        listed.truncate(LISTED_AT_MOST);
        Ok(Listed {
            events: listed,
            truncated,
        })
    }

    /// Every listing of `selectors`, together, as a host reports them.
    pub fn events_of(&self, now: Duration, selectors: &[String]) -> Result<Listed, String> {
        let mut all = Listed::default();
        for selector in selectors {
            let listed = self.events(now, selector)?;
            all.events.extend(listed.events);
            all.truncated |= listed.truncated;
        }
        Ok(all)
    }

    /// `cocoon vm inspect`.
    pub fn inspect(&mut self, now: Duration, vm: &VmId) -> Result<VmInspect, String> {
        self.seen.push(Seen::Inspect {
            at_ms: ms(now),
            vm: vm.as_str().to_owned(),
        });
        if let Some(e) = &self.scenario.inspect_error {
            return Err(e.clone());
        }
        let record = self
            .scenario
            .vm
            .as_ref()
            .ok_or_else(|| format!("no VM {vm}"))?;
        VmInspect::from_value(record, "vm").map_err(|e| e.to_string())
    }

    /// `cocoon vm exec`: how long it takes (never past `timeout`) and its
    /// output. A successful exec of a script writes the done marker of
    /// the nonce its argv carries.
    pub fn exec(
        &mut self,
        now: Duration,
        vm: &str,
        purpose: ExecPurpose,
        argv: &[String],
        timeout: Duration,
    ) -> (Duration, Result<ExecOutput, String>) {
        self.seen.push(Seen::Exec {
            at_ms: ms(now),
            vm: vm.to_owned(),
            purpose,
            timeout_ms: ms(timeout),
        });
        let script = self
            .scenario
            .execs
            .get(self.execs_done)
            .cloned()
            .unwrap_or_default();
        self.execs_done += 1;
        let takes = Duration::from_millis(script.takes_ms);
        if takes > timeout {
            return (
                timeout,
                Err(format!("cocoon vm exec timed out after {}ms", ms(timeout))),
            );
        }
        if let Some(e) = script.error {
            return (takes, Err(e));
        }
        let mut stderr = script.stderr.into_bytes();
        let status = match script.signal {
            Some(signal) => ExitStatusKind::Signal(signal),
            None => ExitStatusKind::Code(script.exit),
        };
        if status == ExitStatusKind::Code(0)
            && let Some(nonce) = exec_nonce(argv)
        {
            stderr.extend(format!("\n{}\n", done_marker(&nonce)).bytes());
        }
        (
            takes,
            Ok(ExecOutput {
                status,
                stdout: Vec::new(),
                stderr,
                stderr_cut: false,
            }),
        )
    }

    /// Opening the VM's console at `*now`: the interfaces listed, or the
    /// scripted failure; the clock moves to its end, or to the shutdown
    /// that stops it, or to the pass's deadline `until` (of a pass of
    /// `total`), where a slower open fails as its dial.
    pub fn sac_open_until(
        &mut self,
        now: &mut Duration,
        vm: &str,
        need: usize,
        (until, total): (Duration, Duration),
    ) -> Waited<Result<Vec<u32>, SacError>> {
        self.seen.push(Seen::SacOpen {
            at_ms: ms(*now),
            vm: vm.to_owned(),
        });
        let script = self.scenario.sac.clone();
        let result = match &script.open_error {
            Some(fault) => Err(fault.error(need, 0, Ipv4Addr::UNSPECIFIED)),
            None => Ok(script
                .nets
                .unwrap_or_else(|| (7..).take(need).collect::<Vec<u32>>())),
        };
        let ends = *now + Duration::from_millis(script.open_ms);
        let step = fixup_sac::Step::Dial;
        self.until_deadline(now, ends, result, (until, total, step))
    }

    /// One set on the open console at `*now`, bounded by the pass's
    /// deadline as [`World::sac_open_until`] is (a slower set fails as
    /// its set line).
    pub fn sac_set_until(
        &mut self,
        now: &mut Duration,
        net: u32,
        ip: Ipv4Addr,
        (until, total): (Duration, Duration),
    ) -> Waited<Result<(), SacError>> {
        self.seen.push(Seen::SacSet {
            at_ms: ms(*now),
            net,
            ip,
        });
        let script = self
            .scenario
            .sac
            .sets
            .get(self.sac_sets_done)
            .cloned()
            .unwrap_or_default();
        self.sac_sets_done += 1;
        let result = match &script.error {
            Some(fault) => Err(fault.error(0, net, ip)),
            None => Ok(()),
        };
        let ends = *now + Duration::from_millis(script.takes_ms);
        let step = fixup_sac::Step::Set { net };
        self.until_deadline(now, ends, result, (until, total, step))
    }

    /// When `mac` has a lease at or after `now`, no later than `until`,
    /// and its address.
    pub fn lease(
        &self,
        mac: &MacAddr,
        now: Duration,
        until: Duration,
    ) -> Option<(Duration, Ipv4Addr)> {
        self.scenario
            .leases
            .iter()
            .filter(|l| MacAddr::parse(&l.mac).is_ok_and(|m| m == *mac))
            .map(|l| (Duration::from_millis(l.at_ms).max(now), l.ip))
            .filter(|(at, _)| *at <= until)
            .min_by_key(|(at, _)| *at)
    }

    /// When the host shuts down.
    pub fn shutdown_at(&self) -> Option<Duration> {
        self.scenario.shutdown_at_ms.map(Duration::from_millis)
    }
}

/// What a wait says of a lease file that is no list of leases
/// ([`Scenario::lease_file_unusable`]); the daemon's replay writes a file
/// that makes its watcher say so too.
pub const UNUSABLE_LEASE_FILE: &str = "lease file: not a JSON array of leases";

/// How a wait in the world ended.
#[derive(Debug)]
pub enum Waited<T> {
    Done(T),
    /// The host shut down first.
    Cancelled,
}

impl World {
    /// Whether the host has shut down by `now`.
    pub fn down(&self, now: Duration) -> bool {
        self.shutdown_at().is_some_and(|s| s <= now)
    }

    /// An exec that starts at `*now`; the clock moves to its end, or to
    /// the shutdown that stops it.
    pub fn exec_until(
        &mut self,
        now: &mut Duration,
        vm: &str,
        purpose: ExecPurpose,
        argv: &[String],
        timeout: Duration,
    ) -> Waited<Result<ExecOutput, String>> {
        let (takes, result) = self.exec(*now, vm, purpose, argv, timeout);
        self.until(now, *now + takes, result)
    }

    /// A sleep from `*now` until `until`.
    pub fn sleep_until(&self, now: &mut Duration, until: Duration) -> Waited<()> {
        self.until(now, until.max(*now), ())
    }

    /// A wait for `mac`'s lease from `*now` until `until`.
    pub fn lease_until(
        &self,
        now: &mut Duration,
        mac: &MacAddr,
        until: Duration,
    ) -> Waited<Result<Option<Ipv4Addr>, String>> {
        if self.scenario.lease_file_unusable {
            return self.until(now, until.max(*now), Err(UNUSABLE_LEASE_FILE.to_owned()));
        }
        let found = self.lease(mac, *now, until);
        let ends = found.map_or(until, |(at, _)| at).max(*now);
        self.until(now, ends, Ok(found.map(|(_, ip)| ip)))
    }

    /// [`World::until`] for a console step that the pass's deadline
    /// (`until`, of a pass of `total`) cuts short during `step`.
    fn until_deadline<T>(
        &self,
        now: &mut Duration,
        ends: Duration,
        value: Result<T, SacError>,
        (until, total, step): (Duration, Duration, fixup_sac::Step),
    ) -> Waited<Result<T, SacError>> {
        if ends <= until {
            return self.until(now, ends, value);
        }
        self.until(now, until, Err(SacError::Deadline { step, total }))
    }

    fn until<T>(&self, now: &mut Duration, ends: Duration, value: T) -> Waited<T> {
        match self.shutdown_at().filter(|s| *s < ends) {
            Some(s) => {
                *now = (*now).max(s);
                Waited::Cancelled
            }
            None => {
                *now = ends;
                Waited::Done(value)
            }
        }
    }
}

/// The pod as the API server sends it.
pub fn pod_json(pod: &PodInput) -> Value {
    let mut metadata = serde_json::json!({
        "name": pod.name,
        "namespace": pod.namespace,
        "uid": pod.uid,
        "annotations": pod.annotations,
        "resourceVersion": pod.resource_version,
    });
    if pod.deleting {
        metadata["deletionTimestamp"] = Value::from("2026-12-01T10:00:00Z");
    }
    serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": []}})
}

/// Merge `patch` into the pod's annotations as the API server does, and
/// move its version on.
fn merge(pod: &mut PodInput, version: &mut u64, patch: &AnnotationPatch) {
    for (k, v) in patch {
        match v {
            Some(v) => pod.annotations.insert(k.clone(), v.clone()),
            None => pod.annotations.remove(k),
        };
    }
    *version += 1;
    pod.resource_version = Some(version.to_string());
}
