//! docs/settings.md's table of settings is made from the code: each
//! setting's flag, environment variable and help come from the command
//! line's own definition (`fixup_host::config::ConfigArgs`), its key in the
//! configuration file is the option's name there, its default is the value
//! the code falls back to (core's `SettingsBuilder`, the planner's limits,
//! the host's constants, the default paths for root and for other users),
//! and its spelling for embedders is the key the C library takes (the
//! planner's options as `cf_planner_new` lists them when it refuses an
//! unknown one; the task's `settings` as core's `RawSettings` spells them)
//! with the Go field that sends it (`go/cocoonfixup`, the `document`
//! methods of `Settings` and `Options`). The test fails when the table in
//! the file differs; `BLESS=1 cargo test -p fixup-host --test it
//! settings::` rewrites it. It also fails when a flag's `[default: ...]`
//! in `--help` does not name the code's default, or when the Go package
//! sends a key the library does not take.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{ArgAction, Args, Command};

use fixup_core::decision::{RawSettings, SettingsBuilder};
use fixup_core::plugin::cache::{CacheOwner, default_paths};
use fixup_core::plugin::{DEFAULT_PLUGIN_DIR, DEFAULT_SLOTS, Limits};
use fixup_core::probe::DEFAULT_COCOON_ROOT;
use fixup_host::config::{
    ConfigArgs, DEFAULT_CONCURRENCY, DEFAULT_CONFIG_FILE, DEFAULT_METRICS_ADDR,
};
use fixup_host::logging::{DEFAULT_LEVEL, LOG_VAR};
use fixup_host::reload;

/// The file that holds the table, from the repository root.
const DOC: &str = "docs/settings.md";
const BEGIN: &str = "<!-- The table is made from the code by host/tests/settings.rs: edit the code, then `BLESS=1 cargo test -p fixup-host --test it settings::`. -->";
const END: &str = "<!-- End of the table made from the code. -->";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One setting, spelled every way it is spelled.
#[derive(Debug, Default)]
struct Row {
    key: String,
    flag: String,
    env: String,
    embedders: String,
    default: String,
    what: String,
}

/// A default as the table shows it, and the values a flag's `[default:
/// ...]` must name.
struct DefaultValue {
    text: String,
    named: Vec<String>,
}

fn plain(text: impl Into<String>) -> DefaultValue {
    DefaultValue {
        text: text.into(),
        named: Vec::new(),
    }
}

/// One value: the table shows it in code font, and the help must name it.
fn value(v: impl ToString) -> DefaultValue {
    let v = v.to_string();
    DefaultValue {
        text: format!("`{v}`"),
        named: vec![v],
    }
}

/// A duration as the options are written: `200ms`, `3s`, `180s`, `30m`.
fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        _ if !ms.is_multiple_of(1000) => format!("{ms}ms"),
        _ if ms >= 600_000 && ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ => format!("{}s", ms / 1000),
    }
}

fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

/// An environment with `HOME` and, when `xdg`, the XDG variables set to
/// their own names, so that a default path shows how it is made.
fn env_of(xdg: bool) -> impl Fn(&str) -> Option<OsString> {
    move |name: &str| match name {
        "HOME" => Some("~".into()),
        "XDG_CACHE_HOME" | "XDG_STATE_HOME" if xdg => Some(format!("${name}").into()),
        _ => None,
    }
}

/// A path default that differs for root and for other users: root's,
/// then the user's with the XDG variable, then without it.
fn per_user(
    root: &str,
    path: impl Fn(u32, &dyn Fn(&str) -> Option<OsString>) -> Option<PathBuf>,
) -> DefaultValue {
    let show = |p: Option<PathBuf>| p.expect("a default path").display().to_string();
    let root_path = show(path(0, &env_of(false)));
    let xdg = show(path(1000, &env_of(true)));
    let home = show(path(1000, &env_of(false)));
    DefaultValue {
        text: format!("`{root_path}` for {root}; otherwise `{xdg}`, else `{home}`"),
        named: vec![root_path, xdg, home],
    }
}

