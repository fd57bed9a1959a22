//! The VM's serial console, as the daemon's executor uses it for the
//! Windows static-IP pass (spec section 10): [`Console`] opens it and lists
//! the guest's interfaces, [`ConsoleSession`] sets and checks one address.
//! [`SerialConsoles`] is the real one, over [`fixup_sac`]: the socket
//! `<cocoon root>/run/cloudhypervisor/<vm id>/console.sock`, confined to
//! the cocoon root, with the budgets of spec section 10
//! ([`fixup_sac::Budgets`]), every call within the pass's total deadline
//! ([`fixup_sac::Deadline`], from the task's action). Its calls block
//! (socket reads with timeouts), so the executor runs them on tokio's
//! blocking pool; a shutdown, or the pod's work stopped, reaches them
//! through [`fixup_sac::StopCheck`] within 100 ms. Tests put a stand-in behind
//! the same trait.

use std::path::PathBuf;

use fixup_core::facts::VmId;
use fixup_sac::{Budgets, ConsoleSocket, Deadline, SacError, Session, StaticNic, StopCheck};

/// Opens a VM's console.
pub trait Console: Send + Sync + std::fmt::Debug {
    /// Open `vm`'s console, wait for the prompt and list the guest's
    /// interfaces until at least `need` are listed, by `deadline` (then
    /// [`SacError::Deadline`]): the interface numbers, in the order
    /// listed, and the open console.
    fn open(
        &self,
        vm: &VmId,
        need: usize,
        stop: StopCheck,
        deadline: Deadline,
    ) -> Result<(Vec<u32>, Box<dyn ConsoleSession>), SacError>;
}

/// An open console.
pub trait ConsoleSession: Send {
    /// Set `nic`'s address on interface `net` and check that it took
    /// effect, in rounds, by `deadline`.
    fn set(&mut self, net: u32, nic: &StaticNic, deadline: Deadline) -> Result<(), SacError>;
}

/// The real consoles, below a cocoon root.
#[derive(Debug, Clone)]
pub struct SerialConsoles {
    pub cocoon_root: PathBuf,
    pub budgets: Budgets,
}

impl Console for SerialConsoles {
    fn open(
        &self,
        vm: &VmId,
        need: usize,
        stop: StopCheck,
        deadline: Deadline,
    ) -> Result<(Vec<u32>, Box<dyn ConsoleSession>), SacError> {
        let mut socket = ConsoleSocket::new(&self.cocoon_root, vm.as_str())?;
        let mut session = Session::open_until(&mut socket, &self.budgets, stop, Some(deadline))?;
        let nets = session.enumerate(need)?;
        Ok((nets, Box::new(session)))
    }
}

impl ConsoleSession for Session {
    fn set(&mut self, net: u32, nic: &StaticNic, deadline: Deadline) -> Result<(), SacError> {
        self.set_deadline(Some(deadline));
        self.set_static(net, nic)
    }
}
