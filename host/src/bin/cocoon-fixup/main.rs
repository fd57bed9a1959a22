//! `cocoon-fixup`: a thin command line over the `fixup_host` library.
//! `main` parses, dispatches to the subcommand, prints the error once and
//! maps the typed outcome to the exit code.
//!
//! # Layout
//!
//! - `args`: the flags of every subcommand and their help.
//! - `commands`: `plan`, `run`, `serve`, `capture`.
//! - `plugin`: the `plugin` subcommands.
//! - `assemble`: planners and the host, from the settings; what a reload
//!   builds.
//! - `plan_text`: `plan`'s text output.

mod args;
mod assemble;
mod commands;
mod plan_text;
mod plugin;

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;

use crate::args::*;
use crate::commands::*;
use crate::plugin::*;
use fixup_core::decision::{FixupEnd, Handled, Readiness, SacEnd, Summary};
use fixup_core::display;

/// `run`'s exit code for a summary (documented in `run --help`).
fn run_exit_code(summary: &Summary) -> u8 {
    if summary.sac == Some(SacEnd::Failed) {
        return 2;
    }
    if matches!(summary.sac, Some(SacEnd::Shutdown | SacEnd::Gone)) {
        return 4;
    }
    match (summary.fixup, summary.readiness, summary.action) {
        (_, _, Handled::VmMismatch) => 5,
        (Some(FixupEnd::Exhausted | FixupEnd::PlanFailed), _, _) | (_, _, Handled::Parked) => 2,
        (_, Some(Readiness::TimedOut), _) => 3,
        (Some(FixupEnd::Shutdown | FixupEnd::Gone), _, _)
        | (_, Some(Readiness::Shutdown | Readiness::Gone), _) => 4,
        _ => 0,
    }
}

/// `prepare`'s exit code for its summary (its `--help` lists them).
fn prepare_exit_code(summary: &Summary) -> u8 {
    match (summary.fixup, summary.action) {
        (_, Handled::VmMismatch) => 5,
        (Some(FixupEnd::Exhausted | FixupEnd::PlanFailed), _) => 2,
        (Some(FixupEnd::Shutdown | FixupEnd::Gone), _) => 4,
        _ if summary.hands_off.is_some() => 4,
        _ => 0,
    }
}

fn main() -> ExitCode {
    fixup_host::logging::init();
    let cli = Cli::parse();
    let config = cli.config.as_deref();
    let result = match &cli.command {
        Command::Plan(args) => run_plan(args, config),
        Command::Run(args) => runtime()
            .and_then(|rt| rt.block_on(run_run(args, config)))
            .map(|summary| run_exit_code(&summary)),
        Command::Prepare(args) => runtime()
            .and_then(|rt| rt.block_on(run_prepare(args, config)))
            .map(|summary| prepare_exit_code(&summary)),
        Command::Serve(args) => runtime().and_then(|rt| rt.block_on(run_serve(args, config))),
        Command::Capture(args) => run_capture(args, config),
        Command::Embed => run_embed(),
        Command::Plugin(PluginCommand::Test(args)) => run_plugin_test(args, config),
        Command::Plugin(PluginCommand::Inspect(args)) => run_plugin_inspect(args, config),
        Command::Plugin(PluginCommand::New(args)) => run_plugin_new(args),
        Command::Plugin(PluginCommand::Push(args)) => {
            runtime().and_then(|rt| rt.block_on(run_plugin_push(args)))
        }
        Command::Plugin(PluginCommand::Pull(args)) => {
            runtime().and_then(|rt| rt.block_on(run_plugin_pull(args, config)))
        }
        Command::Plugin(PluginCommand::Quarantine(args)) => run_plugin_quarantine(args, config),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("{}", display::terminal_text(&format!("error: {e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// `embed`: the JSON ops on standard input and output until the input
/// ends. SIGINT and SIGTERM are noted and ignored: a signal to the
/// embedder's whole process group (Ctrl-C, a service stopping) must let
/// the embedder end its steps first; the child ends when its input does.
fn run_embed() -> Result<u8> {
    use tokio::signal::unix::{SignalKind, signal};
    let ignoring = runtime()?;
    // Registered before the first request is read.
    let (mut int, mut term) = ignoring
        .block_on(async {
            Ok::<_, std::io::Error>((
                signal(SignalKind::interrupt())?,
                signal(SignalKind::terminate())?,
            ))
        })
        .context("embed: taking over SIGINT and SIGTERM")?;
    std::thread::Builder::new()
        .name("cocoon-fixup-signals".into())
        .spawn(move || {
            ignoring.block_on(async move {
                loop {
                    tokio::select! {
                        _ = int.recv() => {}
                        _ = term.recv() => {}
                    }
                    tracing::info!("embed: a signal is ignored; it ends at the end of its input");
                }
            });
        })?;
    cocoon_fixup::wire::serve(std::io::stdin().lock(), std::io::stdout())
        .map(|()| 0)
        .map_err(|e| anyhow::anyhow!("embed: {e}"))
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}
