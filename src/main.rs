//! The `zkq` binary: parse the command line, load and validate the configuration, run.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use zkq::config::{Config, EXIT_CONFIG, LogFormat, Overrides};

/// jemalloc rather than glibc's malloc: it returns freed memory to the system after a few seconds
/// (glibc keeps it in per-thread arenas, so a burst of connections left the process at its peak),
/// and it does not touch the pages of a block it hands out (hyper's 8 KiB connection buffers cost
/// only what is written to them). See the memory benchmark in docs/benchmarks.md.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Durable, Curator-compatible ZooKeeper queues over HTTP, as a sidecar.
///
/// Configuration layers, lowest first: built-in defaults, the TOML file given by --config,
/// environment variables ZKQ__SECTION__KEY (e.g. ZKQ__ZOOKEEPER__CONNECT), then these flags.
#[derive(Debug, Parser)]
#[command(name = "zkq", version, about, long_about)]
struct Cli {
    #[command(flatten)]
    overrides: Overrides,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon (the default).
    Run,
    /// Validate the configuration and the files it names (certificates, keys, password and token
    /// files), print the effective values (secrets redacted) and exit.
    CheckConfig {
        /// Do not read the files the configuration names (to check a configuration away from the
        /// pod that mounts them).
        #[arg(long)]
        no_files: bool,
    },
    /// Print the OpenAPI document the API of this configuration's zkq serves (its bounds, such as
    /// api.max_batch, are the configuration's).
    Openapi,
    /// Print a reference page as Markdown (docs/reference/ holds each as committed).
    Reference {
        /// Which page.
        page: zkq::Page,
    },
    /// Exit 0 if this configuration's zkq answers /readyz with 200 (for container health checks).
    Healthcheck,
    /// Show every queue in ZooKeeper (declared, and under {root}/queues): kind, depth, oldest message,
    /// locks and their sessions, redeliveries, child-list size, undecodable nodes. Read-only; exit 1
    /// when ZooKeeper is unreachable or the report is incomplete.
    Inspect(zkq::InspectArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let overrides = cli.overrides.clone();
    // The reference pages need no configuration.
    if let Some(Command::Reference { page }) = &cli.command {
        return match page.render() {
            Ok(markdown) => {
                print!("{markdown}");
                ExitCode::SUCCESS
            },
            Err(err) => {
                eprintln!("zkq: cannot print the {} reference: {err}", page.name());
                ExitCode::FAILURE
            },
        };
    }
    let config = match Config::load(&overrides) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("zkq: {err}");
            return ExitCode::from(u8::try_from(EXIT_CONFIG).unwrap_or(64));
        },
    };
    match cli.command.unwrap_or(Command::Run) {
        Command::CheckConfig { no_files } => {
            if !no_files && let Err(err) = zkq::load_secrets(&config) {
                eprintln!("zkq: {err}");
                return ExitCode::from(u8::try_from(EXIT_CONFIG).unwrap_or(64));
            }
            println!("# configuration is valid; effective values:");
            print!("{}", config.to_redacted_toml());
            for advice in config.max_items_recommendations() {
                println!("# {advice}");
            }
            ExitCode::SUCCESS
        },
        Command::Openapi => {
            print!("{}", zkq::openapi_json(&config));
            ExitCode::SUCCESS
        },
        Command::Reference { .. } => ExitCode::SUCCESS,
        Command::Healthcheck => healthcheck(&config),
        Command::Inspect(args) => ExitCode::from(zkq::run_inspect(&config, &args)),
        Command::Run => run(config),
    }
}

/// GET /readyz on the admin listener (0.0.0.0 is reached through loopback); no shell or curl needed.
fn healthcheck(config: &Config) -> ExitCode {
    use std::io::{Read, Write};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
    use std::time::Duration;

    let mut addr = config.admin.listen;
    if addr.ip().is_unspecified() {
        let loopback = if addr.is_ipv4() { IpAddr::V4(Ipv4Addr::LOCALHOST) } else { IpAddr::V6(Ipv6Addr::LOCALHOST) };
        addr = SocketAddr::new(loopback, addr.port());
    }
    let answer = (|| -> std::io::Result<String> {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(3)))?;
        write!(stream, "GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    })();
    match answer {
        Ok(response) if response.starts_with("HTTP/1.1 200") => ExitCode::SUCCESS,
        Ok(response) => {
            eprintln!("zkq: not ready: {}", response.lines().last().unwrap_or(""));
            ExitCode::FAILURE
        },
        Err(err) => {
            eprintln!("zkq: cannot reach {addr}/readyz: {err}");
            ExitCode::FAILURE
        },
    }
}

fn init_logging(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log.level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match config.log.format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

fn run(config: Config) -> ExitCode {
    // A background thread returns freed pages after jemalloc's decay time (10 s) even when
    // nothing else allocates, so memory comes back once a burst of clients left.
    if let Err(err) = tikv_jemalloc_ctl::background_thread::write(true) {
        eprintln!("zkq: cannot start jemalloc's background thread: {err}");
    }
    init_logging(&config);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("zkq: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        },
    };
    runtime.block_on(async move {
        let running = match zkq::app::start(config).await {
            Ok(running) => running,
            Err(zkq::app::StartError::Config(err)) => {
                eprintln!("zkq: {err}");
                return ExitCode::from(u8::try_from(EXIT_CONFIG).unwrap_or(64));
            },
            Err(err) => {
                tracing::error!(error = %err, "zkq cannot start");
                return ExitCode::FAILURE;
            },
        };
        zkq::on_signals(running.shutdown.clone());
        // Exit 0 on a signal-initiated shutdown, even past the grace period (it is logged).
        running.wait().await;
        ExitCode::SUCCESS
    })
}
