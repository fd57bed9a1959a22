//! [`PodApi`] against a real API server, through the `kube` client.
//!
//! What this module promises:
//!
//! - Annotation writes are JSON merge patches that carry `metadata.uid` as a
//!   precondition: the API server refuses the patch when the live pod has
//!   another uid (the real one with 422 "field is immutable", some with
//!   409 Conflict), and a 409 or 422 is followed by a GET: the pod is gone
//!   when it has another uid, and a 409 is retried only while it still has
//!   the uid we were given. A write never lands on another
//!   incarnation of the pod (spec section 5).
//! - A write decided from a read ([`PodApi::patch_if_unchanged`]) also
//!   carries the read's `metadata.resourceVersion`: the API server refuses
//!   it with 409 when the pod changed since, and the GET that follows is
//!   the fresh read the caller decides again from. So no read is spent
//!   before such a write, and nothing can change between the decision and
//!   the write.
//! - Transient failures (409 with the same uid and version, 429, 5xx, transport errors,
//!   no answer within the request timeout, and the authorizer's 403, which
//!   a restarted API server answers until it has loaded its bindings) are
//!   retried with the backoff in [`RetryPolicy`]; everything else (an
//!   admission plugin's 403 among them) fails at once, because another try
//!   would get the same answer.
//! - Events are posted to the `events.k8s.io/v1` API, one new object each
//!   (named and filled as kube-runtime's `Recorder` does a first
//!   occurrence), regarding the pod with its uid.
//!
//! Tests: `host/tests/kube.rs` runs every conversation against a tower-test
//! mock API server.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use ::kube::Client;
use ::kube::api::{Api, ListParams, ObjectList, Patch, PatchParams};
use ::kube::runtime::events::Reporter;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event as EventObject;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::pods::{AnnotationPatch, Event, EventType, Guarded, PodApi, PodError, PodRef};
use fixup_core::facts::PodInput;

/// The controller name in events (`reportingController`) and the field
/// manager of annotation patches.
pub const REPORTER: &str = fixup_core::memory::evidence::REPORTER;

/// Names the API server in errors about a pod object that does not parse.
const SOURCE: &str = "kubernetes API";

/// Requests one [`KubeApi`] has in flight at once, by default. A storm of
/// clones must not open a connection per pod: the API server's priority and
/// fairness would answer the excess with 429s, and each connection costs
/// the host memory. The rest wait their turn. Set with
/// [`KubeApi::with_max_requests`].
pub const MAX_REQUESTS_IN_FLIGHT: usize = 32;

/// Pods per page when listing a node's pods. A node runs 110 pods by
/// default, so one page is the common case; `continue` covers the rest.
pub const LIST_PAGE_SIZE: u32 = 500;

/// The most pages of events [`KubeApi::list_pod_events`] reads.
pub const EVENT_PAGES: usize = 10;

/// The most pages of events one wake-event selector lists
/// ([`KubeApi::list_stack_events`]). The selector names the pod, the
/// reason, the type and the reporter, so only the stack's own wake events
/// about the pod are listed, and the rule needs only one recent one: more
/// than a thousand means someone forged them (the admission rule of
/// `deploy/wake-event-policy.yaml` refuses that).
pub const WAKE_EVENT_PAGES: usize = 2;

/// The parts of an event the wake rule reads; its newest occurrence is
/// the series' last one, else the event time, else the timestamps the API
/// server fills for core/v1 writers, else its creation.
fn stack_event(event: EventObject) -> fixup_core::memory::StackEvent {
    let newest = event
        .series
        .as_ref()
        .map(|series| series.last_observed_time.0)
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
        .or_else(|| event.deprecated_last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| event.metadata.creation_timestamp.as_ref().map(|t| t.0));
    fixup_core::memory::StackEvent {
        reason: event.reason.unwrap_or_default(),
        type_: event.type_.unwrap_or_default(),
        reporting_controller: event.reporting_controller.unwrap_or_default(),
        regarding_uid: event
            .regarding
            .and_then(|regarding| regarding.uid)
            .unwrap_or_default(),
        newest_unix_ms: newest.map(|at| at.as_millisecond()),
    }
}

