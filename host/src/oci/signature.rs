//! Plugin signatures: the ones `cosign sign --key` makes, checked offline
//! against the public keys the operator's trust policy names.
//!
//! The format is cosign's "simple signing" one. A signature is a small JSON
//! payload ([`SIMPLE_SIGNING_MEDIA_TYPE`]) whose
//! `critical.image.docker-manifest-digest` names the manifest it vouches
//! for, and an ECDSA P-256 signature (ASN.1 DER, base64, SHA-256 over the
//! payload's bytes) in the annotation [`SIGNATURE_ANNOTATION`] of the
//! layer that holds the payload. cosign puts those layers in a manifest
//! tagged `sha256-<digest>.sig` in the plugin's repository
//! ([`signature_tag`]), or, asked for the OCI 1.1 referrers, in a manifest
//! of artifact type [`SIGNATURE_ARTIFACT_TYPE`] whose subject is the plugin,
//! listed by the referrers API or, on a registry without it, in the index
//! tagged `sha256-<digest>` ([`referrers_tag`]).
//!
//! What is checked, for each key of the policy: that one of the signatures
//! verifies under the key, and that the payload it signs is a cosign image
//! signature naming the pinned manifest digest. The payload's
//! `docker-reference` is shown, not required: a plugin copied to a mirror
//! keeps its vendor's signature. Nothing here reaches the network: no
//! transparency log, no certificate authority, no keyless identities; the
//! keys are what the operator put in the configuration.
//!
//! Which keys must have signed is the trust policy's ([`super::trust`]).

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use p256::ecdsa::signature::Verifier as _;
use p256::ecdsa::{Signature as EcdsaSignature, VerifyingKey};
use p256::pkcs8::DecodePublicKey as _;
use serde::{Deserialize, Serialize};

use super::trust::{Require, TrustRule};
use super::{PluginRef, bounded, sha256_hex};

/// The media type of a layer holding a simple-signing payload.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation that holds the base64 signature of the payload.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The artifact type of a signature manifest attached as an OCI referrer.
pub const SIGNATURE_ARTIFACT_TYPE: &str = "application/vnd.dev.cosign.artifact.sig.v1+json";
/// The artifact type of the Sigstore bundles cosign v3 attaches by default
/// instead of simple signatures: recognized only to say so.
pub const BUNDLE_ARTIFACT_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// How to sign so that nodes read the signature, for the hints.
macro_rules! how_to_sign {
    () => {
        "sign with cosign v2 (`cosign sign --key KEY --tlog-upload=false HOST/REPO@sha256:DIGEST`), or cosign v3 with `--new-bundle-format=false --use-signing-config=false --tlog-upload=false`"
    };
}
/// The `critical.type` of a payload that signs an image (or artifact).
pub const PAYLOAD_TYPE: &str = "cosign container image signature";
/// Largest payload read, 16 KiB: cosign's is about 250 bytes, and with
/// annotations (`cosign sign -a`) still well under 1 KiB.
pub const MAX_PAYLOAD_BYTES: u64 = 16 << 10;
/// Most registry requests made looking for one plugin's signatures, 64:
/// the signature tag's manifest, the referrers index, each signature
/// manifest and each payload count. Every signature layer is read up to
/// it, so layers that do not verify (pushed by someone with push rights
/// and no key) cannot hide a valid one behind them; past it the lookup is
/// refused ([`super::OciError::SignatureLookupCap`]).
pub const MAX_SIGNATURE_REQUESTS: usize = 64;
/// Most bytes read looking for one plugin's signatures, 512 KiB, all
/// requests together: past it the lookup is refused.
pub const MAX_SIGNATURE_BYTES: u64 = 512 << 10;
/// Largest public key file read, 16 KiB (a P-256 PEM key is 178 bytes).
pub const MAX_KEY_BYTES: u64 = 16 << 10;

/// The tag cosign writes the signatures of manifest `hex` under.
pub fn signature_tag(hex: &str) -> String {
    format!("sha256-{hex}.sig")
}

/// The tag under which a registry without the referrers API keeps the index
/// of what refers to manifest `hex` (the OCI distribution spec's fallback).
pub fn referrers_tag(hex: &str) -> String {
    format!("sha256-{hex}")
}

/// One signature as found in the registry: the payload's bytes and the
/// signature's base64 text, neither believed yet. The store keeps these
/// ([`Signatures`]), so a start without the registry verifies again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    /// The payload, base64.
    pub payload: String,
    /// The annotation's text: base64 of the DER signature.
    pub signature: String,
}

