//! The registry protocol (the OCI distribution API), spoken here so that
//! every byte read from a registry is read under a bound chosen before the
//! read: a manifest at most [`MAX_MANIFEST_BYTES`], a layer at most the size
//! its manifest declares, an error body or a token answer at most
//! [`MAX_SMALL_BODY`]. A body longer than its bound is refused (or, for an
//! error's text, cut) as soon as the bound is passed, whatever its
//! `Content-Length` says; nothing is buffered whole first.
//!
//! Redirects are followed only where they cannot widen what the operator
//! named: to HTTPS anywhere, or over plain HTTP to the very host and port
//! the request started on (a registry the operator listed for plain HTTP);
//! never from HTTPS down to HTTP, at most [`MAX_REDIRECTS`] in a row. Each
//! one followed is logged, each one refused ends the request with
//! [`OciError::Redirect`]. Credentials never follow a redirect to another
//! host, scheme or port.
//!
//! A 401 is answered once per request: with the basic credentials for a
//! `Basic` challenge, with a token from the challenge's realm for a
//! `Bearer` one. The realm is the registry's to choose, so it is held to the
//! redirect rules: HTTPS, or the registry itself when that is plain HTTP.

use std::fmt;
use std::time::Duration;

use reqwest::header::{
    ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue, LOCATION, WWW_AUTHENTICATE,
};
use reqwest::redirect::{Attempt, Policy};
use reqwest::{Client, RequestBuilder, Response, StatusCode, Url};

use super::signature::{
    self, Fetched, payload_signature, referrers_tag, signature_layers, signature_referrers,
    signature_tag,
};
use super::{
    Artifact, Descriptor, ImageManifest, MANIFEST_MEDIA_TYPE, MAX_LAYER_BYTES, MAX_MANIFEST_BYTES,
    OciError, Pin, PluginRef, REQUEST_TIMEOUT, RegistryOptions, Tags, WASM_CONFIG_MEDIA_TYPE,
    WASM_LAYER_MEDIA_TYPE, bounded, error_chain, plugin_layer, sha256_hex,
};

/// The media types a signature manifest may come in: cosign writes OCI
/// manifests, older versions Docker's.
const SIGNATURE_MANIFEST_TYPES: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";
/// The media type of an OCI index: the referrers API's answer and the
/// fallback tag's content.
const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";

/// Largest error body or token answer read, 64 KiB: an error's text is cut
/// there, a token answer longer than that is refused.
pub const MAX_SMALL_BODY: usize = 64 << 10;
/// Most redirects followed in a row for one request.
pub const MAX_REDIRECTS: usize = 5;
/// Longest a whole layer download may take, 10 minutes; each read within it
/// has [`REQUEST_TIMEOUT`].
pub const LAYER_TIMEOUT: Duration = Duration::from_secs(600);

/// A registry client for plugin artifacts.
pub struct Registry {
    client: Client,
    plain_http: Vec<String>,
    credentials: Option<(String, String)>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("plain_http", &self.plain_http)
            .finish_non_exhaustive()
    }
}

/// Why a redirect was not followed.
#[derive(Debug)]
struct RedirectRefused(String);

impl fmt::Display for RedirectRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RedirectRefused {}

/// `host[:port]` of `url` as a reference writes it (the port only when
/// the URL has one).
fn authority(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    }
}

/// `url` without its query and fragment: what a log line or an error may
/// show (a signed storage URL carries its signature in the query).
pub(super) fn shown(url: &Url) -> String {
    let mut url = url.clone();
    url.set_query(None);
    url.set_fragment(None);
    let _ = url.set_username("");
    let _ = url.set_password(None);
    bounded(url.as_str())
}

/// Whether a request that started at `origin` and is at `from` may go on
/// to `to`: `Err` says why not.
pub(super) fn may_redirect(origin: &Url, from: &Url, to: &Url) -> Result<(), String> {
    match (from.scheme(), to.scheme()) {
        (_, "https") => Ok(()),
        ("https", _) => Err(format!(
            "it goes from HTTPS down to {}",
            bounded(to.scheme())
        )),
        ("http", "http")
            if to.host_str() == origin.host_str()
                && to.port_or_known_default() == origin.port_or_known_default() =>
        {
            Ok(())
        }
        ("http", "http") => Err(format!(
            "it leaves {} for {} over plain HTTP",
            authority(origin),
            bounded(&authority(to))
        )),
        (_, scheme) => Err(format!("its scheme {} is not HTTP(S)", bounded(scheme))),
    }
}