/// The code's default of the option `key` (a file key, or an embedder's
/// key for the settings only embedders have).
fn code_default(key: &str) -> DefaultValue {
    let settings = SettingsBuilder::default()
        .build()
        .expect("the defaults build");
    let limits = Limits::default();
    let cache = |owner: CacheOwner, euid: u32, var: &dyn Fn(&str) -> Option<OsString>| {
        default_paths(owner, euid, var)
    };
    match key {
        "config" => value(DEFAULT_CONFIG_FILE).with(", when it exists"),
        "plugin_dir" => value(DEFAULT_PLUGIN_DIR).with(", when it exists"),
        "cache_dir" => per_user("`run` and `serve` as root", |euid, var| {
            cache(owner_of(euid), euid, var).dir
        }),
        "cache_key" => per_user("`run` and `serve` as root", |euid, var| {
            cache(owner_of(euid), euid, var).key
        }),
        "plugin_fuel" => value(limits.fuel),
        "plugin_deadline" => value(duration(limits.deadline)),
        "plugin_memory_mib" => value(limits.memory_bytes >> 20),
        "plan_max_steps" => value(limits.plan.max_steps),
        "plan_max_bytes" => value(limits.plan.max_bytes),
        "cocoon_bin" => value(fixup_host::cocoon::DEFAULT_COCOON_BIN),
        "cocoon_root" => value(DEFAULT_COCOON_ROOT),
        "lease_file" => value(fixup_host::ready::DEFAULT_LEASE_FILE),
        "state_dir" => per_user("root", |euid, var| {
            fixup_core::memory::store::state_dir_for(euid, var)
        }),
        "retry_interval" => value(duration(settings.retry.interval)),
        "retry_budget" => value(duration(settings.retry.budget)),
        "exec_timeout" => value(duration(settings.retry.exec_timeout)),
        "inspect_timeout" => value(duration(settings.inspect_timeout)),
        "ip_wait" => value(duration(settings.ready.budget)),
        "ip_poll" => value(duration(fixup_host::ready::DEFAULT_LEASE_POLL)),
        "renew_after" => value(duration(settings.ready.renew_after)),
        "renew_timeout" => value(duration(settings.ready.renew_timeout)),
        "dhcp_recovery_after" => value(duration(settings.ready.dhcp_recovery_after)),
        "wake_event_window" => value(duration(settings.wake.event_window)),
        "wake_grace" => value(duration(settings.wake.grace)),
        "wake_event_reporters" => value(settings.wake.reporters.join(", ")),
        "sac_deadline" => value(duration(settings.sac_deadline)),
        "oci_store" => per_user("root", |euid, var| {
            fixup_host::oci::store_dir_for(euid, var)
        }),
        "accept_legacy_vm_names" => plain(on_off(settings.binding.accept_legacy_names)),
        "accept_annotated_vm_names" => plain(on_off(settings.binding.accept_annotated_names)),
        "concurrency" => value(DEFAULT_CONCURRENCY),
        "metrics_addr" => value(DEFAULT_METRICS_ADDR),
        "plugin_reload_interval" => value(duration(reload::DEFAULT_INTERVAL)),
        "plugin_rollback_after" => value(reload::DEFAULT_WATCH_FIXUPS),
        "plugin_rollback_failure_ratio" => value(reload::DEFAULT_MAX_FAILURE_RATIO),
        "plugin_rollback_min_namespaces" => value(reload::DEFAULT_MIN_NAMESPACES),
        "no_cache" => plain("off"),
        "allowed_plugins" => plain("none: every plugin file loads"),
        "plugins" => plain("none"),
        "oci_plain_http" => plain("none: every registry over HTTPS"),
        "plugin_policy" => plain("none: each plugin's own guest policy alone"),
        "plugin_failure" => plain("`fail` for every plugin"),
        "plugin_trust" => plain("none: no pinned plugin needs a signature"),
        "log" => value(DEFAULT_LEVEL),
        "dhcp_recovery" => plain(on_off(settings.ready.dhcp_recovery)),
        "windows_renew" => plain(on_off(settings.ready.renew)),
        "lifecycle_intents" => plain(on_off(settings.lifecycle_intents)),
        "slots" => value(DEFAULT_SLOTS),
        "strict" => plain("off"),
        other => panic!(
            "no default for the setting `{other}`: give it one in code_default (host/tests/settings.rs)"
        ),
    }
}

/// `run` and `serve` use the node's cache as root; everyone else, and
/// every other command, a user's own.
fn owner_of(euid: u32) -> CacheOwner {
    if euid == 0 {
        CacheOwner::Node
    } else {
        CacheOwner::User
    }
}

impl DefaultValue {
    fn with(mut self, tail: &str) -> Self {
        self.text.push_str(tail);
        self
    }
}

