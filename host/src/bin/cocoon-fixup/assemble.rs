//! Putting a host together from the settings: the planners of the one-shot
//! commands and of the daemon, the pinned plugins, the host of `run` and
//! `serve`, and what a reload builds.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};

use crate::runtime;
use fixup_core::display;
use fixup_core::memory::MemoryStore;
use fixup_core::planner::Planner;
use fixup_core::plugin::Allocation;
use fixup_host::cocoon::CocoonCli;
use fixup_host::config::{ConfigArgs, Resolved};
use fixup_host::host::Host;
use fixup_host::kube::KubeApi;
use fixup_host::metrics::Metrics;
use fixup_host::ready::LeaseWatcher;
use fixup_host::reload::{self};

/// The store's files of the configured plugin references, pulled first
/// where missing (an error names the reference).
pub(crate) async fn pinned_files(settings: &Resolved) -> Result<Vec<PathBuf>> {
    tokio::time::timeout(PULL_TIMEOUT, settings.pinned.files())
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "pulling the plugins pinned in the configuration took longer than {PULL_TIMEOUT:?}: check the registry, or seed the store with `plugin pull`"
            )
        })?
        .context("getting the plugins pinned in the configuration")
}

/// A plugin file that failed to load, for messages: its path, and for a
/// store file the reference the configuration pins it by (whose entry in
/// `plugins` is what to fix or remove).
pub(crate) fn failed_file(path: &Path, settings: &Resolved, pinned: &[PathBuf]) -> String {
    match pinned.iter().position(|p| p == path) {
        Some(i) => format!(
            "{} (pinned as {} in `plugins`)",
            path.display(),
            settings.pinned.references[i]
        ),
        None => path.display().to_string(),
    }
}

/// The planner for `plan` and `capture`: a plugin file that does not load
/// is an error, so a vendor sees it before a node does. A one-shot
/// process makes a few plugin calls and exits, so its engine sets up no
/// instance pool ([`Allocation::OnDemand`]: the same limits, the same
/// plans, the same cache entries).
pub(crate) fn planner(settings: &Resolved) -> Result<Planner> {
    let pinned = if settings.pinned.references.is_empty() {
        Vec::new()
    } else {
        runtime()?.block_on(pinned_files(settings))?
    };
    let (planner, failures) =
        Planner::with_allocation(settings.planner.clone(), &pinned, Allocation::OnDemand)
            .context("starting the plugin host")?;
    if !failures.is_empty() {
        for f in &failures {
            eprintln!(
                "{}",
                display::terminal_text(&format!(
                    "error: {}",
                    f.text(&failed_file(&f.path, settings, &pinned))
                ))
            );
        }
        bail!(
            "{} plugin(s) could not be loaded: fix or remove them",
            failures.len()
        );
    }
    Ok(planner)
}

/// The planner for `run` and `serve`: a plugin file that does not load is
/// reported (log, metric) and the others serve; only pods whose scenario
/// and flavour then have no plugin fail, with a message naming the files.
/// A daemon (`serve`) links every plugin at start (`warm`), so a plugin
/// whose code the cache cannot give back is reported now and its first
/// clone pays nothing extra; `run` loads only what its pod needs.
pub(crate) fn node_planner(
    settings: &Resolved,
    pinned: &[PathBuf],
    metrics: &Metrics,
    warm: bool,
) -> Result<Planner> {
    let (planner, failures) = Planner::with_files(settings.planner.clone(), pinned)
        .context("starting the plugin host")?;
    for f in &failures {
        tracing::error!(
            plugin = %failed_file(&f.path, settings, pinned),
            "plugin not loaded: {}; the other plugins serve, see `cocoon-fixup plugin inspect {}`",
            f.error,
            f.path.display()
        );
    }
    let mut failed = failures.len();
    if warm {
        for e in planner.plugins().warm() {
            tracing::error!("{e}; the pods that need this plugin wait with a node error");
            failed += 1;
        }
    }
    metrics.plugin_load_failures(failed);
    if settings.host.binding.accept_legacy_names {
        tracing::warn!(
            "--accept-legacy-vm-names is on: a VM named vk-<namespace>-<pod> binds to that pod, and the form is ambiguous across namespaces with dashes in their names (vk-a-b-c is a/b-c and a-b/c); turn it off once the legacy VMs are gone"
        );
    }
    if settings.host.binding.accept_annotated_names {
        tracing::warn!(
            "--accept-annotated-vm-names is on: a VM named by its pod's vm.cocoonstack.io/name annotation binds to that pod when no other pod on the node claims the name; this trusts the annotation, which is safe only where the admission policy (deploy/admission-policy.yaml) is installed; turn it off once the retired cocoon-webhook's VMs are gone"
        );
    }
    Ok(planner)
}

