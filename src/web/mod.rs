//! What the HTTP fronts stand on: the server under every listener, the guard in front of every
//! handler, the body deadline, the names of zkq's headers (a push delivery carries the same ones
//! as a lease answer), and the [`Refusal`] the guard hands each front to write in its own dialect.
//!
//! It knows no front: the native API (`crate::http`) and the SQS API (`crate::sqs`) each give the
//! guard a [`Dialect`] of their own.

#![allow(clippy::disallowed_types, reason = "src/web/ answers the guard's refusals with HTTP statuses")]

pub(crate) mod body;
mod guard;
pub(crate) mod headers;
pub(crate) mod server;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
pub(crate) use guard::{Access, Answer, BodyLimits, Dialect, Guard, Refusal, RefusalKind, TokenCheck};

/// Every layer in one `Router::layer` call: each call wraps every route in a boxed service of its
/// own, and a waiting long-poll holds each box for as long as it waits (see "Memory per
/// connection" in docs/architecture.md). Outermost first: request ids (an incoming `x-request-id`
/// is kept, else one is made; either way it is echoed and every log line of the request carries
/// it), then the [`guard`] (metrics, access, shedding, declared size), then a panic guard whose
/// answer carries a [`Refusal`] that the guard writes in the listener's dialect, then the body
/// limit.
pub(crate) fn with_layers<S>(router: Router<S>, guard: Guard, body_limit: Option<usize>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    use tower_http::request_id::{PropagateRequestIdLayer, SetRequestIdLayer};
    router.layer(
        tower::ServiceBuilder::new()
            .layer(SetRequestIdLayer::x_request_id(NewRequestId))
            .layer(PropagateRequestIdLayer::x_request_id())
            .layer(middleware::from_fn_with_state(guard, guard::guard_request))
            .layer(tower_http::catch_panic::CatchPanicLayer::custom(panic_response))
            .option_layer(body_limit.map(DefaultBodyLimit::max)),
    )
}

/// Marks an answer given with the request's body still unread (`Connection: close`). hyper
/// closes such a connection once it answered, unless the rest of the body is already at hand;
/// without the header a client would send its next request on it and see the connection drop
/// under that request instead of a clear answer.
pub(crate) fn closes_connection(response: &mut Response) {
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
}

/// A new request id: a random UUID (version 4), as tower-http's `MakeRequestUuid` makes, with its
/// random bits from the thread's generator (seeded from the operating system) instead of one
/// `getrandom` system call per request.
#[derive(Debug, Clone, Copy)]
struct NewRequestId;

impl tower_http::request_id::MakeRequestId for NewRequestId {
    fn make_request_id<B>(&mut self, _request: &axum::http::Request<B>) -> Option<tower_http::request_id::RequestId> {
        let id = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
        let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
        let text = id.hyphenated().encode_lower(&mut text);
        HeaderValue::from_str(text).ok().map(tower_http::request_id::RequestId::new)
    }
}

/// A handler panicked: a bare 500 that carries the [`Refusal`], which the guard, outside this
/// layer, writes in the listener's dialect.
fn panic_response(_panic: Box<dyn std::any::Any + Send>) -> Response {
    tracing::error!("a request handler panicked; this is a bug");
    let mut response = StatusCode::INTERNAL_SERVER_ERROR.into_response();
    response.extensions_mut().insert(Refusal::panic());
    response
}

#[cfg(test)]
mod tests {
    use tower_http::request_id::MakeRequestId;

    use super::NewRequestId;

    #[test]
    fn new_request_ids_are_distinct_version_4_uuids() {
        let request = axum::http::Request::new(());
        let ids: Vec<String> = (0..1000)
            .map(|_| {
                let id = NewRequestId.make_request_id(&request).expect("an id");
                id.header_value().to_str().expect("ascii").to_owned()
            })
            .collect();
        for id in &ids {
            let parsed = uuid::Uuid::parse_str(id).expect("a UUID");
            assert_eq!(parsed.get_version(), Some(uuid::Version::Random), "{id}");
            assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122, "{id}");
            assert_eq!(id.len(), 36, "hyphenated: {id}");
        }
        let distinct: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
    }
}