/// What the settings that have no flag set: the file's tables, the
/// binary's own options and the settings only embedders have.
fn what(key: &str) -> &'static str {
    match key {
        "config" => "The configuration file (TOML); its keys are the first column",
        "plugin_policy" => {
            "Configuration file only, `[plugin_policy.NAME]`: narrows the guest policy of the plugin named NAME (built-ins included), keys `writes`, `removes` (path patterns), `runs` (argv rules), `special_modes` and `links` (interface name patterns for `name-link` steps), as a plugin declares them (docs/plugins.md, \"Guest policy\"). A plan must fit both the plugin's policy and the narrowing; a key left out allows nothing of its kind. `plugin inspect` shows both"
        }
        "plugin_failure" => {
            "Configuration file only, `[plugin_failure]` with `NAME = \"fail\"` or `\"fallback\"`: what happens when the plugin file named NAME traps or panics, breaches a limit or its guest policy, returns an unusable plan, or declines a VM it claimed (docs/plugins.md, \"When a plugin fails: the failure policy\")"
        }
        "plugin_trust" => {
            "Configuration file only, `[plugin_trust.\"SCOPE\"]` (SCOPE `HOST[:PORT]` or `HOST[:PORT]/REPOSITORY`; the longest that covers a pinned reference applies), keys `keys` (paths of the vendors' PEM public keys, as `cosign generate-key-pair` writes them) and `require` (`any-of`, the default, `all-of` or `none`): whose cosign signatures a plugin pinned from a registry needs before it is pulled or loaded (docs/plugins.md, \"Signed plugins\")"
        }
        "node" => {
            "`serve`: the node whose pods to serve (required). `run`: the pod's node, listed to check an annotated VM name (`--accept-annotated-vm-names`); without it such a VM is not used"
        }
        "log" => {
            "The log filter: a bare level (`error`, `warn`, `info`, `debug`, `trace`) for cocoon-fixup's own lines and what plugins log, or a `tracing` filter taken as written (docs/operations.md, \"Logs\")"
        }
        "dhcp_recovery" => "Whether an all-DHCP Linux clone gets the DHCP recovery pass at all",
        "windows_renew" => "Whether a Windows guest gets the `ipconfig /renew` nudge at all",
        "lifecycle_intents" => {
            "The embedder owns the lifecycle keys: the task writes none of them and hands each change over as a `publish` action (docs/embedding.md)"
        }
        "slots" => "Plugin instances kept ready; calls beyond them at once wait for one",
        "strict" => {
            "A plugin file that does not load fails the planner, as `plan` does; otherwise the others serve, as `serve` does, and the failures are listed"
        }
        other => panic!("no words for the setting `{other}` in host/tests/settings.rs"),
    }
}

/// The keys the Go package sends the library, each with the Go field it
/// comes from (`Settings.RetryBudget`, `Options.Limits.Fuel`), read from
/// the `document` methods of `go/cocoonfixup`: `(key, field, method's
/// type)`.
fn go_keys() -> Vec<(String, String, String)> {
    let dir = repo().join("go/cocoonfixup");
    let mut files: Vec<_> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.ends_with(".go") && !name.ends_with("_test.go")
        })
        .collect();
    files.sort();
    let mut keys = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        let mut receiver: Option<(String, String)> = None;
        let mut aliases: BTreeMap<String, String> = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("func (")
                && let Some((recv, tail)) = rest.split_once(')')
                && tail.trim_start().starts_with("document()")
                && let Some((var, ty)) = recv.split_once(' ')
            {
                receiver = Some((var.to_owned(), ty.trim().to_owned()));
                aliases.clear();
                continue;
            }
            let Some((var, ty)) = &receiver else { continue };
            if line == "}" {
                receiver = None;
                continue;
            }
            // `l := o.Limits`: `l.Fuel` is then `Options.Limits.Fuel`.
            if let Some((alias, source)) = line.trim().split_once(" := ")
                && let Some(field) = source.strip_prefix(&format!("{var}."))
                && field.chars().all(|c| c.is_ascii_alphanumeric())
            {
                aliases.insert(alias.to_owned(), format!("{ty}.{field}"));
                continue;
            }
            let key = line
                .split_once("set(\"")
                .or_else(|| line.split_once("doc[\""))
                .and_then(|(_, rest)| rest.split_once('"'));
            let Some((key, rest)) = key else { continue };
            let field = rest
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
                .find_map(|token| {
                    let (prefix, field) = token.split_once('.')?;
                    let owner = if prefix == var {
                        ty.clone()
                    } else {
                        aliases.get(prefix)?.clone()
                    };
                    // `l.Deadline.Milliseconds()` comes from `Deadline`.
                    let field = field.split('.').next()?;
                    field
                        .starts_with(|c: char| c.is_ascii_uppercase())
                        .then(|| format!("{owner}.{field}"))
                });
            if let Some(field) = field {
                keys.push((key.to_owned(), field, ty.clone()));
            }
        }
    }
    assert!(
        !keys.is_empty(),
        "no `set(\"key\", ...)` found in the document methods of go/cocoonfixup: update go_keys in host/tests/settings.rs to how the Go package now spells its settings"
    );
    keys
}

