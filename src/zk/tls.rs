//! TLS to ZooKeeper: the certificate files, checked before zkq starts and read again when they
//! change, and a handshake of zkq's own that says why a connection failed (the client crate
//! only reports that no session came within the timeout).
//!
//! Key material is never logged: errors name the key and the file, never its contents.

use std::io::Read;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use zookeeper_client as zkc;

use crate::types::Secret;

/// Where the TLS files are and how they are used; from `zookeeper.tls`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub ca_file: PathBuf,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub verify_hostname: bool,
    pub reload_interval: Duration,
}

/// A TLS file that cannot be used, named by its configuration key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key} = {}: {reason}", path.display())]
pub struct TlsFileError {
    pub key: &'static str,
    pub path: PathBuf,
    pub reason: String,
}

/// The checked contents of the TLS files.
#[derive(Clone)]
pub struct TlsMaterial {
    ca_pem: String,
    cert_pem: Option<String>,
    key_pem: Option<Secret>,
    /// The same trust and identity as zkq's connections, for [`diagnose`].
    probe: Arc<ClientConfig>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial").field("client_certificate", &self.cert_pem.is_some()).finish_non_exhaustive()
    }
}

impl TlsMaterial {
    /// Reads and checks every file: the CA bundle holds valid certificates, the client certificate
    /// and key parse and belong together.
    pub fn load(settings: &TlsSettings) -> Result<TlsMaterial, TlsFileError> {
        let ca_pem = read_pem("zookeeper.tls.ca_file", &settings.ca_file)?;
        let (roots, crls) = parse_ca(&ca_pem).map_err(|reason| TlsFileError {
            key: "zookeeper.tls.ca_file",
            path: settings.ca_file.clone(),
            reason,
        })?;
        let identity = match (&settings.cert_file, &settings.key_file) {
            (Some(cert_file), Some(key_file)) => {
                let cert_pem = read_pem("zookeeper.tls.cert_file", cert_file)?;
                let key_pem = Secret::new(read_pem("zookeeper.tls.key_file", key_file)?);
                let chain = parse_certs(&cert_pem).map_err(|reason| TlsFileError {
                    key: "zookeeper.tls.cert_file",
                    path: cert_file.clone(),
                    reason,
                })?;
                let key = parse_key(key_pem.expose()).map_err(|reason| TlsFileError {
                    key: "zookeeper.tls.key_file",
                    path: key_file.clone(),
                    reason,
                })?;
                Some((cert_pem, key_pem, chain, key, key_file))
            },
            _ => None,
        };
        let webpki =
            WebPkiServerVerifier::builder(Arc::new(roots)).with_crls(crls).build().map_err(|err| TlsFileError {
                key: "zookeeper.tls.ca_file",
                path: settings.ca_file.clone(),
                reason: format!("cannot be used to verify servers: {err}"),
            })?;
        let verifier: Arc<dyn ServerCertVerifier> =
            if settings.verify_hostname { webpki } else { Arc::new(AnyNameVerifier(webpki)) };
        let builder = ClientConfig::builder().dangerous().with_custom_certificate_verifier(verifier);
        let (probe, cert_pem, key_pem) = match identity {
            Some((cert_pem, key_pem, chain, key, key_file)) => {
                let config = builder.with_client_auth_cert(chain, key).map_err(|err| TlsFileError {
                    key: "zookeeper.tls.key_file",
                    path: key_file.clone(),
                    reason: format!("cannot be used with zookeeper.tls.cert_file: {err}"),
                })?;
                (config, Some(cert_pem), Some(key_pem))
            },
            None => (builder.with_no_client_auth(), None, None),
        };
        let material = TlsMaterial { ca_pem, cert_pem, key_pem, probe: Arc::new(probe) };
        // The client crate parses the same text again; make sure it agrees now rather than at connect time.
        material.certs().map_err(|err| TlsFileError {
            key: "zookeeper.tls.ca_file",
            path: settings.ca_file.clone(),
            reason: format!("refused by the ZooKeeper client: {err}"),
        })?;
        Ok(material)
    }