/// How requests to the API server are retried.
///
/// The defaults: 5 tries; 200 ms before the second, doubling each time
/// (200, 400, 800, 1600 ms: at most 3 s of waiting in all), never more than
/// 3.2 s between tries (this only binds when `tries` is raised, or when a
/// 429 asks for a longer wait with `retryAfterSeconds`); each request gets
/// 10 s to answer. Worst case one call takes 5 x 10 s + 3 s = 53 s.
/// Set with [`KubeApi::with_retry`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Requests sent in all, the first included. At least 1.
    pub tries: u32,
    /// Wait before the second try; doubles before each further try.
    pub first_delay: Duration,
    /// Upper bound of any wait between tries.
    pub max_delay: Duration,
    /// How long one request may take before it counts as a transient
    /// failure. A merge patch is idempotent, so resending one that timed
    /// out but was applied is harmless.
    pub request_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            tries: 5,
            first_delay: Duration::from_millis(200),
            max_delay: Duration::from_millis(3200),
            request_timeout: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// The wait after the `failed`-th try (1-based) before the next one.
    pub fn delay_after(&self, failed: u32) -> Duration {
        let doublings = failed.saturating_sub(1).min(31);
        self.first_delay
            .saturating_mul(1u32 << doublings)
            .min(self.max_delay)
    }
}

impl fmt::Display for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} tries, {:?} doubling up to {:?} between tries, {:?} per request",
            self.tries, self.first_delay, self.max_delay, self.request_timeout
        )
    }
}

/// Why the Kubernetes client could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum KubeSetupError {
    /// Neither the in-cluster service account nor a kubeconfig gave a
    /// usable client configuration.
    #[error(
        "no usable Kubernetes client configuration (tried the kubeconfig, then the in-cluster service account); run inside a pod with a service account, or set KUBECONFIG to a valid kubeconfig"
    )]
    Config(#[source] ::kube::Error),
}

/// [`PodApi`] over a [`kube::Client`].
///
/// Cheap to clone: the client is a handle to one connection pool.
#[derive(Clone)]
pub struct KubeApi {
    client: Client,
    reporter: Reporter,
    retry: RetryPolicy,
    /// One permit per request in flight ([`MAX_REQUESTS_IN_FLIGHT`]).
    requests: std::sync::Arc<tokio::sync::Semaphore>,
}

