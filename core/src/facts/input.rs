//! What the host reads: the pod and the VM record as JSON, read with
//! bounds and errors that name the field.

use super::*;

/// One NIC as `cocoon vm inspect --json` lists it, values unvalidated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RawNic {
    pub mac: String,
    pub tap: String,
    /// Empty means DHCP.
    pub ip: String,
    pub prefix: Option<i64>,
    /// Empty means no gateway.
    pub gateway: String,
}

impl RawNic {
    /// A NIC is static when `network.ip` is non-empty (spec section 2).
    pub fn is_static(&self) -> bool {
        !self.ip.is_empty()
    }
}

/// Which input a reading error is about; its `Display` is the command whose
/// output the input must be, so the error can say what to pass instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InputKind {
    Pod,
    VmInspect,
}

impl fmt::Display for InputKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InputKind::Pod => "`kubectl get pod <name> -o json`",
            InputKind::VmInspect => "`cocoon vm inspect <id> --json`",
        })
    }
}

/// The parts of a Pod the host reads, as `kubectl get pod -o json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodInput {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`; empty when the JSON has none.
    pub namespace: String,
    /// `metadata.uid`: the pod incarnation. Writes back to the pod carry it
    /// as a precondition so they never land on a recreated pod.
    pub uid: Option<String>,
    /// `metadata.annotations`; absent or `null` reads as empty.
    pub annotations: BTreeMap<String, String>,
    /// `metadata.deletionTimestamp` is set: the pod is being deleted and
    /// nothing more is done for it (spec section 8).
    pub deleting: bool,
    /// `metadata.resourceVersion`: which version of the pod this is. A
    /// write decided from this read carries it as a precondition, so it
    /// lands only while the pod is still as read. `None` when the input
    /// has none (a pod file written by hand).
    pub resource_version: Option<String>,
}

impl PodInput {
    /// Parses `kubectl get pod <name> -o json` output. `input` names the
    /// text in errors (usually the file name).
    pub fn from_json(text: &str, input: &str) -> Result<Self, FactError> {
        let value = parse_json(text, input, InputKind::Pod)?;
        Self::from_value(&value, input)
    }

    /// Reads an already parsed Pod object.
    pub fn from_value(value: &Value, input: &str) -> Result<Self, FactError> {
        let r = Reader {
            input,
            kind: InputKind::Pod,
        };
        let root = r.object(Some(value), "top level")?;
        if let Some(kind) = r.opt_string(root, "kind", "kind")?
            && kind != "Pod"
        {
            return Err(FactError::NotAPod {
                input: input.to_owned(),
                kind: shown(&kind),
            });
        }
        let meta = r.object(root.get("metadata"), "metadata")?;
        let name = r.opt_string(meta, "name", "metadata.name")?;
        let name = match name {
            Some(name) if !name.is_empty() => name,
            _ => return Err(r.shape("metadata.name", "a non-empty string", got_missing(&name))),
        };
        let namespace = r
            .opt_string(meta, "namespace", "metadata.namespace")?
            .unwrap_or_default();
        let uid = r
            .opt_string(meta, "uid", "metadata.uid")?
            .filter(|uid| !uid.is_empty());
        let mut annotations = BTreeMap::new();
        if let Some(found) = present(meta.get("annotations")) {
            let map = r.object(Some(found), "metadata.annotations")?;
            for (key, value) in map {
                let path = format!("metadata.annotations[{key:?}]");
                match value {
                    Value::String(s) => {
                        annotations.insert(key.clone(), s.clone());
                    }
                    other => return Err(r.shape(&path, "a string", describe(other))),
                }
            }
        }
        let deleting = present(meta.get("deletionTimestamp")).is_some();
        // Only ever used as a write precondition: a pod file without a
        // usable one simply has none.
        let resource_version = meta
            .get("resourceVersion")
            .and_then(Value::as_str)
            .filter(|version| !version.is_empty())
            .map(str::to_owned);
        Ok(PodInput {
            name,
            namespace,
            uid,
            annotations,
            deleting,
            resource_version,
        })
    }

    /// `namespace/name`, or just the name when the namespace is unknown.
    /// `namespace/name` for messages, with control characters escaped: a
    /// pod file may carry a name the API server would refuse, and a message
    /// stays one printable line.
    pub fn display_name(&self) -> String {
        let raw = if self.namespace.is_empty() {
            self.name.clone()
        } else {
            format!("{}/{}", self.namespace, self.name)
        };
        escape_controls(&raw)
    }

    /// The annotation's value; empty when absent, because the spec treats
    /// absent and empty alike everywhere.
    pub fn annotation(&self, key: &str) -> &str {
        self.annotations.get(key).map(String::as_str).unwrap_or("")
    }
}

/// The parts of the VM record (`cocoon vm inspect --json`) the host reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VmInspect {
    /// `id`; empty when absent.
    pub id: String,
    /// `config.name`: the VM's name, which binds it to its pod (spec
    /// section 2); empty when absent.
    pub name: String,
    /// `config.image`: cocoon copies a snapshot's config into its clones,
    /// so on a normal clone this is the source image; empty when absent.
    pub image: String,
    /// `network_configs[]` in inspect order (the order FC's `eth<i>` follows).
    pub nics: Vec<RawNic>,
    /// `created_at` (RFC 3339), in milliseconds since the Unix epoch: when
    /// cocoon made this VM. `None` when absent or not an RFC 3339 time; it
    /// only places the stack's wake events near this VM (spec section 2).
    pub created_unix_ms: Option<i64>,
}

