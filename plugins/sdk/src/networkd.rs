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

/// What [`CLONE_FILE`] holds: DHCPv4 on every virtio Ethernet NIC,
/// matched by what a clone keeps (the link type and the driver) rather
/// than by a MAC, with the MAC as the DHCP client identifier rather than a
/// DUID from the machine id every clone shares, so each clone gets its own
/// lease. The parent's static NICs are kept from it by [`PARENT_FILE`].
pub fn clone_content() -> String {
    "[Match]\nType=ether\nDriver=virtio_net\n\n[Network]\nDHCP=ipv4\n\n[DHCPv4]\nClientIdentifier=mac\n"
        .to_owned()
}

/// The file [`prepare`] writes beside [`CLONE_FILE`], sorting just before
/// it, for a parent with static NICs: those NICs, by MAC (and the type and
/// driver the clone file matches), left unmanaged. networkd has no negated
/// MAC match (it ignores `MACAddress=!...` with a warning), so this is what
/// keeps the clone file from turning a static NIC of the parent's to DHCP:
/// such a NIC that a file sorting earlier configures (its own `10-` file,
/// cloud-init's) keeps that file, and one that no file configures stays as
/// it was, unmanaged. A parent's DHCP NIC is not listed: where no earlier
/// file configures it (a clone that came up on the clone file, with no
/// exec), the clone file keeps serving it as it does. In a clone the file
/// names NICs the clone no longer has, or (Firecracker's frozen MAC) one
/// whose own `10-` file wins until the fixup changes its MAC.
pub const PARENT_FILE: &str = "/etc/systemd/network/99-cocoon-clone-parent.network";

/// What [`PARENT_FILE`] holds for the static NICs with MACs `statics` (at
/// least one).
pub fn parent_content(statics: &[MacAddress]) -> String {
    let macs: Vec<String> = statics.iter().map(ToString::to_string).collect();
    format!(
        "[Match]\nType=ether\nDriver=virtio_net\nMACAddress={}\n\n[Link]\nUnmanaged=yes\n",
        macs.join(" ")
    )
}

/// The command that makes a running networkd read its files again without
/// restarting it: a link whose configuration did not change is left as it
/// is, so the parent keeps its network.
pub const RELOAD: [&str; 2] = ["networkctl", "reload"];

/// The `prepare` plan for a guest on systemd-networkd with `nics`:
/// [`PARENT_FILE`] (when a NIC is static), [`CLONE_FILE`], then
/// [`RELOAD`], so the running parent (and so every snapshot of it) has the
/// files loaded. The parent's own files are left as they are. Writing the
/// same files again and reloading changes nothing.
pub fn prepare(nics: &[Nic]) -> Vec<Step> {
    let statics: Vec<MacAddress> = nics
        .iter()
        .filter(|nic| nic.static_ipv4.is_some())
        .map(|nic| nic.mac)
        .collect();
    let mut steps = Vec::new();
    if !statics.is_empty() {
        steps.push(Step::write_file(
            "write the network file that keeps the parent's static NICs from the clone file",
            Phase::Configure,
            PARENT_FILE,
            parent_content(&statics),
            Some(0o644),
        ));
    }
    steps.push(Step::write_file(
        "write the network file a clone's new NIC matches",
        Phase::Configure,
        CLONE_FILE,
        clone_content(),
        Some(0o644),
    ));
    steps.push(Step::run(
        "make systemd-networkd read its files again",
        Phase::Configure,
        RELOAD,
    ));
    steps
}

/// What [`prepare`] does in the guest.
pub fn prepare_policy() -> GuestPolicy {
    GuestPolicy::new()
        .writes([PARENT_FILE, CLONE_FILE])
        .runs([RELOAD])
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
    fn prepare_keeps_static_nics_from_the_clone_file_and_reloads() {
        let other = MacAddress::new([0x52, 0x54, 0x00, 0x0a, 0x0b, 0x0d]);
        let dhcp = MacAddress::new([0x52, 0x54, 0x00, 0x0a, 0x0b, 0x0e]);
        let ipv4 = StaticIpv4 {
            address: Ipv4Address::new([10, 0, 0, 2]),
            prefix: 24,
            gateway: None,
        };
        let nic = |mac, static_ipv4| Nic { mac, static_ipv4 };
        let nics = [
            nic(MAC, Some(ipv4)),
            nic(dhcp, None),
            nic(other, Some(ipv4)),
        ];
        let steps = prepare(&nics);
        assert_eq!(steps.len(), 3);
        let Action::WriteFile(parent) = &steps[0].action else {
            panic!("{steps:?}")
        };
        assert_eq!(
            parent.path,
            "/etc/systemd/network/99-cocoon-clone-parent.network"
        );
        assert_eq!(
            parent.content,
            format!(
                "[Match]\nType=ether\nDriver=virtio_net\nMACAddress={MAC} {other}\n\n[Link]\nUnmanaged=yes\n"
            ),
            "the parent's static NICs, by MAC, left unmanaged; not its DHCP one"
        );
        let Action::WriteFile(clone) = &steps[1].action else {
            panic!("{steps:?}")
        };
        assert_eq!(clone.path, "/etc/systemd/network/99-cocoon-clone.network");
        assert_eq!(
            clone.content,
            "[Match]\nType=ether\nDriver=virtio_net\n\n[Network]\nDHCP=ipv4\n\n[DHCPv4]\nClientIdentifier=mac\n",
            "any virtio NIC, with no MAC match: networkd has no negated one"
        );
        assert!(!clone.content.contains('!'));
        assert_eq!((parent.mode, clone.mode), (Some(0o644), Some(0o644)));
        assert_eq!(
            steps[2].action,
            Action::Run(vec!["networkctl".into(), "reload".into()])
        );
        // An all-DHCP parent (or one without a NIC) has no NIC to keep: a
        // DHCP NIC no earlier file serves stays on the clone file.
        for nics in [&[nic(dhcp, None)][..], &[]] {
            let bare = prepare(nics);
            assert_eq!(bare.len(), 2);
            assert_eq!(bare[0].action, steps[1].action);
            assert_eq!(bare[1].action, steps[2].action);
        }
        // networkd takes the first file in lexical order (bytewise) that
        // matches: a fixup's files win over both, the parent file over the
        // clone file.
        assert!(PARENT_FILE < CLONE_FILE);
        assert!(PARENT_FILE > file_path(&MAC).as_str());
        assert!(PARENT_FILE > STALE_GLOB);
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