impl fmt::Debug for KubeApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeApi")
            .field("reporter", &self.reporter)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl KubeApi {
    /// `reporter` is the controller name in events and the field manager of
    /// patches (normally [`REPORTER`]); `instance` tells the nodes apart in
    /// events (normally the node name). Without an instance, events name
    /// the controller as the instance.
    pub fn new(client: Client, reporter: &str, instance: Option<String>) -> Self {
        KubeApi {
            client,
            reporter: Reporter {
                controller: reporter.to_owned(),
                instance,
            },
            retry: RetryPolicy::default(),
            requests: std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_REQUESTS_IN_FLIGHT)),
        }
    }

    /// The `events.k8s.io/v1` Event of `event` about `pod`, as kube-runtime
    /// names and fills one (`<pod>.<nanoseconds, hex>`, the event time now,
    /// the reporter as controller and instance).
    fn event_object(&self, pod: &PodRef, event: &Event) -> EventObject {
        let now = jiff::Timestamp::now();
        let controller = &self.reporter.controller;
        EventObject {
            action: Some(event.action().to_owned()),
            reason: Some(event.reason.to_owned()),
            event_time: Some(MicroTime(now)),
            regarding: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(pod.namespace.clone()),
                name: Some(pod.name.clone()),
                uid: Some(pod.uid.clone()),
                ..ObjectReference::default()
            }),
            note: (!event.message.is_empty()).then(|| event.message.clone()),
            metadata: ObjectMeta {
                namespace: Some(pod.namespace.clone()),
                name: Some(format!("{}.{:x}", pod.name, now.as_nanosecond())),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            type_: Some(
                match event.kind {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            ..EventObject::default()
        }
    }

    /// Allow at most `max` requests in flight at once (at least 1; default
    /// [`MAX_REQUESTS_IN_FLIGHT`]). The wait for a turn is not part of a
    /// request's timeout.
    pub fn with_max_requests(mut self, max: usize) -> Self {
        self.requests = std::sync::Arc::new(tokio::sync::Semaphore::new(
            max.clamp(1, tokio::sync::Semaphore::MAX_PERMITS),
        ));
        self
    }

    /// A client from the environment: the kubeconfig (`KUBECONFIG` or
    /// `~/.kube/config`) when there is one, else the in-cluster service
    /// account. Must run inside a tokio runtime.
    pub async fn try_default(
        reporter: &str,
        instance: Option<String>,
    ) -> Result<Self, KubeSetupError> {
        let client = Client::try_default()
            .await
            .map_err(KubeSetupError::Config)?;
        Ok(Self::new(client, reporter, instance))
    }

    /// Replace the retry policy (default: [`RetryPolicy::default`]).
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.retry
    }

    /// Every pod scheduled to `node` in all namespaces (field selector
    /// `spec.nodeName=<node>`): `run`'s answer to the check of an annotated
    /// VM name ([`PodApi::node_pods`]).
    /// Pages of [`LIST_PAGE_SIZE`]; each page is retried like any request.
    /// A pod object that cannot be read is skipped with a warning, so one
    /// odd pod does not stop the others from resuming.
    pub async fn list_node_pods(&self, node: &str) -> Result<Vec<PodInput>, PodError> {
        let label = format!("* on node {node:?}");
        if node.is_empty() {
            return Err(PodError::Api {
                pod: label,
                reason: "the node name is empty, so the field selector would match every unscheduled pod; configure the node name".into(),
            });
        }
        let api: Api<Pod> = Api::all(self.client.clone());
        let selector = format!("spec.nodeName={node}");
        let items = self
            .list_paged(&label, "listing pods", &selector, |params| {
                let api = api.clone();
                async move { api.list_metadata(&params).await }
            })
            .await?;
        let mut pods = Vec::new();
        for pod in items {
            match pod_input(pod.metadata) {
                Ok(input) => pods.push(input),
                Err(err) => {
                    tracing::warn!(node, error = %err, "skipping a pod that cannot be read")
                }
            }
        }
        Ok(pods)
    }

    /// Every item of a list request with the field selector `selector`, in
    /// pages of [`LIST_PAGE_SIZE`] (`continue` for the rest), each page
    /// retried like any request. `label` and `what` name the work in errors.
    async fn list_paged<T, F, Fut>(
        &self,
        label: &str,
        what: &str,
        selector: &str,
        list: F,
    ) -> Result<Vec<T>, PodError>
    where
        T: Clone,
        F: Fn(ListParams) -> Fut,
        Fut: Future<Output = Result<ObjectList<T>, ::kube::Error>>,
    {
        let mut items = Vec::new();
        self.each_page(label, what, selector, usize::MAX, list, |page| {
            items.extend(page)
        })
        .await?;
        Ok(items)
    }

    /// [`list_paged`](Self::list_paged), each page handed to `page` as it
    /// arrives, at most `max_pages` of them: `true` when pages were left.
    async fn each_page<T, F, Fut>(
        &self,
        label: &str,
        what: &str,
        selector: &str,
        max_pages: usize,
        list: F,
        mut page: impl FnMut(Vec<T>),
    ) -> Result<bool, PodError>
    where
        T: Clone,
        F: Fn(ListParams) -> Fut,
        Fut: Future<Output = Result<ObjectList<T>, ::kube::Error>>,
    {
        let mut token: Option<String> = None;
        for _ in 0..max_pages {
            let mut params = ListParams::default().fields(selector).limit(LIST_PAGE_SIZE);
            if let Some(token) = &token {
                params = params.continue_token(token);
            }
            let listed = self
                .retrying(label, what, || {
                    let params = params.clone();
                    let list = &list;
                    async move { self.call(|| list(params)).await.map_err(TryError::from) }
                })
                .await?;
            page(listed.items);
            match listed.metadata.continue_ {
                Some(next) if !next.is_empty() => token = Some(next),
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    /// The host's events about `pod` (`PostClone*`, `ResumedAfterRestart`,
    /// reported by [`REPORTER`]), oldest first, for `capture`: the
    /// events.k8s.io/v1 events of its namespace whose `regarding.uid` is
    /// the pod's (a field selector), in pages of [`LIST_PAGE_SIZE`], each
    /// retried like any request and filtered as it arrives; at most
    /// [`EVENT_PAGES`] pages and the newest
    /// [`MAX_EVENTS`](fixup_kit::capture::MAX_EVENTS) events are kept. The
    /// flag is `true` when some were left out. Only reads.
    pub async fn list_pod_events(
        &self,
        pod: &PodRef,
    ) -> Result<(Vec<fixup_kit::capture::PodEvent>, bool), PodError> {
        let label = pod.to_string();
        let api: Api<EventObject> = Api::namespaced(self.client.clone(), &pod.namespace);
        let selector = format!("regarding.uid={}", pod.uid);
        let input = fixup_core::facts::PodInput {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            uid: Some(pod.uid.clone()),
            ..fixup_core::facts::PodInput::default()
        };
        let mut kept = Vec::new();
        let mut truncated = false;
        let left = self
            .each_page(
                &label,
                "listing the pod's events",
                &selector,
                EVENT_PAGES,
                |params| {
                    let api = api.clone();
                    async move { api.list(&params).await }
                },
                |page| {
                    let mut items = Vec::new();
                    for event in &page {
                        match serde_json::to_value(event) {
                            Ok(value) => items.push(value),
                            Err(e) => tracing::warn!(
                                pod = %pod,
                                "skipping an event that cannot be read: {e}"
                            ),
                        }
                    }
                    kept.extend(fixup_kit::capture::events_of(&items, &input));
                    truncated |= fixup_kit::capture::keep_newest(&mut kept);
                },
            )
            .await?;
        Ok((kept, truncated || left))
    }

    /// The events about `pod` (events.k8s.io/v1 in its namespace,
    /// `regarding.uid` = the pod's uid, a field selector), for the stack's
    /// own record of a hibernate wake (spec section 2, rule 2): every
    /// reporter's, the decision filters. At most [`WAKE_EVENT_PAGES`]
    /// pages of [`LIST_PAGE_SIZE`], each retried like any request. Only
    /// reads.
    pub async fn list_stack_events(
        &self,
        pod: &PodRef,
        selector: &str,
    ) -> Result<fixup_core::memory::Listed, PodError> {
        let label = pod.to_string();
        let api: Api<EventObject> = Api::namespaced(self.client.clone(), &pod.namespace);
        let mut events = Vec::new();
        let left = self
            .each_page(
                &label,
                "listing the stack's wake events about the pod",
                selector,
                WAKE_EVENT_PAGES,
                |params| {
                    let api = api.clone();
                    async move { api.list(&params).await }
                },
                |page| events.extend(page.into_iter().map(stack_event)),
            )
            .await?;
        if left {
            tracing::warn!(
                pod = %pod,
                selector,
                "more than {} events match the selector: only the first {} were read for a wake event of the stack (are wake events being forged? deploy/wake-event-policy.yaml refuses them)",
                WAKE_EVENT_PAGES * LIST_PAGE_SIZE as usize,
                events.len()
            );
        }
        Ok(fixup_core::memory::Listed {
            events,
            truncated: left,
        })
    }

    /// One request, bounded by the request timeout, once it has its turn
    /// ([`MAX_REQUESTS_IN_FLIGHT`]). The request is made only then, on the
    /// heap: a flow waiting for its turn holds none of it.
    async fn call<T, Fut>(&self, request: impl FnOnce() -> Fut) -> Result<T, Failure>
    where
        Fut: Future<Output = Result<T, ::kube::Error>>,
    {
        // The semaphore is never closed.
        let _turn = self.requests.acquire().await;
        match tokio::time::timeout(self.retry.request_timeout, Box::pin(request())).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(Failure::from_kube(&err)),
            Err(_) => Err(Failure {
                kind: FailureKind::Transient,
                code: 0,
                detail: format!("no answer within {:?}", self.retry.request_timeout),
                retry_after: None,
            }),
        }
    }

    /// Run `attempt` until it succeeds, fails for good, or the tries of the
    /// retry policy are used up. `pod` and `what` name the work in errors.
    async fn retrying<T, F, Fut>(
        &self,
        pod: &str,
        what: &str,
        mut attempt: F,
    ) -> Result<T, PodError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, TryError>>,
    {
        let tries = self.retry.tries.max(1);
        let mut waited = Duration::ZERO;
        let mut try_no = 1;
        loop {
            let (detail, retry_after) = match attempt().await {
                Ok(value) => return Ok(value),
                Err(TryError::Gone) => {
                    return Err(PodError::Gone {
                        pod: pod.to_owned(),
                    });
                }
                Err(TryError::Permanent { detail, code }) => {
                    return Err(PodError::Refused {
                        pod: pod.to_owned(),
                        reason: format!("{what}: {detail}; {}", permanent_hint(code)),
                    });
                }
                Err(TryError::Transient {
                    detail,
                    retry_after,
                }) => (detail, retry_after),
            };
            if try_no >= tries {
                return Err(PodError::Api {
                    pod: pod.to_owned(),
                    reason: format!(
                        "{what}: gave up after {tries} tries and {waited:?} of backoff ({}); last error: {detail}; check that the API server is reachable and not overloaded",
                        self.retry
                    ),
                });
            }
            let mut delay = self.retry.delay_after(try_no);
            if let Some(asked) = retry_after {
                delay = delay.max(asked.min(self.retry.max_delay));
            }
            tracing::debug!(pod, what, try_no, ?delay, error = %detail, "retrying a Kubernetes request");
            tokio::time::sleep(delay).await;
            waited += delay;
            try_no += 1;
        }
    }

    /// One try of the uid-guarded merge patch; the pod's metadata as the
    /// API server answered. With `version` (the patch then carries it as
    /// `metadata.resourceVersion`), a pod at another version is
    /// [`Answer::Changed`], with its metadata as read now.
    async fn patch_once(
        &self,
        api: &Api<Pod>,
        pod: &PodRef,
        body: &MergePatch<'_>,
        version: Option<&str>,
    ) -> Result<Answer, TryError> {
        let params = PatchParams {
            field_manager: Some(self.reporter.controller.clone()),
            ..PatchParams::default()
        };
        let failure = match self
            .call(|| async move {
                api.patch_metadata(&pod.name, &params, &Patch::Merge(body))
                    .await
            })
            .await
        {
            Ok(answer) => return Ok(Answer::Written(answer.metadata)),
            Err(failure) => failure,
        };
        match failure.kind {
            FailureKind::NotFound => Err(TryError::Gone),
            FailureKind::Conflict => {
                // Either the uid precondition failed (the pod was replaced),
                // the resource version one did (the pod changed), or the
                // write raced another one. Only the live pod tells.
                match self.call(|| api.get_metadata(&pod.name)).await {
                    Ok(live)
                        if live.metadata.uid.as_deref() == Some(pod.uid.as_str())
                            && version.is_some_and(|version| {
                                live.metadata.resource_version.as_deref() != Some(version)
                            }) =>
                    {
                        Ok(Answer::Changed(live.metadata))
                    }
                    Ok(live) if live.metadata.uid.as_deref() == Some(pod.uid.as_str()) => {
                        Err(TryError::Transient {
                            detail: format!(
                                "{} (the pod still has uid {})",
                                failure.detail, pod.uid
                            ),
                            retry_after: failure.retry_after,
                        })
                    }
                    Ok(live) => Err(replaced(pod, &live.metadata)),
                    Err(get) if get.kind == FailureKind::NotFound => Err(TryError::Gone),
                    Err(get) => Err(TryError::from(Failure {
                        detail: format!(
                            "{}; then reading the pod to check its uid failed: {}",
                            failure.detail, get.detail
                        ),
                        ..get
                    })),
                }
            }
            // The real API server refuses a merge patch whose
            // `metadata.uid` is not the live pod's with 422 ("field is
            // immutable"), not 409: the live pod tells whether the pod was
            // replaced; any other 422 stays what it was.
            FailureKind::Permanent if failure.code == 422 => {
                match self.call(|| api.get_metadata(&pod.name)).await {
                    Ok(live) if live.metadata.uid.as_deref() != Some(pod.uid.as_str()) => {
                        Err(replaced(pod, &live.metadata))
                    }
                    Err(get) if get.kind == FailureKind::NotFound => Err(TryError::Gone),
                    _ => Err(TryError::from(failure)),
                }
            }
            _ => Err(TryError::from(failure)),
        }
    }
}

/// What one try of a patch got.
enum Answer {
    /// Written: the pod's metadata as the API server answered.
    Written(ObjectMeta),
    /// Refused: the pod is at another resource version; its metadata now.
    Changed(ObjectMeta),
}

impl KubeApi {
    /// The uid-guarded merge patch, and with `version` the resource
    /// version one too, retried as the policy says.
    async fn guarded_patch(
        &self,
        pod: &PodRef,
        patch: &AnnotationPatch,
        version: Option<&str>,
    ) -> Result<Guarded, PodError> {
        if pod.uid.is_empty() {
            return Err(PodError::Api {
                pod: pod.to_string(),
                reason: "refusing to patch without a uid precondition; read the pod first and pass its metadata.uid".into(),
            });
        }
        let body = merge_patch(pod, patch, version);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let answer = self
            .retrying(&pod.to_string(), "patching annotations", || {
                self.patch_once(&api, pod, &body, version)
            })
            .await?;
        match answer {
            // An answer without a usable pod (a proxy that strips the
            // body) is no read: the caller reads the pod itself.
            Answer::Written(meta) => {
                Ok(Guarded::Written(pod_input(meta).ok().filter(|answer| {
                    answer.uid.as_deref() == Some(pod.uid.as_str())
                })))
            }
            Answer::Changed(meta) => pod_input(meta).map(Guarded::Changed),
        }
    }
}

impl PodApi for KubeApi {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<PodInput>, PodError> {
        let label = format!("{namespace}/{name}");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let pod = self
            .retrying(&label, "reading the pod", || {
                let api = &api;
                async move {
                    match self.call(|| api.get_metadata(name)).await {
                        Ok(pod) => Ok(Some(pod)),
                        Err(failure) if failure.kind == FailureKind::NotFound => Ok(None),
                        Err(failure) => Err(TryError::from(failure)),
                    }
                }
            })
            .await?;
        pod.map(|pod| pod_input(pod.metadata)).transpose()
    }

    async fn patch_annotations(
        &self,
        pod: &PodRef,
        patch: &AnnotationPatch,
    ) -> Result<(), PodError> {
        self.patch_and_read(pod, patch).await.map(|_| ())
    }

    async fn patch_and_read(
        &self,
        pod: &PodRef,
        patch: &AnnotationPatch,
    ) -> Result<Option<PodInput>, PodError> {
        match self.guarded_patch(pod, patch, None).await? {
            Guarded::Written(answer) => Ok(answer),
            Guarded::Changed(_) => {
                unreachable!("a patch without a resource version is never refused as changed")
            }
        }
    }

    async fn patch_if_unchanged(
        &self,
        pod: &PodRef,
        patch: &AnnotationPatch,
        seen: &PodInput,
    ) -> Result<Guarded, PodError> {
        match seen.resource_version.as_deref() {
            Some(version) => self.guarded_patch(pod, patch, Some(version)).await,
            // A read without a version (not the API server's) cannot be
            // a precondition.
            None => crate::pods::read_then_patch(self, pod, patch, seen).await,
        }
    }

    async fn event(&self, pod: &PodRef, event: &Event) -> Result<(), PodError> {
        // Every event is a new `events.k8s.io/v1` object, posted once:
        // kube-runtime 5's Recorder would fold a repeat of (type, reason,
        // action, regarding) within 6 minutes into a PATCH of the first
        // event that keeps the first note, so "attempt 2: ..." and later
        // lines would never be seen; and the created object the API server
        // sends back is not parsed. No retry, because events are best
        // effort and must not hold up the fixup loop.
        let body =
            serde_json::to_vec(&self.event_object(pod, event)).map_err(|e| PodError::Api {
                pod: pod.to_string(),
                reason: format!("recording event {}: {e}", event.reason),
            })?;
        let path = format!("/apis/events.k8s.io/v1/namespaces/{}/events", pod.namespace);
        self.call(|| async move {
            let request = ::kube::core::Request::new(path)
                .create(&::kube::api::PostParams::default(), body)
                .map_err(::kube::Error::BuildRequest)?;
            self.client.request_text(request).await.map(drop)
        })
        .await
        .map_err(|failure| PodError::Api {
            pod: pod.to_string(),
            reason: format!(
                "recording event {}: {}; {}",
                event.reason,
                failure.detail,
                match failure.kind {
                    FailureKind::Permanent => permanent_hint(failure.code),
                    _ => "the event is lost; check that the API server is reachable",
                }
            ),
        })
    }

    async fn node_pods(&self, node: &str) -> Result<Vec<PodInput>, PodError> {
        self.list_node_pods(node).await
    }

    async fn stack_events(
        &self,
        pod: &PodRef,
        field_selectors: &[String],
    ) -> Result<fixup_core::memory::Listed, PodError> {
        let mut all = fixup_core::memory::Listed::default();
        for selector in field_selectors {
            let listed = self.list_stack_events(pod, selector).await?;
            all.events.extend(listed.events);
            all.truncated |= listed.truncated;
        }
        Ok(all)
    }
}

/// `{"metadata": {"uid": <uid>, "annotations": {k: v | null}}}`, and
/// `"resourceVersion": <version>` beside the uid when there is one.
/// Serialized straight from the patch (a `None` value is JSON `null`,
/// which removes the annotation), with nothing copied.
#[derive(Debug, serde::Serialize)]
struct MergePatch<'a> {
    metadata: MergeMetadata<'a>,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct MergeMetadata<'a> {
    uid: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_version: Option<&'a str>,
    annotations: &'a AnnotationPatch,
}

fn merge_patch<'a>(
    pod: &'a PodRef,
    patch: &'a AnnotationPatch,
    version: Option<&'a str>,
) -> MergePatch<'a> {
    MergePatch {
        metadata: MergeMetadata {
            uid: &pod.uid,
            resource_version: version,
            annotations: patch,
        },
    }
}

