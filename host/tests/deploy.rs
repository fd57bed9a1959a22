//! The files in `deploy/`, tied to the code and to each other.
//!
//! - `deploy/admission-policy.yaml`: the match conditions, variables and
//!   validations are read from the file and evaluated by a CEL interpreter
//!   (the `cel` crate) in the API server's order, against a table of
//!   admission requests. Tenants cannot set, change or remove a key under
//!   `vm.cocoonstack.io/` or `cocoonset.cocoonstack.io/` (on a pod, through
//!   pods/status, through a Binding to pods/binding or to the legacy
//!   `bindings` resource); the stack's identities can; the node daemon's
//!   identities can change only the keys the daemon writes (taken from
//!   `fixup_host::pods::keys`), only by updating a pod that exists, and
//!   nothing else of it (no label, no other annotation, no spec); other
//!   annotations and labels stay writable for tenants; evictions are not
//!   matched; a pod without annotations is no evaluation error. Every key
//!   the host reads or writes is protected, the identities
//!   `deploy/rbac.yaml` binds are the policy's daemon, and every patch the
//!   real binary makes in a fixup is one the policy lets the daemon make.
//! - `deploy/rbac.yaml`: the real `cocoon-fixup` binary runs `serve` and
//!   `run` through a whole fixup against the fake API server
//!   (`support/fake_api.rs`) and `fake-cocoon`; every request it made is
//!   mapped to (API group, resource, verb) as the API server's authorizer
//!   does, and the set must equal the ClusterRole's rules: no verb missing,
//!   none granted that the code never uses.
//! - docs/operations.md links to the files in `deploy/`, and neither it
//!   nor README.md keeps a copy of them.
//!
//! The CEL here is the portable subset that both the `cel` crate and the
//! API server evaluate (the standard macros and the strings extension's
//! `join`); the API server also type-checks the expressions against the Pod
//! schema, which this test does not.

use crate::support;

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use cel::{Context, Env, Program};
use fixup_core::facts::annotations;
use fixup_host::pods::{keys, reasons};
use rstest::rstest;
use rustix::process::{Pid, Signal, kill_process};
use serde_json::{Value, json};
use support::binary::cocoon_fixup;
use support::fake::fake_cocoon;
use support::fake_api::{FakeApi, Request};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(relative: &str) -> String {
    let path = repo().join(relative);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Every YAML document of a file under the repository root.
fn yaml_documents(relative: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(&read(relative))
        .unwrap_or_else(|e| panic!("{relative} is not valid YAML: {e}"))
}

/// The one document of `kind` in a file.
fn document(relative: &str, kind: &str) -> Value {
    let mut found: Vec<Value> = yaml_documents(relative)
        .into_iter()
        .filter(|d| d["kind"] == kind)
        .collect();
    assert_eq!(found.len(), 1, "{relative}: expected one {kind}");
    found.remove(0)
}

/// The one `kind` named `name` in `relative`.
fn document_named(relative: &str, kind: &str, name: &str) -> Value {
    let mut found: Vec<Value> = yaml_documents(relative)
        .into_iter()
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "{relative}: expected one {kind} {name}");
    found.remove(0)
}

