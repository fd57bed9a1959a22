//! A test plugin whose `describe` traps: the host must refuse it at load
//! with a typed error and keep loading the others. Never ship it.

use cocoon_fixup_sdk::{GuestPolicy, Plan, PlanError, Plugin, PluginInfo, Scenario, VmFacts};

/// What `describe` panics with.
pub const MESSAGE: &str = "describe refuses on purpose";

/// The plugin.
#[derive(Debug)]
pub struct DescribeTrap;

impl Plugin for DescribeTrap {
    fn describe() -> PluginInfo {
        panic!("{MESSAGE}")
    }

    fn plan(_scenario: Scenario, _facts: &VmFacts) -> Result<Plan, PlanError> {
        Ok(Plan::posix_sh(Vec::new()))
    }

    fn policy() -> GuestPolicy {
        GuestPolicy::new()
    }
}

cocoon_fixup_sdk::export_plugin!(DescribeTrap);
