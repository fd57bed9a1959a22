//! The binary's log output: what `COCOON_FIXUP_LOG` selects, and whether
//! stderr gets colour.
//!
//! A bare level (`debug`, `trace`, `info`, ...) is meant for this
//! program: it applies to the host's own targets ([`HOST_TARGETS`], which
//! include the lines plugins log through the `log` import), while the
//! dependencies (wasmtime, cranelift, kube, hyper, ...) stay at `warn`, or
//! at the level asked for when that is quieter. Anything else (a directive
//! with `=` or `,`, such as `debug,wasmtime=trace` or `cranelift=debug`)
//! is a `tracing` filter taken as written, which is how to widen it.

use std::ffi::OsStr;

use tracing_subscriber::EnvFilter;

/// The variable that sets the log filter.
pub const LOG_VAR: &str = "COCOON_FIXUP_LOG";

/// The filter without [`LOG_VAR`]: warnings and errors from everyone.
pub const DEFAULT_LEVEL: &str = "warn";

/// The `tracing` targets of this program's own lines: the plan path (which
/// logs plugins' `log` calls under `fixup_core::plugin::sandbox`), the
/// apply path and daemon, and the binary.
pub const HOST_TARGETS: &[&str] = &["fixup_core", "fixup_host", "cocoon_fixup"];

/// The levels a bare value may name, quietest first.
const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// A value of [`LOG_VAR`] that is neither a level nor a filter.
#[derive(Debug, thiserror::Error)]
#[error(
    "{LOG_VAR}={value:?} is not a log filter ({reason}); logging at `{DEFAULT_LEVEL}`: write a level such as `debug`, or a filter such as `debug,wasmtime=info`"
)]
pub struct LogFilterError {
    value: String,
    reason: String,
}

/// The filter directives for a value of [`LOG_VAR`] (`None`, or only
/// spaces, is [`DEFAULT_LEVEL`]). A bare level becomes one directive per
/// host target at that level, after a default for everyone else of `warn`
/// or the level itself, whichever is quieter; any other value is returned
/// as written.
pub fn directives(value: Option<&str>) -> String {
    // A trailing comma (`debug,`) is a typo for the bare level, not a
    // filter that turns every library's lines on.
    let value = value
        .map(|v| v.trim().trim_end_matches(',').trim())
        .filter(|v| !v.is_empty());
    let Some(value) = value else {
        return DEFAULT_LEVEL.to_owned();
    };
    let Some(rank) = LEVELS.iter().position(|l| l.eq_ignore_ascii_case(value)) else {
        return value.to_owned();
    };
    let warn = LEVELS.iter().position(|l| *l == "warn").unwrap_or(rank);
    let level = LEVELS[rank];
    let others = LEVELS[rank.min(warn)];
    let mut out = others.to_owned();
    for target in HOST_TARGETS {
        out.push_str(&format!(",{target}={level}"));
    }
    out
}

/// The filter for a value of [`LOG_VAR`] ([`directives`]), or, for a value
/// that does not parse, the default filter and the error to tell the user.
pub fn filter(value: Option<&str>) -> (EnvFilter, Option<LogFilterError>) {
    let directives = directives(value);
    match EnvFilter::builder().parse(&directives) {
        Ok(filter) => (filter, None),
        Err(e) => (
            EnvFilter::new(DEFAULT_LEVEL),
            Some(LogFilterError {
                value: value.unwrap_or_default().to_owned(),
                reason: e.to_string(),
            }),
        ),
    }
}

/// Whether log lines on stderr get colour: only on a terminal, and not
/// when `NO_COLOR` is set to anything but the empty string.
pub fn colour(stderr_is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// Install the binary's subscriber: the filter of [`LOG_VAR`], lines on
/// stderr, colour as [`colour`] decides. A value that does not parse is
/// reported on stderr once, and the default used.
pub fn init() {
    use std::io::IsTerminal as _;
    let value = std::env::var(LOG_VAR).ok();
    let (filter, error) = filter(value.as_deref());
    let ansi = colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .init();
    if let Some(e) = error {
        tracing::warn!("{e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_bare_level_is_scoped_to_the_host() {
        assert_eq!(
            directives(Some("debug")),
            "warn,fixup_core=debug,fixup_host=debug,cocoon_fixup=debug"
        );
        assert_eq!(
            directives(Some(" TRACE ")),
            "warn,fixup_core=trace,fixup_host=trace,cocoon_fixup=trace"
        );
        assert_eq!(
            directives(Some("debug,")),
            "warn,fixup_core=debug,fixup_host=debug,cocoon_fixup=debug",
            "a trailing comma is the bare level"
        );
        // Quieter than warn: everyone at that level.
        assert_eq!(
            directives(Some("error")),
            "error,fixup_core=error,fixup_host=error,cocoon_fixup=error"
        );
        assert_eq!(
            directives(Some("off")),
            "off,fixup_core=off,fixup_host=off,cocoon_fixup=off"
        );
    }

    #[test]
    fn a_filter_is_taken_as_written_and_nothing_is_warn() {
        for value in ["debug,wasmtime=trace", "cranelift=debug", "fixup_core=info"] {
            assert_eq!(directives(Some(value)), value);
        }
        assert_eq!(directives(None), "warn");
        assert_eq!(directives(Some("  ")), "warn");
    }

    #[test]
    fn a_bad_value_falls_back_and_says_how_to_write_one() {
        let (_, error) = filter(Some("debug,wasmtime=loud"));
        let error = error.expect("an unknown level is refused").to_string();
        assert!(error.contains("COCOON_FIXUP_LOG"), "{error}");
        assert!(error.contains("wasmtime=loud"), "{error}");
        assert!(error.contains("debug,wasmtime=info"), "{error}");
        assert!(filter(Some("debug")).1.is_none());
    }

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// One debug line from each target, in the order of [`TARGETS`].
    macro_rules! from_each {
        ($($target:literal),*) => {
            const TARGETS: &[&str] = &[$($target),*];
            fn emit() {
                $(tracing::debug!(target: $target, "from {}", $target);)*
            }
        };
    }
    from_each!(
        "fixup_core::plugin::sandbox",
        "fixup_host::serve",
        "cocoon_fixup",
        "wasmtime::runtime",
        "cranelift_codegen"
    );

    /// What a subscriber with the filter of `value` writes for [`emit`].
    fn logged(value: &str) -> String {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter(Some(value)).0)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = lines.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn debug_shows_the_host_and_plugins_but_not_the_compiler() {
        let out = logged("debug");
        for target in &TARGETS[..3] {
            assert!(out.contains(&format!("from {target}")), "{out}");
        }
        assert!(!out.contains("wasmtime"), "{out}");
        assert!(!out.contains("cranelift"), "{out}");
    }

    #[test]
    fn a_written_filter_widens_to_a_dependency() {
        let out = logged("debug,wasmtime=debug");
        assert!(out.contains("from wasmtime::runtime"), "{out}");
        assert!(
            out.contains("from cranelift_codegen"),
            "everyone at debug: {out}"
        );
        let out = logged("warn,cranelift_codegen=debug");
        assert!(out.contains("from cranelift_codegen"), "{out}");
        assert!(!out.contains("from fixup_core"), "{out}");
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(
            colour(true, Some(OsStr::new(""))),
            "an empty NO_COLOR is unset"
        );
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
    }
}
