//! Plugin calls run off the daemon's async workers: a plugin that spins
//! until its deadline holds a blocking-pool thread and one engine slot,
//! never the runtime that serves the watch, the metrics listener and the
//! other pods.
//!
//! Every test runs `Host::handle` on a runtime with one thread (current
//! thread) and counts the ticks a timer task on that same thread gets while
//! a plugin call is in flight (`PluginHost::calls_in_flight`). A call that
//! ran on the runtime's thread would leave that count at exactly zero.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fixup_core::decision::{NodeError, Stop, Summary, Trigger};
use fixup_core::facts::{VmId, VmInspect};
use fixup_core::planner::{Planner, PlannerOptions};
use fixup_core::plugin::{EngineOptions, Limits, PluginError};
use fixup_host::cocoon::{Cocoon, CocoonError, ExecOutput};
use fixup_host::host::{Host, HostConfig};
use fixup_host::metrics::Metrics;
use fixup_host::pods::MemoryPods;
use fixup_host::ready::LeaseWatcher;
use tokio_util::sync::CancellationToken;

/// The hostile plugin spins for a VM whose id is `hostile-spin`.
const SPINNING_VM_ID: &str = "hostile-spin";

/// Wall-clock deadline of each call: the spin ends there.
const DEADLINE: Duration = Duration::from_millis(200);

/// A `cocoon` whose every VM is the spinning one, named as the stack names
/// the VM of the pod that asks; nothing is ever executed (the plan fails).
#[derive(Debug, Clone, Default)]
struct SpinningVms {
    execs: Arc<Mutex<usize>>,
}

impl Cocoon for SpinningVms {
    async fn exec(
        &self,
        vm: &VmId,
        _argv: &[String],
        _timeout: Duration,
    ) -> Result<ExecOutput, CocoonError> {
        *self.execs.lock().unwrap() += 1;
        Err(CocoonError::Spawn {
            program: format!("no exec in this test ({vm})").into(),
            source_text: "the plan was expected to fail".into(),
        })
    }

    async fn inspect(&self, vm: &VmId, _timeout: Duration) -> Result<VmInspect, CocoonError> {
        Ok(fixup_tests::hostile_vm_record(vm.as_str(), SPINNING_VM_ID))
    }
}

struct Rig {
    host: Arc<Host<SpinningVms, MemoryPods>>,
    planner: Arc<Planner>,
    cocoon: SpinningVms,
    _dir: tempfile::TempDir,
}

/// A host with the hostile plugin, fuel to spare (only the deadline stops
/// a spin) and `slots` engine slots, serving `pods`.
fn rig(slots: u32, pods: &[&str]) -> Rig {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = dir.path().join("plugins");
    let root = dir.path().join("cocoon-root");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    std::fs::create_dir_all(&root).expect("cocoon root");
    std::fs::copy(env!("PLUGIN_HOSTILE"), plugins.join("hostile.wasm")).expect("copy");
    let (planner, failures) = Planner::new(PlannerOptions {
        engine: EngineOptions {
            limits: Limits {
                fuel: u64::MAX / 4,
                deadline: DEADLINE,
                ..Limits::default()
            },
            slots,
            ..EngineOptions::default()
        },
        cocoon_root: root,
        plugin_dir: Some(plugins),
        ..PlannerOptions::default()
    })
    .expect("planner");
    assert!(failures.is_empty(), "{failures:?}");
    let planner = Arc::new(planner);
    let memory = MemoryPods::new();
    for name in pods {
        memory.insert(fixup_tests::hostile_clone(name));
    }
    let cocoon = SpinningVms::default();
    let leases = LeaseWatcher::new(dir.path().join("leases.json"), Duration::from_millis(20))
        .expect("lease watcher");
    let host = Host::new(
        planner.clone(),
        cocoon.clone(),
        memory,
        Arc::new(leases),
        HostConfig::default(),
        Arc::new(Metrics::new()),
    );
    Rig {
        host: Arc::new(host),
        planner,
        cocoon,
        _dir: dir,
    }
}

