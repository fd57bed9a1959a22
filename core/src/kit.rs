//! The plugin kit: what a plugin author runs before shipping a plugin.
//!
//! - [`run_cases`] (`cocoon-fixup plugin test PLUGIN.wasm CASES`) calls a
//!   plugin once per case file through the real [`PluginHost`]: the same
//!   sandbox and the same per-call limits as production, a fresh Store for
//!   every case. It compares the result with the case's expectation, shows
//!   a unified diff on a mismatch, reports what each call used against the
//!   limits, and with `--bless` writes the actual results back.
//! - [`Inspector`] (`cocoon-fixup plugin inspect PLUGIN.wasm`) says what a
//!   plugin file is (name, version, contract, digest, scenarios, flavours,
//!   imports) and whether the host would load it, and if not, why and what
//!   to change. A file that does not load is still described as far as the
//!   host got.
//!
//! The kit compiles plugins without the on-disk cache: a plugin under
//! development changes with every build, and an entry per build would only
//! pile up.
//!
//! # Case files
//!
//! A case is one JSON object in a `*.json` file; a folder of cases is every
//! `*.json` file in it (not its subfolders), run in name order. The case's
//! name is its file name without `.json`.
//!
//! ```json
//! {
//!   "description": "one static NIC with a gateway",
//!   "scenario": "oci-networkd",
//!   "facts": {
//!     "name": "web-0",
//!     "id": "vm-0123abcd",
//!     "backend": "cloud-hypervisor",
//!     "os": "linux",
//!     "image": "oci",
//!     "boot": "clone",
//!     "nics": [
//!       {"mac": "52:54:00:12:34:56",
//!        "static_ipv4": {"address": "10.0.0.5", "prefix": 24, "gateway": "10.0.0.1"}}
//!     ],
//!     "flavor": null
//!   },
//!   "expect": {"plan": {"dialect": "posix-sh", "steps": ["..."]}}
//! }
//! ```
//!
//! - `description` (optional): one line for people.
//! - `scenario`: what the host asks for: `cloudimg`, `oci-networkd`,
//!   `fc-mac`, `windows-pnp` or `dhcp-recovery`.
//! - `facts`: the VM facts the host passes to the plugin (the WIT
//!   `vm-facts`): `name` (RFC 1123 label), `id`, `backend`
//!   (`cloud-hypervisor` or `firecracker`), `os` (`linux`, `windows`,
//!   `android`, `unknown`), `image` (`cloudimg`, `oci`, `unknown`), `boot`
//!   (`clone`, `fork`, `wake`, `resumed`), `nics` (in inspect order, each a
//!   `mac` and a `static_ipv4` that is `null` for DHCP; `gateway` may be
//!   `null`) and `flavor` (a guest flavour or `null`). `static_ipv4`,
//!   `gateway` and `flavor` may be left out; `--bless` writes them as `null`.
//!   The facts pass the host's own validation before the plugin sees them,
//!   so an invalid value is an error in the case file, naming the file and
//!   the field, never a plugin failure.
//! - `expect`: exactly one of
//!   - `{"plan": PLAN}`: the plan, as `cocoon-fixup plan --output json`
//!     prints a plan (`dialect` and `steps`, see [`crate::plan`]); compared
//!     as JSON, so key order and spacing do not matter;
//!   - `{"error": {"kind": "unsupported", "reason_contains": "..."}}` or
//!     `{"error": {"kind": "invalid-facts", "field": "nics[0].mac",
//!     "reason_contains": "..."}}`: the plugin declines. `field` and
//!     `reason_contains` are optional; when given, the field must be equal
//!     and the reason must contain the text.
//!
//!   A case without `expect` fails until `--bless` records one.
//! - `context` (optional): an object for people, not compared: where the
//!   case came from. `cocoon-fixup capture` writes one (the pod, the VM,
//!   the plugins, and a failed pod's error chain); `plugin test` prints its
//!   `summary` and `--bless` keeps it as it is.
//!
//! A sandbox breach (fuel, memory, a denied import, a panic, a plan over the
//! plan limits) is always a failure: it cannot be expected or blessed.

use std::fmt;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::classify::Scenario;
use crate::facts::{
    Backend, BootKind, FactError, Flavor, GuestOs, ImageKind, MAX_NICS, MacAddr, Nic, StaticIpv4,
    VmFacts, VmId, VmName,
};
use crate::plan::Plan;
use crate::plan::policy::{GuestPolicy, PolicySource};
use crate::planner::compose_and_render;
use crate::plugin::contract;
use crate::plugin::registry::ConflictError;
use crate::plugin::{
    EngineOptions, Limits, LoadError, LoadedPlugin, Origin, PluginDir, PluginError, PluginHost,
    check_plugin_dir, read_plugin_dir, read_trusted,
};

/// Instances the kit's engine reserves. The kit makes one call at a time;
/// the pooling allocator's reservation does not need to be the daemon's.
const KIT_SLOTS: u32 = 4;

/// Values shown in case-file errors are cut to this many characters.
const SHOWN_CHARS: usize = 80;

/// The engine options the kit runs plugins with: the resolved options
/// (limits, plugin allow-list and cache as configured, so `--plugin-fuel`,
/// `--cache-dir` and friends apply; the command line resolves the cache
/// to the person's own) with a small instance pool.
pub fn engine_options(resolved: &EngineOptions) -> EngineOptions {
    EngineOptions {
        slots: KIT_SLOTS,
        ..resolved.clone()
    }
}

/// Why the kit could not run at all (as opposed to a case that failed).
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    #[error(
        "cannot read cases at {path}: {reason}; pass a case file or a folder of `*.json` case files"
    )]
    Cases { path: PathBuf, reason: String },
    #[error(
        "{path} holds no `*.json` case files: write one (the format is in the README, \"Testing a plugin\")"
    )]
    NoCases { path: PathBuf },
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error("the built-in plugins do not load ({0}): this binary is broken, rebuild it")]
    BuiltIns(LoadError),
}

/// A case file that cannot be used. Each names the file and, where there is
/// one, the field.
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    #[error("cannot read case file {file}: {reason}; check the path and its permissions")]
    Read { file: PathBuf, reason: String },
    #[error(
        "{file}: not JSON (line {line} column {column}: {reason}); a case file is one JSON object, see \"Testing a plugin\" in the README"
    )]
    Json {
        file: PathBuf,
        line: usize,
        column: usize,
        reason: String,
    },
    #[error("{file}: {field}: {problem}")]
    Field {
        file: PathBuf,
        field: String,
        problem: String,
    },
    /// A fact the host's validation refuses (its message carries the fix).
    #[error("{file}: {field}: {error}")]
    Fact {
        file: PathBuf,
        field: String,
        error: Box<FactError>,
    },
}

/// What a case expects the plugin to return.
#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    /// The plan, as JSON (compared as JSON values).
    Plan(Value),
    /// The plugin declines.
    Error(ExpectedError),
}

/// A plugin's refusal, as a case expects it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExpectedError {
    pub kind: ErrorKind,
    /// `invalid-facts` only: the field the plugin names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Text the plugin's reason must contain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_contains: Option<String>,
}

/// The two ways a plugin may decline (the WIT `plan-error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    Unsupported,
    InvalidFacts,
}

impl ErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::InvalidFacts => "invalid-facts",
        }
    }
}

/// One case file, read and validated.
#[derive(Debug, Clone)]
pub struct Case {
    /// The file name without `.json`.
    pub name: String,
    pub file: PathBuf,
    pub description: Option<String>,
    pub scenario: Scenario,
    pub facts: VmFacts,
    pub expect: Option<Expect>,
    /// The case's `context` object as written, kept whole (never compared).
    pub context: Option<Map<String, Value>>,
    /// The facts as written (values unnormalised), for `--bless`.
    raw_facts: RawFacts,
}

/// The facts in case-file form, in the documented key order.
#[derive(Debug, Clone, Serialize)]
struct RawFacts {
    name: String,
    id: String,
    backend: &'static str,
    os: &'static str,
    image: &'static str,
    boot: &'static str,
    nics: Vec<RawNic>,
    flavor: Option<String>,
}