fn str_list(value: &Value, what: &str) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("{what}: expected a list, got {value}"))
        .iter()
        .map(|v| {
            v.as_str()
                .unwrap_or_else(|| panic!("{what}: expected strings, got {v}"))
                .to_owned()
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The admission policy, evaluated

const POLICY_FILE: &str = "deploy/admission-policy.yaml";

/// One expression of the policy, compiled.
struct Expression {
    /// Where it stands in the file, for messages: `variables[touchedKeys]`.
    place: String,
    program: Program,
}

/// A resource rule of `matchConstraints`.
struct Rule {
    groups: Vec<String>,
    versions: Vec<String>,
    operations: Vec<String>,
    resources: Vec<String>,
}

struct Validation {
    check: Expression,
    message: String,
    message_expression: Option<Expression>,
}

/// The policy as the API server would run it.
struct Policy {
    file: &'static str,
    env: Arc<Env>,
    rules: Vec<Rule>,
    match_conditions: Vec<Expression>,
    /// In file order: a variable may use the ones before it.
    variables: Vec<(String, Expression)>,
    validations: Vec<Validation>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Decision {
    /// No rule or match condition selects the request: the policy is not
    /// consulted.
    NotMatched,
    Admit,
    /// Refused, with the message the user sees.
    Deny(String),
}

impl Policy {
    fn load() -> Policy {
        Policy::load_with(&[])
    }

    /// The policy with some variables' expressions replaced, as an operator
    /// would edit them.
    fn load_with(overrides: &[(&str, &str)]) -> Policy {
        Policy::load_file(POLICY_FILE, overrides)
    }

    /// The policy of `file` (one ValidatingAdmissionPolicy and its
    /// binding), with some variables' expressions replaced.
    fn load_file(file: &'static str, overrides: &[(&str, &str)]) -> Policy {
        let mut policy = document(file, "ValidatingAdmissionPolicy");
        for (name, expression) in overrides {
            let variable = policy["spec"]["variables"]
                .as_array_mut()
                .expect("variables")
                .iter_mut()
                .find(|v| v["name"] == *name)
                .unwrap_or_else(|| panic!("{file}: no variable {name}"));
            variable["expression"] = json!(expression);
        }
        let spec = &policy["spec"];
        assert_eq!(spec["failurePolicy"], "Fail", "{file}: failurePolicy");
        let binding = document(file, "ValidatingAdmissionPolicyBinding");
        assert_eq!(
            binding["spec"]["policyName"], policy["metadata"]["name"],
            "{file}: the binding names the policy"
        );
        assert_eq!(
            binding["spec"]["validationActions"],
            json!(["Deny"]),
            "{file}: the binding refuses"
        );
        assert!(
            binding["spec"].get("paramRef").is_none() && spec.get("paramKind").is_none(),
            "{file}: the policy takes no params; this test gives it none"
        );

        let mut env = Env::stdlib();
        cel::extensions::strings(&mut env).expect("the strings extension registers");
        let env = Arc::new(env);
        let compile = |place: String, source: &Value| {
            let source = source
                .as_str()
                .unwrap_or_else(|| panic!("{file}: {place}: expected a string"));
            let program = env
                .compile(source)
                .unwrap_or_else(|e| panic!("{file}: {place} does not compile: {e}"));
            Expression { place, program }
        };
        let named = |list: &str| -> Vec<(String, Value)> {
            spec[list]
                .as_array()
                .map(|items| {
                    items
                        .iter()
                        .map(|item| {
                            let name = item["name"].as_str().unwrap_or("").to_owned();
                            (name, item["expression"].clone())
                        })
                        .collect()
                })
                .unwrap_or_default()
        };

        let rules = spec["matchConstraints"]["resourceRules"]
            .as_array()
            .expect("matchConstraints.resourceRules")
            .iter()
            .map(|r| Rule {
                groups: str_list(&r["apiGroups"], "apiGroups"),
                versions: str_list(&r["apiVersions"], "apiVersions"),
                operations: str_list(&r["operations"], "operations"),
                resources: str_list(&r["resources"], "resources"),
            })
            .collect();
        let match_conditions = named("matchConditions")
            .into_iter()
            .map(|(name, source)| compile(format!("matchConditions[{name}]"), &source))
            .collect();
        let variables = named("variables")
            .into_iter()
            .map(|(name, source)| {
                let expression = compile(format!("variables[{name}]"), &source);
                (name, expression)
            })
            .collect();
        let validations: Vec<Validation> = spec["validations"]
            .as_array()
            .expect("validations")
            .iter()
            .enumerate()
            .map(|(i, v)| Validation {
                check: compile(format!("validations[{i}].expression"), &v["expression"]),
                message: v["message"].as_str().unwrap_or("").to_owned(),
                message_expression: v
                    .get("messageExpression")
                    .map(|m| compile(format!("validations[{i}].messageExpression"), m)),
            })
            .collect();
        assert!(!validations.is_empty(), "{file}: no validations");
        Policy {
            file,
            env,
            rules,
            match_conditions,
            variables,
            validations,
        }
    }

    /// Whether a resource rule selects the request, as `matchConstraints`
    /// does: `pods` is the pod itself, `pods/*` any of its subresources.
    fn selects(&self, request: &Value) -> bool {
        let r = &request["request"];
        let field = |v: &Value| v.as_str().unwrap_or("").to_owned();
        let resource = match field(&r["subResource"]).as_str() {
            "" => field(&r["resource"]["resource"]),
            sub => format!("{}/{sub}", field(&r["resource"]["resource"])),
        };
        let (main, _) = resource.split_once('/').unwrap_or((&resource, ""));
        let any = |list: &[String], value: &str| list.iter().any(|x| x == "*" || x == value);
        self.rules.iter().any(|rule| {
            any(&rule.groups, &field(&r["resource"]["group"]))
                && any(&rule.versions, &field(&r["resource"]["version"]))
                && any(&rule.operations, &field(&r["operation"]))
                && rule.resources.iter().any(|x| {
                    x == &resource
                        || x == "*/*"
                        || (x == "*" && !resource.contains('/'))
                        || (x.strip_suffix("/*") == Some(main) && resource.contains('/'))
                })
        })
    }

    /// The decision for one admission request
    /// (`{"request": .., "object": .., "oldObject": ..}`): the rules, then
    /// every match condition, then the variables in order, then the
    /// validations. An expression that fails to evaluate is an error (the
    /// API server would refuse the request: `failurePolicy: Fail`).
    fn decide(&self, input: &Value) -> Result<Decision, String> {
        if !self.selects(input) {
            return Ok(Decision::NotMatched);
        }
        let mut context = Context::with_env(self.env.clone());
        for name in ["request", "object", "oldObject"] {
            context
                .add_variable(name, &input[name])
                .map_err(|e| format!("{name} is not a CEL value: {e}"))?;
        }
        for condition in &self.match_conditions {
            if !eval_bool(condition, &context)? {
                return Ok(Decision::NotMatched);
            }
        }
        let mut variables: HashMap<String, cel::Value> = HashMap::new();
        for (name, expression) in &self.variables {
            context.add_variable_from_value("variables", variables.clone());
            let value = expression
                .program
                .execute(&context)
                .map_err(|e| format!("{}: {e}", expression.place))?;
            variables.insert(name.clone(), value);
        }
        context.add_variable_from_value("variables", variables);
        for validation in &self.validations {
            if eval_bool(&validation.check, &context)? {
                continue;
            }
            let message = match &validation.message_expression {
                Some(m) => match m.program.execute(&context) {
                    Ok(cel::Value::String(s)) => s.to_string(),
                    other => return Err(format!("{}: not a string: {other:?}", m.place)),
                },
                None => validation.message.clone(),
            };
            return Ok(Decision::Deny(message));
        }
        Ok(Decision::Admit)
    }

    /// A variable that is a literal list of strings.
    fn strings(&self, name: &str) -> Vec<String> {
        let cel::Value::List(items) = self.constant(name) else {
            panic!("{}: {name} is not a list", self.file);
        };
        items
            .iter()
            .map(|v| match v {
                cel::Value::String(s) => s.to_string(),
                other => panic!("{}: {name} holds {other:?}, not a string", self.file),
            })
            .collect()
    }

    /// The value of a variable that needs no request (a literal list).
    fn constant(&self, name: &str) -> cel::Value {
        let (_, expression) = self
            .variables
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{}: no variable {name}", self.file));
        expression
            .program
            .execute(&Context::with_env(self.env.clone()))
            .unwrap_or_else(|e| panic!("{}: {e}", expression.place))
    }
}

fn eval_bool(expression: &Expression, context: &Context) -> Result<bool, String> {
    match expression.program.execute(context) {
        Ok(cel::Value::Bool(b)) => Ok(b),
        Ok(other) => Err(format!("{}: not a bool: {other:?}", expression.place)),
        Err(e) => Err(format!("{}: {e}", expression.place)),
    }
}

static POLICY: LazyLock<Policy> = LazyLock::new(Policy::load);

// The people in the table.
const TENANT: &str = "alice@example.com";
/// The shared daemon user of deploy/rbac.yaml.
const FIXUP: &str = "cocoon-fixup";
/// A per-node daemon identity: CN=cocoon-fixup:<node>, O=cocoon:fixup-daemons.
const NODE_DAEMON: &str = "cocoon-fixup:vk-cocoon";
const DAEMON_GROUP: &str = "cocoon:fixup-daemons";
const VK_NODE: &str = "system:node:vk-cocoon";
const COCOONSET: &str = "system:serviceaccount:cocoon-system:cocoon-operator";
const KUBELET: &str = "system:node:worker-1";
const SCHEDULER: &str = "system:kube-scheduler";
const ADMIN: &str = "kubernetes-admin";
const ANONYMOUS: &str = "system:anonymous";

fn groups_of(user: &str) -> Value {
    match user {
        VK_NODE | KUBELET => json!(["system:nodes", "system:authenticated"]),
        COCOONSET => json!([
            "system:serviceaccounts",
            "system:serviceaccounts:cocoon-system",
            "system:authenticated"
        ]),
        ADMIN => json!(["system:masters", "system:authenticated"]),
        FIXUP => json!(["system:authenticated"]),
        _ if user.starts_with("cocoon-fixup:") => json!([DAEMON_GROUP, "system:authenticated"]),
        // The API server leaves out an empty list.
        ANONYMOUS => Value::Null,
        _ => json!(["tenants", "system:authenticated"]),
    }
}

const VM_ID: &str = annotations::VM_ID;
const IP: &str = keys::IP;
const MANAGED: &str = annotations::MANAGED;
const STATE: &str = keys::POST_CLONE_STATE;
const HIBERNATE: &str = "vm.cocoonstack.io/hibernate";

/// A pod with these labels and annotations; `None` leaves
/// `metadata.annotations` out, as the API server does for a pod without any.
fn pod(annotations: Option<&[(&str, &str)]>, labels: &[(&str, &str)]) -> Value {
    let to_map = |pairs: &[(&str, &str)]| -> Value {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), json!(v)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let mut metadata = json!({"name": "web-0", "namespace": "tenant-a", "uid": "u-1",
        "labels": to_map(labels)});
    if let Some(pairs) = annotations {
        metadata["annotations"] = to_map(pairs);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
        "spec": {"nodeName": "vk-cocoon", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running"}})
}

/// The stack's annotations on a running pod, and a tenant's own.
const STACK: &[(&str, &str)] = &[
    (VM_ID, "vm-0123abcd"),
    (MANAGED, "true"),
    (IP, "10.0.0.5"),
    ("team.example.com/owner", "alice"),
];

fn with(base: &[(&str, &str)], changes: &[(&str, Option<&str>)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = base
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    for (key, value) in changes {
        out.retain(|(k, _)| k != key);
        if let Some(v) = value {
            out.push(((*key).to_owned(), (*v).to_owned()));
        }
    }
    out
}

/// A pod with `STACK` changed by `changes` (`None` removes a key).
fn stack_pod(changes: &[(&str, Option<&str>)]) -> Value {
    let annotations = with(STACK, changes);
    let pairs: Vec<(&str, &str)> = annotations
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    pod(Some(&pairs), &[("app", "web")])
}

/// `pod` with the field at `path` (object keys, list indexes) set to
/// `value`.
fn edited(mut pod: Value, path: &[&str], value: Value) -> Value {
    let mut at = &mut pod;
    for part in path {
        at = match part.parse::<usize>() {
            Ok(i) => &mut at[i],
            Err(_) => &mut at[*part],
        };
    }
    *at = value;
    pod
}

/// `stack_pod(&[])` with one more label.
fn relabelled() -> Value {
    edited(
        stack_pod(&[]),
        &["metadata", "labels", "tier"],
        json!("front"),
    )
}

/// `stack_pod(&[])` with another status.
fn succeeded() -> Value {
    edited(stack_pod(&[]), &["status", "phase"], json!("Succeeded"))
}

/// An admission request: `subresource` empty for the pod itself;
/// `kind` the object's (group, kind).
fn request(
    operation: &str,
    user: &str,
    subresource: &str,
    kind: (&str, &str),
    object: Value,
    old: Value,
) -> Value {
    let mut user_info = json!({"username": user, "groups": groups_of(user)});
    if user_info["groups"].is_null() {
        user_info.as_object_mut().unwrap().remove("groups");
    }
    json!({
        "request": {
            "operation": operation,
            "kind": {"group": kind.0, "version": "v1", "kind": kind.1},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": subresource,
            "namespace": "tenant-a",
            "name": "web-0",
            "userInfo": user_info,
        },
        "object": object,
        "oldObject": old,
    })
}

const POD: (&str, &str) = ("", "Pod");

fn create(user: &str, object: Value) -> Value {
    request("CREATE", user, "", POD, object, Value::Null)
}

fn update(user: &str, old: Value, new: Value) -> Value {
    request("UPDATE", user, "", POD, new, old)
}

fn update_status(user: &str, old: Value, new: Value) -> Value {
    request("UPDATE", user, "status", POD, new, old)
}

const BINDING: (&str, &str) = ("", "Binding");

/// A Binding of pod web-0 to node vk-cocoon, with these annotations.
fn binding(annotations: &[(&str, &str)]) -> Value {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    json!({"apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "web-0", "namespace": "tenant-a", "annotations": annotations},
        "target": {"kind": "Node", "name": "vk-cocoon"}})
}

/// `POST .../pods/web-0/binding`.
fn bind(user: &str, annotations: &[(&str, &str)]) -> Value {
    request(
        "CREATE",
        user,
        "binding",
        BINDING,
        binding(annotations),
        Value::Null,
    )
}

/// `POST /api/v1/namespaces/tenant-a/bindings`: the legacy resource, same
/// object, same effect on the pod.
fn bind_legacy(user: &str, annotations: &[(&str, &str)]) -> Value {
    let mut input = bind(user, annotations);
    input["request"]["resource"]["resource"] = json!("bindings");
    input["request"]["subResource"] = json!("");
    input
}

/// What a case expects: `Deny` (the tenants' rule) and `DaemonDeny` (the
/// daemon's) list what the message must name.
#[derive(Debug)]
enum Expect {
    NotMatched,
    Admit,
    Deny(&'static [&'static str]),
    DaemonDeny(&'static [&'static str]),
}

#[rstest]
// Creating a pod.
#[case::tenant_creates_with_vm_id(create(TENANT, pod(Some(&[(VM_ID, "vm-1")]), &[])), Expect::Deny(&[VM_ID, TENANT]))]
#[case::tenant_creates_managed(create(TENANT, pod(Some(&[(MANAGED, "true")]), &[])), Expect::Deny(&[MANAGED]))]
#[case::tenant_creates_with_both_prefixes(create(TENANT, stack_pod(&[])), Expect::Deny(&[VM_ID, MANAGED, IP]))]
#[case::cocoonset_controller_creates_with_stack_keys(create(COCOONSET, stack_pod(&[])), Expect::Admit)]
#[case::tenant_creates_without_annotations(create(TENANT, pod(None, &[("app", "web")])), Expect::Admit)]
#[case::tenant_creates_with_empty_annotations(create(TENANT, pod(Some(&[]), &[])), Expect::Admit)]
#[case::tenant_creates_with_unrelated_annotations(create(TENANT, pod(Some(&[("team.example.com/owner", "alice")]), &[])), Expect::Admit)]
#[case::a_look_alike_key_is_not_the_stacks(create(TENANT, pod(Some(&[("x.vm.cocoonstack.io/id", "1"), ("vm.cocoonstack.io.example.com/id", "1")]), &[])), Expect::Admit)]
// Updating a pod that carries the stack's keys.
#[case::tenant_changes_only_a_label(update(TENANT, stack_pod(&[]), relabelled()), Expect::Admit)]
#[case::tenant_adds_an_unrelated_annotation(update(TENANT, stack_pod(&[]), stack_pod(&[("team.example.com/cost-centre", Some("42"))])), Expect::Admit)]
#[case::tenant_changes_an_unrelated_annotation(update(TENANT, stack_pod(&[]), stack_pod(&[("team.example.com/owner", Some("bob"))])), Expect::Admit)]
#[case::tenant_removes_an_unrelated_annotation(update(TENANT, stack_pod(&[]), stack_pod(&[("team.example.com/owner", None)])), Expect::Admit)]
#[case::tenant_resends_the_stack_keys_unchanged(update(TENANT, stack_pod(&[]), stack_pod(&[])), Expect::Admit)]
#[case::tenant_changes_the_ip(update(TENANT, stack_pod(&[]), stack_pod(&[(IP, Some("10.0.0.99"))])), Expect::Deny(&[IP]))]
#[case::tenant_adds_an_ip(update(TENANT, stack_pod(&[(IP, None)]), stack_pod(&[])), Expect::Deny(&[IP]))]
#[case::tenant_removes_the_ip(update(TENANT, stack_pod(&[]), stack_pod(&[(IP, None)])), Expect::Deny(&[IP]))]
#[case::tenant_empties_the_ip(update(TENANT, stack_pod(&[]), stack_pod(&[(IP, Some(""))])), Expect::Deny(&[IP]))]
#[case::tenant_unmanages(update(TENANT, stack_pod(&[]), stack_pod(&[(MANAGED, Some("false"))])), Expect::Deny(&[MANAGED]))]
#[case::tenant_removes_managed(update(TENANT, stack_pod(&[]), stack_pod(&[(MANAGED, None)])), Expect::Deny(&[MANAGED]))]
#[case::tenant_adds_managed(update(TENANT, stack_pod(&[(MANAGED, None)]), stack_pod(&[])), Expect::Deny(&[MANAGED]))]
#[case::tenant_drops_every_annotation(update(TENANT, stack_pod(&[]), pod(None, &[("app", "web")])), Expect::Deny(&[VM_ID, MANAGED, IP]))]
#[case::tenant_annotates_a_pod_without_annotations(update(TENANT, pod(None, &[]), pod(Some(&[(STATE, "done")]), &[])), Expect::Deny(&[STATE]))]
#[case::tenant_may_not_hibernate(update(TENANT, stack_pod(&[]), stack_pod(&[(HIBERNATE, Some("true"))])), Expect::Deny(&[HIBERNATE]))]
#[case::tenant_labels_a_pod_without_annotations(update(TENANT, pod(None, &[]), pod(None, &[("tier", "front")])), Expect::Admit)]
#[case::cocoonset_controller_removes_a_key(update(COCOONSET, stack_pod(&[]), stack_pod(&[(MANAGED, None)])), Expect::Admit)]
// Exact names only; a cluster administrator is not on the list.
#[case::a_longer_name_is_not_the_daemon(update("cocoon-fixup-2", stack_pod(&[]), stack_pod(&[(IP, Some("10.0.0.6"))])), Expect::Deny(&[IP, "cocoon-fixup-2"]))]
#[case::a_prefix_of_a_listed_name_is_not_it(update("system:node:vk", stack_pod(&[]), stack_pod(&[(IP, Some("10.0.0.6"))])), Expect::Deny(&[IP]))]
#[case::a_user_without_groups_is_refused(update(ANONYMOUS, stack_pod(&[]), stack_pod(&[(IP, Some("10.0.0.6"))])), Expect::Deny(&[IP, ANONYMOUS]))]
#[case::a_user_without_groups_labels(update(ANONYMOUS, stack_pod(&[]), relabelled()), Expect::Admit)]
#[case::cluster_admin_is_refused_too(update(ADMIN, stack_pod(&[]), stack_pod(&[(IP, Some("10.0.0.6"))])), Expect::Deny(&[IP]))]
// The node daemon: its own keys, on a pod that exists, and nothing else.
#[case::fixup_writes_its_state(update(FIXUP, stack_pod(&[]), stack_pod(&[(STATE, Some("done")), (IP, Some("10.0.0.6"))])), Expect::Admit)]
#[case::fixup_writes_the_lifecycle(update(FIXUP, stack_pod(&[]), stack_pod(&[(keys::LIFECYCLE_STATE, Some("ready")), (keys::LIFECYCLE_MESSAGE, Some("")), (keys::LIFECYCLE_OBSERVED_GENERATION, Some("1"))])), Expect::Admit)]
#[case::fixup_writes_a_hint_and_errors(update(FIXUP, stack_pod(&[]), stack_pod(&[(STATE, Some("failed")), (keys::POST_CLONE_HINT, Some("ip link ...")), (keys::POST_CLONE_ERRORS, Some("attempt 1: exit 1"))])), Expect::Admit)]
#[case::fixup_removes_its_hint(update(FIXUP, stack_pod(&[(keys::POST_CLONE_HINT, Some("x"))]), stack_pod(&[])), Expect::Admit)]
#[case::fixup_resends_everything_unchanged(update(FIXUP, stack_pod(&[]), stack_pod(&[])), Expect::Admit)]
#[case::fixup_may_not_write_the_vm_id(update(FIXUP, stack_pod(&[]), stack_pod(&[(STATE, Some("done")), (VM_ID, Some("vm-other"))])), Expect::DaemonDeny(&[VM_ID, FIXUP]))]
#[case::fixup_may_not_unmanage(update(FIXUP, stack_pod(&[]), stack_pod(&[(MANAGED, Some("false"))])), Expect::DaemonDeny(&[MANAGED]))]
#[case::fixup_may_not_remove_managed(update(FIXUP, stack_pod(&[]), stack_pod(&[(MANAGED, None)])), Expect::DaemonDeny(&[MANAGED]))]
#[case::fixup_may_not_hibernate(update(FIXUP, stack_pod(&[]), stack_pod(&[(HIBERNATE, Some("true"))])), Expect::DaemonDeny(&[HIBERNATE]))]
#[case::fixup_may_not_write_what_it_only_reads(update(FIXUP, stack_pod(&[]), stack_pod(&[(keys::GENERATION, Some("2")), (keys::PROBE_PORT, Some("22"))])), Expect::DaemonDeny(&[keys::GENERATION, keys::PROBE_PORT]))]
#[case::fixup_may_not_add_a_label(update(FIXUP, stack_pod(&[]), relabelled()), Expect::DaemonDeny(&["labels"]))]
#[case::fixup_may_not_remove_the_labels(update(FIXUP, stack_pod(&[]), edited(stack_pod(&[]), &["metadata", "labels"], json!({}))), Expect::DaemonDeny(&["labels"]))]
#[case::fixup_may_not_relabel_with_its_state(update(FIXUP, stack_pod(&[]), edited(stack_pod(&[(STATE, Some("done"))]), &["metadata", "labels", "app"], json!("db"))), Expect::DaemonDeny(&["labels"]))]
#[case::fixup_may_not_add_an_unrelated_annotation(update(FIXUP, stack_pod(&[]), stack_pod(&[("team.example.com/cost-centre", Some("42"))])), Expect::DaemonDeny(&["team.example.com/cost-centre"]))]
#[case::fixup_may_not_remove_an_unrelated_annotation(update(FIXUP, stack_pod(&[]), stack_pod(&[("team.example.com/owner", None)])), Expect::DaemonDeny(&["team.example.com/owner"]))]
#[case::fixup_may_not_change_an_image(update(FIXUP, stack_pod(&[]), edited(stack_pod(&[]), &["spec", "containers", "0", "image"], json!("example.com/evil:latest"))), Expect::DaemonDeny(&["spec"]))]
#[case::fixup_may_not_add_a_finalizer(update(FIXUP, stack_pod(&[]), edited(stack_pod(&[]), &["metadata", "finalizers"], json!(["example.com/hold"]))), Expect::DaemonDeny(&["finalizers"]))]
#[case::fixup_may_not_add_an_owner(update(FIXUP, stack_pod(&[]), edited(stack_pod(&[]), &["metadata", "ownerReferences"], json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u-2"}]))), Expect::DaemonDeny(&["owner references"]))]
#[case::fixup_may_not_create_a_pod(create(FIXUP, pod(None, &[])), Expect::DaemonDeny(&["CREATE of pods"]))]
#[case::fixup_may_not_create_a_pod_with_its_keys(create(FIXUP, pod(Some(&[(STATE, "done")]), &[])), Expect::DaemonDeny(&["CREATE of pods"]))]
#[case::fixup_may_not_update_the_status(update_status(FIXUP, stack_pod(&[]), stack_pod(&[(STATE, Some("done"))])), Expect::DaemonDeny(&["UPDATE of pods/status"]))]
#[case::fixup_may_not_bind(bind(FIXUP, &[]), Expect::DaemonDeny(&["CREATE of pods/binding"]))]
#[case::fixup_may_not_post_a_binding(bind_legacy(FIXUP, &[(IP, "10.0.0.6")]), Expect::DaemonDeny(&["CREATE of bindings"]))]
#[case::node_daemon_writes_its_state(update(NODE_DAEMON, stack_pod(&[]), stack_pod(&[(STATE, Some("done")), (IP, Some("10.0.0.6"))])), Expect::Admit)]
#[case::node_daemon_may_not_unmanage(update(NODE_DAEMON, stack_pod(&[]), stack_pod(&[(MANAGED, Some("false"))])), Expect::DaemonDeny(&[MANAGED, NODE_DAEMON]))]
#[case::node_daemon_may_not_label(update(NODE_DAEMON, stack_pod(&[]), relabelled()), Expect::DaemonDeny(&["labels"]))]
#[case::node_daemon_may_not_create(create(NODE_DAEMON, pod(None, &[])), Expect::DaemonDeny(&["CREATE"]))]
// pods/status carries metadata too.
#[case::tenant_status_update_changes_the_state(update_status(TENANT, stack_pod(&[]), stack_pod(&[(STATE, Some("done"))])), Expect::Deny(&[STATE]))]
#[case::kubelet_status_update_changes_a_stack_key(update_status(KUBELET, stack_pod(&[]), stack_pod(&[(keys::LIFECYCLE_STATE, Some("ready"))])), Expect::Deny(&[keys::LIFECYCLE_STATE, KUBELET]))]
#[case::kubelet_status_update_of_status_only(update_status(KUBELET, stack_pod(&[]), succeeded()), Expect::Admit)]
#[case::vk_node_status_update_writes_the_lifecycle(update_status(VK_NODE, stack_pod(&[]), stack_pod(&[(keys::LIFECYCLE_STATE, Some("ready"))])), Expect::Admit)]
#[case::tenant_ephemeral_container_update(request("UPDATE", TENANT, "ephemeralcontainers", POD, stack_pod(&[]), stack_pod(&[])), Expect::Admit)]
// Subresources whose object is not a Pod.
#[case::eviction_is_not_matched(request("CREATE", TENANT, "eviction", ("policy", "Eviction"), json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "web-0", "namespace": "tenant-a", "annotations": {(IP): "x"}}}), Value::Null), Expect::NotMatched)]
#[case::eviction_without_metadata_is_not_matched(request("CREATE", TENANT, "eviction", ("policy", "Eviction"), json!({"apiVersion": "policy/v1", "kind": "Eviction"}), Value::Null), Expect::NotMatched)]
// A Binding's annotations are copied onto the pod: pods/binding and the
// legacy `bindings` resource alike.
#[case::scheduler_binds(request("CREATE", SCHEDULER, "binding", BINDING, json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "web-0", "namespace": "tenant-a"}, "target": {"kind": "Node", "name": "vk-cocoon"}}), Value::Null), Expect::Admit)]
#[case::binding_annotations_reach_the_pod(bind(TENANT, &[(IP, "10.0.0.99")]), Expect::Deny(&[IP]))]
#[case::binding_with_unrelated_annotations(bind(TENANT, &[("team.example.com/owner", "alice")]), Expect::Admit)]
#[case::scheduler_posts_to_bindings(bind_legacy(SCHEDULER, &[]), Expect::Admit)]
#[case::legacy_binding_annotations_reach_the_pod(bind_legacy(TENANT, &[(IP, "10.0.0.99"), (MANAGED, "false")]), Expect::Deny(&[IP, MANAGED, TENANT]))]
#[case::legacy_binding_with_unrelated_annotations(bind_legacy(TENANT, &[("team.example.com/owner", "alice")]), Expect::Admit)]
#[case::legacy_binding_by_the_stack(bind_legacy(COCOONSET, &[(IP, "10.0.0.99")]), Expect::Admit)]
// Operations the policy does not constrain.
#[case::delete_is_not_matched(request("DELETE", TENANT, "", POD, Value::Null, stack_pod(&[])), Expect::NotMatched)]
#[case::exec_is_not_matched(request("CONNECT", TENANT, "exec", ("", "PodExecOptions"), json!({"kind": "PodExecOptions"}), Value::Null), Expect::NotMatched)]
fn admission_policy_decides(#[case] input: Value, #[case] expect: Expect) {
    assert_decides(&POLICY, &input, &expect);
}

/// `policy` decides `input` as `expect` says; a refusal's message names
/// what `expect` lists and says what the refused identity may do.
fn assert_decides(policy: &Policy, input: &Value, expect: &Expect) {
    let decision = policy
        .decide(input)
        .unwrap_or_else(|e| panic!("the policy failed to evaluate: {e}\nrequest: {input:#}"));
    let (names, says, message) = match (expect, &decision) {
        (Expect::NotMatched, Decision::NotMatched) | (Expect::Admit, Decision::Admit) => return,
        (Expect::Deny(names), Decision::Deny(message)) => (
            names,
            vec!["allowedUsers".to_owned(), "leave these keys out".to_owned()],
            message,
        ),
        (Expect::DaemonDeny(names), Decision::Deny(message)) => (
            names,
            vec![
                "daemon identity".to_owned(),
                policy.strings("daemonKeys").join(", "),
            ],
            message,
        ),
        _ => panic!("expected {expect:?}, got {decision:?}\nrequest: {input:#}"),
    };
    for name in *names {
        assert!(
            message.contains(name),
            "the message names {name}: {message}"
        );
    }
    for what in says {
        assert!(
            message.contains(&what),
            "the message says what to do ({what}): {message}"
        );
    }
}

// ---------------------------------------------------------------------------
// The wake event policy, evaluated

const WAKE_EVENT_POLICY_FILE: &str = "deploy/wake-event-policy.yaml";

static WAKE_EVENT_POLICY: LazyLock<Policy> =
    LazyLock::new(|| Policy::load_file(WAKE_EVENT_POLICY_FILE, &[]));

/// An admission request for an event about pod web-0: core/v1
/// (`events.k8s.io` false) or events.k8s.io/v1, with `reason` (`None`:
/// none), by `user`; an UPDATE when `old` is given.
fn event_request(
    user: &str,
    events_k8s_io: bool,
    reason: Option<&str>,
    old: Option<&str>,
) -> Value {
    event_request_of(user, events_k8s_io, reason.map(Some), old)
}

/// A DELETE of an event with reason `old`.
fn event_delete(user: &str, old: &str) -> Value {
    event_request_of(user, true, None, Some(old))
}

/// As [`event_request`]; `reason` `None` is no object (a DELETE).
fn event_request_of(
    user: &str,
    events_k8s_io: bool,
    reason: Option<Option<&str>>,
    old: Option<&str>,
) -> Value {
    let (group, api_version) = if events_k8s_io {
        ("events.k8s.io", "events.k8s.io/v1")
    } else {
        ("", "v1")
    };
    let event = |reason: Option<&str>| {
        let mut event = json!({
            "apiVersion": api_version,
            "kind": "Event",
            "metadata": {"name": "web-0.17a1", "namespace": "tenant-a"},
            "type": "Normal",
            "reportingController": "vk-cocoon",
        });
        if let Some(reason) = reason {
            event["reason"] = json!(reason);
        }
        event
    };
    let operation = match (&reason, &old) {
        (None, _) => "DELETE",
        (Some(_), Some(_)) => "UPDATE",
        (Some(_), None) => "CREATE",
    };
    let mut input = request(
        operation,
        user,
        "",
        (group, "Event"),
        reason.map_or(Value::Null, event),
        old.map_or(Value::Null, |old| event(Some(old))),
    );
    input["request"]["resource"] = json!({"group": group, "version": "v1", "resource": "events"});
    input
}

/// Only the stack's event source reports a wake: `Woken` and
/// `HibernateSnapshotExists`, in either events API, on create and update;
/// every other event is not matched.
#[rstest]
#[case::tenant_forges_woken(event_request(TENANT, true, Some("Woken"), None), false)]
#[case::tenant_forges_woken_core_v1(event_request(TENANT, false, Some("Woken"), None), false)]
#[case::tenant_forges_snapshot_exists(
    event_request(TENANT, true, Some("HibernateSnapshotExists"), None),
    false
)]
#[case::tenant_refreshes_a_woken(event_request(TENANT, false, Some("Woken"), Some("Woken")), false)]
#[case::tenant_renames_an_event_woken(
    event_request(TENANT, true, Some("Woken"), Some("Started")),
    false
)]
#[case::daemon_cannot_report_a_wake(event_request(FIXUP, true, Some("Woken"), None), false)]
#[case::node_daemon_cannot_report_a_wake(
    event_request(NODE_DAEMON, true, Some("HibernateSnapshotExists"), None),
    false
)]
#[case::kubelet_cannot_report_a_wake(event_request(KUBELET, false, Some("Woken"), None), false)]
#[case::cocoonset_controller_does_not_report_wakes(
    event_request(COCOONSET, true, Some("Woken"), None),
    false
)]
#[case::anonymous(event_request(ANONYMOUS, true, Some("Woken"), None), false)]
#[case::tenant_renames_a_woken_away(
    event_request(TENANT, true, Some("Started"), Some("Woken")),
    false
)]
#[case::tenant_deletes_a_woken(event_delete(TENANT, "Woken"), false)]
#[case::daemon_deletes_a_snapshot_exists(event_delete(FIXUP, "HibernateSnapshotExists"), false)]
#[case::vk_cocoon_reports_woken(event_request(VK_NODE, true, Some("Woken"), None), true)]
#[case::vk_cocoon_deletes_its_woken(event_delete(VK_NODE, "Woken"), true)]
#[case::vk_cocoon_reports_snapshot_exists(
    event_request(VK_NODE, false, Some("HibernateSnapshotExists"), None),
    true
)]
fn wake_event_policy_decides(#[case] input: Value, #[case] admitted: bool) {
    let decision = WAKE_EVENT_POLICY
        .decide(&input)
        .unwrap_or_else(|e| panic!("the policy failed to evaluate: {e}\nrequest: {input:#}"));
    match decision {
        Decision::Admit => assert!(admitted, "admitted: {input:#}"),
        Decision::Deny(message) => {
            assert!(!admitted, "refused: {message}");
            let user = input["request"]["userInfo"]["username"].as_str().unwrap();
            for what in [user, "allowedUsers", "cocoon-wake-events"] {
                assert!(
                    message.contains(what),
                    "the message names {what}: {message}"
                );
            }
        }
        Decision::NotMatched => panic!("not matched: {input:#}"),
    }
}

