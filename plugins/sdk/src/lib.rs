//! The guest side of the cocoon-fixup plugin contract (`wit/0.4.0/fixup.wit`).
//!
//! A plan plugin is a WebAssembly component that turns the facts of one
//! cloned VM into an ordered list of typed steps. With this crate a vendor
//! writes only that logic: implement [`Plugin`] for a type and call
//! [`export_plugin!`] once.
//!
//! ```
//! use cocoon_fixup_sdk::{
//!     GuestPolicy, Phase, Plan, PlanError, Plugin, PluginInfo, Scenario, Step, VmFacts,
//! };
//!
//! #[derive(Debug)]
//! pub struct Hello;
//!
//! impl Plugin for Hello {
//!     fn describe() -> PluginInfo {
//!         PluginInfo::new("hello", "0.1.0", "says hello", vec![Scenario::OciNetworkd])
//!     }
//!
//!     fn policy() -> GuestPolicy {
//!         GuestPolicy::new().runs([["echo", "hello"]])
//!     }
//!
//!     fn plan(scenario: Scenario, facts: &VmFacts) -> Result<Plan, PlanError> {
//!         match scenario {
//!             Scenario::OciNetworkd => Ok(Plan::posix_sh(vec![Step::run(
//!                 format!("greet {}", facts.name),
//!                 Phase::Configure,
//!                 ["echo", "hello"],
//!             )])),
//!             other => Err(PlanError::unsupported("hello", other)),
//!         }
//!     }
//! }
//!
//! cocoon_fixup_sdk::export_plugin!(Hello);
//! ```
//!
//! The export glue only exists on `wasm32`: natively a plugin crate is an
//! ordinary library whose `Plugin` impl unit tests call directly, and several
//! plugin rlibs can share one test binary.
//!
//! # Layout
//!
//! - `bindings` (hidden): the one `wit_bindgen::generate!` site. Its types are
//!   re-exported here unchanged; nothing else in the crate touches the ABI.
//! - [`guest`]: the [`Plugin`] trait, [`log`], the panic hook and the glue
//!   behind [`export_plugin!`].
//! - `policy`: constructors for [`GuestPolicy`], what a plugin's plans may
//!   do in the guest.
//! - `values`: `Display` for MAC and IPv4 addresses and for the WIT enums.
//! - `steps`: constructors for [`Step`], [`Plan`], [`PlanError`] and
//!   [`PluginInfo`].
//! - [`linux`]: the housekeeping steps every Linux plan starts with.
//! - [`networkd`]: MAC-matched systemd-networkd files and the restart.

pub mod guest;
pub mod linux;
pub mod networkd;
mod policy;
mod steps;
mod values;

/// The generated bindings for world `cocoon:fixup/plugin`. Public only so
/// that [`export_plugin!`] can reach it from a plugin crate.
#[doc(hidden)]
#[allow(unsafe_code)] // the canonical ABI glue is unsafe by nature
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit/0.4.0",
        world: "plugin",
        pub_export_macro: true,
        export_macro_name: "__export_cocoon_fixup_plugin",
        default_bindings_module: "$crate::bindings",
        additional_derives: [PartialEq, Eq],
    });
}

pub use bindings::cocoon::fixup::policy::GuestPolicy;
pub use bindings::cocoon::fixup::types::{
    Action, Backend, BootKind, Dialect, GuestOs, ImageKind, InvalidFact, Ipv4Address, LinkName,
    LogLevel, MacAddress, Nic, Phase, Plan, PlanError, PluginInfo, Scenario, StaticIpv4, Step,
    VmFacts, WriteFile,
};
pub use guest::{Plugin, log};
pub use steps::unsupported;

/// The contract version this SDK was generated from: the version in the
/// `package` line of `wit/0.4.0/fixup.wit`. The host refuses a plugin whose
/// `generator` export carries a version it does not support, and a plugin
/// reports this value in [`PluginInfo::contract`].
pub const CONTRACT_VERSION: &str = "0.4.0";

/// Wires a [`Plugin`] implementation to the component's exports.
///
/// Call it once per plugin crate, at module level, with the type that
/// implements [`Plugin`]. On `wasm32` it exports `cocoon:fixup/generator`
/// and installs a panic hook that reports panics through the host's log
/// before the guest traps. On every other target it expands to nothing, so
/// the crate links natively for unit tests.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        #[cfg(target_arch = "wasm32")]
        #[allow(unsafe_code)] // the generated canonical ABI exports
        const _: () = {
            struct CocoonFixupExport;

            impl $crate::guest::__private::Guest for CocoonFixupExport {
                fn describe() -> $crate::PluginInfo {
                    $crate::guest::__private::describe::<$plugin>()
                }

                fn plan(
                    scenario: $crate::Scenario,
                    facts: $crate::VmFacts,
                ) -> ::core::result::Result<$crate::Plan, $crate::PlanError> {
                    $crate::guest::__private::plan::<$plugin>(scenario, facts)
                }

                fn policy() -> $crate::GuestPolicy {
                    $crate::guest::__private::policy::<$plugin>()
                }
            }

            $crate::bindings::__export_cocoon_fixup_plugin!(
                CocoonFixupExport with_types_in $crate::bindings
            );
        };
    };
}

#[cfg(test)]
mod tests {
    use super::CONTRACT_VERSION;

    const WIT: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../wit/0.4.0/fixup.wit"
    ));

    /// The version in `package cocoon:fixup@<version>;`.
    fn wit_package_version() -> &'static str {
        let line = WIT
            .lines()
            .map(str::trim)
            .find(|line| line.starts_with("package "))
            .expect("wit/0.4.0/fixup.wit has a package line");
        let (_, version) = line
            .trim_end_matches(';')
            .split_once('@')
            .expect("the package line carries a version");
        version
    }

    #[test]
    fn contract_version_matches_the_wit_package() {
        assert_eq!(CONTRACT_VERSION, wit_package_version());
    }
}
