//! The IP wait (spec section 6): the lease, the nudge and the DHCP
//! recovery pass, and the readiness written when it ends.

use super::{
    Action, Duration, Event, ExecPurpose, GuestOs, Ipv4Addr, MIN_STEP, Nonce, Note, Plan, PodTask,
    Readiness, Stage, WaitFacts, WaitNic, Write, exec_argv, messages, reasons,
};

/// The DHCP recovery pass the IP wait may run once.
#[derive(Debug)]
pub(super) struct Recovery {
    pub(super) plan: Plan,
    pub(super) exec: Vec<String>,
    pub(super) nics: usize,
    /// The plugin that claims the VM's guest flavour for the recovery plan
    /// ([`ComposedPlan::flavor_claim`]), and the flavour: the pass then
    /// runs at once.
    ///
    /// [`ComposedPlan::flavor_claim`]: crate::planner::ComposedPlan::flavor_claim
    pub(super) claimed_by: Option<(String, String)>,
}

/// The IP wait's state (spec section 6).
#[derive(Debug)]
pub(super) struct Wait {
    pub(super) facts: WaitFacts,
    pub(super) recovery: Option<Recovery>,
    pub(super) start: Duration,
    pub(super) deadline: Duration,
    pub(super) ip: Option<Ipv4Addr>,
    pub(super) nonce: Option<Nonce>,
    /// A clone or a fork: a flavour's plugin may claim its recovery
    /// ([`Recovery::claimed_by`]); a wake or resumed work keeps the wait.
    pub(super) claimable: bool,
}

impl PodTask {
    pub(super) fn readiness(&mut self, readiness: Readiness, ip: Option<Ipv4Addr>) -> Action {
        self.note(Note::IpWait {
            readiness,
            wake: self.wake,
        });
        self.summary.readiness = Some(readiness);
        self.summary.ip = ip.map(|ip| ip.to_string());
        self.finish()
    }

    /// Start the IP wait (spec section 6).
    ///
    /// - First NIC static: its configured IP, at once.
    /// - Otherwise the primary MAC's lease.
    /// - Windows: one `cmd /c ipconfig /renew` nudge after `renew_after`.
    /// - A Linux clone that needed no fixup: one DHCP recovery pass after
    ///   `dhcp_recovery_after`, inside the same budget.
    pub(super) fn wait(&mut self, mut wait: Box<Wait>) -> Action {
        wait.start = self.now;
        wait.deadline = self.now + self.settings.ready.budget;
        match wait.facts.first {
            Some(WaitNic::Static(address)) => self.wait_over(wait, Some(address)),
            None => {
                let until = wait.deadline;
                self.stage = Stage::WaitLast(wait);
                Action::Sleep { until }
            }
            Some(WaitNic::Lease(mac)) => {
                let nudge_at = if wait.facts.os == GuestOs::Windows {
                    self.settings
                        .ready
                        .renew
                        .then(|| wait.start + self.settings.ready.renew_after)
                } else if let Some(recovery) = &wait.recovery {
                    // A flavour's plugin that claims the clone knows its
                    // network files match the parent's NIC: no 15 s wait
                    // for a lease that cannot come.
                    match recovery.claimed_by {
                        Some(_) => Some(wait.start),
                        None => Some(wait.start + self.settings.ready.dhcp_recovery_after),
                    }
                } else {
                    None
                };
                match nudge_at.filter(|at| *at < wait.deadline) {
                    Some(until) => {
                        self.stage = Stage::WaitFirst(wait);
                        Action::WaitLease { mac, until }
                    }
                    None => self.wait_last(wait),
                }
            }
        }
    }

    /// The nudge: the Windows renew, or the DHCP recovery pass.
    pub(super) fn nudge(&mut self, mut wait: Box<Wait>) -> Action {
        let left = wait.deadline.saturating_sub(self.now);
        let vm = wait.facts.id.clone();
        if wait.facts.os == GuestOs::Windows {
            // Three arguments, as the stack passes them: `cmd /c` runs the
            // one string whether the guest agent quotes each argument
            // (cmd then strips the outer quotes: `ipconfig /renew` names no
            // executable) or joins them with spaces.
            let argv = ["cmd", "/c", "ipconfig /renew"].map(str::to_owned).to_vec();
            let timeout = self.settings.ready.renew_timeout.min(left).max(MIN_STEP);
            self.stage = Stage::WaitNudge(wait);
            return Action::Exec {
                vm,
                argv,
                timeout,
                purpose: ExecPurpose::Renew,
            };
        }
        let Some(recovery) = &wait.recovery else {
            return self.wait_last(wait);
        };
        let message = match &recovery.claimed_by {
            Some((plugin, flavor)) => {
                messages::dhcp_recovery_claimed(plugin, flavor, recovery.nics)
            }
            None => messages::dhcp_recovery(self.settings.ready.dhcp_recovery_after, recovery.nics),
        };
        self.tell(Event::normal(reasons::DHCP_RECOVERY, message));
        let nonce = match (self.nonces)() {
            Ok(nonce) => nonce,
            Err(e) => {
                self.note(Note::Warn(format!("DHCP recovery pass failed: {e}")));
                return self.wait_last(wait);
            }
        };
        let argv = exec_argv(&recovery.plan, &recovery.exec, &nonce);
        wait.nonce = Some(nonce);
        let timeout = self.settings.ready.recovery_timeout.min(left).max(MIN_STEP);
        self.stage = Stage::WaitNudge(wait);
        Action::Exec {
            vm,
            argv,
            timeout,
            purpose: ExecPurpose::Recovery,
        }
    }

    /// The lease until the end of the budget.
    pub(super) fn wait_last(&mut self, wait: Box<Wait>) -> Action {
        let until = wait.deadline;
        let Some(WaitNic::Lease(mac)) = wait.facts.first else {
            unreachable!("only a lease is waited for");
        };
        self.stage = Stage::WaitLast(wait);
        Action::WaitLease { mac, until }
    }

    /// The wait is over: the final write is decided from a read of the
    /// pod and lands only while the pod is still as read.
    pub(super) fn wait_over(&mut self, mut wait: Box<Wait>, ip: Option<Ipv4Addr>) -> Action {
        wait.ip = ip;
        self.stage = Stage::ReadingFor(Write::Final(wait));
        Action::Read
    }
}
