//! `cocoon-fixup`: a thin command line over the `fixup_host` library.
//! Parses, calls the library, prints the error once, picks the exit code.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};

use fixup_core::binding::{BindingPolicy, Verdict};
use fixup_core::decision::{FixupEnd, Handled, Readiness, Summary, Trigger};
use fixup_core::facts::{BootKind, Observation, Overrides, PodInput, VmInspect};
use fixup_core::plan::{self, Action};
use fixup_core::planner::{PlanOutcome, Planner};
use fixup_core::plugin::Allocation;
use fixup_core::plugin::cache::CacheOwner;
use fixup_core::{capture, display, kit, template};
use fixup_host::cocoon::CocoonCli;
use fixup_host::config::{ConfigArgs, OciArgs, PluginConfigArgs, Settings};
use fixup_host::host::Host;
use fixup_host::kube::KubeApi;
use fixup_host::metrics::Metrics;
use fixup_host::oci::{self, PluginRef, RegistryOptions, Tags};
use fixup_host::ready::LeaseWatcher;
use fixup_host::reload::{self, QuarantineFile, Reloader};
use fixup_host::serve;

/// Post-clone guest network fixup for cocoon microVMs.
///
/// Decides whether a cloned VM needs commands run inside its guest to get
/// its network back, produces them with sandboxed WebAssembly plugins, runs
/// them within a retry budget, waits for the guest's IP and reports to
/// Kubernetes. Every option can also be set in the environment or in the
/// configuration file (flags > environment > file > defaults).
#[derive(Debug, Parser)]
#[command(name = "cocoon-fixup", version, propagate_version = true)]
struct Cli {
    /// Configuration file (TOML) [default: /etc/cocoon-fixup/config.toml, when it exists]
    #[arg(long, global = true, value_name = "FILE", env = "COCOON_FIXUP_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Classify a VM and print the fixup plan for it (nothing is run).
    ///
    /// Plugins are loaded only when the VM needs a fixup; then every
    /// configured plugin must load (with a warm cache only the code of
    /// those the scenario selects is read). `plugin inspect` checks plugin
    /// files without a VM.
    ///
    /// Example:
    ///   cocoon-fixup plan --pod examples/oci-static/pod.json --vm examples/oci-static/vm.json
    Plan(PlanArgs),
    /// Run the whole flow for one pod: fixup, IP wait, annotations, events.
    ///
    /// Prints a JSON summary. Exit codes: 0 ready (or nothing to do),
    /// 2 the fixup failed (now or earlier), 3 no IP in time, 4 interrupted
    /// or the pod went away (or the stack took it over), 5 the VM its annotations
    /// point at is not the pod's (nothing was run), 1 could not run.
    Run(RunArgs),
    /// The node daemon: watch this node's pods and run the flow for every
    /// managed clone that needs it; serve /metrics and /healthz.
    Serve(ServeArgs),
    /// Write, test and inspect plan plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Make a pod's plugin calls into `plugin test` cases, to reproduce a
    /// field failure without the cluster.
    ///
    /// Reads the pod (from the API server, like `run`, or from --pod
    /// POD.json with --vm VM.json, like `plan`) and its VM (`cocoon vm
    /// inspect`), refuses a VM that is not the pod's own, and writes one
    /// case per plugin call: the facts, the scenario, that plugin's plan
    /// (or refusal) as `expect`, and a `context` with where it came from,
    /// the plugins used now and, for a failed pod, its error chain and the
    /// plugin versions its hint and events name. Writes nothing to the
    /// cluster. A plan of several calls (fc-mac + oci-networkd on
    /// Firecracker) needs --output DIR/ (one `<plugin>-<scenario>.json`
    /// each; the trailing `/` makes a new folder) or --plugin NAME. An
    /// existing file is replaced only with --force.
    ///
    /// Capture on the pod's node, then test the vendor's plugin against it:
    ///
    ///   cocoon-fixup capture -n apps --pod web-0 --output web-0.json
    ///
    ///   cocoon-fixup plugin test acme_net.wasm web-0.json
    ///
    /// From files, one case per plugin call into a folder:
    ///
    ///   cocoon-fixup capture --pod pod.json --vm vm.json --events events.json --output cases/
    Capture(CaptureArgs),
}

