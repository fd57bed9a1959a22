//! Housekeeping every Linux plan starts with (spec section 4, steps 1-2).
//!
//! Both steps are typed writes, not shell text: the VM name reaches
//! `/etc/hostname` byte for byte, so no name can inject a command. Before
//! the plan runs, the host checks that a VM name written there is a
//! hostname (dot-separated RFC 1123 labels, at most 63 bytes in all); a
//! plan that writes none never has its VM's name refused.

use crate::{GuestPolicy, Phase, Step, VmFacts};

/// Writing `3` here drops the page cache, dentries and inodes.
pub const DROP_CACHES_PATH: &str = "/proc/sys/vm/drop_caches";

/// Where the guest reads its static hostname from at boot.
pub const HOSTNAME_PATH: &str = "/etc/hostname";

/// The prepare-phase steps of every Linux plan, in order:
///
/// 1. drop the page cache, best effort: a clone's cache holds the source
///    VM's pages, dropping them is only hygiene, and some guests mount
///    `/proc/sys` read-only;
/// 2. write the VM name to `/etc/hostname` (mode 0644), required.
pub fn prelude(facts: &VmFacts) -> Vec<Step> {
    vec![
        Step::write_file(
            "drop the page cache",
            Phase::Prepare,
            DROP_CACHES_PATH,
            "3\n",
            None,
        )
        .best_effort(),
        Step::write_file(
            format!("set the hostname to {}", facts.name),
            Phase::Prepare,
            HOSTNAME_PATH,
            format!("{}\n", facts.name),
            Some(0o644),
        ),
    ]
}

/// What [`prelude`] does in the guest: write [`DROP_CACHES_PATH`] and
/// [`HOSTNAME_PATH`].
pub fn prelude_policy() -> GuestPolicy {
    GuestPolicy::new().writes([DROP_CACHES_PATH, HOSTNAME_PATH])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Action, Backend, BootKind, GuestOs, ImageKind, WriteFile};

    fn facts(name: &str) -> VmFacts {
        VmFacts {
            name: name.into(),
            id: "vm-1".into(),
            backend: Backend::CloudHypervisor,
            os: GuestOs::Linux,
            image: ImageKind::Oci,
            boot: BootKind::Clone,
            nics: Vec::new(),
            flavor: None,
        }
    }

    #[test]
    fn prelude_drops_the_cache_then_sets_the_hostname() {
        assert_eq!(
            prelude(&facts("web-0")),
            vec![
                Step {
                    description: "drop the page cache".into(),
                    phase: Phase::Prepare,
                    best_effort: true,
                    action: Action::WriteFile(WriteFile {
                        path: "/proc/sys/vm/drop_caches".into(),
                        content: "3\n".into(),
                        mode: None,
                        parents: false,
                    }),
                },
                Step {
                    description: "set the hostname to web-0".into(),
                    phase: Phase::Prepare,
                    best_effort: false,
                    action: Action::WriteFile(WriteFile {
                        path: "/etc/hostname".into(),
                        content: "web-0\n".into(),
                        mode: Some(0o644),
                        parents: false,
                    }),
                },
            ]
        );
    }
}