/// What the timer task saw: ticks while a plugin call was in flight, and
/// the most calls in flight at one tick.
#[derive(Debug, Default)]
struct Seen {
    ticks_in_flight: usize,
    most_in_flight: usize,
}

/// Handle `pods` concurrently on a one-thread runtime beside a 5 ms timer
/// task, and return their summaries and what the timer saw.
fn handle_beside_a_timer(rig: &Rig, pods: &[&str]) -> (Vec<Result<Summary, Stop>>, Seen) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let ticks_in_flight = Arc::new(AtomicUsize::new(0));
    let most_in_flight = Arc::new(AtomicUsize::new(0));
    let summaries = runtime.block_on(async {
        let timer = tokio::spawn({
            let planner = rig.planner.clone();
            let (ticks, most) = (ticks_in_flight.clone(), most_in_flight.clone());
            async move {
                let mut every = tokio::time::interval(Duration::from_millis(5));
                loop {
                    every.tick().await;
                    let in_flight = planner.plugins().calls_in_flight();
                    if in_flight > 0 {
                        ticks.fetch_add(1, Ordering::SeqCst);
                    }
                    most.fetch_max(in_flight, Ordering::SeqCst);
                }
            }
        });
        let shutdown = CancellationToken::new();
        let handles: Vec<_> = pods
            .iter()
            .map(|name| {
                let host = rig.host.clone();
                let shutdown = shutdown.clone();
                let name = (*name).to_owned();
                tokio::spawn(async move {
                    host.handle("default", &name, Trigger::Event, &shutdown)
                        .await
                })
            })
            .collect();
        let mut summaries = Vec::new();
        for handle in handles {
            summaries.push(handle.await.expect("task"));
        }
        timer.abort();
        summaries
    });
    let seen = Seen {
        ticks_in_flight: ticks_in_flight.load(Ordering::SeqCst),
        most_in_flight: most_in_flight.load(Ordering::SeqCst),
    };
    (summaries, seen)
}

/// A call stopped by its wall-clock deadline is the node's (time is the
/// node's): the pod is not failed, and the work is tried again.
fn assert_stopped_by_the_deadline(result: &Result<Summary, Stop>) {
    match result {
        Err(
            e @ Stop::Node(NodeError::PluginCode {
                source: PluginError::Deadline { plugin, .. },
                ..
            }),
        ) => {
            assert_eq!(plugin, "hostile");
            assert!(e.is_retryable(), "{e}");
        }
        other => panic!("not stopped by the deadline: {other:?}"),
    }
}

/// While the plugin spins (200 ms, to its deadline) the timer on the
/// runtime's only thread keeps ticking: about 40 ticks; a call on the
/// runtime's thread would allow none.
#[test]
fn a_spinning_plugin_never_stalls_the_runtime() {
    let rig = rig(4, &["web-0"]);
    let (summaries, seen) = handle_beside_a_timer(&rig, &["web-0"]);
    assert_stopped_by_the_deadline(&summaries[0]);
    let ticks = seen.ticks_in_flight;
    assert!(
        ticks >= 3,
        "the timer ticked {ticks} times while the plugin call was in flight"
    );
    assert_eq!(*rig.cocoon.execs.lock().unwrap(), 0, "nothing ran");
    assert_eq!(rig.planner.plugins().calls_in_flight(), 0);
}

/// With one engine slot, three pods' plugin calls take turns: never more
/// than one in flight (a second would find no instance slot in the pooling
/// allocator and fail with another error), each stopped by its own
/// deadline, and the runtime keeps ticking throughout.
#[test]
fn plugin_calls_wait_for_an_engine_slot() {
    let pods = ["web-0", "web-1", "web-2"];
    let rig = rig(1, &pods);
    let (summaries, seen) = handle_beside_a_timer(&rig, &pods);
    for result in &summaries {
        assert_stopped_by_the_deadline(result);
    }
    assert_eq!(seen.most_in_flight, 1);
    assert!(seen.ticks_in_flight >= 3, "{seen:?}");
}