/// Every other event, from anyone (the daemon's own reports included), is
/// left alone: the policy is not even consulted.
#[rstest]
#[case::daemon_reports_success(event_request(FIXUP, true, Some(reasons::SUCCEEDED), None))]
#[case::tenant_reports_started(event_request(TENANT, false, Some("Started"), None))]
#[case::reason_not_exact(event_request(TENANT, true, Some("woken"), None))]
#[case::no_reason(event_request(TENANT, true, None, None))]
#[case::started_renamed(event_request(TENANT, true, Some("Finished"), Some("Started")))]
#[case::delete_of_another_event(event_delete(TENANT, "Started"))]
fn wake_event_policy_leaves_other_events_alone(#[case] input: Value) {
    assert_eq!(
        WAKE_EVENT_POLICY.decide(&input),
        Ok(Decision::NotMatched),
        "{input:#}"
    );
}

/// The event source the policy admits is the stack's event source of the
/// pod policy: keep the two in step.
#[test]
fn the_wake_event_policy_admits_the_stacks_event_source() {
    let allowed = WAKE_EVENT_POLICY.strings("allowedUsers");
    let stack = POLICY.strings("allowedUsers");
    for user in &allowed {
        assert!(
            stack.contains(user),
            "{user} reports wake events ({WAKE_EVENT_POLICY_FILE}) but is not the stack in {POLICY_FILE}"
        );
    }
    for daemon in POLICY.strings("daemonUsers") {
        assert!(
            !allowed.contains(&daemon),
            "the daemon {daemon} may report wakes"
        );
    }
}

