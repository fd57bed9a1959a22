//! Contract 0.3.0 (`wit/0.3.0/`), frozen: 0.2.0, and `write-file` with
//! `parents`, the `name-link` action and the policy's `links`. Its types
//! are converted here to and from the current version's ([`super::wit`]),
//! where nothing of theirs is lost; the current version's `prepare`
//! scenario and `parent` boot kind have no 0.3.0 form, so such a call is
//! never made to a 0.3.0 plugin. [`super::v0_2`] converts through these
//! types.

wasmtime::component::bindgen!({
    path: "../wit/0.3.0",
    world: "plugin",
});

pub use cocoon::fixup::types as old;
pub use exports::cocoon::fixup::generator::PluginInfo;

use super::wit;

pub const VERSION: &str = "0.3.0";

/// The one import with functions a plugin of this version is granted,
/// linked by [`link_log`](super::super::sandbox::link_log).
pub const HOST_IMPORT: &str = "cocoon:fixup/host@0.3.0";

super::older_types!();

/// What `plan` returned, as the current version's types.
pub fn plan_to_current(r: Result<old::Plan, old::PlanError>) -> Result<wit::Plan, wit::PlanError> {
    let p = r.map_err(error_to_current)?;
    Ok(wit::Plan {
        dialect: dialect_to_current(p.dialect),
        steps: p
            .steps
            .into_iter()
            .map(|s| wit::Step {
                description: s.description,
                phase: phase_to_current(s.phase),
                best_effort: s.best_effort,
                action: match s.action {
                    old::Action::Run(argv) => wit::Action::Run(argv),
                    old::Action::WriteFile(w) => wit::Action::WriteFile(wit::WriteFile {
                        path: w.path,
                        content: w.content,
                        mode: w.mode,
                        parents: w.parents,
                    }),
                    old::Action::RemoveFiles(paths) => wit::Action::RemoveFiles(paths),
                    old::Action::NameLink(l) => wit::Action::NameLink(wit::LinkName {
                        mac: wit::MacAddress {
                            octets: l.mac.octets,
                        },
                        name: l.name,
                    }),
                },
            })
            .collect(),
    })
}
