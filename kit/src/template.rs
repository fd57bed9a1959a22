//! `cocoon-fixup plugin new`: a vendor plugin folder from the template.
//!
//! The template is the folder `plugins/template/` of this repository,
//! embedded here file by file with `include_str!`: the folder is the single
//! source, and a unit test fails when a file is added there but not here.
//! Its files carry placeholders, replaced in one pass (a value is never
//! searched for placeholders again):
//!
//! | placeholder | value for `acme-net` |
//! |---|---|
//! | `{{name}}` | `acme-net`: package, plugin and default flavour name |
//! | `{{crate_name}}` | `acme_net`: the Rust crate, and the `.wasm` file name |
//! | `{{type_name}}` | `AcmeNetPlugin`: the type implementing `Plugin` |
//! | `{{sdk_path}}` | the SDK folder, absolute, escaped for a TOML string |
//!
//! The new crate is its own workspace (a `[workspace]` table) and depends on
//! the SDK by path, so it builds anywhere on the machine: `cargo test`
//! natively, `cargo build --release --target wasm32-wasip2` for the
//! component. The SDK inherits its version and its `wit-bindgen` dependency
//! from this repository's workspace and finds the WIT contract relative to
//! itself, so the path must point into a cocoon-fixup checkout.

use std::io;
use std::path::{Path, PathBuf};

/// Every file of `plugins/template/`, by its path inside the new folder.
pub const TEMPLATE_FILES: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("../../plugins/template/Cargo.toml"),
    ),
    (
        "src/lib.rs",
        include_str!("../../plugins/template/src/lib.rs"),
    ),
    (
        "cases/example.json",
        include_str!("../../plugins/template/cases/example.json"),
    ),
    (
        "README.md",
        include_str!("../../plugins/template/README.md"),
    ),
    (
        ".gitignore",
        include_str!("../../plugins/template/.gitignore"),
    ),
];

/// The longest plugin name: the host refuses longer ones at load, and the
/// name must fit a DNS label where it is used as a flavour.
pub const MAX_NAME_LEN: usize = 63;

/// The SDK's package name; `--sdk` must point at a folder holding it.
pub const SDK_PACKAGE: &str = "cocoon-fixup-sdk";

/// Names cargo refuses for a package (Rust keywords, the standard library's
/// crates, its own build folders) and the SDK's own name, which would make
/// the plugin depend on itself.
const RESERVED_NAMES: &[&str] = &[
    "abstract",
    "alloc",
    "as",
    "async",
    "await",
    "become",
    "box",
    "break",
    "build",
    "const",
    "continue",
    "core",
    "crate",
    "deps",
    "do",
    "dyn",
    "else",
    "enum",
    "examples",
    "extern",
    "false",
    "final",
    "fn",
    "for",
    "gen",
    "if",
    "impl",
    "in",
    "incremental",
    "let",
    "loop",
    "macro",
    "match",
    "mod",
    "move",
    "mut",
    "override",
    "priv",
    "proc-macro",
    "pub",
    "ref",
    "return",
    "self",
    "static",
    "std",
    "struct",
    "super",
    "test",
    "trait",
    "true",
    "try",
    "type",
    "typeof",
    "unsafe",
    "unsized",
    "use",
    "virtual",
    "where",
    "while",
    "yield",
    SDK_PACKAGE,
];

/// Why no plugin folder was made. Nothing is left behind after any of them.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error(
        "plugin name {name:?} {reason}: use 1..={MAX_NAME_LEN} lowercase letters, digits and `-`, starting with a letter (for example `acme-net`)"
    )]
    InvalidName { name: String, reason: &'static str },
    #[error("{} already exists: pick another name, or another parent folder with --dir", .path.display())]
    Exists { path: PathBuf },
    #[error("parent folder {} does not exist: create it, or pass another one with --dir", .path.display())]
    NoParent { path: PathBuf },
    #[error(
        "SDK folder {} has no Cargo.toml: pass --sdk with the path of plugins/sdk in a cocoon-fixup checkout",
        .path.display()
    )]
    NoSdk { path: PathBuf },
    #[error(
        "{} is not the cocoon-fixup SDK (its Cargo.toml does not name package `{SDK_PACKAGE}`): pass --sdk with the path of plugins/sdk in a cocoon-fixup checkout",
        .path.display()
    )]
    NotSdk { path: PathBuf },
    #[error(
        "SDK path {} is not UTF-8, so Cargo.toml cannot name it: move the checkout to a plain path",
        .path.display()
    )]
    NonUtf8Sdk { path: PathBuf },
    #[error("cannot {action} {}", .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The SDK of the checkout this binary was built from
