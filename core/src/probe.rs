//! The disk probe: does the cloudimg qcow2 overlay exist for a VM?
//!
//! Cocoon keeps a cloudimg VM's writable layer at
//! `<cocoon root>/run/cloudhypervisor/<vm id>/overlay.qcow2`; an OCI VM has
//! none (spec section 2). The probe is confined to the cocoon root: the root
//! is opened once as a capability directory, and every lookup below it goes
//! through cap-std, which refuses any path (`..`, an absolute or escaping
//! symlink) that would lead out of it. The id is a validated [`VmId`], so it
//! is always exactly one path component; cap-std is the second fence.

use std::io;
use std::path::{Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::Dir;

use crate::facts::VmId;

/// The cocoon root when none is configured (`--cocoon-root`).
pub const DEFAULT_COCOON_ROOT: &str = "/var/lib/cocoon";

/// Where, below the root, cocoon keeps Cloud Hypervisor VM state.
const CH_RUN_DIR: &str = "run/cloudhypervisor";

/// The overlay's file name inside a VM's state directory.
const OVERLAY_FILE: &str = "overlay.qcow2";

/// Why the overlay probe failed. A probe failure is not "no overlay": the
/// caller must not guess the image kind from a directory it could not read.
/// The I/O error is part of the one-line message, not a `source`.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The cocoon root itself could not be opened.
    #[error(
        "cannot open cocoon root {}: {error}; pass the right directory with `--cocoon-root` (default {DEFAULT_COCOON_ROOT})",
        root.display()
    )]
    OpenRoot { root: PathBuf, error: io::Error },
    /// Looking up the overlay failed for a reason other than its absence,
    /// including a path that would lead outside the root.
    #[error(
        "cannot probe {} below cocoon root {}: {error}; check that nothing on that path is a symlink out of the root, and that the root is readable",
        path.display(),
        root.display()
    )]
    Lookup {
        root: PathBuf,
        /// The overlay path, relative to the root.
        path: PathBuf,
        error: io::Error,
    },
    /// Something other than a regular file sits at the overlay path.
    #[error(
        "{} below cocoon root {} is not a regular file; remove it or check the VM's state directory",
        path.display(),
        root.display()
    )]
    NotAFile { root: PathBuf, path: PathBuf },
}

/// Checks for cloudimg overlays below one cocoon root.
#[derive(Debug)]
pub struct OverlayProbe {
    root: Dir,
    /// The root as given, for messages only; never used to open anything.
    root_path: PathBuf,
}

impl OverlayProbe {
    /// Opens the cocoon root. This is the probe's only use of ambient
    /// authority: everything after it is relative to the opened directory.
    pub fn open(root: impl AsRef<Path>) -> Result<Self, ProbeError> {
        let root_path = root.as_ref().to_path_buf();
        let root = Dir::open_ambient_dir(&root_path, ambient_authority()).map_err(|error| {
            ProbeError::OpenRoot {
                root: root_path.clone(),
                error,
            }
        })?;
        Ok(OverlayProbe { root, root_path })
    }

    /// The root path as given to [`OverlayProbe::open`].
    pub fn root(&self) -> &Path {
        &self.root_path
    }

    /// The overlay's path for `id`, relative to the cocoon root.
    pub fn overlay_path(id: &VmId) -> PathBuf {
        Path::new(CH_RUN_DIR).join(id.as_str()).join(OVERLAY_FILE)
    }