fn redirect_policy(attempt: Attempt<'_>) -> reqwest::redirect::Action {
    let previous = attempt.previous();
    let (Some(origin), Some(from)) = (previous.first(), previous.last()) else {
        return attempt.error(RedirectRefused("a redirect with no request".to_owned()));
    };
    let to = attempt.url();
    if previous.len() > MAX_REDIRECTS {
        let why = format!("more than {MAX_REDIRECTS} redirects in a row");
        return attempt.error(RedirectRefused(why));
    }
    match may_redirect(origin, from, to) {
        Ok(()) => {
            tracing::info!(from = %shown(from), to = %shown(to), "registry redirect followed");
            attempt.follow()
        }
        Err(why) => {
            let why = format!(
                "redirect from {} to {} refused: {why}",
                shown(from),
                shown(to)
            );
            tracing::warn!("{why}");
            attempt.error(RedirectRefused(why))
        }
    }
}

/// Why a bounded read stopped.
enum ReadError {
    /// The body is longer than the bound.
    Over,
    Transport(reqwest::Error),
}

/// The body of `response`, refused past `cap` bytes: before any read when
/// its `Content-Length` says so, else as soon as the bytes pass it.
async fn read_capped(response: &mut Response, cap: u64) -> Result<Vec<u8>, ReadError> {
    if response.content_length().is_some_and(|len| len > cap) {
        return Err(ReadError::Over);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(ReadError::Transport)? {
        if body.len() as u64 + chunk.len() as u64 > cap {
            return Err(ReadError::Over);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// At most [`MAX_SMALL_BODY`] bytes of an error answer's body, as text;
/// the rest is never read.
async fn error_text(mut response: Response) -> String {
    let mut body = Vec::new();
    while body.len() < MAX_SMALL_BODY {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = MAX_SMALL_BODY - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            _ => break,
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

/// The error of a request that did not get an answer.
fn transport(reference: &PluginRef, e: reqwest::Error) -> OciError {
    let shown_url = e.url().map(shown);
    let e = e.without_url();
    let reason = match shown_url {
        Some(url) => bounded(&format!("{url}: {}", error_chain(&e))),
        None => bounded(&error_chain(&e)),
    };
    if e.is_redirect() {
        OciError::Redirect {
            reference: reference.to_string(),
            reason,
        }
    } else {
        OciError::Unreachable {
            reference: reference.to_string(),
            reason,
        }
    }
}

/// The error a registry's non-success answer means: 401 and 403 (or an
/// error envelope saying so) are a missing or refused login, 404 (or an
/// envelope's `*_UNKNOWN`) no such thing, anything else the registry's
/// own failure with its text.
async fn refusal(reference: &PluginRef, response: Response) -> OciError {
    let reference_text = reference.to_string();
    let status = response.status();
    if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
        return OciError::Unauthorized {
            reference: reference_text,
        };
    }
    if status == StatusCode::NOT_FOUND {
        return OciError::NotFound {
            reference: reference_text,
        };
    }
    let text = error_text(response).await;
    #[derive(serde::Deserialize)]
    struct Envelope {
        errors: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        code: String,
        #[serde(default)]
        message: String,
    }
    let mut detail = text.trim().to_owned();
    if let Ok(envelope) = serde_json::from_str::<Envelope>(&text) {
        let codes: Vec<&str> = envelope.errors.iter().map(|e| e.code.as_str()).collect();
        let any = |wanted: &[&str]| codes.iter().any(|code| wanted.contains(code));
        if any(&["UNAUTHORIZED", "DENIED"]) {
            return OciError::Unauthorized {
                reference: reference_text,
            };
        }
        if any(&[
            "MANIFEST_UNKNOWN",
            "BLOB_UNKNOWN",
            "NAME_UNKNOWN",
            "NOT_FOUND",
        ]) {
            return OciError::NotFound {
                reference: reference_text,
            };
        }
        detail = envelope
            .errors
            .iter()
            .map(|e| format!("{}: {}", e.code, e.message))
            .collect::<Vec<_>>()
            .join("; ");
    }
    OciError::Registry {
        reference: reference_text,
        status: format!("HTTP {}", status.as_u16()),
        detail: bounded(&detail),
    }
}

/// The token a bearer realm answers with: `token`, else `access_token`.
#[derive(serde::Deserialize)]
struct TokenAnswer {
    token: Option<String>,
    access_token: Option<String>,
}

/// One exchange with a registry about one reference: the login it
/// earned, kept for its later requests.
struct Session<'a> {
    registry: &'a Registry,
    reference: &'a PluginRef,
    /// `http://HOST[:PORT]` or `https://...`: where the registry is.
    base: Url,
    authorization: Option<HeaderValue>,
    /// Bytes read of answers dropped for being over their cap, for the
    /// signature lookup's count.
    dropped: u64,
}

impl<'a> Session<'a> {
    fn new(registry: &'a Registry, reference: &'a PluginRef) -> Result<Self, OciError> {
        let scheme = if registry.plain_http.contains(&reference.registry) {
            "http"
        } else {
            "https"
        };
        let base = Url::parse(&format!("{scheme}://{}/", reference.registry)).map_err(|e| {
            OciError::BadReference {
                text: reference.to_string(),
                reason: if e.to_string().contains("port") {
                    "the port is not a number up to 65535"
                } else {
                    "the host is not a host name or an address"
                },
            }
        })?;
        Ok(Session {
            registry,
            reference,
            base,
            authorization: None,
            dropped: 0,
        })
    }

    /// `/v2/<repository>/<tail>` on the registry.
    fn url(&self, tail: &str) -> Url {
        let mut url = self.base.clone();
        url.set_path(&format!("/v2/{}/{tail}", self.reference.repository));
        url
    }

    fn transport(&self, e: reqwest::Error) -> OciError {
        transport(self.reference, e)
    }

    /// Whether `url` is on the registry itself: its scheme, host and port.
    fn on_registry(&self, url: &Url) -> bool {
        url.scheme() == self.base.scheme() && authority(url) == authority(&self.base)
    }

    /// A URL the registry named (a token realm, an upload location), held
    /// to the redirect rule as if the registry had redirected to it.
    fn held_to_the_rule(&self, what: &str, url: &Url) -> Result<(), OciError> {
        may_redirect(&self.base, &self.base, url).map_err(|why| OciError::Redirect {
            reference: self.reference.to_string(),
            reason: format!("the {what} {} is refused: {why}", shown(url)),
        })
    }

    /// Send what `make` builds, with the login this session has; on a
    /// 401, earn one from its challenge and send it again, once. The
    /// answer is returned whatever its status.
    async fn send(
        &mut self,
        make: impl Fn(&Client) -> RequestBuilder,
    ) -> Result<Response, OciError> {
        let attempt = |authorization: &Option<HeaderValue>| {
            let request = make(&self.registry.client);
            match authorization {
                Some(value) => request.header(AUTHORIZATION, value.clone()),
                None => request,
            }
        };
        let response = attempt(&self.authorization)
            .send()
            .await
            .map_err(|e| self.transport(e))?;
        if response.status() != StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        // A host a redirect reached gets no login of this registry's.
        let from = response.url();
        if !self.on_registry(from) {
            return Ok(response);
        }
        let challenge = response
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let Some(authorization) = self.login(challenge.as_deref()).await? else {
            return Ok(response);
        };
        drop(response);
        self.authorization = Some(authorization);
        attempt(&self.authorization)
            .send()
            .await
            .map_err(|e| self.transport(e))
    }

    /// The `Authorization` value a challenge asks for, when this client can
    /// give one: `None` leaves the 401 as the answer.
    async fn login(&self, challenge: Option<&str>) -> Result<Option<HeaderValue>, OciError> {
        let Some(challenge) = challenge else {
            return Ok(None);
        };
        let Ok(challenges) = http_auth::parse_challenges(challenge) else {
            return Ok(None);
        };
        let unauthorized = || OciError::Unauthorized {
            reference: self.reference.to_string(),
        };
        for challenge in challenges {
            let param = |name: &str| {
                challenge
                    .params
                    .iter()
                    .find(|(key, _)| key.eq_ignore_ascii_case(name))
                    .map(|(_, value)| value.to_unescaped())
            };
            if challenge.scheme.eq_ignore_ascii_case("basic") {
                let Some((user, password)) = &self.registry.credentials else {
                    return Ok(None);
                };
                use base64::Engine;
                let encoded =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                return HeaderValue::from_str(&format!("Basic {encoded}"))
                    .map(Some)
                    .map_err(|_| unauthorized());
            }
            if challenge.scheme.eq_ignore_ascii_case("bearer") {
                let Some(realm) = param("realm") else {
                    continue;
                };
                let token = self.token(&realm, param("service"), param("scope")).await?;
                return HeaderValue::from_str(&format!("Bearer {token}"))
                    .map(Some)
                    .map_err(|_| self.token_refused("its token is not a header value"));
            }
        }
        Ok(None)
    }

    fn token_refused(&self, why: &str) -> OciError {
        OciError::Registry {
            reference: self.reference.to_string(),
            status: "a token answer outside the distribution spec".to_owned(),
            detail: why.to_owned(),
        }
    }

    /// A bearer token from `realm`, asked with the basic credentials when
    /// there are any; the realm held to the redirect rules, the answer read
    /// within [`MAX_SMALL_BODY`].
    async fn token(
        &self,
        realm: &str,
        service: Option<String>,
        scope: Option<String>,
    ) -> Result<String, OciError> {
        let mut url = Url::parse(realm).map_err(|_| OciError::Redirect {
            reference: self.reference.to_string(),
            reason: format!("the token realm {} is not a URL", bounded(realm)),
        })?;
        self.held_to_the_rule("token realm", &url)?;
        {
            let mut query = url.query_pairs_mut();
            if let Some(service) = &service {
                query.append_pair("service", service);
            }
            if let Some(scope) = &scope {
                query.append_pair("scope", scope);
            }
        }
        let mut request = self.registry.client.get(url).timeout(REQUEST_TIMEOUT);
        if let Some((user, password)) = &self.registry.credentials {
            request = request.basic_auth(user, Some(password));
        }
        let mut response = request.send().await.map_err(|e| self.transport(e))?;
        if !response.status().is_success() {
            return Err(refusal(self.reference, response).await);
        }
        let body = match read_capped(&mut response, MAX_SMALL_BODY as u64).await {
            Ok(body) => body,
            Err(ReadError::Over) => {
                return Err(self.token_refused(&format!(
                    "the token answer is more than {MAX_SMALL_BODY} bytes"
                )));
            }
            Err(ReadError::Transport(e)) => return Err(self.transport(e)),
        };
        let answer: TokenAnswer = serde_json::from_slice(&body)
            .map_err(|_| self.token_refused("the token answer is not JSON with a token"))?;
        answer
            .token
            .or(answer.access_token)
            .filter(|token| !token.is_empty())
            .ok_or_else(|| self.token_refused("the token answer has no token"))
    }

    /// Where an upload goes on: `location` against the registry, held to
    /// the redirect rules.
    fn upload_url(&self, answered: &Url, location: &str) -> Result<Url, OciError> {
        let url = answered.join(location).map_err(|_| OciError::Registry {
            reference: self.reference.to_string(),
            status: "an upload location outside the distribution spec".to_owned(),
            detail: format!(
                "`Location: {}`",
                bounded(location.split('?').next().unwrap_or_default())
            ),
        })?;
        self.held_to_the_rule("upload location", &url)?;
        Ok(url)
    }

    /// Push one blob: start an upload, then put its bytes in one request.
    async fn push_blob(&mut self, bytes: &[u8], digest: &str) -> Result<(), OciError> {
        let start = self.url("blobs/uploads/");
        let response = self
            .send(|client| client.post(start.clone()).timeout(REQUEST_TIMEOUT))
            .await?;
        if response.status() != StatusCode::ACCEPTED {
            return Err(refusal(self.reference, response).await);
        }
        let location = response
            .headers()
            .get(LOCATION)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
            .ok_or_else(|| OciError::Registry {
                reference: self.reference.to_string(),
                status: "an upload without a Location".to_owned(),
                detail: "the registry did not say where the blob goes".to_owned(),
            })?;
        let mut url = self.upload_url(response.url(), &location)?;
        url.query_pairs_mut().append_pair("digest", digest);
        let put = |client: &Client| {
            client
                .put(url.clone())
                .header(CONTENT_TYPE, "application/octet-stream")
                .timeout(LAYER_TIMEOUT)
                .body(bytes.to_vec())
        };
        let response = if self.on_registry(&url) {
            self.send(put).await?
        } else {
            // Another host gets no login of this registry's.
            put(&self.registry.client)
                .send()
                .await
                .map_err(|e| self.transport(e))?
        };
        // 201 Created: the blob is in; a 202 would be an upload still open.
        if response.status() != StatusCode::CREATED {
            return Err(refusal(self.reference, response).await);
        }
        Ok(())
    }
}

impl Registry {
    pub fn new(options: &RegistryOptions) -> Result<Self, OciError> {
        // TLS is rustls with the ring provider kube already uses; a second
        // install (another client in this process) is a no-op.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = Client::builder()
            .redirect(Policy::custom(redirect_policy))
            .referer(false)
            .connect_timeout(REQUEST_TIMEOUT)
            .read_timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| OciError::Unreachable {
                reference: "oci://".to_owned(),
                reason: format!("no HTTP client: {}", bounded(&error_chain(&e))),
            })?;
        Ok(Registry {
            client,
            plain_http: options.plain_http.clone(),
            credentials: options.credentials.clone(),
        })
    }

    /// Push `wasm` as a plugin artifact to `reference` (a tag); the
    /// reference pinned to the manifest's digest, to put in a
    /// configuration. The manifest has no timestamp: the same file pushed
    /// twice has the same digest.
    pub async fn push(&self, reference: &PluginRef, wasm: &[u8]) -> Result<PluginRef, OciError> {
        let Pin::Tag(tag) = &reference.pin else {
            return Err(OciError::PushNeedsTag {
                reference: reference.to_string(),
            });
        };
        if !wasm.starts_with(b"\0asm") {
            return Err(OciError::NotAPlugin {
                reference: reference.to_string(),
                reason: "the file is not WebAssembly (no `\\0asm` header)".to_owned(),
            });
        }
        let wasm_digest = format!("sha256:{}", sha256_hex(wasm));
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": "wasm",
            "os": "wasip2",
            "layerDigests": [wasm_digest],
        }))
        .expect("a JSON value serializes");
        let config_digest = format!("sha256:{}", sha256_hex(&config));
        let descriptor = |media_type: &str, digest: &str, size: usize| Descriptor {
            media_type: media_type.to_owned(),
            digest: digest.to_owned(),
            size: size as i64,
        };
        let manifest = ImageManifest {
            schema_version: 2,
            media_type: Some(MANIFEST_MEDIA_TYPE.to_owned()),
            config: descriptor(WASM_CONFIG_MEDIA_TYPE, &config_digest, config.len()),
            layers: vec![descriptor(WASM_LAYER_MEDIA_TYPE, &wasm_digest, wasm.len())],
        };
        let manifest = serde_json::to_vec(&manifest).expect("a manifest serializes");
        let mut session = Session::new(self, reference)?;
        session.push_blob(wasm, &wasm_digest).await?;
        session.push_blob(&config, &config_digest).await?;
        session.put_manifest(tag, &manifest).await?;
        Ok(reference.pinned(&sha256_hex(&manifest)))
    }

    /// Attach a cosign signature to the manifest `pinned` names, as
    /// `cosign sign` does: the payload as a layer of the signature
    /// manifest under the tag `sha256-<digest>.sig`, the signature in the
    /// layer's annotation. Signatures already under the tag are kept, and
    /// the same one is not added twice.
    pub async fn push_signature(
        &self,
        pinned: &PluginRef,
        signature: &signature::Signature,
    ) -> Result<(), OciError> {
        let hex = pinned.digest().ok_or_else(|| OciError::NotPinned {
            reference: pinned.to_string(),
        })?;
        use base64::Engine as _;
        let payload = base64::engine::general_purpose::STANDARD
            .decode(&signature.payload)
            .expect("a payload this host encoded");
        let payload_digest = format!("sha256:{}", sha256_hex(&payload));
        let tag = signature_tag(hex);
        let mut session = Session::new(self, pinned)?;
        let mut layers: Vec<serde_json::Value> = match session
            .get_bounded(
                &format!("manifests/{tag}"),
                SIGNATURE_MANIFEST_TYPES,
                MAX_MANIFEST_BYTES as u64,
                Absent::NotFound,
            )
            .await?
            .and_then(|manifest| serde_json::from_slice::<serde_json::Value>(&manifest).ok())
        {
            Some(manifest) => manifest["layers"].as_array().cloned().unwrap_or_default(),
            None => Vec::new(),
        };
        let layer = serde_json::json!({
            "mediaType": signature::SIMPLE_SIGNING_MEDIA_TYPE,
            "size": payload.len(),
            "digest": payload_digest,
            "annotations": {signature::SIGNATURE_ANNOTATION: signature.signature},
        });
        if layers.contains(&layer) {
            return Ok(());
        }
        layers.push(layer);
        session.push_blob(&payload, &payload_digest).await?;
        let diff_ids: Vec<&serde_json::Value> = layers.iter().map(|l| &l["digest"]).collect();
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": "",
            "os": "",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }))
        .expect("a JSON value serializes");
        let config_digest = format!("sha256:{}", sha256_hex(&config));
        session.push_blob(&config, &config_digest).await?;
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "size": config.len(),
                "digest": config_digest,
            },
            "layers": layers,
        }))
        .expect("a JSON value serializes");
        session.put_manifest(&tag, &manifest).await
    }

    /// Pull the plugin at `reference` and verify it: the manifest against
    /// the pinned digest (or, for a tag that `tags` allows, take its
    /// digest), its layout and media types, the layer against the digest
    /// the manifest names.
    pub async fn pull(&self, reference: &PluginRef, tags: Tags) -> Result<Artifact, OciError> {
        let name = match &reference.pin {
            Pin::Tag(_) if tags == Tags::Refuse => {
                return Err(OciError::TagNotAllowed {
                    reference: reference.to_string(),
                });
            }
            Pin::Tag(tag) => tag.clone(),
            Pin::Digest(hex) => format!("sha256:{hex}"),
        };
        let mut session = Session::new(self, reference)?;
        let url = session.url(&format!("manifests/{name}"));
        let mut response = session
            .send(|client| {
                client
                    .get(url.clone())
                    .header(ACCEPT, MANIFEST_MEDIA_TYPE)
                    .timeout(REQUEST_TIMEOUT)
            })
            .await?;
        if !response.status().is_success() {
            return Err(refusal(reference, response).await);
        }
        let manifest = match read_capped(&mut response, MAX_MANIFEST_BYTES as u64).await {
            Ok(manifest) => manifest,
            Err(ReadError::Over) => {
                return Err(OciError::NotAPlugin {
                    reference: reference.to_string(),
                    reason: format!("its manifest is more than {MAX_MANIFEST_BYTES} bytes"),
                });
            }
            Err(ReadError::Transport(e)) => return Err(session.transport(e)),
        };
        let digest = sha256_hex(&manifest);
        if let Some(expected) = reference.digest()
            && expected != digest
        {
            return Err(OciError::DigestMismatch {
                reference: reference.to_string(),
                what: "manifest",
                expected: expected.to_owned(),
                actual: digest,
            });
        }
        let pinned = reference.pinned(&digest);
        let layer = plugin_layer(&manifest).map_err(|reason| OciError::NotAPlugin {
            reference: pinned.to_string(),
            reason,
        })?;
        let wasm = session.pull_layer(&pinned, &layer).await?;
        Ok(Artifact {
            wasm_sha256: sha256_hex(&wasm),
            reference: pinned,
            manifest,
            wasm,
        })
    }

    /// The cosign signatures the registry has for the manifest `pinned`
    /// names (module docs of [`signature`]), none of them believed yet: an
    /// empty list when it has none. Each payload is read within
    /// [`signature::MAX_PAYLOAD_BYTES`] and kept only when it matches the
    /// digest its signature manifest names; a signature manifest that is
    /// not one is logged and skipped.
    pub async fn signatures(&self, pinned: &PluginRef) -> Result<Fetched, OciError> {
        let Some(hex) = pinned.digest() else {
            return Err(OciError::NotPinned {
                reference: pinned.to_string(),
            });
        };
        let mut session = Session::new(self, pinned)?;
        let mut lookup = Lookup::default();
        let mut found = Vec::new();
        let (manifests, bundle) = session.signature_manifests(hex, &mut lookup).await?;
        for manifest in manifests {
            let layers = match signature_layers(&manifest) {
                Ok(layers) => layers,
                Err(why) => {
                    tracing::warn!(reference = %pinned, "{why}; not used");
                    continue;
                }
            };
            for (digest, size, text) in layers {
                let Some(payload) = session
                    .get_counted(
                        &mut lookup,
                        &format!("blobs/{digest}"),
                        "*/*",
                        size,
                        Absent::NotFound,
                    )
                    .await?
                else {
                    continue;
                };
                match payload_signature(&payload, &digest, text) {
                    Some(signature) if !found.contains(&signature) => found.push(signature),
                    Some(_) => {}
                    None => {
                        tracing::warn!(reference = %pinned, "a signature payload does not match its digest {digest}; not used")
                    }
                }
            }
        }
        Ok(Fetched {
            signatures: found,
            bundle,
        })
    }
}