/// What the store keeps beside a manifest: the signatures the registry had
/// for it when it was last asked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signatures {
    pub signatures: Vec<Signature>,
}

/// A configured public key: where it came from (what messages name) and
/// the key.
#[derive(Clone)]
pub struct PublicKey {
    /// The file it was read from, as configured.
    pub path: PathBuf,
    key: VerifyingKey,
}

impl PublicKey {
    /// Whether `other` is the same key, whatever file it came from.
    pub fn same_key(&self, other: &PublicKey) -> bool {
        self.key == other.key
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublicKey")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl PartialEq for PublicKey {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path && self.key == other.key
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())
    }
}

impl PublicKey {
    /// Read the PEM public key (`-----BEGIN PUBLIC KEY-----`, as `cosign
    /// generate-key-pair` writes `cosign.pub`) at `path`, under the trust
    /// rules of plugin files: a key someone else could replace would let
    /// them sign for the vendor.
    pub fn read(path: &Path) -> Result<Self, String> {
        let bytes = fixup_core::plugin::trusted::read_file_bounded(path, MAX_KEY_BYTES)
            .map_err(|e| e.to_string())?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|_| format!("{} is not a PEM file", path.display()))?;
        Self::from_pem(path, text)
    }

    /// The key in `pem`, named `path`.
    pub fn from_pem(path: &Path, pem: &str) -> Result<Self, String> {
        let key = VerifyingKey::from_public_key_pem(pem.trim()).map_err(|e| {
            format!(
                "{} is not an ECDSA P-256 public key in PEM (`-----BEGIN PUBLIC KEY-----`, as `cosign generate-key-pair` writes cosign.pub): {e}",
                path.display()
            )
        })?;
        Ok(PublicKey {
            path: path.to_owned(),
            key,
        })
    }
}

/// A vendor's private key for `plugin push --sign-key`: an unencrypted
/// PKCS#8 ECDSA P-256 key in PEM (`-----BEGIN PRIVATE KEY-----`, as
/// `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256`
/// writes). cosign's own encrypted `cosign.key` is not read here: sign with
/// `cosign sign --key` instead.
pub struct SigningKey {
    path: PathBuf,
    key: p256::ecdsa::SigningKey,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the key.
        f.debug_struct("SigningKey")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// Read the key at `path`, under the trust rules of plugin files (a
    /// key someone else could replace would sign for them), at most
    /// [`MAX_KEY_BYTES`].
    pub fn read(path: &Path) -> Result<Self, String> {
        use p256::pkcs8::DecodePrivateKey as _;
        let bytes = fixup_core::plugin::trusted::read_file_bounded(path, MAX_KEY_BYTES)
            .map_err(|e| e.to_string())?;
        let not_one = || {
            format!(
                "{} is not an unencrypted PKCS#8 ECDSA P-256 private key in PEM (`-----BEGIN PRIVATE KEY-----`); with cosign's own encrypted cosign.key, sign the digest after the push: {}",
                path.display(),
                how_to_sign!()
            )
        };
        let text = std::str::from_utf8(&bytes).map_err(|_| not_one())?;
        let key = p256::ecdsa::SigningKey::from_pkcs8_pem(text.trim()).map_err(|_| not_one())?;
        Ok(SigningKey {
            path: path.to_owned(),
            key,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// cosign's signature of the manifest `pinned` names: the payload
    /// naming the digest and where it was pushed, and its ECDSA P-256
    /// SHA-256 signature (DER, base64).
    pub fn sign(&self, pinned: &PluginRef) -> Signature {
        use p256::ecdsa::signature::Signer as _;
        let payload = serde_json::to_vec(&serde_json::json!({
            "critical": {
                "identity": {
                    "docker-reference": format!("{}/{}", pinned.registry, pinned.repository),
                },
                "image": {
                    "docker-manifest-digest": format!("sha256:{}", pinned.digest().unwrap_or_default()),
                },
                "type": PAYLOAD_TYPE,
            },
            "optional": null,
        }))
        .expect("a JSON value serializes");
        let signature: EcdsaSignature = self.key.sign(&payload);
        let b64 = base64::engine::general_purpose::STANDARD;
        Signature {
            payload: b64.encode(&payload),
            signature: b64.encode(signature.to_der().as_bytes()),
        }
    }
}

/// Who signed a plugin: a key of the policy, and the reference the signer
/// wrote in the payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Signer {
    /// The key's path, as configured.
    pub key: String,
    /// `critical.identity.docker-reference` of the payload (where the
    /// signer pushed it), shown, not checked.
    pub signed_as: String,
}

impl fmt::Display for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (signed as {})", self.key, self.signed_as)
    }
}

