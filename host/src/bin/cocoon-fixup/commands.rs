//! `plan`, `run`, `prepare`, `serve` and `capture`: each reads its inputs, calls the
//! library and prints what it answered.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};

use crate::args::*;
use crate::assemble::*;
use crate::plan_text::*;
use crate::runtime;
use fixup_core::binding::{BindingPolicy, Verdict};
use fixup_core::decision::{Summary, Trigger};
use fixup_core::display;
use fixup_core::facts::{BootKind, Observation, Overrides, PodInput, VmInspect};
use fixup_core::planner::PlanOutcome;
use fixup_core::plugin::cache::CacheOwner;
use fixup_core::plugin::quarantine::QuarantineFile;
use fixup_host::cocoon::CocoonCli;
use fixup_host::config::Resolved;
use fixup_host::kube::KubeApi;
use fixup_host::node_pods::{NodePods, OtherPods};
use fixup_host::reload::Reloader;
use fixup_host::serve;
use fixup_kit::capture;

pub(crate) async fn run_run(args: &RunArgs, config: Option<&Path>) -> Result<Summary> {
    let host = one_pod_host(args, config, "run").await?;
    let shutdown = serve::shutdown_on_signals();
    let summary = host
        .handle(&args.namespace, &args.pod, Trigger::Event, &shutdown)
        .await?;
    print_json(&summary)?;
    Ok(summary)
}

pub(crate) async fn run_prepare(args: &RunArgs, config: Option<&Path>) -> Result<Summary> {
    let host = one_pod_host(args, config, "prepare").await?;
    let shutdown = serve::shutdown_on_signals();
    let summary = host.prepare(&args.namespace, &args.pod, &shutdown).await?;
    print_json(&summary)?;
    Ok(summary)
}

/// The host of a command for one pod, with no watch: the node's pods are
/// listed when an annotated VM name must be checked against them.
async fn one_pod_host(
    args: &RunArgs,
    config: Option<&Path>,
    command: &str,
) -> Result<fixup_host::host::Host<CocoonCli, KubeApi>> {
    let settings = args.config.resolve(config)?;
    let (host, _client) = build_host(&settings, None).await?;
    Ok(host.with_other_pods(match &args.node {
        Some(node) if !node.is_empty() => OtherPods::List { node: node.clone() },
        _ => OtherPods::Unseen {
            why: format!("`{command}` was given no node: pass --node (or set NODE_NAME) so it can list the node's pods"),
        },
    }))
}

pub(crate) async fn run_serve(args: &ServeArgs, config: Option<&Path>) -> Result<u8> {
    serve::raise_open_file_limit();
    let settings = args.config.resolve(config)?;
    let (host, client) = build_host(&settings, Some(args.node.clone())).await?;
    // The watch keeps the node's pods only where an annotated VM name may
    // need them.
    let host = if settings.host.binding.accept_annotated_names {
        host.with_other_pods(OtherPods::Watched(NodePods::new()))
    } else {
        host
    };
    let host = Arc::new(host);
    let shutdown = serve::shutdown_on_signals();
    let server = tokio::spawn(serve::metrics_server(
        settings.metrics_addr,
        host.metrics_handle(),
        serve::ListenerLimits::default(),
        shutdown.clone(),
    ));
    if !settings.reload.interval.is_zero() {
        let (sender, outcomes) = tokio::sync::mpsc::unbounded_channel();
        host.report_outcomes_to(sender);
        // The trust policy's key files too: a key replaced or removed on
        // disk reloads the set, which verifies every pinned plugin again.
        let mut watched = vec![
            settings
                .planner
                .plugin_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(fixup_host::config::DEFAULT_PLUGIN_DIR)),
            settings
                .file
                .clone()
                .unwrap_or_else(|| PathBuf::from(fixup_host::config::DEFAULT_CONFIG_FILE)),
        ];
        watched.extend(settings.pinned.trust.key_files());
        let mut reloader = Reloader::new(
            host.clone(),
            reload_build(
                args.config.clone(),
                settings.file.clone(),
                host.planner().plugins().slots(),
            ),
            watched,
            settings.reload.clone(),
        );
        if let Some(file) = QuarantineFile::beside_key(settings.planner.engine.cache_key.as_deref())
        {
            reloader = reloader.with_quarantine_file(file);
        }
        tokio::spawn(reloader.run(outcomes, shutdown.clone()));
    }
    tracing::info!(node = %args.node, metrics = %settings.metrics_addr, concurrency = settings.concurrency, "serving");
    serve::run(client, &args.node, host, shutdown.clone()).await;
    shutdown.cancel();
    server.await.context("metrics server task")??;
    Ok(0)
}

pub(crate) fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// The pod and VM files of `plan` and offline `capture`.
pub(crate) fn read_pod_and_vm(pod: &Path, vm: &Path) -> Result<(PodInput, VmInspect)> {
    let pod_input = PodInput::from_json(&read(pod)?, &pod.display().to_string())?;
    let record = VmInspect::from_json(&read(vm)?, &vm.display().to_string())?;
    Ok((pod_input, record))
}

