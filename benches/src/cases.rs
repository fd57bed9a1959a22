//! The four plan scenarios the benchmarks run, as a pod and a VM each.
//!
//! Every case has a static first NIC, so a fixup flow through the real loop
//! is ready as soon as its fixup is done (the clone storm measures the loop,
//! not the lease file; [`crate::ready`] measures that). Instance `i` of a
//! case gets its own pod name, uid, VM id, MACs and address, so a thousand
//! of them can share one in-memory API server.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use fixup_core::facts::{Observation, Overrides, PodInput, RawNic, VmInspect};
use fixup_core::planner::{Planner, PlannerOptions};
use fixup_core::plugin::EngineOptions;
use fixup_core::plugin::cache::ArtifactCache;

/// The namespace every benchmark pod lives in.
pub const NAMESPACE: &str = "bench";

/// The recorded source image of a cloudimg clone: an http(s) URL makes the
/// guest a cloudimg guest without the disk probe.
pub const CLOUDIMG_SOURCE: &str =
    "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img";

/// A plan scenario, named as the summary table names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Case {
    /// Cloud Hypervisor, OCI image (the disk probe finds no overlay), one
    /// static and one DHCP NIC: `oci-networkd`.
    OciNetworkd,
    /// Cloud Hypervisor, cloud image (source image URL), one static NIC:
    /// `cloudimg`.
    Cloudimg,
    /// Firecracker, OCI image, one static and one DHCP NIC: `fc-mac`
    /// composed with `oci-networkd` (two plugin calls).
    FcMac,
    /// Windows on Cloud Hypervisor, one static NIC: `windows-pnp`.
    WindowsPnp,
}

impl Case {
    pub const ALL: [Case; 4] = [
        Case::OciNetworkd,
        Case::Cloudimg,
        Case::FcMac,
        Case::WindowsPnp,
    ];

    /// The scenario's name, as benchmark ids and the table use it.
    pub fn name(self) -> &'static str {
        match self {
            Case::OciNetworkd => "oci-networkd",
            Case::Cloudimg => "cloudimg",
            Case::FcMac => "fc-mac",
            Case::WindowsPnp => "windows-pnp",
        }
    }

    /// What the plan is made of, for the table.
    pub fn plugins(self) -> &'static str {
        match self {
            Case::OciNetworkd => "oci-networkd",
            Case::Cloudimg => "cloudimg",
            Case::FcMac => "fc-mac + oci-networkd",
            Case::WindowsPnp => "windows-pnp",
        }
    }

    /// The case of storm pod `i`: the four cases in turn.
    pub fn cycle(i: usize) -> Case {
        Case::ALL[i % Case::ALL.len()]
    }

    fn short(self) -> &'static str {
        match self {
            Case::OciNetworkd => "oci",
            Case::Cloudimg => "cim",
            Case::FcMac => "fc",
            Case::WindowsPnp => "win",
        }
    }

    /// The pod name of instance `i`.
    pub fn pod_name(self, i: usize) -> String {
        format!("{}-{i}", self.short())
    }

    /// The VM id of instance `i`.
    pub fn vm_id(self, i: usize) -> String {
        format!("vm-{}{i:06}", self.short())
    }

    /// The VM name the stack derives for instance `i`'s pod.
    pub fn vm_name(self, i: usize) -> String {
        fixup_core::binding::vm_name_for_pod(NAMESPACE, &self.pod_name(i))
    }

    /// The pod of instance `i`, as the API server would return it.
    pub fn pod(self, i: usize) -> PodInput {
        let (backend, os) = match self {
            Case::FcMac => ("firecracker", "linux"),
            Case::WindowsPnp => ("cloud-hypervisor", "windows"),
            Case::OciNetworkd | Case::Cloudimg => ("cloud-hypervisor", "linux"),
        };
        let name = self.pod_name(i);
        let vm_name = self.vm_name(i);
        let annotations: BTreeMap<String, String> = [
            ("cocoonset.cocoonstack.io/managed", "true"),
            ("cocoonset.cocoonstack.io/mode", "clone"),
            ("cocoonset.cocoonstack.io/os", os),
            ("cocoonset.cocoonstack.io/generation", "3"),
            ("vm.cocoonstack.io/name", vm_name.as_str()),
            ("vm.cocoonstack.io/id", self.vm_id(i).as_str()),
            ("vm.cocoonstack.io/backend", backend),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        PodInput {
            name,
            namespace: NAMESPACE.to_owned(),
            uid: Some(uid(self, i)),
            annotations,
            deleting: false,
            resource_version: None,
        }
    }

    /// The static address of instance `i`'s first NIC.
    pub fn address(self, i: usize) -> Ipv4Addr {
        let n = i * Case::ALL.len() + self as usize;
        Ipv4Addr::new(10, 88, (n / 250) as u8, (n % 250 + 2) as u8)
    }

    /// `cocoon vm inspect --json` of instance `i`.
    pub fn inspect_json(self, i: usize) -> String {
        let ip = self.address(i);
        let mut nics = vec![serde_json::json!({
            "mac": mac(self, i, 0),
            "tap": "tap0",
            "network": {"ip": ip.to_string(), "prefix": 16, "gateway": "10.88.0.1"},
        })];
        if matches!(self, Case::OciNetworkd | Case::FcMac) {
            nics.push(serde_json::json!({"mac": mac(self, i, 1), "tap": "tap1"}));
        }
        let config = serde_json::json!({
            "name": self.vm_name(i),
            "image": self.source_image().unwrap_or_default(),
        });
        serde_json::json!({"id": self.vm_id(i), "config": config, "network_configs": nics})
            .to_string()
    }

    /// The parsed inspect output of instance `i`.
    pub fn inspect(self, i: usize) -> VmInspect {
        VmInspect::from_json(&self.inspect_json(i), "bench inspect")
            .expect("the bench inspect JSON is valid")
    }

    /// The source image the snapshot recorded: a URL for cloudimg, unknown
    /// otherwise (the disk probe decides).
    pub fn source_image(self) -> Option<String> {
        (self == Case::Cloudimg).then(|| CLOUDIMG_SOURCE.to_owned())
    }

    /// What `Planner::plan` is given for instance `i`.
    pub fn observation(self, i: usize) -> Observation {
        let overrides = Overrides {
            boot: None,
            source_image: self.source_image(),
        };
        Observation::new(&self.pod(i), &self.inspect(i), &overrides)
    }
}

