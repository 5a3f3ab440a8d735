//! The guard in front of every handler: who may use the API (cross-origin browsers, the API token),
//! load shedding, declared body sizes, and the request metrics and log line.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use super::body::DeadlineBody;
use super::closes_connection;
use super::headers::API_TOKEN_HEADER;
use crate::config::{Config, Secret};
use crate::metrics::Metrics;

/// Who may use a listener: the admin listener, whoever reaches it; the API, not a web page of
/// another site (`api.refuse_cross_origin`) and, with `api.token_file`, only with the token; the
/// SQS listener, not a web page of another site (it checks signatures itself, `sqs/sigv4.rs`).
#[derive(Clone, Default)]
pub(crate) struct Access {
    /// Refuse requests a web browser sent for another site's page.
    pub(crate) refuse_cross_origin: bool,
    pub(crate) token: Option<TokenCheck>,
}

/// The token every request must carry in `zkq-api-token`, but on the paths `exempt` allows.
#[derive(Clone)]
pub(crate) struct TokenCheck {
    pub(crate) token: Arc<Secret>,
    /// Paths that hold no data and need no token (the API's OpenAPI document and its viewer).
    pub(crate) exempt: fn(&str) -> bool,
}

/// Why the guard answered a request itself instead of its handler (or why the handler gave no
/// answer: it panicked). Each listener writes it in its own [`Dialect`]: the API and the admin
/// listener as zkq's JSON errors, the SQS listener in the request's protocol with SQS's codes
/// (`sqs/error.rs`).
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    pub(crate) kind: RefusalKind,
    /// The request is a batch put (zkq's batch route, SQS's `SendMessageBatch`).
    pub(crate) batch: bool,
    pub(crate) message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefusalKind {
    /// The body is (declared) larger than the listener's `limit` bytes.
    TooLarge { limit: usize },
    /// `api.max_concurrent_requests` requests are being handled already.
    Overloaded,
    /// The body did not arrive within `api.body_read_timeout`.
    TimedOut,
    /// No API token, or the wrong one.
    Unauthorized,
    /// A web browser sent it for another site's page.
    CrossOrigin,
    /// The handler panicked (a bug).
    Panic,
}

impl Refusal {
    pub(crate) fn new(kind: RefusalKind, message: impl Into<String>) -> Refusal {
        Refusal { kind, batch: false, message: message.into() }
    }

    /// What a handler that panicked answers.
    pub(crate) fn panic() -> Refusal {
        Refusal::new(RefusalKind::Panic, "internal error; this is a bug, please report it")
    }

    /// Whether the answer leaves the request's body unread (hyper then closes the connection).
    pub(crate) fn leaves_body_unread(&self) -> bool {
        matches!(self.kind, RefusalKind::TooLarge { .. } | RefusalKind::TimedOut)
    }
}

/// Who may not use the listener ([`Access`]): a web browser's request for another site's page
/// ([`RefusalKind::CrossOrigin`]), a request without the token ([`RefusalKind::Unauthorized`]).
fn access_refusal(access: &Access, request: &Request) -> Option<Refusal> {
    if access.refuse_cross_origin
        && let Some(why) = browser_request_refused(request.headers())
    {
        return Some(Refusal::new(
            RefusalKind::CrossOrigin,
            format!(
                "{why}: zkq's API is for the application in its pod, not for web pages \
                 (api.refuse_cross_origin)"
            ),
        ));
    }
    if let Some(TokenCheck { token, exempt }) = &access.token
        && !exempt(request.uri().path())
    {
        let refusal = match request.headers().get(API_TOKEN_HEADER) {
            None => Some("the request has no zkq-api-token header; zkq requires the token of api.token_file"),
            Some(given) if !same_secret(given.as_bytes(), token.expose().as_bytes()) => {
                Some("the zkq-api-token header does not match the token of api.token_file")
            },
            Some(_) => None,
        };
        if let Some(message) = refusal {
            return Some(Refusal::new(RefusalKind::Unauthorized, message));
        }
    }
    None
}

/// Compares in constant time, so the time taken does not tell how much of a guess was right.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    subtle::ConstantTimeEq::ct_eq(given, expected).into()
}

