//! The deadline clock of a process that makes a few plugin calls and exits
//! (`plan`, `capture`): an interval timer armed for each call, instead of
//! a ticker thread for the engine's life.
//!
//! A call's wall-clock deadline is wasmtime's epoch interruption: compiled
//! code checks the engine's epoch and traps once it passes the Store's
//! deadline. A daemon advances the epoch from a thread ([`super::EPOCH_TICK`]),
//! which a one-shot command pays for in full (creating it, and tearing
//! down a second thread at exit) for a call that lasts a fraction of a
//! tick. Here the Store's deadline is one epoch away, and only then is
//! `ITIMER_REAL` armed for the call's deadline: when it expires, the
//! `SIGALRM` handler advances the epoch (one atomic add, safe in a signal
//! handler) and the plugin traps at its next check, as with the ticker.
//! The timer is disarmed when the call returns.
//!
//! The handler advances the epoch only for the kernel's timer signal and
//! only once the armed call's deadline has passed (its own clock reading),
//! so a timer signal left over from an earlier call does nothing (a call's
//! turn ends only when no handler is between that reading and its
//! increment). A `SIGALRM` someone sends (`kill`, `timeout -s ALRM`) does
//! what it did before the host took the signal: the default action, which
//! ends the process. (A kernel that cannot allocate the timer signal's
//! information sends it as `SI_USER`: the process then ends too, which
//! fails closed.)
//!
//! One engine per process owns the alarm ([`Alarm::claim`]), and only when
//! `SIGALRM` still has its default action and no `ITIMER_REAL` is running
//! (a wrapper's `alarm` keeps working); its calls are made one at a time.
//! A call on a thread that blocks `SIGALRM`, or after other code has
//! installed its own `SIGALRM` action, is kept by the ticker thread
//! instead, and so is every call after it (a running ticker would advance
//! an alarm call's one-epoch deadline). Every other engine uses the ticker.
//! The process must not otherwise use `SIGALRM` or `ITIMER_REAL`: a call
//! arms and disarms the one interval timer.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use wasmtime::Engine;

/// The engine whose epoch the timer advances. Set once; never cleared,
/// because a handler may run at any moment and must find it.
static ENGINE: OnceLock<Engine> = OnceLock::new();

/// When the armed call's deadline passes (`CLOCK_MONOTONIC`, nanoseconds);
/// zero when no call is armed.
static DUE: AtomicU64 = AtomicU64::new(0);

/// Handlers between reading [`DUE`] and advancing the epoch: a turn ends
/// only when none is, so a late handler cannot advance the epoch under the
/// next call's deadline.
static IN_HANDLER: AtomicU32 = AtomicU32::new(0);

/// The process's alarm, owned by one engine.
pub(super) struct Alarm {
    /// Held for the length of a call: `ITIMER_REAL` is one per process.
    calls: Mutex<()>,
}

/// One call's turn at the alarm: armed by [`Turn::arm`] once the Store's
/// deadline is set, disarmed when dropped.
pub(super) struct Turn<'a> {
    armed: bool,
    _call: MutexGuard<'a, ()>,
}

impl Alarm {
    /// The alarm for `engine`: `None` (use the ticker thread) when the
    /// process gave it to another engine, `SIGALRM` has a handler or is
    /// ignored, an interval timer is running or cannot be set, or the
    /// handler could not be installed.
    pub(super) fn claim(engine: &Engine) -> Option<Alarm> {
        // Disarming an idle timer changes nothing, and shows that the
        // timer may be set here (a seccomp filter may refuse setitimer).
        if let Some(why) = taken().or_else(|| {
            set_timer(Duration::ZERO)
                .err()
                .map(|e| format!("ITIMER_REAL cannot be set: {e}"))
        }) {
            tracing::debug!("plugin call deadlines use the ticker thread: {why}");
            return None;
        }
        ENGINE.set(engine.clone()).ok()?;
        #[allow(unsafe_code)]
        // SAFETY: `on_alarm` reads a set `OnceLock`, an atomic and the
        // monotonic clock and makes one atomic add, or restores the
        // default action and re-raises: all safe in a signal handler.
        // `SA_RESTART` restarts the system calls that can be restarted
        // (signal(7) lists those that fail with EINTR regardless);
        // `SA_ONSTACK` runs the handler on the signal stack of whichever
        // thread receives it (wasmtime gives one to every thread that
        // runs a plugin), not on a plugin's stack.
        let installed = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            let mut old: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler();
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGALRM, &action, &mut old) != 0 {
                Err(std::io::Error::last_os_error().to_string())
            } else if old.sa_sigaction != libc::SIG_DFL {
                // Another thread installed one since `taken` looked: its.
                libc::sigaction(libc::SIGALRM, &old, std::ptr::null_mut());
                Err("SIGALRM got another handler meanwhile".to_owned())
            } else {
                Ok(())
            }
        };
        if let Err(why) = installed {
            tracing::debug!("plugin call deadlines use the ticker thread: {why}");
            return None;
        }
        tracing::debug!("plugin call deadlines are kept by an interval timer (SIGALRM)");
        Some(Alarm {
            calls: Mutex::new(()),
        })
    }

    /// Wait for the alarm to be free and take it for one call; not armed
    /// yet.
    pub(super) fn turn(&self) -> Turn<'_> {
        Turn {
            armed: false,
            _call: self.calls.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }
}

