//! Layering: built-in defaults < TOML file < `ZKQ__SECTION__KEY` environment < flags.

#![allow(clippy::disallowed_methods, reason = "src/config/load.rs owns the environment")]

use std::collections::HashMap;
use std::path::PathBuf;

use super::Config;
use super::error::{ConfigError, from_config_error, invalid};

/// Values given on the command line; each one overrides every other source. This is the one list
/// of flags: `main.rs` flattens it into its parser, and [`Overrides::keys`] names each flag's key.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Overrides {
    /// TOML configuration file.
    #[arg(long = "config", value_name = "PATH", global = true)]
    pub config_file: Option<PathBuf>,
    /// ZooKeeper connect string (zookeeper.connect), e.g. zk1:2181,zk2:2181/chroot.
    #[arg(long, value_name = "HOSTS", global = true)]
    pub zk_connect: Option<String>,
    /// Root path for zkq's own nodes (zookeeper.root).
    #[arg(long, value_name = "PATH", global = true)]
    pub zk_root: Option<String>,
    /// Address of the queue API (api.listen).
    #[arg(long, value_name = "ADDR", global = true)]
    pub api_listen: Option<String>,
    /// Address of /livez, /readyz and /metrics (admin.listen).
    #[arg(long, value_name = "ADDR", global = true)]
    pub admin_listen: Option<String>,
    /// Log format: text or json (log.format).
    #[arg(long, value_name = "FORMAT", global = true)]
    pub log_format: Option<String>,
    /// Log filter, e.g. info or zkq=debug,info (log.level).
    #[arg(long, value_name = "FILTER", global = true)]
    pub log_level: Option<String>,
}

impl Overrides {
    /// Each configuration flag with the key it overrides.
    fn keys(&self) -> [(&'static str, &Option<String>); 6] {
        [
            ("zookeeper.connect", &self.zk_connect),
            ("zookeeper.root", &self.zk_root),
            ("api.listen", &self.api_listen),
            ("admin.listen", &self.admin_listen),
            ("log.format", &self.log_format),
            ("log.level", &self.log_level),
        ]
    }
}

impl Config {
    /// Loads from every source, using the process environment, and validates.
    pub fn load(overrides: &Overrides) -> Result<Config, ConfigError> {
        let env: HashMap<String, String> = std::env::vars().filter(|(k, _)| k.starts_with("ZKQ__")).collect();
        Self::load_with_env(overrides, env)
    }

    /// Loads from every source with an explicit environment (for tests), and validates.
    pub fn load_with_env(overrides: &Overrides, env: HashMap<String, String>) -> Result<Config, ConfigError> {
        let mut builder = config::Config::builder();
        if let Some(path) = &overrides.config_file {
            if !path.is_file() {
                return Err(invalid("--config", path, "no such file; give the path of a TOML file"));
            }
            builder = builder.add_source(config::File::from(path.as_path()).format(config::FileFormat::Toml));
        }
        builder = builder.add_source(
            config::Environment::with_prefix("ZKQ")
                .prefix_separator("__")
                .separator("__")
                .source(Some(env.into_iter().map(|(k, v)| (k.to_ascii_uppercase(), v)).collect())),
        );
        for (key, value) in overrides.keys() {
            if let Some(value) = value {
                builder = builder.set_override(key, value.as_str()).map_err(|e| invalid(key, value, e.to_string()))?;
            }
        }
        let merged = builder.build().map_err(|e| from_config_error(e, None))?;
        let config: Config = merged.clone().try_deserialize().map_err(|e| from_config_error(e, Some(&merged)))?;
        config.validate()?;
        Ok(config)
    }
}
