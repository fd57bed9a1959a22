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
    "no loaded plugin serves {scenario} for {}: add one to the plugin directory",
    flavor_label(.flavor.as_ref())
)]
pub struct NoPlugin {
    pub scenario: Scenario,
    pub flavor: Option<Flavor>,
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
}

type Claim = (Scenario, Option<Flavor>);

/// The loaded plugins and their claims.
#[derive(Debug, Default)]
pub struct Registry {
    plugins: Vec<Arc<LoadedPlugin>>,
    claims: BTreeMap<Claim, usize>,
}

fn claims_of(plugin: &LoadedPlugin) -> Vec<Claim> {
    let mut claims = Vec::new();
    for &scenario in &plugin.info.scenarios {
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
    pub fn add(&mut self, plugin: LoadedPlugin) -> Result<Arc<LoadedPlugin>, ConflictError> {
        let claims = claims_of(&plugin);
        for claim in &claims {
            if let Some(&i) = self.claims.get(claim) {
                return Err(ConflictError {
                    scenario: claim.0,
                    flavor: claim.1.clone(),
                    existing: self.plugins[i].origin.clone(),
                    new: plugin.origin.clone(),
                });
            }
        }
        let index = self.plugins.len();
        let plugin = Arc::new(plugin);
        self.plugins.push(plugin.clone());
        for claim in claims {
            self.claims.insert(claim, index);
        }
        Ok(plugin)
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
            });
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
                })
            }
            None => Err(NoPlugin {
                scenario,
                flavor: flavor.cloned(),
            }),
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
