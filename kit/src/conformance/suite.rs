//! The suite as a replay runs it, and the replay through the decision
//! alone.

use super::*;

/// The suite as an executor's replay runs it: every scenario file, and a
/// cocoon root where each scenario's overlay exists while it is replayed.
#[derive(Debug)]
pub struct Suite {
    root: tempfile::TempDir,
    pub scenarios: Vec<(PathBuf, Scenario)>,
    failures: Vec<String>,
}

impl Suite {
    /// The files of `tests/conformance/` under `workspace`.
    pub fn load(workspace: &Path) -> Suite {
        let suite = Suite::load_dir(&workspace.join("tests/conformance"));
        assert!(
            suite.scenarios.len() >= 20,
            "{} scenarios",
            suite.scenarios.len()
        );
        suite
    }

    /// The files of `tests/conformance-embedder/` under `workspace`: what
    /// an embedder's own knowledge of the VM changes ([`Scenario::knows`]),
    /// which only the embedders' executors replay.
    pub fn load_embedder(workspace: &Path) -> Suite {
        let suite = Suite::load_dir(&workspace.join("tests/conformance-embedder"));
        assert!(!suite.scenarios.is_empty());
        suite
    }

    /// The files of `tests/conformance-owned/` under `workspace`: what
    /// only an embedder that owns the lifecycle sees (replayed with
    /// `lifecycle_intents` alone).
    pub fn load_owned(workspace: &Path) -> Suite {
        let suite = Suite::load_dir(&workspace.join("tests/conformance-owned"));
        assert!(!suite.scenarios.is_empty());
        suite
    }

    fn load_dir(dir: &Path) -> Suite {
        let scenarios = Scenario::all(dir).unwrap_or_else(|e| panic!("{e}"));
        Suite {
            root: tempfile::tempdir().expect("a temporary cocoon root"),
            scenarios,
            failures: Vec::new(),
        }
    }

    /// The cocoon root the planner must probe.
    pub fn cocoon_root(&self) -> &Path {
        self.root.path()
    }

    /// Make the scenario's overlay exist (when it has one) while `replay`
    /// runs, then check what it saw.
    pub fn overlay_path(&self, scenario: &Scenario) -> Option<PathBuf> {
        let id = scenario.vm.as_ref()?.get("id")?.as_str()?;
        scenario.overlay.then(|| {
            self.root
                .path()
                .join("run/cloudhypervisor")
                .join(id)
                .join("overlay.qcow2")
        })
    }

    /// Before a scenario's replay: its overlay, when it has one.
    pub fn prepare(&self, scenario: &Scenario) {
        if let Some(overlay) = self.overlay_path(scenario) {
            std::fs::create_dir_all(overlay.parent().expect("a directory")).unwrap();
            std::fs::write(overlay, b"").unwrap();
        }
    }

    /// After a scenario's replay: check what it saw, remove its overlay.
    pub fn finish(&mut self, index: usize, world: &World, ended: &Ended) {
        let (path, scenario) = &self.scenarios[index];
        if let Err(e) = scenario.check(world, ended) {
            self.failures.push(format!(
                "{}: {}\n{e}\nnotes: {:#?}",
                path.display(),
                scenario.about,
                world.notes
            ));
        }
        if let Some(overlay) = self.overlay_path(scenario) {
            std::fs::remove_file(overlay).unwrap();
        }
    }

    /// Replay every scenario with `replay` (its overlay made first, what it
    /// saw checked after), then [`assert_passed`](Self::assert_passed).
    /// `replay` returns the world it played against and how the task ended.
    pub fn each(mut self, mut replay: impl FnMut(&Scenario) -> (World, Ended)) {
        for i in 0..self.scenarios.len() {
            let scenario = self.scenarios[i].1.clone();
            self.prepare(&scenario);
            let (world, ended) = replay(&scenario);
            self.finish(i, &world, &ended);
        }
        self.assert_passed();
    }

    /// Panic with every scenario that did not replay as expected.
    pub fn assert_passed(&self) {
        assert!(self.failures.is_empty(), "{}", self.failures.join("\n\n"));
    }
}

