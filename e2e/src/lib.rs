//! The end-to-end guest suite's shared parts: what both the `cocoon-shim`
//! binary and the tests need. The suite itself (image cache, QEMU, network
//! namespaces, the scenarios) is in `tests/`; how to run it is in
//! `docs/e2e.md`.
//!
//! # Layout
//!
//! - [`qga`]: a client for the QEMU guest agent on its virtio-serial
//!   socket: synchronise, run a command and collect its exit and output,
//!   shut the guest down.
//! - [`state`]: where a VM's files live below the suite's stand-in cocoon
//!   root, so the shim finds the agent socket and the inspect JSON of a VM
//!   id the same way the harness wrote them.
//! - `src/bin/cocoon-shim.rs`: a `cocoon`-compatible CLI (`vm exec`,
//!   `vm inspect --json`) over [`qga`] and [`state`], for the host's real
//!   `CocoonCli`.

pub mod qga;
pub mod state;
