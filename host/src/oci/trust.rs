//! The operator's trust policy for plugins pinned from a registry:
//! `[plugin_trust."SCOPE"]` tables of the configuration file, each naming
//! the vendors' public keys and how many of them must have signed.
//!
//! A scope is a registry (`HOST[:PORT]`), or a repository and those under
//! it (`HOST/acme` covers `HOST/acme` and `HOST/acme/net`, not
//! `HOST/acmex`). The longest scope that covers a reference is its rule; a
//! reference no rule covers needs no signature. The keys are read, under
//! the trust rules of plugin files, when the configuration is resolved, so
//! a start or a reload with a key that cannot be read is refused.
//! [`super::signature::verify`] judges a reference's signatures under its
//! rule.

use std::path::PathBuf;

use serde::Deserialize;

use super::PluginRef;
use super::bounded;
use super::signature::PublicKey;

/// How many of a rule's keys must have signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Require {
    /// A signature by at least one of the keys.
    AnyOf,
    /// A signature by each of the keys.
    AllOf,
    /// None: signatures by the keys are shown, and nothing is refused.
    None,
}

/// The trust rule of one scope.
#[derive(Debug, Clone, PartialEq)]
pub struct TrustRule {
    /// `HOST[:PORT]` or `HOST[:PORT]/REPO-PREFIX`, as in the configuration.
    pub scope: String,
    pub require: Require,
    pub keys: Vec<PublicKey>,
}

impl TrustRule {
    /// Whether a signature is required for what this rule covers.
    pub fn required(&self) -> bool {
        self.require != Require::None
    }

    /// Whether the rule covers `reference`: its registry, and its
    /// repository at a `/` boundary.
    fn covers(&self, reference: &PluginRef) -> bool {
        let (registry, prefix) = match self.scope.split_once('/') {
            Some((registry, prefix)) => (registry, Some(prefix)),
            None => (self.scope.as_str(), None),
        };
        registry == reference.registry
            && prefix.is_none_or(|prefix| {
                reference.repository == prefix
                    || reference
                        .repository
                        .strip_prefix(prefix)
                        .is_some_and(|rest| rest.starts_with('/'))
            })
    }

