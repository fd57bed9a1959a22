//! The command line: every subcommand's flags and their help (clap).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use fixup_host::config::{ConfigArgs, OciArgs, PluginConfigArgs};

/// Post-clone guest network fixup for cocoon microVMs.
///
/// Decides whether a cloned VM needs commands run inside its guest to get
/// its network back, produces them with sandboxed WebAssembly plugins, runs
/// them within a retry budget, waits for the guest's IP and reports to
/// Kubernetes. Every option can also be set in the environment or in the
/// configuration file (flags > environment > file > defaults).
#[derive(Debug, Parser)]
#[command(name = "cocoon-fixup", version, propagate_version = true)]
pub(crate) struct Cli {
    /// Configuration file (TOML) [default: /etc/cocoon-fixup/config.toml, when it exists]
    #[arg(long, global = true, value_name = "FILE", env = "COCOON_FIXUP_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Classify a VM and print the fixup plan for it (nothing is run).
    ///
    /// Plugins are loaded only when the VM needs a fixup; then every
    /// configured plugin must load (with a warm cache only the code of
    /// those the scenario selects is read). `plugin inspect` checks plugin
    /// files without a VM.
    ///
    /// Example:
    ///   cocoon-fixup plan --pod examples/oci-static/pod.json --vm examples/oci-static/vm.json
    Plan(PlanArgs),
    /// Run the whole flow for one pod: fixup, IP wait, annotations, events.
    ///
    /// Prints a JSON summary. Exit codes: 0 ready (or nothing to do),
    /// 2 the fixup (or the Windows serial-console pass) failed, now or
    /// earlier, 3 no IP in time, 4 interrupted
    /// or the pod went away (or the stack took it over), 5 the VM its annotations
    /// point at is not the pod's (nothing was run), 1 could not run.
    Run(RunArgs),
    /// Prepare a running pod's VM to be cloned, before its snapshot is
    /// taken: the plugin that plans its clones' network scenario plans
    /// `prepare` (network files that match the NIC by driver instead of
    /// the parent's MAC, a DHCP client identity from the MAC), and it runs
    /// in the guest as a fixup does (same exec path, markers and retry
    /// budget). When it took, the pod gets vm.cocoonstack.io/prepared
    /// naming the plugin; give its clones the same annotation. Running it
    /// again is harmless. A Windows guest, or a plugin that does not
    /// declare `prepare`, has nothing to prepare.
    ///
    /// Prints a JSON summary. Exit codes: 0 prepared (or nothing to
    /// prepare: `errors` says why), 2 the preparation failed (the pod is
    /// not annotated; an attempt may have left its files in the guest,
    /// which the next preparation rewrites), 4 interrupted, or the pod is gone or
    /// left alone (`hands_off`: deleting, hibernating, not settled, macOS,
    /// not managed), 5 the VM its annotations point at is not the pod's
    /// (nothing was run), 1 could not run (the guest may have been
    /// prepared without the pod saying so: run it again).
    ///
    /// Example:
    ///   cocoon-fixup prepare -n apps --pod web-parent
    Prepare(RunArgs),
    /// The node daemon: watch this node's pods and run the flow for every
    /// managed clone that needs it; serve /metrics and /healthz.
    Serve(ServeArgs),
    /// Write, test and inspect plan plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Make a pod's plugin calls into `plugin test` cases, to reproduce a
    /// field failure without the cluster.
    ///
    /// Reads the pod (from the API server, like `run`, or from --pod
    /// POD.json with --vm VM.json, like `plan`) and its VM (`cocoon vm
    /// inspect`), refuses a VM that is not the pod's own, and writes one
    /// case per plugin call: the facts, the scenario, that plugin's plan
    /// (or refusal) as `expect`, and a `context` with where it came from,
    /// the plugins used now and, for a failed pod, its error chain and the
    /// plugin versions its hint and events name. Writes nothing to the
    /// cluster. A plan of several calls (fc-mac + oci-networkd on
    /// Firecracker) needs --output DIR/ (one `<plugin>-<scenario>.json`
    /// each; the trailing `/` makes a new folder) or --plugin NAME. An
    /// existing file is replaced only with --force.
    ///
    /// Capture on the pod's node, then test the vendor's plugin against it:
    ///
    ///   cocoon-fixup capture -n apps --pod web-0 --output web-0.json
    ///
    ///   cocoon-fixup plugin test acme_net.wasm web-0.json
    ///
    /// From files, one case per plugin call into a folder:
    ///
    ///   cocoon-fixup capture --pod pod.json --vm vm.json --events events.json --output cases/
    Capture(CaptureArgs),
    /// Serve the library's JSON ops on standard input and output, for an
    /// embedder that does not link the C library (the Go package, unless
    /// built with a link tag, starts one such child and keeps it).
    ///
    /// One request per line, `{"id": N, "op": "...", ...}`; one response
    /// per line, `{"id": N, "ok": ...}` or `{"id": N, "error": {"status",
    /// "message"}}`, as each request finishes (many run at once). The ops
    /// and their fields are the C library's calls (docs/embedding.md).
    /// Logs go to standard error. Ends at the end of its input, after the
    /// requests in flight. The configuration file is not read: a planner's
    /// options come in its `planner_new` request.
    ///
    /// Example:
    ///   echo '{"id": 1, "op": "abi"}' | cocoon-fixup embed
    Embed,
}