impl Turn<'_> {
    /// Arm the timer for a deadline `after` from now. Call it once the
    /// Store's epoch deadline is set (one epoch away): a timer that
    /// expired before would advance the epoch the deadline then counts
    /// from, and the call would run unbounded.
    pub(super) fn arm(&mut self, after: Duration) -> std::io::Result<()> {
        // Whole microseconds, rounded up, as the timer takes them (so it
        // never expires before `DUE`, and the handler never finds its one
        // signal early), and at least one: zero would disarm it.
        let micros = u64::try_from(after.as_nanos().div_ceil(1_000))
            .unwrap_or(u64::MAX)
            .max(1);
        let after = Duration::from_micros(micros);
        let due =
            monotonic_ns().saturating_add(u64::try_from(after.as_nanos()).unwrap_or(u64::MAX));
        DUE.store(due, Ordering::SeqCst);
        self.armed = true;
        set_timer(after)
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        DUE.store(0, Ordering::SeqCst);
        if let Err(e) = set_timer(Duration::ZERO) {
            tracing::warn!("disarming the plugin call's deadline timer: {e}");
        }
        // A handler that read this call's `DUE` finishes its increment
        // before the next call can set its deadline. (A handler never
        // waits, so one on this very thread has finished already.)
        while IN_HANDLER.load(Ordering::SeqCst) != 0 {
            std::hint::spin_loop();
        }
    }
}

/// Whether a call on this thread can use the alarm: the thread can receive
/// `SIGALRM` (an inherited signal mask may block it) and the handler is
/// still this module's (other code may have installed its own since).
pub(super) fn usable() -> bool {
    #[allow(unsafe_code)]
    // SAFETY: only reads, into a zeroed structure of the right type.
    let ours = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGALRM, std::ptr::null(), &mut action) == 0
            && action.sa_sigaction == handler()
    };
    ours && unblocked()
}

/// [`on_alarm`] as `sigaction` takes it.
fn handler() -> libc::sighandler_t {
    on_alarm as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
        as libc::sighandler_t
}

/// Whether the calling thread can receive `SIGALRM`.
fn unblocked() -> bool {
    #[allow(unsafe_code)]
    // SAFETY: asks for the calling thread's mask only; `mask` is written.
    unsafe {
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut mask) == 0
            && libc::sigismember(&mask, libc::SIGALRM) == 0
    }
}

/// Why the process's alarm is not free to take, if it is not.
fn taken() -> Option<String> {
    #[allow(unsafe_code)]
    // SAFETY: both calls only read: the current action and timer are
    // written into zeroed structures of the right types.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGALRM, std::ptr::null(), &mut action) != 0 {
            return Some(format!("SIGALRM: {}", std::io::Error::last_os_error()));
        }
        if action.sa_sigaction != libc::SIG_DFL {
            return Some("SIGALRM already has a handler or is ignored".to_owned());
        }
        let mut timer: libc::itimerval = std::mem::zeroed();
        if libc::getitimer(libc::ITIMER_REAL, &mut timer) != 0 {
            return Some(format!("ITIMER_REAL: {}", std::io::Error::last_os_error()));
        }
        if timer.it_value.tv_sec != 0 || timer.it_value.tv_usec != 0 {
            return Some("an ITIMER_REAL timer is already running".to_owned());
        }
    }
    None
}