/// The keys core's `RawSettings` takes (the C task option `settings`).
fn task_keys() -> Vec<String> {
    let all = RawSettings {
        retry_interval_ms: Some(1),
        retry_budget_ms: Some(1),
        exec_timeout_ms: Some(1),
        inspect_timeout_ms: Some(1),
        ip_wait_ms: Some(1),
        renew_after_ms: Some(1),
        renew_timeout_ms: Some(1),
        dhcp_recovery_after_ms: Some(1),
        wake_event_window_ms: Some(1),
        wake_grace_ms: Some(1),
        sac_deadline_ms: Some(1),
        wake_event_reporters: Some(vec![]),
        accept_legacy_vm_names: true,
        accept_annotated_vm_names: true,
        dhcp_recovery: Some(true),
        windows_renew: Some(true),
        lifecycle_intents: true,
    };
    match serde_json::to_value(all).unwrap() {
        serde_json::Value::Object(map) => map.keys().cloned().collect(),
        other => panic!("RawSettings is not an object: {other}"),
    }
}

/// The keys the C library's `cf_planner_new` takes, as its own answer to
/// an unknown key lists them (through `cf_call`'s JSON ops).
fn planner_keys() -> Vec<String> {
    let session = cocoon_fixup::wire::Session::new();
    let answer =
        session.call(r#"{"id": 1, "op": "planner_new", "options": {"no-such-option": 1}}"#);
    let message = answer["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("an unknown planner option was not refused: {answer}"));
    let (_, expected) = message.split_once("expected one of ").unwrap_or_else(|| {
        panic!("the library's refusal of an unknown planner option lists no keys: {message}")
    });
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// An embedder's key names the file key it stands for, less `_ms`.
fn file_key(embedder_key: &str) -> &str {
    embedder_key.strip_suffix("_ms").unwrap_or(embedder_key)
}

/// The `[default: ...]` of a help text, and the text without it.
fn split_default(help: &str) -> (String, Option<String>) {
    match help.find("[default: ") {
        Some(start) => {
            let end = start + help[start..].find(']').expect("a closed [default: ...]");
            let text = format!("{}{}", help[..start].trim_end(), &help[end + 1..]);
            (
                text.trim().to_owned(),
                Some(help[start + 10..end].to_owned()),
            )
        }
        None => (help.trim().to_owned(), None),
    }
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// The table, made from the code.
fn table() -> String {
    let go = go_keys();
    let task = task_keys();
    // The task keys the Go package sends must be keys the library takes.
    for (key, field, ty) in &go {
        if ty == "Settings" {
            assert!(
                task.contains(key),
                "go/cocoonfixup sends `{key}` (from {field}) in the task's settings, which core's RawSettings does not take"
            );
        }
    }
    let planner = planner_keys();
    for (key, field, ty) in &go {
        if ty != "Settings" {
            assert!(
                planner.contains(key),
                "go/cocoonfixup sends `{key}` (from {field}) in the planner's options, which the C library's cf_planner_new does not take"
            );
        }
    }
    let go_field = |key: &str| {
        go.iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, field, _)| format!("; Go `{field}`"))
            .unwrap_or_default()
    };
    let mut embedders: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // A key both take is the planner's: the task takes the binding policy
    // from its planner.
    for key in &planner {
        embedders
            .entry(file_key(key).to_owned())
            .or_default()
            .push(format!("planner `{key}`{}", go_field(key)));
    }
    for key in task.iter().filter(|key| !planner.contains(key)) {
        embedders
            .entry(file_key(key).to_owned())
            .or_default()
            .push(format!("task `{key}`{}", go_field(key)));
    }

    let mut rows = Vec::new();
    let mut problems = Vec::new();
    let config = code_default("config");
    rows.push(Row {
        key: String::new(),
        flag: "`--config FILE`".into(),
        env: "`COCOON_FIXUP_CONFIG`".into(),
        default: config.text,
        what: what("config").into(),
        ..Row::default()
    });
    let command = ConfigArgs::augment_args(Command::new("cocoon-fixup"));
    for arg in command.get_arguments() {
        let key = arg.get_id().as_str().to_owned();
        let long = arg.get_long().expect("every setting has a flag");
        let takes_value = !matches!(arg.get_action(), ArgAction::SetTrue);
        let mut flag = format!("`--{long}");
        if takes_value && let Some(names) = arg.get_value_names() {
            flag.push(' ');
            flag.push_str(
                &names
                    .iter()
                    .map(|n| n.as_str())
                    .collect::<Vec<_>>()
                    .join(" "),
            );
        }
        flag.push('`');
        if arg.get_value_delimiter() == Some(',') {
            flag.push_str(" (repeat, or comma-separated)");
        }
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        let (text, help_default) = split_default(&help);
        let default = code_default(&key);
        if let Some(help_default) = &help_default {
            for named in &default.named {
                if !help_default.contains(named.as_str()) {
                    problems.push(format!(
                        "--{long}: its help says [default: {help_default}], but the code's default is {named}"
                    ));
                }
            }
        }
        rows.push(Row {
            flag,
            env: arg
                .get_env()
                .map(|e| format!("`{}`", e.to_string_lossy()))
                .unwrap_or_default(),
            embedders: embedders.remove(&key).unwrap_or_default().join("<br>"),
            default: default.text,
            what: text,
            key: format!("`{key}`"),
        });
    }
    for key in ["plugin_policy", "plugin_failure", "plugin_trust"] {
        rows.push(Row {
            key: format!("`[{key}]`"),
            embedders: embedders.remove(key).unwrap_or_default().join("<br>"),
            default: code_default(key).text,
            what: what(key).into(),
            ..Row::default()
        });
    }
    rows.push(Row {
        flag: "`--node NAME` (`run`, `serve`)".into(),
        env: "`NODE_NAME`".into(),
        default: "none".into(),
        what: what("node").into(),
        ..Row::default()
    });
    rows.push(Row {
        env: format!("`{LOG_VAR}`"),
        default: code_default("log").text,
        what: what("log").into(),
        ..Row::default()
    });
    // What is left is spelled only by embedders.
    for (key, spellings) in std::mem::take(&mut embedders) {
        rows.push(Row {
            embedders: spellings.join("<br>"),
            default: code_default(&key).text,
            what: what(&key).into(),
            ..Row::default()
        });
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    let mut out = String::from(
        "| file key | flag | environment | C and Go | default | what it sets |\n|---|---|---|---|---|---|\n",
    );
    for row in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            cell(&row.key),
            cell(&row.flag),
            cell(&row.env),
            cell(&row.embedders),
            cell(&row.default),
            cell(&row.what)
        ));
    }
    out
}