/// The plugin's name in messages: its repository, since the component's
/// own name is known only after loading it, and nothing unverified is
/// loaded.
pub fn plugin_name(reference: &PluginRef) -> &str {
    &reference.repository
}

/// Why a plugin's signatures do not satisfy its rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plugin `{plugin}` ({reference}) is refused: {wanted}, and {failed}; {next}")]
pub struct SignatureError {
    pub plugin: String,
    pub reference: String,
    /// The rule and what it wants: "`[plugin_trust."SCOPE"]` requires a
    /// signature by any of keys K" (or "signatures by all of keys K1, K2").
    pub wanted: String,
    /// What failed, key by key.
    pub failed: String,
    /// The next action.
    pub next: &'static str,
}

/// What `cosign` wrote, checked: the digest the payload vouches for and
/// where it says the image was.
struct Payload {
    digest: String,
    signed_as: String,
}

/// The payload's claims, when it is a cosign image signature.
fn read_payload(bytes: &[u8]) -> Result<Payload, String> {
    #[derive(Deserialize)]
    struct Simple {
        critical: Critical,
    }
    #[derive(Deserialize)]
    struct Critical {
        #[serde(rename = "type")]
        kind: String,
        image: Image,
        #[serde(default)]
        identity: Option<Identity>,
    }
    #[derive(Deserialize)]
    struct Image {
        #[serde(rename = "docker-manifest-digest")]
        digest: String,
    }
    #[derive(Deserialize)]
    struct Identity {
        #[serde(rename = "docker-reference", default)]
        reference: String,
    }
    let simple: Simple = serde_json::from_slice(bytes).map_err(|e| {
        format!(
            "its payload is not a cosign simple-signing payload ({})",
            bounded(&e.to_string())
        )
    })?;
    if simple.critical.kind != PAYLOAD_TYPE {
        return Err(format!(
            "its payload is of type `{}`, not `{PAYLOAD_TYPE}`",
            bounded(&simple.critical.kind)
        ));
    }
    Ok(Payload {
        digest: simple.critical.image.digest,
        signed_as: simple
            .critical
            .identity
            .map(|i| bounded(&i.reference))
            .unwrap_or_default(),
    })
}

/// How one key fared against the signatures.
enum KeyVerdict {
    Signed(Signer),
    /// Why not, in a few words.
    Not(String),
}

/// Judge `signatures` for `pinned` (the manifest digest, hex) with `key`.
fn judge_key(key: &PublicKey, pinned: &str, signatures: &[Signature]) -> KeyVerdict {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut other_digest = None;
    let mut bad_payload = None;
    // No more can be read from a registry (one request each).
    for signature in signatures.iter().take(MAX_SIGNATURE_REQUESTS) {
        let (Ok(payload), Ok(der)) = (
            b64.decode(signature.payload.trim()),
            b64.decode(signature.signature.trim()),
        ) else {
            continue;
        };
        let Ok(parsed) = EcdsaSignature::from_der(&der) else {
            continue;
        };
        // Go's ECDSA signs with either half of s; both verify.
        let parsed = parsed.normalize_s().unwrap_or(parsed);
        if key.key.verify(&payload, &parsed).is_err() {
            continue;
        }
        match read_payload(&payload) {
            Ok(claims) if claims.digest == format!("sha256:{pinned}") => {
                return KeyVerdict::Signed(Signer {
                    key: key.to_string(),
                    signed_as: claims.signed_as,
                });
            }
            Ok(claims) => other_digest = Some(bounded(&claims.digest)),
            Err(why) => bad_payload = Some(why),
        }
    }
    KeyVerdict::Not(match (other_digest, bad_payload) {
        (Some(digest), _) => format!(
            "its signature signs {digest}, not the pinned digest sha256:{pinned} (a signature copied from another plugin or version)"
        ),
        (None, Some(why)) => format!("its signature verifies, but {why}"),
        (None, None) if signatures.is_empty() => "no signature".to_owned(),
        (None, None) => format!(
            "none of the {} signature(s) found verifies with it (another key signed, or a signature was changed)",
            signatures.len()
        ),
    })
}

