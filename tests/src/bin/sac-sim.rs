//! The SAC simulator (`fixup_sac::sim`) as a program, for executors that
//! are not written in Rust: the Go package's tests open the console through
//! the library against it, as the daemon's tests do in process.
//!
//! `sac-sim [--no-prompt] <cocoon root> <vm id> <net>...` listens on the
//! VM's console socket below the cocoon root (made as Cloud Hypervisor
//! makes it), with one interface per `<net>` (a number; `<net>:noanswer`
//! answers no set line), and prints `listening` on a line once it does.
//! `--no-prompt`: no empty line is ever answered (a console that holds
//! the dial), and `connected` is printed once a client has connected. When its
//! standard input ends it prints one JSON line, `{"received": [lines],
//! "addresses": {"<net>": "<ip>"}}`, and exits.

use std::io::{Read, Write};

use std::sync::Arc;

use fixup_sac::sim::{PromptMode, Script, SetMode, Sim, SimNet, console_path_in};

fn main() {
    let mut args: Vec<String> = std::env::args().collect();
    let no_prompt = args.get(1).is_some_and(|a| a == "--no-prompt");
    if no_prompt {
        args.remove(1);
    }
    let [_, root, vm, nets @ ..] = args.as_slice() else {
        eprintln!("usage: sac-sim [--no-prompt] <cocoon root> <vm id> <net>[:noanswer]...");
        std::process::exit(2);
    };
    let mut script = Script::new();
    if no_prompt {
        script = script.prompt(PromptMode::Never);
    }
    let mut numbers = Vec::new();
    for spec in nets {
        let (number, mode) = match spec.split_once(':') {
            Some((n, "noanswer")) => (n, SetMode::NoAnswer),
            Some(_) => fail(&format!("unknown interface option in {spec:?}")),
            None => (spec.as_str(), SetMode::Takes),
        };
        let number: u32 = number
            .parse()
            .unwrap_or_else(|_| fail(&format!("{spec:?} is not an interface number")));
        numbers.push(number);
        script = script.net(SimNet::new(number, "169.254.10.2").set_mode(mode));
    }
    let path = console_path_in(std::path::Path::new(root), vm)
        .unwrap_or_else(|e| fail(&format!("cannot make the console's directory: {e}")));
    let sim = Arc::new(
        Sim::start(&path, script)
            .unwrap_or_else(|e| fail(&format!("cannot listen on {}: {e}", path.display()))),
    );
    let mut out = std::io::stdout();
    writeln!(out, "listening").and_then(|()| out.flush()).ok();
    if no_prompt {
        let sim = Arc::clone(&sim);
        std::thread::spawn(move || {
            while sim.connections() == 0 {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let mut out = std::io::stdout();
            writeln!(out, "connected").and_then(|()| out.flush()).ok();
        });
    }
    let mut rest = Vec::new();
    std::io::stdin().read_to_end(&mut rest).ok();
    let addresses: serde_json::Map<String, serde_json::Value> = numbers
        .iter()
        .filter_map(|n| Some((n.to_string(), sim.address(*n)?.into())))
        .collect();
    let report = serde_json::json!({"received": sim.received(), "addresses": addresses});
    writeln!(out, "{report}").ok();
    if let Ok(sim) = Arc::try_unwrap(sim) {
        sim.stop();
    }
}

fn fail(why: &str) -> ! {
    eprintln!("sac-sim: {why}");
    std::process::exit(2);
}