    /// Whether `id`'s overlay exists below the root. A missing file (or a
    /// missing directory on the way) is `Ok(false)`; symlinks inside the
    /// root are followed, a symlink leading out of it is an error.
    pub fn overlay_exists(&self, id: &VmId) -> Result<bool, ProbeError> {
        let path = Self::overlay_path(id);
        match self.root.metadata(&path) {
            Ok(meta) if meta.is_file() => Ok(true),
            Ok(_) => Err(ProbeError::NotAFile {
                root: self.root_path.clone(),
                path,
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(error) => Err(ProbeError::Lookup {
                root: self.root_path.clone(),
                path,
                error,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use std::fs;
    use std::os::unix::fs::symlink;

    fn id(s: &str) -> VmId {
        VmId::parse(s).unwrap()
    }

    /// A cocoon root with a state directory for `vm-a`.
    fn root() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("run/cloudhypervisor/vm-a")).unwrap();
        dir
    }

    #[test]
    fn overlay_exists() {
        let dir = root();
        fs::write(
            dir.path().join("run/cloudhypervisor/vm-a/overlay.qcow2"),
            b"QFI\xfb",
        )
        .unwrap();
        let probe = OverlayProbe::open(dir.path()).unwrap();
        assert!(probe.overlay_exists(&id("vm-a")).unwrap());
    }

    #[rstest]
    #[case::no_overlay("vm-a")]
    #[case::no_vm_dir("vm-b")]
    fn overlay_missing(#[case] vm: &str) {
        let dir = root();
        let probe = OverlayProbe::open(dir.path()).unwrap();
        assert!(!probe.overlay_exists(&id(vm)).unwrap());
    }

    #[test]
    fn no_run_dir_means_no_overlay() {
        let dir = tempfile::tempdir().unwrap();
        let probe = OverlayProbe::open(dir.path()).unwrap();
        assert!(!probe.overlay_exists(&id("vm-a")).unwrap());
    }

    #[test]
    fn symlink_inside_root_is_followed() {
        let dir = root();
        fs::write(dir.path().join("shared.qcow2"), b"").unwrap();
        symlink(
            "../../../shared.qcow2",
            dir.path().join("run/cloudhypervisor/vm-a/overlay.qcow2"),
        )
        .unwrap();
        let probe = OverlayProbe::open(dir.path()).unwrap();
        assert!(probe.overlay_exists(&id("vm-a")).unwrap());
    }

    /// Escaping symlinks point at a real file outside the root, so following
    /// them would say `true`: the probe must fail instead.
    #[rstest]
    #[case::relative_file("overlay", false)]
    #[case::absolute_file("overlay", true)]
    #[case::relative_vm_dir("vm", false)]
    #[case::absolute_vm_dir("vm", true)]
    fn symlink_escaping_root_is_rejected(#[case] link: &str, #[case] absolute: bool) {
        let outside = tempfile::tempdir().unwrap();
        fs::create_dir(outside.path().join("vm-a")).unwrap();
        fs::write(outside.path().join("vm-a/overlay.qcow2"), b"").unwrap();
        let dir = root();
        let run = dir.path().join("run/cloudhypervisor");
        let (at, target) = match link {
            "overlay" => (
                run.join("vm-a/overlay.qcow2"),
                outside.path().join("vm-a/overlay.qcow2"),
            ),
            _ => {
                fs::remove_dir(run.join("vm-a")).unwrap();
                (run.join("vm-a"), outside.path().join("vm-a"))
            }
        };
        let target = if absolute {
            target
        } else {
            // From `at`'s directory up to `/`, then down to the target.
            let depth = at.parent().unwrap().components().count() - 1;
            let mut rel = PathBuf::new();
            for _ in 0..depth {
                rel.push("..");
            }
            rel.join(target.strip_prefix("/").unwrap())
        };
        assert!(
            at.parent().unwrap().join(&target).exists(),
            "the link works outside cap-std"
        );
        symlink(&target, &at).unwrap();
        let probe = OverlayProbe::open(dir.path()).unwrap();
        let err = probe.overlay_exists(&id("vm-a")).unwrap_err();
        assert!(matches!(err, ProbeError::Lookup { .. }), "{err:?}");
        assert!(err.to_string().contains("symlink out of the root"), "{err}");
    }

    #[test]
    fn directory_at_overlay_path_is_an_error() {
        let dir = root();
        fs::create_dir(dir.path().join("run/cloudhypervisor/vm-a/overlay.qcow2")).unwrap();
        let probe = OverlayProbe::open(dir.path()).unwrap();
        let err = probe.overlay_exists(&id("vm-a")).unwrap_err();
        assert!(matches!(err, ProbeError::NotAFile { .. }), "{err:?}");
    }

    #[test]
    fn missing_root_names_path_and_flag() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-root");
        let err = OverlayProbe::open(&missing).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains(&missing.display().to_string()),
            "{message}"
        );
        assert!(
            message.ends_with(
                "pass the right directory with `--cocoon-root` (default /var/lib/cocoon)"
            ),
            "{message}"
        );
    }

    #[test]
    fn overlay_path_is_below_run_dir() {
        assert_eq!(
            OverlayProbe::overlay_path(&id("vm-a")),
            Path::new("run/cloudhypervisor/vm-a/overlay.qcow2")
        );
    }

    /// The ids that could escape the root never become a [`VmId`], so they
    /// never reach the probe.
    #[rstest]
    #[case::empty("")]
    #[case::parent("../x")]
    #[case::nested("a/b")]
    #[case::absolute("/abs")]
    #[case::option("-rf")]
    #[case::dotdot("..")]
    #[case::dot(".")]
    #[case::inner_parent("a/../../b")]
    fn escaping_ids_are_rejected(#[case] value: &str) {
        assert!(VmId::parse(value).is_err(), "{value:?}");
    }
}
