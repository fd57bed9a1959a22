//! The `plugin` subcommands: `test`, `inspect`, `new`, `push`, `pull`,
//! `quarantine`.

use std::path::Path;

use anyhow::{Context, Result};

use crate::args::*;
use crate::assemble::PULL_TIMEOUT;
use crate::commands::*;
use fixup_core::display;
use fixup_host::oci::{self, PluginRef, RegistryOptions, Tags, signature};
use fixup_kit::{self as kit, template};

pub(crate) fn run_plugin_test(args: &PluginTestArgs, config: Option<&Path>) -> Result<u8> {
    let settings = args.config.resolve(config)?;
    let report = kit::test_plugin(
        kit::engine_options(&settings.planner.engine),
        &args.plugin,
        &args.cases,
        kit::TestOptions {
            bless: args.bless,
            render: args.render,
        },
    )?;
    if let Output::Text = args.output {
        for warning in report.cases.iter().flat_map(|c| &c.warnings) {
            eprintln!("{}", display::terminal_text(&format!("warning: {warning}")));
        }
    }
    match args.output {
        Output::Json => print_json(&report)?,
        Output::Text => print_terminal(&report.to_string()),
    }
    Ok(if report.success() { 0 } else { 1 })
}

pub(crate) fn run_plugin_inspect(args: &PluginInspectArgs, config: Option<&Path>) -> Result<u8> {
    let settings = args.config.resolve(config)?;
    let inspector = kit::Inspector::new(
        kit::engine_options(&settings.planner.engine),
        settings.planner.plugin_dir.as_deref(),
    )?;
    let pins = settings.pinned.stored_files();
    let signed = pins
        .files
        .iter()
        .filter(|file| !file.signers.is_empty())
        .map(oci::PinnedFile::describe)
        .collect();
    let files = pins.files.into_iter().map(|file| file.path).collect();
    let inspector = inspector
        .with_pinned(files, pins.missing)
        .with_pinned_trust(signed, pins.refused);
    let inspection = inspector.inspect(&args.plugin);
    match args.output {
        Output::Json => print_json(&inspection)?,
        Output::Text => print_terminal(&inspection.to_string()),
    }
    Ok(if inspection.success() { 0 } else { 1 })
}

/// List the quarantine `serve` keeps, or release one digest from it.
pub(crate) fn run_plugin_quarantine(
    args: &PluginQuarantineArgs,
    config: Option<&Path>,
) -> Result<u8> {
    use fixup_core::plugin::quarantine::QuarantineFile;
    // The node's file: the one `serve` keeps beside its cache key.
    let settings = args.config.resolve_for_node(config)?;
    let file = QuarantineFile::beside_key(settings.planner.engine.cache_key.as_deref()).context(
        "no place for the quarantine file: give --cache-key (HOME and XDG_STATE_HOME are unset)",
    )?;
    let path = file.path();
    if let Some(digest) = &args.release {
        let digest = fixup_core::plugin::parse_sha256(digest).map_err(anyhow::Error::msg)?;
        if !file
            .release(&digest)
            .with_context(|| format!("cannot rewrite {}", path.display()))?
        {
            anyhow::bail!(
                "{digest} is not quarantined in {}: `cocoon-fixup plugin quarantine` lists what is",
                path.display()
            );
        }
        println!(
            "released {digest} from {}: `plan` and `run` load that file again, a running `serve` reloads its plugin directory within its reload interval",
            path.display()
        );
        return Ok(0);
    }
    let entries = file.entries();
    match args.output {
        Output::Json => {
            let entries: Vec<_> = entries
                .iter()
                .map(|(sha256, note)| serde_json::json!({"sha256": sha256, "note": note}))
                .collect();
            print_json(&serde_json::json!({"file": path, "quarantined": entries}))?;
        }
        Output::Text if entries.is_empty() => {
            println!("nothing is quarantined ({})", path.display());
        }
        Output::Text => {
            let mut text = format!("quarantined by a rollback ({}):\n", path.display());
            for (sha256, note) in &entries {
                text.push_str(&format!("  {sha256}  {note}\n"));
            }
            text.push_str("release one with: cocoon-fixup plugin quarantine --release SHA256\n");
            print_terminal(&text);
        }
    }
    Ok(0)
}

pub(crate) fn run_plugin_new(args: &PluginNewArgs) -> Result<u8> {
    let sdk = args.sdk.clone().unwrap_or_else(template::default_sdk_dir);
    let dir = template::new_plugin(&args.name, &args.dir, &sdk)?;
    println!("created {}", dir.display());
    Ok(0)
}

/// Registry options for a push or pull of `reference`: plain HTTP to its
/// registry when asked, besides the configured ones.
pub(crate) fn registry_options(
    reference: &PluginRef,
    plain_http: bool,
    configured: &RegistryOptions,
) -> RegistryOptions {
    let mut options = RegistryOptions::from_env(configured.plain_http.clone());
    if plain_http {
        options.plain_http.push(reference.registry.clone());
    }
    options
}

