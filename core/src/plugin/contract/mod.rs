//! The contract versions this host serves, and the only place generated
//! bindings are seen: facts go in and plans come out as the host's domain
//! types.
//!
//! Each version is a module with its own `bindgen!` over its frozen WIT
//! (`wit/<version>/`): [`v0_1`], [`v0_2`], [`v0_3`] and [`v0_4`]. The
//! rest of the host sees only the current version's `types` ([`wit`]), and
//! the conversions below turn them into domain types. 0.1.0 and 0.2.0
//! share one `types` interface (0.1.0 reuses the types generated for
//! 0.2.0), which [`v0_2`] converts to and from the current one, as
//! [`v0_3`] does its own ([`older_types!`] holds what they share). A
//! current scenario or boot kind an older version lacks (`prepare`,
//! `parent`) is never sent to it: its plugins do not declare it. [`Pre`] is
//! a linked plugin of any version, dispatching each export to its
//! version's bindings.
//!
//! Serving another version takes: its WIT under `wit/<version>/`, a module
//! like [`v0_4`] (a `bindgen!`, its host import's name), a variant of
//! [`Contract`] and of [`Pre`]; every match over them is exhaustive, so the
//! compiler lists each place that needs an arm. If its `types` change, it
//! becomes the current version: [`wit`] points at its types, the
//! conversions below follow them, and the version it replaces converts its
//! own types to the new ones in its module (as [`v0_3`] does).

/// The conversions an older version's module shares with the others,
/// written once over its generated types (`old`, and its `PluginInfo`),
/// whose names are the current version's: the facts and the scenario to
/// it (`None` where it has no such value), and what `describe` and `plan`
/// return from it (`plan_to_current` stays in the module, for the actions
/// it has).
macro_rules! older_types {
    () => {
        /// The facts as this version's types; `None` for a parent's facts
        /// (the `prepare` scenario), which it cannot carry.
        pub fn facts_from_current(f: &wit::VmFacts) -> Option<old::VmFacts> {
            let ipv4 = |a: &wit::Ipv4Address| old::Ipv4Address { octets: a.octets };
            Some(old::VmFacts {
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
                    wit::BootKind::Parent => return None,
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
            })
        }

        /// The scenario as this version's type; `None` for `prepare`.
        pub fn scenario_from_current(s: wit::Scenario) -> Option<old::Scenario> {
            Some(match s {
                wit::Scenario::Cloudimg => old::Scenario::Cloudimg,
                wit::Scenario::OciNetworkd => old::Scenario::OciNetworkd,
                wit::Scenario::FcMac => old::Scenario::FcMac,
                wit::Scenario::WindowsPnp => old::Scenario::WindowsPnp,
                wit::Scenario::DhcpRecovery => old::Scenario::DhcpRecovery,
                wit::Scenario::Prepare => return None,
            })
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

        fn error_to_current(e: old::PlanError) -> wit::PlanError {
            match e {
                old::PlanError::Unsupported(reason) => wit::PlanError::Unsupported(reason),
                old::PlanError::InvalidFacts(f) => wit::PlanError::InvalidFacts(wit::InvalidFact {
                    field: f.field,
                    reason: f.reason,
                }),
            }
        }

        fn dialect_to_current(d: old::Dialect) -> wit::Dialect {
            match d {
                old::Dialect::PosixSh => wit::Dialect::PosixSh,
                old::Dialect::Powershell => wit::Dialect::Powershell,
            }
        }

        fn phase_to_current(p: old::Phase) -> wit::Phase {
            match p {
                old::Phase::Prepare => wit::Phase::Prepare,
                old::Phase::Link => wit::Phase::Link,
                old::Phase::Configure => wit::Phase::Configure,
            }
        }
    };
}
use older_types;

pub mod v0_1;
pub mod v0_2;
pub mod v0_3;
pub mod v0_4;

use wasmtime::Store;
use wasmtime::component::{Component, Linker};

use crate::classify::Scenario;
use crate::facts::{self, VmFacts};
use crate::plan::policy::RawPolicy;
use crate::plan::{self, Plan};

use super::sandbox::{self, CallState};

pub use v0_4::cocoon::fixup::types as wit;
pub use v0_4::exports::cocoon::fixup::generator::PluginInfo as WitPluginInfo;

/// The export every plugin must provide, without its version.
pub const GENERATOR_EXPORT: &str = "cocoon:fixup/generator";

/// A contract version this host serves. A plugin whose `generator` export
/// carries another version is refused at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Contract {
    V0_1,
    V0_2,
    V0_3,
    V0_4,
}

