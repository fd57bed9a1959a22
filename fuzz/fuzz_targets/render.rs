//! Plan checking and rendering: an arbitrary plan goes through
//! `Plan::check`; one that passes is rendered as the exec argv and as the
//! hint in its dialect, and a failure is attributed from arbitrary stderr
//! under an arbitrary nonce.
//! Nothing may panic, and the rendered forms keep their shape.

#![no_main]

use arbitrary::Arbitrary;
use base64::Engine as _;
use fixup_core::plan::{
    self, StepAction, Dialect, Phase, Plan, PlanLimits, ScriptHeader, Step, WriteFile,
};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum FuzzAction {
    Run(Vec<String>),
    Write {
        path: String,
        content: String,
        mode: Option<u32>,
    },
    Remove(Vec<String>),
}

#[derive(Debug, Arbitrary)]
struct FuzzStep {
    description: String,
    phase: u8,
    best_effort: bool,
    action: FuzzAction,
}

#[derive(Debug, Arbitrary)]
struct Input {
    powershell: bool,
    steps: Vec<FuzzStep>,
    title: Vec<String>,
    exit_code: Option<i32>,
    nonce: [u8; 16],
    stderr: Vec<u8>,
}

fn plan(input: &Input) -> Plan {
    Plan {
        dialect: if input.powershell {
            Dialect::PowerShell
        } else {
            Dialect::PosixSh
        },
        steps: input
            .steps
            .iter()
            .map(|s| Step {
                description: s.description.clone(),
                phase: match s.phase % 3 {
                    0 => Phase::Prepare,
                    1 => Phase::Link,
                    _ => Phase::Configure,
                },
                best_effort: s.best_effort,
                action: match &s.action {
                    FuzzAction::Run(argv) => StepAction::Run(argv.clone()),
                    FuzzAction::Write {
                        path,
                        content,
                        mode,
                    } => StepAction::WriteFile(WriteFile {
                        path: path.clone(),
                        content: content.clone(),
                        mode: *mode,
                        parents: false,
                    }),
                    FuzzAction::Remove(patterns) => StepAction::RemoveFiles(patterns.clone()),
                },
            })
            .collect(),
    }
}

fuzz_target!(|input: Input| {
    let plan = plan(&input);
    if plan.check(&PlanLimits::default()).is_err() {
        return;
    }
    let exec = plan::render_exec(&plan);
    assert!(!exec.is_empty());
    match plan.steps.as_slice() {
        [
            Step {
                best_effort: false,
                action: StepAction::Run(argv),
                ..
            },
        ] => assert_eq!(&exec, argv, "one run step is exec'd directly"),
        _ => match plan.dialect {
            Dialect::PosixSh => assert_eq!(exec[..2], ["sh", "-c"]),
            Dialect::PowerShell => assert_eq!(exec[0], "powershell"),
        },
    }
    let script = plan::render_script(
        &plan,
        &ScriptHeader {
            title: input.title.clone(),
        },
    );
    let hint = plan::hint_base64(&script);
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(&hint)
        .expect("the hint is base64");
    assert_eq!(decoded, script.as_bytes());
    // Comment lines of the header cannot break out into commands.
    if plan.dialect == Dialect::PosixSh {
        let mut lines = script.lines();
        assert_eq!(lines.next(), Some("#!/bin/sh"));
    }
    for word in plan.steps.iter().flat_map(|s| match &s.action {
        StepAction::Run(argv) => argv.clone(),
        _ => Vec::new(),
    }) {
        let _ = plan::sh_quote(&word);
        let _ = plan::ps_quote(&word);
    }
    let nonce = plan::Nonce::from_bytes(input.nonce);
    let argv = plan::exec_argv(&plan, &exec, &nonce);
    assert_eq!(argv[..exec.len()], exec[..], "the nonce is only appended");
    let failure = plan::attribute_failure(&plan, &nonce, input.exit_code, &input.stderr);
    let _ = failure.to_string();
    let _ = plan::ran_to_completion(&plan, &nonce, &input.stderr);
});
