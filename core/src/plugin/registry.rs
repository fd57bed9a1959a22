//! Which plugin serves a scenario.
//!
//! Each plugin claims `(scenario, flavour)` pairs: one per flavour it
//! declares, or `(scenario, any)` when it declares none. Selection for a VM
//! with flavour `f` takes the plugin claiming `(scenario, f)` if there is
//! one, else the one claiming `(scenario, any)`. So a vendor plugin replaces
//! a built-in only where it is more specific (a named flavour), and two
//! plugins making the same claim are refused at load, naming both.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::classify::Scenario;
use crate::facts::Flavor;

use super::{LoadedPlugin, Origin};

/// Two plugins claiming the same thing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{new} and {existing} both serve {scenario} for {} with equal specificity: remove one of them or make one serve a narrower flavour",
    flavor_label(.flavor.as_ref())
)]
pub struct ConflictError {
    pub scenario: Scenario,
    pub flavor: Option<Flavor>,
    pub existing: Origin,
    pub new: Origin,
}

/// No plugin serves a scenario.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no loaded plugin serves {scenario} for {}{}",
    flavor_label(.flavor.as_ref()),
    no_plugin_fix(.contested.as_ref(), .failed)
)]
pub struct NoPlugin {
    pub scenario: Scenario,
    pub flavor: Option<Flavor>,
    /// The claim is contested: two plugins made it, neither serves it.
    pub contested: Option<(Origin, Origin)>,
    /// Plugin files that failed to load, as `path: why` (at most a few).
    pub failed: Vec<String>,
}

impl NoPlugin {
    /// Whether the plugin directory is to blame (a contested claim, a file
    /// that did not load) rather than the VM: the node's operator must fix
    /// it, and the VM can be served once they have.
    pub fn is_node_config(&self) -> bool {
        self.contested.is_some() || !self.failed.is_empty()
    }
}

/// Plugin-file failures named in a [`NoPlugin`] message.
const FAILURES_SHOWN: usize = 3;

