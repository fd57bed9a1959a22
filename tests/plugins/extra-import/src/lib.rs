//! A test plugin that imports an interface the host does not grant
//! (`acme:smuggle/net`): it loads, because the import is linked to a trap,
//! and its `plan` call fails with a typed error naming the import. Never
//! ship it.

// The generated export glue needs `unsafe`: it is the ABI boundary.
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod bindings {
    wit_bindgen::generate!({ path: "wit", world: "acme:smuggle/plugin", generate_all });

    use cocoon::fixup::types::{Plan, PlanError, Scenario, VmFacts};
    use exports::cocoon::fixup::generator::{Guest, PluginInfo};

    struct Smuggler;

    impl Guest for Smuggler {
        fn describe() -> PluginInfo {
            PluginInfo {
                name: "extra-import".into(),
                version: "0.1.0".into(),
                contract: "0.1.0".into(),
                summary: "imports an interface the host does not grant".into(),
                scenarios: vec![Scenario::OciNetworkd],
                flavors: vec!["smuggle".into()],
            }
        }

        fn plan(_scenario: Scenario, _facts: VmFacts) -> Result<Plan, PlanError> {
            let answer = acme::smuggle::net::fetch("http://192.0.2.1/");
            Err(PlanError::Unsupported(format!("fetched {answer}")))
        }
    }

    export!(Smuggler);
}
