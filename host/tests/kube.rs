//! `KubeApi` against a tower-test mock API server.
//!
//! Each test is a named [`Scenario`] (`support/mock_api.rs`): the exact
//! conversation the client must have with the API server, in order. The
//! mock asserts method, path, query and body of every request, answers
//! with the scripted status and body, fails on any request the scenario
//! does not expect, and fails when a scripted request never came. Time is
//! paused (`start_paused`), so the retry backoff and request timeouts pass
//! instantly; no assertion depends on how long anything took.

use crate::support;

use std::collections::BTreeMap;

use fixup_core::facts::PodInput;
use fixup_host::kube::{EVENT_PAGES, REPORTER, RetryPolicy};
use fixup_host::pods::{AnnotationPatch, Event, Guarded, PodApi, PodError, PodRef, reasons};
use http::Method;
use serde_json::{Value, json};
use support::mock_api::{Exchange, NODE, Scenario, status};

const POD_PATH: &str = "/api/v1/namespaces/ns/pods/name";

/// A PATCH of pod `ns/name` by this host.
fn patch_pod() -> Exchange {
    Exchange::patch(POD_PATH)
}

fn pod_ref() -> PodRef {
    PodRef {
        namespace: "ns".into(),
        name: "name".into(),
        uid: "uid-1".into(),
    }
}

fn pod_json(name: &str, uid: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "annotations": annotations,
        },
        "spec": { "nodeName": NODE, "containers": [] },
    })
}

fn conflict() -> Value {
    status(
        409,
        "Conflict",
        "Precondition failed: UID in precondition: uid-1, UID in object meta: uid-2",
    )
}

fn internal_error() -> Value {
    status(500, "InternalError", "etcdserver: request timed out")
}

fn patch() -> AnnotationPatch {
    BTreeMap::from([
        (
            "vm.cocoonstack.io/post-clone-state".to_owned(),
            Some("done".to_owned()),
        ),
        ("vm.cocoonstack.io/post-clone-errors".to_owned(), None),
    ])
}

fn patched_pod() -> Value {
    pod_json(
        "name",
        "uid-1",
        json!({ "vm.cocoonstack.io/post-clone-state": "done" }),
    )
}

#[tokio::test(start_paused = true)]
async fn get_reads_an_existing_pod() {
    let pod = Scenario::new(
        "get found",
        vec![Exchange::get(POD_PATH).respond(200, pod_json("name", "uid-1", json!({"a": "b"})))],
    )
    .run(|api| async move { api.get("ns", "name").await })
    .await;
    assert_eq!(
        pod,
        Ok(Some(PodInput {
            name: "name".into(),
            namespace: "ns".into(),
            uid: Some("uid-1".into()),
            annotations: BTreeMap::from([("a".into(), "b".into())]),
            deleting: false,
            resource_version: None,
        }))
    );
}

#[tokio::test(start_paused = true)]
async fn get_of_a_missing_pod_is_none() {
    let pod = Scenario::new(
        "get 404",
        vec![
            Exchange::get(POD_PATH)
                .respond(404, status(404, "NotFound", "pods \"name\" not found")),
        ],
    )
    .run(|api| async move { api.get("ns", "name").await })
    .await;
    assert_eq!(pod, Ok(None));
}

#[tokio::test(start_paused = true)]
async fn get_retries_a_server_error() {
    let pod = Scenario::new(
        "get 503 then found",
        vec![
            Exchange::get(POD_PATH).respond(503, status(503, "ServiceUnavailable", "try later")),
            Exchange::get(POD_PATH).respond(200, pod_json("name", "uid-1", json!({}))),
        ],
    )
    .run(|api| async move { api.get("ns", "name").await })
    .await;
    assert_eq!(pod.unwrap().unwrap().uid.as_deref(), Some("uid-1"));
}