#[test]
fn the_settings_table_is_the_codes() {
    let fresh = table();
    let path = repo().join(DOC);
    let doc = fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {DOC}: {e}"));
    let start = doc
        .find(BEGIN)
        .unwrap_or_else(|| panic!("{DOC} lacks the line {BEGIN}"));
    let body = start + BEGIN.len() + 1;
    let end = doc[body..]
        .find(END)
        .map(|i| body + i)
        .unwrap_or_else(|| panic!("{DOC} lacks the line {END}"));
    let current = &doc[body..end];
    if current == fresh {
        return;
    }
    if std::env::var_os("BLESS").is_some() {
        let updated = format!("{}{fresh}{}", &doc[..body], &doc[end..]);
        fs::write(&path, updated).unwrap();
        return;
    }
    let old: Vec<&str> = current.lines().collect();
    let new: Vec<&str> = fresh.lines().collect();
    let mut diff = String::new();
    for line in &old {
        if !new.contains(line) {
            diff.push_str(&format!("- {line}\n"));
        }
    }
    for line in &new {
        if !old.contains(line) {
            diff.push_str(&format!("+ {line}\n"));
        }
    }
    panic!(
        "{DOC}'s table of settings is not the code's: run `BLESS=1 cargo test -p fixup-host --test it settings::` and review the diff\n{diff}"
    );
}