pub(crate) fn overrides(boot: Option<Boot>, source_image: Option<&String>) -> Overrides {
    Overrides {
        boot: boot.map(|b| match b {
            Boot::Clone => BootKind::Clone,
            Boot::Fork => BootKind::Fork,
            Boot::Wake => BootKind::Wake,
            Boot::Resumed => BootKind::Resumed,
        }),
        source_image: source_image.cloned(),
    }
}

pub(crate) fn observe(args: &PlanArgs, policy: BindingPolicy) -> Result<(Observation, Verdict)> {
    let (pod, vm) = read_pod_and_vm(&args.pod, &args.vm)?;
    if let Some(why) = fixup_core::decision::never_planned(&pod) {
        bail!(
            "pod {} is hands-off ({why}): cocoon-fixup inspects, runs and writes nothing for it, so there is no plan",
            pod.display_name()
        );
    }
    let verdict = fixup_core::decision::bind_record(&pod, &vm, policy);
    let overrides = overrides(args.boot, args.source_image.as_ref());
    Ok((
        fixup_core::decision::observe(&pod, &vm, &overrides),
        verdict,
    ))
}

/// The pod, its VM record and its host events, read from the cluster as
/// the daemon reads them (the pod's metadata, one `cocoon vm inspect` of
/// the VM the annotations point at). Events that cannot be listed are a
/// warning: the case is still worth having.
pub(crate) async fn capture_online(
    args: &CaptureArgs,
    settings: &Resolved,
) -> Result<(PodInput, VmInspect, CapturedEvents)> {
    use fixup_host::cocoon::Cocoon as _;
    use fixup_host::pods::{PodApi as _, PodRef};
    let pods = KubeApi::try_default("cocoon-fixup", None).await?;
    let pod = pods
        .get(&args.namespace, &args.pod)
        .await?
        .with_context(|| {
            format!(
                "pod {}/{} not found: check the namespace and name",
                args.namespace, args.pod
            )
        })?;
    let reference = capture::vm_reference(&pod)?;
    let record = CocoonCli::new(settings.cocoon_bin.clone())
        .inspect(&reference, settings.host.inspect_timeout)
        .await
        .with_context(|| format!("pod {}", pod.display_name()))?;
    unproven_note(&capture::bound_record(
        &pod,
        &record,
        settings.host.binding,
    )?);
    let mut events = CapturedEvents::default();
    if let Some(uid) = &pod.uid {
        let pod_ref = PodRef {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: uid.clone(),
        };
        let warn = |e: &dyn std::fmt::Display, missing: &str| {
            eprintln!(
                "{}",
                display::terminal_text(&format!("warning: {e}; {missing}"))
            );
        };
        match pods.list_pod_events(&pod_ref).await {
            Ok((host, truncated)) => (events.host, events.truncated) = (host, truncated),
            Err(e) => warn(&e, "the case has no events in its context"),
        }
        // As the daemon: the stack's own events can make the VM a wake.
        let selectors =
            fixup_core::memory::field_selectors(&pod_ref.uid, &settings.host.wake.reporters);
        match pods.stack_events(&pod_ref, &selectors).await {
            Ok(stack) => events.stack = stack.events,
            Err(e) => warn(
                &e,
                "a hibernate wake is recognised by the pod's annotation only (check `list` on events.k8s.io events)",
            ),
        }
    }
    Ok((pod, record, events))
}

/// The events a capture reads: the host's own for the case's context
/// (and whether some were left out), every event for the wake rule.
#[derive(Default)]
pub(crate) struct CapturedEvents {
    host: Vec<capture::PodEvent>,
    truncated: bool,
    stack: Vec<fixup_core::memory::StackEvent>,
}

/// `capture` has no view of the node's pods: an annotated VM name it
/// captures is said to be unproven, never taken for bound.
fn unproven_note(verdict: &Verdict) {
    if let Verdict::Unproven { .. } = verdict {
        eprintln!(
            "{}",
            display::terminal_text(&format!(
                "note: {verdict}; the case is captured all the same"
            ))
        );
    }
}