#[tokio::test(start_paused = true)]
async fn patch_sends_a_uid_guarded_merge_patch() {
    let result = Scenario::new(
        "patch success",
        vec![
            patch_pod()
                .body(|_, body| {
                    assert_eq!(
                        body,
                        &json!({
                            "metadata": {
                                "uid": "uid-1",
                                "annotations": {
                                    "vm.cocoonstack.io/post-clone-state": "done",
                                    "vm.cocoonstack.io/post-clone-errors": null,
                                },
                            },
                        })
                    );
                })
                .respond(200, patched_pod()),
        ],
    )
    .run(|api| async move { api.patch_annotations(&pod_ref(), &patch()).await })
    .await;
    assert_eq!(result, Ok(()));
}

/// `pod_json` at a resource version.
fn pod_at(uid: &str, version: &str, annotations: Value) -> Value {
    let mut pod = pod_json("name", uid, annotations);
    pod["metadata"]["resourceVersion"] = json!(version);
    pod
}

/// The pod as the host read it, at resource version `version`.
fn seen_at(version: Option<&str>) -> PodInput {
    PodInput {
        name: "name".into(),
        namespace: "ns".into(),
        uid: Some("uid-1".into()),
        annotations: BTreeMap::new(),
        deleting: false,
        resource_version: version.map(str::to_owned),
    }
}

/// `patch_if_unchanged` of [`patch`] on `ns/name`, read at `version`,
/// against the conversation `exchanges`.
async fn decided_write(
    name: &'static str,
    exchanges: Vec<Exchange>,
    version: Option<&'static str>,
) -> Result<Guarded, PodError> {
    Scenario::new(name, exchanges)
        .run(|api| async move {
            api.patch_if_unchanged(&pod_ref(), &patch(), &seen_at(version))
                .await
        })
        .await
}

fn modified() -> Value {
    status(
        409,
        "Conflict",
        "Operation cannot be fulfilled on pods \"name\": the object has been modified; please apply your changes to the latest version and try again",
    )
}

#[tokio::test(start_paused = true)]
async fn a_decided_write_carries_the_reads_resource_version_and_no_read() {
    let result = decided_write(
        "guarded patch success",
        vec![
            patch_pod()
                .body(|_, body| {
                    assert_eq!(
                        body["metadata"],
                        json!({
                            "uid": "uid-1",
                            "resourceVersion": "41",
                            "annotations": {
                                "vm.cocoonstack.io/post-clone-state": "done",
                                "vm.cocoonstack.io/post-clone-errors": null,
                            },
                        })
                    );
                })
                .respond(
                    200,
                    pod_at(
                        "uid-1",
                        "42",
                        json!({"vm.cocoonstack.io/post-clone-state": "done"}),
                    ),
                ),
        ],
        Some("41"),
    )
    .await;
    let Ok(Guarded::Written(Some(answer))) = result else {
        panic!("expected a write with the pod answered, got {result:?}");
    };
    assert_eq!(answer.resource_version.as_deref(), Some("42"));
    assert_eq!(
        answer.annotation("vm.cocoonstack.io/post-clone-state"),
        "done"
    );
}

#[tokio::test(start_paused = true)]
async fn a_decided_write_on_a_changed_pod_is_refused_with_the_pod_now() {
    let result = decided_write(
        "guarded patch 409, the pod moved to another version",
        vec![
            patch_pod().respond(409, modified()),
            Exchange::get(POD_PATH).respond(
                200,
                pod_at(
                    "uid-1",
                    "43",
                    json!({"vm.cocoonstack.io/hibernate": "true"}),
                ),
            ),
        ],
        Some("41"),
    )
    .await;
    let Ok(Guarded::Changed(now)) = result else {
        panic!("expected the pod as it is now, got {result:?}");
    };
    assert_eq!(now.resource_version.as_deref(), Some("43"));
    assert_eq!(now.annotation("vm.cocoonstack.io/hibernate"), "true");
}