/// What the host reads of a pod: its metadata only (requests ask the API
/// server for `PartialObjectMetadata`, so the spec and status are neither
/// sent nor parsed). The same rules as [`PodInput::from_value`]: a name is
/// required, an empty uid is none, a deletion timestamp means deleting.
pub fn pod_input(meta: ObjectMeta) -> Result<PodInput, PodError> {
    let name = match meta.name {
        Some(name) if !name.is_empty() => name,
        _ => {
            return Err(PodError::Api {
                pod: format!("{}/(no name)", meta.namespace.as_deref().unwrap_or("")),
                reason: format!("{SOURCE}: metadata.name: expected a non-empty string"),
            });
        }
    };
    Ok(PodInput {
        name,
        namespace: meta.namespace.unwrap_or_default(),
        uid: meta.uid.filter(|uid| !uid.is_empty()),
        annotations: meta.annotations.unwrap_or_default(),
        deleting: meta.deletion_timestamp.is_some(),
        resource_version: meta.resource_version.filter(|v| !v.is_empty()),
    })
}

/// Whether a 403's message is the authorizer's (RBAC, the Node
/// authorizer: `User "…" cannot get resource "pods" …`), not an admission
/// plugin's. The authorizer's answer is about the daemon's identity, not
/// the pod, and it is not always final: an API server that has just
/// started answers so until its authorizer has loaded the bindings (about
/// a second, seen against the real one in host/tests/realkube_nodes.rs),
/// and an operator may fix the binding. So it is tried again, within the
/// request and then with the daemon's backoff, where an admission
/// plugin's refusal of the same request would only be refused again.
fn authorizer_refusal(message: &str) -> bool {
    // The authorizer's own sentence, anchored where it starts, so that an
    // admission webhook's denial that quotes a tenant's text (`admission
    // webhook "…" denied the request: …`) or a policy's
    // (`ValidatingAdmissionPolicy '…'`) is never taken for it.
    let Some((head, user)) = message.split_once(" is forbidden: User \"") else {
        return false;
    };
    // What is forbidden: `pods` or `pods "name"`, nothing else before.
    let mut words = head.split(' ');
    let resource = words.next().is_some_and(|r| {
        !r.is_empty()
            && r.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"./-".contains(&b))
    });
    let name = words.next().is_none_or(|n| {
        n.len() >= 2 && n.starts_with('"') && n.ends_with('"') && !n[1..n.len() - 1].contains('"')
    });
    if !(resource && name && words.next().is_none()) {
        return false;
    }
    let Some((_, rest)) = user.split_once("\" cannot ") else {
        return false;
    };
    rest.split_once(' ')
        .is_some_and(|(verb, after)| !verb.is_empty() && after.starts_with("resource \""))
}