impl RawFacts {
    /// Validated facts in case-file form: what `load_case` reads back as
    /// the same facts.
    fn of(facts: &VmFacts) -> Self {
        RawFacts {
            name: facts.name.as_str().to_owned(),
            id: facts.id.as_str().to_owned(),
            backend: facts.backend.as_str(),
            os: facts.os.as_str(),
            image: facts.image.as_str(),
            boot: facts.boot.as_str(),
            nics: facts
                .nics
                .iter()
                .map(|nic| RawNic {
                    mac: nic.mac.to_string(),
                    static_ipv4: nic.static_ipv4.map(|s| RawStatic {
                        address: s.address.to_string(),
                        prefix: s.prefix,
                        gateway: s.gateway.map(|g| g.to_string()),
                    }),
                })
                .collect(),
            flavor: facts.flavor.as_ref().map(|f| f.as_str().to_owned()),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct RawNic {
    mac: String,
    static_ipv4: Option<RawStatic>,
}

#[derive(Debug, Clone, Serialize)]
struct RawStatic {
    address: String,
    prefix: u8,
    gateway: Option<String>,
}

/// The case files at `path`: the file itself, or every `*.json` file in the
/// folder, sorted by name.
pub fn case_files(path: &Path) -> Result<Vec<PathBuf>, KitError> {
    let cases = |e: std::io::Error| KitError::Cases {
        path: path.to_owned(),
        reason: e.to_string(),
    };
    if std::fs::metadata(path).map_err(cases)?.is_file() {
        return Ok(vec![path.to_owned()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(cases)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json") && p.is_file())
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(KitError::NoCases {
            path: path.to_owned(),
        });
    }
    Ok(files)
}

fn case_name(file: &Path) -> String {
    file.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| file.display().to_string())
}

/// Read and validate one case file.
pub fn load_case(file: &Path) -> Result<Case, CaseError> {
    let text = std::fs::read_to_string(file).map_err(|e| CaseError::Read {
        file: file.to_owned(),
        reason: e.to_string(),
    })?;
    let value: Value = serde_json::from_str(&text).map_err(|e| {
        let full = e.to_string();
        let position = format!(" at line {} column {}", e.line(), e.column());
        CaseError::Json {
            file: file.to_owned(),
            line: e.line(),
            column: e.column(),
            reason: full.strip_suffix(&position).unwrap_or(&full).to_owned(),
        }
    })?;
    let r = Reader { file };
    let root = r.object(&value, "top level")?;
    r.only(
        root,
        "",
        &["description", "scenario", "facts", "expect", "context"],
    )?;
    let description = r.opt_string(root, "", "description")?;
    let scenario = r.choice(
        root,
        "",
        "scenario",
        &Scenario::ALL.map(|s| (s.as_str(), s)),
    )?;
    let Some(facts) = present(root.get("facts")) else {
        return Err(r.field(
            "facts",
            "is missing; give the VM facts the plugin sees".into(),
        ));
    };
    let (facts, raw_facts) = r.facts(facts)?;
    let expect = match present(root.get("expect")) {
        None => None,
        Some(v) => Some(r.expect(v)?),
    };
    let context = present(root.get("context"))
        .map(|v| r.object(v, "context").cloned())
        .transpose()?;
    Ok(Case {
        name: case_name(file),
        file: file.to_owned(),
        description,
        scenario,
        facts,
        expect,
        context,
        raw_facts,
    })
}

/// `null` reads like an absent key.
fn present(value: Option<&Value>) -> Option<&Value> {
    value.filter(|v| !v.is_null())
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// A JSON value for an error message: compact, cut to [`SHOWN_CHARS`].
fn shown(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(SHOWN_CHARS) {
        None => text,
        Some((cut, _)) => format!("{}...", &text[..cut]),
    }
}

/// Reads a case file's JSON, naming the file and the field in every error.
struct Reader<'a> {
    file: &'a Path,
}

impl Reader<'_> {
    fn field(&self, field: &str, problem: String) -> CaseError {
        CaseError::Field {
            file: self.file.to_owned(),
            field: field.to_owned(),
            problem,
        }
    }

    fn fact(&self, field: &str, error: FactError) -> CaseError {
        CaseError::Fact {
            file: self.file.to_owned(),
            field: field.to_owned(),
            error: Box::new(error),
        }
    }

    fn object<'v>(
        &self,
        value: &'v Value,
        field: &str,
    ) -> Result<&'v Map<String, Value>, CaseError> {
        value
            .as_object()
            .ok_or_else(|| self.field(field, format!("expected an object, got {}", shown(value))))
    }

    /// Refuse keys outside `allowed`: a misspelt key would otherwise be
    /// silently ignored.
    fn only(&self, map: &Map<String, Value>, at: &str, allowed: &[&str]) -> Result<(), CaseError> {
        match map.keys().find(|k| !allowed.contains(&k.as_str())) {
            None => Ok(()),
            Some(key) => Err(self.field(
                &join(at, key),
                format!("unknown key; expected one of {}", allowed.join(", ")),
            )),
        }
    }

    fn opt_string(
        &self,
        map: &Map<String, Value>,
        at: &str,
        key: &str,
    ) -> Result<Option<String>, CaseError> {
        match present(map.get(key)) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.field(
                &join(at, key),
                format!("expected a string, got {}", shown(other)),
            )),
        }
    }

    fn string(&self, map: &Map<String, Value>, at: &str, key: &str) -> Result<String, CaseError> {
        self.opt_string(map, at, key)?
            .ok_or_else(|| self.field(&join(at, key), "is missing; it is required".into()))
    }

    fn choice<T: Copy>(
        &self,
        map: &Map<String, Value>,
        at: &str,
        key: &str,
        options: &[(&str, T)],
    ) -> Result<T, CaseError> {
        let names: Vec<String> = options.iter().map(|(n, _)| format!("\"{n}\"")).collect();
        let value = self.opt_string(map, at, key)?.ok_or_else(|| {
            self.field(
                &join(at, key),
                format!("is missing; give one of {}", names.join(", ")),
            )
        })?;
        options
            .iter()
            .find(|(n, _)| *n == value)
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                self.field(
                    &join(at, key),
                    format!(
                        "{} is not one of {}",
                        shown(&Value::String(value)),
                        names.join(", ")
                    ),
                )
            })
    }

    fn ipv4(&self, value: String, field: &str) -> Result<Ipv4Addr, CaseError> {
        value.parse().map_err(|_| {
            self.field(
                field,
                format!(
                    "{} is not a dotted-quad IPv4 address",
                    shown(&Value::String(value.clone()))
                ),
            )
        })
    }

    /// The facts, validated with the host's rules (the same parsers
    /// [`VmFacts::validate`] uses, the same NIC bound, unique MACs).
    fn facts(&self, value: &Value) -> Result<(VmFacts, RawFacts), CaseError> {
        const AT: &str = "facts";
        let map = self.object(value, AT)?;
        self.only(
            map,
            AT,
            &[
                "name", "id", "backend", "os", "image", "boot", "nics", "flavor",
            ],
        )?;
        let raw_name = self.string(map, AT, "name")?;
        let name = VmName::parse(&raw_name).map_err(|e| self.fact("facts.name", e))?;
        let raw_id = self.string(map, AT, "id")?;
        let id = VmId::parse(&raw_id).map_err(|e| self.fact("facts.id", e))?;
        let backend = self.choice(
            map,
            AT,
            "backend",
            &[Backend::CloudHypervisor, Backend::Firecracker].map(|b| (b.as_str(), b)),
        )?;
        let os = self.choice(
            map,
            AT,
            "os",
            &[
                GuestOs::Linux,
                GuestOs::Windows,
                GuestOs::Android,
                GuestOs::Unknown,
            ]
            .map(|o| (o.as_str(), o)),
        )?;
        let image = self.choice(
            map,
            AT,
            "image",
            &[ImageKind::Cloudimg, ImageKind::Oci, ImageKind::Unknown].map(|i| (i.as_str(), i)),
        )?;
        let boot = self.choice(
            map,
            AT,
            "boot",
            &[
                BootKind::Clone,
                BootKind::Fork,
                BootKind::Wake,
                BootKind::Resumed,
            ]
            .map(|b| (b.as_str(), b)),
        )?;
        let items = match present(map.get("nics")) {
            Some(Value::Array(items)) => items,
            Some(other) => {
                return Err(self.field(
                    "facts.nics",
                    format!("expected an array, got {}", shown(other)),
                ));
            }
            None => {
                return Err(self.field(
                    "facts.nics",
                    "is missing; give the NICs in inspect order (`[]` for none)".into(),
                ));
            }
        };
        if items.len() > MAX_NICS {
            return Err(self.field(
                "facts.nics",
                format!(
                    "{} NICs, more than the {MAX_NICS} the host passes to a plugin",
                    items.len()
                ),
            ));
        }
        let mut nics = Vec::with_capacity(items.len());
        let mut raw_nics = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let (nic, raw) = self.nic(i, item)?;
            if let Some(first) = nics.iter().position(|n: &Nic| n.mac == nic.mac) {
                return Err(self.field(
                    &format!("facts.nics[{i}].mac"),
                    format!(
                        "{} is also the MAC of nics[{first}]; give every NIC its own MAC",
                        nic.mac
                    ),
                ));
            }
            nics.push(nic);
            raw_nics.push(raw);
        }
        let raw_flavor = self.opt_string(map, AT, "flavor")?;
        let flavor = raw_flavor
            .as_deref()
            .map(|f| Flavor::parse(f).map_err(|e| self.fact("facts.flavor", e)))
            .transpose()?;
        let facts = VmFacts {
            name,
            id,
            backend,
            os,
            image,
            boot,
            nics,
            flavor,
        };
        let raw = RawFacts {
            name: raw_name,
            id: raw_id,
            backend: backend.as_str(),
            os: os.as_str(),
            image: image.as_str(),
            boot: boot.as_str(),
            nics: raw_nics,
            flavor: raw_flavor,
        };
        Ok((facts, raw))
    }

    fn nic(&self, i: usize, value: &Value) -> Result<(Nic, RawNic), CaseError> {
        let at = format!("facts.nics[{i}]");
        let map = self.object(value, &at)?;
        self.only(map, &at, &["mac", "static_ipv4"])?;
        let raw_mac = self.string(map, &at, "mac")?;
        let mac = MacAddr::parse(&raw_mac).map_err(|e| self.fact(&join(&at, "mac"), e))?;
        let Some(ipv4) = present(map.get("static_ipv4")) else {
            let nic = Nic {
                mac,
                static_ipv4: None,
            };
            let raw = RawNic {
                mac: raw_mac,
                static_ipv4: None,
            };
            return Ok((nic, raw));
        };
        let at = join(&at, "static_ipv4");
        let s = self.object(ipv4, &at)?;
        self.only(s, &at, &["address", "prefix", "gateway"])?;
        let raw_address = self.string(s, &at, "address")?;
        let address = self.ipv4(raw_address.clone(), &join(&at, "address"))?;
        let prefix_field = join(&at, "prefix");
        let prefix = match present(s.get("prefix")) {
            None => {
                return Err(self.field(
                    &prefix_field,
                    "is missing; a static NIC needs a prefix length 0..=32".into(),
                ));
            }
            Some(v) => v
                .as_u64()
                .and_then(|p| u8::try_from(p).ok())
                .filter(|p| *p <= 32)
                .ok_or_else(|| {
                    self.field(
                        &prefix_field,
                        format!("expected a prefix length 0..=32, got {}", shown(v)),
                    )
                })?,
        };
        let raw_gateway = self.opt_string(s, &at, "gateway")?;
        let gateway = raw_gateway
            .clone()
            .map(|g| self.ipv4(g, &join(&at, "gateway")))
            .transpose()?;
        let nic = Nic {
            mac,
            static_ipv4: Some(StaticIpv4 {
                address,
                prefix,
                gateway,
            }),
        };
        let raw = RawNic {
            mac: raw_mac,
            static_ipv4: Some(RawStatic {
                address: raw_address,
                prefix,
                gateway: raw_gateway,
            }),
        };
        Ok((nic, raw))
    }

    fn expect(&self, value: &Value) -> Result<Expect, CaseError> {
        let map = self.object(value, "expect")?;
        let keys: Vec<&str> = map.keys().map(String::as_str).collect();
        match keys.as_slice() {
            ["plan"] => {
                let plan = &map["plan"];
                self.object(plan, "expect.plan")?;
                Ok(Expect::Plan(plan.clone()))
            }
            ["error"] => {
                const AT: &str = "expect.error";
                let e = self.object(&map["error"], AT)?;
                self.only(e, AT, &["kind", "field", "reason_contains"])?;
                let kind = self.choice(
                    e,
                    AT,
                    "kind",
                    &[ErrorKind::Unsupported, ErrorKind::InvalidFacts].map(|k| (k.as_str(), k)),
                )?;
                let field = self.opt_string(e, AT, "field")?;
                if kind == ErrorKind::Unsupported && field.is_some() {
                    return Err(self.field(
                        "expect.error.field",
                        "applies to kind \"invalid-facts\" only; remove it".into(),
                    ));
                }
                Ok(Expect::Error(ExpectedError {
                    kind,
                    field,
                    reason_contains: self.opt_string(e, AT, "reason_contains")?,
                }))
            }
            _ => Err(self.field(
                "expect",
                "must hold exactly one key, \"plan\" or \"error\" (or leave `expect` out and run with --bless)".into(),
            )),
        }
    }
}

