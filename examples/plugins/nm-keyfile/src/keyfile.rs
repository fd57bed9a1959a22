//! NetworkManager keyfiles matched by MAC, and the commands that make
//! NetworkManager use them.
//!
//! A clone's NICs may come up under new names (`eth0` becomes `eth1`), so
//! every connection here is bound to its NIC by `mac-address=` and named
//! after the MAC: connection `cocoon-<12 lowercase hex digits>` in
//! `/etc/NetworkManager/system-connections/cocoon-<hex>.nmconnection`.
//! Files are written byte for byte by the host, never through a shell.
//!
//! Applying them takes two commands, both `nmcli`, both reporting failure
//! through their exit code:
//!
//! 1. `nmcli connection reload` once: NetworkManager reads the keyfiles
//!    again, forgetting the removed ones and learning the new ones. It does
//!    not activate anything by itself.
//! 2. `nmcli connection up id cocoon-<hex>` per NIC: activates the
//!    connection on the device with that MAC, replacing whatever the clone
//!    had active there (the source VM's address). A NIC missing from the
//!    guest fails here, naming the connection. A static connection is
//!    waited for (`--wait 30`: activation takes well under a second once the
//!    link is up; 30 s keeps a stuck link inside the host's per-exec
//!    timeout, and the retry loop tries again). A DHCP connection is not
//!    (`--wait 0`: nmcli returns once NetworkManager accepted the
//!    activation); the lease is the host's IP wait's business, as it is
//!    with systemd-networkd.
//!
//! Restarting NetworkManager or `nmcli networking off`/`on` would also do,
//! but they drop every connection in the guest and leave the choice of
//! profile to autoconnect; naming each connection does neither.

use cocoon_fixup_sdk::{GuestPolicy, MacAddress, Nic, Phase, StaticIpv4, Step};

use crate::uuid;

/// The directory NetworkManager reads keyfile connections from.
pub const CONNECTIONS_DIR: &str = "/etc/NetworkManager/system-connections";

/// What [`remove_stale`] deletes: only the keyfiles this plugin writes.
/// Profiles the image brought are left alone; the connections activated
/// below take their devices over, and [`AUTOCONNECT_PRIORITY`] keeps them
/// ahead at the next boot.
pub const STALE_GLOB: &str = "/etc/NetworkManager/system-connections/cocoon-*.nmconnection";

/// NetworkManager ignores a keyfile that anyone but root can read.
pub const MODE: u32 = 0o600;

/// At boot NetworkManager autoconnects, per device, the matching profile
/// with the highest priority; the image's own profiles have the default, 0.
pub const AUTOCONNECT_PRIORITY: i32 = 100;

/// Seconds `nmcli` waits for a static connection to activate.
pub const STATIC_WAIT_SECS: u32 = 30;

/// The connection id for `mac`: `cocoon-525400123456`.
pub fn connection_id(mac: &MacAddress) -> String {
    format!("cocoon-{}", mac.hex_no_colons())
}

/// The keyfile path for `mac`.
pub fn file_path(mac: &MacAddress) -> String {
    format!("{CONNECTIONS_DIR}/{}.nmconnection", connection_id(mac))
}

/// The connection UUID for `mac`: name-based, so the same on every run.
pub fn connection_uuid(mac: &MacAddress) -> String {
    uuid::v5(&uuid::NAMESPACE, mac.to_string().as_bytes())
}

/// The keyfile for `mac`: a static address (and gateway, when there is one)
/// when `ipv4` is given, DHCPv4 otherwise. IPv6 is left off, as the
/// networkd plugin leaves it.
pub fn content(mac: &MacAddress, ipv4: Option<&StaticIpv4>) -> String {
    let mut text = format!(
        "[connection]\nid={id}\nuuid={uuid}\ntype=ethernet\nautoconnect=true\nautoconnect-priority={AUTOCONNECT_PRIORITY}\n\n[ethernet]\nmac-address={mac}\n\n[ipv4]\n",
        id = connection_id(mac),
        uuid = connection_uuid(mac),
    );
    match ipv4 {
        Some(ipv4) => {
            text.push_str("method=manual\n");
            text.push_str(&format!("address1={}/{}", ipv4.address, ipv4.prefix));
            if let Some(gateway) = ipv4.gateway {
                text.push_str(&format!(",{gateway}"));
            }
            text.push('\n');
        }
        // The client identifier is the MAC, so the lease follows the NIC,
        // not the machine id the clone inherited.
        None => text.push_str("method=auto\ndhcp-client-id=mac\n"),
    }
    text.push_str("\n[ipv6]\nmethod=ignore\n");
    text
}