/// Said after an authorizer's 403, which is tried again.
const AUTHORIZER_HINT: &str = "; the API server's authorizer refused the daemon's identity: an API server that has just started answers so until it has loaded its bindings (the request is tried again), else grant the identity what deploy/rbac.yaml grants";

/// The next action for a failure that retrying does not fix.
fn permanent_hint(code: u16) -> &'static str {
    match code {
        401 => "not retried; check the service account token or the kubeconfig credentials",
        403 => {
            "not retried: an admission plugin refused it (for a pod, deploy/admission-policy.yaml lets the daemon's identities, its daemonUsers and daemonGroups, write only the daemon's annotations; check the policies and webhooks the message names); if the message is the authorizer's, grant the identity what deploy/rbac.yaml grants: get, list, watch and patch on pods, create and list on events.k8s.io events"
        }
        _ => "not retried, another try would get the same answer; check the request named above",
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FailureKind {
    NotFound,
    Conflict,
    Transient,
    Permanent,
}

/// A failed request, classified.
#[derive(Debug)]
struct Failure {
    kind: FailureKind,
    /// The HTTP status when the API server answered, else 0.
    code: u16,
    /// What went wrong, for the error message.
    detail: String,
    retry_after: Option<Duration>,
}

impl Failure {
    fn from_kube(err: &::kube::Error) -> Self {
        use ::kube::Error as E;
        match err {
            E::Api(status) => {
                let code = status_code(status);
                let kind = match code {
                    404 => FailureKind::NotFound,
                    409 => FailureKind::Conflict,
                    429 | 500..=599 => FailureKind::Transient,
                    403 if authorizer_refusal(&status.message) => FailureKind::Transient,
                    _ => FailureKind::Permanent,
                };
                let retry_after = status
                    .details
                    .as_ref()
                    .map(|d| d.retry_after_seconds)
                    .filter(|&s| s > 0)
                    .map(|s| Duration::from_secs(s.into()));
                let mut detail = format!("{code} {}", status.reason);
                if !status.message.is_empty() {
                    detail.push_str(": ");
                    detail.push_str(&status.message);
                }
                if code == 403 && kind == FailureKind::Transient {
                    detail.push_str(AUTHORIZER_HINT);
                }
                Failure {
                    kind,
                    code,
                    detail,
                    retry_after,
                }
            }
            // No answer, or the connection broke: the next try may get through.
            E::HyperError(_) | E::Service(_) | E::ReadEvents(_) => Failure {
                kind: FailureKind::Transient,
                code: 0,
                detail: err.to_string(),
                retry_after: None,
            },
            _ => Failure {
                kind: FailureKind::Permanent,
                code: 0,
                detail: err.to_string(),
                retry_after: None,
            },
        }
    }
}

/// The pod now has another uid than `pod`'s: it was replaced, and nothing
/// is written to the new incarnation.
fn replaced(pod: &PodRef, live: &ObjectMeta) -> TryError {
    tracing::info!(
        pod = %pod,
        expected_uid = pod.uid,
        live_uid = live.uid.as_deref().unwrap_or(""),
        "pod was replaced; not writing to the new incarnation"
    );
    TryError::Gone
}

/// What one try came to, when it did not succeed.
enum TryError {
    /// The pod is deleted or replaced: stop, write nothing more.
    Gone,
    /// Worth another try after the backoff.
    Transient {
        detail: String,
        retry_after: Option<Duration>,
    },
    /// Another try would get the same answer.
    Permanent { detail: String, code: u16 },
}

impl From<Failure> for TryError {
    fn from(failure: Failure) -> Self {
        match failure.kind {
            FailureKind::Permanent | FailureKind::NotFound => TryError::Permanent {
                code: failure.code,
                detail: failure.detail,
            },
            FailureKind::Conflict | FailureKind::Transient => TryError::Transient {
                detail: failure.detail,
                retry_after: failure.retry_after,
            },
        }
    }
}

/// The HTTP status of an error answer. kube fills `code` from the body; a
/// body without one (a proxy's, or `{}`) falls back to the reason.
fn status_code(status: &::kube::core::Status) -> u16 {
    if status.code != 0 {
        return status.code;
    }
    match status.reason.as_str() {
        "NotFound" => 404,
        "Conflict" | "AlreadyExists" => 409,
        "TooManyRequests" => 429,
        "InternalError" => 500,
        "ServiceUnavailable" => 503,
        "ServerTimeout" | "Timeout" => 504,
        _ => 0,
    }
}