/// (`<checkout>/plugins/sdk`), canonicalised when it still exists. The CLI
/// passes it to [`new_plugin`] unless `--sdk` is given; a binary copied to
/// another machine needs `--sdk`.
pub fn default_sdk_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/sdk");
    dir.canonicalize().unwrap_or(dir)
}

/// Writes a new plugin crate at `<parent_dir>/<name>/` from the template,
/// depending on the SDK at `sdk`, and returns the new folder.
///
/// `name` must be 1..=63 lowercase letters, digits and `-`, start with a
/// letter, and not be a name cargo refuses. The folder must not exist yet;
/// `parent_dir` must. On any failure the partly written folder is removed.
pub fn new_plugin(name: &str, parent_dir: &Path, sdk: &Path) -> Result<PathBuf, TemplateError> {
    validate_name(name)?;
    let sdk = check_sdk(sdk)?;
    let sdk_text = sdk
        .to_str()
        .ok_or_else(|| TemplateError::NonUtf8Sdk { path: sdk.clone() })?;
    if !parent_dir.is_dir() {
        return Err(TemplateError::NoParent {
            path: parent_dir.to_owned(),
        });
    }
    let dir = parent_dir.join(name);
    std::fs::create_dir(&dir).map_err(|source| {
        if source.kind() == io::ErrorKind::AlreadyExists {
            TemplateError::Exists { path: dir.clone() }
        } else {
            TemplateError::Io {
                action: "create",
                path: dir.clone(),
                source,
            }
        }
    })?;

    let crate_name = name.replace('-', "_");
    let type_name = type_name(name);
    let sdk_path = toml_string_content(sdk_text);
    let vars = [
        ("name", name),
        ("crate_name", crate_name.as_str()),
        ("type_name", type_name.as_str()),
        ("sdk_path", sdk_path.as_str()),
    ];
    match write_files(&dir, &vars) {
        Ok(()) => Ok(dir),
        Err(e) => {
            // Best effort: the error that matters is the one returned.
            let _ = std::fs::remove_dir_all(&dir);
            Err(e)
        }
    }
}

fn write_files(dir: &Path, vars: &[(&str, &str)]) -> Result<(), TemplateError> {
    for (rel, text) in TEMPLATE_FILES {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| TemplateError::Io {
                action: "create",
                path: parent.to_owned(),
                source,
            })?;
        }
        std::fs::write(&path, render(text, vars)).map_err(|source| TemplateError::Io {
            action: "write",
            path,
            source,
        })?;
    }
    Ok(())
}

fn validate_name(name: &str) -> Result<(), TemplateError> {
    let invalid = |reason| {
        Err(TemplateError::InvalidName {
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return invalid("is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return invalid("is too long");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return invalid("has a character other than a-z, 0-9 and -");
    }
    if !name.as_bytes()[0].is_ascii_lowercase() {
        return invalid("does not start with a letter");
    }
    if RESERVED_NAMES.contains(&name) {
        return invalid("is reserved by Rust or cargo");
    }
    Ok(())
}

/// The SDK folder, absolute, after checking that it holds the SDK.
fn check_sdk(sdk: &Path) -> Result<PathBuf, TemplateError> {
    let manifest = sdk.join("Cargo.toml");
    let Ok(text) = std::fs::read_to_string(&manifest) else {
        return Err(TemplateError::NoSdk {
            path: sdk.to_owned(),
        });
    };
    let is_sdk = toml::from_str::<toml::Table>(&text).is_ok_and(|t| {
        t.get("package")
            .and_then(|p| p.get("name"))
            .and_then(toml::Value::as_str)
            == Some(SDK_PACKAGE)
    });
    if !is_sdk {
        return Err(TemplateError::NotSdk {
            path: sdk.to_owned(),
        });
    }
    sdk.canonicalize().map_err(|source| TemplateError::Io {
        action: "resolve",
        path: sdk.to_owned(),
        source,
    })
}

/// `acme-net` -> `AcmeNetPlugin`. The suffix keeps the type clear of every
/// name the template imports from the SDK (`Plan`, `Step`, ...).
fn type_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 6);
    for part in name.split('-') {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            out.push(first.to_ascii_uppercase());
            out.extend(chars);
        }
    }
    out.push_str("Plugin");
    out
}