/// What the plugin returned for a case (a sandbox breach is kept apart).
#[derive(Debug, Clone, PartialEq)]
enum Returned {
    Plan(Plan),
    Declined {
        kind: ErrorKind,
        field: Option<String>,
        reason: String,
    },
}

impl Returned {
    /// A plugin that declines (`unsupported`, `invalid-facts`); `None` for
    /// any other error, which is a breach of the sandbox or the host's.
    fn declined(error: &PluginError) -> Option<Self> {
        match error {
            PluginError::Unsupported { reason, .. } => Some(Returned::Declined {
                kind: ErrorKind::Unsupported,
                field: None,
                reason: reason.clone(),
            }),
            PluginError::InvalidFact { field, reason, .. } => Some(Returned::Declined {
                kind: ErrorKind::InvalidFacts,
                field: Some(field.clone()),
                reason: reason.clone(),
            }),
            _ => None,
        }
    }

    fn matches(&self, expect: &Expect) -> bool {
        match (expect, self) {
            (Expect::Plan(expected), Returned::Plan(plan)) => {
                serde_json::to_value(plan).is_ok_and(|actual| actual == *expected)
            }
            (
                Expect::Error(e),
                Returned::Declined {
                    kind,
                    field,
                    reason,
                },
            ) => {
                e.kind == *kind
                    && e.field.as_ref().is_none_or(|f| Some(f) == field.as_ref())
                    && e.reason_contains
                        .as_ref()
                        .is_none_or(|text| reason.contains(text.as_str()))
            }
            _ => false,
        }
    }

    /// The expectation `--bless` records for this result.
    fn expectation(&self) -> ExpectOut<'_> {
        match self {
            Returned::Plan(plan) => ExpectOut::Plan(plan),
            Returned::Declined {
                kind,
                field,
                reason,
            } => ExpectOut::Error(ExpectedError {
                kind: *kind,
                field: field.clone(),
                reason_contains: Some(reason.clone()),
            }),
        }
    }
}

/// An expectation as written to a case file: `{"plan": ...}` or
/// `{"error": ...}`, the plan's keys in their natural order.
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
enum ExpectOut<'a> {
    Plan(&'a Plan),
    Error(ExpectedError),
}

#[derive(Debug, Serialize)]
struct CaseFileOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    scenario: &'a str,
    facts: &'a RawFacts,
    #[serde(skip_serializing_if = "Option::is_none")]
    expect: Option<&'a ExpectOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    context: Option<&'a Map<String, Value>>,
}

impl CaseFileOut<'_> {
    /// The file's text: pretty JSON, two-space indent, a final newline.
    fn text(&self) -> Result<String, serde_json::Error> {
        let mut text = serde_json::to_string_pretty(self)?;
        text.push('\n');
        Ok(text)
    }
}

/// Whether `error` is the plugin declining (`unsupported`,
/// `invalid-facts`), which a case can expect, rather than a breach.
pub fn is_refusal(error: &PluginError) -> bool {
    Returned::declined(error).is_some()
}

/// The text of a new case file, in the form `--bless` writes: `facts`
/// (validated, so `load_case` reads them back as the same facts), and the
/// plugin's result as `expect`, or no `expect` for a call that breached
/// the sandbox (`plugin test` then shows the breach). `context` is kept
/// as given.
pub fn case_text(
    description: Option<&str>,
    scenario: Scenario,
    facts: &VmFacts,
    result: &Result<Plan, PluginError>,
    context: Option<&Map<String, Value>>,
) -> Result<String, serde_json::Error> {
    let returned = match result {
        Ok(plan) => Some(Returned::Plan(plan.clone())),
        Err(error) => Returned::declined(error),
    };
    let expect = returned.as_ref().map(Returned::expectation);
    CaseFileOut {
        description,
        scenario: scenario.as_str(),
        facts: &RawFacts::of(facts),
        expect: expect.as_ref(),
        context,
    }
    .text()
}

/// Keys in the order the contract lists them (and `--bless` writes them);
/// keys not listed follow, alphabetically.
const KEY_ORDER: [&str; 16] = [
    "plan",
    "error",
    "kind",
    "field",
    "reason_contains",
    "dialect",
    "steps",
    "description",
    "phase",
    "best_effort",
    "run",
    "write_file",
    "remove_files",
    "path",
    "content",
    "mode",
];

/// Pretty JSON (two-space indent) with keys in [`KEY_ORDER`] and a final
/// newline. Both sides of a diff go through this, so only real differences
/// show, whatever the key order and spacing in the case file.
fn normalised(value: &impl Serialize) -> String {
    let value = serde_json::to_value(value).unwrap_or(Value::Null);
    let mut out = String::new();
    pretty(&value, 0, &mut out);
    out.push('\n');
    out
}

fn pretty(value: &Value, depth: usize, out: &mut String) {
    let pad = |out: &mut String, depth: usize| out.push_str(&"  ".repeat(depth));
    match value {
        Value::Object(map) if !map.is_empty() => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by_key(|k| {
                let rank = KEY_ORDER.iter().position(|o| o == k);
                (rank.unwrap_or(KEY_ORDER.len()), k.as_str())
            });
            out.push_str("{\n");
            for (i, key) in keys.iter().enumerate() {
                pad(out, depth + 1);
                out.push_str(&Value::String((*key).clone()).to_string());
                out.push_str(": ");
                pretty(&map[key.as_str()], depth + 1, out);
                out.push_str(if i + 1 < keys.len() { ",\n" } else { "\n" });
            }
            pad(out, depth);
            out.push('}');
        }
        Value::Array(items) if !items.is_empty() => {
            out.push_str("[\n");
            for (i, item) in items.iter().enumerate() {
                pad(out, depth + 1);
                pretty(item, depth + 1, out);
                out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
            }
            pad(out, depth);
            out.push(']');
        }
        scalar_or_empty => out.push_str(&scalar_or_empty.to_string()),
    }
}

fn expect_value(expect: &Expect) -> Value {
    match expect {
        Expect::Plan(plan) => serde_json::json!({ "plan": plan }),
        Expect::Error(e) => serde_json::json!({ "error": e }),
    }
}

fn unified_diff(expected: &str, actual: &str, (old, new): (&str, &str)) -> String {
    similar::TextDiff::from_lines(expected, actual)
        .unified_diff()
        .context_radius(3)
        .header(old, new)
        .to_string()
}

/// The diff of `expect` against the actual result: the normalised JSON,
/// except that a string field that differs and holds several lines (a
/// file's `content`) is diffed by line under its path, after the JSON,
/// rather than shown as two long escaped strings.
fn result_diff(expect: Option<&Expect>, actual: &ExpectOut<'_>) -> String {
    let mut actual = serde_json::to_value(actual).unwrap_or(Value::Null);
    let Some(expect) = expect else {
        return unified_diff("", &normalised(&actual), ("expected", "actual"));
    };
    let mut expected = expect_value(expect);
    let mut texts = Vec::new();
    take_multiline_texts(&mut expected, &mut actual, String::new(), &mut texts);
    let mut diff = unified_diff(
        &normalised(&expected),
        &normalised(&actual),
        ("expected", "actual"),
    );
    for (path, old, new) in texts {
        let (old_name, new_name) = (format!("expected {path}"), format!("actual {path}"));
        diff.push_str(&unified_diff(&old, &new, (&old_name, &new_name)));
    }
    diff
}