/// The value of every constant in `fixup_host::pods::keys` (defined in
/// `fixup_core::annotations`), read from its source: a key added there is
/// seen here without a change to this file.
fn pods_keys() -> BTreeSet<String> {
    let source = read("core/src/annotations.rs");
    let start = source
        .find("pub mod keys {")
        .expect("core/src/annotations.rs has `pub mod keys`");
    let body = &source[start..];
    let body = &body[..body.find("\n}").expect("the end of `mod keys`")];
    let values: BTreeSet<String> = body
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    assert_eq!(
        values.len(),
        body.matches("pub const ").count(),
        "one string per constant in `pods::keys`: {values:?}"
    );
    assert!(values.contains(keys::IP) && values.contains(keys::GENERATION));
    values
}

/// The keys the daemon writes: `pods::keys` without the two it only reads.
fn written_keys() -> BTreeSet<String> {
    let mut keys = pods_keys();
    keys.remove(keys::GENERATION);
    keys.remove(keys::PROBE_PORT);
    keys
}

/// Every annotation the host reads (spec section 2) or writes (sections 5
/// to 7) is one a tenant cannot set.
#[test]
fn every_key_the_host_reads_or_writes_is_protected() {
    let read_keys = [
        annotations::VM_NAME,
        annotations::VM_ID,
        annotations::BACKEND,
        annotations::OS,
        annotations::MANAGED,
        annotations::MODE,
        annotations::FORK_FROM,
        annotations::CLONE_FROM_DIR,
        annotations::RESTORE_FROM_HIBERNATE,
        annotations::GUEST_FLAVOR,
        HIBERNATE,
    ];
    assert!(
        POLICY.strings("userKeys").is_empty(),
        "{POLICY_FILE}: userKeys is for operators to fill, empty as shipped"
    );
    let pods_keys = pods_keys();
    for key in read_keys
        .into_iter()
        .chain(pods_keys.iter().map(String::as_str))
    {
        let input = update(TENANT, pod(None, &[]), pod(Some(&[(key, "x")]), &[]));
        let decision = POLICY.decide(&input).expect("evaluates");
        assert!(
            matches!(&decision, Decision::Deny(m) if m.contains(key)),
            "a tenant may set {key}: {decision:?}"
        );
    }
}

