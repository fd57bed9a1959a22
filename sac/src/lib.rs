//! Windows static IPs over the serial console (spec section 10 of
//! `docs/behaviour.md`): cocoon gives a Windows guest no cloud-init data,
//! so the host types each static address into the Special Administration
//! Console (SAC) on the VM's Cloud Hypervisor serial console itself.
//!
//! # Layout
//!
//! - [`listing`]: SAC's `Net: <n>, Ip=<address>` listing, matched by hand.
//! - [`nic`]: the record's NICs and prefix-to-mask.
//! - [`error`]: [`SacError`] and the Warning event each failure emits.

pub mod error;
pub mod listing;
pub mod nic;

pub use error::{SacError, reasons};
pub use nic::{Nic, StaticNic, prefix_mask};
