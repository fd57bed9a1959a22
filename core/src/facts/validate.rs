//! Validated facts, the only form in which facts reach a plugin: names,
//! ids, MACs, addresses and flavours checked, with what to fix when one is
//! not.

use super::*;

/// A validated VM name, as the stack names VMs: 1..=[`MAX_VM_NAME_LEN`]
/// of ASCII letters, digits, `-`, `.` and `_`, starting and ending with a
/// letter or digit. Safe in messages, the hint and a plugin's facts; not
/// always a hostname (a long pod's hashed name is longer than one): only
/// the plans that write it as the guest's hostname need that
/// ([`hostname`](Self::hostname)), so a Windows plan never refuses it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VmName(String);

impl VmName {
    /// Validates a VM name.
    pub fn parse(value: &str) -> Result<Self, FactError> {
        parse_name(value, &Ctx::standalone("VM name"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as the guest's hostname (spec section 4, step 2):
    /// dot-separated RFC 1123 labels (`a-z`, `0-9`, `-`, each starting
    /// and ending with a letter or digit) of at most [`MAX_HOSTNAME_LEN`]
    /// bytes in all, so the legacy name of a dotted pod
    /// (`vk-default-web.v1-0`) is one. The error names the rule broken and
    /// what the stack must change.
    pub fn hostname(&self) -> Result<&str, FactError> {
        let name = self.as_str();
        let ctx = Ctx::standalone(
            "VM name (the VM record's config.name, which the plan writes to /etc/hostname)",
        );
        match hostname_rule(name) {
            Some(rule) => Err(ctx.invalid(name, rule, FIX_HOSTNAME)),
            None => Ok(name),
        }
    }
}

/// Check what a plan writes to [`HOSTNAME_PATH`] that is not the VM name
/// (a vendor plugin's own hostname): the same hostname rule as
/// [`VmName::hostname`], so no Linux plan writes a hostname the guest
/// cannot take.
pub fn check_written_hostname(written: &str) -> Result<(), FactError> {
    let ctx = Ctx::standalone("the hostname the plan writes to /etc/hostname");
    match hostname_rule(written) {
        Some(rule) => Err(ctx.invalid(
            written,
            rule,
            "the plugin that planned it must write the VM name, or a hostname of dot-separated RFC 1123 labels of at most 63 bytes; report it to the plugin's vendor",
        )),
        None => Ok(()),
    }
}

/// The hostname rule a value breaks, or `None`: dot-separated RFC 1123
/// labels (`a-z`, `0-9`, `-`, each starting and ending with a letter or
/// digit) of at most [`MAX_HOSTNAME_LEN`] bytes in all.
pub(crate) fn hostname_rule(name: &str) -> Option<&'static str> {
    if name.len() > MAX_HOSTNAME_LEN {
        Some("is longer than the 63 bytes a hostname may have")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.'))
    {
        Some("may only hold a-z, 0-9, '-' and '.' as a hostname")
    } else if name.split('.').any(str::is_empty) {
        Some("has an empty label (a dot at an end, or two in a row)")
    } else if name
        .split('.')
        .any(|label| label.starts_with('-') || label.ends_with('-'))
    {
        Some("has a label that starts or ends with '-'")
    } else {
        None
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
    /// Validates a VM id: 1..=128 of `A-Z`, `a-z`, `0-9`, `.`, `_`, `-`, not
    /// starting with `-` (it would read as an option) or `.` (hidden, `.`,
    /// `..`), and without `..` anywhere. No `/` can pass, so the id is always
    /// exactly one path component.
    pub fn parse(value: &str) -> Result<Self, FactError> {
        parse_id(value, &Ctx::standalone("VM id"))
    }

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

impl MacAddr {
    /// Parses six two-hex-digit groups separated by `:` (either case).
    /// Multicast (lowest bit of the first octet set, broadcast included) and
    /// all-zero addresses are refused: no NIC can own them, and a networkd
    /// `[Match]` on one would match nothing or too much.
    pub fn parse(value: &str) -> Result<Self, FactError> {
        parse_mac(value, &Ctx::standalone("MAC address"))
    }
}

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
    /// 1..=32 (a record without one, or with 0, gives 24).
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
    /// Validates a flavour name. Flavours select vendor plugins and appear
    /// in messages and metrics labels, so they are kept short and plain.
    pub fn parse(value: &str) -> Result<Self, FactError> {
        parse_flavor(value, &Ctx::standalone("guest flavour"))
    }

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

impl VmFacts {
    /// Validates an observation for a fixup that is about to run. `image` is
    /// the probed image kind ([`ImageKind::Unknown`] when the scenario does
    /// not need it).
    ///
    /// Called only when classification asked for a fixup, so a VM that was
    /// not cloned is an error here. The first invalid value wins; every
    /// error names the pod, the field and the value.
    pub fn validate(obs: &Observation, image: ImageKind) -> Result<Self, FactError> {
        let Some(boot) = obs.boot else {
            return Err(FactError::NotCloned {
                pod: obs.pod.clone(),
            });
        };
        Self::validate_as(obs, image, boot)
    }

    /// Validates the observation of a running VM about to be snapshotted
    /// as a parent (the `prepare` scenario): as [`validate`](Self::validate)
    /// does, with boot kind [`BootKind::Parent`] whatever made the VM (a
    /// clone may itself become a parent).
    pub fn for_parent(obs: &Observation, image: ImageKind) -> Result<Self, FactError> {
        Self::validate_as(obs, image, BootKind::Parent)
    }

    fn validate_as(obs: &Observation, image: ImageKind, boot: BootKind) -> Result<Self, FactError> {
        let pod = Some(obs.pod.as_str());
        let name = parse_name(&obs.vm_name, &Ctx::in_pod(pod, obs.vm_name_from.field()))?;
        let id = obs.parse_vm_id()?;
        if obs.nics.len() > MAX_NICS {
            return Err(FactError::TooManyNics {
                pod: obs.pod.clone(),
                count: obs.nics.len(),
            });
        }
        let mut nics = Vec::with_capacity(obs.nics.len());
        let mut seen: BTreeMap<[u8; 6], usize> = BTreeMap::new();
        for (i, raw) in obs.nics.iter().enumerate() {
            let nic = validate_nic(pod, i, raw)?;
            match seen.entry(nic.mac.0) {
                Entry::Occupied(first) => {
                    return Err(FactError::DuplicateMac {
                        pod: obs.pod.clone(),
                        mac: nic.mac,
                        first: *first.get(),
                        second: i,
                    });
                }
                Entry::Vacant(slot) => {
                    slot.insert(i);
                }
            }
            nics.push(nic);
        }
        let flavor = obs
            .flavor
            .as_deref()
            .map(|f| {
                parse_flavor(
                    f,
                    &Ctx::in_pod(pod, format!("annotation {}", annotations::GUEST_FLAVOR)),
                )
            })
            .transpose()?;
        Ok(VmFacts {
            name,
            id,
            backend: obs.backend,
            os: obs.os,
            image,
            boot,
            nics,
            flavor,
        })
    }
}

/// How the IP wait finds the guest's address: the first NIC's static IP,
/// or its MAC's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WaitNic {
    Static(Ipv4Addr),
    Lease(MacAddr),
}

/// What the IP wait needs, and nothing more: the VM id, the first NIC and
/// the OS (spec section 2, "validate only what the path uses"). A pod that
/// needs no fixup is never failed over a fact only a plan would use (a VM
/// name that is no hostname, an odd MAC on a second NIC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitFacts {
    pub id: VmId,
    /// The VM's name as the record has it, escaped, for messages only.
    pub name: String,
    pub os: GuestOs,
    /// `None` when the VM has no NIC: there is no IP to wait for.
    pub first: Option<WaitNic>,
}

impl WaitFacts {
    /// Validates the id and the one value of the first NIC the wait reads.
    pub fn validate(obs: &Observation) -> Result<Self, FactError> {
        let pod = Some(obs.pod.as_str());
        let id = obs.parse_vm_id()?;
        let first = match obs.nics.first() {
            None => None,
            Some(raw) if raw.is_static() => Some(WaitNic::Static(
                raw.ip.parse::<Ipv4Addr>().map_err(|_| {
                    Ctx::in_pod(pod, "network_configs[0].network.ip".to_owned()).invalid(
                        &raw.ip,
                        "is not a dotted-quad IPv4 address",
                        FIX_NET,
                    )
                })?,
            )),
            Some(raw) => Some(WaitNic::Lease(parse_mac(
                &raw.mac,
                &Ctx::in_pod(pod, "network_configs[0].mac".to_owned()),
            )?)),
        };
        Ok(WaitFacts {
            id,
            name: escape_controls(&obs.vm_name),
            os: obs.os,
            first,
        })
    }

    /// The same view of facts already validated for a plan.
    pub fn from_facts(facts: &VmFacts) -> Self {
        WaitFacts {
            id: facts.id.clone(),
            name: facts.name.to_string(),
            os: facts.os,
            first: facts.nics.first().map(|nic| match nic.static_ipv4 {
                Some(s) => WaitNic::Static(s.address),
                None => WaitNic::Lease(nic.mac),
            }),
        }
    }
}

pub(crate) fn pod_prefix(pod: &Option<String>) -> String {
    pod.as_ref()
        .map(|p| format!("pod {p}: "))
        .unwrap_or_default()
}

/// Shows a value escaped (`{:?}`, so control characters and quotes are
/// visible) and cut to [`SHOWN_CHARS`] characters.
pub(crate) fn shown(value: &str) -> String {
    match value.char_indices().nth(SHOWN_CHARS) {
        None => format!("{value:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &value[..cut], value.len()),
    }
}

/// Where a value being validated came from, for error messages.
pub(crate) struct Ctx<'a> {
    pod: Option<&'a str>,
    field: String,
}

impl<'a> Ctx<'a> {
    fn standalone(field: &str) -> Self {
        Ctx {
            pod: None,
            field: field.to_owned(),
        }
    }

    pub(crate) fn in_pod(pod: Option<&'a str>, field: String) -> Self {
        Ctx { pod, field }
    }

    fn missing(&self, fix: &'static str) -> FactError {
        FactError::Missing {
            pod: self.pod.map(str::to_owned),
            field: self.field.clone(),
            fix,
        }
    }

    fn invalid(&self, value: &str, rule: &'static str, fix: &'static str) -> FactError {
        self.invalid_shown(shown(value), rule, fix)
    }

    fn invalid_shown(&self, value: String, rule: &'static str, fix: &'static str) -> FactError {
        FactError::Invalid {
            pod: self.pod.map(str::to_owned),
            field: self.field.clone(),
            value,
            rule,
            fix,
        }
    }
}

pub(crate) const FIX_NAME: &str = "the stack names the VM after the pod's namespace and name, and cocoon keeps the name as config.name in `cocoon vm inspect <id> --json`: pass that output unmodified, or recreate the pod through its controller so that the stack names its VM";

pub(crate) const FIX_HOSTNAME: &str = "a Linux plan writes the VM name as the guest's hostname, which must be dot-separated RFC 1123 labels of at most 63 bytes in all (a Windows plan writes none); the stack names the VM after the pod's namespace and name, so the stack must give this pod a name that makes such a VM name: a shorter namespace or pod name (for a CocoonSet, a shorter CocoonSet name)";

pub(crate) fn parse_name(value: &str, ctx: &Ctx<'_>) -> Result<VmName, FactError> {
    if value.is_empty() {
        return Err(ctx.missing(FIX_NAME));
    }
    if value.len() > MAX_VM_NAME_LEN {
        return Err(ctx.invalid(value, "is longer than 327 bytes", FIX_NAME));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    {
        return Err(ctx.invalid(
            value,
            "may only hold ASCII letters, digits, '-', '.' and '_'",
            FIX_NAME,
        ));
    }
    if !value.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !value.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err(ctx.invalid(value, "must start and end with a letter or digit", FIX_NAME));
    }
    Ok(VmName(value.to_owned()))
}

pub(crate) const FIX_ID: &str =
    "check `id` in `cocoon vm inspect <id> --json` and annotation vm.cocoonstack.io/id";

pub(crate) fn parse_id(value: &str, ctx: &Ctx<'_>) -> Result<VmId, FactError> {
    if value.is_empty() {
        return Err(ctx.missing(FIX_ID));
    }
    if value.len() > MAX_VM_ID_LEN {
        return Err(ctx.invalid(value, "is longer than 128 characters", FIX_ID));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(ctx.invalid(
            value,
            "may only hold A-Z, a-z, 0-9, '.', '_' and '-' (one path component)",
            FIX_ID,
        ));
    }
    if value.starts_with('-') || value.starts_with('.') {
        return Err(ctx.invalid(value, "must not start with '-' or '.'", FIX_ID));
    }
    if value.contains("..") {
        return Err(ctx.invalid(value, "must not contain \"..\"", FIX_ID));
    }
    Ok(VmId(value.to_owned()))
}

pub(crate) const FIX_MAC: &str =
    "give the NIC a unicast MAC like 52:54:00:12:34:56 in cocoon's network config";

pub(crate) fn parse_mac(value: &str, ctx: &Ctx<'_>) -> Result<MacAddr, FactError> {
    if value.is_empty() {
        return Err(ctx.missing(FIX_MAC));
    }
    let Some(octets) = mac_octets(value) else {
        return Err(ctx.invalid(
            value,
            "is not six two-digit hex groups separated by ':'",
            FIX_MAC,
        ));
    };
    if octets[0] & 1 == 1 {
        return Err(ctx.invalid(value, "is a multicast address", FIX_MAC));
    }
    if octets == [0; 6] {
        return Err(ctx.invalid(value, "is all zeros", FIX_MAC));
    }
    Ok(MacAddr(octets))
}

pub(crate) fn mac_octets(value: &str) -> Option<[u8; 6]> {
    let mut groups = value.split(':');
    let mut octets = [0u8; 6];
    for octet in &mut octets {
        let group = groups.next()?;
        if group.len() != 2 || !group.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        *octet = u8::from_str_radix(group, 16).ok()?;
    }
    groups.next().is_none().then_some(octets)
}

pub(crate) const FIX_FLAVOR: &str = "use a flavour name like `ubuntu` (1..=63 of a-z, 0-9, '-', '.', '_'), or remove annotation vm.cocoonstack.io/guest-flavor";

pub(crate) fn parse_flavor(value: &str, ctx: &Ctx<'_>) -> Result<Flavor, FactError> {
    if value.is_empty() {
        return Err(ctx.missing(FIX_FLAVOR));
    }
    if value.len() > MAX_LABEL_LEN {
        return Err(ctx.invalid(value, "is longer than 63 characters", FIX_FLAVOR));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b'_'))
    {
        return Err(ctx.invalid(
            value,
            "may only hold a-z, 0-9, '-', '.' and '_'",
            FIX_FLAVOR,
        ));
    }
    Ok(Flavor(value.to_owned()))
}

/// The prefix length of a static NIC whose record has none (or 0).
pub const DEFAULT_PREFIX: u8 = 24;

pub(crate) const FIX_NET: &str =
    "fix the NIC's network in cocoon's network config, or leave `ip` empty for DHCP";

pub(crate) fn validate_nic(pod: Option<&str>, i: usize, raw: &RawNic) -> Result<Nic, FactError> {
    let field = |name: &str| Ctx::in_pod(pod, format!("network_configs[{i}].{name}"));
    let mac = parse_mac(&raw.mac, &field("mac"))?;
    Ok(Nic {
        mac,
        static_ipv4: validate_static(pod, i, raw)?,
    })
}

/// A NIC's static values, `None` for DHCP (whose prefix and gateway mean
/// nothing and are not checked).
pub(crate) fn validate_static(
    pod: Option<&str>,
    i: usize,
    raw: &RawNic,
) -> Result<Option<StaticIpv4>, FactError> {
    let field = |name: &str| Ctx::in_pod(pod, format!("network_configs[{i}].{name}"));
    if !raw.is_static() {
        return Ok(None);
    }
    let ipv4 = |value: &str, ctx: &Ctx<'_>| {
        value
            .parse::<Ipv4Addr>()
            .map_err(|_| ctx.invalid(value, "is not a dotted-quad IPv4 address", FIX_NET))
    };
    let address = ipv4(&raw.ip, &field("network.ip"))?;
    let prefix_ctx = field("network.prefix");
    // cocoon leaves a 0 prefix out (`omitempty`), so absent and 0 both
    // mean unknown, taken as 24 as the stack's console pass takes it
    // (spec section 2); a present prefix must be a usable length.
    let prefix = match raw.prefix {
        None | Some(0) => DEFAULT_PREFIX,
        Some(p) => u8::try_from(p)
            .ok()
            .filter(|p| (1..=32).contains(p))
            .ok_or_else(|| prefix_ctx.invalid_shown(p.to_string(), "is outside 1..=32", FIX_NET))?,
    };
    let gateway = if raw.gateway.is_empty() {
        None
    } else {
        Some(ipv4(&raw.gateway, &field("network.gateway"))?)
    };
    Ok(Some(StaticIpv4 {
        address,
        prefix,
        gateway,
    }))
}

/// The static values of every NIC, in inspect order (`None` for DHCP),
/// validated: all the serial-console pass of spec section 10 reads besides
/// the VM id. MACs are not looked at.
pub fn static_nics(obs: &Observation) -> Result<Vec<Option<StaticIpv4>>, FactError> {
    let pod = Some(obs.pod.as_str());
    if obs.nics.len() > MAX_NICS {
        return Err(FactError::TooManyNics {
            pod: obs.pod.clone(),
            count: obs.nics.len(),
        });
    }
    obs.nics
        .iter()
        .enumerate()
        .map(|(i, raw)| validate_static(pod, i, raw))
        .collect()
}