pub(crate) async fn run_plugin_push(args: &PluginPushArgs) -> Result<u8> {
    let reference: PluginRef = args.reference.parse()?;
    let wasm = read_bytes(&args.plugin)?;
    // Read before anything is pushed: a key that cannot sign stops here.
    let key = args
        .sign_key
        .as_deref()
        .map(signature::SigningKey::read)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let options = registry_options(&reference, args.plain_http, &RegistryOptions::default());
    let registry = oci::Registry::new(&options)?;
    let pinned = registry.push(&reference, &wasm).await?;
    println!("pushed {}: pin {pinned}", args.plugin.display());
    if let Some(key) = key {
        registry
            .push_signature(&pinned, &key.sign(&pinned))
            .await
            .with_context(|| format!("signing {pinned} with {}", key.path().display()))?;
        println!(
            "signed {pinned} with {} (tag {})",
            key.path().display(),
            signature::signature_tag(pinned.digest().unwrap_or_default())
        );
    }
    Ok(0)
}

pub(crate) async fn run_plugin_pull(args: &PluginPullArgs, config: Option<&Path>) -> Result<u8> {
    let reference: PluginRef = args.reference.parse()?;
    let tags = if args.allow_tag {
        Tags::Resolve
    } else {
        Tags::Refuse
    };
    let settings = args.oci.resolve(config)?;
    let options = registry_options(&reference, args.plain_http, &settings.pinned.registry);
    let registry = oci::Registry::new(&options)?;
    let trust = &settings.pinned.trust;
    // A pinned reference's signatures are checked before its plugin is
    // downloaded, a tag's once the registry resolved it; either way before
    // anything is written: a plugin the trust policy refuses is not pulled.
    let work = async {
        let early = match reference.digest() {
            Some(_) => Some(pull_signatures(&registry, &reference, trust).await?),
            None => None,
        };
        let artifact = registry.pull(&reference, tags).await?;
        let checked = match early {
            Some(checked) => checked,
            None => pull_signatures(&registry, &artifact.reference, trust).await?,
        };
        anyhow::Ok((artifact, checked))
    };
    let (artifact, (signatures, signed)) = tokio::time::timeout(PULL_TIMEOUT, work)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "pulling {reference} took longer than {PULL_TIMEOUT:?}: check the registry"
            )
        })??;
    if reference.digest().is_none() {
        println!("{reference} is {}: pin this", artifact.reference);
    }
    let path = match &args.output {
        Some(path) => {
            std::fs::write(path, &artifact.wasm)
                .with_context(|| format!("cannot write {}", path.display()))?;
            path.clone()
        }
        None => {
            let store = settings
                .pinned
                .store
                .as_deref()
                .ok_or(oci::OciError::NoStore)?;
            let store = oci::Store::open(store)?;
            let hex = artifact.reference.digest().unwrap_or_default();
            if let Some(signatures) = &signatures {
                store.put_signatures(hex, signatures)?;
            }
            store.put(&artifact)?
        }
    };
    println!(
        "pulled {} (plugin sha256 {}) to {}",
        artifact.reference,
        artifact.wasm_sha256,
        path.display()
    );
    println!("{}: {signed}", artifact.reference);
    Ok(0)
}

/// The signatures of `pinned` and what they say under `trust`: an error
/// when its rule requires signatures they do not meet, or the registry
/// cannot be asked for them; otherwise best effort (no signatures, and
/// why, when the registry cannot be asked).
async fn pull_signatures(
    registry: &oci::Registry,
    pinned: &PluginRef,
    trust: &oci::TrustPolicy,
) -> Result<(Option<Vec<signature::Signature>>, String)> {
    let rule = trust.rule_for(pinned);
    let fetched = match registry.signatures(pinned).await {
        Ok(fetched) => fetched,
        Err(e) if rule.is_some_and(|rule| rule.required()) => return Err(e.into()),
        Err(e) => {
            return Ok((
                None,
                format!("signatures not checked: asking the registry for them failed: {e}"),
            ));
        }
    };
    let found = fetched.signatures.len();
    let signed = match rule {
        Some(rule) => {
            let signers = fetched.verify(rule, pinned)?;
            if signers.is_empty() {
                format!(
                    "not signed by a key of `[plugin_trust.\"{}\"]` ({found} signature(s) found; it requires none)",
                    rule.scope
                )
            } else {
                let signers: Vec<String> = signers.iter().map(ToString::to_string).collect();
                format!("signed by {}", signers.join(", "))
            }
        }
        None => format!(
            "signatures not checked: no `[plugin_trust]` rule covers it ({found} signature(s) found)"
        ),
    };
    Ok((Some(fetched.signatures), signed))
}

pub(crate) fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}
