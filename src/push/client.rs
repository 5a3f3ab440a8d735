//! The HTTP/1.1 client that calls the app: one keep-alive connection per worker, opened before a
//! message is leased (so an app that is down costs no delivery), with hyper's own client
//! connection API (the hyper zkq already serves with; no pool, no other crate).

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_TYPE, HOST, HeaderName, HeaderValue, RETRY_AFTER, USER_AGENT};
use http::{Method, Request};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::types::AppUrl;

/// The most of an answer's body zkq reads (enough for Dapr's `{"status": …}`); a longer body
/// is not read, and its connection is not reused.
pub(super) const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Why a call to the app has no answer.
#[derive(Debug, thiserror::Error)]
pub(super) enum CallError {
    #[error("cannot connect to {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("no connection within {0:?}")]
    ConnectTimeout(Duration),
    /// The connection was closed before the request was written: nothing reached the app.
    #[error("the connection closed before the request was sent")]
    NotSent,
    #[error("{0}")]
    Http(#[from] hyper::Error),
}

/// The app's answer: what [`super::answer::judge`] needs.
#[derive(Debug)]
pub(super) struct Answer {
    pub status: u16,
    pub retry_after: Option<String>,
    /// `None` when the body was larger than [`MAX_ANSWER_BYTES`] or broke off.
    pub body: Option<Bytes>,
}

/// Where the app is and how to reach it.
#[derive(Debug, Clone)]
pub(super) struct AppClient {
    url: AppUrl,
    host: HeaderValue,
    connect_timeout: Duration,
    /// Owns the connection tasks (hyper's dispatchers); each ends when its connection closes.
    tasks: TaskTracker,
    /// Shutdown's last step: every connection closes.
    abort: CancellationToken,
}

/// An open connection to the app.
pub(super) struct AppConnection {
    sender: http1::SendRequest<Full<Bytes>>,
    /// False once an answer was not read to its end: the connection cannot carry another request.
    reusable: bool,
}

impl AppClient {
    pub(super) fn new(
        url: AppUrl,
        connect_timeout: Duration,
        tasks: TaskTracker,
        abort: CancellationToken,
    ) -> AppClient {
        let host = HeaderValue::from_str(&url.authority).unwrap_or_else(|_| HeaderValue::from_static("localhost"));
        AppClient { url, host, connect_timeout, tasks, abort }
    }

    pub(super) fn url(&self) -> &AppUrl {
        &self.url
    }

    async fn open(&self) -> Result<TcpStream, CallError> {
        let target = (self.url.host.as_str(), self.url.port);
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(target))
            .await
            .map_err(|_| CallError::ConnectTimeout(self.connect_timeout))?
            .map_err(|err| CallError::Connect(self.url.authority.clone(), err))?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    /// Opens a keep-alive connection.
    pub(super) async fn connect(&self) -> Result<AppConnection, CallError> {
        let stream = self.open().await?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        let abort = self.abort.clone();
        self.tasks.spawn(async move {
            // Ends when the app closes the connection or the worker drops its sender (or at
            // shutdown's last step, should the app hold a request open).
            tokio::select! {
                _ = connection => {},
                _ = abort.cancelled() => {},
            }
        });
        Ok(AppConnection { sender, reusable: true })
    }

    /// A POST of `body` to the app's URL with `headers`.
    pub(super) fn post(&self, headers: Vec<(HeaderName, HeaderValue)>, body: Bytes) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.url.path_and_query.parse().unwrap_or_else(|_| http::Uri::from_static("/"));
        let map = request.headers_mut();
        map.insert(HOST, self.host.clone());
        map.insert(USER_AGENT, HeaderValue::from_static(concat!("zkq/", env!("CARGO_PKG_VERSION"))));
        for (name, value) in headers {
            map.insert(name, value);
        }
        request
    }

    /// One GET of the URL on a connection of its own: true for a 2xx answer within the connect
    /// timeout (the readiness probe).
    pub(super) async fn probe(&self) -> bool {
        let probe = async {
            let mut connection = self.connect().await?;
            let mut request = Request::new(Full::new(Bytes::new()));
            *request.uri_mut() = self.url.path_and_query.parse().unwrap_or_else(|_| http::Uri::from_static("/"));
            request.headers_mut().insert(HOST, self.host.clone());
            request.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
            connection.call(request).await
        };
        matches!(tokio::time::timeout(self.connect_timeout, probe).await, Ok(Ok(answer)) if (200..300).contains(&answer.status))
    }
}

impl AppConnection {
    /// Whether this connection can carry another request.
    pub(super) fn is_usable(&self) -> bool {
        self.reusable && !self.sender.is_closed()
    }

    /// Sends `request` and reads the answer (its body up to [`MAX_ANSWER_BYTES`]).
    /// [`CallError::NotSent`] means the app never saw the request.
    pub(super) async fn call(&mut self, request: Request<Full<Bytes>>) -> Result<Answer, CallError> {
        if self.sender.ready().await.is_err() {
            return Err(CallError::NotSent);
        }
        let response = match self.sender.try_send_request(request).await {
            Ok(response) => response,
            Err(mut err) => {
                if err.take_message().is_some() {
                    return Err(CallError::NotSent);
                }
                return Err(CallError::Http(err.into_error()));
            },
        };
        let status = response.status().as_u16();
        let retry_after = response.headers().get(RETRY_AFTER).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let declared_too_large = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok())
            .is_some_and(|length| length > MAX_ANSWER_BYTES);
        if declared_too_large {
            self.reusable = false;
            return Ok(Answer { status, retry_after, body: None });
        }
        let body = match Limited::new(response.into_body(), MAX_ANSWER_BYTES).collect().await {
            Ok(collected) => Some(collected.to_bytes()),
            Err(_) => {
                self.reusable = false;
                None
            },
        };
        Ok(Answer { status, retry_after, body })
    }
}

/// A header value as the CloudEvents HTTP binding writes it: space, `"`, `%` and everything
/// outside printable ASCII percent-encoded (so any message id or kind field can be sent).
pub(super) fn header_text(text: &str) -> HeaderValue {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_graphic() && byte != b'"' && byte != b'%' {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    HeaderValue::from_str(&encoded).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The `Content-Type` header value of a subscription (validated as printable ASCII).
pub(super) fn content_type(text: &str) -> (HeaderName, HeaderValue) {
    (CONTENT_TYPE, HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_text_percent_encodes_what_the_cloudevents_binding_says() {
        assert_eq!(header_text("queue-0000000042"), "queue-0000000042");
        assert_eq!(header_text("a b\"c%d"), "a%20b%22c%25d");
        assert_eq!(header_text("€"), "%E2%82%AC");
        assert_eq!(header_text("\u{0}\n"), "%00%0A");
    }
}