/// What the steps of this module do in the guest: write and remove
/// [`STALE_GLOB`] keyfiles, reload NetworkManager, bring a connection up.
pub fn policy() -> GuestPolicy {
    GuestPolicy::new()
        .writes([STALE_GLOB, CLONE_FILE])
        .removes([STALE_GLOB])
        .runs([
            vec!["nmcli", "connection", "reload"],
            vec!["nmcli", "--wait", "*"],
        ])
}

/// Removes the keyfiles this plugin wrote for the source VM's MACs.
pub fn remove_stale() -> Step {
    Step::remove_files(
        "remove stale cocoon NetworkManager keyfiles",
        Phase::Configure,
        [STALE_GLOB],
    )
}

/// The keyfile for `nic`: static when it has a static address, DHCP
/// otherwise.
pub fn file_for(nic: &Nic) -> Step {
    let kind = if nic.static_ipv4.is_some() {
        "static"
    } else {
        "DHCP"
    };
    Step::write_file(
        format!("write the {kind} NetworkManager keyfile for {}", nic.mac),
        Phase::Configure,
        file_path(&nic.mac),
        content(&nic.mac, nic.static_ipv4.as_ref()),
        Some(MODE),
    )
}

/// A DHCP keyfile for `mac`, whatever the NIC was configured with before.
pub fn dhcp_file_for(mac: &MacAddress) -> Step {
    file_for(&Nic {
        mac: *mac,
        static_ipv4: None,
    })
}

/// The connection [`prepare`] writes into a parent.
pub const CLONE_ID: &str = "cocoon-clone";

/// Its file: outside [`STALE_GLOB`], so a clone's fixup keeps it and the
/// clone is prepared in turn should it become a parent.
pub const CLONE_FILE: &str = "/etc/NetworkManager/system-connections/cocoon_clone.nmconnection";

/// Below the image's own profiles (0) and this plugin's per-NIC ones
/// ([`AUTOCONNECT_PRIORITY`]): the clone connection is taken only by a
/// device nothing else matches.
pub const CLONE_PRIORITY: i32 = -100;

/// The keyfile for a parent's clones: DHCPv4 on any virtio Ethernet NIC
/// but the parent's own (`parents`, denied by MAC), matched by driver
/// instead of a MAC (a clone's NIC has a new one), on as many devices at
/// once as match (`multi-connect=3`), with the MAC as the DHCP client
/// identifier instead of the machine id every clone shares.
pub fn clone_content(parents: &[MacAddress]) -> String {
    let denied: Vec<String> = parents.iter().map(ToString::to_string).collect();
    let ethernet = if denied.is_empty() {
        String::new()
    } else {
        format!("mac-address-blacklist={};\n", denied.join(";"))
    };
    format!(
        "[connection]\nid={CLONE_ID}\nuuid={uuid}\ntype=ethernet\nautoconnect=true\nautoconnect-priority={CLONE_PRIORITY}\nmulti-connect=3\n\n[ethernet]\n{ethernet}\n[match]\ndriver=virtio_net\n\n[ipv4]\nmethod=auto\ndhcp-client-id=mac\n\n[ipv6]\nmethod=ignore\n",
        uuid = uuid::v5(&uuid::NAMESPACE, CLONE_ID.as_bytes()),
    )
}

/// The `prepare` plan for a parent whose NICs have `parents` MACs: the
/// clone keyfile, then the reload, which makes the running NetworkManager
/// know it without activating anything (the parent's own connection stays
/// up). Writing it again changes nothing.
pub fn prepare(parents: &[MacAddress]) -> Vec<Step> {
    vec![
        Step::write_file(
            "write the NetworkManager keyfile a clone's new NIC matches",
            Phase::Configure,
            CLONE_FILE,
            clone_content(parents),
            Some(MODE),
        ),
        reload(),
    ]
}

/// Makes NetworkManager read the keyfiles again.
pub fn reload() -> Step {
    Step::run(
        "reload NetworkManager connection files",
        Phase::Configure,
        ["nmcli", "connection", "reload"],
    )
}

/// Activates the connection of `nic`: waits for a static one, only starts a
/// DHCP one (see the module docs).
pub fn up(nic: &Nic) -> Step {
    let id = connection_id(&nic.mac);
    let (description, wait) = match nic.static_ipv4 {
        Some(_) => (
            format!("activate {id} on {}", nic.mac),
            STATIC_WAIT_SECS.to_string(),
        ),
        None => (
            format!("start DHCP with {id} on {}", nic.mac),
            "0".to_owned(),
        ),
    };
    Step::run(
        description,
        Phase::Configure,
        ["nmcli", "--wait", &wait, "connection", "up", "id", &id],
    )
}

/// Starts DHCP on `mac`.
pub fn dhcp_up(mac: &MacAddress) -> Step {
    up(&Nic {
        mac: *mac,
        static_ipv4: None,
    })
}