/// `ITIMER_REAL` to expire once, `after` from now (zero: disarmed).
fn set_timer(after: Duration) -> std::io::Result<()> {
    #[allow(clippy::unnecessary_fallible_conversions)]
    // `suseconds_t` is 32 bits on some targets.
    let value = libc::timeval {
        tv_sec: libc::time_t::try_from(after.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_usec: libc::suseconds_t::try_from(after.subsec_micros()).unwrap_or(0),
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

/// `CLOCK_MONOTONIC` in nanoseconds (the clock `ITIMER_REAL` runs on).
fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    #[allow(unsafe_code)]
    // SAFETY: `now` is a valid timespec; clock_gettime is async-signal-safe.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now);
    }
    u64::try_from(now.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(now.tv_nsec).unwrap_or(0))
}

extern "C" fn on_alarm(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    #[allow(unsafe_code)]
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let code = unsafe { (*info).si_code };
    if code != libc::SI_KERNEL {
        // Sent by someone, not the timer: what SIGALRM did before.
        #[allow(unsafe_code)]
        // SAFETY: signal and raise are async-signal-safe; the raised
        // signal is delivered when this handler returns.
        unsafe {
            libc::signal(libc::SIGALRM, libc::SIG_DFL);
            libc::raise(libc::SIGALRM);
        }
        return;
    }
    IN_HANDLER.fetch_add(1, Ordering::SeqCst);
    let due = DUE.load(Ordering::SeqCst);
    if due != 0
        && monotonic_ns() >= due
        && let Some(engine) = ENGINE.get()
    {
        engine.increment_epoch();
    }
    IN_HANDLER.fetch_sub(1, Ordering::SeqCst);
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

    /// A Store with `fuel` and the epoch deadline one epoch away.
    fn store(engine: &Engine, fuel: u64) -> Store<()> {
        let mut store = Store::new(engine, ());
        store.set_fuel(fuel).expect("fuel");
        store.set_epoch_deadline(1);
        store.epoch_deadline_trap();
        store
    }

    /// How a spin in `store` ends.
    fn spin(store: &mut Store<()>, module: &Module) -> Trap {
        let instance = Instance::new(&mut *store, module, &[]).expect("instance");
        let spin = instance
            .get_typed_func::<(), ()>(&mut *store, "spin")
            .expect("spin");
        let err = spin
            .call(&mut *store, ())
            .expect_err("a spin never returns");
        *err.downcast_ref::<Trap>().expect("a trap")
    }

    /// The one test that claims this test binary's alarm (no other unit
    /// test builds an on-demand host): an armed alarm stops a call at its
    /// deadline and not before; the timer's signal before the armed
    /// deadline, or with nothing armed, does nothing; a disarmed alarm
    /// never advances the epoch.
    #[test]
    fn an_armed_alarm_stops_a_call_and_a_disarmed_one_never_fires() {
        let mut config = Config::new();
        config.consume_fuel(true).epoch_interruption(true);
        let engine = Engine::new(&config).expect("engine");
        let module = Module::new(&engine, SPIN).expect("module");
        assert!(unblocked(), "the test thread can receive SIGALRM");
        let alarm = Alarm::claim(&engine).expect("the alarm of this test binary");
        assert!(
            Alarm::claim(&engine).is_none(),
            "the process's alarm is given once"
        );
        assert!(usable(), "the handler is the alarm's");

        let mut stopped = store(&engine, FUEL);
        let started = std::time::Instant::now();
        let mut turn = alarm.turn();
        turn.arm(Duration::from_millis(20)).expect("armed");
        assert_eq!(spin(&mut stopped, &module), Trap::Interrupt);
        assert!(
            started.elapsed() >= Duration::from_millis(20),
            "stopped at its deadline, not before"
        );
        drop(turn);

        // Each Store's deadline is set before the timer's signal comes: an
        // epoch advanced by it would stop the spin at once; the spin ends
        // on fuel instead.
        let signal_in = |due: u64| {
            let mut untouched = store(&engine, 1_000_000);
            DUE.store(due, Ordering::SeqCst);
            set_timer(Duration::from_millis(1)).expect("timer");
            std::thread::sleep(Duration::from_millis(30));
            DUE.store(0, Ordering::SeqCst);
            spin(&mut untouched, &module)
        };
        let later = monotonic_ns() + 10_000_000_000;
        assert_eq!(signal_in(later), Trap::OutOfFuel, "before the deadline");
        assert_eq!(signal_in(0), Trap::OutOfFuel, "nothing armed");

        let mut untouched = store(&engine, 1_000_000);
        let mut turn = alarm.turn();
        turn.arm(Duration::from_millis(20)).expect("armed");
        drop(turn);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(spin(&mut untouched, &module), Trap::OutOfFuel, "disarmed");
    }
}
