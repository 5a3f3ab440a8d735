//! The reference pages the code prints: `zkq reference <page>` writes one as Markdown, and
//! `docs/reference/` holds each as committed. A unit test fails when a committed page drifts from
//! what the code prints, and names the command that rewrites it.

mod config;

/// A reference page the code can print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Page {
    /// Every metric with its type, labels and help text.
    Metrics,
    /// Every error code with its HTTP status and when it is answered.
    Errors,
    /// Every configuration key with its type, default, environment variable, flag and meaning.
    Config,
}

impl Page {
    /// Every page.
    pub const ALL: [Page; 3] = [Page::Metrics, Page::Errors, Page::Config];

    /// The page's name on the command line (`zkq reference NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Page::Metrics => "metrics",
            Page::Errors => "errors",
            Page::Config => "config",
        }
    }

    /// Where the page is committed, relative to the repository.
    pub fn path(self) -> &'static str {
        match self {
            Page::Metrics => "docs/reference/metrics.md",
            Page::Errors => "docs/reference/errors.md",
            Page::Config => "docs/reference/configuration.md",
        }
    }

    /// The page, as Markdown. Fails only on a bug: a metric registered twice, a configuration
    /// type that does not serialize.
    pub fn render(self) -> Result<String, String> {
        match self {
            Page::Metrics => crate::metrics::metrics_markdown().map_err(|err| err.to_string()),
            Page::Errors => Ok(crate::http::error::errors_markdown()),
            Page::Config => config::configuration_markdown().map_err(|err| err.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed pages are what the code prints; `ZKQ_UPDATE_DOCS=1` rewrites them.
    #[test]
    fn committed_reference_pages_are_what_the_code_prints() {
        #[allow(
            clippy::disallowed_methods,
            reason = "a rewrite of the committed pages is asked for in the environment"
        )]
        let update = std::env::var_os("ZKQ_UPDATE_DOCS").is_some();
        for page in Page::ALL {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(page.path());
            let printed = page.render().expect("the page renders");
            if update {
                std::fs::write(&path, &printed).expect("rewrite the reference page");
            }
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                committed == printed,
                "{} differs from what the code prints; run `cargo run -q -- reference {} > {}` \
                 (or `ZKQ_UPDATE_DOCS=1 cargo test --lib reference` for every page) and commit the result",
                page.path(),
                page.name(),
                page.path(),
            );
        }
    }
}
