//! A tower-test mock API server that plays one scripted conversation.
//!
//! A [`Scenario`] is the exact conversation a [`KubeApi`] must have with
//! the API server, in order. The mock asserts method, path, query and body
//! of every request, answers with the scripted status and body, fails on
//! any request the scenario does not expect, and fails when a scripted
//! request never came. Under paused time (`start_paused`) the client's
//! retry backoff and request timeouts pass instantly.
//!
//! A listing of a pod's events (the wake rule of spec section 2 asks for
//! one before it classifies a VM) that the scenario does not script is
//! answered with no events and is not a step: a conversation about
//! something else need not spell it out.

use std::future::Future;

use fixup_host::kube::{KubeApi, REPORTER};
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// Asserts on a request's head and its JSON body (`null` when empty).
pub type BodyCheck = Box<dyn FnOnce(&http::request::Parts, &Value) + Send>;

/// The `reportingInstance` of the [`KubeApi`] a scenario hands out.
pub const NODE: &str = "node-1";

/// The content type of an annotation patch.
pub const MERGE_PATCH: &str = "application/merge-patch+json";

/// One expected request and the answer to it.
pub struct Exchange {
    method: Method,
    path: String,
    /// Every query parameter, decoded; order does not matter.
    query: Vec<(String, String)>,
    /// The request's `Content-Type`, when it must have one.
    content_type: Option<&'static str>,
    check: BodyCheck,
    /// `None`: never answer (the client's request timeout must fire).
    answer: Option<(StatusCode, Value)>,
}

impl Exchange {
    /// A request answered `200 {}` unless [`respond`](Self::respond) says
    /// otherwise.
    pub fn new(method: Method, path: &str) -> Self {
        Exchange {
            method,
            path: path.to_owned(),
            query: Vec::new(),
            content_type: None,
            check: Box::new(|_, _| {}),
            answer: Some((StatusCode::OK, json!({}))),
        }
    }

    pub fn get(path: &str) -> Self {
        Self::new(Method::GET, path)
    }

    pub fn post(path: &str) -> Self {
        Self::new(Method::POST, path)
    }

    /// A PATCH by this host: asserts the merge-patch content type and the
    /// field manager.
    pub fn patch(path: &str) -> Self {
        let mut exchange = Self::new(Method::PATCH, path).query(&[("fieldManager", REPORTER)]);
        exchange.content_type = Some(MERGE_PATCH);
        exchange
    }

    pub fn query(mut self, pairs: &[(&str, &str)]) -> Self {
        self.query = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self
    }

    pub fn body(
        mut self,
        check: impl FnOnce(&http::request::Parts, &Value) + Send + 'static,
    ) -> Self {
        self.check = Box::new(check);
        self
    }

    pub fn respond(mut self, status: u16, body: Value) -> Self {
        self.answer = Some((StatusCode::from_u16(status).unwrap(), body));
        self
    }

    /// Never answer this request.
    pub fn hang(mut self) -> Self {
        self.answer = None;
        self
    }

    fn describe(&self) -> String {
        format!("{} {} {:?}", self.method, self.path, self.query)
    }
}

/// A named conversation with the mock API server.
pub struct Scenario {
    name: &'static str,
    exchanges: Vec<Exchange>,
}

impl Scenario {
    pub fn new(name: &'static str, exchanges: Vec<Exchange>) -> Self {
        Scenario { name, exchanges }
    }

    /// Serve the scenario to a fresh `KubeApi` (reporter [`REPORTER`],
    /// instance [`NODE`], default retry policy) handed to `client`. Returns
    /// what `client` returned once the whole conversation went as scripted;
    /// panics otherwise. `client` must drop the `KubeApi` (and anything
    /// holding it) before its future ends: that closes the mock, so a
    /// request still expected then was never sent.
    pub async fn run<T, F, Fut>(self, client: F) -> T
    where
        F: FnOnce(KubeApi) -> Fut,
        Fut: Future<Output = T>,
    {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(serve(self.name, self.exchanges, handle));
        let api = KubeApi::new(
            kube::Client::new(service, "default"),
            REPORTER,
            Some(NODE.to_owned()),
        );
        let result = client(api).await;
        if let Err(err) = server.await {
            std::panic::resume_unwind(err.into_panic());
        }
        result
    }
}

async fn serve(name: &'static str, exchanges: Vec<Exchange>, mut handle: Handle) {
    let total = exchanges.len();
    // Requests left unanswered on purpose stay open until the scenario ends.
    let mut hung = Vec::new();
    for (index, exchange) in exchanges.into_iter().enumerate() {
        let step = format!("scenario {name:?}, step {}/{total}", index + 1);
        let scripted_listing = exchange.method == Method::GET && is_events(&exchange.path);
        let (request, respond) = loop {
            let Some((request, respond)) = handle.next_request().await else {
                panic!(
                    "{step}: expected {} but the client sent nothing more",
                    exchange.describe()
                );
            };
            if !scripted_listing
                && request.method() == Method::GET
                && is_events(request.uri().path())
            {
                respond.send_response(no_events());
                continue;
            }
            break (request, respond);
        };
        let (parts, body) = request.into_parts();
        assert_eq!(
            parts.method, exchange.method,
            "{step}: method of {}",
            parts.uri
        );
        assert_eq!(parts.uri.path(), exchange.path, "{step}: path");
        let mut query = decode_query(parts.uri.query().unwrap_or(""));
        query.sort();
        let mut expected = exchange.query;
        expected.sort();
        assert_eq!(query, expected, "{step}: query of {}", parts.uri);
        if let Some(content_type) = exchange.content_type {
            let found = parts.headers.get(http::header::CONTENT_TYPE);
            assert_eq!(
                found.and_then(|v| v.to_str().ok()),
                Some(content_type),
                "{step}: content type"
            );
        }
        let bytes = body.collect_bytes().await.expect("request body");
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("request body is JSON")
        };
        let check = exchange.check;
        if let Err(panic) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&parts, &body)))
        {
            eprintln!("{step}: the check of {} {} failed", parts.method, parts.uri);
            std::panic::resume_unwind(panic);
        }
        match exchange.answer {
            Some((status, answer)) => respond.send_response(
                Response::builder()
                    .status(status)
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                    .unwrap(),
            ),
            None => hung.push(respond),
        }
    }
    while let Some((request, respond)) = handle.next_request().await {
        if request.method() == Method::GET && is_events(request.uri().path()) {
            respond.send_response(no_events());
            continue;
        }
        panic!(
            "scenario {name:?}: unexpected request {} {} after all {total} steps",
            request.method(),
            request.uri()
        );
    }
    drop(hung);
}

/// `a=b&c=d` with percent-escapes and `+` decoded.
fn decode_query(query: &str) -> Vec<(String, String)> {
    fn decode(text: &str) -> String {
        let bytes = text.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                    out.push(u8::from_str_radix(hex, 16).expect("percent escape"));
                    i += 2;
                }
                other => out.push(other),
            }
            i += 1;
        }
        String::from_utf8(out).expect("query is UTF-8")
    }
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// A `Status` body as the API server sends with an error.
pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    })
}

/// Whether `path` is a namespace's events.k8s.io events.
fn is_events(path: &str) -> bool {
    path.starts_with("/apis/events.k8s.io/v1/namespaces/") && path.ends_with("/events")
}

/// An empty events.k8s.io `EventList`.
fn no_events() -> Response<Body> {
    let list =
        json!({"apiVersion": "events.k8s.io/v1", "kind": "EventList", "metadata": {}, "items": []});
    Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(&list).unwrap()))
        .unwrap()
}
