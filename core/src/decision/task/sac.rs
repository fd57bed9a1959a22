//! The serial-console pass (spec section 10): a Windows VM's static
//! addresses set through its console, checked, within one deadline.

use super::{
    Action, Duration, Event, Fixup, NodeError, Note, PodTask, SacEnd, SacError, SacNic, Stage,
    StaticIpv4, StaticNic, VmId, Wait, Write,
};

/// The serial-console pass (spec section 10).
#[derive(Debug)]
pub(super) struct SacPass {
    pub(super) vm: VmId,
    pub(super) nics: Vec<SacNic>,
    /// The guest's interfaces, once the console is open.
    pub(super) nets: Option<Vec<u32>>,
    /// The next NIC (by position) to look at.
    pub(super) next: usize,
    pub(super) then: AfterSac,
    /// The pass's total deadline on the task's clock (spec section 10),
    /// set when the pass starts ([`PodTask::sac_start`]).
    pub(super) until: Duration,
}

/// What comes after a serial-console pass that set every address.
#[derive(Debug)]
pub(super) enum AfterSac {
    /// `PostCloneSucceeded`, then the IP wait (spec section 5).
    Succeeded(Box<Fixup>),
    /// The IP wait.
    Wait(Box<Wait>),
}

/// The NICs the serial-console pass works on, when one of them is static
/// (a VM with only DHCP NICs gets no pass).
pub(super) fn sac_nics(statics: &[Option<StaticIpv4>]) -> Option<Vec<SacNic>> {
    statics.iter().any(Option::is_some).then(|| {
        statics
            .iter()
            .map(|s| match s {
                Some(s) => SacNic::Static(StaticNic {
                    ip: s.address,
                    prefix: Some(s.prefix),
                    gateway: s.gateway,
                }),
                None => SacNic::Dhcp,
            })
            .collect()
    })
}

impl PodTask {
    /// Start the serial-console pass: its total deadline starts now, and
    /// the pass holds no turn among the pods worked on at once (a console
    /// may take up to the deadline; nothing after the pass needs a turn:
    /// its failure record, `PostCloneSucceeded`, the IP wait and the final
    /// write hold none). Then: is the pod still ours?
    pub(super) fn sac_start(&mut self, mut pass: SacPass) -> Action {
        pass.until = self.now + self.settings.sac_deadline;
        self.release();
        self.stage = Stage::SacCheck(Box::new(pass));
        Action::Read
    }

    /// The pod is still ours: open the console, or set the next address,
    /// each bounded by what is left of the pass's deadline; past it, the
    /// step about to start fails.
    pub(super) fn sac_step(&mut self, pass: Box<SacPass>) -> Action {
        let (until, total) = (pass.until, self.settings.sac_deadline);
        match &pass.nets {
            None if self.now >= until => {
                let step = fixup_sac::Step::Dial;
                self.sac_error(*pass, SacError::Deadline { step, total })
            }
            None => {
                let (vm, need) = (pass.vm.clone(), pass.nics.len());
                self.stage = Stage::SacOpening(pass);
                Action::SacOpen {
                    vm,
                    need,
                    until,
                    total,
                }
            }
            Some(nets) => {
                let i = pass.next;
                let (Some(&net), Some(&SacNic::Static(nic))) = (nets.get(i), pass.nics.get(i))
                else {
                    unreachable!("sac_next stops at a static NIC with an interface");
                };
                if self.now >= until {
                    let step = fixup_sac::Step::Set { net };
                    return self.sac_error(*pass, SacError::Deadline { step, total });
                }
                self.stage = Stage::SacSetting(pass);
                Action::SacSet {
                    net,
                    nic,
                    until,
                    total,
                }
            }
        }
    }

    /// The next static NIC, checked for first; the pass is over after the
    /// last.
    pub(super) fn sac_next(&mut self, mut pass: Box<SacPass>) -> Action {
        let nets = pass.nets.as_ref().map_or(0, Vec::len);
        while pass.next < pass.nics.len() && !matches!(pass.nics[pass.next], SacNic::Static(_)) {
            pass.next += 1;
        }
        if pass.next >= pass.nics.len() {
            return self.sac_over(pass.then, SacEnd::Set);
        }
        if pass.next >= nets {
            // The console listed fewer interfaces than it said: as if the
            // listing had come up short.
            let error = SacError::EnumExhausted {
                found: nets,
                need: pass.nics.len(),
            };
            return self.sac_error(*pass, error);
        }
        self.stage = Stage::SacCheck(pass);
        Action::Read
    }

    /// A step of the pass failed: its own event, then the failure record;
    /// a console path the host will not use is the node's fault; a stop
    /// is a shutdown.
    pub(super) fn sac_error(&mut self, pass: SacPass, error: SacError) -> Action {
        if error == SacError::Stopped {
            return self.sac_over(pass.then, SacEnd::Shutdown);
        }
        self.queue.push_back(Action::SacClose);
        if let (Some(reason), Some(message)) = (error.event_reason(), error.event_message()) {
            self.tell(Event::warning(reason, message));
            let line = error.to_string();
            self.note(Note::Warn(format!("serial-console pass failed: {line}")));
            self.stage = Stage::ReadingFor(Write::SacFailed { vm: pass.vm, line });
            return Action::Read;
        }
        let pod = self.summary.pod.clone();
        self.node_error(NodeError::Console { pod, source: error })
    }

    /// The pass ended short of a failure: every address set (then what
    /// comes after it), or the pod gone or the host shutting down (nothing
    /// is written; resumed work runs the pass again).
    pub(super) fn sac_over(&mut self, then: AfterSac, end: SacEnd) -> Action {
        // Closing a console that was never opened does nothing.
        self.queue.push_back(Action::SacClose);
        if end != SacEnd::Set {
            return self.sac_end(end);
        }
        self.note(Note::Sac(end));
        self.summary.sac = Some(end);
        match then {
            // The turn was given back when the pass started.
            AfterSac::Succeeded(fixup) => self.succeeded(fixup, None),
            AfterSac::Wait(wait) => self.wait(wait),
        }
    }

    /// The task ends with the pass.
    pub(super) fn sac_end(&mut self, end: SacEnd) -> Action {
        self.note(Note::Sac(end));
        self.summary.sac = Some(end);
        self.finish()
    }
}
