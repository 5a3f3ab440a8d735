//! One typed client of zkq's queue API for every test and benchmark: each call returns an
//! [`Answer`] with what a user of the API sees (status, the `zkq-*` headers, the body, the error
//! code), so a test asserts on those instead of re-parsing responses itself.

use reqwest::Method;

/// What zkq answered to one request.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    pub status: u16,
    /// `zkq-message-id`.
    pub id: String,
    /// `zkq-lease`: the receipt of a lease.
    pub receipt: String,
    /// `zkq-lease-expires-at` (epoch ms) of a lease.
    pub expiry: String,
    /// `zkq-delivery-count`, when the answer carries a message.
    pub deliveries: Option<u32>,
    /// `zkq-fencing-token`, on a lease.
    pub fencing_token: Option<u64>,
    /// Whether the answer carries `Retry-After`.
    pub retry_after: bool,
    /// The error body's `code` (empty below 400).
    pub code: String,
    pub body: Vec<u8>,
}

impl Answer {
    pub async fn of(response: reqwest::Response) -> Answer {
        let status = response.status().as_u16();
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        let (id, receipt, expiry) = (header("zkq-message-id"), header("zkq-lease"), header("zkq-lease-expires-at"));
        let deliveries = header("zkq-delivery-count").parse().ok();
        let fencing_token = header("zkq-fencing-token").parse().ok();
        let retry_after = response.headers().contains_key("retry-after");
        let body = response.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
        let code = if status >= 400 {
            serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| v["code"].as_str().map(str::to_owned))
        } else {
            None
        };
        Answer {
            status,
            id,
            receipt,
            expiry,
            deliveries,
            fencing_token,
            retry_after,
            code: code.unwrap_or_default(),
            body,
        }
    }

    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A client of one zkq's queue API (`http://127.0.0.1:PORT`).
#[derive(Debug, Clone)]
pub struct Api {
    pub http: reqwest::Client,
    pub base: String,
}

impl Api {
    pub fn new(http: reqwest::Client, base: &str) -> Api {
        Api { http, base: base.to_owned() }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Any request; `Err` only when no answer arrived (refused, reset, timed out).
    pub async fn try_send(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Result<Answer, reqwest::Error> {
        let mut request = self.http.request(method, self.url(path));
        if let Some(body) = body {
            request = request.body(body);
        }
        Ok(Answer::of(request.send().await?).await)
    }

    /// Any request; panics when no answer arrived.
    pub async fn send(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Answer {
        let what = format!("{method} {path}");
        self.try_send(method, path, body).await.unwrap_or_else(|e| panic!("{what}: no answer: {e}"))
    }

    /// A JSON request.
    pub async fn send_json(&self, method: Method, path: &str, json: &serde_json::Value) -> Answer {
        let response = self.http.request(method.clone(), self.url(path)).json(json).send().await;
        Answer::of(response.unwrap_or_else(|e| panic!("{method} {path}: no answer: {e}"))).await
    }

    /// `POST /v1/queues/{queue}/messages?{query}`.
    pub async fn put(&self, queue: &str, query: &str, body: &[u8]) -> Answer {
        self.send(Method::POST, &format!("/v1/queues/{queue}/messages?{query}"), Some(body.to_vec())).await
    }

    /// `POST /v1/queues/{queue}/take?{query}` (e.g. `wait=0s`, `max=10`).
    pub async fn take(&self, queue: &str, query: &str) -> Answer {
        self.send(Method::POST, &format!("/v1/queues/{queue}/take?{query}"), None).await
    }

    /// `POST /v1/queues/{queue}/leases?{query}`.
    pub async fn lease(&self, queue: &str, query: &str) -> Answer {
        self.send(Method::POST, &format!("/v1/queues/{queue}/leases?{query}"), None).await
    }

    /// `DELETE /v1/queues/{queue}/leases/{receipt}`: the ack.
    pub async fn ack(&self, queue: &str, receipt: &str) -> Answer {
        self.send(Method::DELETE, &format!("/v1/queues/{queue}/leases/{receipt}"), None).await
    }

    /// `POST /v1/queues/{queue}/leases/{receipt}/nack?{query}`.
    pub async fn nack(&self, queue: &str, receipt: &str, query: &str) -> Answer {
        self.send(Method::POST, &format!("/v1/queues/{queue}/leases/{receipt}/nack?{query}"), None).await
    }

    /// `POST /v1/queues/{queue}/leases/{receipt}/extend?{query}`.
    pub async fn extend(&self, queue: &str, receipt: &str, query: &str) -> Answer {
        self.send(Method::POST, &format!("/v1/queues/{queue}/leases/{receipt}/extend?{query}"), None).await
    }

    /// `POST /v1/queues/{queue}/batch?{query}` with a JSON body.
    pub async fn batch_put(&self, queue: &str, query: &str, json: &serde_json::Value) -> Answer {
        self.send_json(Method::POST, &format!("/v1/queues/{queue}/batch?{query}"), json).await
    }

    /// `POST /v1/queues/{queue}/acks` with `{"leases": [...]}`.
    pub async fn batch_ack(&self, queue: &str, receipts: &[impl AsRef<str>]) -> Answer {
        let receipts: Vec<&str> = receipts.iter().map(AsRef::as_ref).collect();
        self.send_json(Method::POST, &format!("/v1/queues/{queue}/acks"), &serde_json::json!({ "leases": receipts }))
            .await
    }

    /// `GET /v1/queues/{queue}`.
    pub async fn info(&self, queue: &str) -> Answer {
        self.send(Method::GET, &format!("/v1/queues/{queue}"), None).await
    }
}

/// Sends a request with a path exactly as written (no client-side `..`/`%2E` normalisation);
/// returns the status and the JSON body.
pub async fn raw_request(base: &str, method: &str, path: &str) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("read");
    let text = String::from_utf8_lossy(&response);
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(serde_json::Value::Null))
}