/// `s` escaped for the inside of a TOML basic string (`"..."`).
fn toml_string_content(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

/// Replaces each `{{key}}` of `vars` in one pass; anything else is copied.
fn render(text: &str, vars: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let hit = after.find("}}").and_then(|end| {
            vars.iter()
                .find(|(key, _)| *key == &after[..end])
                .map(|(_, value)| (end, *value))
        });
        match hit {
            Some((end, value)) => {
                out.push_str(value);
                rest = &after[end + 2..];
            }
            None => {
                out.push_str("{{");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rstest::rstest;

    use super::*;

    fn template_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/template")
    }

    fn files_under(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).expect("readable") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                files_under(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).expect("under root");
                out.insert(rel.to_str().expect("utf-8").replace('\\', "/"));
            }
        }
    }

    /// A fake SDK folder: only its manifest is read.
    fn fake_sdk(parent: &Path, folder: &str) -> PathBuf {
        let sdk = parent.join(folder);
        std::fs::create_dir_all(&sdk).expect("mkdir");
        std::fs::write(
            sdk.join("Cargo.toml"),
            format!("[package]\nname = \"{SDK_PACKAGE}\"\nversion = \"0.1.0\"\n"),
        )
        .expect("write");
        sdk
    }

    fn read(dir: &Path, rel: &str) -> String {
        std::fs::read_to_string(dir.join(rel)).expect("generated file")
    }

    #[test]
    fn every_file_of_the_template_folder_is_embedded_as_itself() {
        let mut on_disk = BTreeSet::new();
        files_under(&template_dir(), &template_dir(), &mut on_disk);
        let embedded: BTreeSet<String> = TEMPLATE_FILES
            .iter()
            .map(|(rel, _)| (*rel).to_owned())
            .collect();
        assert_eq!(on_disk, embedded, "plugins/template/ and TEMPLATE_FILES");
        for (rel, text) in TEMPLATE_FILES {
            assert_eq!(read(&template_dir(), rel), *text, "{rel}");
        }
    }

    #[test]
    fn the_default_sdk_is_this_checkouts() {
        let sdk = default_sdk_dir();
        assert!(sdk.is_absolute(), "{}", sdk.display());
        assert_eq!(check_sdk(&sdk).expect("the SDK"), sdk);
    }

    #[test]
    fn writes_every_template_file_with_the_placeholders_replaced() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let sdk = default_sdk_dir();
        let dir = new_plugin("acme-net", tmp.path(), &sdk).expect("generated");
        assert_eq!(dir, tmp.path().join("acme-net"));
        for (rel, _) in TEMPLATE_FILES {
            let text = read(&dir, rel);
            assert!(!text.contains("{{"), "{rel} keeps a placeholder:\n{text}");
        }

        let manifest: toml::Table = toml::from_str(&read(&dir, "Cargo.toml")).expect("TOML");
        assert_eq!(manifest["package"]["name"].as_str(), Some("acme-net"));
        assert_eq!(
            manifest["dependencies"][SDK_PACKAGE]["path"].as_str(),
            sdk.to_str()
        );
        assert!(manifest["workspace"].is_table(), "a workspace of its own");
        assert_eq!(
            manifest["lib"]["crate-type"],
            toml::Value::Array(vec!["cdylib".into(), "rlib".into()])
        );
        assert_eq!(
            manifest["profile"]["release"]["strip"],
            toml::Value::Boolean(true)
        );

        let lib = read(&dir, "src/lib.rs");
        assert!(lib.contains("pub const NAME: &str = \"acme-net\";"));
        assert!(lib.contains("pub struct AcmeNetPlugin;"));
        assert!(lib.contains("export_plugin!(AcmeNetPlugin);"));
        assert!(lib.contains("#[test]"), "a native unit test");

        let case: serde_json::Value =
            serde_json::from_str(&read(&dir, "cases/example.json")).expect("JSON");
        assert_eq!(case["facts"]["flavor"], "acme-net");
        assert_eq!(case["scenario"], "oci-networkd");

        let readme = read(&dir, "README.md");
        for command in [
            "cargo test",
            "cargo build --release --target wasm32-wasip2",
            "cocoon-fixup plugin test target/wasm32-wasip2/release/acme_net.wasm cases/",
        ] {
            assert!(readme.contains(command), "README lacks `{command}`");
        }
    }

    #[test]
    fn an_awkward_sdk_path_stays_one_toml_string() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let sdk = fake_sdk(tmp.path(), "odd \"sdk\" \\ {{name}}");
        let dir = new_plugin("p1", tmp.path(), &sdk).expect("generated");
        let manifest: toml::Table = toml::from_str(&read(&dir, "Cargo.toml")).expect("TOML");
        assert_eq!(
            manifest["dependencies"][SDK_PACKAGE]["path"].as_str(),
            sdk.canonicalize().expect("exists").to_str()
        );
    }

    #[rstest]
    #[case::empty("", "is empty")]
    #[case::too_long(&"a".repeat(64), "is too long")]
    #[case::uppercase("Acme", "has a character")]
    #[case::underscore("acme_net", "has a character")]
    #[case::dot("acme.net", "has a character")]
    #[case::space("acme net", "has a character")]
    #[case::slash("../acme", "has a character")]
    #[case::unicode("ácme", "has a character")]
    #[case::digit_first("1acme", "does not start with a letter")]
    #[case::dash_first("-acme", "does not start with a letter")]
    #[case::keyword("fn", "is reserved")]
    #[case::std_test("test", "is reserved")]
    #[case::the_sdk("cocoon-fixup-sdk", "is reserved")]
    fn bad_names_are_refused_and_nothing_is_written(#[case] name: &str, #[case] reason: &str) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let err = new_plugin(name, tmp.path(), &default_sdk_dir()).expect_err("refused");
        assert!(matches!(err, TemplateError::InvalidName { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains(reason), "{message}");
        assert!(message.contains("for example `acme-net`"), "{message}");
        assert_eq!(std::fs::read_dir(tmp.path()).expect("dir").count(), 0);
    }

    #[rstest]
    #[case("a")]
    #[case("nm-keyfile")]
    #[case("a1-b2")]
    #[case(&"a".repeat(MAX_NAME_LEN))]
    fn good_names_are_accepted(#[case] name: &str) {
        validate_name(name).expect("accepted");
    }

    #[test]
    fn an_existing_folder_is_left_alone() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(tmp.path().join("acme")).expect("mkdir");
        std::fs::write(tmp.path().join("acme/keep"), "mine").expect("write");
        let err = new_plugin("acme", tmp.path(), &default_sdk_dir()).expect_err("refused");
        assert!(matches!(err, TemplateError::Exists { .. }), "{err:?}");
        assert!(err.to_string().contains("already exists"), "{err}");
        assert_eq!(read(&tmp.path().join("acme"), "keep"), "mine");
        assert!(!tmp.path().join("acme/Cargo.toml").exists());
    }

    #[test]
    fn a_missing_parent_folder_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let err =
            new_plugin("acme", &tmp.path().join("nope"), &default_sdk_dir()).expect_err("refused");
        assert!(matches!(err, TemplateError::NoParent { .. }), "{err:?}");
        assert!(err.to_string().contains("--dir"), "{err}");
    }

    #[test]
    fn a_folder_without_the_sdk_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let err = new_plugin("acme", tmp.path(), tmp.path()).expect_err("no Cargo.toml");
        assert!(matches!(err, TemplateError::NoSdk { .. }), "{err:?}");
        assert!(err.to_string().contains("has no Cargo.toml"), "{err}");
        assert!(err.to_string().contains("--sdk"), "{err}");

        std::fs::write(
            tmp.path().join("Cargo.toml"),
            "[package]\nname = \"other\"\n",
        )
        .expect("write");
        let err = new_plugin("acme", tmp.path(), tmp.path()).expect_err("another crate");
        assert!(matches!(err, TemplateError::NotSdk { .. }), "{err:?}");
        assert!(!tmp.path().join("acme").exists());
    }

    #[rstest]
    #[case("acme-net", "AcmeNetPlugin")]
    #[case("a", "APlugin")]
    #[case("a1-2b", "A12bPlugin")]
    #[case("plan", "PlanPlugin")]
    fn type_names_are_camel_case_with_a_suffix(#[case] name: &str, #[case] expected: &str) {
        assert_eq!(type_name(name), expected);
    }

    #[test]
    fn render_replaces_in_one_pass_and_keeps_unknown_braces() {
        let vars = [("name", "{{crate_name}}"), ("crate_name", "x")];
        assert_eq!(
            render("a {{name}} b {{other}} c {{crate_name}} {{", &vars),
            "a {{crate_name}} b {{other}} c x {{"
        );
    }
}