fn no_plugin_fix(contested: Option<&(Origin, Origin)>, failed: &[String]) -> String {
    let mut text = match contested {
        Some((a, b)) => {
            format!(": {a} and {b} both claim it, so neither serves it; remove one of them")
        }
        None if failed.is_empty() => ": add one to the plugin directory".to_owned(),
        None => {
            ": a plugin file that did not load may have served it; fix or remove it, then restart"
                .to_owned()
        }
    };
    if !failed.is_empty() {
        text.push_str(&format!(
            "; {} plugin file(s) did not load (`cocoon-fixup plugin inspect FILE` says why): {}",
            failed.len(),
            failed
                .iter()
                .take(FAILURES_SHOWN)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    text
}

fn flavor_label(f: Option<&Flavor>) -> String {
    match f {
        Some(f) => format!("flavour `{f}`"),
        None => "any flavour".to_owned(),
    }
}

/// The plugin chosen for a scenario, and why.
#[derive(Debug, Clone)]
pub struct Selection {
    pub plugin: Arc<LoadedPlugin>,
    pub scenario: Scenario,
    /// One sentence for people and for `plan` output.
    pub reason: String,
    /// The VM's guest flavour when no plugin declares it for the scenario
    /// and the generic plugin serves instead (`plan` and the daemon say
    /// so); `None` when the VM names no flavour or a plugin declares it.
    pub unmatched_flavor: Option<Flavor>,
}

type Claim = (Scenario, Option<Flavor>);

/// The loaded plugins and their claims.
///
/// A claim two plugins make is *contested*: neither serves it, and a VM
/// that needs it fails with a message naming both, rather than being
/// served by whichever file happened to load first.
#[derive(Debug, Default, Clone)]
pub struct Registry {
    plugins: Vec<Arc<LoadedPlugin>>,
    claims: BTreeMap<Claim, usize>,
    contested: BTreeMap<Claim, (Origin, Origin)>,
    /// Plugin files that did not load, as `path: why`, for messages.
    failed: Vec<String>,
}

fn claims_of(plugin: &LoadedPlugin) -> Vec<Claim> {
    let mut claims = Vec::new();
    for &scenario in plugin.info.scenarios.iter().filter(|s| !s.is_companion()) {
        if plugin.info.flavors.is_empty() {
            claims.push((scenario, None));
        }
        for f in &plugin.info.flavors {
            claims.push((scenario, Some(f.clone())));
        }
    }
    claims
}

impl Registry {
    /// Register a plugin unless one of its claims is taken; then nothing of
    /// it is registered.
    ///
    /// On a conflict between two plugin files every claim they share is
    /// withdrawn (see [`Registry`]); the first file keeps serving its other
    /// claims. A built-in keeps its claims: a file that claims the same is
    /// refused, and the built-in goes on serving.
    pub fn add(
        &mut self,
        plugin: impl Into<Arc<LoadedPlugin>>,
    ) -> Result<Arc<LoadedPlugin>, ConflictError> {
        let plugin = plugin.into();
        let claims = claims_of(&plugin);
        let mut conflict = None;
        for claim in &claims {
            let existing = match (self.claims.get(claim), self.contested.get(claim)) {
                (Some(&i), _) => self.plugins[i].origin.clone(),
                (None, Some((first, _))) => first.clone(),
                (None, None) => continue,
            };
            if matches!(existing, Origin::BuiltIn(_)) {
                conflict.get_or_insert_with(|| ConflictError {
                    scenario: claim.0,
                    flavor: claim.1.clone(),
                    existing,
                    new: plugin.origin.clone(),
                });
                continue;
            }
            self.claims.remove(claim);
            self.contested
                .insert(claim.clone(), (existing.clone(), plugin.origin.clone()));
            conflict.get_or_insert_with(|| ConflictError {
                scenario: claim.0,
                flavor: claim.1.clone(),
                existing,
                new: plugin.origin.clone(),
            });
        }
        if let Some(conflict) = conflict {
            return Err(conflict);
        }
        let index = self.plugins.len();
        self.plugins.push(plugin.clone());
        for claim in claims {
            self.claims.insert(claim, index);
        }
        Ok(plugin)
    }

    /// Remember plugin files that failed to load, for the messages of
    /// [`NoPlugin`] and of generic selections that one of them might have
    /// replaced.
    pub fn note_failures(&mut self, failures: impl IntoIterator<Item = String>) {
        self.failed.extend(failures);
    }

    /// The origins that share a contested claim with `origin`: the claim
    /// both made, which now serves neither; with whether the other origin
    /// loaded first (and kept its other claims).
    pub fn contested_with(&self, origin: &Origin) -> Vec<(Scenario, Option<Flavor>, Origin, bool)> {
        self.contested
            .iter()
            .filter_map(|((scenario, flavor), (a, b))| {
                let (other, first) = if a == origin {
                    (b, false)
                } else if b == origin {
                    (a, true)
                } else {
                    return None;
                };
                Some((*scenario, flavor.clone(), other.clone(), first))
            })
            .collect()
    }

    /// Every registered plugin, in load order.
    pub fn plugins(&self) -> &[Arc<LoadedPlugin>] {
        &self.plugins
    }

    /// The plugin for `scenario` on a VM of `flavor`.
    pub fn select(
        &self,
        scenario: Scenario,
        flavor: Option<&Flavor>,
    ) -> Result<Selection, NoPlugin> {
        let no_plugin = |contested: Option<&(Origin, Origin)>| NoPlugin {
            scenario,
            flavor: flavor.cloned(),
            contested: contested.cloned(),
            failed: self.failed.clone(),
        };
        if let Some(f) = flavor
            && let Some(pair) = self.contested.get(&(scenario, Some(f.clone())))
        {
            return Err(no_plugin(Some(pair)));
        }
        if let Some(f) = flavor
            && let Some(&i) = self.claims.get(&(scenario, Some(f.clone())))
        {
            let plugin = self.plugins[i].clone();
            let shadowed = match self.claims.get(&(scenario, None)) {
                Some(&g) => format!(", in place of the generic {}", self.plugins[g].origin),
                None => String::new(),
            };
            return Ok(Selection {
                reason: format!(
                    "{} ({}) declares flavour `{f}` for {scenario}{shadowed}",
                    plugin.info.name, plugin.origin
                ),
                plugin,
                scenario,
                unmatched_flavor: None,
            });
        }
        // A VM that asks for a flavour no loaded plugin declares, while a
        // plugin file did not load: that file may have been the flavour's
        // plugin, so the generic plan is not guessed at.
        if flavor.is_some() && !self.failed.is_empty() {
            return Err(no_plugin(None));
        }
        match self.claims.get(&(scenario, None)) {
            Some(&i) => {
                let plugin = self.plugins[i].clone();
                let why_generic = match flavor {
                    Some(f) => format!("; no plugin declares flavour `{f}`"),
                    None => String::new(),
                };
                Ok(Selection {
                    reason: format!(
                        "{} ({}) serves {scenario} for any flavour{why_generic}",
                        plugin.info.name, plugin.origin
                    ),
                    plugin,
                    scenario,
                    unmatched_flavor: flavor.cloned(),
                })
            }
            None => Err(no_plugin(self.contested.get(&(scenario, None)))),
        }
    }
}

impl fmt::Display for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.plugins {
            writeln!(f, "{} {} ({})", p.info.name, p.info.version, p.origin)?;
        }
        Ok(())
    }
}