#[derive(Debug, Args)]
pub(crate) struct CaptureArgs {
    /// The pod's namespace (read from the cluster).
    #[arg(
        long,
        short = 'n',
        value_name = "NS",
        default_value = "default",
        conflicts_with = "vm"
    )]
    pub(crate) namespace: String,
    /// The pod's name; with --vm, a file as `kubectl get pod NAME -o json`
    /// prints it.
    #[arg(long, value_name = "NAME|POD.json")]
    pub(crate) pod: String,
    /// The VM as `cocoon vm inspect --json ID` prints it: read the pod and
    /// the VM from files instead of the cluster.
    #[arg(long, value_name = "VM.json")]
    pub(crate) vm: Option<PathBuf>,
    /// The pod's events as `kubectl get events -o json` prints them (with
    /// --vm; only the host's events about this pod are kept).
    #[arg(long, value_name = "EVENTS.json", requires = "vm")]
    pub(crate) events: Option<PathBuf>,
    /// The snapshot's source image, with --vm [default: the record's `config.image` on a normal clone]
    #[arg(long, value_name = "URL", requires = "vm")]
    pub(crate) source_image: Option<String>,
    /// Override the boot kind read from the pod annotations [default: resumed for a pod whose post-clone-state is running]
    #[arg(long, value_enum)]
    pub(crate) boot: Option<Boot>,
    /// Only the case of this plugin's call.
    #[arg(long, value_name = "NAME")]
    pub(crate) plugin: Option<String>,
    /// The case file; a folder (ending with `/`, created when missing) for one `<plugin>-<scenario>.json` per call [default: standard output, for one call]
    #[arg(long, value_name = "PATH")]
    pub(crate) output: Option<PathBuf>,
    /// Capture a pod the daemon would leave alone (deleting, hibernating,
    /// the stack's, not managed, not a clone); `context.daemon` says so.
    #[arg(long)]
    pub(crate) anyway: bool,
    /// Replace case files that exist already (never through a symbolic link).
    #[arg(long)]
    pub(crate) force: bool,
    #[command(flatten)]
    pub(crate) config: ConfigArgs,
}