/// What a signature lookup has asked of the registry so far, held to
/// [`signature::MAX_SIGNATURE_REQUESTS`] and [`signature::MAX_SIGNATURE_BYTES`].
#[derive(Default)]
struct Lookup {
    requests: usize,
    bytes: u64,
}

/// Which refusals of a `GET` say that the thing is not there.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Absent {
    /// 404 only.
    NotFound,
    /// 400, 404, 405, 406 or 501: what a registry without the API answers.
    /// Any other refusal (401, 403, a server error, 429) is an error: a
    /// signature served there is not taken as missing.
    NoApi,
}

impl Session<'_> {
    /// `PUT` an OCI image manifest under `tag`.
    async fn put_manifest(&mut self, tag: &str, manifest: &[u8]) -> Result<(), OciError> {
        let url = self.url(&format!("manifests/{tag}"));
        let response = self
            .send(|client| {
                client
                    .put(url.clone())
                    .header(CONTENT_TYPE, MANIFEST_MEDIA_TYPE)
                    .timeout(REQUEST_TIMEOUT)
                    .body(manifest.to_vec())
            })
            .await?;
        if !response.status().is_success() {
            return Err(refusal(self.reference, response).await);
        }
        Ok(())
    }

    /// [`get_bounded`](Self::get_bounded) as one request of `lookup`: refused
    /// before it is sent when the lookup has made all its requests, and
    /// after it is read when the lookup has read more than its bytes.
    async fn get_counted(
        &mut self,
        lookup: &mut Lookup,
        tail: &str,
        accept: &str,
        cap: u64,
        absent: Absent,
    ) -> Result<Option<Vec<u8>>, OciError> {
        let reference = self.reference;
        let reached = |cap: String| OciError::SignatureLookupCap {
            reference: reference.to_string(),
            cap,
        };
        if lookup.requests >= signature::MAX_SIGNATURE_REQUESTS {
            return Err(reached(format!(
                "{} registry requests",
                signature::MAX_SIGNATURE_REQUESTS
            )));
        }
        lookup.requests += 1;
        let dropped = self.dropped;
        let body = self.get_bounded(tail, accept, cap, absent).await?;
        lookup.bytes += body.as_ref().map_or(0, |body| body.len() as u64);
        // An answer dropped for being over its cap was read that far.
        lookup.bytes += self.dropped - dropped;
        if lookup.bytes > signature::MAX_SIGNATURE_BYTES {
            return Err(reached(format!(
                "{} bytes read",
                signature::MAX_SIGNATURE_BYTES
            )));
        }
        Ok(body)
    }

    /// `GET /v2/<repository>/<tail>` read within `cap` bytes: `None` when
    /// the registry has no such thing (404, or with [`Absent::NoApi`] an
    /// answer that says it lacks the API, logged), or answers with more than
    /// `cap` bytes (logged: a signature artifact that large is not
    /// cosign's).
    async fn get_bounded(
        &mut self,
        tail: &str,
        accept: &str,
        cap: u64,
        absent: Absent,
    ) -> Result<Option<Vec<u8>>, OciError> {
        let url = self.url(tail);
        let mut response = self
            .send(|client| {
                client
                    .get(url.clone())
                    .header(ACCEPT, accept)
                    .timeout(REQUEST_TIMEOUT)
            })
            .await?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let no_api = matches!(
            status,
            StatusCode::BAD_REQUEST
                | StatusCode::METHOD_NOT_ALLOWED
                | StatusCode::NOT_ACCEPTABLE
                | StatusCode::NOT_IMPLEMENTED
        );
        if absent == Absent::NoApi && no_api {
            tracing::debug!(reference = %self.reference, "{} answers {status}: taken as absent", shown(&url));
            return Ok(None);
        }
        if !status.is_success() {
            return Err(refusal(self.reference, response).await);
        }
        match read_capped(&mut response, cap).await {
            Ok(body) => Ok(Some(body)),
            Err(ReadError::Over) => {
                self.dropped += cap;
                tracing::warn!(reference = %self.reference, "{} answers with more than {cap} bytes: not read", shown(&url));
                Ok(None)
            }
            Err(ReadError::Transport(e)) => Err(self.transport(e)),
        }
    }

    /// The signature manifests of the manifest `hex`: the one under
    /// cosign's `.sig` tag, and those the referrers API (or, where the
    /// registry has none, the fallback tag's index) lists with cosign's
    /// signature artifact type, each checked against its digest; and
    /// whether the index lists a Sigstore bundle. Each request is one of
    /// `lookup`'s.
    async fn signature_manifests(
        &mut self,
        hex: &str,
        lookup: &mut Lookup,
    ) -> Result<(Vec<Vec<u8>>, bool), OciError> {
        let cap = MAX_MANIFEST_BYTES as u64;
        let mut manifests = Vec::new();
        if let Some(manifest) = self
            .get_counted(
                lookup,
                &format!("manifests/{}", signature_tag(hex)),
                SIGNATURE_MANIFEST_TYPES,
                cap,
                Absent::NotFound,
            )
            .await?
        {
            manifests.push(manifest);
        }
        let index = match self
            .get_counted(
                lookup,
                &format!("referrers/sha256:{hex}"),
                INDEX_MEDIA_TYPE,
                cap,
                // A registry without the referrers API may answer 400, 405
                // or 501 rather than 404: the fallback tag is asked then.
                Absent::NoApi,
            )
            .await?
        {
            // An answer that is no list of referrers is as none: the
            // fallback tag is asked too.
            Some(index) if signature_referrers(&index).is_ok() => Some(index),
            _ => {
                self.get_counted(
                    lookup,
                    &format!("manifests/{}", referrers_tag(hex)),
                    INDEX_MEDIA_TYPE,
                    cap,
                    Absent::NotFound,
                )
                .await?
            }
        };
        let (referrers, bundle) = match index.as_deref().map(signature_referrers) {
            Some(Ok(found)) => found,
            Some(Err(why)) => {
                tracing::warn!(reference = %self.reference, "{why}; its referrers are not used");
                (Vec::new(), false)
            }
            None => (Vec::new(), false),
        };
        for digest in referrers {
            let Some(manifest) = self
                .get_counted(
                    lookup,
                    &format!("manifests/{digest}"),
                    SIGNATURE_MANIFEST_TYPES,
                    cap,
                    Absent::NotFound,
                )
                .await?
            else {
                continue;
            };
            if digest.strip_prefix("sha256:") == Some(sha256_hex(&manifest).as_str()) {
                manifests.push(manifest);
            } else {
                tracing::warn!(reference = %self.reference, "the referrer {digest} does not match its digest; not used");
            }
        }
        Ok((manifests, bundle))
    }

    /// The layer's bytes, at most its declared size, verified against its
    /// digest.
    async fn pull_layer(
        &mut self,
        pinned: &PluginRef,
        layer: &Descriptor,
    ) -> Result<Vec<u8>, OciError> {
        let expected = layer.digest.strip_prefix("sha256:").unwrap_or_default();
        let mismatch = |actual: String| OciError::DigestMismatch {
            reference: pinned.to_string(),
            what: "plugin layer",
            expected: expected.to_owned(),
            actual,
        };
        let url = self.url(&format!("blobs/{}", layer.digest));
        let mut response = self
            .send(|client| client.get(url.clone()).timeout(LAYER_TIMEOUT))
            .await?;
        if !response.status().is_success() {
            return Err(refusal(pinned, response).await);
        }
        let size = (layer.size as u64).min(MAX_LAYER_BYTES);
        let wasm = match read_capped(&mut response, size).await {
            Ok(wasm) => wasm,
            Err(ReadError::Over) => {
                return Err(mismatch(format!(
                    "<more than the {size} bytes the manifest declares>"
                )));
            }
            Err(ReadError::Transport(e)) => return Err(self.transport(e)),
        };
        let actual = sha256_hex(&wasm);
        if actual != expected {
            return Err(mismatch(actual));
        }
        Ok(wasm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap()
    }

    #[test]
    fn redirects_stay_on_the_registry_or_go_to_https() {
        let plain = url("http://127.0.0.1:5000/v2/a/blobs/x");
        let tls = url("https://registry.test/v2/a/blobs/x");
        for (origin, from, to, allowed) in [
            (&plain, &plain, "http://127.0.0.1:5000/other", true),
            (&plain, &plain, "https://cdn.test/blob", true),
            (&plain, &plain, "http://127.0.0.1:5001/blob", false),
            (&plain, &plain, "http://cdn.test/blob", false),
            (&plain, &plain, "ftp://127.0.0.1:5000/blob", false),
            (&tls, &tls, "https://cdn.test/blob", true),
            (&tls, &tls, "http://registry.test/v2/a/blobs/x", false),
            // Back to the registry's own host over HTTP after HTTPS: a
            // downgrade all the same.
            (
                &plain,
                &url("https://cdn.test/x"),
                "http://127.0.0.1:5000/x",
                false,
            ),
        ] {
            assert_eq!(
                may_redirect(origin, from, &url(to)).is_ok(),
                allowed,
                "{from} -> {to}"
            );
        }
    }
}