/// The policy with the per-node opt-in: each daemon identity is
/// `cocoon-fixup:<node name>` and writes only its node's pods.
static NODE_POLICY: LazyLock<Policy> =
    LazyLock::new(|| Policy::load_with(&[("daemonNodePrefix", "'cocoon-fixup:'")]));

/// `stack_pod(&[])` scheduled on another node, or on none.
fn on_node(node: Option<&str>) -> Value {
    let mut pod = stack_pod(&[]);
    match node {
        Some(node) => pod["spec"]["nodeName"] = json!(node),
        None => {
            pod["spec"].as_object_mut().unwrap().remove("nodeName");
        }
    }
    pod
}

/// The write the daemon makes when a fixup is done, on `old`.
fn done(user: &str, old: Value) -> Value {
    let mut new = old.clone();
    new["metadata"]["annotations"][STATE] = json!("done");
    update(user, old, new)
}

#[rstest]
#[case::its_own_node(done(NODE_DAEMON, stack_pod(&[])), Expect::Admit)]
#[case::another_nodes_pod(done(NODE_DAEMON, on_node(Some("worker-2"))), Expect::DaemonDeny(&["a pod on node worker-2", "daemonNodePrefix"]))]
#[case::another_nodes_daemon(done("cocoon-fixup:worker-2", stack_pod(&[])), Expect::DaemonDeny(&["a pod on node vk-cocoon"]))]
#[case::a_prefix_of_the_node_name(done("cocoon-fixup:vk", stack_pod(&[])), Expect::DaemonDeny(&["vk-cocoon"]))]
#[case::an_extension_of_the_node_name(done("cocoon-fixup:vk-cocoon-2", stack_pod(&[])), Expect::DaemonDeny(&["vk-cocoon"]))]
#[case::an_unscheduled_pod(done(NODE_DAEMON, on_node(None)), Expect::DaemonDeny(&["(none)"]))]
#[case::the_shared_user(done(FIXUP, stack_pod(&[])), Expect::DaemonDeny(&["vk-cocoon", FIXUP]))]
#[case::its_own_node_but_a_label(update(NODE_DAEMON, stack_pod(&[]), relabelled()), Expect::DaemonDeny(&["labels"]))]
#[case::its_own_node_but_the_vm_id(update(NODE_DAEMON, stack_pod(&[]), stack_pod(&[(VM_ID, Some("vm-other"))])), Expect::DaemonDeny(&[VM_ID]))]
#[case::the_stack_is_not_limited(update(VK_NODE, on_node(Some("worker-2")), edited(on_node(Some("worker-2")), &["metadata", "annotations", MANAGED], json!("false"))), Expect::Admit)]
#[case::tenants_are_not_let_in(done(TENANT, stack_pod(&[])), Expect::Deny(&[STATE]))]
fn per_node_daemons_write_only_their_nodes_pods(#[case] input: Value, #[case] expect: Expect) {
    assert_decides(&NODE_POLICY, &input, &expect);
}

