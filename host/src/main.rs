//! `cocoon-fixup`: a thin command line over the `fixup_host` library.
//! Parses, calls the library, prints the error once, picks the exit code.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};

use fixup_host::facts::{BootKind, Observation, Overrides, PodInput, VmInspect};
use fixup_host::plan::{self, Action, PlanLimits};
use fixup_host::planner::{PlanOutcome, Planner, PlannerOptions};
use fixup_host::plugin::cache::DEFAULT_CACHE_DIR;
use fixup_host::plugin::sandbox::{DEFAULT_FUEL, DEFAULT_MEMORY_BYTES};
use fixup_host::plugin::{DEFAULT_SLOTS, EngineOptions, Limits};
use fixup_host::probe::DEFAULT_COCOON_ROOT;

/// Where vendor plugins are looked for unless `--plugin-dir` says otherwise.
const DEFAULT_PLUGIN_DIR: &str = "/etc/cocoon-fixup/plugins";

/// Post-clone guest network fixup for cocoon microVMs.
///
/// Decides whether a cloned VM needs commands run inside its guest to get
/// its network back, and produces them with sandboxed WebAssembly plugins.
#[derive(Debug, Parser)]
#[command(name = "cocoon-fixup", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Classify a VM and print the fixup plan for it (nothing is run).
    ///
    /// Example:
    ///   cocoon-fixup plan --pod examples/oci-static/pod.json --vm examples/oci-static/vm.json
    Plan(PlanArgs),
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
    /// The snapshot's recorded source image (known on a normal clone only).
    #[arg(long, value_name = "URL")]
    source_image: Option<String>,
    /// Override the boot kind read from the pod annotations.
    #[arg(long, value_enum)]
    boot: Option<Boot>,
    #[command(flatten)]
    engine: EngineArgs,
    /// How to print the result.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
}

/// Options shared by every command that loads plugins.
#[derive(Debug, Args)]
struct EngineArgs {
    /// The cocoon root; the overlay probe looks under
    /// `<root>/run/cloudhypervisor/<vm id>/overlay.qcow2`.
    #[arg(long, value_name = "DIR", env = "COCOON_ROOT", default_value = DEFAULT_COCOON_ROOT)]
    cocoon_root: PathBuf,
    /// Directory of vendor plugins (`*.wasm`), loaded after the built-ins.
    /// The default is used only when it exists; a given one must exist.
    #[arg(long, value_name = "DIR", env = "COCOON_FIXUP_PLUGIN_DIR")]
    plugin_dir: Option<PathBuf>,
    /// Directory for precompiled plugins (makes a restart load in
    /// milliseconds).
    #[arg(long, value_name = "DIR", env = "COCOON_FIXUP_CACHE_DIR", default_value = DEFAULT_CACHE_DIR)]
    cache_dir: PathBuf,
    /// Compile plugins at every start instead of using the cache.
    #[arg(long)]
    no_cache: bool,
    /// CPU fuel per plugin call (about 10 ms of work by default).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_FUEL)]
    plugin_fuel: u64,
    /// Linear memory per plugin call, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = (DEFAULT_MEMORY_BYTES >> 20) as u32,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    plugin_memory_mib: u32,
    /// Most steps a plan may have.
    #[arg(long, value_name = "N", default_value_t = PlanLimits::default().max_steps)]
    plan_max_steps: usize,
    /// Most bytes of text (argv, paths, contents, descriptions) in a plan.
    #[arg(long, value_name = "BYTES", default_value_t = PlanLimits::default().max_bytes)]
    plan_max_bytes: usize,
}

