//! The session's settings: the validated configuration with the files it names read (the TLS
//! certificates here, the SASL password and API token by `config::read_secret_files`). `app` and
//! `inspect` both start a session from them.

use crate::config::{Config, ConfigError, FileSecrets, Secret, SqsKeyPair, read_secret_files};

use super::{SaslCredentials, SessionSettings, TlsMaterial, TlsSettings};

/// What zkq reads from files before it starts: the TLS certificates, the SASL password, the
/// API token. `Debug` shows no secret.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    pub tls: Option<(TlsSettings, TlsMaterial)>,
    pub sasl_password: Option<Secret>,
    pub api_token: Option<Secret>,
    pub sqs_key_pair: Option<SqsKeyPair>,
}

/// Reads and checks every file the configuration names. A file that is missing, unreadable or
/// invalid (not PEM, no certificate, a key that does not belong to its certificate, an empty
/// password, a token that cannot be a header value) is a configuration error.
pub fn load_secrets(config: &Config) -> Result<Secrets, ConfigError> {
    let zk = &config.zookeeper;
    let tls = match (&zk.tls.enabled, &zk.tls.ca_file) {
        (true, Some(ca_file)) => {
            let settings = TlsSettings {
                ca_file: ca_file.clone(),
                cert_file: zk.tls.cert_file.clone(),
                key_file: zk.tls.key_file.clone(),
                verify_hostname: zk.tls.verify_hostname,
                reload_interval: zk.tls.reload_interval,
            };
            let material = TlsMaterial::load(&settings).map_err(|err| ConfigError {
                key: err.key.to_owned(),
                value: format!("{:?}", err.path),
                allowed: err.reason,
            })?;
            Some((settings, material))
        },
        _ => None,
    };
    let FileSecrets { sasl_password, api_token, sqs_key_pair } = read_secret_files(config)?;
    Ok(Secrets { tls, sasl_password, api_token, sqs_key_pair })
}

/// The session's settings: the configuration with the secrets read from their files.
pub(crate) fn session_settings(config: &Config, secrets: Secrets) -> SessionSettings {
    SessionSettings {
        connect: config.zookeeper.connect.clone(),
        session_timeout: config.zookeeper.session_timeout,
        request_timeout: config.zookeeper.request_timeout,
        auth_digest: config.zookeeper.auth_digest.clone(),
        sasl: match (&config.zookeeper.sasl.username, secrets.sasl_password) {
            (Some(username), Some(password)) => Some(SaslCredentials { username: username.clone(), password }),
            _ => None,
        },
        tls: secrets.tls,
        acl: config.node_acl(),
        reconnect_backoff_max: config.zookeeper.reconnect_backoff_max,
        jute_maxbuffer: config.zookeeper.jute_maxbuffer,
    }
}