#[derive(Debug, Args)]
struct CaptureArgs {
    /// The pod's namespace (read from the cluster).
    #[arg(
        long,
        short = 'n',
        value_name = "NS",
        default_value = "default",
        conflicts_with = "vm"
    )]
    namespace: String,
    /// The pod's name; with --vm, a file as `kubectl get pod NAME -o json`
    /// prints it.
    #[arg(long, value_name = "NAME|POD.json")]
    pod: String,
    /// The VM as `cocoon vm inspect --json ID` prints it: read the pod and
    /// the VM from files instead of the cluster.
    #[arg(long, value_name = "VM.json")]
    vm: Option<PathBuf>,
    /// The pod's events as `kubectl get events -o json` prints them (with
    /// --vm; only the host's events about this pod are kept).
    #[arg(long, value_name = "EVENTS.json", requires = "vm")]
    events: Option<PathBuf>,
    /// The snapshot's source image, with --vm [default: the record's `config.image` on a normal clone]
    #[arg(long, value_name = "URL", requires = "vm")]
    source_image: Option<String>,
    /// Override the boot kind read from the pod annotations [default: resumed for a pod whose post-clone-state is running]
    #[arg(long, value_enum)]
    boot: Option<Boot>,
    /// Only the case of this plugin's call.
    #[arg(long, value_name = "NAME")]
    plugin: Option<String>,
    /// The case file; a folder (ending with `/`, created when missing) for one `<plugin>-<scenario>.json` per call [default: standard output, for one call]
    #[arg(long, value_name = "PATH")]
    output: Option<PathBuf>,
    /// Capture a pod the daemon would leave alone (deleting, hibernating,
    /// the stack's, not managed, not a clone); `context.daemon` says so.
    #[arg(long)]
    anyway: bool,
    /// Replace case files that exist already (never through a symbolic link).
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    config: ConfigArgs,
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Run a plugin on case files (facts in, expected plan or error out).
    ///
    /// CASES is a case file or a folder of `*.json` case files (the format
    /// is in the README, "Testing a plugin"). Each case runs in the real
    /// sandbox with the configured limits; a mismatch shows a diff. Exit
    /// code 1 when any case fails or a case file is invalid.
    ///
    /// Example:
    ///   cocoon-fixup plugin test target/wasm32-wasip2/release/acme_net.wasm cases/
    Test(PluginTestArgs),
    /// Show what a plugin file is and whether the host would load it.
    ///
    /// Name, version, contract, sha256, scenarios, flavours, imports and
    /// the guest policy (what its plans may write, remove and run in a
    /// guest, with a warning for rules that allow arbitrary code, and the
    /// configuration file's narrowing of it), then `accepted` or
    /// `refused: <why and the fix>`. The file is judged with every file of
    /// the plugin directory loaded as the node loads them (a file elsewhere
    /// as its copy there); the reload's `NAME.cases/` gate is not run.
    /// Exit code 1 when refused or when the plugin directory would not load
    /// as a whole (JSON: `success`).
    Inspect(PluginInspectArgs),
    /// Create a new plugin crate from the template.
    ///
    /// Example:
    ///   cocoon-fixup plugin new acme-net --dir ~/src
    New(PluginNewArgs),
    /// Publish a plugin file to an OCI registry; prints the reference
    /// pinned to the manifest digest, for `plugins = [...]`.
    ///
    /// The artifact is one `application/wasm` layer with config
    /// `application/vnd.wasm.config.v0+json`. Credentials, when the registry
    /// wants them: COCOON_FIXUP_OCI_USERNAME and COCOON_FIXUP_OCI_PASSWORD.
    ///
    /// Example:
    ///   cocoon-fixup plugin push acme_net.wasm oci://registry.example/acme/net:1.0
    Push(PluginPushArgs),
    /// Pull a plugin by digest from an OCI registry and verify it, into a
    /// file (--output) or the plugin store.
    ///
    /// A tag is refused unless --allow-tag: it is then resolved to its
    /// digest, which is printed so you can pin it.
    ///
    /// Example:
    ///   cocoon-fixup plugin pull oci://registry.example/acme/net@sha256:... --output acme_net.wasm
    Pull(Box<PluginPullArgs>),
}