    /// Whether `other` was read from files with the same contents.
    pub fn same_contents(&self, other: &TlsMaterial) -> bool {
        self.ca_pem == other.ca_pem && self.cert_pem == other.cert_pem && self.key_pem == other.key_pem
    }

    /// The certificates in the client crate's terms.
    pub(super) fn certs(&self) -> Result<zkc::TlsCerts, zkc::Error> {
        let builder = zkc::TlsCerts::builder().with_ca(zkc::TlsCa::from_pem(&self.ca_pem)?);
        let builder = match (&self.cert_pem, &self.key_pem) {
            (Some(cert), Some(key)) => builder.with_identity(zkc::TlsIdentity::from_pem(cert, key.expose())?),
            _ => builder,
        };
        builder.build()
    }
}

fn read_pem(key: &'static str, path: &Path) -> Result<String, TlsFileError> {
    let error = |reason: String| TlsFileError { key, path: path.to_owned(), reason };
    let bytes = std::fs::read(path).map_err(|err| error(format!("cannot read the file: {err}")))?;
    String::from_utf8(bytes).map_err(|_| error("is not a PEM file (not text)".to_owned()))
}

fn parse_ca(pem: &str) -> Result<(RootCertStore, Vec<CertificateRevocationListDer<'static>>), String> {
    let mut roots = RootCertStore::empty();
    let mut crls = Vec::new();
    for item in rustls_pemfile::read_all(&mut pem.as_bytes()) {
        match item.map_err(|err| format!("is not valid PEM: {err}"))? {
            rustls_pemfile::Item::X509Certificate(cert) => {
                let n = roots.len() + 1;
                roots
                    .add(cert)
                    .map_err(|err| format!("certificate {n} is not a usable X.509 CA certificate: {err}"))?;
            },
            rustls_pemfile::Item::Crl(crl) => crls.push(crl),
            _ => {},
        }
    }
    if roots.is_empty() {
        return Err("holds no certificate (expected PEM blocks -----BEGIN CERTIFICATE-----)".to_owned());
    }
    Ok((roots, crls))
}

fn parse_certs(pem: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain = rustls_pemfile::certs(&mut pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| format!("is not valid PEM: {err}"))?;
    let Some(leaf) = chain.first() else {
        return Err("holds no certificate (expected PEM blocks -----BEGIN CERTIFICATE-----)".to_owned());
    };
    rustls::server::ParsedCertificate::try_from(leaf)
        .map_err(|err| format!("the first certificate is not a usable X.509 certificate: {err}"))?;
    Ok(chain)
}

fn parse_key(pem: &str) -> Result<PrivateKeyDer<'static>, String> {
    match rustls_pemfile::private_key(&mut pem.as_bytes()) {
        Ok(Some(key)) => Ok(key),
        Ok(None) => {
            Err("holds no private key (expected -----BEGIN PRIVATE KEY-----, or an RSA or EC private key)".to_owned())
        },
        Err(err) => Err(format!("is not valid PEM: {err}")),
    }
}

