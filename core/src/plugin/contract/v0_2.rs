//! Contract 0.2.0 (`wit/0.2.0/`), frozen: 0.1.0 and a declared guest-side
//! policy. Its `types` interface is 0.1.0's; both are converted here to
//! and from the current version's ([`super::wit`]), where nothing of
//! theirs is lost: a write never creates parent directories and no step
//! names a link.

wasmtime::component::bindgen!({
    path: "../wit/0.2.0",
    world: "plugin",
});

use cocoon::fixup::types as old;
use exports::cocoon::fixup::generator::PluginInfo;

use super::wit;

pub const VERSION: &str = "0.2.0";

/// The one import with functions a plugin of this version is granted,
/// linked by [`link_log`](super::super::sandbox::link_log).
pub const HOST_IMPORT: &str = "cocoon:fixup/host@0.2.0";

/// The facts as this version's types.
pub fn facts_from_current(f: &wit::VmFacts) -> old::VmFacts {
    let ipv4 = |a: &wit::Ipv4Address| old::Ipv4Address { octets: a.octets };
    old::VmFacts {
        name: f.name.clone(),
        id: f.id.clone(),
        backend: match f.backend {
            wit::Backend::CloudHypervisor => old::Backend::CloudHypervisor,
            wit::Backend::Firecracker => old::Backend::Firecracker,
        },
        os: match f.os {
            wit::GuestOs::Linux => old::GuestOs::Linux,
            wit::GuestOs::Windows => old::GuestOs::Windows,
            wit::GuestOs::Android => old::GuestOs::Android,
            wit::GuestOs::Unknown => old::GuestOs::Unknown,
        },
        image: match f.image {
            wit::ImageKind::Cloudimg => old::ImageKind::Cloudimg,
            wit::ImageKind::Oci => old::ImageKind::Oci,
            wit::ImageKind::Unknown => old::ImageKind::Unknown,
        },
        boot: match f.boot {
            wit::BootKind::Clone => old::BootKind::Clone,
            wit::BootKind::Fork => old::BootKind::Fork,
            wit::BootKind::Wake => old::BootKind::Wake,
            wit::BootKind::Resumed => old::BootKind::Resumed,
        },
        nics: f
            .nics
            .iter()
            .map(|n| old::Nic {
                mac: old::MacAddress {
                    octets: n.mac.octets,
                },
                static_ipv4: n.static_ipv4.as_ref().map(|s| old::StaticIpv4 {
                    address: ipv4(&s.address),
                    prefix: s.prefix,
                    gateway: s.gateway.as_ref().map(ipv4),
                }),
            })
            .collect(),
        flavor: f.flavor.clone(),
    }
}

pub fn scenario_from_current(s: wit::Scenario) -> old::Scenario {
    match s {
        wit::Scenario::Cloudimg => old::Scenario::Cloudimg,
        wit::Scenario::OciNetworkd => old::Scenario::OciNetworkd,
        wit::Scenario::FcMac => old::Scenario::FcMac,
        wit::Scenario::WindowsPnp => old::Scenario::WindowsPnp,
        wit::Scenario::DhcpRecovery => old::Scenario::DhcpRecovery,
    }
}

fn scenario_to_current(s: old::Scenario) -> wit::Scenario {
    match s {
        old::Scenario::Cloudimg => wit::Scenario::Cloudimg,
        old::Scenario::OciNetworkd => wit::Scenario::OciNetworkd,
        old::Scenario::FcMac => wit::Scenario::FcMac,
        old::Scenario::WindowsPnp => wit::Scenario::WindowsPnp,
        old::Scenario::DhcpRecovery => wit::Scenario::DhcpRecovery,
    }
}

/// What `describe` returned, as the current version's type.
pub fn info_to_current(i: PluginInfo) -> super::WitPluginInfo {
    super::WitPluginInfo {
        name: i.name,
        version: i.version,
        contract: i.contract,
        summary: i.summary,
        scenarios: i.scenarios.into_iter().map(scenario_to_current).collect(),
        flavors: i.flavors,
    }
}

/// What `plan` returned, as the current version's types: every write
/// without `parents`.
pub fn plan_to_current(r: Result<old::Plan, old::PlanError>) -> Result<wit::Plan, wit::PlanError> {
    let p = r.map_err(|e| match e {
        old::PlanError::Unsupported(reason) => wit::PlanError::Unsupported(reason),
        old::PlanError::InvalidFacts(f) => wit::PlanError::InvalidFacts(wit::InvalidFact {
            field: f.field,
            reason: f.reason,
        }),
    })?;
    Ok(wit::Plan {
        dialect: match p.dialect {
            old::Dialect::PosixSh => wit::Dialect::PosixSh,
            old::Dialect::Powershell => wit::Dialect::Powershell,
        },
        steps: p
            .steps
            .into_iter()
            .map(|s| wit::Step {
                description: s.description,
                phase: match s.phase {
                    old::Phase::Prepare => wit::Phase::Prepare,
                    old::Phase::Link => wit::Phase::Link,
                    old::Phase::Configure => wit::Phase::Configure,
                },
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
