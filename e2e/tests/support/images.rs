//! The image cache `e2e/images.sh` fills, and the prerequisites check: a
//! scenario run without QEMU, root or an image fails at once with the
//! command that fixes it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// Where `e2e/images.sh` caches images, unless `COCOON_FIXUP_E2E_CACHE`
/// says otherwise. Outside the repository: images are hundreds of MB.
pub const DEFAULT_CACHE: &str = "/var/tmp/cocoon-fixup-e2e";

/// The fix for anything missing.
pub const FIX: &str = "run `just e2e`, or by hand: `sudo bash e2e/host-packages.sh && sudo bash e2e/images.sh`, then `cargo test -p fixup-e2e --test guest -- --ignored --test-threads=1`";

/// Host programs the suite runs.
const TOOLS: [&str; 6] = [
    "qemu-system-x86_64",
    "qemu-img",
    "ip",
    "ping",
    "dnsmasq",
    "genisoimage",
];

pub fn cache_dir() -> PathBuf {
    std::env::var_os("COCOON_FIXUP_E2E_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CACHE))
}

/// A guest image as `images.sh` describes it in `image.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Image {
    pub name: String,
    pub release: String,
    /// The Debian version of cloud-init, empty when the image has none.
    pub cloud_init: String,
    /// The parent VM's network: the clone must end up elsewhere.
    pub golden: Golden,
    #[serde(skip)]
    pub dir: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Golden {
    pub mac: String,
    pub ip: String,
    pub prefix: u8,
    pub gateway: String,
}

impl Image {
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs.raw")
    }
    pub fn kernel(&self) -> PathBuf {
        self.dir.join("vmlinuz")
    }
    pub fn initrd(&self) -> PathBuf {
        self.dir.join("initrd.img")
    }

    fn load(cache: &Path, name: &str) -> Result<Image> {
        let dir = cache.join("images").join(name);
        for file in ["ready", "rootfs.raw", "vmlinuz", "initrd.img", "image.json"] {
            if !dir.join(file).is_file() {
                bail!(
                    "guest image `{name}` is not built ({} missing)",
                    dir.join(file).display()
                );
            }
        }
        let json = std::fs::read_to_string(dir.join("image.json"))?;
        let mut image: Image =
            serde_json::from_str(&json).with_context(|| format!("{}/image.json", dir.display()))?;
        image.dir = dir;
        Ok(image)
    }
}

fn on_path(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .any(|dir| dir.join(tool).is_file())
}

/// Everything a scenario needs, or one error listing what is missing and
/// how to get it.
pub fn require(image: &str) -> Result<Image> {
    let mut missing = Vec::new();
    if !rustix::process::geteuid().is_root() {
        missing.push("root (network namespaces, taps)".to_owned());
    }
    for tool in TOOLS {
        if !on_path(tool) {
            missing.push(format!("`{tool}`"));
        }
    }
    let loaded = Image::load(&cache_dir(), image);
    if let Err(e) = &loaded {
        missing.push(format!("{e:#}"));
    }
    if !missing.is_empty() {
        bail!(
            "end-to-end prerequisites missing: {}; {FIX}",
            missing.join(", ")
        );
    }
    loaded
}
