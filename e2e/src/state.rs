//! Where a VM's files live below the suite's stand-in cocoon root.
//!
//! The harness plays cocoon: it boots a guest and keeps its state in
//! `<root>/run/<backend>/<vm id>/`, where `<backend>` is `cloudhypervisor`
//! or `firecracker`. That is the directory the host's overlay probe looks
//! at (`<root>/run/cloudhypervisor/<vm id>/overlay.qcow2`, spec section 2),
//! so a cloud-image guest's qcow2 disk is named `overlay.qcow2` there and
//! an OCI guest's disk is not. The shim reads the same directory.

use std::path::{Path, PathBuf};

/// `cocoon vm inspect --json <id>` prints this file.
pub const INSPECT_FILE: &str = "inspect.json";
/// The guest agent's virtio-serial socket.
pub const QGA_SOCKET: &str = "qga.sock";
/// The QMP socket.
pub const QMP_SOCKET: &str = "qmp.sock";
/// The guest's serial console.
pub const SERIAL_LOG: &str = "serial.log";
/// QEMU's own stdout and stderr.
pub const QEMU_LOG: &str = "qemu.log";
/// One line per shim call, in `<root>`.
pub const SHIM_LOG: &str = "shim.log";

/// The hypervisor a VM pretends to run on; it picks the state directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    CloudHypervisor,
    Firecracker,
}

impl Backend {
    /// The `vm.cocoonstack.io/backend` annotation value.
    pub fn annotation(self) -> &'static str {
        match self {
            Backend::CloudHypervisor => "cloud-hypervisor",
            Backend::Firecracker => "firecracker",
        }
    }

    /// The directory below `<root>/run`.
    pub fn run_dir(self) -> &'static str {
        match self {
            Backend::CloudHypervisor => "cloudhypervisor",
            Backend::Firecracker => "firecracker",
        }
    }
}

/// `<root>/run/<backend>/<id>`.
pub fn vm_dir(root: &Path, backend: Backend, id: &str) -> PathBuf {
    root.join("run").join(backend.run_dir()).join(id)
}

/// The state directory of VM `id` under either backend, if it exists.
/// `None` too for an id that is not one plain path component.
pub fn find_vm(root: &Path, id: &str) -> Option<PathBuf> {
    if id.is_empty() || id == "." || id == ".." || id.contains('/') || id.contains('\0') {
        return None;
    }
    [Backend::CloudHypervisor, Backend::Firecracker]
        .into_iter()
        .map(|b| vm_dir(root, b, id))
        .find(|dir| dir.join(INSPECT_FILE).is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_vm_under_either_backend_and_refuses_paths() {
        let root = std::env::temp_dir().join(format!("fixup-e2e-state-{}", std::process::id()));
        let dir = vm_dir(&root, Backend::Firecracker, "vm-1");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(INSPECT_FILE), "{}").unwrap();
        assert_eq!(find_vm(&root, "vm-1"), Some(dir));
        assert_eq!(find_vm(&root, "vm-2"), None);
        for bad in ["", ".", "..", "../vm-1", "a/b"] {
            assert_eq!(find_vm(&root, bad), None, "{bad:?}");
        }
        std::fs::remove_dir_all(&root).unwrap();
    }
}
