//! `fixup-bench`: the whole-process measurements and the summary table.
//!
//! - `fixup-bench report` runs everything below in child processes (so each
//!   figure is that process's own), reads criterion's latest results, and
//!   prints the markdown summary. Run `cargo bench -p fixup-bench` first.
//! - `fixup-bench cold-start [--cache-dir DIR]`: build a planner with the
//!   four built-ins, print the time it took as JSON.
//! - `fixup-bench storm [...]`: the clone storm, as JSON.
//! - `fixup-bench ready [...]`: the readiness reaction, as JSON.
//! - `fixup-bench loop WORKLOAD`: one workload in a loop, to run under a
//!   profiler (`perf record -g fixup-bench loop cold-cache`).
//! - `fixup-bench plan-process [--runs N] [--binary PATH] [--cache-dir DIR]`:
//!   the plan-process figure alone (whole `cocoon-fixup` processes), as JSON.
//! - `fixup-bench kube [--clones 1000] [--nodes 3] [...]`: what a clone
//!   costs a real API server (`fixup_bench::kube`), as JSON; the markdown
//!   tables to `--output` (else standard error).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use fixup_bench::cases::{self, Case};
use fixup_bench::engines::{
    Interrupt, START_VARIANTS, Variant, VariantEngine, first_and_second_call,
};
use fixup_bench::native;
use fixup_bench::process::{self, Machine};
use fixup_bench::ready::{ReadyResult, ReadyRunConfig};
use fixup_bench::report::{
    self, BenchResult, Table, criterion_dir, human_ns, interleaved, median, ratio, read_criterion,
    verdict,
};
use fixup_bench::serve::ServeResult;
use fixup_bench::storm::{StormConfig, StormResult};
use fixup_core::classify::Scenario;
use fixup_core::facts::{ImageKind, Observation, VmFacts};
use serde::{Deserialize, Serialize};

#[derive(Debug, Parser)]
#[command(about = "cocoon-fixup benchmarks: whole-process figures and the summary table")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the whole-process measurements and print the summary table.
    Report {
        /// Criterion's output directory (default: as criterion picks it).
        #[arg(long)]
        criterion_dir: Option<PathBuf>,
        /// Cold starts per mode, each a fresh process.
        #[arg(long, default_value_t = 10)]
        cold_runs: usize,
        #[arg(long, default_value_t = 1000)]
        fixups: usize,
        /// The large storm (the 10 000-flow goal).
        #[arg(long, default_value_t = 10_000)]
        big_fixups: usize,
        /// Pods on the node for the `serve` run (and watch events).
        #[arg(long, default_value_t = 10_000)]
        serve_pods: usize,
        /// Whole `cocoon-fixup` processes per command for the plan-process
        /// figure, in turns.
        #[arg(long, default_value_t = 40)]
        process_runs: usize,
        /// The `cocoon-fixup` binary (default: beside this one; build it
        /// with `cargo build --release -p fixup-host --bin cocoon-fixup`).
        #[arg(long)]
        cocoon_fixup: Option<PathBuf>,
        #[arg(long, default_value_t = 200)]
        ready_runs: usize,
        /// Also write the table to this file.
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Build a planner with the four built-ins and print how long it took.
    ColdStart {
        /// A warm precompiled cache; without it every plugin is compiled.
        #[arg(long)]
        cache_dir: Option<PathBuf>,
    },
    /// The clone storm through `Host::handle`.
    Storm {
        #[arg(long, default_value_t = 1000)]
        fixups: usize,
        #[arg(long, default_value_t = 3)]
        exec_delay_ms: u64,
        #[arg(long, default_value_t = 5)]
        fail_first_every: usize,
        #[arg(long, default_value_t = 100)]
        retry_interval_ms: u64,
        #[arg(long)]
        cache_dir: Option<PathBuf>,
        /// tokio worker threads (default: one per core, as the daemon).
        #[arg(long)]
        workers: Option<usize>,
    },
    /// The fake API server and the runner, for a storm or a serve run in
    /// another process (started by them; serves until stdin closes).
    Standins {
        #[arg(long, default_value_t = 1000)]
        fixups: usize,
        #[arg(long, default_value_t = 0)]
        idle: usize,
        #[arg(long, default_value_t = 3)]
        exec_delay_ms: u64,
        #[arg(long, default_value_t = 5)]
        fail_first_every: usize,
    },
    /// The size of the futures a flow holds while it is in flight, bytes.
    Sizes,
    /// `serve` with many pods on the node (most needing nothing), as JSON.
    Serve {
        #[arg(long, default_value_t = 10_000)]
        pods: usize,
        #[arg(long, default_value_t = 10_000)]
        events: usize,
        #[arg(long)]
        cache_dir: Option<PathBuf>,
    },
    /// Run one workload in a loop, for a profiler.
    Loop {
        #[arg(value_enum)]
        workload: Workload,
        #[arg(long, default_value_t = 1000)]
        iterations: usize,
    },
    /// Whole `cocoon-fixup` processes (`--version`, `plan` of the bundled
    /// examples), as in the report, printed alone as JSON: medians and the
    /// ratios against `--version` measured in the same run.
    PlanProcess {
        /// Processes per command, in turns.
        #[arg(long, default_value_t = 40)]
        runs: usize,
        /// The `cocoon-fixup` binary (default: beside this one).
        #[arg(long)]
        binary: Option<PathBuf>,
        /// A cache directory to warm and use (kept); default: a temporary
        /// one, warmed first and removed at the end.
        #[arg(long)]
        cache_dir: Option<PathBuf>,
    },
    /// What a clone costs a real API server (`cocoon-kube-lab`, one
    /// `cocoon-fixup serve` per node): API requests per kind, one clone at
    /// a time, and the server's load for many clones, as JSON.
    Kube {
        /// Clones of the load (and plain pods of its baseline).
        #[arg(long, default_value_t = 1000)]
        clones: usize,
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Clones per kind, one at a time, each on the next node.
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// Creates the controller has in flight at once.
        #[arg(long, default_value_t = 32)]
        in_flight: usize,
        /// Requests of each kind for the prices of one request at the end.
        #[arg(long, default_value_t = 50)]
        price_requests: usize,
        /// `cocoon-kube-lab` (default: target/cocoon-kube-lab).
        #[arg(long)]
        lab: Option<PathBuf>,
        /// `cocoon-fixup` (default: beside this binary).
        #[arg(long)]
        binary: Option<PathBuf>,
        /// `fake-cocoon` (default: beside this binary).
        #[arg(long)]
        fake_cocoon: Option<PathBuf>,
        /// The Go test's request counts (`COCOON_FIXUP_COUNT_REQUESTS` of
        /// `cargo test -p fixup-capi --test kubeclient`), for the tables.
        #[arg(long)]
        go_counts: Option<PathBuf>,
        /// Keep the lab's data, its audit log and the daemons' logs here
        /// (default: a temporary directory, removed).
        #[arg(long)]
        work_dir: Option<PathBuf>,
        /// Write the markdown tables here (default: standard error).
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Lease written by rename to IP published.
    Ready {
        #[arg(long, default_value_t = 200)]
        runs: usize,
        #[arg(long)]
        cache_dir: Option<PathBuf>,
    },
}

/// What `loop` runs.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Workload {
    /// `Planner::new` from a warm precompiled cache.
    ColdCache,
    /// `Planner::plan`, oci-networkd.
    PlanOci,
    /// `Planner::plan`, windows-pnp.
    PlanWindows,
    /// The native baseline, oci-networkd.
    NativeOci,
}

