//! The one `bindgen!` site. Generated types stop here: facts go in and plans
//! come out as the host's domain types.

use crate::classify::Scenario;
use crate::facts::{self, VmFacts};
use crate::plan::{self, Plan};

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
});

pub use cocoon::fixup::types as wit;
pub use exports::cocoon::fixup::generator::PluginInfo as WitPluginInfo;

/// The WIT package version this host implements. A plugin whose
/// `generator` export carries another version is refused at load.
pub const CONTRACT_VERSION: &str = "0.1.0";

/// The export every plugin must provide, without its version.
pub const GENERATOR_EXPORT: &str = "cocoon:fixup/generator";

/// The one import a plugin is granted. It is linked by hand
/// ([`super::sandbox::link_log`]), not through the generated `Host` traits:
/// its host function needs the Store, to charge the call's fuel.
pub const HOST_IMPORT: &str = "cocoon:fixup/host@0.1.0";

pub fn scenario_to_wit(s: Scenario) -> wit::Scenario {
    match s {
        Scenario::Cloudimg => wit::Scenario::Cloudimg,
        Scenario::OciNetworkd => wit::Scenario::OciNetworkd,
        Scenario::FcMac => wit::Scenario::FcMac,
        Scenario::WindowsPnp => wit::Scenario::WindowsPnp,
        Scenario::DhcpRecovery => wit::Scenario::DhcpRecovery,
    }
}

pub fn scenario_from_wit(s: wit::Scenario) -> Scenario {
    match s {
        wit::Scenario::Cloudimg => Scenario::Cloudimg,
        wit::Scenario::OciNetworkd => Scenario::OciNetworkd,
        wit::Scenario::FcMac => Scenario::FcMac,
        wit::Scenario::WindowsPnp => Scenario::WindowsPnp,
        wit::Scenario::DhcpRecovery => Scenario::DhcpRecovery,
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
                    wit::Action::Run(argv) => plan::Action::Run(argv),
                    wit::Action::WriteFile(w) => plan::Action::WriteFile(plan::WriteFile {
                        path: w.path,
                        content: w.content,
                        mode: w.mode,
                    }),
                    wit::Action::RemoveFiles(paths) => plan::Action::RemoveFiles(paths),
                },
            })
            .collect(),
    }
}