/// Why a request that a web browser sent must be refused, if it must. Browsers mark their
/// requests with `Sec-Fetch-Site` and (for most cross-origin ones) `Origin`; other HTTP clients
/// send neither. Allowed from a browser: a page zkq served itself (`/docs`) or a URL typed in,
/// with the host given as an address or `localhost` (a name would allow DNS rebinding: a page
/// whose own name resolves to 127.0.0.1).
fn browser_request_refused(headers: &HeaderMap) -> Option<String> {
    use axum::http::header::{HOST, ORIGIN};
    let site = headers.get("sec-fetch-site").map(|v| v.to_str().unwrap_or("?").to_ascii_lowercase());
    let origin = headers.get(ORIGIN).map(|v| v.to_str().unwrap_or("?").to_owned());
    if site.is_none() && origin.is_none() {
        return None;
    }
    if let Some(site) = site.as_deref()
        && (site == "cross-site" || site == "same-site")
    {
        return Some(format!("a web browser sent this request for a page of another site (Sec-Fetch-Site: {site})"));
    }
    let host = headers.get(HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    if let Some(origin) = origin
        && origin != format!("http://{host}")
    {
        return Some(format!("a web browser sent this request for the page of another origin (Origin: {origin})"));
    }
    let name = host.rsplit_once(':').map_or(
        host,
        |(name, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) { name } else { host }
        },
    );
    let literal = name.eq_ignore_ascii_case("localhost")
        || name.parse::<std::net::IpAddr>().is_ok()
        || name.trim_start_matches('[').trim_end_matches(']').parse::<std::net::Ipv6Addr>().is_ok();
    if !literal {
        return Some(format!("a web browser sent this request to the host name `{name}` (use 127.0.0.1 or localhost)"));
    }
    None
}

/// How a listener writes its [`Refusal`]s: each front has its own.
pub(crate) trait Dialect: Send + Sync {
    /// What an answer needs of one request, read from its head before anything else (the SQS
    /// listener's: the request's protocol and action).
    fn asked(&self, headers: &HeaderMap, uri: &Uri) -> Box<dyn Answer>;
}

/// A refusal's answer in a listener's dialect, for one request.
pub(crate) trait Answer: Send + Sync {
    /// Whether the request is a batch by what its head says (the SQS listener's
    /// `SendMessageBatch`); the guard's batch route is one too.
    fn is_batch(&self) -> bool {
        false
    }
    /// `refusal` as the dialect answers it.
    fn refused(&self, request_id: &str, refusal: Refusal) -> Response;
}

/// What [`guard_request`] checks on one listener: the API sheds load and refuses declared
/// oversize bodies; the admin listener only counts its requests.
#[derive(Clone)]
pub(crate) struct Guard {
    pub(crate) metrics: Arc<Metrics>,
    /// `api.max_concurrent_requests` permits (long-polls included).
    pub(crate) in_flight: Option<Arc<tokio::sync::Semaphore>>,
    pub(crate) body_limits: Option<BodyLimits>,
    /// The route template of the listener's batch put, whose body is judged by the batch limit.
    pub(crate) batch_route: Option<&'static str>,
    /// Who may use the listener ([`access_refusal`]).
    pub(crate) access: Access,
    /// How its refusals are written.
    pub(crate) dialect: Arc<dyn Dialect>,
}

/// What the API accepts of a request body: its size, and the time it may take to arrive.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLimits {
    /// `api.max_message_bytes`: every route but the batch put.
    pub(crate) message: usize,
    /// A batch put: `api.max_batch_bytes` of bodies in base64 (4/3), and up to 1 KiB of JSON and
    /// kind fields per message.
    pub(crate) batch: usize,
    /// `api.body_read_timeout`: the whole body arrives within this of the request's headers.
    pub(crate) read_timeout: Duration,
}

impl BodyLimits {
    pub(crate) fn of(config: &Config) -> BodyLimits {
        let api = &config.api;
        let batch =
            api.max_batch_bytes.div_ceil(3).saturating_mul(4).saturating_add(api.max_batch.saturating_mul(1024));
        BodyLimits { message: api.max_message_bytes, batch, read_timeout: api.body_read_timeout }
    }
}