impl Contract {
    /// Every served version, newest first.
    pub const ALL: [Contract; 4] = [
        Contract::V0_4,
        Contract::V0_3,
        Contract::V0_2,
        Contract::V0_1,
    ];

    /// The version new plugins are built against (the SDK's).
    pub const CURRENT: Contract = Contract::V0_4;

    pub fn version(self) -> &'static str {
        match self {
            Contract::V0_1 => v0_1::VERSION,
            Contract::V0_2 => v0_2::VERSION,
            Contract::V0_3 => v0_3::VERSION,
            Contract::V0_4 => v0_4::VERSION,
        }
    }

    pub fn parse(version: &str) -> Option<Contract> {
        Contract::ALL.into_iter().find(|c| c.version() == version)
    }

    /// The served versions for messages: `0.4.0, 0.3.0, 0.2.0 and 0.1.0`.
    pub fn served() -> String {
        let versions: Vec<&str> = Contract::ALL.iter().map(|c| c.version()).collect();
        match versions.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => versions.concat(),
        }
    }

    /// The one import with functions a plugin of this version is granted.
    fn host_import(self) -> &'static str {
        match self {
            Contract::V0_1 => v0_1::HOST_IMPORT,
            Contract::V0_2 => v0_2::HOST_IMPORT,
            Contract::V0_3 => v0_3::HOST_IMPORT,
            Contract::V0_4 => v0_4::HOST_IMPORT,
        }
    }

    /// The imports a plugin of this version is granted, for `plugin
    /// inspect`: the host's `log` and the interfaces that only carry types.
    pub fn granted_imports(self) -> Vec<String> {
        let interfaces: &[&str] = match self {
            Contract::V0_1 => &["host", "types"],
            Contract::V0_2 | Contract::V0_3 | Contract::V0_4 => &["host", "types", "policy"],
        };
        interfaces
            .iter()
            .map(|i| format!("cocoon:fixup/{i}@{}", self.version()))
            .collect()
    }
}

impl std::fmt::Display for Contract {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.version())
    }
}

/// A plugin linked against its contract version.
pub enum Pre {
    V0_1(v0_1::PluginPre<CallState>),
    V0_2(v0_2::PluginPre<CallState>),
    V0_3(v0_3::PluginPre<CallState>),
    V0_4(v0_4::PluginPre<CallState>),
}

/// What a plugin says about itself at load.
#[derive(Debug)]
pub struct Described {
    pub info: WitPluginInfo,
    /// `None` for a contract that cannot declare a policy.
    pub policy: Option<RawPolicy>,
}

/// Link `component`, which exports the generator of `contract`: that
/// version's `log`, and every other import denied.
pub fn link(
    engine: &wasmtime::Engine,
    component: &Component,
    contract: Contract,
) -> wasmtime::Result<Pre> {
    let mut linker = Linker::<CallState>::new(engine);
    // `log` is linked by hand (its host function charges the Store's fuel),
    // the same for every version: its signature has not changed.
    sandbox::link_log(&mut linker, contract.host_import())?;
    // The type-only interfaces are defined as empty instances there too.
    sandbox::deny_remaining_imports(engine, &mut linker, component, &[contract.host_import()])?;
    let pre = linker.instantiate_pre(component)?;
    Ok(match contract {
        Contract::V0_1 => Pre::V0_1(v0_1::PluginPre::new(pre)?),
        Contract::V0_2 => Pre::V0_2(v0_2::PluginPre::new(pre)?),
        Contract::V0_3 => Pre::V0_3(v0_3::PluginPre::new(pre)?),
        Contract::V0_4 => Pre::V0_4(v0_4::PluginPre::new(pre)?),
    })
}

impl std::fmt::Debug for Pre {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pre(contract {})", self.contract())
    }
}

impl Pre {
    pub fn contract(&self) -> Contract {
        match self {
            Pre::V0_1(_) => Contract::V0_1,
            Pre::V0_2(_) => Contract::V0_2,
            Pre::V0_3(_) => Contract::V0_3,
            Pre::V0_4(_) => Contract::V0_4,
        }
    }