/// Walk `expected` and `actual` side by side (into arrays of the same
/// length only); where both hold a string at the same path, the strings
/// differ and either has a line break, replace both with one marker and
/// push `(path, expected, actual)`.
fn take_multiline_texts(
    expected: &mut Value,
    actual: &mut Value,
    path: String,
    out: &mut Vec<(String, String, String)>,
) {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (key, e) in e.iter_mut() {
                if let Some(a) = a.get_mut(key) {
                    take_multiline_texts(e, a, join(&path, key), out);
                }
            }
        }
        // Elements correspond only when the arrays are as long: with a
        // step added or dropped, pairing by index would diff unrelated
        // steps, so the escaped JSON stays.
        (Value::Array(e), Value::Array(a)) if e.len() == a.len() => {
            for (i, (e, a)) in e.iter_mut().zip(a.iter_mut()).enumerate() {
                take_multiline_texts(e, a, format!("{path}[{i}]"), out);
            }
        }
        (Value::String(e), Value::String(a))
            if e != a && (e.contains('\n') || a.contains('\n')) =>
        {
            let marker = format!("<text of several lines: see the line diff of {path} below>");
            let old = std::mem::replace(e, marker.clone());
            let new = std::mem::replace(a, marker);
            out.push((path, old, new));
        }
        _ => {}
    }
}

/// Write the case file back with a new `expect`, through a temporary file
/// renamed into place so an interrupted bless leaves the old file whole.
fn bless(case: &Case, expect: &ExpectOut<'_>) -> std::io::Result<()> {
    let text = CaseFileOut {
        description: case.description.as_deref(),
        scenario: case.scenario.as_str(),
        facts: &case.raw_facts,
        expect: Some(expect),
        context: case.context.as_ref(),
    }
    .text()
    .map_err(std::io::Error::other)?;
    let dir = case
        .file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(text.as_bytes())?;
    tmp.persist(&case.file).map_err(|e| e.error)?;
    Ok(())
}

/// `plugin test` options.
#[derive(Debug, Clone, Copy, Default)]
pub struct TestOptions {
    /// Rewrite `expect` in each case whose result differs (or that has none).
    pub bless: bool,
    /// Render each plan the plugin returns as the hint script `plan`
    /// prints ([`CaseReport::script`]).
    pub render: bool,
}

/// How a case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The result matched `expect`.
    Pass,
    /// It did not, or the call breached the sandbox.
    Fail,
    /// `--bless` recorded the result as the new `expect`.
    Blessed,
    /// The case file is unusable (bad JSON, an invalid fact).
    Invalid,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Blessed => "BLESSED",
            Status::Invalid => "INVALID",
        }
    }
}

/// What one call used. `None` where the host did not report it: a call
/// that ends in an error reports no usage, except the fuel it ran out of.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Usage {
    pub fuel: Option<u64>,
    pub peak_memory_bytes: Option<usize>,
    pub plan_steps: Option<usize>,
    pub plan_bytes: Option<usize>,
    /// Wall time of the call, instantiation included, in milliseconds.
    pub wall_ms: f64,
}

/// A line the plugin logged during the call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogReport {
    pub level: String,
    pub message: String,
}

/// The result of one case.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    pub name: String,
    pub file: String,
    pub description: Option<String>,
    pub scenario: Option<&'static str>,
    pub status: Status,
    /// Why it failed (or was blessed), one sentence.
    pub message: Option<String>,
    /// Unified diff of `expect` (as normalised JSON) against the actual
    /// result, when they differ.
    pub diff: Option<String>,
    pub usage: Option<Usage>,
    pub logs: Vec<LogReport>,
    /// The `summary` of the case's `context`, when it has one: where the
    /// case came from (`cocoon-fixup capture` writes it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// What the case asks that the host would never ask of this plugin
    /// (a flavour it does not serve); `plugin test` prints these on
    /// standard error.
    pub warnings: Vec<String>,
    /// With `--render`: the hint script of the returned plan, as `plan`
    /// prints it, in the plan's dialect.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// With `--render`, when there is no script: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_script: Option<String>,
}

/// The plugin a report is about.
#[derive(Debug, Clone, Serialize)]
pub struct PluginSummary {
    pub name: String,
    pub version: String,
    pub sha256: String,
    pub file: String,
}

/// The limits in force for every call.
#[derive(Debug, Clone, Serialize)]
pub struct LimitsReport {
    pub fuel: u64,
    pub memory_bytes: usize,
    pub plan_max_steps: usize,
    pub plan_max_bytes: usize,
}

impl From<&Limits> for LimitsReport {
    fn from(l: &Limits) -> Self {
        LimitsReport {
            fuel: l.fuel,
            memory_bytes: l.memory_bytes,
            plan_max_steps: l.plan.max_steps,
            plan_max_bytes: l.plan.max_bytes,
        }
    }
}

/// A case file's text for one line of the report: every control character
/// (line breaks included) and invisible formatting character escaped, and
/// the Unicode line and paragraph separators (U+2028, U+2029) too, so a
/// `description` or `context.summary` cannot start a line of its own that
/// looks like the report's.
fn one_line(text: &str) -> String {
    crate::facts::escape_controls(text)
        .replace('\u{2028}', "\\u{2028}")
        .replace('\u{2029}', "\\u{2029}")
}

/// The result of `plugin test`: every case, and the counts.
#[derive(Debug, Clone, Serialize)]
pub struct TestReport {
    pub plugin: PluginSummary,
    pub limits: LimitsReport,
    pub cases: Vec<CaseReport>,
    /// Cases that passed, blessed ones included.
    pub passed: usize,
    /// Cases that failed, invalid case files included.
    pub failed: usize,
    pub blessed: usize,
}

impl TestReport {
    /// True when no case failed: the exit code is 0.
    pub fn success(&self) -> bool {
        self.failed == 0
    }
}

/// Load the plugin at `plugin` and run it on the cases at `cases` (a file
/// or a folder).
pub fn test_plugin(
    engine: EngineOptions,
    plugin: &Path,
    cases: &Path,
    options: TestOptions,
) -> Result<TestReport, KitError> {
    let files = case_files(cases)?;
    let host = PluginHost::new(engine)?;
    // A vendor tests the file in their own build tree, which a umask of
    // 002 leaves group-writable: the node's trust rules are `plugin
    // inspect`'s verdict, here only a warning.
    if let Err(e) = crate::plugin::trusted::read_file(plugin)
        && !e.is_io()
    {
        tracing::warn!(
            "{e}; the host would refuse this file where it is (see `cocoon-fixup plugin inspect`)"
        );
    }
    let bytes = std::fs::read(plugin).map_err(|source| PluginError::Read {
        path: plugin.to_owned(),
        source,
    })?;
    let loaded = host.prepare(Origin::File(plugin.to_owned()), &bytes)?;
    Ok(run_cases(&host, &loaded, &files, options))
}

/// Run `plugin` on each case file, in order.
pub fn run_cases(
    host: &PluginHost,
    plugin: &LoadedPlugin,
    files: &[PathBuf],
    options: TestOptions,
) -> TestReport {
    let cases: Vec<CaseReport> = files
        .iter()
        .map(|file| run_case(host, plugin, file, options))
        .collect();
    let count = |s: Status| cases.iter().filter(|c| c.status == s).count();
    let blessed = count(Status::Blessed);
    TestReport {
        plugin: PluginSummary {
            name: plugin.info.name.clone(),
            version: plugin.info.version.clone(),
            sha256: plugin.sha256.clone(),
            file: plugin.origin.to_string(),
        },
        limits: host.limits().into(),
        passed: count(Status::Pass) + blessed,
        failed: count(Status::Fail) + count(Status::Invalid),
        blessed,
        cases,
    }
}

