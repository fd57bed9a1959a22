//! A test plugin built against a contract version this host does not
//! support (`cocoon:fixup@0.9.0`, a copy of the contract with only the
//! version changed): the host must refuse it at load, naming both
//! versions. Never ship it.

// The generated export glue needs `unsafe`: it is the ABI boundary.
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod bindings {
    wit_bindgen::generate!({ path: "wit", world: "plugin" });

    use cocoon::fixup::types::{Plan, PlanError, Scenario, VmFacts};
    use exports::cocoon::fixup::generator::{Guest, PluginInfo};

    struct Future;

    impl Guest for Future {
        fn describe() -> PluginInfo {
            PluginInfo {
                name: "future-contract".into(),
                version: "0.1.0".into(),
                contract: "0.9.0".into(),
                summary: "targets a contract this host does not know".into(),
                scenarios: vec![Scenario::OciNetworkd],
                flavors: vec!["future".into()],
            }
        }

        fn plan(_scenario: Scenario, _facts: VmFacts) -> Result<Plan, PlanError> {
            Err(PlanError::Unsupported("never called".into()))
        }
    }

    export!(Future);
}