    /// Instantiate and call `describe` (and, where the contract has it,
    /// `policy`) in one instance.
    pub fn describe(&self, store: &mut Store<CallState>) -> wasmtime::Result<Described> {
        // A contract with `policy`: its info in today's types, its policy
        // as the raw one (`links` as the contract has them).
        macro_rules! described {
            ($pre:expr, $info:path, |$p:ident| $links:expr) => {{
                let plugin = $pre.instantiate(&mut *store)?;
                let generator = plugin.cocoon_fixup_generator();
                let info = generator.call_describe(&mut *store)?;
                let $p = generator.call_policy(&mut *store)?;
                Ok(Described {
                    info: $info(info),
                    policy: Some(RawPolicy {
                        writes: $p.writes,
                        removes: $p.removes,
                        runs: $p.runs,
                        special_modes: $p.special_modes,
                        links: $links,
                    }),
                })
            }};
        }
        match self {
            Pre::V0_1(pre) => {
                let plugin = pre.instantiate(&mut *store)?;
                let info = plugin.cocoon_fixup_generator().call_describe(&mut *store)?;
                Ok(Described {
                    info: v0_2::info_to_current(info),
                    policy: None,
                })
            }
            Pre::V0_2(pre) => described!(pre, v0_2::info_to_current, |_p| Vec::new()),
            Pre::V0_3(pre) => described!(pre, v0_3::info_to_current, |p| p.links),
            Pre::V0_4(pre) => described!(pre, std::convert::identity, |p| p.links),
        }
    }

    /// Instantiate and call `plan`.
    pub fn plan(
        &self,
        store: &mut Store<CallState>,
        scenario: wit::Scenario,
        facts: &wit::VmFacts,
    ) -> wasmtime::Result<Result<wit::Plan, wit::PlanError>> {
        // A scenario or facts an older version has no form for (`prepare`)
        // is never asked of it: its plugins cannot declare it.
        let older = |version: &str| {
            wit::PlanError::Unsupported(format!(
                "contract {version} has no {} scenario: rebuild the plugin against {}",
                scenario_name(scenario),
                Contract::CURRENT
            ))
        };
        match self {
            Pre::V0_1(_) | Pre::V0_2(_) => {
                let (Some(s), Some(f)) = (
                    v0_2::scenario_from_current(scenario),
                    v0_2::facts_from_current(facts),
                ) else {
                    return Ok(Err(older(self.contract().version())));
                };
                let answer = match self {
                    Pre::V0_1(pre) => pre
                        .instantiate(&mut *store)?
                        .cocoon_fixup_generator()
                        .call_plan(&mut *store, s, &f)?,
                    Pre::V0_2(pre) => pre
                        .instantiate(&mut *store)?
                        .cocoon_fixup_generator()
                        .call_plan(&mut *store, s, &f)?,
                    _ => unreachable!("matched above"),
                };
                Ok(v0_2::plan_to_current(answer))
            }
            Pre::V0_3(pre) => {
                let (Some(s), Some(f)) = (
                    v0_3::scenario_from_current(scenario),
                    v0_3::facts_from_current(facts),
                ) else {
                    return Ok(Err(older(v0_3::VERSION)));
                };
                Ok(v0_3::plan_to_current(
                    pre.instantiate(&mut *store)?
                        .cocoon_fixup_generator()
                        .call_plan(&mut *store, s, &f)?,
                ))
            }
            Pre::V0_4(pre) => pre
                .instantiate(&mut *store)?
                .cocoon_fixup_generator()
                .call_plan(&mut *store, scenario, facts),
        }
    }
}

fn scenario_name(s: wit::Scenario) -> &'static str {
    scenario_from_wit(s).as_str()
}

pub fn scenario_to_wit(s: Scenario) -> wit::Scenario {
    match s {
        Scenario::Cloudimg => wit::Scenario::Cloudimg,
        Scenario::OciNetworkd => wit::Scenario::OciNetworkd,
        Scenario::FcMac => wit::Scenario::FcMac,
        Scenario::WindowsPnp => wit::Scenario::WindowsPnp,
        Scenario::DhcpRecovery => wit::Scenario::DhcpRecovery,
        Scenario::Prepare => wit::Scenario::Prepare,
    }
}