    /// The keys, as messages list them.
    pub(super) fn keys_text(&self) -> String {
        self.keys
            .iter()
            .map(|k| k.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The operator's trust policy: `[plugin_trust."SCOPE"]` in the
/// configuration file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrustPolicy {
    pub rules: Vec<TrustRule>,
}

/// One `[plugin_trust."SCOPE"]` table as written in the file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTrustRule {
    /// Paths of PEM public keys.
    #[serde(default)]
    pub keys: Vec<PathBuf>,
    /// `any-of` (the default), `all-of` or `none`.
    #[serde(default)]
    pub require: Option<Require>,
}

impl TrustPolicy {
    /// The policy of the file's tables: each scope checked, each key read.
    /// `Err` names the table and what is wrong.
    pub fn from_raw<'a>(
        raw: impl IntoIterator<Item = (&'a String, &'a RawTrustRule)>,
    ) -> Result<Self, String> {
        let mut rules = Vec::new();
        for (scope, rule) in raw {
            let at = format!("plugin_trust.\"{}\"", bounded(scope));
            // A scope is a reference without its pin: HOST alone gets a
            // repository to make one.
            let probe = if scope.contains('/') {
                format!("oci://{scope}:t")
            } else {
                format!("oci://{scope}/r:t")
            };
            if probe.parse::<PluginRef>().is_err() {
                return Err(format!(
                    "{at}: the scope is not HOST[:PORT] or HOST[:PORT]/REPOSITORY (lowercase, no tag or digest)"
                ));
            }
            let require = rule.require.unwrap_or(Require::AnyOf);
            if rule.keys.is_empty() {
                return Err(format!(
                    "{at}: no keys; list the vendor's public keys (`keys = [\"/etc/cocoon-fixup/keys/vendor.pub\"]`)"
                ));
            }
            let keys = rule
                .keys
                .iter()
                .map(|path| PublicKey::read(path).map_err(|e| format!("{at}: {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            refuse_duplicate_keys(&keys).map_err(|e| format!("{at}: {e}"))?;
            rules.push(TrustRule {
                scope: scope.clone(),
                require,
                keys,
            });
        }
        Ok(TrustPolicy { rules })
    }

    /// The rule for `reference`: the longest scope that covers it.
    pub fn rule_for(&self, reference: &PluginRef) -> Option<&TrustRule> {
        self.rules
            .iter()
            .filter(|rule| rule.covers(reference))
            .max_by_key(|rule| rule.scope.len())
    }

    /// The key files of every rule, each once: `serve` watches them, so
    /// that a key replaced or removed on disk reloads the set.
    pub fn key_files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = Vec::new();
        for key in self.rules.iter().flat_map(|rule| &rule.keys) {
            if !files.contains(&key.path) {
                files.push(key.path.clone());
            }
        }
        files
    }
}

/// A rule's keys are distinct keys: the same key in two files would count
/// twice for `all-of`.
fn refuse_duplicate_keys(keys: &[PublicKey]) -> Result<(), String> {
    for (i, key) in keys.iter().enumerate() {
        if let Some(twin) = keys[..i].iter().find(|other| other.same_key(key)) {
            return Err(format!(
                "{key} and {twin} are the same public key; list each key once"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn key(seed: u8, name: &str) -> PublicKey {
        use p256::pkcs8::EncodePublicKey as _;
        let pem = p256::ecdsa::SigningKey::from_slice(&[seed; 32])
            .unwrap()
            .verifying_key()
            .to_public_key_pem(p256::pkcs8::LineEnding::LF)
            .unwrap();
        PublicKey::from_pem(Path::new(name), &pem).unwrap()
    }

    #[test]
    fn the_longest_scope_that_covers_a_reference_is_its_rule() {
        let k = key(1, "/k.pub");
        let policy = TrustPolicy {
            rules: [
                "registry.example",
                "registry.example/acme",
                "registry.example/acme/net",
            ]
            .into_iter()
            .map(|scope| TrustRule {
                scope: scope.into(),
                require: Require::AnyOf,
                keys: vec![k.clone()],
            })
            .collect(),
        };
        for (reference, scope) in [
            (
                "oci://registry.example/acme/net:v1",
                Some("registry.example/acme/net"),
            ),
            (
                "oci://registry.example/acme/net/x:v1",
                Some("registry.example/acme/net"),
            ),
            (
                "oci://registry.example/acme/netx:v1",
                Some("registry.example/acme"),
            ),
            ("oci://registry.example/acmex:v1", Some("registry.example")),
            ("oci://other.example/acme/net:v1", None),
            ("oci://registry.example:5000/acme/net:v1", None),
        ] {
            let reference: PluginRef = reference.parse().unwrap();
            assert_eq!(
                policy.rule_for(&reference).map(|r| r.scope.as_str()),
                scope,
                "{reference}"
            );
        }
    }

    /// `serve` watches each key file once, whichever rules name it.
    #[test]
    fn key_files_lists_each_file_once() {
        let rule = |scope: &str, keys: Vec<PublicKey>| TrustRule {
            scope: scope.into(),
            require: Require::AnyOf,
            keys,
        };
        let policy = TrustPolicy {
            rules: vec![
                rule(
                    "reg/acme",
                    vec![key(1, "/keys/a.pub"), key(2, "/keys/b.pub")],
                ),
                rule("reg/other", vec![key(1, "/keys/a.pub")]),
            ],
        };
        assert_eq!(
            policy.key_files(),
            [PathBuf::from("/keys/a.pub"), PathBuf::from("/keys/b.pub")]
        );
    }

    /// A scope is read as a reference is: one the registry's URL would
    /// rewrite (an uppercase or dotted host, a `.`, `..` or empty segment)
    /// is refused when the configuration is read, and so is such a
    /// reference, so neither can escape the rule meant for it.
    #[test]
    fn scopes_and_references_the_url_would_rewrite_are_refused() {
        for scope in [
            "REG/acme",
            "reg./acme",
            "reg/acme/..",
            "reg/./acme",
            "reg/acme/",
            "reg//acme",
        ] {
            let raw = RawTrustRule {
                keys: vec![PathBuf::from("/nonexistent/k.pub")],
                require: None,
            };
            let scope = scope.to_owned();
            let err = TrustPolicy::from_raw([(&scope, &raw)]).unwrap_err();
            assert!(err.contains("the scope is not"), "{scope}: {err}");
        }
        let hex = "0".repeat(64);
        for escape in [
            format!("oci://reg/other/../acme/net@sha256:{hex}"),
            format!("oci://REG/acme/x@sha256:{hex}"),
            format!("oci://reg./acme/x@sha256:{hex}"),
            format!("oci://reg/acme/./x@sha256:{hex}"),
        ] {
            assert!(escape.parse::<PluginRef>().is_err(), "{escape}");
        }
        let policy = TrustPolicy {
            rules: vec![TrustRule {
                scope: "reg/acme".into(),
                require: Require::AnyOf,
                keys: vec![key(1, "/k.pub")],
            }],
        };
        let sibling: PluginRef = format!("oci://reg/acme-evil/x@sha256:{hex}")
            .parse()
            .unwrap();
        assert!(policy.rule_for(&sibling).is_none());
    }

    /// The same key in two files is refused: it would count twice for
    /// `all-of`.
    #[test]
    fn the_same_key_twice_in_a_rule_is_refused() {
        let twice = [key(1, "/keys/a.pub"), key(1, "/keys/a-copy.pub")];
        let err = refuse_duplicate_keys(&twice).unwrap_err();
        assert!(
            err.contains("/keys/a-copy.pub and /keys/a.pub are the same public key"),
            "{err}"
        );
        assert!(refuse_duplicate_keys(&[key(1, "/keys/a.pub"), key(2, "/keys/b.pub")]).is_ok());
    }
}