#[derive(Debug, Args)]
struct PluginPushArgs {
    /// The plugin component (`.wasm`).
    #[arg(value_name = "PLUGIN.wasm")]
    plugin: PathBuf,
    /// Where to publish it: oci://HOST/REPO:TAG.
    #[arg(value_name = "REFERENCE")]
    reference: String,
    /// Speak plain HTTP to this reference's registry instead of HTTPS (a
    /// registry on loopback).
    #[arg(long)]
    plain_http: bool,
}

#[derive(Debug, Args)]
struct PluginPullArgs {
    /// oci://HOST/REPO@sha256:DIGEST (or :TAG with --allow-tag).
    #[arg(value_name = "REFERENCE")]
    reference: String,
    /// Resolve a tag to the digest it names now, and print that digest.
    #[arg(long)]
    allow_tag: bool,
    /// Write the plugin to this file instead of the plugin store.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Speak plain HTTP to this reference's registry instead of HTTPS (a
    /// registry on loopback).
    #[arg(long)]
    plain_http: bool,
    #[command(flatten)]
    oci: OciArgs,
}

#[derive(Debug, Args)]
struct PluginTestArgs {
    /// The plugin component (`.wasm`).
    #[arg(value_name = "PLUGIN.wasm")]
    plugin: PathBuf,
    /// A case file, or a folder of them.
    #[arg(value_name = "CASES")]
    cases: PathBuf,
    /// Write each case's actual result into its `expect` (review the diff).
    #[arg(long)]
    bless: bool,
    /// After each case's result, print the hint script the host would
    /// render from the plan (as `plan` prints it: steps in phase order,
    /// checked against the node's limits), or why there is none; a plan
    /// the node would refuse fails the case.
    #[arg(long)]
    render: bool,
    /// How to print the result.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
    #[command(flatten)]
    config: PluginConfigArgs,
}

#[derive(Debug, Args)]
struct PluginInspectArgs {
    /// The plugin component (`.wasm`).
    #[arg(value_name = "PLUGIN.wasm")]
    plugin: PathBuf,
    /// How to print the result.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
    #[command(flatten)]
    config: PluginConfigArgs,
}

#[derive(Debug, Args)]
struct PluginNewArgs {
    /// The plugin's name: lowercase letters, digits and `-`.
    name: String,
    /// Where to create the plugin's folder.
    #[arg(long, value_name = "DIR", default_value = ".")]
    dir: PathBuf,
    /// The cocoon-fixup SDK folder (`plugins/sdk` of a checkout) [default: the checkout this binary was built from]
    #[arg(long, value_name = "PATH")]
    sdk: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    /// For people.
    Text,
    /// One JSON object (schema in the README).
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Boot {
    Clone,
    Fork,
    Wake,
    Resumed,
}

#[derive(Debug, Args)]
struct PlanArgs {
    /// The pod, as `kubectl get pod NAME -o json` prints it.
    #[arg(long, value_name = "POD.json")]
    pod: PathBuf,
    /// The VM, as `cocoon vm inspect --json ID` prints it.
    #[arg(long, value_name = "VM.json")]
    vm: PathBuf,
    /// The snapshot's source image [default: the record's `config.image` on a normal clone]
    #[arg(long, value_name = "URL")]
    source_image: Option<String>,
    /// Override the boot kind read from the pod annotations [default: resumed for a pod whose post-clone-state is running, as the daemon resumes it]
    #[arg(long, value_enum)]
    boot: Option<Boot>,
    /// How to print the result.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
    #[command(flatten)]
    config: ConfigArgs,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The pod's namespace.
    #[arg(long, short = 'n', value_name = "NS", default_value = "default")]
    namespace: String,
    /// The pod's name.
    #[arg(long, value_name = "NAME")]
    pod: String,
    #[command(flatten)]
    config: ConfigArgs,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// The node whose pods to serve (usually the downward API's spec.nodeName).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    node: String,
    #[command(flatten)]
    config: ConfigArgs,
}

/// The store's files of the configured plugin references, pulled first
/// where missing (an error names the reference).
async fn pinned_files(settings: &Settings) -> Result<Vec<PathBuf>> {
    tokio::time::timeout(PULL_TIMEOUT, settings.pinned.files())
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "pulling the plugins pinned in the configuration took longer than {PULL_TIMEOUT:?}: check the registry, or seed the store with `plugin pull`"
            )
        })?
        .context("getting the plugins pinned in the configuration")
}

