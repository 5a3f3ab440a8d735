//! The secrets the configuration names by file: read once, before anything starts.

use std::path::Path;

use super::error::ConfigError;
use super::{Config, Secret};

/// The secrets zkq reads from files: the SASL password and the API token. `Debug` shows neither.
#[derive(Debug, Clone, Default)]
pub struct FileSecrets {
    pub sasl_password: Option<Secret>,
    pub api_token: Option<Secret>,
    /// `sqs.access_key_id` with the secret of `sqs.secret_access_key_file`.
    pub sqs_key_pair: Option<SqsKeyPair>,
}

/// The one key pair SQS requests must be signed with. `Debug` shows the key id only.
#[derive(Debug, Clone)]
pub struct SqsKeyPair {
    pub access_key_id: String,
    pub secret: Secret,
}

/// Reads and checks `zookeeper.sasl.password_file`, `api.token_file` and
/// `sqs.secret_access_key_file` (or takes the password
/// given inline). A file that is missing, unreadable, not UTF-8 or empty, or a token that cannot
/// be a header value, is a configuration error.
pub fn read_secret_files(config: &Config) -> Result<FileSecrets, ConfigError> {
    let zk = &config.zookeeper;
    let sasl_password = match (&zk.sasl.password, &zk.sasl.password_file) {
        (Some(password), _) => Some(password.clone()),
        (None, Some(path)) => Some(read_secret_file("zookeeper.sasl.password_file", path)?),
        (None, None) => None,
    };
    let api_token = match &config.api.token_file {
        Some(path) => {
            let token = read_secret_file("api.token_file", path)?;
            if !token.expose().bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ConfigError {
                    key: "api.token_file".to_owned(),
                    value: format!("{path:?}"),
                    allowed: "the token must be printable ASCII without spaces (it travels in a header)".to_owned(),
                });
            }
            Some(token)
        },
        None => None,
    };
    let sqs_key_pair = match (&config.sqs.access_key_id, &config.sqs.secret_access_key_file) {
        (Some(access_key_id), Some(path)) => Some(SqsKeyPair {
            access_key_id: access_key_id.clone(),
            secret: read_secret_file("sqs.secret_access_key_file", path)?,
        }),
        _ => None,
    };
    Ok(FileSecrets { sasl_password, api_token, sqs_key_pair })
}

/// A file holding one secret; line breaks at its end are not part of it.
fn read_secret_file(key: &str, path: &Path) -> Result<Secret, ConfigError> {
    let error = |allowed: String| ConfigError { key: key.to_owned(), value: format!("{path:?}"), allowed };
    let bytes = std::fs::read(path).map_err(|err| error(format!("cannot read the file: {err}")))?;
    let text = String::from_utf8(bytes).map_err(|_| error("the file is not UTF-8 text".to_owned()))?;
    let secret = text.trim_end_matches(['\r', '\n']);
    if secret.is_empty() {
        return Err(error("the file is empty".to_owned()));
    }
    Ok(Secret::new(secret))
}