impl VmInspect {
    /// Parses `cocoon vm inspect --json` output. `input` names the text in
    /// errors (usually the file name).
    pub fn from_json(text: &str, input: &str) -> Result<Self, FactError> {
        let value = parse_json(text, input, InputKind::VmInspect)?;
        Self::from_value(&value, input)
    }

    /// Reads an already parsed inspect object. Absent and `null` optional
    /// fields read as empty; a field of the wrong JSON type is an error
    /// naming its path.
    pub fn from_value(value: &Value, input: &str) -> Result<Self, FactError> {
        let r = Reader {
            input,
            kind: InputKind::VmInspect,
        };
        let root = r.object(Some(value), "top level")?;
        let id = r.opt_string(root, "id", "id")?.unwrap_or_default();
        let (mut name, mut image) = (String::new(), String::new());
        if let Some(config) = present(root.get("config")) {
            let config = r.object(Some(config), "config")?;
            name = r
                .opt_string(config, "name", "config.name")?
                .unwrap_or_default();
            image = r
                .opt_string(config, "image", "config.image")?
                .unwrap_or_default();
        }
        let mut nics = Vec::new();
        if let Some(found) = present(root.get("network_configs")) {
            let Value::Array(items) = found else {
                return Err(r.shape("network_configs", "an array", describe(found)));
            };
            for (i, item) in items.iter().enumerate() {
                let path = format!("network_configs[{i}]");
                let nic = r.object(Some(item), &path)?;
                let mut raw = RawNic {
                    mac: r
                        .opt_string(nic, "mac", &format!("{path}.mac"))?
                        .unwrap_or_default(),
                    tap: r
                        .opt_string(nic, "tap", &format!("{path}.tap"))?
                        .unwrap_or_default(),
                    ..RawNic::default()
                };
                if let Some(network) = present(nic.get("network")) {
                    let net_path = format!("{path}.network");
                    let network = r.object(Some(network), &net_path)?;
                    raw.ip = r
                        .opt_string(network, "ip", &format!("{net_path}.ip"))?
                        .unwrap_or_default();
                    raw.gateway = r
                        .opt_string(network, "gateway", &format!("{net_path}.gateway"))?
                        .unwrap_or_default();
                    raw.prefix = r.opt_integer(network, "prefix", &format!("{net_path}.prefix"))?;
                }
                nics.push(raw);
            }
        }
        let created_unix_ms = root
            .get("created_at")
            .and_then(Value::as_str)
            .and_then(|text| text.parse::<jiff::Timestamp>().ok())
            .map(|at| at.as_millisecond());
        Ok(VmInspect {
            id,
            name,
            image,
            nics,
            created_unix_ms,
        })
    }
}

/// Parses JSON, keeping serde_json's line and column in the error.
pub(crate) fn parse_json(text: &str, input: &str, kind: InputKind) -> Result<Value, FactError> {
    serde_json::from_str(text).map_err(|e| {
        let full = e.to_string();
        let position = format!(" at line {} column {}", e.line(), e.column());
        let reason = full.strip_suffix(&position).unwrap_or(&full).to_owned();
        FactError::Json {
            input: input.to_owned(),
            kind,
            line: e.line(),
            column: e.column(),
            reason,
        }
    })
}

/// `null` reads like an absent field: Go encoders print either.
pub(crate) fn present(value: Option<&Value>) -> Option<&Value> {
    value.filter(|v| !v.is_null())
}

/// How an unexpected JSON value is shown in a shape error.
pub(crate) fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => shown(s),
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
    }
}

pub(crate) fn got_missing(found: &Option<String>) -> String {
    match found {
        None => "nothing".to_owned(),
        Some(s) => shown(s),
    }
}

/// Reads typed fields out of one input, naming it and the field path in
/// every error.
pub(crate) struct Reader<'a> {
    input: &'a str,
    kind: InputKind,
}

impl Reader<'_> {
    fn shape(&self, path: &str, expected: &'static str, found: String) -> FactError {
        FactError::Shape {
            input: self.input.to_owned(),
            kind: self.kind,
            path: path.to_owned(),
            expected,
            found,
        }
    }

    fn object<'v>(
        &self,
        value: Option<&'v Value>,
        path: &str,
    ) -> Result<&'v Map<String, Value>, FactError> {
        match value {
            Some(Value::Object(map)) => Ok(map),
            Some(other) => Err(self.shape(path, "an object", describe(other))),
            None => Err(self.shape(path, "an object", "nothing".to_owned())),
        }
    }

    fn opt_string(
        &self,
        map: &Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Result<Option<String>, FactError> {
        match present(map.get(key)) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.shape(path, "a string", describe(other))),
        }
    }

    fn opt_integer(
        &self,
        map: &Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Result<Option<i64>, FactError> {
        match present(map.get(key)) {
            None => Ok(None),
            Some(Value::Number(n)) if n.as_i64().is_some() => Ok(n.as_i64()),
            Some(other) => Err(self.shape(path, "an integer", describe(other))),
        }
    }
}