/// A plugin file that failed to load, for messages: its path, and for a
/// store file the reference the configuration pins it by (whose entry in
/// `plugins` is what to fix or remove).
fn failed_file(path: &Path, settings: &Settings, pinned: &[PathBuf]) -> String {
    match pinned.iter().position(|p| p == path) {
        Some(i) => format!(
            "{} (pinned as {} in `plugins`)",
            path.display(),
            settings.pinned.references[i]
        ),
        None => path.display().to_string(),
    }
}

/// The planner for `plan` and `capture`: a plugin file that does not load
/// is an error, so a vendor sees it before a node does. A one-shot
/// process makes a few plugin calls and exits, so its engine sets up no
/// instance pool ([`Allocation::OnDemand`]: the same limits, the same
/// plans, the same cache entries).
fn planner(settings: &Settings) -> Result<Planner> {
    let pinned = if settings.pinned.references.is_empty() {
        Vec::new()
    } else {
        runtime()?.block_on(pinned_files(settings))?
    };
    let (planner, failures) =
        Planner::with_allocation(settings.planner.clone(), &pinned, Allocation::OnDemand)
            .context("starting the plugin host")?;
    if !failures.is_empty() {
        for f in &failures {
            eprintln!(
                "{}",
                display::terminal_text(&format!(
                    "error: {}: {}",
                    failed_file(&f.path, settings, &pinned),
                    f.error
                ))
            );
        }
        bail!(
            "{} plugin(s) could not be loaded: fix or remove them",
            failures.len()
        );
    }
    Ok(planner)
}

/// The planner for `run` and `serve`: a plugin file that does not load is
/// reported (log, metric) and the others serve; only pods whose scenario
/// and flavour then have no plugin fail, with a message naming the files.
/// A daemon (`serve`) links every plugin at start (`warm`), so a plugin
/// whose code the cache cannot give back is reported now and its first
/// clone pays nothing extra; `run` loads only what its pod needs.
fn node_planner(
    settings: &Settings,
    pinned: &[PathBuf],
    metrics: &Metrics,
    warm: bool,
) -> Result<Planner> {
    let (planner, failures) = Planner::with_files(settings.planner.clone(), pinned)
        .context("starting the plugin host")?;
    for f in &failures {
        tracing::error!(
            plugin = %failed_file(&f.path, settings, pinned),
            "plugin not loaded: {}; the other plugins serve, see `cocoon-fixup plugin inspect {}`",
            f.error,
            f.path.display()
        );
    }
    let mut failed = failures.len();
    if warm {
        for e in planner.plugins().warm() {
            tracing::error!("{e}; the pods that need this plugin wait with a node error");
            failed += 1;
        }
    }
    metrics.plugin_load_failures(failed);
    if settings.host.binding.accept_legacy_names {
        tracing::warn!(
            "--accept-legacy-vm-names is on: a VM named vk-<namespace>-<pod> binds to that pod, and the form is ambiguous across namespaces with dashes in their names (vk-a-b-c is a/b-c and a-b/c); turn it off once the legacy VMs are gone"
        );
    }
    Ok(planner)
}

/// Everything `run` and `serve` share: planner, cocoon, Kubernetes, leases.
async fn build_host(
    settings: &Settings,
    node: Option<String>,
) -> Result<(Host<CocoonCli, KubeApi>, kube::Client)> {
    let metrics = Arc::new(Metrics::new());
    let pinned = pinned_files(settings).await?;
    let planner = Arc::new(node_planner(settings, &pinned, &metrics, node.is_some())?);
    let client = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes (in-cluster config or KUBECONFIG)")?;
    let pods = KubeApi::new(client.clone(), "cocoon-fixup", node);
    let leases = Arc::new(
        LeaseWatcher::new(settings.lease_file.clone(), settings.ip_poll)
            .context("watching the lease file")?,
    );
    let host = Host::new(
        planner,
        CocoonCli::new(settings.cocoon_bin.clone()),
        pods,
        leases,
        settings.host.clone(),
        metrics,
    );
    Ok((host, client))
}

