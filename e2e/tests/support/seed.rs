//! cloud-init NoCloud seed ISOs (volume label `cidata`): the identity a
//! cloud-image VM boots with.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;

use super::net::run;

/// One VM's cloud-init identity: its instance id, hostname and a static
/// IPv4 address on the NIC with `mac` (network config version 1, which
/// every cloud-init version reads).
#[derive(Debug, Clone)]
pub struct Identity<'a> {
    pub instance_id: &'a str,
    pub hostname: &'a str,
    pub mac: &'a str,
    pub ip: &'a str,
    pub prefix: u8,
    pub gateway: &'a str,
}

/// Write `<dir>/<name>.iso` for `id`.
pub fn write(dir: &Path, name: &str, id: &Identity<'_>) -> Result<PathBuf> {
    let files = dir.join(format!("{name}.d"));
    std::fs::create_dir_all(&files)?;
    std::fs::write(
        files.join("meta-data"),
        format!(
            "instance-id: {}\nlocal-hostname: {}\n",
            id.instance_id, id.hostname
        ),
    )?;
    std::fs::write(files.join("user-data"), "#cloud-config\n{}\n")?;
    std::fs::write(
        files.join("network-config"),
        format!(
            "version: 1\nconfig:\n  - type: physical\n    name: eth0\n    mac_address: \"{}\"\n    subnets:\n      - type: static\n        address: {}/{}\n        gateway: {}\n",
            id.mac, id.ip, id.prefix, id.gateway
        ),
    )?;
    let iso = dir.join(format!("{name}.iso"));
    run(Command::new("genisoimage")
        .args(["-quiet", "-volid", "cidata", "-joliet", "-rock", "-output"])
        .arg(&iso)
        .arg(files.join("meta-data"))
        .arg(files.join("user-data"))
        .arg(files.join("network-config")))?;
    Ok(iso)
}
