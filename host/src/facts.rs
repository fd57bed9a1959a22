//! VM facts: what the host knows about one cloned VM.
//!
//! Two stages, so that classification never depends on values it does not
//! use:
//!
//! 1. [`Observation`]: read leniently from a Pod (`kubectl get pod -o json`)
//!    and `cocoon vm inspect --json`. Annotations are interpreted exactly as
//!    spec section 2 says (backend, OS, boot kind); NIC values stay raw text.
//! 2. [`VmFacts`]: validated, typed values (RFC 1123 VM name, MACs, IPv4
//!    addresses, prefixes, gateways, flavour). Only these reach a plugin.
//!    Every error names the field and the offending value.

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;

/// Annotation keys read by the host (spec section 2). Other components of
/// the stack read the same keys: they are part of the contract.
pub mod annotations {
    pub const VM_NAME: &str = "vm.cocoonstack.io/name";
    pub const VM_ID: &str = "vm.cocoonstack.io/id";
    pub const BACKEND: &str = "vm.cocoonstack.io/backend";
    pub const OS: &str = "cocoonset.cocoonstack.io/os";
    pub const MANAGED: &str = "cocoonset.cocoonstack.io/managed";
    pub const MODE: &str = "cocoonset.cocoonstack.io/mode";
    pub const FORK_FROM: &str = "vm.cocoonstack.io/fork-from";
    pub const CLONE_FROM_DIR: &str = "vm.cocoonstack.io/clone-from-dir";
    pub const RESTORE_FROM_HIBERNATE: &str = "vm.cocoonstack.io/restore-from-hibernate";
    pub const GUEST_FLAVOR: &str = "vm.cocoonstack.io/guest-flavor";
}

/// The hypervisor behind the VM. Anything but exactly `firecracker` is
/// Cloud Hypervisor (spec section 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    CloudHypervisor,
    Firecracker,
}

/// The guest OS. Only exactly `windows` is Windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GuestOs {
    Linux,
    Windows,
    Android,
    Unknown,
}

/// How the guest disk was made; decides the Linux network flavour only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageKind {
    Cloudimg,
    Oci,
    /// Not needed for this decision, so not probed.
    Unknown,
}

/// How a cloned VM came to run. A VM that was not cloned (mode `run`
/// without fork-from or clone-from-dir) has no boot kind: see
/// [`Observation::boot`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BootKind {
    Clone,
    Fork,
    Wake,
    Resumed,
}

/// One NIC as `cocoon vm inspect --json` lists it, values unvalidated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RawNic {
    pub mac: String,
    pub tap: String,
    /// Empty means DHCP.
    pub ip: String,
    pub prefix: Option<i64>,
    /// Empty means no gateway.
    pub gateway: String,
}

impl RawNic {
    /// A NIC is static when `network.ip` is non-empty (spec section 2).
    pub fn is_static(&self) -> bool {
        !self.ip.is_empty()
    }
}

/// What was read from the pod, the inspect output and the command line,
/// before validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// Pod namespace and name, for messages.
    pub pod: String,
    pub managed: bool,
    pub vm_name: String,
    /// From inspect (`id`), else the `vm.cocoonstack.io/id` annotation.
    pub vm_id: String,
    pub backend: Backend,
    pub os: GuestOs,
    /// `None` when the VM was not cloned (classification rule 2).
    pub boot: Option<BootKind>,
    /// The snapshot's recorded source image, when known.
    pub source_image: Option<String>,
    /// The `vm.cocoonstack.io/guest-flavor` annotation, when non-empty.
    pub flavor: Option<String>,
    pub nics: Vec<RawNic>,
    /// All pod annotations, for later stages.
    pub annotations: BTreeMap<String, String>,
}

/// A validated VM name: an RFC 1123 label (1..=63 of `a-z`, `0-9`, `-`,
/// starting and ending with a letter or digit). Safe as a hostname.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VmName(String);

impl VmName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VmName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated cocoon VM id: safe as a single path component below the
/// cocoon root and as a `cocoon` argument (never starts with `-`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VmId(String);

impl VmId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A unicast, non-zero MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    /// Lowercase, colon-separated: `52:54:00:12:34:56`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            o[0], o[1], o[2], o[3], o[4], o[5]
        )
    }
}

/// A static IPv4 configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StaticIpv4 {
    pub address: Ipv4Addr,
    /// 0..=32.
    pub prefix: u8,
    pub gateway: Option<Ipv4Addr>,
}

/// A validated NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Nic {
    pub mac: MacAddr,
    pub static_ipv4: Option<StaticIpv4>,
}

/// A validated guest flavour: 1..=63 of `a-z`, `0-9`, `-`, `.`, `_`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Flavor(String);

impl Flavor {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Validated facts: the only form in which facts reach a plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmFacts {
    pub name: VmName,
    pub id: VmId,
    pub backend: Backend,
    pub os: GuestOs,
    pub image: ImageKind,
    pub boot: BootKind,
    pub nics: Vec<Nic>,
    pub flavor: Option<Flavor>,
}