/// The longest a start or a reload waits for the pinned plugins to be
/// pulled, all of them together (each request has its own timeouts too).
const PULL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// How `serve` builds a plugin set at a reload: the configuration as it is
/// on disk now (flags and environment as at start), the pinned references
/// pulled, every plugin loaded; a plugin that does not load refuses the
/// reload. Only the planner's settings are taken (plugins, allow-list,
/// policies, limits, failure policies); the others need a restart. The
/// engine keeps `slots` instance slots, the number the host's planning
/// permits were sized for at start. `config` is the file read at start:
/// it must still be there, and not empty if it was not empty then (a file
/// being rewritten in place must not reload as all defaults).
fn reload_build(args: ConfigArgs, config: Option<PathBuf>, slots: u32) -> reload::Build {
    // A file that had content at start must keep some: one emptied while
    // being rewritten must not reload as all defaults.
    let had_content = config
        .as_deref()
        .and_then(|file| std::fs::metadata(file).ok())
        .is_some_and(|meta| meta.len() > 0);
    Arc::new(move || {
        if let Some(file) = config.as_ref().filter(|_| had_content) {
            match std::fs::metadata(file) {
                Ok(meta) if meta.len() > 0 => {}
                Ok(_) => {
                    return Err(format!(
                        "the configuration file {} is empty; write it to a temporary name and rename it into place",
                        file.display()
                    ));
                }
                Err(e) => {
                    return Err(format!(
                        "the configuration file {} read at start: {e}",
                        file.display()
                    ));
                }
            }
        }
        let mut settings = args.resolve(config.as_deref()).map_err(|e| e.to_string())?;
        if settings.planner.engine.slots != slots {
            tracing::warn!(
                "the configuration asks for {} plugin instance slots (from `concurrency`), {slots} serve until a restart",
                settings.planner.engine.slots
            );
        }
        settings.planner.engine.slots = slots;
        let pinned = tokio::runtime::Handle::current()
            .block_on(pinned_files(&settings))
            .map_err(|e| format!("{e:#}"))?;
        let (planner, failures) =
            Planner::with_files(settings.planner.clone(), &pinned).map_err(|e| e.to_string())?;
        if !failures.is_empty() {
            let failed: Vec<String> = failures
                .iter()
                .map(|f| format!("{}: {}", failed_file(&f.path, &settings, &pinned), f.error))
                .collect();
            return Err(failed.join("; "));
        }
        Ok(reload::Candidate {
            planner,
            engine: settings.planner.engine.clone(),
        })
    })
}

/// `run`'s exit code for a summary (documented in `run --help`).
fn run_exit_code(summary: &Summary) -> u8 {
    match (summary.fixup, summary.readiness, summary.action) {
        (_, _, Handled::VmMismatch) => 5,
        (Some(FixupEnd::Exhausted | FixupEnd::PlanFailed), _, _) | (_, _, Handled::Parked) => 2,
        (_, Some(Readiness::TimedOut), _) => 3,
        (Some(FixupEnd::Shutdown | FixupEnd::Gone), _, _)
        | (_, Some(Readiness::Shutdown | Readiness::Gone), _) => 4,
        _ => 0,
    }
}

async fn run_run(args: &RunArgs, config: Option<&Path>) -> Result<u8> {
    let settings = args.config.resolve(config)?;
    let (host, _client) = build_host(&settings, None).await?;
    let shutdown = serve::shutdown_on_signals();
    let summary = host
        .handle(&args.namespace, &args.pod, Trigger::Event, &shutdown)
        .await?;
    print_json(&summary)?;
    Ok(run_exit_code(&summary))
}