fn uid(case: Case, i: usize) -> String {
    format!("00000000-0000-4000-8{:03}-{i:012}", case as usize)
}

/// A locally administered unicast MAC, unique per case, instance and NIC.
pub fn mac(case: Case, i: usize, nic: usize) -> String {
    let i = i as u32;
    format!(
        "52:54:{:02x}:{:02x}:{:02x}:{:02x}",
        (case as usize) * 4 + nic,
        (i >> 16) & 0xff,
        (i >> 8) & 0xff,
        i & 0xff
    )
}

/// A DHCP NIC as inspect lists it (for the readiness pods).
pub fn dhcp_nic(mac: &str) -> RawNic {
    RawNic {
        mac: mac.to_owned(),
        tap: "tap0".to_owned(),
        ..RawNic::default()
    }
}

/// A planner with the four built-ins linked and the default engine, probing
/// overlays under `cocoon_root`; `cache_dir` as `--cache-dir` (`None` is
/// `--no-cache`), its key beside it ([`cache_key`]).
pub fn planner(cocoon_root: &Path, cache_dir: Option<PathBuf>) -> anyhow::Result<Planner> {
    let options = PlannerOptions {
        engine: EngineOptions {
            cache_key: cache_dir.as_deref().map(cache_key),
            cache_dir,
            ..EngineOptions::default()
        },
        cocoon_root: cocoon_root.to_owned(),
        plugin_dir: None,
        ..PlannerOptions::default()
    };
    let (planner, failures) = Planner::new(options)?;
    anyhow::ensure!(failures.is_empty(), "plugin load failures: {failures:?}");
    // Every plugin linked now, as the daemon does at start (`serve`): the
    // benchmarks measure a daemon's planner. A one-shot `plan` links only
    // what it calls (the plan-process figure, measured on the binary).
    let unlinked = planner.plugins().warm();
    anyhow::ensure!(unlinked.is_empty(), "plugins not linked: {unlinked:?}");
    Ok(planner)
}

/// The cache key the benchmarks use for `cache_dir`: `cache.key` in a
/// directory beside it (`<dir>-key/`), so that no benchmark makes the
/// machine's default key, and a cache directly under `/tmp` still gets a
/// key directory of its own (a key may not sit in a directory others can
/// write).
pub fn cache_key(cache_dir: &Path) -> PathBuf {
    let mut name = cache_dir.file_name().unwrap_or_default().to_owned();
    name.push("-key");
    cache_dir.with_file_name(name).join("cache.key")
}

/// Fill `cache_dir` with the precompiled built-ins, as the first start of a
/// daemon does, and check that a second start hits every entry.
pub fn warm_cache(cache_dir: &Path) -> anyhow::Result<()> {
    let root = tempfile::tempdir()?;
    let planner = planner(root.path(), Some(cache_dir.to_owned()))?;
    let cache = ArtifactCache::open(
        cache_dir,
        Some(&cache_key(cache_dir)),
        planner.plugins().engine(),
    )?;
    for plugin in planner.plugins().registry().plugins() {
        let path = cache.entry_path(&plugin.sha256);
        anyhow::ensure!(
            path.is_file(),
            "the cache has no entry for {} at {}",
            plugin.info.name,
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_differ_and_parse() {
        for case in Case::ALL {
            let a = case.observation(0);
            let b = case.observation(999);
            assert_ne!(a.vm_id, b.vm_id);
            assert_ne!(a.nics[0].mac, b.nics[0].mac);
            assert_ne!(a.nics[0].ip, b.nics[0].ip);
        }
        let macs: std::collections::BTreeSet<String> = Case::ALL
            .iter()
            .flat_map(|&c| (0..1000).map(move |i| mac(c, i, 0)))
            .collect();
        assert_eq!(macs.len(), 4000);
    }
}