fn run_case(
    host: &PluginHost,
    plugin: &LoadedPlugin,
    file: &Path,
    options: TestOptions,
) -> CaseReport {
    let case = match load_case(file) {
        Ok(case) => case,
        Err(e) => {
            return CaseReport {
                name: case_name(file),
                file: file.display().to_string(),
                description: None,
                scenario: None,
                status: Status::Invalid,
                message: Some(e.to_string()),
                diff: None,
                usage: None,
                logs: Vec::new(),
                context: None,
                warnings: Vec::new(),
                script: None,
                no_script: options
                    .render
                    .then(|| "the case file is not valid".to_owned()),
            };
        }
    };
    let mut report = CaseReport {
        name: case.name.clone(),
        file: file.display().to_string(),
        description: case.description.clone(),
        scenario: Some(case.scenario.as_str()),
        status: Status::Fail,
        message: None,
        diff: None,
        usage: None,
        logs: Vec::new(),
        context: case
            .context
            .as_ref()
            .and_then(|c| c.get("summary"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        warnings: flavor_warning(plugin, &case).into_iter().collect(),
        script: None,
        no_script: None,
    };
    let started = Instant::now();
    let result = host.plan(plugin, case.scenario, &case.facts);
    let wall_ms = duration_ms(started.elapsed());
    let mut usage = Usage {
        fuel: None,
        peak_memory_bytes: None,
        plan_steps: None,
        plan_bytes: None,
        wall_ms,
    };
    let returned = match result {
        Ok((plan, stats)) => {
            usage.fuel = Some(stats.fuel_used);
            usage.peak_memory_bytes = Some(stats.peak_memory_bytes);
            usage.plan_steps = Some(plan.steps.len());
            usage.plan_bytes = Some(plan.text_bytes());
            report.logs = stats
                .logs
                .iter()
                .map(|l| LogReport {
                    level: l.level.as_str().to_ascii_lowercase(),
                    message: l.message.clone(),
                })
                .collect();
            Returned::Plan(plan)
        }
        Err(error) => match Returned::declined(&error) {
            Some(declined) => declined,
            None => {
                let breach = error;
                if let PluginError::Fuel { limit, .. } = &breach {
                    usage.fuel = Some(*limit);
                }
                report.usage = Some(usage);
                if options.render {
                    report.no_script = Some("the call failed (see above)".to_owned());
                }
                report.message = Some(match &breach {
                    PluginError::Policy { .. } => format!(
                        "{breach}; if the plan needs it, declare it in the plugin's `policy` (operators will see it in `plugin inspect`), otherwise drop the step"
                    ),
                    _ => breach.to_string(),
                });
                return report;
            }
        },
    };
    report.usage = Some(usage);
    // Why the node would refuse the plan once rendered: the case fails
    // whatever `expect` says, as the VM would get no fixup.
    let mut refused = None;
    if options.render {
        match &returned {
            Returned::Plan(plan) => match compose_and_render(
                &case.facts,
                &[case.scenario],
                &[plugin],
                vec![plan.clone()],
                &host.limits().plan,
            ) {
                Ok(rendered) => report.script = Some(rendered.script),
                Err(e) => {
                    let why = format!("the node would refuse it: {e}");
                    report.no_script = Some(why.clone());
                    refused = Some(why);
                }
            },
            Returned::Declined { kind, reason, .. } => {
                report.no_script = Some(format!(
                    "the plugin declined ({}: {reason}), so the host has nothing to run",
                    kind.as_str()
                ));
            }
        }
    }
    if let Some(expect) = &case.expect
        && returned.matches(expect)
    {
        report.status = match refused {
            None => Status::Pass,
            Some(why) => {
                report.message = Some(format!(
                    "the result is as expected, but {why}; fix the plugin's plan"
                ));
                Status::Fail
            }
        };
        return report;
    }
    let actual_expect = returned.expectation();
    report.diff = Some(result_diff(case.expect.as_ref(), &actual_expect));
    if options.bless {
        match bless(&case, &actual_expect) {
            Ok(()) => {
                report.status = Status::Blessed;
                report.message = Some(format!("wrote the actual result to {}", file.display()));
            }
            Err(e) => {
                report.message = Some(format!(
                    "cannot write {}: {e}; check that the file and its folder are writable",
                    file.display()
                ));
            }
        }
    } else if case.expect.is_none() {
        report.message = Some(
            "the case has no `expect` yet: check the result below, then run with --bless to record it"
                .to_owned(),
        );
    } else {
        report.message = Some(
            "the result differs from `expect`: fix the plugin, or run with --bless if the change is intended"
                .to_owned(),
        );
    }
    if let Some(why) = refused {
        report.status = Status::Fail;
        let message = report.message.take().unwrap_or_default();
        report.message = Some(format!("{message}; and {why}"));
    }
    report
}

/// A warning when the case's VM names a flavour this plugin does not
/// declare (or none, for a plugin that declares some): the host would
/// select another plugin for such a VM, so the case tests a call that
/// never happens on a node.
fn flavor_warning(plugin: &LoadedPlugin, case: &Case) -> Option<String> {
    let served = &plugin.info.flavors;
    if served.is_empty()
        || case
            .facts
            .flavor
            .as_ref()
            .is_some_and(|f| served.contains(f))
    {
        return None;
    }
    let served = served
        .iter()
        .map(|f| format!("`{f}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let asked = match &case.facts.flavor {
        Some(f) => format!("flavour `{f}`"),
        None => "no flavour (`facts.flavor` is null)".to_owned(),
    };
    Some(format!(
        "case {}: its VM has {asked}, but plugin {} serves only {served}: a node would never call it for this VM (the generic plugin plans it); set `facts.flavor` to one of those, or declare the flavour in the plugin's `describe`",
        crate::facts::escape_controls(&case.name),
        plugin.info.name
    ))
}

/// The lines of `text` for a terminal, split on `\n` only, with each `\r`
/// written as `\r`: a line ending in CRLF stays distinct from one ending
/// in LF (`str::lines` would drop the `\r`).
fn shown_lines(text: &str) -> impl Iterator<Item = String> + '_ {
    text.strip_suffix('\n')
        .unwrap_or(text)
        .split('\n')
        .map(|line| line.replace('\r', "\\r"))
}

fn duration_ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `28380` as `28,380`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `812 B`, `64 KiB`, `1.1 MiB`.
fn bytes(n: usize) -> String {
    let scaled = |unit: usize, name: &str| {
        let v = n as f64 / unit as f64;
        if n.is_multiple_of(unit) {
            format!("{} {name}", n / unit)
        } else {
            format!("{v:.1} {name}")
        }
    };
    if n >= 1 << 20 {
        scaled(1 << 20, "MiB")
    } else if n >= 1 << 10 {
        scaled(1 << 10, "KiB")
    } else {
        format!("{n} B")
    }
}

fn percent(used: u64, limit: u64) -> String {
    if limit == 0 {
        return "-".to_owned();
    }
    let p = used as f64 * 100.0 / limit as f64;
    if used > 0 && p < 0.01 {
        "<0.01%".to_owned()
    } else {
        format!("{p:.2}%")
    }
}

impl Usage {
    /// `fuel 28,380 / 250,000,000 (0.01%)  memory 1.1 MiB / 16 MiB  plan 6 steps / 256, 812 B / 64 KiB  time 1.3 ms`
    fn line(&self, limits: &LimitsReport) -> String {
        let mut parts = Vec::new();
        if let Some(fuel) = self.fuel {
            parts.push(format!(
                "fuel {} / {} ({})",
                thousands(fuel),
                thousands(limits.fuel),
                percent(fuel, limits.fuel)
            ));
        }
        if let Some(memory) = self.peak_memory_bytes {
            parts.push(format!(
                "memory {} / {}",
                bytes(memory),
                bytes(limits.memory_bytes)
            ));
        }
        if let (Some(steps), Some(size)) = (self.plan_steps, self.plan_bytes) {
            parts.push(format!(
                "plan {steps} step{} / {}, {} / {}",
                if steps == 1 { "" } else { "s" },
                limits.plan_max_steps,
                bytes(size),
                bytes(limits.plan_max_bytes)
            ));
        }
        parts.push(format!("time {:.1} ms", self.wall_ms));
        parts.join("  ")
    }
}

const INDENT: &str = "        ";

impl fmt::Display for TestReport {
    /// The text `plugin test` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.plugin;
        let n = self.cases.len();
        writeln!(
            f,
            "{} {} (sha256 {}) from {}: {n} case{}",
            p.name,
            p.version,
            &p.sha256[..p.sha256.len().min(16)],
            p.file,
            if n == 1 { "" } else { "s" }
        )?;
        for case in &self.cases {
            write!(f, "{:<7} {}", case.status.label(), case.name)?;
            match (case.scenario, &case.description) {
                (Some(s), Some(d)) => writeln!(f, "  {s}: {}", one_line(d))?,
                (Some(s), None) => writeln!(f, "  {s}")?,
                _ => writeln!(f)?,
            }
            if let Some(context) = &case.context {
                writeln!(f, "{INDENT}context: {}", one_line(context))?;
            }
            if let Some(usage) = &case.usage {
                writeln!(f, "{INDENT}{}", usage.line(&self.limits))?;
            }
            if let Some(message) = &case.message {
                writeln!(f, "{INDENT}{message}")?;
            }
            if case.status != Status::Pass {
                for log in &case.logs {
                    writeln!(f, "{INDENT}log {}: {}", log.level, log.message)?;
                }
            }
            if let Some(diff) = &case.diff {
                for line in shown_lines(diff) {
                    writeln!(f, "{INDENT}{line}")?;
                }
            }
            if let Some(script) = &case.script {
                writeln!(f, "{INDENT}hint script:")?;
                for line in shown_lines(script) {
                    writeln!(f, "{INDENT}  {line}")?;
                }
            }
            if let Some(why) = &case.no_script {
                writeln!(f, "{INDENT}no script: {why}")?;
            }
        }
        write!(f, "{} passed, {} failed", self.passed, self.failed)?;
        if self.blessed > 0 {
            write!(f, " ({} blessed)", self.blessed)?;
        }
        writeln!(f)
    }
}

/// How the host treats one import of a plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Linked to the host: `cocoon:fixup/host` (the bounded log) and the
    /// contract's own type interface.
    Granted,
    /// Linked to a function that traps with an error naming the import.
    Denied,
}

/// One import of a plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImportReport {
    pub name: String,
    pub access: Access,
}

/// What the bytes of a file are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    Component,
    CoreModule,
    NotWasm,
    Unreadable,
}

impl Format {
    fn of(bytes: &[u8]) -> Self {
        match bytes.get(..8) {
            Some([0, b'a', b's', b'm', _, _, 1, 0]) => Format::Component,
            Some([0, b'a', b's', b'm', 1, 0, 0, 0]) => Format::CoreModule,
            _ => Format::NotWasm,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Format::Component => "WebAssembly component",
            Format::CoreModule => "WebAssembly core module (not a component)",
            Format::NotWasm => "not WebAssembly",
            Format::Unreadable => "unreadable",
        }
    }
}

