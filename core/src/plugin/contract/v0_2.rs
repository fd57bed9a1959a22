//! Contract 0.2.0 (`wit/0.2.0/`), frozen: 0.1.0 and a declared guest-side
//! policy. Its `types` interface is 0.1.0's; both are converted here to
//! and from the current version's ([`super::wit`]), where nothing of
//! theirs is lost: a write never creates parent directories and no step
//! names a link. Neither is ever asked to prepare.

wasmtime::component::bindgen!({
    path: "../wit/0.2.0",
    world: "plugin",
});

pub use cocoon::fixup::types as old;
pub use exports::cocoon::fixup::generator::PluginInfo;

use super::wit;

pub const VERSION: &str = "0.2.0";

/// The one import with functions a plugin of this version is granted,
/// linked by [`link_log`](super::super::sandbox::link_log).
pub const HOST_IMPORT: &str = "cocoon:fixup/host@0.2.0";

super::older_types!();

/// What `plan` returned, as the current version's types: every write
/// without `parents`.
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
                        parents: false,
                    }),
                    old::Action::RemoveFiles(paths) => wit::Action::RemoveFiles(paths),
                },
            })
            .collect(),
    })
}