/// What one `cold-start` child reports.
#[derive(Debug, Serialize, Deserialize)]
struct ColdStart {
    /// `Planner::new` with the four built-ins.
    planner_ms: f64,
    /// From `main` to the planner being ready.
    main_to_ready_ms: f64,
    peak_rss_kib: u64,
}

/// With `--features dhat-heap`, every allocation is recorded; the storm
/// writes the profile (dhat-heap.json) when it ends.
#[cfg(feature = "dhat-heap")]
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

fn main() -> anyhow::Result<()> {
    let entered = Instant::now();
    match Cli::parse().command {
        Cmd::ColdStart { cache_dir } => {
            let started = Instant::now();
            let planner = cases::planner(Path::new("/nonexistent"), cache_dir)?;
            let ready = Instant::now();
            drop(planner);
            print_json(&ColdStart {
                planner_ms: ms(ready - started),
                main_to_ready_ms: ms(ready - entered),
                peak_rss_kib: process::peak_rss_kib(),
            })
        }
        Cmd::Storm {
            fixups,
            exec_delay_ms,
            fail_first_every,
            retry_interval_ms,
            cache_dir,
            workers,
        } => print_json(&{
            #[cfg(feature = "dhat-heap")]
            let _profiler = dhat::Profiler::new_heap();
            fixup_bench::storm::run(&StormConfig {
                fixups,
                exec_delay: Duration::from_millis(exec_delay_ms),
                fail_first_every,
                retry_interval: Duration::from_millis(retry_interval_ms),
                cache_dir,
                workers,
                place: fixup_bench::standins::Place::Process,
                fixups_in_flight: fixup_host::host::DEFAULT_FIXUPS_IN_FLIGHT,
            })?
        }),
        Cmd::Sizes => print_json(&fixup_bench::storm::future_sizes()?),
        Cmd::Serve {
            pods,
            events,
            cache_dir,
        } => print_json(&fixup_bench::serve::run(
            &fixup_bench::serve::ServeConfig {
                pods,
                events,
                cache_dir,
                place: fixup_bench::standins::Place::Process,
            },
        )?),
        Cmd::Standins {
            fixups,
            idle,
            exec_delay_ms,
            fail_first_every,
        } => fixup_bench::standins::run(fixup_bench::standins::StandinsConfig {
            fixups,
            idle,
            exec_delay_ms,
            fail_first_every,
        }),
        Cmd::Loop {
            workload,
            iterations,
        } => run_loop(workload, iterations),
        Cmd::Ready { runs, cache_dir } => print_json(&fixup_bench::ready::run(&ReadyRunConfig {
            runs,
            cache_dir,
            ..ReadyRunConfig::default()
        })?),
        Cmd::Kube {
            clones,
            nodes,
            repeat,
            in_flight,
            price_requests,
            lab,
            binary,
            fake_cocoon,
            go_counts,
            work_dir,
            output,
        } => {
            let go_counts = go_counts
                .map(|path| -> anyhow::Result<serde_json::Value> {
                    let text = std::fs::read_to_string(&path)
                        .with_context(|| format!("reading {}: run `COCOON_FIXUP_COUNT_REQUESTS={} cargo test -p fixup-capi --test kubeclient` first", path.display(), path.display()))?;
                    Ok(serde_json::from_str(&text)?)
                })
                .transpose()?;
            let result = fixup_bench::kube::run(&fixup_bench::kube::KubeConfig {
                clones,
                nodes,
                repeat,
                in_flight,
                price_requests,
                lab: lab.unwrap_or_else(|| workspace_root().join("target/cocoon-kube-lab")),
                binary: cocoon_fixup_binary(binary)?,
                fake_cocoon: fake_cocoon.unwrap_or_else(|| {
                    std::env::current_exe()
                        .unwrap_or_default()
                        .with_file_name("fake-cocoon")
                }),
                work_dir,
            })?;
            let tables = fixup_bench::kube::markdown(&result, go_counts.as_ref());
            match output {
                Some(path) => std::fs::write(&path, &tables)
                    .with_context(|| format!("writing {}", path.display()))?,
                None => eprint!("{tables}"),
            }
            print_json(&result)
        }
        Cmd::PlanProcess {
            runs,
            binary,
            cache_dir,
        } => {
            let binary = cocoon_fixup_binary(binary)?;
            let scratch = tempfile::tempdir()?;
            let cache = cache_dir.unwrap_or_else(|| scratch.path().join("cache"));
            cases::warm_cache(&cache)?;
            let processes = plan_processes(&binary, &cache, runs)?;
            let baseline = processes.first().map_or(Duration::ZERO, |(_, d)| *d);
            print_json(&PlanProcessResult {
                binary: binary.display().to_string(),
                runs,
                commands: processes
                    .iter()
                    .map(|(label, d)| PlanProcessRow {
                        command: label.clone(),
                        median_ms: ms(*d),
                        vs_version: dns(*d) / dns(baseline),
                    })
                    .collect(),
            })
        }
        Cmd::Report {
            criterion_dir: dir,
            cold_runs,
            fixups,
            big_fixups,
            serve_pods,
            process_runs,
            cocoon_fixup,
            ready_runs,
            output,
        } => {
            let dir = dir.unwrap_or_else(|| criterion_dir(&workspace_root()));
            let binary = cocoon_fixup_binary(cocoon_fixup)?;
            let table = report(&ReportConfig {
                criterion: dir,
                cold_runs,
                fixups,
                big_fixups,
                serve_pods,
                process_runs,
                binary,
                ready_runs,
            })?;
            print!("{table}");
            if let Some(path) = output {
                std::fs::write(&path, &table)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(())
        }
    }
}

/// The `cocoon-fixup` binary to measure: the one given, else the one beside
/// this binary.
fn cocoon_fixup_binary(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let binary = match given {
        Some(path) => path,
        None => std::env::current_exe()?.with_file_name("cocoon-fixup"),
    };
    anyhow::ensure!(
        binary.is_file(),
        "{} is missing: build it first (`cargo build --release -p fixup-host --bin cocoon-fixup`) or pass its path",
        binary.display()
    );
    Ok(binary)
}

/// What `plan-process` prints.
#[derive(Debug, Serialize)]
struct PlanProcessResult {
    binary: String,
    runs: usize,
    /// `--version` first, then the examples.
    commands: Vec<PlanProcessRow>,
}

#[derive(Debug, Serialize)]
struct PlanProcessRow {
    command: String,
    median_ms: f64,
    /// This median over `--version`'s, same run.
    vs_version: f64,
}

fn run_loop(workload: Workload, iterations: usize) -> anyhow::Result<()> {
    let scratch = tempfile::tempdir()?;
    let cache = scratch.path().join("cache");
    cases::warm_cache(&cache)?;
    let planner = cases::planner(scratch.path(), Some(cache.clone()))?;
    let started = Instant::now();
    for _ in 0..iterations {
        match workload {
            Workload::ColdCache => drop(cases::planner(scratch.path(), Some(cache.clone()))?),
            Workload::PlanOci => drop(planner.plan(&Case::OciNetworkd.observation(0))?),
            Workload::PlanWindows => drop(planner.plan(&Case::WindowsPnp.observation(0))?),
            Workload::NativeOci => drop(fixup_bench::native::plan(
                &planner,
                scratch.path(),
                &Case::OciNetworkd.observation(0),
            )?),
        }
    }
    let each = started.elapsed() / iterations.max(1) as u32;
    eprintln!("{workload:?}: {} per iteration", human_ns(dns(each)));
    Ok(())
}

fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(value)?);
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Run this binary with `args`; its stdout is one JSON value.
fn child<T: for<'de> Deserialize<'de>>(args: &[&str]) -> anyhow::Result<(T, Duration)> {
    let exe = std::env::current_exe()?;
    let started = Instant::now();
    let out = Command::new(&exe)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {} {}", exe.display(), args.join(" ")))?;
    let elapsed = started.elapsed();
    anyhow::ensure!(
        out.status.success(),
        "`fixup-bench {}` failed: {}",
        args.join(" "),
        out.status
    );
    let value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("reading the output of `fixup-bench {}`", args.join(" ")))?;
    Ok((value, elapsed))
}