#[derive(Debug, Subcommand)]
pub(crate) enum PluginCommand {
    /// Run a plugin on case files (facts in, expected plan or error out).
    ///
    /// CASES is a case file or a folder of `*.json` case files (the format
    /// is in docs/plugins.md, "5. Testing"). Each case runs in the real
    /// sandbox with the configured limits; a mismatch shows a diff. Exit
    /// code 1 when any case fails or a case file is invalid.
    ///
    /// Example:
    ///   cocoon-fixup plugin test target/wasm32-wasip2/release/acme_net.wasm cases/
    Test(PluginTestArgs),
    /// Show what a plugin file is and whether the host would load it.
    ///
    /// Name, version, contract, sha256, scenarios, flavours, imports and
    /// the guest policy (what its plans may write, remove and run in a
    /// guest, with a warning for rules that allow arbitrary code, and the
    /// configuration file's narrowing of it), then `accepted` or
    /// `refused: <why and the fix>`. The file is judged with every file of
    /// the plugin directory loaded as the node loads them (a file elsewhere
    /// as its copy there); the reload's `NAME.cases/` gate is not run.
    /// Exit code 1 when refused or when the plugin directory would not load
    /// as a whole (JSON: `success`).
    Inspect(PluginInspectArgs),
    /// Create a new plugin crate from the template.
    ///
    /// Example:
    ///   cocoon-fixup plugin new acme-net --dir ~/src
    New(PluginNewArgs),
    /// Publish a plugin file to an OCI registry; prints the reference
    /// pinned to the manifest digest, for `plugins = [...]`.
    ///
    /// The artifact is one `application/wasm` layer with config
    /// `application/vnd.wasm.config.v0+json`. Credentials, when the registry
    /// wants them: COCOON_FIXUP_OCI_USERNAME and COCOON_FIXUP_OCI_PASSWORD.
    ///
    /// With --sign-key it signs the digest as `cosign sign --key` does (the
    /// `sha256-<digest>.sig` tag), for nodes whose `[plugin_trust]` lists
    /// your public key. With cosign's own encrypted key, sign the printed
    /// digest with cosign v2 instead:
    ///   cosign sign --key cosign.key --tlog-upload=false HOST/REPO@sha256:DIGEST
    /// or with cosign v3, whose default Sigstore bundles nodes do not read:
    ///   cosign sign --key cosign.key --new-bundle-format=false \
    ///     --use-signing-config=false --tlog-upload=false HOST/REPO@sha256:DIGEST
    ///
    /// Example:
    ///   cocoon-fixup plugin push acme_net.wasm oci://registry.example/acme/net:1.0
    Push(PluginPushArgs),
    /// Pull a plugin by digest from an OCI registry and verify it, into a
    /// file (--output) or the plugin store.
    ///
    /// A tag is refused unless --allow-tag: it is then resolved to its
    /// digest, which is printed so you can pin it.
    ///
    /// The cosign signatures the registry has for the digest are checked
    /// against the configuration's `[plugin_trust]` and the keys that
    /// signed are printed; a plugin whose rule requires a signature it
    /// lacks is refused and nothing is written (docs/plugins.md, "Signed
    /// plugins").
    ///
    /// Example:
    ///   cocoon-fixup plugin pull oci://registry.example/acme/net@sha256:... --output acme_net.wasm
    Pull(Box<PluginPullArgs>),
    /// List the plugin files `serve` rolled back and quarantined, or
    /// release one so that it loads again.
    ///
    /// A rollback keeps the digest of the version it took out in the
    /// quarantine file beside the node's cache key
    /// (/var/lib/cocoon-fixup/quarantine for root), with which plugin, when
    /// and in which namespaces it failed; `plan`, `run` and `serve` refuse
    /// that file until it changes. `--release SHA256` removes its line: a
    /// running `serve` notices within its reload interval and loads the
    /// plugin directory again.
    ///
    /// Example:
    ///   cocoon-fixup plugin quarantine --release 3f5a...
    Quarantine(PluginQuarantineArgs),
}

#[derive(Debug, Args)]
pub(crate) struct PluginQuarantineArgs {
    /// Take this digest (64 hex digits, as listed) out of the quarantine.
    #[arg(long, value_name = "SHA256")]
    pub(crate) release: Option<String>,
    /// How to print the list.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub(crate) output: Output,
    #[command(flatten)]
    pub(crate) config: PluginConfigArgs,
}

#[derive(Debug, Args)]
pub(crate) struct PluginPushArgs {
    /// The plugin component (`.wasm`).
    #[arg(value_name = "PLUGIN.wasm")]
    pub(crate) plugin: PathBuf,
    /// Where to publish it: oci://HOST/REPO:TAG.
    #[arg(value_name = "REFERENCE")]
    pub(crate) reference: String,
    /// Sign the pushed digest with this key: an unencrypted PKCS#8 ECDSA
    /// P-256 private key in PEM (`-----BEGIN PRIVATE KEY-----`), a file of
    /// root's or yours not writable by others. Its public key is what the
    /// nodes list in `[plugin_trust]`
    #[arg(long, value_name = "KEY.pem")]
    pub(crate) sign_key: Option<PathBuf>,
    /// Speak plain HTTP to this reference's registry instead of HTTPS (a
    /// registry on loopback).
    #[arg(long)]
    pub(crate) plain_http: bool,
}