impl EngineArgs {
    fn planner(&self) -> Result<Planner> {
        let plugin_dir = match &self.plugin_dir {
            Some(dir) => {
                if !dir.is_dir() {
                    bail!(
                        "plugin directory {} does not exist: create it or drop --plugin-dir",
                        dir.display()
                    );
                }
                Some(dir.clone())
            }
            None => Some(PathBuf::from(DEFAULT_PLUGIN_DIR)).filter(|d| d.is_dir()),
        };
        let options = PlannerOptions {
            engine: EngineOptions {
                limits: Limits {
                    fuel: self.plugin_fuel,
                    memory_bytes: (self.plugin_memory_mib as usize) << 20,
                    plan: PlanLimits {
                        max_steps: self.plan_max_steps,
                        max_bytes: self.plan_max_bytes,
                    },
                },
                cache_dir: (!self.no_cache).then(|| self.cache_dir.clone()),
                slots: DEFAULT_SLOTS,
            },
            cocoon_root: self.cocoon_root.clone(),
            plugin_dir,
        };
        let (planner, failures) = Planner::new(options).context("starting the plugin host")?;
        if !failures.is_empty() {
            for f in &failures {
                eprintln!("error: {}: {}", f.path.display(), f.error);
            }
            bail!(
                "{} plugin(s) could not be loaded: fix or remove them",
                failures.len()
            );
        }
        Ok(planner)
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

fn observe(args: &PlanArgs) -> Result<Observation> {
    let pod = PodInput::from_json(&read(&args.pod)?, &args.pod.display().to_string())?;
    let vm = VmInspect::from_json(&read(&args.vm)?, &args.vm.display().to_string())?;
    let overrides = Overrides {
        boot: args.boot.map(|b| match b {
            Boot::Clone => BootKind::Clone,
            Boot::Fork => BootKind::Fork,
            Boot::Wake => BootKind::Wake,
            Boot::Resumed => BootKind::Resumed,
        }),
        source_image: args.source_image.clone(),
    };
    Ok(Observation::new(&pod, &vm, &overrides)?)
}

fn run_plan(args: &PlanArgs) -> Result<()> {
    let obs = observe(args)?;
    let planner = args.engine.planner()?;
    let outcome = planner.plan(&obs).with_context(|| {
        format!(
            "planning from {} and {}",
            args.pod.display(),
            args.vm.display()
        )
    })?;
    match args.output {
        Output::Json => {
            let json = serde_json::to_string_pretty(&outcome.report(&obs))?;
            println!("{json}");
        }
        Output::Text => print_text(&obs, &outcome),
    }
    Ok(())
}

fn print_text(obs: &Observation, outcome: &PlanOutcome) {
    let report = outcome.report(obs);
    println!("pod {}  (VM {}, id {})", obs.pod, obs.vm_name, obs.vm_id);
    println!(
        "rule {}: {}",
        outcome.decision.rule.number(),
        outcome.decision.rule
    );
    let Some(composed) = &outcome.composed else {
        println!("no fixup needed");
        return;
    };
    println!("scenario: {}  (image: {})", report.scenario, report.image);
    for p in &report.plugins {
        println!(
            "plugin: {} {}  sha256:{}  fuel {}  memory {} KiB",
            p.name,
            p.version,
            &p.sha256[..16],
            p.fuel_used,
            p.peak_memory_bytes >> 10
        );
        println!("  why: {}", p.why);
    }
    let total = composed.plan.steps.len();
    println!();
    for (i, step) in composed.plan.steps.iter().enumerate() {
        let flag = if step.best_effort {
            " (best effort)"
        } else {
            ""
        };
        println!("{:>3}/{total} {}{flag}", i + 1, step.description);
        match &step.action {
            Action::Run(argv) => println!("        run   {}", plan::sh_words(argv)),
            Action::WriteFile(w) => println!(
                "        write {} ({} bytes{})",
                w.path,
                w.content.len(),
                w.mode
                    .map(|m| format!(", mode {m:04o}"))
                    .unwrap_or_default()
            ),
            Action::RemoveFiles(paths) => println!("        rm    {}", paths.join(" ")),
        }
    }
    println!();
    let exec = match composed.exec.as_slice() {
        [shell, flag, script] if flag.starts_with('-') && script.contains('\n') => format!(
            "{} {flag} <script of {} bytes: the steps above, with step markers>",
            plan::sh_words(std::slice::from_ref(shell)),
            script.len()
        ),
        argv => plan::sh_words(argv),
    };
    println!("exec: cocoon vm exec {} -- {exec}", obs.vm_id);
    println!();
    println!("hint script:");
    println!("{}", composed.script);
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("COCOON_FIXUP_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Plan(args) => run_plan(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
