//! The deadline clock of a process that makes a few plugin calls and exits
//! (`plan`, `capture`): an interval timer armed for each call, instead of
//! a ticker thread for the engine's life.
//!
//! A call's wall-clock deadline is wasmtime's epoch interruption: compiled
//! code checks the engine's epoch and traps once it passes the Store's
//! deadline. A daemon advances the epoch from a thread ([`super::EPOCH_TICK`]),
//! which a one-shot command pays for in full (creating it, and tearing
//! down a second thread at exit) for a call that lasts a fraction of a
//! tick. Here the call's deadline is one epoch away, and `ITIMER_REAL` is
//! armed for the deadline itself: when it expires, `SIGALRM`'s handler
//! advances the epoch (one atomic add, safe in a signal handler) and the
//! plugin traps at its next check, exactly as with the ticker. The timer
//! is disarmed when the call returns, so a call that keeps its deadline
//! never sees a signal.
//!
//! One engine per process owns the alarm ([`Alarm::claim`]): the handler
//! advances that engine's epoch, and its calls are made one at a time.
//! Every other engine falls back to the ticker thread. The process must
//! not use `SIGALRM` or `ITIMER_REAL` for anything else, which is why only
//! the one-shot allocation ([`super::Allocation::OnDemand`]) asks for it.

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use wasmtime::Engine;

/// The engine whose epoch `SIGALRM` advances. Set once; never cleared,
/// because a handler may run at any moment and must find it.
static ENGINE: OnceLock<Engine> = OnceLock::new();

/// The process's alarm, owned by one engine.
pub(super) struct Alarm {
    /// Held for the length of a call: `ITIMER_REAL` is one per process.
    calls: Mutex<()>,
}

/// A call's armed timer: disarmed when dropped.
pub(super) struct Armed<'a> {
    _call: MutexGuard<'a, ()>,
}

impl Alarm {
    /// The alarm for `engine`, if this process has not given it to another
    /// engine and the handler could be installed; `None` means: use the
    /// ticker thread.
    pub(super) fn claim(engine: &Engine) -> Option<Alarm> {
        ENGINE.set(engine.clone()).ok()?;
        #[allow(unsafe_code)]
        // SAFETY: `on_alarm` only reads a set `OnceLock` and makes one
        // atomic add, both safe in a signal handler. `SA_RESTART` keeps
        // interrupted system calls from failing with EINTR; `SA_ONSTACK`
        // runs the handler on the thread's signal stack (wasmtime gives
        // every thread that runs a plugin one), not on a plugin's stack.
        let installed = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_alarm as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGALRM, &action, std::ptr::null_mut()) == 0
        };
        if !installed {
            tracing::debug!(
                "no SIGALRM handler ({}); plugin deadlines use the ticker thread",
                std::io::Error::last_os_error()
            );
            return None;
        }
        Some(Alarm {
            calls: Mutex::new(()),
        })
    }

    /// Arm the timer for one call whose deadline is `after` from now and
    /// whose Store's epoch deadline is one epoch away.
    pub(super) fn arm(&self, after: Duration) -> std::io::Result<Armed<'_>> {
        let call = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        // A zero value would disarm the timer and leave the call unbounded.
        set_timer(after.max(Duration::from_micros(1)))?;
        Ok(Armed { _call: call })
    }
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        if let Err(e) = set_timer(Duration::ZERO) {
            tracing::warn!("disarming the plugin call's deadline timer: {e}");
        }
    }
}

/// `ITIMER_REAL` to expire once, `after` from now (zero: disarmed).
fn set_timer(after: Duration) -> std::io::Result<()> {
    let value = libc::timeval {
        tv_sec: libc::time_t::try_from(after.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_usec: libc::suseconds_t::from(after.subsec_micros()),
    };
    let timer = libc::itimerval {
        it_interval: libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        it_value: value,
    };
    #[allow(unsafe_code)]
    // SAFETY: `timer` is a valid itimerval; the old value is not asked for.
    let set = unsafe { libc::setitimer(libc::ITIMER_REAL, &timer, std::ptr::null_mut()) };
    if set == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

extern "C" fn on_alarm(_: libc::c_int) {
    if let Some(engine) = ENGINE.get() {
        engine.increment_epoch();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::{Config, Instance, Module, Store, Trap};

    /// `(module (func (export "spin") (loop (br 0))))`
    const SPIN: &[u8] = &[
        0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
        0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // type: () -> ()
        0x03, 0x02, 0x01, 0x00, // one function of that type
        0x07, 0x08, 0x01, 0x04, b's', b'p', b'i', b'n', 0x00, 0x00, // export "spin"
        0x0a, 0x09, 0x01, 0x07, 0x00, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x0b, // loop { br 0 }
    ];

    /// Enough fuel to spin for seconds: a spin that ends on fuel was not
    /// stopped by the alarm.
    const FUEL: u64 = 20_000_000_000;

    /// The outcome of spinning with the deadline one epoch away.
    fn spin(engine: &Engine, module: &Module, fuel: u64) -> Trap {
        let mut store = Store::new(engine, ());
        store.set_fuel(fuel).expect("fuel");
        store.set_epoch_deadline(1);
        store.epoch_deadline_trap();
        let instance = Instance::new(&mut store, module, &[]).expect("instance");
        let spin = instance
            .get_typed_func::<(), ()>(&mut store, "spin")
            .expect("spin");
        let err = spin.call(&mut store, ()).expect_err("a spin never returns");
        *err.downcast_ref::<Trap>().expect("a trap")
    }

    /// The one test that claims this test binary's alarm (a second claim
    /// would find it taken): an armed alarm stops a call at its deadline,
    /// and a disarmed one never advances the epoch.
    #[test]
    fn an_armed_alarm_stops_a_call_and_a_disarmed_one_never_fires() {
        let mut config = Config::new();
        config.consume_fuel(true).epoch_interruption(true);
        let engine = Engine::new(&config).expect("engine");
        let module = Module::new(&engine, SPIN).expect("module");
        let alarm = Alarm::claim(&engine).expect("the alarm of this test binary");
        assert!(
            Alarm::claim(&engine).is_none(),
            "the process's alarm is given once"
        );

        let armed = alarm.arm(Duration::from_millis(20)).expect("armed");
        assert_eq!(spin(&engine, &module, FUEL), Trap::Interrupt);
        drop(armed);

        // Armed and disarmed well before it was due: the epoch stays, so a
        // spin with nothing armed ends on fuel, not on an interrupt.
        drop(alarm.arm(Duration::from_millis(20)).expect("armed"));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(spin(&engine, &module, 1_000_000), Trap::OutOfFuel);
    }
}
