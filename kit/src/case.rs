//! Case files: what `plugin test` reads, and how it validates it.
//!
//! This module owns the case-file format: finding the case files of a path
//! ([`case_files`]), reading one into a [`Case`] ([`load_case`]), and every
//! error that names the file and the field ([`CaseError`]). The form a case
//! file is written back in (`--bless`, `capture`) is in [`super::diff`].
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
//!     prints a plan (`dialect` and `steps`, see [`fixup_core::plan`]); compared
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

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value};

use fixup_core::classify::Scenario;
use fixup_core::facts::{
    Backend, BootKind, FactError, Flavor, GuestOs, ImageKind, MAX_NICS, MacAddr, Nic, StaticIpv4,
    VmFacts, VmId, VmName,
};

use super::KitError;

/// Values shown in case-file errors are cut to this many characters.
const SHOWN_CHARS: usize = 80;

/// A case file that cannot be used. Each names the file and, where there is
/// one, the field.
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    #[error("cannot read case file {file}: {reason}; check the path and its permissions")]
    Read { file: PathBuf, reason: String },
    #[error(
        "{file}: not JSON (line {line} column {column}: {reason}); a case file is one JSON object, see docs/plugins.md, \"5. Testing\""
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
    pub(super) fn as_str(self) -> &'static str {
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
    pub(super) raw_facts: RawFacts,
}

/// The facts in case-file form, in the documented key order.
#[derive(Debug, Clone, Serialize)]
pub(super) struct RawFacts {
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
    pub(super) fn of(facts: &VmFacts) -> Self {
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
pub(super) struct RawNic {
    mac: String,
    static_ipv4: Option<RawStatic>,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct RawStatic {
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

pub(super) fn case_name(file: &Path) -> String {
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

pub(super) fn join(parent: &str, key: &str) -> String {
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
                    "is missing; a static NIC needs a prefix length 1..=32".into(),
                ));
            }
            Some(v) => v
                .as_u64()
                .and_then(|p| u8::try_from(p).ok())
                .filter(|p| (1..=32).contains(p))
                .ok_or_else(|| {
                    self.field(
                        &prefix_field,
                        format!("expected a prefix length 1..=32, got {}", shown(v)),
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A case for the built-in oci-networkd with a `context`, whose
    /// `expect` is `expect`.
    pub(crate) fn case_with_context(dir: &Path, expect: Value) -> PathBuf {
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
}