/// Everything `run` and `serve` share: planner, cocoon, Kubernetes, leases.
pub(crate) async fn build_host(
    settings: &Resolved,
    node: Option<String>,
) -> Result<(Host<CocoonCli, KubeApi>, kube::Client)> {
    let metrics = Arc::new(Metrics::new());
    let pinned = pinned_files(settings).await?;
    let planner = Arc::new(node_planner(settings, &pinned, &metrics, node.is_some())?);
    let client = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes (in-cluster config or KUBECONFIG)")?;
    let pods = KubeApi::new(client.clone(), "cocoon-fixup", node);
    let leases = Arc::new(
        LeaseWatcher::new(settings.lease_file.clone(), settings.ip_poll)
            .context("watching the lease file")?,
    );
    let host = Host::new(
        planner,
        CocoonCli::new(settings.cocoon_bin.clone()),
        pods,
        leases,
        settings.host.clone(),
        metrics,
    );
    let host = match &settings.state_dir {
        Some(dir) => match MemoryStore::open(dir) {
            Ok(store) => host.with_records(Arc::new(store)),
            Err(e) => {
                tracing::error!(
                    "state directory {}: {e}; no record of the pods is kept, so a fixup loop retried or resumed after a restart gets a whole retry budget again",
                    dir.display()
                );
                host
            }
        },
        None => host,
    };
    Ok((host, client))
}

/// The longest a start or a reload waits for the pinned plugins to be
/// pulled, all of them together (each request has its own timeouts too).
pub(crate) const PULL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// How `serve` builds a plugin set at a reload: the configuration as it is
/// on disk now (flags and environment as at start), the pinned references
/// pulled, every plugin loaded; a plugin that does not load refuses the
/// reload. Only the planner's settings are taken (plugins, allow-list,
/// policies, limits, failure policies); the others need a restart. The
/// engine keeps `slots` instance slots, the number the host's planning
/// permits were sized for at start. `config` is the file read at start:
/// it must still be there, and not empty if it was not empty then (a file
/// being rewritten in place must not reload as all defaults).
pub(crate) fn reload_build(args: ConfigArgs, config: Option<PathBuf>, slots: u32) -> reload::Build {
    // A file that had content at start must keep some: one emptied while
    // being rewritten must not reload as all defaults.
    let had_content = config
        .as_deref()
        .and_then(|file| std::fs::metadata(file).ok())
        .is_some_and(|meta| meta.len() > 0);
    Arc::new(move || {
        if let Some(file) = config.as_ref().filter(|_| had_content) {
            match std::fs::metadata(file) {
                Ok(meta) if meta.len() > 0 => {}
                Ok(_) => {
                    return Err(format!(
                        "the configuration file {} is empty; write it to a temporary name and rename it into place",
                        file.display()
                    ));
                }
                Err(e) => {
                    return Err(format!(
                        "the configuration file {} read at start: {e}",
                        file.display()
                    ));
                }
            }
        }
        let mut settings = args.resolve(config.as_deref()).map_err(|e| e.to_string())?;
        if settings.planner.engine.slots != slots {
            tracing::warn!(
                "the configuration asks for {} plugin instance slots (from `concurrency`), {slots} serve until a restart",
                settings.planner.engine.slots
            );
        }
        settings.planner.engine.slots = slots;
        let pinned = tokio::runtime::Handle::current()
            .block_on(pinned_files(&settings))
            .map_err(|e| format!("{e:#}"))?;
        let (planner, failures) =
            Planner::with_files(settings.planner.clone(), &pinned).map_err(|e| e.to_string())?;
        if !failures.is_empty() {
            let failed: Vec<String> = failures
                .iter()
                .map(|f| f.text(&failed_file(&f.path, &settings, &pinned)))
                .collect();
            return Err(failed.join("; "));
        }
        Ok(reload::Candidate {
            planner,
            engine: settings.planner.engine.clone(),
        })
    })
}