#[derive(Debug, Args)]
pub(crate) struct PluginPullArgs {
    /// oci://HOST/REPO@sha256:DIGEST (or :TAG with --allow-tag).
    #[arg(value_name = "REFERENCE")]
    pub(crate) reference: String,
    /// Resolve a tag to the digest it names now, and print that digest.
    #[arg(long)]
    pub(crate) allow_tag: bool,
    /// Write the plugin to this file instead of the plugin store.
    #[arg(long, value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
    /// Speak plain HTTP to this reference's registry instead of HTTPS (a
    /// registry on loopback).
    #[arg(long)]
    pub(crate) plain_http: bool,
    #[command(flatten)]
    pub(crate) oci: OciArgs,
}

#[derive(Debug, Args)]
pub(crate) struct PluginTestArgs {
    /// The plugin component (`.wasm`).
    #[arg(value_name = "PLUGIN.wasm")]
    pub(crate) plugin: PathBuf,
    /// A case file, or a folder of them.
    #[arg(value_name = "CASES")]
    pub(crate) cases: PathBuf,
    /// Write each case's actual result into its `expect` (review the diff).
    #[arg(long)]
    pub(crate) bless: bool,
    /// After each case's result, print the hint script the host would
    /// render from the plan (as `plan` prints it: steps in phase order,
    /// checked against the node's limits), or why there is none; a plan
    /// the node would refuse fails the case.
    #[arg(long)]
    pub(crate) render: bool,
    /// How to print the result.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub(crate) output: Output,
    #[command(flatten)]
    pub(crate) config: PluginConfigArgs,
}

#[derive(Debug, Args)]
pub(crate) struct PluginInspectArgs {
    /// The plugin component (`.wasm`).
    #[arg(value_name = "PLUGIN.wasm")]
    pub(crate) plugin: PathBuf,
    /// How to print the result.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub(crate) output: Output,
    #[command(flatten)]
    pub(crate) config: PluginConfigArgs,
}

#[derive(Debug, Args)]
pub(crate) struct PluginNewArgs {
    /// The plugin's name: lowercase letters, digits and `-`.
    pub(crate) name: String,
    /// Where to create the plugin's folder.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub(crate) dir: PathBuf,
    /// The cocoon-fixup SDK folder (`plugins/sdk` of a checkout) [default: the checkout this binary was built from]
    #[arg(long, value_name = "PATH")]
    pub(crate) sdk: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Output {
    /// For people.
    Text,
    /// One JSON object (schema in docs/cli.md).
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Boot {
    Clone,
    Fork,
    Wake,
    Resumed,
}

#[derive(Debug, Args)]
pub(crate) struct PlanArgs {
    /// The pod, as `kubectl get pod NAME -o json` prints it.
    #[arg(long, value_name = "POD.json")]
    pub(crate) pod: PathBuf,
    /// The VM, as `cocoon vm inspect --json ID` prints it.
    #[arg(long, value_name = "VM.json")]
    pub(crate) vm: PathBuf,
    /// The snapshot's source image [default: the record's `config.image` on a normal clone]
    #[arg(long, value_name = "URL")]
    pub(crate) source_image: Option<String>,
    /// Override the boot kind read from the pod annotations [default: resumed for a pod whose post-clone-state is running, as the daemon resumes it]
    #[arg(long, value_enum)]
    pub(crate) boot: Option<Boot>,
    /// How to print the result.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub(crate) output: Output,
    #[command(flatten)]
    pub(crate) config: ConfigArgs,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The pod's namespace.
    #[arg(long, short = 'n', value_name = "NS", default_value = "default")]
    pub(crate) namespace: String,
    /// The pod's name.
    #[arg(long, value_name = "NAME")]
    pub(crate) pod: String,
    /// The pod's node, whose pods are listed to check that no other pod
    /// claims the VM's name; needed only for a VM named by the pod's
    /// vm.cocoonstack.io/name annotation under --accept-annotated-vm-names
    /// (without it such a VM is not used)
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub(crate) node: Option<String>,
    #[command(flatten)]
    pub(crate) config: ConfigArgs,
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The node whose pods to serve (usually the downward API's spec.nodeName).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub(crate) node: String,
    #[command(flatten)]
    pub(crate) config: ConfigArgs,
}
