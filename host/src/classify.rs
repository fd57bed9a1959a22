//! Classification: which clones need a guest fixup, and which scenario.
//!
//! A pure function of the [`Observation`](crate::facts::Observation)
//! (spec section 3): the first matching rule wins. Cloudimg vs OCI never
//! decides *whether* a fixup runs, only which Linux network flavour is used;
//! that needs the image kind, which the caller probes only when
//! [`Decision::needs_image_kind`] says so.

use std::fmt;

/// The scenarios the host asks plugins to plan (the WIT `scenario` enum).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scenario {
    Cloudimg,
    OciNetworkd,
    FcMac,
    WindowsPnp,
    DhcpRecovery,
}

impl Scenario {
    pub const ALL: [Scenario; 5] = [
        Scenario::Cloudimg,
        Scenario::OciNetworkd,
        Scenario::FcMac,
        Scenario::WindowsPnp,
        Scenario::DhcpRecovery,
    ];

    /// The name used in JSON output, plugin cases and the WIT contract.
    pub fn as_str(self) -> &'static str {
        match self {
            Scenario::Cloudimg => "cloudimg",
            Scenario::OciNetworkd => "oci-networkd",
            Scenario::FcMac => "fc-mac",
            Scenario::WindowsPnp => "windows-pnp",
            Scenario::DhcpRecovery => "dhcp-recovery",
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