/// What `plugin inspect` found. Fields the host could not learn before it
/// refused the file are `None` (or empty).
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    pub file: String,
    pub size_bytes: Option<u64>,
    pub sha256: Option<String>,
    pub format: Format,
    pub name: Option<String>,
    pub version: Option<String>,
    /// `cocoon:fixup@<version>`.
    pub contract: Option<String>,
    pub summary: Option<String>,
    pub scenarios: Vec<&'static str>,
    /// Empty: any flavour (when the plugin loaded).
    pub flavors: Vec<String>,
    pub imports: Vec<ImportReport>,
    /// What the plugin's plans may do in the guest (when it loaded).
    pub policy: Option<PolicyReport>,
    /// Whether the node would load this file and serve everything it
    /// claims.
    pub accepted: bool,
    /// `accepted`, `accepted by itself, but ...` when other files of the
    /// plugin directory fail, or `refused: <one sentence with the fix>`.
    pub verdict: String,
    /// The plugin directory loaded with this file in it, when there is one.
    pub directory: Option<DirectoryReport>,
    /// Whether the node would load the file and the plugin directory as a
    /// whole ([`Inspection::success`]): the exit code is 0 exactly then.
    pub success: bool,
    /// The store's files of the pinned references (`plugins` in the
    /// configuration file), loaded after the directory.
    pub pinned: Vec<String>,
    /// The pinned references the store does not hold: not checked.
    pub pinned_unchecked: Vec<String>,
}

impl Inspection {
    /// Whether the node would load the file and the plugin directory
    /// as a whole: the exit code is 0.
    pub fn success(&self) -> bool {
        self.accepted && self.directory.as_ref().is_none_or(|d| d.loads)
    }
}

/// The plugin directory as the node would load it with the inspected file
/// in it.
#[derive(Debug, Clone, Serialize)]
pub struct DirectoryReport {
    pub path: String,
    /// The inspected file's path in the directory: where it lies, or
    /// where a copy of it would go (its file name in the directory).
    pub file_as: String,
    /// Whether the inspected file lies elsewhere and is judged as a copy.
    pub copy: bool,
    /// Whether that copy would replace a file of the same name.
    pub replaces: bool,
    /// Whether every file would load. `plan` refuses to start otherwise;
    /// `run` and a starting `serve` skip the files that fail and serve
    /// with the rest; a running `serve` refuses to reload such a set.
    pub loads: bool,
    /// The other files that would not load (and the directory itself,
    /// when it is refused whole), each with the node's error.
    pub problems: Vec<DirectoryProblem>,
}

/// A file of the plugin directory that would not load.
#[derive(Debug, Clone, Serialize)]
pub struct DirectoryProblem {
    pub file: String,
    pub error: String,
}

/// A plugin's guest-side policy, as `plugin inspect` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyReport {
    /// `declared` by the plugin, or the `contract-default` of a contract
    /// that cannot declare one.
    pub source: PolicySource,
    #[serde(flatten)]
    pub policy: GuestPolicy,
    /// The operator's narrowing from the configuration file, if any.
    pub narrowed_by_operator: Option<GuestPolicy>,
    /// What a reviewer must look at twice: run rules that leave a
    /// program's arguments open, patterns that cover files through which
    /// code could run ([`GuestPolicy::warnings`]).
    pub warnings: Vec<String>,
}

impl PolicyReport {
    fn of(plugin: &LoadedPlugin) -> Self {
        PolicyReport {
            source: plugin.policy_source,
            policy: plugin.policy.clone(),
            narrowed_by_operator: plugin.narrowing.clone(),
            warnings: plugin.policy.warnings(),
        }
    }
}

/// Inspects plugin files against a host set up like production: the
/// built-ins and every file of the plugin directory, loaded in the node's
/// order with the node's rules, so a plugin that would clash with any of
/// them is refused as the node would refuse it.
pub struct Inspector {
    /// The engine, with the built-ins registered.
    host: PluginHost,
    plugin_dir: Option<PathBuf>,
    /// The store's files of the pinned references, loaded after the
    /// directory ([`Inspector::with_pinned`]).
    pinned: Vec<PathBuf>,
    /// The pinned references whose files the store does not hold.
    unchecked: Vec<String>,
}

impl fmt::Debug for Inspector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inspector")
            .field("host", &self.host)
            .field("plugin_dir", &self.plugin_dir)
            .field("pinned", &self.pinned)
            .finish()
    }
}

/// A file of the plugin directory, as the inspector loads it.
enum DirEntry {
    /// The file being inspected (where it lies, or where a copy would).
    Inspected,
    /// Another file, as read under the node's rules.
    Other(Result<Vec<u8>, PluginError>),
}

/// What loading the plugin directory with the inspected file in it gave.
struct DirLoad {
    report: Option<DirectoryReport>,
    /// Why the node would not load the inspected file, or leave one of its
    /// claims unserved.
    refusal: Option<String>,
}

impl Inspector {
    /// An engine with the built-ins; `plugin_dir`, when given, is read
    /// again for each file inspected. A plugin directory that cannot be
    /// read at all is an error here, as it is for the node.
    pub fn new(engine: EngineOptions, plugin_dir: Option<&Path>) -> Result<Self, KitError> {
        let mut host = PluginHost::new(engine)?;
        host.load_builtins().map_err(KitError::BuiltIns)?;
        if let Some(dir) = plugin_dir {
            check_plugin_dir(dir)?;
        }
        Ok(Inspector {
            host,
            plugin_dir: plugin_dir.map(Path::to_owned),
            pinned: Vec::new(),
            unchecked: Vec::new(),
        })
    }

    /// Also load `files`, the store's copies of the pinned references, after
    /// the plugin directory, as the node does; `unchecked` names the pinned
    /// references the store does not hold (the node would pull them; the
    /// inspector does not), listed in each inspection.
    pub fn with_pinned(mut self, files: Vec<PathBuf>, unchecked: Vec<String>) -> Self {
        self.pinned = files;
        self.unchecked = unchecked;
        self
    }

    /// Inspect one file. Never fails: what cannot be learned stays empty
    /// and the verdict says why.
    pub fn inspect(&self, path: &Path) -> Inspection {
        let mut out = self.judge(path);
        out.success = out.success();
        out.pinned = self
            .pinned
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        out.pinned_unchecked.clone_from(&self.unchecked);
        out
    }

