//! The whole pass for one VM (spec section 10): check the input, open the
//! console, list the interfaces, then set and check each static NIC in
//! the record's order. For a caller that needs nothing between the steps;
//! one that must look at its pod in between uses [`Session`] itself.

use crate::transcript::Transcript;
use crate::{Budgets, Dial, Nic, SacError, Session, StopCheck};

/// How a pass ended, and what it said to the console on the way.
#[derive(Debug)]
pub struct Pass {
    /// The listed interfaces (position `i` belongs to the record's NIC
    /// `i`), or why the pass ended. Empty when no NIC is static: then
    /// nothing was dialled.
    pub result: Result<Vec<u32>, SacError>,
    /// The exchanges of the session, also when it failed (empty when it
    /// never reached the prompt).
    pub transcript: Transcript,
}

/// Runs the pass over `nics`, the VM record's `network_configs` in
/// inspect order. Every static NIC's prefix is checked before anything is
/// dialled, so invalid input never reaches the console. `stop` is
/// consulted before the pass, between tries and before each set line.
pub fn run_pass(dial: &mut dyn Dial, nics: &[Nic], budgets: &Budgets, stop: StopCheck) -> Pass {
    let mut transcript = Transcript::default();
    let result = pass(dial, nics, budgets, stop, &mut transcript);
    Pass { result, transcript }
}

fn pass(
    dial: &mut dyn Dial,
    nics: &[Nic],
    budgets: &Budgets,
    stop: StopCheck,
    transcript: &mut Transcript,
) -> Result<Vec<u32>, SacError> {
    for (position, nic) in nics.iter().enumerate() {
        if let Nic::Static(nic) = nic {
            nic.mask().map_err(|e| match e {
                SacError::Invalid { problem, fix } => SacError::Invalid {
                    problem: format!("network_configs[{position}]: {problem}"),
                    fix,
                },
                other => other,
            })?;
        }
    }
    if !nics.iter().any(|nic| matches!(nic, Nic::Static(_))) {
        return Ok(Vec::new());
    }
    if stop.is_set() {
        return Err(SacError::Stopped);
    }
    let mut session = Session::open(dial, budgets, stop)?;
    let result = set_all(&mut session, nics);
    transcript.append(session.into_transcript());
    result
}

fn set_all(session: &mut Session, nics: &[Nic]) -> Result<Vec<u32>, SacError> {
    let nets = session.enumerate(nics.len())?;
    for (nic, &net) in nics.iter().zip(&nets) {
        if let Nic::Static(nic) = nic {
            session.set_static(net, nic)?;
        }
    }
    Ok(nets)
}
