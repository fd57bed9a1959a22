//! Windows static IPs over the serial console (spec section 10 of
//! `docs/behaviour.md`): cocoon gives a Windows guest no cloud-init data,
//! so the host types each static address into the Special Administration
//! Console (SAC) on the VM's Cloud Hypervisor serial console itself.
//!
//! The crate promises three things. It talks to the console at
//! `<cocoon root>/run/cloudhypervisor/<vm id>/console.sock` only, without
//! following a link below the root ([`ConsoleSocket`]). It sends nothing
//! but lines built from validated values: `i`, digits, dots and single
//! spaces. And every wait has a budget ([`Budgets`], the spec's numbers by
//! default) and gives way to a [`StopCheck`] within 100 ms, so a shutdown
//! never waits out a 60 s dial; a [`Deadline`] bounds the whole pass, every
//! NIC included, so a console that answers each line just in time cannot
//! hold the host for minutes.
//!
//! Blocking and std only: the pass is one short, sequential conversation.
//! A caller on an async runtime runs it on a blocking thread.
//!
//! # Layout
//!
//! - [`console`]: the [`Transport`] and [`Dial`] seams, and
//!   [`ConsoleSocket`], the confined Unix socket.
//! - [`session`]: [`Session`], the protocol step by step: open (dial and
//!   prompt), enumerate, set and check.
//! - [`pass`]: [`run_pass`], all steps for one VM's NICs.
//! - [`listing`]: SAC's `Net: <n>, Ip=<address>` listing, matched by hand.
//! - [`nic`]: the record's NICs and prefix-to-mask.
//! - [`budget`]: [`Budgets`] and [`StopCheck`].
//! - [`transcript`]: the bounded record of lines sent, for logs.
//! - [`error`]: [`SacError`] and the Warning event each failure emits.
//! - `line` (private): the only builder of lines sent.
//! - `sim` (feature `sim`): a scripted SAC on a real Unix socket, for tests.

pub mod budget;
pub mod console;
pub mod error;
mod line;
pub mod listing;
pub mod nic;
pub mod pass;
pub mod session;
#[cfg(feature = "sim")]
pub mod sim;
pub mod transcript;

pub use budget::{Budgets, Deadline, StopCheck};
pub use console::{ConsoleSocket, Dial, DialError, Transport};
pub use error::{SacError, Step, go_duration, reasons};
pub use nic::{Nic, StaticNic, prefix_mask};
pub use pass::{Pass, run_pass};
pub use session::Session;
pub use transcript::{Exchange, Reply, TRANSCRIPT_MAX, Transcript};