/// 503 `overloaded` (in the native dialect) at once when `api.max_concurrent_requests` requests are already being handled
/// (shedding keeps memory bounded and answers fast instead of queueing); 413 at once for a body
/// declared (`Content-Length`) larger than the limit, before anything reads it (hyper sends
/// `100 Continue` only when the body is first read, so a client that sent
/// `Expect: 100-continue` is told to stop instead of being asked to upload the body).
/// Each is a [`Refusal`], which the listener writes in its dialect; `batch_by_head` says the
/// request is a batch by its head (SQS's `SendMessageBatch`).
fn refusal(
    guard: &Guard,
    route: &str,
    request: &Request,
    batch_by_head: bool,
) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, Refusal> {
    let batch_route = guard.batch_route == Some(route);
    let is_batch = batch_by_head || batch_route;
    if let Some(refused) = access_refusal(&guard.access, request) {
        return Err(Refusal { batch: is_batch, ..refused });
    }
    if let Some(limits) = guard.body_limits {
        let (limit, key) = if batch_route {
            (limits.batch, "api.max_batch_bytes, as base64 in JSON")
        } else {
            (limits.message, "api.max_message_bytes")
        };
        let declared = request
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|len| len > u64::try_from(limit).unwrap_or(u64::MAX)) {
            return Err(Refusal {
                batch: is_batch,
                ..Refusal::new(
                    RefusalKind::TooLarge { limit },
                    format!("the body is larger than {limit} bytes ({key})"),
                )
            });
        }
    }
    match &guard.in_flight {
        Some(in_flight) => match in_flight.clone().try_acquire_owned() {
            Ok(permit) => Ok(Some(permit)),
            Err(_) => Err(Refusal {
                batch: is_batch,
                ..Refusal::new(
                    RefusalKind::Overloaded,
                    "zkq is handling api.max_concurrent_requests requests already; retry after the Retry-After delay",
                )
            }),
        },
        None => Ok(None),
    }
}

/// The `method` label: the standard methods, and `other` for any other token a client sends
/// (a method is free text in HTTP: as a label it would grow the series without bound).
fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "other",
    }
}

/// `status` label of a request whose client left before it was answered (nginx's "client closed
/// request"). Work the request already started still finishes: every write runs on a background
/// task, not on the request's future.
const ABANDONED_STATUS: &str = "499";

/// Counts a request as abandoned when it is dropped before it was answered.
struct Abandoned<'a> {
    metrics: &'a Metrics,
    route: &'a str,
    method: &'static str,
    request_id: &'a str,
    answered: bool,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        self.metrics.http_requests.with_label_values(&[self.route, self.method, ABANDONED_STATUS]).inc();
        tracing::debug!(request = %self.request_id, method = %self.method, route = %self.route,
            "the client left before the answer");
    }
}

/// Counts and times every request by route template (never the raw path: bounded labels), and
/// answers the [`refusal`]s before the handler runs. One middleware for all of it: each
/// middleware boxes the rest of the stack's future, and a waiting long-poll holds every box.
pub(crate) async fn guard_request(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    let route =
        request.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = method_label(request.method());
    let started = Instant::now();
    // Set (kept or made) by the request-id layer; every log line of the request carries it.
    let request_id = request.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let span = tracing::info_span!("request", id = %request_id, %method, %route);
    let metrics = &guard.metrics;
    // Counted as 499 if the client gives up before the answer (hyper then drops this future).
    let mut abandoned = Abandoned { metrics, route: &route, method, request_id: &request_id, answered: false };
    // What an answer of the guard's needs of the request (an SQS one: its protocol, its action).
    let asked = guard.dialect.asked(request.headers(), request.uri());
    let response = match refusal(&guard, &route, &request, asked.is_batch()) {
        Ok(permit) => {
            let request = match guard.body_limits {
                Some(limits) => request.map(|body| DeadlineBody::wrap(body, limits.read_timeout)),
                None => request,
            };
            let mut response = next.run(request).instrument(span).await;
            drop(permit);
            // A handler that panicked: the panic guard said why, and the answer is the dialect's.
            match response.extensions_mut().remove::<Refusal>() {
                Some(refused) => asked.refused(&request_id, refused),
                None => response,
            }
        },
        Err(refused) => {
            let mut response = asked.refused(&request_id, refused);
            // Refused before anything read the body.
            if !http_body::Body::is_end_stream(request.body()) {
                closes_connection(&mut response);
            }
            response
        },
    };
    abandoned.answered = true;
    let status = response.status();
    metrics.http_requests.with_label_values(&[&route, method, status.as_str()]).inc();
    metrics.http_request_duration.with_label_values(&[&route, method]).observe(started.elapsed().as_secs_f64());
    if status == StatusCode::INTERNAL_SERVER_ERROR {
        tracing::error!(request = %request_id, %method, %route, status = status.as_u16(), "request failed");
    } else {
        tracing::debug!(request = %request_id, %method, %route, status = status.as_u16(), "request served");
    }
    response
}