/// Deterministic nonces for a replay: 1, 2, 3, ...
pub fn counting_nonces() -> fixup_core::decision::NonceSource {
    let mut n = 0u8;
    Box::new(move || {
        n = n.wrapping_add(1);
        let mut bytes = [0u8; 16];
        bytes[15] = n;
        Ok(Nonce::from_bytes(bytes))
    })
}

/// Replay `scenario` through the decision alone, with `planner` (whose
/// cocoon root holds the scenario's overlay, if any): what the world saw,
/// and how the task ended.
pub fn replay(scenario: &Scenario, planner: &Planner) -> (World, Ended) {
    replay_owning(scenario, planner, false)
}

/// [`replay`] with the lifecycle owned by the embedder when
/// `lifecycle_intents`: the world publishes each lifecycle change the task
/// hands over, and no write of the task may carry a lifecycle key.
pub fn replay_owning(
    scenario: &Scenario,
    planner: &Planner,
    lifecycle_intents: bool,
) -> (World, Ended) {
    let mut world = World::new(scenario);
    let mut settings = scenario.settings();
    settings.lifecycle_intents = lifecycle_intents;
    let (mut task, mut action): (Box<dyn Steps>, Action) = match scenario.trigger.fixup() {
        Some(trigger) => {
            let (mut task, action) =
                PodTask::start(world.first_read(), trigger, settings, counting_nonces());
            task.wall_clock(world.scenario.wall_start_ms);
            if let Some((record, wall)) = world.start_record() {
                task.remember(record, wall);
            }
            if let Some(knows) = &scenario.knows {
                task.told(knows.clone());
            }
            (Box::new(task), action)
        }
        None => {
            let (task, action) =
                PrepareTask::start(world.first_read(), settings, counting_nonces());
            (Box::new(task), action)
        }
    };
    let mut now = Duration::ZERO;
    let uid = task.pod().uid.clone();
    loop {
        if !matches!(action, Action::Publish(_)) {
            world.not_publishing();
        }
        let report = match action {
            Action::Finish(result) => return (world, Ended::of(&result, scenario.trigger)),
            Action::Publish(intent) => {
                world.publish(now, &intent.patch());
                Report::Go
            }
            a if a.interruptible() && world.down(now) => Report::Cancelled,
            Action::Note(note) => {
                world.notes.push(format!("{note:?}"));
                Report::Go
            }
            Action::Admit | Action::Release | Action::Checkpoint => Report::Go,
            Action::Tell(event) => {
                let _ = world.event(now, event.reason, &event.message);
                Report::Go
            }
            Action::Inspect { vm, .. } => {
                Report::Inspected(world.inspect(now, &vm).map_err(Into::into))
            }
            Action::OtherPods { .. } => Report::OtherPods(world.other_pods()),
            Action::WakeEvents { field_selectors } => {
                Report::Events(world.events_of(now, &field_selectors))
            }
            Action::Plan(request) => Report::Planned(request.run(planner)),
            Action::Read => Report::Read(world.read(now)),
            Action::Patch {
                patch,
                unless_changed_from,
            } => Report::Patched({
                assert!(
                    !lifecycle_intents
                        || fixup_core::lifecycle::LIFECYCLE_KEYS
                            .iter()
                            .all(|key| !patch.contains_key(*key)),
                    "a write of a task whose embedder owns the lifecycle carries a lifecycle key: {patch:?}"
                );
                world.patch(
                    now,
                    &uid,
                    &patch,
                    unless_changed_from
                        .as_deref()
                        .map(|from| from.resource_version.as_deref().unwrap_or("")),
                )
            }),
            Action::Exec {
                vm,
                argv,
                timeout,
                purpose,
            } => match world.exec_until(&mut now, vm.as_str(), purpose, &argv, timeout) {
                Waited::Done(result) => Report::Ran(result),
                Waited::Cancelled => Report::Cancelled,
            },
            Action::Sleep { until } => match world.sleep_until(&mut now, until) {
                Waited::Done(()) => Report::Go,
                Waited::Cancelled => Report::Cancelled,
            },
            Action::WaitLease { mac, until } => match world.lease_until(&mut now, &mac, until) {
                Waited::Done(found) => Report::Lease(found),
                Waited::Cancelled => Report::Cancelled,
            },
            Action::SacOpen {
                vm,
                need,
                until,
                total,
            } => match world.sac_open_until(&mut now, vm.as_str(), need, (until, total)) {
                Waited::Done(result) => Report::SacOpened(result),
                Waited::Cancelled => Report::Cancelled,
            },
            Action::SacSet {
                net,
                nic,
                until,
                total,
            } => match world.sac_set_until(&mut now, net, nic.ip, (until, total)) {
                Waited::Done(result) => Report::SacSet(result),
                Waited::Cancelled => Report::Cancelled,
            },
            Action::SacClose => Report::Go,
            Action::Remember(record) => {
                world.remember(*record);
                Report::Go
            }
        };
        action = task.next(report, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fixup_core::planner::PlannerOptions;

    /// Every scenario of `suite`, replayed through the decision alone with
    /// the built-in plugins (with `intents`, the lifecycle handed to the
    /// embedder).
    fn replay_every_scenario(suite: Suite, intents: bool) {
        let (planner, failures) = Planner::new(PlannerOptions {
            cocoon_root: suite.cocoon_root().to_owned(),
            ..PlannerOptions::default()
        })
        .unwrap();
        assert!(failures.is_empty(), "{failures:?}");
        suite.each(|scenario| replay_owning(scenario, &planner, intents));
    }

    fn workspace() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// The reference the other executors are held to.
    #[test]
    fn every_scenario_replays_through_the_decision() {
        replay_every_scenario(Suite::load(&workspace()), false);
    }

    /// The embedder's scenarios, in both lifecycle modes, and those of an
    /// embedder that owns the lifecycle with it handed over.
    #[test]
    fn every_embedder_scenario_replays_through_the_decision() {
        for intents in [false, true] {
            replay_every_scenario(Suite::load_embedder(&workspace()), intents);
        }
        replay_every_scenario(Suite::load_owned(&workspace()), true);
    }

    /// With the lifecycle owned by the embedder, the changes it is handed,
    /// published by it, add up to the same writes, in the same order, as
    /// the task's own writes of them.
    #[test]
    fn every_scenario_replays_with_the_lifecycle_handed_over() {
        replay_every_scenario(Suite::load(&workspace()), true);
    }

    /// Scenarios whose serial console takes time (`open_ms`, `takes_ms`
    /// with changes meanwhile), which only the executors with a clock in
    /// their console stand-in can replay: the decision here, and the C op
    /// (`host/capi/src/task.rs`,
    /// `timed_console_scenarios_replay_through_the_task_op`).
    #[test]
    fn timed_console_scenarios_replay_through_the_decision() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/conformance-timed");
        let scenarios = Scenario::all(&dir).unwrap();
        assert!(!scenarios.is_empty());
        let (planner, _) = Planner::new(PlannerOptions::default()).unwrap();
        for (path, scenario) in scenarios {
            for intents in [false, true] {
                let (world, ended) = replay_owning(&scenario, &planner, intents);
                if let Err(e) = scenario.check(&world, &ended) {
                    panic!(
                        "{} (lifecycle handed over: {intents}): {}\n{e}",
                        path.display(),
                        scenario.about
                    );
                }
            }
        }
    }

    /// A fixup that ended done is counted once, as `done` lands: a serial-
    /// console pass that fails after it does not take it back, and one
    /// that succeeds does not count it twice.
    #[rstest::rstest]
    #[case::pass_fails("sac-set-no-answer.json")]
    #[case::pass_succeeds("sac-windows-clone-static.json")]
    fn a_done_fixup_is_counted_once_whatever_the_pass_does(#[case] file: &str) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/conformance")
            .join(file);
        let scenario: Scenario = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let (planner, _) = Planner::new(PlannerOptions::default()).unwrap();
        let (world, _) = replay(&scenario, &planner);
        let counted: Vec<&String> = world
            .notes
            .iter()
            .filter(|n| n.starts_with("Fixup {"))
            .collect();
        assert_eq!(counted.len(), 1, "{:#?}", world.notes);
        assert!(counted[0].contains("end: Done"), "{counted:?}");
        assert!(
            world.notes.iter().any(|n| n.starts_with("Sac(")),
            "{:#?}",
            world.notes
        );
    }
}