    fn judge(&self, path: &Path) -> Inspection {
        let mut out = Inspection {
            file: path.display().to_string(),
            size_bytes: None,
            sha256: None,
            format: Format::Unreadable,
            name: None,
            version: None,
            contract: None,
            summary: None,
            scenarios: Vec::new(),
            flavors: Vec::new(),
            imports: Vec::new(),
            policy: None,
            accepted: false,
            verdict: String::new(),
            directory: None,
            success: false,
            pinned: Vec::new(),
            pinned_unchecked: Vec::new(),
        };
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) => {
                out.verdict = format!(
                    "refused: cannot read {}: {e}; check the path",
                    path.display()
                );
                return out;
            }
        };
        // What the host would refuse on where the file lies (a link, an
        // owner or a mode that lets another user change it), beside what
        // the file is.
        let untrusted = crate::plugin::trusted::read_file(path)
            .err()
            .filter(|e| !e.is_io());
        out.size_bytes = Some(bytes.len() as u64);
        out.sha256 = Some(hex::encode(Sha256::digest(&bytes)));
        out.format = Format::of(&bytes);
        let prepared = self
            .host
            .prepare(Origin::File(path.to_owned()), &bytes)
            .and_then(|plugin| plugin.link().map(|()| Arc::new(plugin)));
        let plugin = match prepared {
            Ok(plugin) => plugin,
            Err(e) => {
                let refusal = refusal(&e);
                out.directory = self.load_dir(path, None).report;
                out.verdict = format!("refused: {refusal}");
                return out;
            }
        };
        out.name = Some(plugin.info.name.clone());
        out.version = Some(plugin.info.version.clone());
        out.contract = Some(format!("cocoon:fixup@{}", plugin.info.contract));
        out.summary = Some(plugin.info.summary.clone());
        out.scenarios = plugin.info.scenarios.iter().map(|s| s.as_str()).collect();
        out.flavors = plugin
            .info
            .flavors
            .iter()
            .map(|f| f.as_str().to_owned())
            .collect();
        out.imports = plugin
            .imports
            .iter()
            .map(|name| ImportReport {
                access: import_access(&plugin.granted_imports(), name),
                name: name.clone(),
            })
            .collect();
        out.policy = Some(PolicyReport::of(&plugin));
        let loaded = self.load_dir(path, Some(&plugin));
        out.directory = loaded.report;
        match (untrusted, loaded.refusal) {
            (Some(e), _) => out.verdict = format!("refused: {e}"),
            (None, Some(refusal)) => out.verdict = format!("refused: {refusal}"),
            (None, None) => {
                out.accepted = true;
                out.verdict = match &out.directory {
                    Some(dir) if !dir.loads => format!(
                        "accepted by itself, but the plugin directory {} does not load as a whole ({} other file(s) fail, listed under `directory`): `plan` refuses to start until they are fixed or removed, `run` and a starting `serve` skip them and load this file, and a running `serve` refuses to reload until they are fixed (this check does not run the `NAME.cases/` gate of a reload)",
                        dir.path,
                        dir.problems.len()
                    ),
                    _ => "accepted".to_owned(),
                };
            }
        }
        out
    }

    /// Load the built-ins, the plugin directory and then the pinned
    /// references' files into a registry of their own, in the node's
    /// order, with the inspected file in place: the file itself when it
    /// lies in the directory, else a copy of it under its file name
    /// (replacing a file of that name). `plugin` is the inspected plugin,
    /// or why it does not load. Without a plugin directory, the plugin is
    /// judged against the built-ins and the pinned files alone.
    fn load_dir(&self, path: &Path, plugin: Option<&Arc<LoadedPlugin>>) -> DirLoad {
        let mut registry = self.host.registry().clone();
        let name = path.file_name().unwrap_or(path.as_os_str());
        // The node reads only `*.wasm` files of its directory.
        let wasm_name = name.as_encoded_bytes().ends_with(b".wasm");
        let here = match &self.plugin_dir {
            Some(dir) => dir.join(name),
            None => path.to_owned(),
        };
        let inside = self
            .plugin_dir
            .as_deref()
            .is_some_and(|dir| lies_in(path, dir));
        let mut report = self.plugin_dir.as_ref().map(|dir| DirectoryReport {
            path: dir.display().to_string(),
            file_as: here.display().to_string(),
            copy: !inside,
            replaces: false,
            loads: true,
            problems: Vec::new(),
        });
        let files = match self.plugin_dir.as_deref().map(read_plugin_dir) {
            None => Vec::new(),
            Some(Ok(PluginDir::Files(files))) => files,
            Some(Ok(PluginDir::Refused(e))) => {
                let report = report.expect("a directory");
                let problem = PluginError::Untrusted(e).to_string();
                return DirLoad {
                    refusal: Some(format!(
                        "the plugin directory {} is refused whole, so the node reads none of its files: {problem}",
                        report.path
                    )),
                    report: Some(DirectoryReport {
                        loads: false,
                        problems: vec![DirectoryProblem {
                            file: report.path.clone(),
                            error: problem,
                        }],
                        ..report
                    }),
                };
            }
            Some(Err(e)) => {
                let report = report.expect("a directory");
                return DirLoad {
                    refusal: Some(format!("{e}; the node cannot start with it")),
                    report: Some(DirectoryReport {
                        loads: false,
                        problems: vec![DirectoryProblem {
                            file: report.path.clone(),
                            error: e.to_string(),
                        }],
                        ..report
                    }),
                };
            }
        };
        let mut entries: Vec<(PathBuf, DirEntry)> = files
            .into_iter()
            .map(|(file, bytes)| (file, DirEntry::Other(bytes)))
            .collect();
        // Why the node cannot read the inspected file where it lies.
        let mut unreadable = None;
        match entries.iter().position(|(file, _)| *file == here) {
            // The file itself: judged as the node reads it there.
            Some(i) if inside => match &entries[i].1 {
                DirEntry::Other(Err(e)) => unreadable = Some(e.to_string()),
                _ => entries[i].1 = DirEntry::Inspected,
            },
            Some(i) => {
                if let Some(report) = &mut report {
                    report.replaces = true;
                }
                entries[i].1 = DirEntry::Inspected;
            }
            // A file the node would not read stays out.
            None if !wasm_name && self.plugin_dir.is_some() => {}
            None => {
                let at = entries.partition_point(|(file, _)| *file < here);
                entries.insert(at, (here.clone(), DirEntry::Inspected));
            }
        }
        // The pinned references' files load after the directory.
        entries.extend(
            self.pinned
                .iter()
                .map(|file| (file.clone(), DirEntry::Other(read_trusted(file)))),
        );
        let mut own = None;
        let mut inspected_fails = false;
        // The files the inspected one shares a claim with: the other file,
        // the claim, and whether the other file loads first.
        let mut others: Vec<(Origin, Scenario, Option<Flavor>, bool)> = Vec::new();
        for (file, entry) in entries {
            let loaded = match (entry, plugin) {
                (DirEntry::Inspected, Some(plugin)) => {
                    let added = registry.add(plugin.clone());
                    if let Err(conflict) = &added {
                        own = Some(conflict.clone());
                    }
                    added.map_err(LoadError::from)
                }
                (DirEntry::Inspected, None) => {
                    inspected_fails = true;
                    continue;
                }
                (DirEntry::Other(bytes), _) => bytes
                    .and_then(|bytes| self.host.prepare(Origin::File(file.clone()), &bytes))
                    .map_err(LoadError::from)
                    .and_then(|other| Ok(registry.add(other)?)),
            };
            let Err(error) = loaded else { continue };
            if let (LoadError::Conflict(c), Some(plugin)) = (&error, plugin)
                && c.existing == plugin.origin
            {
                others.push((c.new.clone(), c.scenario, c.flavor.clone(), false));
            }
            // The inspected file's own failure is its verdict.
            if file == here && (inside || wasm_name) {
                inspected_fails = true;
                continue;
            }
            if let Some(report) = &mut report {
                report.problems.push(DirectoryProblem {
                    file: file.display().to_string(),
                    error: crate::facts::escape_controls(&error.to_string()),
                });
            }
        }
        if let Some(report) = &mut report {
            report.loads = report.problems.is_empty() && !inspected_fails;
        }
        let report = report.filter(|_| self.plugin_dir.is_some());
        if let Some(e) = unreadable {
            return DirLoad {
                report,
                refusal: Some(format!("the node cannot read it there: {e}")),
            };
        }
        if !wasm_name && self.plugin_dir.is_some() {
            return DirLoad {
                report,
                refusal: Some(
                    "the node does not load this file (its name does not end in `.wasm`), so the directory was judged without it; give it a name ending in `.wasm` to have it loaded, or leave it out"
                        .to_owned(),
                ),
            };
        }
        let Some(plugin) = plugin else {
            return DirLoad {
                report,
                refusal: None,
            };
        };
        others.extend(
            registry
                .contested_with(&plugin.origin)
                .into_iter()
                .map(|(scenario, flavor, other, first)| (other, scenario, flavor, first)),
        );
        let refusal = match own {
            Some(c) if matches!(c.existing, Origin::BuiltIn(_)) => {
                Some(self.conflict_sentence(&c, plugin))
            }
            Some(c) => {
                others.push((c.existing, c.scenario, c.flavor, true));
                None
            }
            None => None,
        };
        others.sort();
        others.dedup();
        let refusal = refusal.or_else(|| (!others.is_empty()).then(|| shared_claims(&others)));
        DirLoad { report, refusal }
    }
}

impl Inspector {
    /// Why `plugin` is refused for a claim a built-in makes: a copy of
    /// the built-in itself is named as such.
    fn conflict_sentence(&self, c: &ConflictError, plugin: &LoadedPlugin) -> String {
        let same = self
            .host
            .registry()
            .plugins()
            .iter()
            .find(|b| b.sha256 == plugin.sha256);
        match same {
            Some(builtin) => format!(
                "it is {} itself (the same sha256), which this binary serves already: a copy in the plugin directory is refused as a second claim of {}; leave it out",
                builtin.origin, c.scenario
            ),
            None => conflict_sentence(c),
        }
    }
}