#[tokio::test(start_paused = true)]
async fn a_decided_write_conflicting_at_the_same_version_is_retried() {
    let result = decided_write(
        "guarded patch 409, the pod still at the version read, patch again",
        vec![
            patch_pod().respond(409, modified()),
            Exchange::get(POD_PATH).respond(200, pod_at("uid-1", "41", json!({}))),
            patch_pod()
                .body(|_, body| assert_eq!(body["metadata"]["resourceVersion"], "41"))
                .respond(200, pod_at("uid-1", "42", json!({}))),
        ],
        Some("41"),
    )
    .await;
    assert!(
        matches!(result, Ok(Guarded::Written(Some(_)))),
        "{result:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_decided_write_on_a_replaced_pod_is_gone() {
    let result = decided_write(
        "guarded patch 409, the pod was recreated",
        vec![
            patch_pod().respond(409, conflict()),
            Exchange::get(POD_PATH).respond(200, pod_at("uid-2", "1", json!({}))),
        ],
        Some("41"),
    )
    .await;
    assert_eq!(
        result,
        Err(PodError::Gone {
            pod: "ns/name".into()
        })
    );
}

#[tokio::test(start_paused = true)]
async fn a_decided_write_from_a_read_without_a_version_reads_first() {
    let result = decided_write(
        "no version to guard with: read, then the uid-guarded patch",
        vec![
            Exchange::get(POD_PATH).respond(200, pod_json("name", "uid-1", json!({}))),
            patch_pod()
                .body(|_, body| assert!(body["metadata"].get("resourceVersion").is_none()))
                .respond(200, patched_pod()),
        ],
        None,
    )
    .await;
    assert!(matches!(result, Ok(Guarded::Written(_))), "{result:?}");
}

#[tokio::test(start_paused = true)]
async fn patch_conflict_with_the_same_uid_is_retried() {
    let result = Scenario::new(
        "patch 409, pod still has our uid, patch again",
        vec![
            patch_pod().respond(409, conflict()),
            Exchange::get(POD_PATH).respond(200, pod_json("name", "uid-1", json!({}))),
            patch_pod()
                .body(|_, body| assert_eq!(body["metadata"]["uid"], "uid-1"))
                .respond(200, patched_pod()),
        ],
    )
    .run(|api| async move { api.patch_annotations(&pod_ref(), &patch()).await })
    .await;
    assert_eq!(result, Ok(()));
}

#[tokio::test(start_paused = true)]
async fn patch_conflict_with_another_uid_is_gone_and_not_retried() {
    let result = Scenario::new(
        "patch 409, pod was recreated",
        vec![
            patch_pod().respond(409, conflict()),
            Exchange::get(POD_PATH).respond(200, pod_json("name", "uid-2", json!({}))),
        ],
    )
    .run(|api| async move { api.patch_annotations(&pod_ref(), &patch()).await })
    .await;
    assert_eq!(
        result,
        Err(PodError::Gone {
            pod: "ns/name".into()
        })
    );
}

/// The real API server refuses a merge patch carrying another uid with 422
/// ("field is immutable"), not 409: the live pod says it was replaced.
#[tokio::test(start_paused = true)]
async fn patch_refused_as_invalid_for_another_uid_is_gone() {
    let result = Scenario::new(
        "patch 422 metadata.uid immutable, pod was recreated",
        vec![
            patch_pod().respond(
                422,
                status(
                    422,
                    "Invalid",
                    "Pod \"name\" is invalid: metadata.uid: Invalid value: \"uid-1\": field is immutable",
                ),
            ),
            Exchange::get(POD_PATH).respond(200, pod_json("name", "uid-2", json!({}))),
        ],
    )
    .run(|api| async move { api.patch_annotations(&pod_ref(), &patch()).await })
    .await;
    assert_eq!(
        result,
        Err(PodError::Gone {
            pod: "ns/name".into()
        })
    );
}

/// A 422 for a pod that still has our uid is a refusal for good.
#[tokio::test(start_paused = true)]
async fn patch_refused_as_invalid_for_our_uid_stays_refused() {
    let result = Scenario::new(
        "patch 422, same uid",
        vec![
            patch_pod().respond(
                422,
                status(422, "Invalid", "metadata.annotations: Too long"),
            ),
            Exchange::get(POD_PATH).respond(200, pod_json("name", "uid-1", json!({}))),
        ],
    )
    .run(|api| async move { api.patch_annotations(&pod_ref(), &patch()).await })
    .await;
    assert!(
        matches!(&result, Err(PodError::Refused { reason, .. }) if reason.contains("Too long")),
        "{result:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn patch_conflict_with_the_pod_deleted_is_gone() {
    let result = Scenario::new(
        "patch 409, pod deleted meanwhile",
        vec![
            patch_pod().respond(409, conflict()),
            Exchange::get(POD_PATH)
                .respond(404, status(404, "NotFound", "pods \"name\" not found")),
        ],
    )
    .run(|api| async move { api.patch_annotations(&pod_ref(), &patch()).await })
    .await;
    assert_eq!(
        result,
        Err(PodError::Gone {
            pod: "ns/name".into()
        })
    );
}

#[tokio::test(start_paused = true)]
async fn patch_of_a_missing_pod_is_gone() {
    let result = Scenario::new(
        "patch 404",
        vec![patch_pod().respond(404, status(404, "NotFound", "pods \"name\" not found"))],
    )
    .run(|api| async move { api.patch_annotations(&pod_ref(), &patch()).await })
    .await;
    assert_eq!(
        result,
        Err(PodError::Gone {
            pod: "ns/name".into()
        })
    );
}

#[tokio::test(start_paused = true)]
async fn patch_recovers_from_server_errors_after_backoff() {
    let result = Scenario::new(
        "patch 500, 500, 200",
        vec![
            patch_pod().respond(500, internal_error()),
            patch_pod().respond(500, internal_error()),
            patch_pod().respond(200, patched_pod()),
        ],
    )
    .run(|api| async move { api.patch_annotations(&pod_ref(), &patch()).await })
    .await;
    assert_eq!(result, Ok(()));
}

#[tokio::test(start_paused = true)]
async fn patch_gives_up_after_the_policy_tries() {
    let tries = RetryPolicy::default().tries;
    assert_eq!(tries, 5, "the documented default");
    let exchanges = (0..tries)
        .map(|_| patch_pod().respond(500, internal_error()))
        .collect();
    let result = Scenario::new("patch always 500", exchanges)
        .run(|api| async move { api.patch_annotations(&pod_ref(), &patch()).await })
        .await;
    let Err(PodError::Api { pod, reason }) = &result else {
        panic!("expected an API error, got {result:?}");
    };
    assert_eq!(pod, "ns/name");
    let message = result.as_ref().unwrap_err().to_string();
    assert!(message.contains("ns/name"), "{message}");
    assert!(reason.contains("gave up after 5 tries"), "{reason}");
    assert!(reason.contains("etcdserver: request timed out"), "{reason}");
}

#[tokio::test(start_paused = true)]
async fn patch_retries_a_request_that_gets_no_answer() {
    let result = Scenario::new(
        "patch unanswered, then 200",
        vec![patch_pod().hang(), patch_pod().respond(200, patched_pod())],
    )
    .run(|api| async move { api.patch_annotations(&pod_ref(), &patch()).await })
    .await;
    assert_eq!(result, Ok(()));
}

#[tokio::test(start_paused = true)]
async fn patch_forbidden_is_not_retried() {
    let result = Scenario::new(
        "patch 403",
        vec![patch_pod().respond(
            403,
            status(
                403,
                "Forbidden",
                "pods \"name\" is forbidden: User cannot patch",
            ),
        )],
    )
    .run(|api| async move { api.patch_annotations(&pod_ref(), &patch()).await })
    .await;
    let Err(PodError::Refused { pod, reason }) = result else {
        panic!("expected an API error, got {result:?}");
    };
    assert_eq!(pod, "ns/name");
    assert!(reason.contains("403 Forbidden"), "{reason}");
    assert!(
        reason.contains("an admission plugin refused it"),
        "{reason}"
    );
}

/// The authorizer's 403 (RBAC's wording, `User "…" cannot patch resource
/// "pods"`) is about the identity, and an API server that has just
/// started answers so until its authorizer has loaded: tried again.
#[tokio::test(start_paused = true)]
async fn patch_refused_by_the_authorizer_is_tried_again() {
    let rbac = "pods \"name\" is forbidden: User \"cocoon-fixup:n1\" cannot patch resource \"pods\" in API group \"\" in the namespace \"ns\"";
    let result = Scenario::new(
        "patch 403 (authorizer), then 200",
        vec![
            patch_pod().respond(403, status(403, "Forbidden", rbac)),
            patch_pod().respond(200, patched_pod()),
        ],
    )
    .run(|api| async move { api.patch_annotations(&pod_ref(), &patch()).await })
    .await;
    assert_eq!(result, Ok(()));
    // Refused every time: the error says why and what to do, and the
    // daemon's backoff tries the pod again later (retryable).
    let result = Scenario::new(
        "patch 403 (authorizer) five times",
        (0..5)
            .map(|_| patch_pod().respond(403, status(403, "Forbidden", rbac)))
            .collect(),
    )
    .run(|api| async move { api.patch_annotations(&pod_ref(), &patch()).await })
    .await;
    let Err(PodError::Api { reason, .. }) = result else {
        panic!("expected an API error, got {result:?}");
    };
    assert!(reason.contains("cannot patch resource"), "{reason}");
    assert!(reason.contains("deploy/rbac.yaml"), "{reason}");
}

/// Each shape of the authorizer's sentence the real API server sends is
/// tried again: a named object, the cluster scope, a subresource, a
/// grouped resource, RBAC's reason after it.
#[tokio::test(start_paused = true)]
async fn every_shape_of_the_authorizers_refusal_is_tried_again() {
    for message in [
        "pods \"name\" is forbidden: User \"cocoon-fixup:n1\" cannot patch resource \"pods/status\" in API group \"\" in the namespace \"ns\"",
        "pods is forbidden: User \"cocoon-fixup:n1\" cannot list resource \"pods\" in API group \"\" at the cluster scope",
        "events.events.k8s.io is forbidden: User \"cocoon-fixup:n1\" cannot create resource \"events\" in API group \"events.k8s.io\" in the namespace \"ns\"",
        "pods \"name\" is forbidden: User \"system:node:vk-cocoon\" cannot patch resource \"pods\" in API group \"\" in the namespace \"ns\": RBAC: clusterrole.rbac.authorization.k8s.io \"x\" not found",
    ] {
        let result = Scenario::new(
            "patch 403 (authorizer), then 200",
            vec![
                patch_pod().respond(403, status(403, "Forbidden", message)),
                patch_pod().respond(200, patched_pod()),
            ],
        )
        .run(|api| async move { api.patch_annotations(&pod_ref(), &patch()).await })
        .await;
        assert_eq!(result, Ok(()), "{message}");
    }
}

/// Only the authorizer's own sentence is tried again: a policy's or a
/// webhook's denial that quotes a tenant's text shaped like it stays a
/// refusal, sent once.
#[tokio::test(start_paused = true)]
async fn a_denial_that_only_quotes_the_authorizers_words_is_not_retried() {
    for message in [
        "pods \"name\" is forbidden: ValidatingAdmissionPolicy 'cocoon-stack-annotations' with binding 'cocoon-stack-annotations' denied request: the daemon may change only its own annotations",
        "admission webhook \"validation.gatekeeper.sh\" denied the request: [owner] pods \"name\" is forbidden: User \"x\" cannot patch resource \"pods\"",
        "pods \"name\" is forbidden: note says User \"x\" cannot patch resource \"pods\"",
    ] {
        let result = Scenario::new(
            "patch 403 (not the authorizer)",
            vec![patch_pod().respond(403, status(403, "Forbidden", message))],
        )
        .run(|api| async move { api.patch_annotations(&pod_ref(), &patch()).await })
        .await;
        assert!(
            matches!(result, Err(PodError::Refused { .. })),
            "{message}: {result:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn patch_without_a_uid_sends_nothing() {
    let result = Scenario::new("patch without uid", vec![])
        .run(|api| async move {
            let pod = PodRef {
                uid: String::new(),
                ..pod_ref()
            };
            api.patch_annotations(&pod, &patch()).await
        })
        .await;
    assert!(matches!(result, Err(PodError::Api { .. })), "{result:?}");
}

fn event_exchange(kind: &'static str, note: &'static str) -> Exchange {
    Exchange::new(Method::POST, "/apis/events.k8s.io/v1/namespaces/ns/events")
        .body(move |_, body| {
            assert_eq!(body["reason"], reasons::EXEC_ATTEMPT_FAILED);
            assert_eq!(body["type"], kind);
            assert_eq!(body["note"], note);
            assert_eq!(body["action"], "PostCloneFixup");
            assert_eq!(body["reportingController"], REPORTER);
            assert_eq!(body["reportingInstance"], NODE);
            assert_eq!(body["metadata"]["namespace"], "ns");
            let regarding = &body["regarding"];
            assert_eq!(regarding["apiVersion"], "v1");
            assert_eq!(regarding["kind"], "Pod");
            assert_eq!(regarding["namespace"], "ns");
            assert_eq!(regarding["name"], "name");
            assert_eq!(regarding["uid"], "uid-1");
        })
        .respond(201, json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "name.1", "namespace": "ns"}}))
}

#[tokio::test(start_paused = true)]
async fn event_is_created_in_the_events_api() {
    let result = Scenario::new(
        "event creation",
        vec![event_exchange("Warning", "attempt 1: exit 1")],
    )
    .run(|api| async move {
        api.event(
            &pod_ref(),
            &Event::warning(reasons::EXEC_ATTEMPT_FAILED, "attempt 1: exit 1"),
        )
        .await
    })
    .await;
    assert_eq!(result, Ok(()));
}

#[tokio::test(start_paused = true)]
async fn repeated_events_each_keep_their_message() {
    // kube-runtime's Recorder would turn the second into a PATCH of the
    // first that keeps "attempt 1"; every attempt line must be visible.
    let result = Scenario::new(
        "two events with one reason",
        vec![
            event_exchange("Warning", "attempt 1: exit 1"),
            event_exchange("Warning", "attempt 2: exit 2"),
        ],
    )
    .run(|api| async move {
        for line in ["attempt 1: exit 1", "attempt 2: exit 2"] {
            api.event(
                &pod_ref(),
                &Event::warning(reasons::EXEC_ATTEMPT_FAILED, line),
            )
            .await?;
        }
        Ok::<_, PodError>(())
    })
    .await;
    assert_eq!(result, Ok(()));
}

#[tokio::test(start_paused = true)]
async fn event_failure_is_returned_without_retry() {
    let result = Scenario::new(
        "event 500",
        vec![
            Exchange::new(Method::POST, "/apis/events.k8s.io/v1/namespaces/ns/events")
                .respond(500, internal_error()),
        ],
    )
    .run(|api| async move {
        api.event(
            &pod_ref(),
            &Event::normal(reasons::SUCCEEDED, "kind=oci attempts=1"),
        )
        .await
    })
    .await;
    let Err(PodError::Api { pod, reason }) = result else {
        panic!("expected an API error, got {result:?}");
    };
    assert_eq!(pod, "ns/name");
    assert!(reason.contains(reasons::SUCCEEDED), "{reason}");
}

#[tokio::test(start_paused = true)]
async fn list_node_pods_selects_by_node_and_follows_pages() {
    let selector = format!("spec.nodeName={NODE}");
    let pods = Scenario::new(
        "list pods on the node, two pages",
        vec![
            Exchange::get("/api/v1/pods")
                .query(&[("fieldSelector", &selector), ("limit", "500")])
                .respond(
                    200,
                    json!({
                        "apiVersion": "v1",
                        "kind": "PodList",
                        "metadata": {"continue": "page-2"},
                        "items": [pod_json("a", "uid-a", json!({}))],
                    }),
                ),
            Exchange::get("/api/v1/pods")
                .query(&[
                    ("fieldSelector", &selector),
                    ("limit", "500"),
                    ("continue", "page-2"),
                ])
                .respond(
                    200,
                    json!({
                        "apiVersion": "v1",
                        "kind": "PodList",
                        "metadata": {},
                        "items": [pod_json("b", "uid-b", json!({"k": "v"}))],
                    }),
                ),
        ],
    )
    .run(|api| async move { api.list_node_pods(NODE).await })
    .await
    .unwrap();
    let names: Vec<_> = pods
        .iter()
        .map(|p| (p.name.as_str(), p.uid.as_deref()))
        .collect();
    assert_eq!(names, [("a", Some("uid-a")), ("b", Some("uid-b"))]);
    assert_eq!(pods[1].annotation("k"), "v");
}

/// `capture` reads the pod's events: events.k8s.io/v1 in the pod's
/// namespace, selected by the pod's uid, every page; only the host's
/// reasons are kept, oldest first.
#[tokio::test(start_paused = true)]
async fn list_pod_events_selects_by_uid_and_keeps_the_hosts_reasons() {
    let event = |name: &str, reason: &str, time: &str| {
        json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": name, "namespace": "ns"},
            "eventTime": time, "reason": reason, "type": "Warning", "note": format!("{reason} note"),
            "reportingController": "cocoon-fixup",
            "regarding": {"kind": "Pod", "namespace": "ns", "name": "name", "uid": "uid-1"},
        })
    };
    let mut forged = event(
        "e3",
        "PostCloneExecExhausted",
        "2026-12-01T10:00:03.000000Z",
    );
    forged["reportingController"] = json!("someone-else");
    let path = "/apis/events.k8s.io/v1/namespaces/ns/events";
    let selector = "regarding.uid=uid-1";
    let pod = pod_ref();
    let (events, truncated) = Scenario::new(
        "list the pod's events, two pages",
        vec![
            Exchange::get(path)
                .query(&[("fieldSelector", selector), ("limit", "500")])
                .respond(
                    200,
                    json!({"apiVersion": "events.k8s.io/v1", "kind": "EventList",
                        "metadata": {"continue": "page-2"},
                        "items": [event("e2", "PostCloneExecExhausted", "2026-12-01T10:00:02.000000Z"),
                                  event("e0", "Pulled", "2026-12-01T09:00:00.000000Z")]}),
                ),
            Exchange::get(path)
                .query(&[
                    ("fieldSelector", selector),
                    ("limit", "500"),
                    ("continue", "page-2"),
                ])
                .respond(
                    200,
                    json!({"apiVersion": "events.k8s.io/v1", "kind": "EventList", "metadata": {},
                        "items": [event("e1", "PostCloneExecAttemptFailed", "2026-12-01T10:00:01.000000Z"), forged]}),
                ),
        ],
    )
    .run(|api| async move { api.list_pod_events(&pod).await })
    .await
    .unwrap();
    let reasons: Vec<&str> = events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(
        reasons,
        ["PostCloneExecAttemptFailed", "PostCloneExecExhausted"]
    );
    assert_eq!(events[1].message, "PostCloneExecExhausted note");
    assert_eq!(events[1].kind, "Warning");
    assert!(!truncated);
}

