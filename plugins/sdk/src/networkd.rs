//! systemd-networkd configuration matched by MAC (spec section 4, steps 4-5),
//! and the file that prepares a parent for its clones ([`prepare`]).
//!
//! A clone's NICs may come up under new names (`eth0` becomes `eth1`), so
//! every file a fixup writes matches on `MACAddress=` and is named after
//! the MAC: `/etc/systemd/network/10-<12 lowercase hex digits>.network`.
//! File content is written byte for byte, never through `printf` or a
//! shell.

use crate::{GuestPolicy, MacAddress, Nic, Phase, StaticIpv4, Step};

/// The directory networkd reads administrator configuration from.
pub const NETWORK_DIR: &str = "/etc/systemd/network";

/// What [`remove_stale`] deletes: every `10-` file, which covers the ones
/// this module writes for the source VM's MACs and cloud-init's
/// `10-cloud-init-*.network`.
pub const STALE_GLOB: &str = "/etc/systemd/network/10-*.network";

/// Removes the generated `10-*.network` files the clone inherited, so that
/// no file keyed to the source VM's MACs survives.
pub fn remove_stale() -> Step {
    Step::remove_files(
        "remove stale systemd-networkd files",
        Phase::Configure,
        [STALE_GLOB],
    )
}

/// The restart [`restart`] runs.
pub const RESTART: [&str; 3] = ["systemctl", "restart", "systemd-networkd"];

/// What the steps of this module do in the guest: write and remove
/// [`STALE_GLOB`] files, run [`RESTART`].
pub fn policy() -> GuestPolicy {
    GuestPolicy::new()
        .writes([STALE_GLOB])
        .removes([STALE_GLOB])
        .runs([RESTART])
}

/// The file [`prepare`] writes into a parent. networkd takes the first
/// file in lexical order that matches a link, so every `10-` file (the
/// parent's own NICs, a clone's fixup) wins over it: it serves only a NIC
/// that nothing else names, such as the NIC a clone is given in place of
/// its parent's.
pub const CLONE_FILE: &str = "/etc/systemd/network/99-cocoon-clone.network";

/// What [`CLONE_FILE`] holds: DHCPv4 on every virtio Ethernet NIC that is
/// not one of the parent's own (`parents`, excluded by MAC whatever the
/// order networkd reads the parent's files in), matched by what a clone
/// keeps (the link type and the driver) rather than by a MAC, with the MAC
/// as the DHCP client identifier rather than a DUID from the machine id
/// every clone shares, so each clone gets its own lease.
pub fn clone_content(parents: &[MacAddress]) -> String {
    let mut content = String::from("[Match]\nType=ether\nDriver=virtio_net\n");
    if !parents.is_empty() {
        let macs: Vec<String> = parents.iter().map(ToString::to_string).collect();
        content += &format!("MACAddress=!{}\n", macs.join(" "));
    }
    content + "\n[Network]\nDHCP=ipv4\n\n[DHCPv4]\nClientIdentifier=mac\n"
}

/// The command that makes a running networkd read its files again without
/// restarting it: a link whose configuration did not change is left as it
/// is, so the parent keeps its network.
pub const RELOAD: [&str; 2] = ["networkctl", "reload"];

/// The `prepare` plan for a guest on systemd-networkd whose NICs have
/// `parents` MACs: [`CLONE_FILE`], then [`RELOAD`], so the running parent
/// (and so every snapshot of it) has the file loaded. The parent's own
/// files are left as they are, and its own NICs never match the new one.
/// Writing the same file again and reloading changes nothing.
pub fn prepare(parents: &[MacAddress]) -> Vec<Step> {
    vec![
        Step::write_file(
            "write the network file a clone's new NIC matches",
            Phase::Configure,
            CLONE_FILE,
            clone_content(parents),
            Some(0o644),
        ),
        Step::run(
            "make systemd-networkd read its files again",
            Phase::Configure,
            RELOAD,
        ),
    ]
}

/// What [`prepare`] does in the guest.
pub fn prepare_policy() -> GuestPolicy {
    GuestPolicy::new().writes([CLONE_FILE]).runs([RELOAD])
}

/// The path of the file for `mac`.
pub fn file_path(mac: &MacAddress) -> String {
    format!("{NETWORK_DIR}/10-{}.network", mac.hex_no_colons())
}

/// A static address (and default gateway, when there is one) for the NIC
/// with `mac`.
pub fn static_content(mac: &MacAddress, ipv4: &StaticIpv4) -> String {
    let mut content = format!(
        "[Match]\nMACAddress={mac}\n\n[Network]\nAddress={}/{}\n",
        ipv4.address, ipv4.prefix
    );
    if let Some(gateway) = ipv4.gateway {
        content.push_str(&format!("Gateway={gateway}\n"));
    }
    content
}

/// DHCPv4 for the NIC with `mac`. The client identifier is the MAC, so the
/// lease follows the NIC rather than the machine id the clone inherited.
pub fn dhcp_content(mac: &MacAddress) -> String {
    format!("[Match]\nMACAddress={mac}\n\n[Network]\nDHCP=ipv4\n\n[DHCPv4]\nClientIdentifier=mac\n")
}