/// What a registry has for a digest: cosign's simple signatures, and
/// whether it also lists a Sigstore bundle, which is not read.
#[derive(Debug, Default)]
pub struct Fetched {
    pub signatures: Vec<Signature>,
    pub bundle: bool,
}

impl Fetched {
    /// [`verify`] these signatures; when there is none but a Sigstore
    /// bundle, the refusal says so and how to sign instead.
    pub fn verify(
        &self,
        rule: &TrustRule,
        pinned: &PluginRef,
    ) -> Result<Vec<Signer>, SignatureError> {
        verify(rule, pinned, &self.signatures).map_err(|mut e| {
            if self.signatures.is_empty() && self.bundle {
                e.failed = "the registry has for this digest only a Sigstore bundle signature (cosign v3's default), which is not supported".to_owned();
                e.next = concat!("the vendor signs it again: ", how_to_sign!());
            }
            e
        })
    }
}

/// Verify `signatures` of the plugin at `pinned` (a reference pinned to
/// its manifest digest) under `rule`: the keys that signed it, or why the
/// rule is not met. With [`Require::None`] nothing is refused and the
/// signers found are returned.
pub fn verify(
    rule: &TrustRule,
    pinned: &PluginRef,
    signatures: &[Signature],
) -> Result<Vec<Signer>, SignatureError> {
    let hex = pinned.digest().unwrap_or_default();
    let verdicts: Vec<(&PublicKey, KeyVerdict)> = rule
        .keys
        .iter()
        .map(|key| (key, judge_key(key, hex, signatures)))
        .collect();
    let signers: Vec<Signer> = verdicts
        .iter()
        .filter_map(|(_, v)| match v {
            KeyVerdict::Signed(s) => Some(s.clone()),
            KeyVerdict::Not(_) => None,
        })
        .collect();
    let met = match rule.require {
        Require::None => true,
        Require::AnyOf => !signers.is_empty(),
        Require::AllOf => signers.len() == rule.keys.len(),
    };
    if met {
        return Ok(signers);
    }
    let wanted = match rule.require {
        Require::AllOf => format!("signatures by all of keys {}", rule.keys_text()),
        _ => format!("a signature by any of keys {}", rule.keys_text()),
    };
    let wanted = format!("`[plugin_trust.\"{}\"]` requires {wanted}", rule.scope);
    let (failed, next) = if signatures.is_empty() {
        (
            format!(
                "the registry has no signature for this digest (no `{}` tag, no referrer)",
                signature_tag(hex)
            ),
            "the vendor signs it (cosign v2's `cosign sign --key KEY --tlog-upload=false HOST/REPO@sha256:DIGEST`; cosign v3 also needs `--new-bundle-format=false --use-signing-config=false`), or the pin names another digest",
        )
    } else {
        let failed = verdicts
            .iter()
            .filter_map(|(key, v)| match v {
                KeyVerdict::Not(why) => Some(format!("key {key}: {why}")),
                KeyVerdict::Signed(_) => None,
            })
            .collect::<Vec<_>>()
            .join("; ");
        (
            format!("it is not met: {failed}"),
            "check that the pin is the vendor's digest and the key the vendor's public key; nothing from this reference is loaded",
        )
    };
    Err(SignatureError {
        plugin: plugin_name(pinned).to_owned(),
        reference: pinned.to_string(),
        wanted,
        failed,
        next,
    })
}