/// The policy as an operator whose stack lets users hibernate their VMs
/// would set it: `vm.cocoonstack.io/hibernate` in `userKeys`.
static USER_KEYS_POLICY: LazyLock<Policy> =
    LazyLock::new(|| Policy::load_with(&[("userKeys", "['vm.cocoonstack.io/hibernate']")]));

#[rstest]
#[case::tenant_hibernates(update(TENANT, stack_pod(&[]), stack_pod(&[(HIBERNATE, Some("true"))])), Expect::Admit)]
#[case::tenant_wakes(update(TENANT, stack_pod(&[(HIBERNATE, Some("true"))]), stack_pod(&[])), Expect::Admit)]
#[case::tenant_creates_hibernated(create(TENANT, pod(Some(&[(HIBERNATE, "true")]), &[])), Expect::Admit)]
#[case::only_that_exact_key(update(TENANT, stack_pod(&[]), stack_pod(&[("vm.cocoonstack.io/hibernate-now", Some("true"))])), Expect::Deny(&["vm.cocoonstack.io/hibernate-now"]))]
#[case::other_keys_stay_protected(update(TENANT, stack_pod(&[]), stack_pod(&[(keys::PROBE_PORT, Some("22"))])), Expect::Deny(&[keys::PROBE_PORT]))]
#[case::with_a_protected_key(update(TENANT, stack_pod(&[]), stack_pod(&[(HIBERNATE, Some("true")), (IP, Some("10.0.0.9"))])), Expect::Deny(&[IP]))]
#[case::the_daemon_still_may_not(update(FIXUP, stack_pod(&[]), stack_pod(&[(HIBERNATE, Some("true"))])), Expect::DaemonDeny(&[HIBERNATE]))]
#[case::the_stack_still_may(update(COCOONSET, stack_pod(&[]), stack_pod(&[(HIBERNATE, Some("true"))])), Expect::Admit)]
fn user_keys_are_exempt_for_users_only(#[case] input: Value, #[case] expect: Expect) {
    assert_decides(&USER_KEYS_POLICY, &input, &expect);
}