/// Verifies the chain like the default verifier but accepts any server name
/// (`zookeeper.tls.verify_hostname = false`), as the client crate does with that setting.
#[derive(Debug)]
struct AnyNameVerifier(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyNameVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // The chain (and revocation) is checked before the name: a name error means the rest passed.
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// How long each step of a diagnostic handshake may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// Servers of the connect string that a diagnosis tries, at most.
const PROBE_HOSTS: usize = 5;

/// After a failed connection: one TLS handshake of zkq's own with each server of `connect`
/// (the first few), with the same trust and identity. Returns what went wrong in words, naming
/// the setting to check; `None` when every handshake succeeded (the problem is not TLS).
pub(super) async fn diagnose(connect: &str, material: &TlsMaterial) -> Option<String> {
    // All at once, so a diagnosis takes one probe's time however many servers do not answer.
    let probes: Vec<_> = connect
        .split('/')
        .next()
        .unwrap_or("")
        .split(',')
        .take(PROBE_HOSTS)
        .map(|host| {
            let (host, config) = (host.to_owned(), material.probe.clone());
            tokio::task::spawn_blocking(move || handshake(&host, config))
        })
        .collect();
    // Every probe is awaited (none outlives the diagnosis); a TLS failure says more than an
    // unreachable server.
    let (mut refused, mut unreachable) = (None, None);
    for probe in probes {
        match probe.await {
            Ok(Err(Failure::Tls(why))) => {
                refused.get_or_insert(why);
            },
            Ok(Err(Failure::Unreachable(why))) => {
                unreachable.get_or_insert(why);
            },
            Ok(Ok(())) | Err(_) => {},
        }
    }
    refused.or(unreachable)
}

enum Failure {
    /// The server answered but the handshake failed.
    Tls(String),
    /// No TCP connection.
    Unreachable(String),
}

fn handshake(host_port: &str, config: Arc<ClientConfig>) -> Result<(), Failure> {
    let (host, _) = host_port.rsplit_once(':').unwrap_or((host_port, ""));
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let unreachable = |why: String| Failure::Unreachable(format!("cannot connect to {host_port}: {why}"));
    let addr = host_port
        .to_socket_addrs()
        .map_err(|err| unreachable(err.to_string()))?
        .next()
        .ok_or_else(|| unreachable("the name resolves to no address".to_owned()))?;
    let mut socket = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).map_err(|err| unreachable(err.to_string()))?;
    socket.set_read_timeout(Some(PROBE_TIMEOUT)).map_err(|err| unreachable(err.to_string()))?;
    socket.set_write_timeout(Some(PROBE_TIMEOUT)).map_err(|err| unreachable(err.to_string()))?;
    let name = ServerName::try_from(host.to_owned())
        .map_err(|_| Failure::Tls(format!("TLS to {host_port}: `{host}` is not a valid server name")))?;
    let mut tls = rustls::ClientConnection::new(config, name)
        .map_err(|err| Failure::Tls(format!("TLS to {host_port} cannot start: {err}")))?;
    let failed = |err: std::io::Error| Failure::Tls(describe(host_port, host, &err));
    while tls.is_handshaking() {
        tls.complete_io(&mut socket).map_err(failed)?;
    }
    // A TLS 1.3 server verifies the client's certificate after the client finished: a refusal
    // arrives as an alert on the first read. Wait briefly for one; silence is success.
    let _ = socket.set_read_timeout(Some(Duration::from_millis(300)));
    let mut stream = rustls::Stream::new(&mut tls, &mut socket);
    let mut buf = [0u8; 1];
    match stream.read(&mut buf) {
        Err(err) if err.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) => Err(failed(err)),
        _ => Ok(()),
    }
}

/// A failed handshake in words, with the setting to check.
fn describe(host_port: &str, host: &str, err: &std::io::Error) -> String {
    let hint = match err.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        )) => format!(
            "the server's certificate does not name `{host}`: use the name it was issued for in \
             zookeeper.connect, or set zookeeper.tls.verify_hostname = false"
        ),
        Some(rustls::Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        )) => "the server's certificate has expired".to_owned(),
        Some(rustls::Error::InvalidCertificate(_)) => {
            "the server's certificate is not trusted: is zookeeper.tls.ca_file the CA that signed it?".to_owned()
        },
        Some(rustls::Error::AlertReceived(_)) => "the server refused the handshake: if it requires client \
                                                   certificates (ssl.clientAuth=need), set zookeeper.tls.cert_file \
                                                   and key_file to a certificate its trust store accepts"
            .to_owned(),
        Some(rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. }) => {
            format!("{host_port} does not speak TLS: is it the server's secureClientPort?")
        },
        _ if matches!(err.kind(), std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset) => {
            format!(
                "the server closed the connection: is {host_port} the server's secureClientPort, and does it accept \
                 zkq's client certificate?"
            )
        },
        _ => "check zookeeper.tls.*".to_owned(),
    };
    format!("TLS handshake with {host_port} failed: {err} ({hint})")
}