pub fn scenario_from_wit(s: wit::Scenario) -> Scenario {
    match s {
        wit::Scenario::Cloudimg => Scenario::Cloudimg,
        wit::Scenario::OciNetworkd => Scenario::OciNetworkd,
        wit::Scenario::FcMac => Scenario::FcMac,
        wit::Scenario::WindowsPnp => Scenario::WindowsPnp,
        wit::Scenario::DhcpRecovery => Scenario::DhcpRecovery,
        wit::Scenario::Prepare => Scenario::Prepare,
    }
}

fn ipv4_to_wit(a: std::net::Ipv4Addr) -> wit::Ipv4Address {
    let o = a.octets();
    wit::Ipv4Address {
        octets: (o[0], o[1], o[2], o[3]),
    }
}

pub fn facts_to_wit(f: &VmFacts) -> wit::VmFacts {
    wit::VmFacts {
        name: f.name.as_str().to_owned(),
        id: f.id.as_str().to_owned(),
        backend: match f.backend {
            facts::Backend::CloudHypervisor => wit::Backend::CloudHypervisor,
            facts::Backend::Firecracker => wit::Backend::Firecracker,
        },
        os: match f.os {
            facts::GuestOs::Linux => wit::GuestOs::Linux,
            facts::GuestOs::Windows => wit::GuestOs::Windows,
            facts::GuestOs::Android => wit::GuestOs::Android,
            facts::GuestOs::Unknown => wit::GuestOs::Unknown,
        },
        image: match f.image {
            facts::ImageKind::Cloudimg => wit::ImageKind::Cloudimg,
            facts::ImageKind::Oci => wit::ImageKind::Oci,
            facts::ImageKind::Unknown => wit::ImageKind::Unknown,
        },
        boot: match f.boot {
            facts::BootKind::Clone => wit::BootKind::Clone,
            facts::BootKind::Fork => wit::BootKind::Fork,
            facts::BootKind::Wake => wit::BootKind::Wake,
            facts::BootKind::Resumed => wit::BootKind::Resumed,
            facts::BootKind::Parent => wit::BootKind::Parent,
        },
        nics: f
            .nics
            .iter()
            .map(|n| {
                let m = n.mac.0;
                wit::Nic {
                    mac: wit::MacAddress {
                        octets: (m[0], m[1], m[2], m[3], m[4], m[5]),
                    },
                    static_ipv4: n.static_ipv4.map(|s| wit::StaticIpv4 {
                        address: ipv4_to_wit(s.address),
                        prefix: s.prefix,
                        gateway: s.gateway.map(ipv4_to_wit),
                    }),
                }
            })
            .collect(),
        flavor: f.flavor.as_ref().map(|f| f.as_str().to_owned()),
    }
}

pub fn plan_from_wit(p: wit::Plan) -> Plan {
    Plan {
        dialect: match p.dialect {
            wit::Dialect::PosixSh => plan::Dialect::PosixSh,
            wit::Dialect::Powershell => plan::Dialect::PowerShell,
        },
        steps: p
            .steps
            .into_iter()
            .map(|s| plan::Step {
                description: s.description,
                phase: match s.phase {
                    wit::Phase::Prepare => plan::Phase::Prepare,
                    wit::Phase::Link => plan::Phase::Link,
                    wit::Phase::Configure => plan::Phase::Configure,
                },
                best_effort: s.best_effort,
                action: match s.action {
                    wit::Action::Run(argv) => plan::StepAction::Run(argv),
                    wit::Action::WriteFile(w) => plan::StepAction::WriteFile(plan::WriteFile {
                        path: w.path,
                        content: w.content,
                        mode: w.mode,
                        parents: w.parents,
                    }),
                    wit::Action::RemoveFiles(paths) => plan::StepAction::RemoveFiles(paths),
                    wit::Action::NameLink(l) => {
                        let o = l.mac.octets;
                        plan::StepAction::NameLink(plan::NameLink {
                            mac: facts::MacAddr([o.0, o.1, o.2, o.3, o.4, o.5]),
                            name: l.name,
                        })
                    }
                },
            })
            .collect(),
    }
}