/// Median whole-process and in-process cold start over `runs` processes.
struct ColdFigures {
    process: Duration,
    planner: Duration,
    main_to_ready: Duration,
    peak_rss_kib: u64,
}

fn cold_starts(runs: usize, cache_dir: Option<&Path>) -> anyhow::Result<ColdFigures> {
    let mut args = vec!["cold-start".to_owned()];
    if let Some(dir) = cache_dir {
        args.push("--cache-dir".to_owned());
        args.push(dir.display().to_string());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (mut process, mut planner, mut main_to_ready, mut peak) = (vec![], vec![], vec![], 0);
    for _ in 0..runs.max(1) {
        let (figures, elapsed): (ColdStart, _) = child(&args)?;
        process.push(elapsed);
        planner.push(Duration::from_secs_f64(figures.planner_ms / 1e3));
        main_to_ready.push(Duration::from_secs_f64(figures.main_to_ready_ms / 1e3));
        peak = peak.max(figures.peak_rss_kib);
    }
    Ok(ColdFigures {
        process: median(&process),
        planner: median(&planner),
        main_to_ready: median(&main_to_ready),
        peak_rss_kib: peak,
    })
}

fn dns(d: Duration) -> f64 {
    d.as_secs_f64() * 1e9
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// Plan and engine figures measured in turns in this process (see
/// [`interleaved`]): `(id, per-iteration median)`, ids as criterion's.
fn in_turns(cache: &Path) -> anyhow::Result<BTreeMap<String, f64>> {
    let scratch = tempfile::tempdir()?;
    let root = scratch.path().to_owned();
    let planner = cases::planner(&root, Some(cache.to_owned()))?;
    let observations: Vec<(Case, Observation)> =
        Case::ALL.iter().map(|&c| (c, c.observation(0))).collect();
    for (_, obs) in &observations {
        let wasm = planner.plan(obs)?;
        native::assert_same(&wasm, &native::plan(&planner, &root, obs)?);
    }
    let mut work: Vec<report::Workload<'_>> = Vec::new();
    for (case, obs) in &observations {
        let (planner, root) = (&planner, &root);
        work.push((
            format!("plan/native/{}", case.name()),
            Box::new(move || {
                black_box(native::plan(planner, root, black_box(obs)).expect("native plan"));
            }),
        ));
        work.push((
            format!("plan/wasm/{}", case.name()),
            Box::new(move || {
                black_box(planner.plan(black_box(obs)).expect("wasm plan"));
            }),
        ));
    }
    let mut figures: BTreeMap<String, f64> = interleaved(TURN_ROUNDS, TURN_BATCH, &mut work)
        .into_iter()
        .map(|(id, d)| (id, dns(d)))
        .collect();
    drop(work);

    let obs = Case::OciNetworkd.observation(0);
    let facts = VmFacts::validate(&obs, ImageKind::Oci)?;
    let scenario = Scenario::OciNetworkd;
    let expected = native::call("oci-networkd", scenario, &facts)?;
    let selection = planner.plugins().registry().select(scenario, None)?;
    let engines = Variant::ALL
        .iter()
        .map(|&v| VariantEngine::new(v, "oci-networkd"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for engine in &engines {
        anyhow::ensure!(engine.plan(scenario, &facts)? == expected);
    }
    let mut work: Vec<report::Workload<'_>> = Vec::new();
    let facts = &facts;
    work.push((
        "engine/native".to_owned(),
        Box::new(move || {
            black_box(native::call("oci-networkd", scenario, black_box(facts)).expect("call"));
        }),
    ));
    let (plugins, plugin) = (planner.plugins(), &selection.plugin);
    work.push((
        "engine/shipped".to_owned(),
        Box::new(move || {
            black_box(
                plugins
                    .plan(plugin, scenario, black_box(facts))
                    .expect("call"),
            );
        }),
    ));
    for engine in &engines {
        work.push((
            format!("engine/{}", engine.variant().label()),
            Box::new(move || {
                black_box(engine.plan(scenario, black_box(facts)).expect("call"));
            }),
        ));
    }
    figures.extend(
        interleaved(TURN_ROUNDS, TURN_BATCH, &mut work)
            .into_iter()
            .map(|(id, d)| (id, dns(d))),
    );
    Ok(figures)
}

/// Rounds of [`in_turns`], and calls per workload in each: many short
/// rounds, so a burst of load from elsewhere spoils few of them (about 2 s
/// in all on this kind of machine).
const TURN_ROUNDS: usize = 200;
const TURN_BATCH: usize = 10;

/// What `report` runs.
struct ReportConfig {
    criterion: PathBuf,
    cold_runs: usize,
    fixups: usize,
    big_fixups: usize,
    serve_pods: usize,
    process_runs: usize,
    binary: PathBuf,
    ready_runs: usize,
}

/// The bundled examples the plan-process figure plans: one plugin, two
/// plugins, no fixup.
const PROCESS_EXAMPLES: [(&str, &str); 3] = [
    ("oci-static", "one plugin (oci-networkd)"),
    ("fc-dhcp", "two plugins (fc-mac + oci-networkd)"),
    ("no-fixup", "no fixup: no plugin called"),
];

/// Whole `cocoon-fixup` processes, spawn to exit: `--version` and `plan` of
/// each of [`PROCESS_EXAMPLES`], in turns, with the report's warm cache.
/// Medians, by command (`--version` first).
fn plan_processes(
    binary: &Path,
    cache: &Path,
    runs: usize,
) -> anyhow::Result<Vec<(String, Duration)>> {
    let examples = workspace_root().join("examples");
    let key = cases::cache_key(cache);
    let mut commands: Vec<(String, Vec<String>)> =
        vec![("--version".into(), vec!["--version".into()])];
    for (example, _) in PROCESS_EXAMPLES {
        let dir = examples.join(example);
        let arg = |p: PathBuf| p.display().to_string();
        commands.push((
            example.to_owned(),
            vec![
                "plan".into(),
                "--pod".into(),
                arg(dir.join("pod.json")),
                "--vm".into(),
                arg(dir.join("vm.json")),
                "--cocoon-root".into(),
                arg(examples.join("cocoon-root")),
                "--cache-dir".into(),
                arg(cache.to_owned()),
                "--cache-key".into(),
                arg(key.clone()),
            ],
        ));
    }
    let run = |args: &[String]| -> anyhow::Result<Duration> {
        let started = Instant::now();
        let status = Command::new(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .with_context(|| format!("running {}", binary.display()))?;
        let elapsed = started.elapsed();
        anyhow::ensure!(
            status.success(),
            "`{} {}` failed: {status}",
            binary.display(),
            args.join(" ")
        );
        Ok(elapsed)
    };
    // Once each first: the binary's own cache entries and describe records.
    for (_, args) in &commands {
        run(args)?;
    }
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); commands.len()];
    for _ in 0..runs.max(1) {
        for (i, (_, args)) in commands.iter().enumerate() {
            times[i].push(run(args)?);
        }
    }
    Ok(commands
        .into_iter()
        .zip(times)
        .map(|((label, _), t)| (label, median(&t)))
        .collect())
}

fn report(config: &ReportConfig) -> anyhow::Result<String> {
    let ReportConfig {
        criterion,
        cold_runs,
        fixups,
        big_fixups,
        serve_pods,
        process_runs,
        binary,
        ready_runs,
    } = config;
    let (cold_runs, fixups, ready_runs) = (*cold_runs, *fixups, *ready_runs);
    let machine = Machine::current();
    let benches = read_criterion(criterion)?;
    let criterion = criterion.as_path();
    let crit = |id: &str| {
        benches
            .get(id)
            .map_or(f64::NAN, |r: &BenchResult| r.median_ns)
    };

    eprintln!("fixup-bench: warming the plugin cache");
    // The cache and its key's directory (`cases::cache_key`) inside one
    // temporary directory, removed with it.
    let scratch = tempfile::tempdir()?;
    let cache = scratch.path().join("cache");
    cases::warm_cache(&cache)?;
    eprintln!("fixup-bench: plan latency and engine settings, measured in turns");
    let turns = in_turns(&cache)?;
    let turn = |id: &str| turns.get(id).copied().unwrap_or(f64::NAN);
    eprintln!("fixup-bench: first calls on fresh pool slots");
    let first_calls = Variant::ALL
        .iter()
        .filter(|v| v.interrupt == Interrupt::Fuel && v.instance_pre)
        .map(|&v| Ok((v, first_and_second_call(v, 5)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    eprintln!("fixup-bench: cold starts ({cold_runs} processes per mode)");
    let compile = cold_starts(cold_runs, None)?;
    let cached = cold_starts(cold_runs, Some(&cache))?;
    eprintln!("fixup-bench: clone storm ({fixups} flows)");
    let cache_arg = cache.display().to_string();
    let fixups_arg = fixups.to_string();
    let (storm, _): (StormResult, _) =
        child(&["storm", "--fixups", &fixups_arg, "--cache-dir", &cache_arg])?;
    eprintln!("fixup-bench: clone storm ({big_fixups} flows)");
    let big_arg = big_fixups.to_string();
    let (big, _): (StormResult, _) =
        child(&["storm", "--fixups", &big_arg, "--cache-dir", &cache_arg])?;
    eprintln!("fixup-bench: serve with {serve_pods} pods on the node");
    let pods_arg = serve_pods.to_string();
    let (served, _): (ServeResult, _) = child(&[
        "serve",
        "--pods",
        &pods_arg,
        "--events",
        &pods_arg,
        "--cache-dir",
        &cache_arg,
    ])?;
    eprintln!(
        "fixup-bench: whole cocoon-fixup processes ({process_runs} per command, {})",
        binary.display()
    );
    let processes = plan_processes(binary, &cache, *process_runs)?;
    eprintln!("fixup-bench: readiness reaction ({ready_runs} runs)");
    let runs_arg = ready_runs.to_string();
    let (ready, _): (ReadyResult, _) =
        child(&["ready", "--runs", &runs_arg, "--cache-dir", &cache_arg])?;
    let load_end = process::load_average();

    let mut out = String::new();
    out.push_str("## cocoon-fixup benchmarks\n\n");
    out.push_str(&format!(
        "Machine: {} CPUs ({}), {:.1} GiB memory, Linux {}; 1-minute load {:.2} when the report started, {:.2} when it ended.\n\n",
        machine.cpus, machine.cpu_model, machine.memory_gib, machine.kernel, machine.load, load_end
    ));
    if benches.is_empty() {
        out.push_str(&format!(
            "No criterion results under {}: run `cargo bench -p fixup-bench` first for the criterion columns.\n\n",
            criterion.display()
        ));
    }

    // The goals, each against the baseline measured in this run.
    let plan_ratio = |case: Case| {
        turn(&format!("plan/wasm/{}", case.name())) / turn(&format!("plan/native/{}", case.name()))
    };
    let (worst_case, worst) = Case::ALL.iter().map(|&c| (c, plan_ratio(c))).fold(
        (Case::OciNetworkd, f64::NAN),
        |acc, x| {
            if x.1 > acc.1 || acc.1.is_nan() {
                x
            } else {
                acc
            }
        },
    );
    // Criterion's in-process figure, else the fresh processes' one.
    let either = |id: &str, fallback: Duration| {
        let ns = crit(id);
        if ns.is_finite() { ns } else { dns(fallback) }
    };
    let cache_ns = either("cold_start/cache", cached.planner);
    let compile_ns = either("cold_start/compile", compile.planner);
    let mean_plan_ns = Case::ALL
        .iter()
        .map(|c| turn(&format!("plan/wasm/{}", c.name())))
        .sum::<f64>()
        / Case::ALL.len() as f64;

    let mut goals = Table::new(&[
        "goal",
        "measured",
        "baseline (same run)",
        "ratio",
        "verdict",
    ]);
    goals.row(vec![
        "plan <= 25x native baseline".into(),
        format!(
            "worst: {} {}",
            worst_case.name(),
            human_ns(turn(&format!("plan/wasm/{}", worst_case.name())))
        ),
        format!(
            "native {}",
            human_ns(turn(&format!("plan/native/{}", worst_case.name())))
        ),
        format!("{worst:.1}x"),
        verdict(worst, 25.0).into(),
    ]);
    goals.row(vec![
        "cold start from cache <= 5 ms (4 plugins linked: `Planner::new` + `warm`)".into(),
        human_ns(cache_ns),
        format!("compiling: {}", human_ns(compile_ns)),
        ratio(cache_ns, compile_ns),
        verdict(cache_ns, 5e6).into(),
    ]);
    goals.row(vec![
        "clone storm peak memory < 64 MiB".into(),
        mib(storm.peak_rss_kib),
        format!("idle before the storm: {}", mib(storm.rss_before_kib)),
        ratio(storm.peak_rss_kib as f64, storm.rss_before_kib as f64),
        verdict(storm.peak_rss_kib as f64, 64.0 * 1024.0).into(),
    ]);
    goals.row(vec![
        "clone storm CPU < 1 ms per fixup".into(),
        human_ns(storm.cpu_per_fixup_us * 1e3),
        format!("its plan alone (mean of the 4): {}", human_ns(mean_plan_ns)),
        ratio(storm.cpu_per_fixup_us * 1e3, mean_plan_ns),
        verdict(storm.cpu_per_fixup_us, 1000.0).into(),
    ]);
    let big_growth_kib = big.peak_rss_kib.saturating_sub(big.rss_before_kib);
    goals.row(vec![
        format!(
            "storm of {}: host memory <= 40 MiB above the idle process",
            big.fixups
        ),
        format!(
            "{} ({:.1} KiB per flow)",
            mib(big_growth_kib),
            big.bytes_per_flow / 1024.0
        ),
        format!("idle, before the storm: {}", mib(big.rss_before_kib)),
        ratio(big.peak_rss_kib as f64, big.rss_before_kib as f64),
        verdict(big_growth_kib as f64, 40.0 * 1024.0).into(),
    ]);
    goals.row(vec![
        format!("storm of {}: CPU < 0.2 ms per fixup", big.fixups),
        human_ns(big.cpu_per_fixup_us * 1e3),
        format!("its plan alone (mean of the 4): {}", human_ns(mean_plan_ns)),
        ratio(big.cpu_per_fixup_us * 1e3, mean_plan_ns),
        verdict(big.cpu_per_fixup_us, 200.0).into(),
    ]);
    let version = processes[0].1;
    let (worst_label, worst_plan) = processes[1..]
        .iter()
        .filter(|(label, _)| label != "no-fixup")
        .max_by_key(|(_, d)| *d)
        .cloned()
        .unwrap_or_default();
    goals.row(vec![
        "`plan` process <= 1.5x `--version` (cache warm)".into(),
        format!("worst: {worst_label} {}", human_ns(dns(worst_plan))),
        format!("`--version`: {}", human_ns(dns(version))),
        ratio(dns(worst_plan), dns(version)),
        verdict(dns(worst_plan) / dns(version), 1.5).into(),
    ]);
    goals.row(vec![
        "lease to ready p99 <= 20 ms".into(),
        format!("{:.2} ms", ready.p99_ms),
        format!("safety-net poll: {:.0} ms", ready.poll_ms),
        ratio(ready.p99_ms, ready.poll_ms),
        verdict(ready.p99_ms, 20.0).into(),
    ]);
    out.push_str("### Goals\n\n");
    out.push_str(&goals.render());

    out.push_str(&format!(
        "\n### Plan latency per scenario\n\n`Planner::plan` on an observation (classification, overlay probe, validation, a fresh sandbox per plugin call, the call, checks, composition, rendering) against the same host code calling the plugin crates natively; both make the same plan (checked first). Medians of {TURN_ROUNDS} rounds measured in turns; criterion's medians from `cargo bench` for comparison.\n\n"
    ));
    let mut plans = Table::new(&[
        "scenario",
        "plugins",
        "native",
        "wasm",
        "ratio",
        "criterion native",
        "criterion wasm",
        "criterion ratio",
    ]);
    for case in Case::ALL {
        let (n, w) = (
            format!("plan/native/{}", case.name()),
            format!("plan/wasm/{}", case.name()),
        );
        plans.row(vec![
            case.name().into(),
            case.plugins().into(),
            human_ns(turn(&n)),
            human_ns(turn(&w)),
            ratio(turn(&w), turn(&n)),
            human_ns(crit(&n)),
            human_ns(crit(&w)),
            ratio(crit(&w), crit(&n)),
        ]);
    }
    out.push_str(&plans.render());

    out.push_str(
        "\n### Engine settings\n\nThe plugin call alone (fresh Store, instantiation, `plan`, conversion, plan check), oci-networkd. `shipped` is `PluginHost::plan` itself; each variant rebuilds its sandbox with one setting changed (`pooling+fuel+pre` is the shipped configuration rebuilt: the difference between the two is noise). Measured in turns; criterion's median for comparison.\n\n",
    );
    let native_call = turn("engine/native");
    let shipped = turn("engine/shipped");
    let mut engines = Table::new(&[
        "engine",
        "call",
        "vs shipped",
        "vs native call",
        "criterion",
    ]);
    let mut engine_row = |label: String, id: &str| {
        let ns = turn(id);
        engines.row(vec![
            label,
            human_ns(ns),
            ratio(ns, shipped),
            ratio(ns, native_call),
            human_ns(crit(id)),
        ]);
    };
    engine_row("native call (no sandbox)".into(), "engine/native");
    engine_row("shipped (`PluginHost::plan`)".into(), "engine/shipped");
    for variant in Variant::ALL {
        engine_row(variant.label(), &format!("engine/{}", variant.label()));
    }
    out.push_str(&engines.render());

    out.push_str(
        "\nThe first call on a pool slot no instance has used (each plugin's `describe` at start-up) against the second (a running daemon's plan calls); median of 5 fresh engines each.\n\n",
    );
    let mut firsts = Table::new(&["engine", "first call", "second call"]);
    for (variant, (first, second)) in &first_calls {
        firsts.row(vec![
            variant.label(),
            human_ns(dns(*first)),
            human_ns(dns(*second)),
        ]);
    }
    out.push_str(&firsts.render());

    out.push_str(&format!(
        "\n### Cold start\n\nA planner with the four built-ins linked, as the daemon starts: `Planner::new`, then `PluginHost::warm` (from the cache, `Planner::new` registers each plugin from its describe record and `warm` loads and links its code). In-process: criterion's median. Fresh process: median of {cold_runs} processes, the two timed inside, and the whole process from spawn to exit (exec, loading, teardown). The rows rebuilt outside the host load the four eagerly and call each one's `describe`, as the host did before describe records.\n\n"
    ));
    let mut cold = Table::new(&[
        "plugins from",
        "`Planner::new` + `warm` (criterion)",
        "`Planner::new` + `warm` (fresh process)",
        "main to ready",
        "whole process",
        "peak memory",
    ]);
    for (label, id, figures) in [
        ("compiled (no cache)", "cold_start/compile", &compile),
        ("precompiled cache", "cold_start/cache", &cached),
    ] {
        cold.row(vec![
            label.into(),
            human_ns(crit(id)),
            human_ns(dns(figures.planner)),
            human_ns(dns(figures.main_to_ready)),
            human_ns(dns(figures.process)),
            mib(figures.peak_rss_kib),
        ]);
    }
    for variant in START_VARIANTS {
        cold.row(vec![
            format!("cache, rebuilt outside the host: {}", variant.label()),
            human_ns(crit(&format!("cold_start/rebuilt/{}", variant.label()))),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ]);
    }
    cold.row(vec![
        "engine alone (no plugin)".into(),
        human_ns(crit("cold_start/engine")),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
    ]);
    out.push_str(&cold.render());

    out.push_str(&format!(
        "\n### Clone storm\n\nFlows started at once through `Host::handle`, static first NICs, the four scenarios in turn, plugins from the precompiled cache, tokio's default runtime (one worker per core). The pods, their events and the runner live in a second process (`fixup-bench standins`): the host reads and writes pods through the real `kube` client over loopback HTTP to a fake API server, and asks the runner over a Unix socket, one connection per exec or inspect; the runner answers each exec after {:.0} ms and fails the first attempt of every fifth VM. Retry interval {:.0} ms (the default is 3 s). The figures are the host process's alone; the stand-ins' memory is shown apart.\n\n",
        storm.exec_delay_ms, storm.retry_interval_ms
    ));
    let mut st = Table::new(&[
        "figure",
        &format!("{} flows", storm.fixups),
        &format!("{} flows", big.fixups),
    ]);
    let mut both = |label: &str, f: &dyn Fn(&StormResult) -> String| {
        st.row(vec![label.into(), f(&storm), f(&big)]);
    };
    both("flows whose first attempt failed", &|r| {
        r.failed_first.to_string()
    });
    both("execs", &|r| r.attempts.to_string());
    both("wall time", &|r| human_ns(r.wall_ms * 1e6));
    both("CPU time (user + system, all threads)", &|r| {
        human_ns(r.cpu_ms * 1e6)
    });
    both("CPU time per fixup", &|r| {
        human_ns(r.cpu_per_fixup_us * 1e3)
    });
    both("of which in the kernel (system time)", &|r| {
        format!(
            "{} ({:.0} %)",
            human_ns(r.system_cpu_ms * 1e6),
            100.0 * r.system_cpu_ms / r.cpu_ms.max(1e-9)
        )
    });
    both("API requests per fixup (patches, events)", &|r| {
        let n = r.fixups.max(1) as f64;
        format!(
            "{:.1} ({:.1}, {:.1})",
            r.api_requests as f64 / n,
            r.api_patches as f64 / n,
            r.api_events as f64 / n
        )
    });
    both(
        "one API request alone, CPU (a GET of a pod; an event)",
        &|r| {
            format!(
                "{}; {}",
                human_ns(r.cpu_per_get_us * 1e3),
                human_ns(r.cpu_per_event_us * 1e3)
            )
        },
    );
    both(
        "the fixup's API requests at that price (GETs for reads and patches)",
        &|r| {
            let n = r.fixups.max(1) as f64;
            let others = (r.api_requests - r.api_events) as f64 / n;
            let events = r.api_events as f64 / n;
            let floor = others * r.cpu_per_get_us + events * r.cpu_per_event_us;
            format!(
                "{} ({:.0} % of the fixup)",
                human_ns(floor * 1e3),
                100.0 * floor / r.cpu_per_fixup_us.max(1e-9)
            )
        },
    );
    both(
        "resident before the storm (planner, runtime, client)",
        &|r| mib(r.rss_before_kib),
    );
    both("resident after the storm", &|r| mib(r.rss_after_kib));
    both(
        "peak resident during the storm (VmHWM, reset at its start)",
        &|r| mib(r.peak_rss_kib),
    );
    both("peak above the idle process, per flow", &|r| {
        format!("{:.1} KiB", r.bytes_per_flow / 1024.0)
    });
    both("the stand-ins' own resident memory (not counted)", &|r| {
        mib(r.standins_rss_kib)
    });
    out.push_str(&st.render());

    out.push_str(&format!(
        "\n### `serve` with {} pods on the node\n\nThe daemon's watch (metadata only), dispatcher and metrics against the fake API server, {} pods on the node that need nothing and one marker clone (see `fixup_bench::serve`). The listing: `serve::run` starting to the marker's fixup written, the marker made a clone that needs a fixup once the host's watch is open (so after the listing). The events: {} pods changed (one `MODIFIED` watch event each), then the marker again; CPU time over that phase per event.\n\n",
        served.pods, served.pods, served.events
    ));
    let mut sv = Table::new(&["figure", "value"]);
    sv.row(vec![
        "resident, idle daemon (before the watch)".into(),
        mib(served.rss_idle_kib),
    ]);
    sv.row(vec![
        "resident after the listing".into(),
        mib(served.rss_listed_kib),
    ]);
    sv.row(vec![
        "resident after the watch events".into(),
        mib(served.rss_after_events_kib),
    ]);
    sv.row(vec!["peak resident".into(), mib(served.peak_rss_kib)]);
    sv.row(vec![
        "above the idle daemon, per pod on the node".into(),
        format!(
            "{:.0} bytes",
            served.peak_rss_kib.saturating_sub(served.rss_idle_kib) as f64 * 1024.0
                / served.pods.max(1) as f64
        ),
    ]);
    for (label, wall_ms, cpu_ms) in [
        ("the listing: wall, CPU", served.list_ms, served.list_cpu_ms),
        (
            "the watch events: wall, CPU",
            served.events_ms,
            served.events_cpu_ms,
        ),
    ] {
        sv.row(vec![
            label.into(),
            format!("{}, {}", human_ns(wall_ms * 1e6), human_ns(cpu_ms * 1e6)),
        ]);
    }
    sv.row(vec![
        "CPU per watch event (a pod that needs nothing)".into(),
        human_ns(served.cpu_per_event_us * 1e3),
    ]);
    sv.row(vec![
        "API requests in all".into(),
        served.api_requests.to_string(),
    ]);
    sv.row(vec![
        "the stand-ins' own resident memory (not counted)".into(),
        mib(served.standins_rss_kib),
    ]);
    out.push_str(&sv.render());

    out.push_str(&format!(
        "\n### The `plan` process\n\nWhole `cocoon-fixup` processes from spawn to exit (`{}`), cache warm (the report's): `--version` and `plan` of three bundled examples, {} of each in turns, medians. A cached `plan` registers every plugin from its describe record and loads the code of only the plugins it calls.\n\n",
        binary.display(),
        process_runs
    ));
    let mut pp = Table::new(&[
        "command",
        "what it loads",
        "whole process",
        "vs `--version`",
    ]);
    for (label, time) in &processes {
        let what = if label == "--version" {
            "no engine"
        } else {
            PROCESS_EXAMPLES
                .iter()
                .find(|(e, _)| e == label)
                .map_or("", |(_, w)| *w)
        };
        let command = if label == "--version" {
            "`cocoon-fixup --version`".to_owned()
        } else {
            format!("`cocoon-fixup plan` examples/{label}")
        };
        pp.row(vec![
            command,
            what.into(),
            human_ns(dns(*time)),
            ratio(dns(*time), dns(version)),
        ]);
    }
    out.push_str(&pp.render());

    out.push_str(&format!(
        "\n### Readiness reaction\n\nFrom the rename that puts a lease into the lease file to the `vm.cocoonstack.io/ip` patch reaching the pod store, {} runs, one shared `LeaseWatcher` (file events {}; safety-net poll {:.0} ms).\n\n",
        ready.runs,
        if ready.watching {
            "on"
        } else {
            "OFF: polling only"
        },
        ready.poll_ms
    ));
    let mut rd = Table::new(&["min", "p50", "p90", "p99", "max"]);
    rd.row(
        [
            ready.min_ms,
            ready.p50_ms,
            ready.p90_ms,
            ready.p99_ms,
            ready.max_ms,
        ]
        .iter()
        .map(|v| format!("{v:.2} ms"))
        .collect(),
    );
    out.push_str(&rd.render());
    Ok(out)
}
