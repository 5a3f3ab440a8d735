//! The app's URLs: `http://host[:port][/path][?query]`, nothing else (no TLS, no credentials).

use std::net::IpAddr;

/// Longest push `url` or `readiness_url` accepted, in bytes.
pub(crate) const MAX_PUSH_URL_LEN: usize = 2048;

/// A checked `http://` URL of the app: where to connect and what to ask for. Parsed once, when
/// the configuration is read; written back as it was written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AppUrl {
    /// The URL as written.
    text: String,
    /// The host as written, without IPv6 brackets (`127.0.0.1`, `::1`, `localhost`).
    pub host: String,
    pub port: u16,
    /// `host:port` as written, for the `Host` header.
    pub authority: String,
    /// The request target: path and query, `/` when the URL has none.
    pub path_and_query: String,
}

impl AppUrl {
    /// Parses and checks a URL; the error says what is allowed.
    pub fn parse(text: &str) -> Result<AppUrl, &'static str> {
        if text.is_empty() {
            return Err("required: the app's endpoint, like http://127.0.0.1:3000/orders");
        }
        if text.len() > MAX_PUSH_URL_LEN {
            return Err("at most 2048 bytes");
        }
        if text.contains('#') {
            return Err("must not have a #fragment");
        }
        let uri: http::Uri = text.parse().map_err(|_| "not a URL; write it like http://127.0.0.1:3000/orders")?;
        if uri.scheme_str() != Some("http") {
            return Err("only http:// URLs (the app is in the same pod; zkq does not speak TLS to it)");
        }
        let Some(authority) = uri.authority() else {
            return Err("needs a host, like http://127.0.0.1:3000/orders");
        };
        if authority.as_str().contains('@') {
            return Err("must not hold credentials (user:password@)");
        }
        let host = authority.host().trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err("needs a host, like http://127.0.0.1:3000/orders");
        }
        // Read the port from the text: `Authority::port` hides one that is not a u16.
        let port = match authority.as_str().strip_prefix(authority.host()).unwrap_or("") {
            "" => 80,
            written => written
                .strip_prefix(':')
                .and_then(|port| port.parse::<u16>().ok())
                .filter(|port| *port != 0)
                .ok_or("the port must be 1 to 65535")?,
        };
        let path_and_query = uri.path_and_query().map_or("/", |p| p.as_str());
        let path_and_query = if path_and_query.is_empty() { "/" } else { path_and_query };
        Ok(AppUrl {
            text: text.to_owned(),
            host: host.to_owned(),
            port,
            authority: authority.as_str().to_owned(),
            path_and_query: path_and_query.to_owned(),
        })
    }

    /// Whether the host is this machine's loopback (so the request never leaves the pod).
    pub fn is_loopback(&self) -> bool {
        self.host.eq_ignore_ascii_case("localhost") || self.host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }
}

impl TryFrom<String> for AppUrl {
    type Error = &'static str;

    fn try_from(text: String) -> Result<AppUrl, &'static str> {
        AppUrl::parse(&text)
    }
}

impl From<AppUrl> for String {
    fn from(url: AppUrl) -> String {
        url.text
    }
}

impl std::fmt::Display for AppUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_urls_are_split_into_what_a_request_needs() {
        let url = AppUrl::parse("http://127.0.0.1:3000/orders?v=2").expect("valid");
        assert_eq!((url.host.as_str(), url.port), ("127.0.0.1", 3000));
        assert_eq!(url.authority, "127.0.0.1:3000");
        assert_eq!(url.path_and_query, "/orders?v=2");
        assert!(url.is_loopback());

        let url = AppUrl::parse("http://[::1]:8081").expect("valid");
        assert_eq!((url.host.as_str(), url.port, url.path_and_query.as_str()), ("::1", 8081, "/"));
        assert_eq!(url.to_string(), "http://[::1]:8081", "printed as written");
        assert!(url.is_loopback());
        let url = AppUrl::parse("http://localhost/in").expect("valid");
        assert_eq!((url.port, url.is_loopback()), (80, true));
        let url = AppUrl::parse("http://app.example:80/x").expect("valid");
        assert!(!url.is_loopback());
        assert!(!AppUrl::parse("http://10.0.0.7/x").expect("valid").is_loopback());
    }

    #[test]
    fn anything_but_plain_http_to_a_host_is_refused() {
        for bad in [
            "",
            "127.0.0.1:3000/orders",
            "https://127.0.0.1/x",
            "ftp://127.0.0.1/x",
            "http:///x",
            "http://user:pw@127.0.0.1/x",
            "http://127.0.0.1/x#frag",
            "http://127.0.0.1:0/x",
            "http://127.0.0.1:99999/x",
            "http://127.0.0.1/a b",
            "/relative",
        ] {
            assert!(AppUrl::parse(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(AppUrl::parse(&format!("http://127.0.0.1/{}", "a".repeat(2100))).is_err());
    }
}