/// The signature layers of a signature manifest: each layer of the
/// simple-signing media type with a signature annotation, as (payload
/// digest `sha256:HEX`, declared size, the signature text), every one
/// (the lookup's request cap bounds how many are read). `Err` says why the
/// manifest is not one.
pub(super) fn signature_layers(manifest: &[u8]) -> Result<Vec<(String, u64, String)>, String> {
    #[derive(Deserialize)]
    struct Manifest {
        #[serde(default)]
        layers: Vec<Layer>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Layer {
        media_type: String,
        digest: String,
        size: i64,
        #[serde(default)]
        annotations: std::collections::BTreeMap<String, String>,
    }
    let manifest: Manifest = serde_json::from_slice(manifest).map_err(|e| {
        format!(
            "the signature manifest is not a manifest ({})",
            bounded(&e.to_string())
        )
    })?;
    Ok(manifest
        .layers
        .into_iter()
        .filter(|layer| layer.media_type == SIMPLE_SIGNING_MEDIA_TYPE)
        .filter(|layer| super::is_sha256_digest(&layer.digest))
        .filter_map(|layer| {
            let size = u64::try_from(layer.size)
                .ok()
                .filter(|&size| size <= MAX_PAYLOAD_BYTES)?;
            let signature = layer.annotations.get(SIGNATURE_ANNOTATION)?.clone();
            Some((layer.digest, size, signature))
        })
        .collect())
}

/// The signature manifests an index lists (the referrers API's answer, or
/// the fallback tag's index): the digests of those of cosign's signature
/// artifact type, every one (the lookup's request cap bounds how many are
/// read), and whether it lists a
/// Sigstore bundle ([`BUNDLE_ARTIFACT_TYPE`]).
pub(super) fn signature_referrers(index: &[u8]) -> Result<(Vec<String>, bool), String> {
    #[derive(Deserialize)]
    struct Index {
        #[serde(default)]
        manifests: Vec<Entry>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Entry {
        digest: String,
        #[serde(default)]
        artifact_type: Option<String>,
    }
    let index: Index = serde_json::from_slice(index).map_err(|e| {
        format!(
            "the referrers index is not an index ({})",
            bounded(&e.to_string())
        )
    })?;
    let bundle = index
        .manifests
        .iter()
        .any(|entry| entry.artifact_type.as_deref() == Some(BUNDLE_ARTIFACT_TYPE));
    let digests = index
        .manifests
        .into_iter()
        .filter(|entry| entry.artifact_type.as_deref() == Some(SIGNATURE_ARTIFACT_TYPE))
        .filter(|entry| super::is_sha256_digest(&entry.digest))
        .map(|entry| entry.digest)
        .collect();
    Ok((digests, bundle))
}

/// A payload's bytes as the store keeps them, checked against the digest
/// the signature manifest names.
pub(super) fn payload_signature(
    payload: &[u8],
    digest: &str,
    signature: String,
) -> Option<Signature> {
    (digest.strip_prefix("sha256:") == Some(sha256_hex(payload).as_str())).then(|| Signature {
        payload: base64::engine::general_purpose::STANDARD.encode(payload),
        signature,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::SigningKey;
    use p256::ecdsa::signature::Signer as _;
    use p256::pkcs8::EncodePublicKey as _;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const OTHER: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

    fn key(seed: u8, name: &str) -> (SigningKey, PublicKey) {
        let signing = SigningKey::from_slice(&[seed; 32]).unwrap();
        let pem = signing
            .verifying_key()
            .to_public_key_pem(p256::pkcs8::LineEnding::LF)
            .unwrap();
        (signing, PublicKey::from_pem(Path::new(name), &pem).unwrap())
    }

    fn payload(hex: &str, kind: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "critical": {
                "identity": {"docker-reference": "registry.example/acme/net"},
                "image": {"docker-manifest-digest": format!("sha256:{hex}")},
                "type": kind,
            },
            "optional": null,
        }))
        .unwrap()
    }

    fn sign(key: &SigningKey, payload: &[u8]) -> Signature {
        let b64 = base64::engine::general_purpose::STANDARD;
        let signature: EcdsaSignature = key.sign(payload);
        Signature {
            payload: b64.encode(payload),
            signature: b64.encode(signature.to_der().as_bytes()),
        }
    }

    fn pinned(hex: &str) -> PluginRef {
        format!("oci://registry.example/acme/net@sha256:{hex}")
            .parse()
            .unwrap()
    }

    fn rule(require: Require, keys: Vec<PublicKey>) -> TrustRule {
        TrustRule {
            scope: "registry.example/acme".into(),
            require,
            keys,
        }
    }

    #[test]
    fn any_of_and_all_of_count_the_keys_that_signed_the_pinned_digest() {
        let (a, key_a) = key(1, "/keys/a.pub");
        let (_, key_b) = key(2, "/keys/b.pub");
        let signed = [sign(&a, &payload(HEX, PAYLOAD_TYPE))];
        let any = rule(Require::AnyOf, vec![key_a.clone(), key_b.clone()]);
        let signers = verify(&any, &pinned(HEX), &signed).unwrap();
        assert_eq!(signers.len(), 1);
        assert_eq!(signers[0].key, "/keys/a.pub");
        assert_eq!(signers[0].signed_as, "registry.example/acme/net");

        let all = rule(Require::AllOf, vec![key_a, key_b]);
        let err = verify(&all, &pinned(HEX), &signed).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("all of keys /keys/a.pub, /keys/b.pub"),
            "{text}"
        );
        assert!(
            text.contains("key /keys/b.pub: none of the 1 signature"),
            "{text}"
        );
        assert!(!text.contains("key /keys/a.pub:"), "a signed: {text}");
        assert!(text.contains("plugin `acme/net`"), "{text}");
        assert!(text.contains(&format!("@sha256:{HEX}")), "{text}");
    }

    /// Each way a signature can fail says which: no signature, another
    /// key, a changed signature, a payload for another digest, a payload
    /// that is not cosign's.
    #[test]
    fn each_failure_says_what_failed() {
        let (a, key_a) = key(1, "/keys/a.pub");
        let (b, _) = key(2, "/keys/b.pub");
        let any = rule(Require::AnyOf, vec![key_a]);
        let mut changed = sign(&a, &payload(HEX, PAYLOAD_TYPE));
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut der = b64.decode(&changed.signature).unwrap();
        let last = der.len() - 1;
        der[last] ^= 1;
        changed.signature = b64.encode(der);
        for (signatures, says) in [
            (vec![], "the registry has no signature"),
            (
                vec![sign(&b, &payload(HEX, PAYLOAD_TYPE))],
                "none of the 1 signature(s) found verifies",
            ),
            (vec![changed], "none of the 1 signature(s) found verifies"),
            (
                vec![sign(&a, &payload(OTHER, PAYLOAD_TYPE))],
                &format!("signs sha256:{OTHER}, not the pinned digest sha256:{HEX}"),
            ),
            (
                vec![sign(&a, &payload(HEX, "something else"))],
                "its payload is of type `something else`",
            ),
            (
                vec![sign(&a, b"not json")],
                "not a cosign simple-signing payload",
            ),
        ] {
            let err = verify(&any, &pinned(HEX), &signatures).unwrap_err();
            assert!(err.to_string().contains(says), "{says}: {err}");
            assert!(err.to_string().contains("/keys/a.pub"), "{err}");
        }
        let none = rule(Require::None, any.keys.clone());
        assert_eq!(verify(&none, &pinned(HEX), &[]).unwrap(), []);
    }

    #[test]
    fn a_signature_manifest_gives_its_signed_layers_only() {
        let digest = format!("sha256:{HEX}");
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest, "size": 2},
            "layers": [
                {"mediaType": SIMPLE_SIGNING_MEDIA_TYPE, "digest": digest, "size": 250,
                 "annotations": {SIGNATURE_ANNOTATION: "MEUC"}},
                {"mediaType": SIMPLE_SIGNING_MEDIA_TYPE, "digest": digest, "size": 250},
                {"mediaType": SIMPLE_SIGNING_MEDIA_TYPE, "digest": digest, "size": MAX_PAYLOAD_BYTES + 1,
                 "annotations": {SIGNATURE_ANNOTATION: "MEUC"}},
                {"mediaType": "application/wasm", "digest": digest, "size": 250,
                 "annotations": {SIGNATURE_ANNOTATION: "MEUC"}},
            ],
        }))
        .unwrap();
        assert_eq!(
            signature_layers(&manifest).unwrap(),
            [(digest, 250, "MEUC".to_owned())]
        );
        assert!(signature_layers(b"\"not a manifest\"").is_err());
    }

    /// cosign v3's default, a Sigstore bundle referrer, is recognized only
    /// to say that it is not read and how to sign instead.
    #[test]
    fn a_sigstore_bundle_alone_is_named_in_the_refusal() {
        let digest = format!("sha256:{HEX}");
        let index = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "manifests": [
                {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest,
                 "size": 600, "artifactType": BUNDLE_ARTIFACT_TYPE},
            ],
        }))
        .unwrap();
        let (digests, bundle) = signature_referrers(&index).unwrap();
        assert!(digests.is_empty());
        assert!(bundle);
        let (_, key_a) = key(1, "/keys/a.pub");
        let any = rule(Require::AnyOf, vec![key_a]);
        let fetched = Fetched {
            signatures: Vec::new(),
            bundle,
        };
        let text = fetched.verify(&any, &pinned(HEX)).unwrap_err().to_string();
        assert!(text.contains("only a Sigstore bundle signature"), "{text}");
        assert!(
            text.contains(
                "--new-bundle-format=false --use-signing-config=false --tlog-upload=false"
            ),
            "{text}"
        );
        let bare = Fetched::default().verify(&any, &pinned(HEX)).unwrap_err();
        assert!(
            bare.to_string().contains("the registry has no signature"),
            "{bare}"
        );
    }
}