async fn run_serve(args: &ServeArgs, config: Option<&Path>) -> Result<u8> {
    serve::raise_open_file_limit();
    let settings = args.config.resolve(config)?;
    let (host, client) = build_host(&settings, Some(args.node.clone())).await?;
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
        let watched = vec![
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
    serve::run(
        client,
        &args.node,
        host,
        settings.concurrency,
        shutdown.clone(),
    )
    .await;
    shutdown.cancel();
    server.await.context("metrics server task")??;
    Ok(0)
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// The pod and VM files of `plan` and offline `capture`.
fn read_pod_and_vm(pod: &Path, vm: &Path) -> Result<(PodInput, VmInspect)> {
    let pod_input = PodInput::from_json(&read(pod)?, &pod.display().to_string())?;
    let record = VmInspect::from_json(&read(vm)?, &vm.display().to_string())?;
    Ok((pod_input, record))
}

fn overrides(boot: Option<Boot>, source_image: Option<&String>) -> Overrides {
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

fn observe(args: &PlanArgs, policy: BindingPolicy) -> Result<(Observation, Verdict)> {
    let (pod, vm) = read_pod_and_vm(&args.pod, &args.vm)?;
    let verdict = fixup_core::decision::bind_record(&pod, &vm, policy);
    let overrides = overrides(args.boot, args.source_image.as_ref());
    Ok((
        fixup_core::decision::observe(&pod, &vm, &overrides)?,
        verdict,
    ))
}

/// The pod, its VM record and its host events, read from the cluster as
/// the daemon reads them (the pod's metadata, one `cocoon vm inspect` of
/// the VM the annotations point at). Events that cannot be listed are a
/// warning: the case is still worth having.
async fn capture_online(
    args: &CaptureArgs,
    settings: &Settings,
) -> Result<(PodInput, VmInspect, (Vec<capture::PodEvent>, bool))> {
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
    capture::bound_record(&pod, &record, settings.host.binding)?;
    let events = match &pod.uid {
        Some(uid) => {
            let pod_ref = PodRef {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: uid.clone(),
            };
            pods.list_pod_events(&pod_ref).await.unwrap_or_else(|e| {
                eprintln!(
                    "{}",
                    display::terminal_text(&format!(
                        "warning: {e}; the case has no events in its context"
                    ))
                );
                (Vec::new(), false)
            })
        }
        None => (Vec::new(), false),
    };
    Ok((pod, record, events))
}

fn run_capture(args: &CaptureArgs, config: Option<&Path>) -> Result<u8> {
    let settings = args.config.resolve_for(config, CacheOwner::User)?;
    let (pod, record, events, source) = match &args.vm {
        Some(vm) => {
            let pod_file = PathBuf::from(&args.pod);
            let (pod, record) = read_pod_and_vm(&pod_file, vm)?;
            // As the daemon: a pod whose annotations name no VM is not looked at.
            capture::vm_reference(&pod)?;
            capture::bound_record(&pod, &record, settings.host.binding)?;
            let mut events = match &args.events {
                Some(file) => {
                    capture::events_from_json(&read(file)?, &file.display().to_string(), &pod)?
                }
                None => Vec::new(),
            };
            let truncated = capture::keep_newest(&mut events);
            let events = (events, truncated);
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
    if let Some((_, why)) = capture::assumed_boot(&pod, &overrides).filter(|_| args.boot.is_none())
    {
        eprintln!("{}", display::terminal_text(&format!("note: boot {why}")));
    }
    let input = capture::CaptureInput {
        pod: &pod,
        vm: &record,
        overrides: &overrides,
        events: &events.0,
        events_truncated: events.1,
        source,
        at,
        by: format!("cocoon-fixup {}", env!("CARGO_PKG_VERSION")),
        cocoon_root: &settings.planner.cocoon_root,
        anyway: args.anyway,
    };
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
            eprintln!(
                "{}",
                display::terminal_text(&format!(
                    "wrote {}: {} for {}, {expect}; run `cocoon-fixup plugin test <{}.wasm> {}`",
                    path.display(),
                    case.scenario,
                    case.plugin,
                    case.plugin,
                    path.display()
                ))
            );
        }
    }
    Ok(0)
}

fn run_plan(args: &PlanArgs, config: Option<&Path>) -> Result<u8> {
    let settings = args.config.resolve_for(config, CacheOwner::User)?;
    let (obs, verdict) = observe(args, settings.host.binding)?;
    if !verdict.is_bound() {
        eprintln!(
            "{}",
            display::terminal_text(&format!(
                "warning: {verdict}; `run` and `serve` would run nothing in this VM for this pod"
            ))
        );
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
fn print_terminal(text: &str) {
    print!("{}", display::terminal_text(text));
}

/// Print a JSON document through [`display::terminal_json`].
fn print_json(value: &impl serde::Serialize) -> Result<()> {
    let json = serde_json::to_string_pretty(value)?;
    println!("{}", display::terminal_json(&json));
    Ok(())
}

fn plan_text(
    obs: &Observation,
    outcome: &PlanOutcome,
    verdict: &Verdict,
) -> Result<String, std::fmt::Error> {
    use std::fmt::Write;
    let mut out = String::new();
    let report = outcome.report(obs);
    writeln!(
        out,
        "pod {}  (VM {}, id {})",
        obs.pod, obs.vm_name, obs.vm_id
    )?;
    writeln!(out, "binding: {verdict}")?;
    writeln!(
        out,
        "rule {}: {}",
        outcome.decision.rule.number(),
        outcome.decision.rule
    )?;
    let Some(composed) = &outcome.composed else {
        writeln!(out, "no fixup needed")?;
        return Ok(out);
    };
    writeln!(
        out,
        "scenario: {}  (image: {})",
        report.scenario, report.image
    )?;
    for p in &report.plugins {
        writeln!(
            out,
            "plugin: {} {}  sha256:{}  fuel {}  memory {} KiB",
            p.name,
            p.version,
            &p.sha256[..16],
            p.fuel_used,
            p.peak_memory_bytes >> 10
        )?;
        writeln!(out, "  why: {}", p.why)?;
        if let Some(fallback) = &p.fallback {
            writeln!(out, "  fallback: {fallback}")?;
        }
    }
    for unmatched in &report.flavor_unmatched {
        writeln!(out, "note: {}", unmatched.message)?;
    }
    let total = composed.plan.steps.len();
    writeln!(out)?;
    for (i, step) in composed.plan.steps.iter().enumerate() {
        let flag = if step.best_effort {
            " (best effort)"
        } else {
            ""
        };
        writeln!(out, "{:>3}/{total} {}{flag}", i + 1, step.description)?;
        match &step.action {
            Action::Run(argv) => writeln!(out, "        run   {}", plan::sh_words(argv))?,
            Action::WriteFile(w) => writeln!(
                out,
                "        write {} ({} bytes{}{})",
                w.path,
                w.content.len(),
                w.mode
                    .map(|m| format!(", mode {m:04o}"))
                    .unwrap_or_default(),
                if w.parents { ", parents" } else { "" }
            )?,
            Action::RemoveFiles(paths) => writeln!(out, "        rm    {}", paths.join(" "))?,
            Action::NameLink(l) => writeln!(out, "        link  {} as {}", l.mac, l.name)?,
        }
    }
    writeln!(out)?;
    let exec = match composed.exec.as_slice() {
        [shell, flag, script] if flag.starts_with('-') && script.contains('\n') => format!(
            "{} {flag} <script of {} bytes: the steps above, with step markers>",
            plan::sh_words(std::slice::from_ref(shell)),
            script.len()
        ),
        argv => plan::sh_words(argv),
    };
    // The nonce is drawn for each exec; show where it goes.
    let placeholder = plan::Nonce::from_bytes([0; plan::NONCE_HEX_LEN / 2]);
    let nonce_words = plan::exec_argv(&composed.plan, &composed.exec, &placeholder)
        .len()
        .saturating_sub(composed.exec.len());
    let exec = match (nonce_words, composed.plan.dialect) {
        (0, _) => exec,
        (_, plan::Dialect::PosixSh) => format!("{exec} sh <nonce: fresh for each exec>"),
        (_, plan::Dialect::PowerShell) => format!("{exec} '<nonce: fresh for each exec>'"),
    };
    writeln!(out, "exec: cocoon vm exec {} -- {exec}", obs.vm_id)?;
    writeln!(out)?;
    writeln!(out, "hint script:")?;
    writeln!(out, "{}", composed.script)?;
    Ok(out)
}

fn run_plugin_test(args: &PluginTestArgs, config: Option<&Path>) -> Result<u8> {
    let settings = args.config.resolve(config)?;
    let report = kit::test_plugin(
        kit::engine_options(&settings.planner.engine),
        &args.plugin,
        &args.cases,
        kit::TestOptions {
            bless: args.bless,
            render: args.render,
        },
    )?;
    if let Output::Text = args.output {
        for warning in report.cases.iter().flat_map(|c| &c.warnings) {
            eprintln!("{}", display::terminal_text(&format!("warning: {warning}")));
        }
    }
    match args.output {
        Output::Json => print_json(&report)?,
        Output::Text => print_terminal(&report.to_string()),
    }
    Ok(if report.success() { 0 } else { 1 })
}

fn run_plugin_inspect(args: &PluginInspectArgs, config: Option<&Path>) -> Result<u8> {
    let settings = args.config.resolve(config)?;
    let inspector = kit::Inspector::new(
        kit::engine_options(&settings.planner.engine),
        settings.planner.plugin_dir.as_deref(),
    )?;
    let (pinned, unchecked) = settings.pinned.stored_files();
    let inspector = inspector.with_pinned(pinned, unchecked);
    let inspection = inspector.inspect(&args.plugin);
    match args.output {
        Output::Json => print_json(&inspection)?,
        Output::Text => print_terminal(&inspection.to_string()),
    }
    Ok(if inspection.success() { 0 } else { 1 })
}

fn run_plugin_new(args: &PluginNewArgs) -> Result<u8> {
    let sdk = args.sdk.clone().unwrap_or_else(template::default_sdk_dir);
    let dir = template::new_plugin(&args.name, &args.dir, &sdk)?;
    println!("created {}", dir.display());
    Ok(0)
}

/// Registry options for a push or pull of `reference`: plain HTTP to its
/// registry when asked, besides the configured ones.
fn registry_options(
    reference: &PluginRef,
    plain_http: bool,
    configured: &RegistryOptions,
) -> RegistryOptions {
    let mut options = RegistryOptions::from_env(configured.plain_http.clone());
    if plain_http {
        options.plain_http.push(reference.registry.clone());
    }
    options
}

async fn run_plugin_push(args: &PluginPushArgs) -> Result<u8> {
    let reference: PluginRef = args.reference.parse()?;
    let wasm = read_bytes(&args.plugin)?;
    let options = registry_options(&reference, args.plain_http, &RegistryOptions::default());
    let pinned = oci::Registry::new(&options).push(&reference, &wasm).await?;
    println!("pushed {}: pin {pinned}", args.plugin.display());
    Ok(0)
}

async fn run_plugin_pull(args: &PluginPullArgs, config: Option<&Path>) -> Result<u8> {
    let reference: PluginRef = args.reference.parse()?;
    let tags = if args.allow_tag {
        Tags::Resolve
    } else {
        Tags::Refuse
    };
    let settings = args.oci.resolve(config)?;
    let options = registry_options(&reference, args.plain_http, &settings.pinned.registry);
    let artifact = oci::Registry::new(&options).pull(&reference, tags).await?;
    if reference.digest().is_none() {
        println!("{reference} is {}: pin this", artifact.reference);
    }
    let path = match &args.output {
        Some(path) => {
            std::fs::write(path, &artifact.wasm)
                .with_context(|| format!("cannot write {}", path.display()))?;
            path.clone()
        }
        None => {
            let store = settings
                .pinned
                .store
                .as_deref()
                .ok_or(oci::OciError::NoStore)?;
            oci::Store::open(store)?.put(&artifact)?
        }
    };
    println!(
        "pulled {} (plugin sha256 {}) to {}",
        artifact.reference,
        artifact.wasm_sha256,
        path.display()
    );
    Ok(0)
}

fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

fn main() -> ExitCode {
    fixup_host::logging::init();
    let cli = Cli::parse();
    let config = cli.config.as_deref();
    let result = match &cli.command {
        Command::Plan(args) => run_plan(args, config),
        Command::Run(args) => runtime().and_then(|rt| rt.block_on(run_run(args, config))),
        Command::Serve(args) => runtime().and_then(|rt| rt.block_on(run_serve(args, config))),
        Command::Capture(args) => run_capture(args, config),
        Command::Plugin(PluginCommand::Test(args)) => run_plugin_test(args, config),
        Command::Plugin(PluginCommand::Inspect(args)) => run_plugin_inspect(args, config),
        Command::Plugin(PluginCommand::New(args)) => run_plugin_new(args),
        Command::Plugin(PluginCommand::Push(args)) => {
            runtime().and_then(|rt| rt.block_on(run_plugin_push(args)))
        }
        Command::Plugin(PluginCommand::Pull(args)) => {
            runtime().and_then(|rt| rt.block_on(run_plugin_pull(args, config)))
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("{}", display::terminal_text(&format!("error: {e:#}")));
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}