/// The event list stops after `EVENT_PAGES` pages and says so.
#[tokio::test(start_paused = true)]
async fn list_pod_events_stops_after_the_page_cap() {
    let path = "/apis/events.k8s.io/v1/namespaces/ns/events";
    let selector = "regarding.uid=uid-1";
    let exchanges = (0..EVENT_PAGES)
        .map(|page| {
            let mut query = vec![("fieldSelector", selector), ("limit", "500")];
            let token = format!("page-{page}");
            if page > 0 {
                query.push(("continue", token.as_str()));
            }
            Exchange::get(path).query(&query).respond(
                200,
                json!({"apiVersion": "events.k8s.io/v1", "kind": "EventList",
                    "metadata": {"continue": format!("page-{}", page + 1)}, "items": []}),
            )
        })
        .collect();
    let pod = pod_ref();
    let (events, truncated) = Scenario::new("an endless event list", exchanges)
        .run(|api| async move { api.list_pod_events(&pod).await })
        .await
        .unwrap();
    assert!(events.is_empty());
    assert!(truncated, "pages were left");
}

#[test]
fn retry_policy_numbers_are_the_documented_ones() {
    let policy = RetryPolicy::default();
    let delays: Vec<u128> = (1..=6).map(|n| policy.delay_after(n).as_millis()).collect();
    assert_eq!(delays, [200, 400, 800, 1600, 3200, 3200]);
    assert_eq!(policy.request_timeout.as_secs(), 10);
}
