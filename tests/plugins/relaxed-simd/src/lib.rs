//! A test plugin built with relaxed SIMD, a WebAssembly proposal the host
//! switches off (its results depend on the node's CPU): otherwise a good
//! plugin, which the host must refuse at load, naming the plugin and the
//! feature. Stable Rust emits relaxed SIMD from a `relaxed-simd` function
//! with no extra flags, so this builds as every plugin does. Never ship it.

use cocoon_fixup_sdk::{
    GuestPolicy, Phase, Plan, PlanError, Plugin, PluginInfo, Scenario, Step, VmFacts,
};

/// The plugin's name and the one flavour it claims.
pub const NAME: &str = "relaxed-simd";

/// The plugin.
#[derive(Debug)]
pub struct RelaxedSimd;

/// `n` through a relaxed SIMD truncation (`i32x4.relaxed_trunc_f32x4_s`).
#[cfg(target_arch = "wasm32")]
#[target_feature(enable = "relaxed-simd")]
fn relaxed_count(n: usize) -> usize {
    use core::arch::wasm32::{f32x4_splat, i32x4_extract_lane, i32x4_relaxed_trunc_f32x4};
    i32x4_extract_lane::<0>(i32x4_relaxed_trunc_f32x4(f32x4_splat(n as f32))) as usize
}

/// The NIC count, through relaxed SIMD in the plugin's code. (Calling a
/// `target_feature` function is safe on WebAssembly: a module runs only on
/// an engine that validated it.)
fn count(n: usize) -> usize {
    #[cfg(target_arch = "wasm32")]
    let n = relaxed_count(n);
    n
}

impl Plugin for RelaxedSimd {
    fn describe() -> PluginInfo {
        PluginInfo::new(
            NAME,
            env!("CARGO_PKG_VERSION"),
            "uses relaxed SIMD, which the host refuses at load",
            vec![Scenario::OciNetworkd],
        )
        .with_flavors([NAME])
    }

    fn plan(_scenario: Scenario, facts: &VmFacts) -> Result<Plan, PlanError> {
        let nics = count(facts.nics.len()).to_string();
        Ok(Plan::posix_sh(vec![Step::run(
            "count the NICs",
            Phase::Configure,
            ["echo", nics.as_str()],
        )]))
    }

    fn policy() -> GuestPolicy {
        GuestPolicy::new()
    }
}

cocoon_fixup_sdk::export_plugin!(RelaxedSimd);