/// Whether `path` is a file directly in `dir` (compared as real paths).
fn lies_in(path: &Path, dir: &Path) -> bool {
    let parent = match path.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new("."),
        Some(p) => p,
        None => return false,
    };
    match (parent.canonicalize(), dir.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The refusal for claims the inspected plugin shares with other files:
/// each names the other file, what both claim and which of the two keeps
/// its other claims (the node loads files in name order: the earlier one
/// loads, the later one is refused whole), then the fix.
fn shared_claims(others: &[(Origin, Scenario, Option<Flavor>, bool)]) -> String {
    let each: Vec<String> = others
        .iter()
        .map(|(other, scenario, flavor, first)| {
            let flavor = match flavor {
                Some(f) => format!("flavour `{f}`"),
                None => "any flavour".to_owned(),
            };
            let (kept, lost) = if *first {
                (other.to_string(), "this file".to_owned())
            } else {
                ("this file".to_owned(), other.to_string())
            };
            format!(
                "{other} also serves {scenario} for {flavor}: {kept} loads first and keeps its other claims, {lost} does not load and serves none of its claims, and neither serves {scenario} for {flavor}"
            )
        })
        .collect();
    format!(
        "{} (`plan` refuses to start with this directory); remove one of them, or make one of them serve a narrower flavour",
        each.join("; ")
    )
}

fn conflict_sentence(c: &ConflictError) -> String {
    match (&c.existing, &c.flavor) {
        (Origin::BuiltIn(name), None) => format!(
            "it serves {} for any flavour, as built-in {name} does, and a plugin file cannot replace a built-in for every flavour: declare the guest flavours it serves (`PluginInfo::with_flavors`)",
            c.scenario
        ),
        _ => c.to_string(),
    }
}

fn import_access(granted: &[String], name: &str) -> Access {
    if granted.iter().any(|g| g == name) {
        Access::Granted
    } else {
        Access::Denied
    }
}

/// Why the host refuses a plugin, as one sentence ending in the fix. The
/// host's own messages carry the fix where the cause implies it; the rest
/// get one here.
fn refusal(e: &PluginError) -> String {
    match e {
        PluginError::Read { .. } => format!("{e}; check the path"),
        PluginError::Link { .. } => format!(
            "{e}; build the plugin with cocoon-fixup-sdk for wasm32-wasip2, which imports only what the host can link"
        ),
        PluginError::BadDescription { .. } => {
            format!("{e}; fix what the plugin's `describe` returns")
        }
        PluginError::BadPolicy { .. } => format!(
            "{e}; fix what the plugin's `policy` returns (the rules are in the contract's `policy` interface and docs/plugins.md)"
        ),
        PluginError::Denied { .. } => {
            format!("{e}; remove that call from the plugin's `describe`")
        }
        PluginError::Panicked { .. } | PluginError::Trapped { .. } => {
            format!("{e}; fix the plugin's `describe` so that it returns")
        }
        _ => e.to_string(),
    }
}

impl fmt::Display for Inspection {
    /// The text `plugin inspect` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let row =
            |f: &mut fmt::Formatter<'_>, key: &str, value: &str| writeln!(f, "{key:<10} {value}");
        let size = self
            .size_bytes
            .map(|n| format!(" ({} bytes)", thousands(n)))
            .unwrap_or_default();
        row(f, "file", &format!("{}{size}", self.file))?;
        if let Some(sha) = &self.sha256 {
            row(f, "sha256", sha)?;
        }
        row(f, "format", self.format.describe())?;
        for (key, value) in [
            ("name", &self.name),
            ("version", &self.version),
            ("contract", &self.contract),
            ("summary", &self.summary),
        ] {
            if let Some(value) = value {
                row(f, key, value)?;
            }
        }
        if self.name.is_some() {
            row(f, "scenarios", &self.scenarios.join(", "))?;
            let flavors = if self.flavors.is_empty() {
                "any".to_owned()
            } else {
                self.flavors.join(", ")
            };
            row(f, "flavours", &flavors)?;
            if self.imports.is_empty() {
                row(f, "imports", "none")?;
            }
            let width = self.imports.iter().map(|i| i.name.len()).max().unwrap_or(0);
            for (i, import) in self.imports.iter().enumerate() {
                let access = match import.access {
                    Access::Granted
                        if import.name.starts_with("cocoon:fixup/types@")
                            || import.name.starts_with("cocoon:fixup/policy@") =>
                    {
                        "granted (types only)"
                    }
                    Access::Granted => "granted",
                    Access::Denied => "denied (traps)",
                };
                let line = format!("{:<width$}  {access}", import.name);
                row(f, if i == 0 { "imports" } else { "" }, &line)?;
            }
        }
        if let Some(policy) = &self.policy {
            let source = match policy.source {
                PolicySource::Declared => "declared by the plugin".to_owned(),
                PolicySource::ContractDefault => format!(
                    "the default for its contract, which cannot declare one (rebuild against cocoon:fixup@{} to declare a tighter one)",
                    contract::Contract::CURRENT
                ),
            };
            row(f, "policy", &source)?;
            write!(f, "{}", policy.policy)?;
            for warning in &policy.warnings {
                writeln!(f, "  warning: {warning}")?;
            }
            match &policy.narrowed_by_operator {
                Some(narrowing) => {
                    row(
                        f,
                        "operator",
                        "narrowed in the configuration file; plans must fit both",
                    )?;
                    write!(f, "{narrowing}")?;
                }
                None => row(f, "operator", "no narrowing in the configuration file")?,
            }
        }
        if let Some(dir) = &self.directory {
            let loads = if dir.loads {
                "every file loads"
            } else {
                "does not load as a whole"
            };
            row(f, "directory", &format!("{}: {loads}", dir.path))?;
            let place = match (dir.copy, dir.replaces) {
                (false, _) => format!("this file is {}", dir.file_as),
                (true, false) => format!("judged as a copy at {}", dir.file_as),
                (true, true) => format!(
                    "judged as a copy at {}, replacing the file there",
                    dir.file_as
                ),
            };
            row(f, "", &place)?;
            for problem in &dir.problems {
                row(
                    f,
                    "",
                    &format!("fails: {}: {}", problem.file, problem.error),
                )?;
            }
        }
        for file in &self.pinned {
            row(f, "pinned", &format!("{file} (loaded after the directory)"))?;
        }
        if !self.pinned_unchecked.is_empty() {
            row(
                f,
                "pinned",
                &format!(
                    "pinned references not checked: {} (not in the store: {}; `plugin pull` them)",
                    self.pinned_unchecked.len(),
                    self.pinned_unchecked.join(", ")
                ),
            )?;
        }
        row(f, "verdict", &self.verdict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CRLF line stays distinct from an LF line when shown.
    #[test]
    fn shown_lines_keep_a_carriage_return_visible() {
        let lines: Vec<String> = shown_lines("a\r\nb\n").collect();
        assert_eq!(lines, vec!["a\\r".to_owned(), "b".to_owned()]);
        let diff = unified_diff("x\r\ny\n", "x\ny\n", ("expected", "actual"));
        let shown: Vec<String> = shown_lines(&diff).collect();
        assert!(shown.contains(&"-x\\r".to_owned()), "{shown:?}");
        assert!(shown.contains(&"+x".to_owned()), "{shown:?}");
    }

    /// Strings are line-diffed only where array elements correspond: with
    /// a step added, the escaped JSON stays.
    #[test]
    fn multiline_texts_are_taken_only_from_arrays_of_one_length() {
        let step = |content: &str| serde_json::json!({"content": content});
        let mut expected = serde_json::json!({"steps": [step("a\nb")]});
        let mut actual = serde_json::json!({"steps": [step("a\nc")]});
        let mut texts = Vec::new();
        take_multiline_texts(&mut expected, &mut actual, String::new(), &mut texts);
        assert_eq!(texts.len(), 1, "{texts:?}");

        let mut expected = serde_json::json!({"steps": [step("a\nb")]});
        let mut actual = serde_json::json!({"steps": [step("x\ny"), step("a\nc")]});
        let mut texts = Vec::new();
        take_multiline_texts(&mut expected, &mut actual, String::new(), &mut texts);
        assert!(texts.is_empty(), "{texts:?}");
        assert_eq!(expected["steps"][0]["content"], "a\nb");
    }

    /// A case for the built-in oci-networkd with a `context`, whose
    /// `expect` is `expect`.
    fn case_with_context(dir: &Path, expect: Value) -> PathBuf {
        let case = serde_json::json!({
            "description": "captured",
            "scenario": "oci-networkd",
            "facts": {
                "name": "web-0", "id": "vm-1", "backend": "cloud-hypervisor",
                "os": "linux", "image": "oci", "boot": "clone",
                "nics": [{"mac": "52:54:00:12:34:56",
                          "static_ipv4": {"address": "10.0.0.5", "prefix": 24, "gateway": "10.0.0.1"}}],
                "flavor": null
            },
            "expect": expect,
            "context": {
                "summary": "captured from pod apps/web-0",
                "field": {"errors": ["attempt 1: x", "attempt 2: \u{1b}[31my"]},
                "plugins_named": [{"name": "oci-networkd", "version": "0.0.9"}]
            }
        });
        let path = dir.join("captured.json");
        std::fs::write(&path, serde_json::to_string_pretty(&case).unwrap()).unwrap();
        path
    }

    #[test]
    fn load_case_keeps_the_context_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = case_with_context(
            dir.path(),
            serde_json::json!({"plan": {"dialect": "posix-sh", "steps": []}}),
        );
        let case = load_case(&path).expect("valid case");
        let context = case.context.expect("context kept");
        assert_eq!(context["summary"], "captured from pod apps/web-0");
        assert_eq!(context["field"]["errors"][1], "attempt 2: \u{1b}[31my");
        assert_eq!(context.len(), 3);

        let mut value: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        value["context"] = serde_json::json!(["not", "an", "object"]);
        std::fs::write(&path, value.to_string()).unwrap();
        let err = load_case(&path).expect_err("a context that is not an object");
        assert!(
            err.to_string().contains("context: expected an object"),
            "{err}"
        );
    }

    /// The built-in oci-networkd written to `dir` as a plugin file.
    fn builtin_networkd(dir: &Path) -> PathBuf {
        let (_, bytes) = crate::plugin::builtin::BUILTINS
            .iter()
            .find(|(n, _)| *n == "oci-networkd")
            .unwrap();
        let plugin = dir.join("oci-networkd.wasm");
        std::fs::write(&plugin, bytes).unwrap();
        plugin
    }

    #[test]
    fn bless_keeps_the_context_and_the_report_shows_its_summary() {
        let dir = tempfile::tempdir().unwrap();
        let stale = serde_json::json!({"plan": {"dialect": "posix-sh", "steps": []}});
        let path = case_with_context(dir.path(), stale);
        let before = load_case(&path).unwrap().context;
        let plugin = builtin_networkd(dir.path());
        let engine = engine_options(&EngineOptions::default());
        let report = test_plugin(
            engine.clone(),
            &plugin,
            &path,
            TestOptions {
                bless: true,
                ..TestOptions::default()
            },
        )
        .expect("the kit runs");
        assert_eq!(report.cases[0].status, Status::Blessed, "{report}");
        let after = load_case(&path).expect("blessed case loads");
        assert_eq!(after.context, before, "bless keeps the context");
        assert!(matches!(after.expect, Some(Expect::Plan(_))));

        let rerun = test_plugin(engine, &plugin, &path, TestOptions::default()).unwrap();
        assert!(rerun.success(), "{rerun}");
        assert_eq!(
            rerun.cases[0].context.as_deref(),
            Some("captured from pod apps/web-0")
        );
        assert!(
            rerun
                .to_string()
                .contains("context: captured from pod apps/web-0"),
            "{rerun}"
        );
    }

    #[test]
    fn a_description_and_summary_print_on_one_line() {
        assert_eq!(
            one_line("a\nPASS b\r\u{2028}c\u{2029}d\u{202e}"),
            "a\\nPASS b\\r\\u{2028}c\\u{2029}d\\u{202e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = case_with_context(
            dir.path(),
            serde_json::json!({"plan": {"dialect": "posix-sh", "steps": []}}),
        );
        let mut case: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        case["description"] = "x\nPASS    forged.json".into();
        case["context"]["summary"] = "y\u{2028}PASS    forged2.json".into();
        std::fs::write(&path, case.to_string()).unwrap();
        let plugin = builtin_networkd(dir.path());
        let engine = engine_options(&EngineOptions::default());
        let report = test_plugin(engine, &plugin, &path, TestOptions::default()).unwrap();
        let shown = report.to_string();
        assert!(
            !shown.lines().any(|l| l.starts_with("PASS    forged")),
            "{shown}"
        );
        assert!(!shown.contains('\u{2028}'), "{shown}");
        assert!(shown.contains("x\\nPASS    forged.json"), "{shown}");
    }
}