pub(crate) fn run_capture(args: &CaptureArgs, config: Option<&Path>) -> Result<u8> {
    let settings = args.config.resolve_for(config, CacheOwner::User)?;
    let (pod, record, events, source) = match &args.vm {
        Some(vm) => {
            let pod_file = PathBuf::from(&args.pod);
            let (pod, record) = read_pod_and_vm(&pod_file, vm)?;
            // As the daemon: a pod whose annotations name no VM is not looked at.
            capture::vm_reference(&pod)?;
            unproven_note(&capture::bound_record(
                &pod,
                &record,
                settings.host.binding,
            )?);
            let (mut host, stack) = match &args.events {
                Some(file) => {
                    capture::events_from_json(&read(file)?, &file.display().to_string(), &pod)?
                }
                None => Default::default(),
            };
            let truncated = capture::keep_newest(&mut host);
            let events = CapturedEvents {
                host,
                truncated,
                stack,
            };
            let source = capture::Source::Files {
                pod: pod_file,
                vm: vm.clone(),
                events: args.events.clone(),
            };
            (pod, record, events, source)
        }
        None => {
            let (pod, record, events) = runtime()?.block_on(capture_online(args, &settings))?;
            (pod, record, events, capture::Source::Cluster)
        }
    };
    let planner = planner(&settings)?;
    let overrides = overrides(args.boot, args.source_image.as_ref());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the system clock is before 1970")?;
    let at = jiff::Timestamp::from_second(i64::try_from(now.as_secs())?)?.to_string();
    let wake = &settings.host.wake;
    let now_unix_ms = i64::try_from(now.as_millis())?;
    let input = capture::CaptureInput {
        pod: &pod,
        vm: &record,
        overrides: &overrides,
        events: &events.host,
        events_truncated: events.truncated,
        stack_events: &events.stack,
        wake,
        now_unix_ms,
        source,
        at,
        by: format!("cocoon-fixup {}", env!("CARGO_PKG_VERSION")),
        cocoon_root: &settings.planner.cocoon_root,
        anyway: args.anyway,
    };
    if let Ok(Some(why)) = capture::assumed_boot(&input) {
        eprintln!("{}", display::terminal_text(&format!("note: boot {why}")));
    }
    let cases = capture::capture(&planner, &input)?;
    let placed = capture::place(
        cases,
        args.output.as_deref(),
        args.plugin.as_deref(),
        args.force,
    )?;
    for case in capture::write(&placed, args.force)? {
        print!("{}", display::terminal_json(&case.text));
    }
    for (case, path) in &placed {
        if let Some(path) = path {
            let expect = match case.expect {
                "plan" => "expects its plan",
                "error" => "expects its refusal",
                _ => "has no expect: the call breached the sandbox (see context.call_error)",
            };
            let next = match &case.file {
                Some(file) => format!(
                    "run `cocoon-fixup plugin test {} {}`",
                    file.display(),
                    path.display()
                ),
                None => format!(
                    "{} is built in (there is no file to test): keep the case for a plugin of your own that serves {}, or send it with a report about the built-in",
                    case.plugin, case.scenario
                ),
            };
            eprintln!(
                "{}",
                display::terminal_text(&format!(
                    "wrote {}: {} for {}, {expect}; {next}",
                    path.display(),
                    case.scenario,
                    case.plugin,
                ))
            );
        }
    }
    Ok(0)
}

pub(crate) fn run_plan(args: &PlanArgs, config: Option<&Path>) -> Result<u8> {
    let settings = args.config.resolve_for(config, CacheOwner::User)?;
    let (obs, verdict) = observe(args, settings.host.binding)?;
    match &verdict {
        Verdict::Bound { .. } => {}
        Verdict::Unproven { .. } => eprintln!(
            "{}",
            display::terminal_text(&format!(
                "note: {verdict}; `run` and `serve` run nothing in this VM for this pod while another pod on its node claims the name"
            ))
        ),
        Verdict::Mismatch(_) => eprintln!(
            "{}",
            display::terminal_text(&format!(
                "warning: {verdict}; `run` and `serve` would run nothing in this VM for this pod"
            ))
        ),
    }
    // Classified first: a VM that needs no fixup is answered without an
    // engine or a plugin.
    let outcome = match PlanOutcome::without_fixup(&obs) {
        Some(outcome) => {
            if settings.planner.plugin_dir.is_some() || !settings.pinned.references.is_empty() {
                eprintln!(
                    "note: no fixup needed, so no plugin was loaded; `cocoon-fixup plugin inspect` checks plugin files"
                );
            }
            outcome
        }
        None => {
            let planner = planner(&settings)?;
            let outcome = planner.plan(&obs).with_context(|| {
                format!(
                    "planning from {} and {}",
                    args.pod.display(),
                    args.vm.display()
                )
            })?;
            // The process exits next: the kernel takes the engine and the
            // mapped plugin code back at once, without unregistering each.
            std::mem::forget(planner);
            outcome
        }
    };
    match args.output {
        Output::Json => {
            let mut report = outcome.report(&obs);
            report.binding = Some(verdict);
            print_json(&report)?;
        }
        Output::Text => print_terminal(&plan_text(&obs, &outcome, &verdict)?),
    }
    Ok(0)
}

/// Print text that carries plugin- or user-supplied strings: through the
/// one terminal formatter ([`display::terminal_text`]).
pub(crate) fn print_terminal(text: &str) {
    print!("{}", display::terminal_text(text));
}

/// Print a JSON document through [`display::terminal_json`].
pub(crate) fn print_json(value: &impl serde::Serialize) -> Result<()> {
    let json = serde_json::to_string_pretty(value)?;
    println!("{}", display::terminal_json(&json));
    Ok(())
}