/// A refusal names the protected keys, not the exempted one beside them.
#[test]
fn a_refusal_does_not_name_user_keys() {
    let input = update(
        TENANT,
        stack_pod(&[]),
        stack_pod(&[(HIBERNATE, Some("true")), (IP, Some("10.0.0.9"))]),
    );
    let Ok(Decision::Deny(message)) = USER_KEYS_POLICY.decide(&input) else {
        panic!("admitted");
    };
    assert!(!message.contains(HIBERNATE), "{message}");
}

/// `daemonKeys` in the policy are the keys the code writes, no more, no
/// fewer.
#[test]
fn the_daemon_may_write_exactly_the_keys_the_host_writes() {
    let policy: BTreeSet<String> = POLICY.strings("daemonKeys").into_iter().collect();
    assert_eq!(
        policy,
        written_keys(),
        "daemonKeys in {POLICY_FILE} and fixup_host::pods::keys (less GENERATION and PROBE_PORT) disagree"
    );
}

/// The subjects deploy/rbac.yaml binds are daemon identities of the policy,
/// not the stack's: each may write the daemon's keys and nothing else.
#[test]
fn the_identities_rbac_binds_are_the_policys_daemon() {
    let binding = document_named("deploy/rbac.yaml", "ClusterRoleBinding", "cocoon-fixup");
    let subjects = binding["subjects"].as_array().expect("subjects");
    assert!(!subjects.is_empty());
    for subject in subjects {
        let name = subject["name"].as_str().expect("subject name");
        let (daemon_list, stack_list, mut input) = match subject["kind"].as_str() {
            Some("User") => (
                "daemonUsers",
                "allowedUsers",
                update(name, stack_pod(&[]), stack_pod(&[])),
            ),
            Some("Group") => {
                let mut input = update("cocoon-fixup:n1", stack_pod(&[]), stack_pod(&[]));
                input["request"]["userInfo"]["groups"] = json!([name, "system:authenticated"]);
                ("daemonGroups", "allowedGroups", input)
            }
            _ => panic!("deploy/rbac.yaml: a subject neither User nor Group: {subject}"),
        };
        assert!(
            POLICY.strings(daemon_list).iter().any(|n| n == name),
            "{name} (deploy/rbac.yaml) is missing from {daemon_list} in {POLICY_FILE}"
        );
        assert!(
            !POLICY.strings(stack_list).iter().any(|n| n == name),
            "{name} (deploy/rbac.yaml) is on {stack_list} in {POLICY_FILE}: the daemon would write every key"
        );
        input["object"] = stack_pod(&[(STATE, Some("running"))]);
        assert_eq!(POLICY.decide(&input), Ok(Decision::Admit), "{subject}");
        input["object"] = stack_pod(&[(MANAGED, Some("false"))]);
        assert!(
            matches!(POLICY.decide(&input), Ok(Decision::Deny(_))),
            "{subject} may write {MANAGED}"
        );
    }
}

/// The embedder's role (a program that embeds cocoon-fixup and runs as
/// its own node, as vk-cocoon does) adds only the event listing the Node
/// authorizer does not give, and is bound to an identity the policy
/// counts as the stack's, so it writes what the stack may.
#[test]
fn the_embedders_role_adds_only_the_event_listing() {
    let role = document("deploy/rbac-embedder.yaml", "ClusterRole");
    assert_eq!(role["metadata"]["name"], "cocoon-fixup-embedder");
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["list"]}])
    );
    let binding = document("deploy/rbac-embedder.yaml", "ClusterRoleBinding");
    assert_eq!(binding["roleRef"]["name"], "cocoon-fixup-embedder");
    for subject in binding["subjects"].as_array().expect("subjects") {
        let name = subject["name"].as_str().expect("subject name");
        assert_eq!(subject["kind"], "User", "{subject}");
        assert!(
            POLICY.strings("allowedUsers").iter().any(|n| n == name),
            "{name} (the embedder, deploy/rbac-embedder.yaml) is not on allowedUsers in {POLICY_FILE}"
        );
    }
}

// ---------------------------------------------------------------------------
// RBAC: what the real binary asks the API server

/// `(API group, resource, verb)`, as RBAC rules name them.
type Permission = (String, String, String);

/// What the API server's authorizer checks for a request (the request info
/// of k8s.io/apiserver): the group from `/api` or `/apis/<group>`, the
/// resource (with its subresource), and the verb from the method: GET is
/// `watch` with `watch=true`, else `get` of one object and `list` of a
/// collection; POST `create`, PUT `update`, PATCH `patch`, DELETE `delete`
/// or `deletecollection`.
fn permission(r: &Request) -> Permission {
    let parts: Vec<&str> = r.path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => panic!("not a resource request: {r:?}"),
    };
    let rest = match rest {
        ["namespaces", _namespace, rest @ ..] if !rest.is_empty() => rest,
        other => other,
    };
    let (resource, name) = match rest {
        [resource] => (resource.to_string(), None),
        [resource, name] => (resource.to_string(), Some(name)),
        [resource, name, sub] => (format!("{resource}/{sub}"), Some(name)),
        _ => panic!("not a resource request: {r:?}"),
    };
    let watch = r
        .query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    let verb = match (r.method.as_str(), name.is_some()) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => panic!("a method RBAC does not name: {r:?}"),
    };
    (group.to_owned(), resource, verb.to_owned())
}

/// Every (group, resource, verb) the ClusterRole in deploy/rbac.yaml grants.
fn granted() -> BTreeSet<Permission> {
    let role = document_named("deploy/rbac.yaml", "ClusterRole", "cocoon-fixup");
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        assert!(rule.get("resourceNames").is_none(), "{rule}");
        let groups = str_list(&rule["apiGroups"], "apiGroups");
        let resources = str_list(&rule["resources"], "resources");
        let verbs = str_list(&rule["verbs"], "verbs");
        for g in &groups {
            for r in &resources {
                for v in &verbs {
                    assert!(
                        ![g, r, v].iter().any(|x| x.contains('*')),
                        "a wildcard grants what no test sees: {rule}"
                    );
                    out.insert((g.clone(), r.clone(), v.clone()));
                }
            }
        }
    }
    out
}

/// RFC 7386: apply a JSON merge patch, as the API server applies one.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(changes) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let fields = target.as_object_mut().expect("an object");
    for (key, value) in changes {
        if value.is_null() {
            fields.remove(key);
        } else {
            merge_patch(fields.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Each patch the real binary made, applied in order to the pod it
/// started from, is an update the admission policy lets the daemon's
/// identity make: what the code writes needs nothing the policy refuses.
/// With the per-node opt-in, the daemon of the pod's node (`n1`).
fn assert_the_policy_lets_the_daemon_patch(patches: &[Value]) {
    assert!(!patches.is_empty(), "the daemon patched nothing");
    for (policy, user) in [(&*POLICY, FIXUP), (&*NODE_POLICY, "cocoon-fixup:n1")] {
        let mut pod = fixup_pod();
        for patch in patches {
            let mut next = pod.clone();
            merge_patch(&mut next, patch);
            let input = update(user, pod, next.clone());
            assert_eq!(
                policy.decide(&input),
                Ok(Decision::Admit),
                "the policy refuses {user}'s patch {patch}"
            );
            pod = next;
        }
    }
}

fn permissions(requests: &[Request]) -> BTreeSet<Permission> {
    requests.iter().map(permission).collect()
}

fn perm(group: &str, resource: &str, verb: &str) -> Permission {
    (group.to_owned(), resource.to_owned(), verb.to_owned())
}

const NAMESPACE: &str = "default";
const POD_NAME: &str = "web-0";

/// The VM's name for the pod, as the stack names it (spec section 2).
fn vm_name() -> String {
    fixup_core::binding::vm_name_for_pod(NAMESPACE, POD_NAME)
}

/// A managed Linux clone on Cloud Hypervisor: a fixup is needed.
fn fixup_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": POD_NAME,
            "namespace": NAMESPACE,
            "uid": "3e0c6a57-2f1b-4d8e-9c4a-6b7d8e9f0a1b",
            "annotations": {
                (annotations::VM_NAME): vm_name(),
                (VM_ID): "vm-deploy",
                (MANAGED): "true",
                (annotations::OS): "linux",
                (keys::GENERATION): "1",
                (annotations::BACKEND): "cloud-hypervisor",
            },
        },
        "spec": {"nodeName": "n1", "containers": []},
    })
}

