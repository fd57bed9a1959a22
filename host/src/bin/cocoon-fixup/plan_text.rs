//! `plan`'s text output: the report, the steps, the exec argv and the hint
//! script, as a person reads them in a terminal.

use anyhow::Result;

use fixup_core::binding::Verdict;
use fixup_core::facts::Observation;
use fixup_core::plan::{self, StepAction};
use fixup_core::planner::PlanOutcome;

pub(crate) fn plan_text(
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
            StepAction::Run(argv) => writeln!(out, "        run   {}", plan::sh_words(argv))?,
            StepAction::WriteFile(w) => writeln!(
                out,
                "        write {} ({} bytes{}{})",
                w.path,
                w.content.len(),
                w.mode
                    .map(|m| format!(", mode {m:04o}"))
                    .unwrap_or_default(),
                if w.parents { ", parents" } else { "" }
            )?,
            StepAction::RemoveFiles(paths) => writeln!(out, "        rm    {}", paths.join(" "))?,
            StepAction::NameLink(l) => writeln!(out, "        link  {} as {}", l.mac, l.name)?,
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