/// The file for `nic`: static when it has a static address, DHCP otherwise.
pub fn file_for(nic: &Nic) -> Step {
    match &nic.static_ipv4 {
        Some(ipv4) => write(
            format!("write the static network file for {}", nic.mac),
            &nic.mac,
            static_content(&nic.mac, ipv4),
        ),
        None => dhcp_file_for(&nic.mac),
    }
}

/// A DHCP file for `mac`, whatever the NIC was configured with before.
pub fn dhcp_file_for(mac: &MacAddress) -> Step {
    write(
        format!("write the DHCP network file for {mac}"),
        mac,
        dhcp_content(mac),
    )
}

/// Restarts networkd so it reads the new files.
pub fn restart() -> Step {
    Step::run("restart systemd-networkd", Phase::Configure, RESTART)
}

fn write(description: String, mac: &MacAddress, content: String) -> Step {
    Step::write_file(
        description,
        Phase::Configure,
        file_path(mac),
        content,
        Some(0o644),
    )
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;
    use crate::{Action, Ipv4Address, WriteFile};

    const MAC: MacAddress = MacAddress::new([0x52, 0x54, 0x00, 0xAB, 0xCD, 0xEF]);

    fn static_nic(gateway: Option<[u8; 4]>) -> Nic {
        Nic {
            mac: MAC,
            static_ipv4: Some(StaticIpv4 {
                address: Ipv4Address::new([10, 0, 0, 7]),
                prefix: 24,
                gateway: gateway.map(Ipv4Address::new),
            }),
        }
    }

    fn configure_write(description: &str, content: &str) -> Step {
        Step {
            description: description.into(),
            phase: Phase::Configure,
            best_effort: false,
            action: Action::WriteFile(WriteFile {
                path: "/etc/systemd/network/10-525400abcdef.network".into(),
                content: content.into(),
                mode: Some(0o644),
                parents: false,
            }),
        }
    }

    #[test]
    fn remove_stale_removes_every_10_file() {
        assert_eq!(
            remove_stale(),
            Step {
                description: "remove stale systemd-networkd files".into(),
                phase: Phase::Configure,
                best_effort: false,
                action: Action::RemoveFiles(vec!["/etc/systemd/network/10-*.network".into()]),
            }
        );
    }

    #[test]
    fn file_path_uses_the_bare_lowercase_mac() {
        assert_eq!(
            file_path(&MAC),
            "/etc/systemd/network/10-525400abcdef.network"
        );
    }

    #[rstest]
    #[case::with_gateway(
        Some([10, 0, 0, 1]),
        "[Match]\nMACAddress=52:54:00:ab:cd:ef\n\n[Network]\nAddress=10.0.0.7/24\nGateway=10.0.0.1\n"
    )]
    #[case::without_gateway(
        None,
        "[Match]\nMACAddress=52:54:00:ab:cd:ef\n\n[Network]\nAddress=10.0.0.7/24\n"
    )]
    fn static_nic_gets_a_static_file(#[case] gateway: Option<[u8; 4]>, #[case] content: &str) {
        assert_eq!(
            file_for(&static_nic(gateway)),
            configure_write(
                "write the static network file for 52:54:00:ab:cd:ef",
                content
            )
        );
    }

    #[test]
    fn dhcp_nic_gets_a_dhcp_file() {
        let expected = configure_write(
            "write the DHCP network file for 52:54:00:ab:cd:ef",
            "[Match]\nMACAddress=52:54:00:ab:cd:ef\n\n[Network]\nDHCP=ipv4\n\n[DHCPv4]\nClientIdentifier=mac\n",
        );
        let nic = Nic {
            mac: MAC,
            static_ipv4: None,
        };
        assert_eq!(file_for(&nic), expected);
        assert_eq!(dhcp_file_for(&MAC), expected);
    }

    #[test]
    fn prepare_writes_the_clone_file_and_reloads() {
        let other = MacAddress::new([0x52, 0x54, 0x00, 0x0a, 0x0b, 0x0d]);
        let steps = prepare(&[MAC, other]);
        assert_eq!(steps.len(), 2);
        let Action::WriteFile(w) = &steps[0].action else {
            panic!("{steps:?}")
        };
        assert_eq!(w.path, "/etc/systemd/network/99-cocoon-clone.network");
        assert_eq!(
            w.content,
            format!(
                "[Match]\nType=ether\nDriver=virtio_net\nMACAddress=!{MAC} {other}\n\n[Network]\nDHCP=ipv4\n\n[DHCPv4]\nClientIdentifier=mac\n"
            ),
            "any virtio NIC but the parent's own"
        );
        assert_eq!(w.mode, Some(0o644));
        // A parent without a NIC excludes none.
        let Action::WriteFile(w) = &prepare(&[])[0].action else {
            panic!()
        };
        assert!(!w.content.contains("MACAddress"), "{}", w.content);
        assert_eq!(
            steps[1].action,
            Action::Run(vec!["networkctl".into(), "reload".into()])
        );
        // It sorts after every file a fixup writes, so those win.
        assert!(CLONE_FILE > file_path(&MAC).as_str());
        assert!(CLONE_FILE > STALE_GLOB);
    }

    #[test]
    fn restart_restarts_networkd() {
        assert_eq!(
            restart(),
            Step {
                description: "restart systemd-networkd".into(),
                phase: Phase::Configure,
                best_effort: false,
                action: Action::Run(vec![
                    "systemctl".into(),
                    "restart".into(),
                    "systemd-networkd".into()
                ]),
            }
        );
    }
}
