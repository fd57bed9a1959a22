//! An in-process `Cocoon` for the clone storm and the readiness runs.
//!
//! `inspect` parses the VM's inspect JSON each time, as the real runner
//! parses the CLI's output; `exec` answers after [`BenchCocoon::delay`]
//! (a `tokio::time` sleep, so no thread is held) and fails the first attempt
//! of every VM whose index is a multiple of `fail_first_every`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use fixup_core::facts::{VmId, VmInspect};
use fixup_host::cocoon::{Cocoon, CocoonError, ExecOutput, ExitStatusKind};

/// One VM the runner knows.
#[derive(Debug)]
struct Vm {
    inspect_json: String,
    fail_first: bool,
    attempts: AtomicU32,
}

/// The stand-in for the `cocoon` CLI.
#[derive(Debug, Clone)]
pub struct BenchCocoon {
    vms: Arc<HashMap<String, Vm>>,
    delay: Duration,
}

/// What a failed first attempt prints on stderr.
const FAILED_STDERR: &str = "networkctl: link busy\n";

/// Builds a [`BenchCocoon`].
#[derive(Debug, Default)]
pub struct BenchCocoonBuilder {
    vms: HashMap<String, Vm>,
}

impl BenchCocoonBuilder {
    /// A VM with this id answers inspect with `inspect_json` (its record,
    /// the source image included), and fails its first exec when
    /// `fail_first`.
    pub fn vm(&mut self, id: String, inspect_json: String, fail_first: bool) -> &mut Self {
        self.vms.insert(
            id,
            Vm {
                inspect_json,
                fail_first,
                attempts: AtomicU32::new(0),
            },
        );
        self
    }

    /// Every exec answers after `delay`.
    pub fn build(self, delay: Duration) -> BenchCocoon {
        BenchCocoon {
            vms: Arc::new(self.vms),
            delay,
        }
    }
}

impl BenchCocoon {
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// Execs run so far, over every VM.
    pub fn attempts(&self) -> u64 {
        self.vms
            .values()
            .map(|vm| u64::from(vm.attempts.load(Ordering::Relaxed)))
            .sum()
    }

    fn vm(&self, id: &VmId) -> Result<&Vm, CocoonError> {
        self.vms
            .get(id.as_str())
            .ok_or_else(|| CocoonError::Failed {
                what: format!("cocoon vm inspect {id}"),
                status: ExitStatusKind::Code(1),
                stderr_tail: fixup_core::plan::StderrTail::new(b"no such VM"),
            })
    }
}

impl Cocoon for BenchCocoon {
    async fn exec(
        &self,
        vm: &VmId,
        argv: &[String],
        timeout: Duration,
    ) -> Result<ExecOutput, CocoonError> {
        let entry = self.vm(vm)?;
        let attempt = entry.attempts.fetch_add(1, Ordering::Relaxed) + 1;
        if self.delay > timeout {
            tokio::time::sleep(timeout).await;
            return Err(CocoonError::Timeout {
                what: format!("cocoon vm exec {vm}"),
                after: timeout,
            });
        }
        tokio::time::sleep(self.delay).await;
        let (status, stderr) = if entry.fail_first && attempt == 1 {
            (ExitStatusKind::Code(1), FAILED_STDERR.as_bytes().to_vec())
        } else {
            // A guest that ran the whole script ends with the done marker,
            // under the nonce of this exec's argv (a plan run directly has
            // none and needs no marker).
            let done = match fixup_core::plan::exec_nonce(argv) {
                Some(nonce) => format!("\n{}\n", fixup_core::plan::done_marker(&nonce)),
                None => String::new(),
            };
            (ExitStatusKind::Code(0), done.into_bytes())
        };
        Ok(ExecOutput {
            status,
            stdout: Vec::new(),
            stderr,
            stderr_cut: false,
        })
    }

    async fn inspect(&self, vm: &VmId, _timeout: Duration) -> Result<VmInspect, CocoonError> {
        let entry = self.vm(vm)?;
        VmInspect::from_json(&entry.inspect_json, "cocoon vm inspect").map_err(|e| {
            CocoonError::BadOutput {
                what: format!("cocoon vm inspect {vm}"),
                reason: e.to_string(),
            }
        })
    }
}