/// A node's directory: the fake `cocoon` (a link to fake-cocoon, which
/// plays `cocoon.json` beside it: a static NIC, so the IP is known at once,
/// and exec succeeds), an empty config and plugin directory.
fn node_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::os::unix::fs::symlink(fake_cocoon(), d.join("cocoon")).unwrap();
    let scenario = json!({
        "exec": [{"exit": 0, "done": true}],
        "inspect": {"json": {
            "id": "vm-deploy",
            "hypervisor": "cloud-hypervisor",
            "config": {"name": vm_name()},
            "network_configs": [
                {"mac": "52:54:00:12:34:56", "tap": "tap0",
                 "network": {"ip": "10.0.0.5", "prefix": 24, "gateway": "10.0.0.1"}}]}},
    });
    fs::write(d.join("cocoon.json"), scenario.to_string()).unwrap();
    fs::create_dir(d.join("plugins")).unwrap();
    fs::write(d.join("config.toml"), "").unwrap();
    dir
}

/// The pod ended ready after a successful fixup, and every request was
/// one the server serves.
fn assert_fixed(api: &FakeApi, log: &str) {
    assert_eq!(
        api.annotation(keys::LIFECYCLE_STATE).as_deref(),
        Some("ready"),
        "log:\n{log}"
    );
    assert_eq!(
        api.annotation(keys::POST_CLONE_STATE).as_deref(),
        Some("done")
    );
    assert_eq!(api.annotation(keys::IP).as_deref(), Some("10.0.0.5"));
    assert!(
        api.events()
            .iter()
            .any(|(reason, _)| reason == reasons::SUCCEEDED),
        "{:#?}",
        api.events()
    );
    api.with(|s| assert!(s.unexpected.is_empty(), "{:?}", s.unexpected));
}

/// What the daemon asked of the API server: every request, and the body of
/// every patch the server applied, in order.
struct Traffic {
    requests: Vec<Request>,
    patches: Vec<Value>,
}

fn traffic(api: &FakeApi) -> Traffic {
    api.with(|s| Traffic {
        requests: s.requests.clone(),
        patches: s
            .patches
            .iter()
            .filter(|(_, status)| *status == 200)
            .map(|(patch, _)| patch.clone())
            .collect(),
    })
}

/// The requests of `serve --node n1` through one fixup, until the pod is
/// ready; then SIGTERM.
async fn serve_traffic() -> Traffic {
    let dir = node_dir();
    let api = FakeApi::start(fixup_pod(), false).await;
    let log = dir.path().join("serve.log");
    let mut daemon = cocoon_fixup(
        dir.path(),
        &api.kubeconfig(dir.path()),
        &["serve", "--node", "n1"],
    )
    .args(["--metrics-addr", "127.0.0.1:0"])
    .stdout(Stdio::null())
    .stderr(fs::File::create(&log).unwrap())
    .spawn()
    .expect("the daemon starts");
    let start = std::time::Instant::now();
    while api.annotation(keys::LIFECYCLE_STATE).as_deref() != Some("ready") {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "gave up waiting for the fixup; daemon log:\n{}",
            fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = Pid::from_raw(i32::try_from(daemon.id().unwrap()).unwrap()).unwrap();
    kill_process(pid, Signal::TERM).unwrap();
    let status = daemon.wait().await.unwrap();
    let log = fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{status}; log:\n{log}");
    assert_fixed(&api, &log);
    traffic(&api)
}

/// The requests of `run --namespace default --pod web-0` through one fixup.
async fn run_traffic() -> Traffic {
    let dir = node_dir();
    let api = FakeApi::start(fixup_pod(), false).await;
    let out = cocoon_fixup(
        dir.path(),
        &api.kubeconfig(dir.path()),
        &["run", "--namespace", NAMESPACE, "--pod", POD_NAME],
    )
    .output()
    .await
    .expect("run runs");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{}; stdout:\n{}\nstderr:\n{log}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    assert_fixed(&api, &log);
    traffic(&api)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_grants_exactly_what_serve_and_run_use() {
    let serve_traffic = serve_traffic().await;
    let run_traffic = run_traffic().await;
    for traffic in [&serve_traffic, &run_traffic] {
        assert_the_policy_lets_the_daemon_patch(&traffic.patches);
    }
    let serve = permissions(&serve_traffic.requests);
    let run = permissions(&run_traffic.requests);

    // `run` handles one pod: read it, patch it, record events, and list
    // the events about it (the stack's wake events, spec section 2).
    let one_pod: BTreeSet<Permission> = [
        perm("", "pods", "get"),
        perm("", "pods", "patch"),
        perm("events.k8s.io", "events", "create"),
        perm("events.k8s.io", "events", "list"),
    ]
    .into();
    assert_eq!(run, one_pod, "the requests of `run`");
    // `serve` also lists and watches the node's pods.
    let mut node: BTreeSet<Permission> = one_pod;
    node.extend([perm("", "pods", "list"), perm("", "pods", "watch")]);
    assert_eq!(serve, node, "the requests of `serve`");

    let used: BTreeSet<Permission> = serve.union(&run).cloned().collect();
    let granted = granted();
    let missing: Vec<_> = used.difference(&granted).collect();
    let unused: Vec<_> = granted.difference(&used).collect();
    assert!(
        missing.is_empty() && unused.is_empty(),
        "deploy/rbac.yaml and the code disagree: used but not granted {missing:?}; \
         granted but never used {unused:?}"
    );
}

// ---------------------------------------------------------------------------
// The documents and deploy/

/// docs/operations.md's "Deployment" section, up to the next heading.
fn deployment_section() -> String {
    let doc = read(OPERATIONS);
    let start = doc
        .find("## Deployment")
        .unwrap_or_else(|| panic!("{OPERATIONS} has a Deployment section"));
    doc[start..]
        .lines()
        .enumerate()
        .take_while(|(i, line)| *i == 0 || !line.starts_with('#'))
        .map(|(_, line)| format!("{line}\n"))
        .collect()
}

/// Where the deploy files are described for operators.
const OPERATIONS: &str = "docs/operations.md";

#[test]
fn the_docs_link_the_deploy_files_and_keep_no_copies() {
    let section = deployment_section();
    for file in [
        "deploy/cocoon-fixup.service",
        "deploy/rbac.yaml",
        "deploy/admission-policy.yaml",
        "deploy/wake-event-policy.yaml",
        "deploy/rbac-embedder.yaml",
        "deploy/alerts.yaml",
        "deploy/README.md",
    ] {
        assert!(
            repo().join(file).is_file(),
            "{file} is missing from the repository"
        );
        assert!(
            section.contains(&format!("](../{file})")),
            "{OPERATIONS}'s Deployment section does not link {file}"
        );
    }
    for doc in ["README.md", OPERATIONS] {
        let text = read(doc);
        for copied in [
            "kind: ClusterRole",
            "kind: ValidatingAdmissionPolicy",
            "[Service]",
            "ExecStart=",
        ] {
            assert!(
                !text.contains(copied),
                "{doc} inlines `{copied}`: link the file in deploy/ instead, so the two cannot drift"
            );
        }
    }
}

/// deploy/README.md describes every file beside it.
#[test]
fn deploy_readme_names_every_file() {
    let readme = read("deploy/README.md");
    for entry in fs::read_dir(repo().join("deploy")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name != "README.md" {
            assert!(
                readme.contains(&name),
                "deploy/README.md does not mention {name}"
            );
        }
    }
}
