//! The `polestar` command: parses the command line, sets up logging and calls the library.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use polestar::client;
use polestar::config::{self, Config};
use polestar::log_output::{self, LogOutput};

#[cfg(feature = "demo")]
mod demo;

#[derive(Parser)]
#[command(
    name = "polestar",
    version,
    about = "Serves the current Redis/Valkey primary of Sentinel-managed masters by DNS and HTTP"
)]
struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Human, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon.
    Run {
        #[arg(short, long, default_value = config::DEFAULT_PATH)]
        config: PathBuf,
    },
    /// Validate the configuration: exit 0, or 2 with every problem listed.
    Check {
        #[arg(short, long, default_value = config::DEFAULT_PATH)]
        config: PathBuf,
    },
    /// Show every master: primary, epoch, state, replicas, Sentinels.
    Status {
        #[arg(long, default_value = client::DEFAULT_API)]
        api: String,
    },
    /// Block until MASTER's epoch exceeds EPOCH (default: the current one); print the primary.
    Wait {
        master: String,
        #[arg(long, value_name = "EPOCH")]
        after: Option<u64>,
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        timeout: Duration,
        #[arg(long, default_value = client::DEFAULT_API)]
        api: String,
    },
    /// Planned switchover through the API, lossless: the primary is fenced until the replicas
    /// have all of it, then SENTINEL FAILOVER; with --wait, print the new primary.
    Failover {
        master: String,
        #[arg(long)]
        wait: bool,
        /// How long the fenced primary may wait for its replicas (default 5s).
        #[arg(long, value_name = "DUR", value_parser = parse_duration)]
        max_wait: Option<Duration>,
        /// Refuse up front when the replica is further behind than this (1MB, 512KB, bytes).
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        max_lag: Option<String>,
        #[arg(long, default_value = client::DEFAULT_API)]
        api: String,
        /// The admin token (default: $POLESTAR_ADMIN_TOKEN, else /etc/polestar/admin.token).
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
    },
    /// Make a node safe to stop (run it just before stopping it): a lossless switchover away
    /// from a primary, or a replica out of every replica answer and drained. Prints what was done.
    Handoff {
        /// The node, as ip:port.
        node: String,
        /// Refuse unless the node is one of this master's (a hook that knows its master).
        #[arg(long, value_name = "NAME")]
        master: Option<String>,
        /// How long to wait for what blocks the handoff to clear (another node of the master
        /// still coming back, a failover, a replica catching up), and then, for a primary, for
        /// the new primary to be published.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        wait: Duration,
        /// A primary's switchover: how long it may wait for its replicas (default 5s).
        #[arg(long, value_name = "DUR", value_parser = parse_duration)]
        max_wait: Option<Duration>,
        /// A primary's switchover: refuse when the replica is further behind than this.
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        max_lag: Option<String>,
        #[arg(long, default_value = client::DEFAULT_API)]
        api: String,
        /// The admin token (default: $POLESTAR_ADMIN_TOKEN, else /etc/polestar/admin.token).
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
    },
    /// A real local cluster (3 redis-server, 3 redis-sentinel on loopback) with polestar in
    /// front; Ctrl-C cleans up.
    // Without the `demo` feature: not listed, and says so when asked for (see `demo`).
    #[cfg_attr(not(feature = "demo"), command(hide = true, about = NO_DEMO))]
    Demo,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    config::duration::parse(text)
}

/// Checked here for a clear usage error; sent as written.
fn parse_size(text: &str) -> Result<String, String> {
    config::size::parse(text).map(|_| text.trim().to_string())
}

fn main() -> ExitCode {
    polestar::alloc::configure();
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let code = command(cli.command);
    log_output::flush(Duration::from_secs(1));
    code
}

fn command(command: Command) -> ExitCode {
    match command {
        Command::Check { config } => check(&config),
        Command::Run { config } => run(&config),
        Command::Status { api } => runtime(async move { client::status(&api).await }),
        Command::Wait { master, after, timeout, api } => {
            runtime(async move { client::wait(&api, &master, after, timeout).await })
        }
        Command::Failover { master, wait, max_wait, max_lag, api, token_file } => {
            let limits = client::Limits { max_wait, max_lag };
            match admin_token(token_file) {
                Ok(token) => {
                    runtime(
                        async move { client::failover(&api, &master, wait, token, limits).await },
                    )
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Handoff { node, master, wait, max_wait, max_lag, api, token_file } => {
            let limits = client::Limits { max_wait, max_lag };
            match admin_token(token_file) {
                Ok(token) => runtime(async move {
                    let handoff = client::Handoff { node: &node, master: master.as_deref(), wait };
                    client::handoff(&api, handoff, token, limits).await
                }),
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Demo => demo(),
    }
}

#[cfg(feature = "demo")]
fn demo() -> ExitCode {
    runtime(async {
        let shutdown = CancellationToken::new();
        // For the life of the process: it only cancels `shutdown`.
        tokio::spawn(signals(shutdown.clone()));
        demo::demo(shutdown).await
    })
}

/// What `polestar demo` says in a build without the `demo` feature.
#[cfg(not(feature = "demo"))]
const NO_DEMO: &str = "this polestar was built without the `demo` feature \
    (cargo build --no-default-features): it has no demo; build it with the default features \
    (cargo run --release -- demo) to get one";

#[cfg(not(feature = "demo"))]
fn demo() -> ExitCode {
    report(&format!("error: {NO_DEMO}"));
    ExitCode::from(2)
}

/// The token for POST endpoints: `--token-file`, `$POLESTAR_ADMIN_TOKEN`, or the default file
/// when it is readable (none at all is fine: the server then answers 401/403 itself).
fn admin_token(file: Option<PathBuf>) -> Result<Option<String>, String> {
    if let Some(file) = file {
        return config::read_secret(&file).map(|s| Some(s.expose().to_string()));
    }
    if let Ok(token) = std::env::var("POLESTAR_ADMIN_TOKEN") {
        return Ok(Some(token.trim().to_string()));
    }
    let default = std::path::Path::new("/etc/polestar/admin.token");
    Ok(config::read_secret(default).ok().map(|s| s.expose().to_string()))
}

/// Logs go to stderr through [`LogOutput`]: a log pipe or journald that goes away or stalls
/// costs lines, never a wedged daemon (see `polestar::log_output`).
fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_env("POLESTAR_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,hickory_server=warn"));
    let Ok(out) = LogOutput::stderr() else {
        report("error: cannot start the log writer thread");
        return;
    };
    // Colours only for a terminal (and never with NO_COLOR): a pipe, a file or journald gets
    // plain text.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(out)
        .with_ansi(ansi)
        .log_internal_errors(false);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn check(path: &std::path::Path) -> ExitCode {
    match Config::load(path) {
        Ok(config) => {
            for warning in &config.warnings {
                eprintln!("{}: warning: {warning}", path.display());
            }
            let problems = config.host_problems();
            for problem in &problems {
                eprintln!("{}: {problem}", path.display());
            }
            if !problems.is_empty() {
                return ExitCode::from(2);
            }
            println!("{}: {}", path.display(), config.summary());
            ExitCode::SUCCESS
        }
        Err(e) => {
            for problem in e.problems() {
                eprintln!("{problem}");
            }
            ExitCode::from(2)
        }
    }
}

fn run(path: &std::path::Path) -> ExitCode {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            for problem in e.problems() {
                eprintln!("{problem}");
            }
            return ExitCode::from(2);
        }
    };
    for warning in &config.warnings {
        tracing::warn!("{}: {warning}", path.display());
    }
    runtime(async move {
        let shutdown = CancellationToken::new();
        // For the life of the process: it only cancels `shutdown`.
        tokio::spawn(signals(shutdown.clone()));
        polestar::daemon::run(config, shutdown).await
    })
}

/// Runs `work` on a multi-threaded runtime; an error is printed with its causes, exit 1.
fn runtime(work: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = worker_threads(
        std::env::var_os("TOKIO_WORKER_THREADS").is_some(),
        std::thread::available_parallelism().map_or(1, usize::from),
    ) {
        builder.worker_threads(threads);
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(work);
    rt.shutdown_timeout(Duration::from_secs(2));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report(&format!("error: {e:#}"));
            ExitCode::FAILURE
        }
    }
}

/// At most this many runtime threads by default. polestar's work is a few hundred records a
/// second and the answers to DNS and HTTP clients: at 1,000 masters under 1 % of one core at
/// idle, and a 50-master failover storm with 34 k DNS queries a second took 38 % of one core.
/// Tokio's default, a thread per CPU, gives a 64-core host 64 threads, each with its own stack
/// and its own glibc malloc arena, for no work that needs them: at 1,000 masters 16 workers held
/// 21 MB more than 2 (bench/README.md, "Scale").
const MAX_WORKER_THREADS: usize = 4;

/// The runtime's thread count: one per CPU (as the cgroup's CPU quota allows) up to
/// [`MAX_WORKER_THREADS`]; `None` leaves it to tokio, which then reads `TOKIO_WORKER_THREADS`
/// (`set`): the way to give a host serving very high DNS rates more.
fn worker_threads(set: bool, cpus: usize) -> Option<usize> {
    (!set).then_some(cpus.clamp(1, MAX_WORKER_THREADS))
}

/// A line on stderr that cannot panic (`eprintln!` does when stderr is a closed pipe).
fn report(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{text}");
}

/// SIGTERM and SIGINT stop gracefully; a second one, or [`STOP_DEADLINE`] without the stop
/// completing, exits at once (the demo's cluster is then cleaned by the next lab's start). SIGHUP (reload) is the daemon's own: see
/// `polestar::reload`.
async fn signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("shutting down");
    shutdown.cancel();
    tokio::select! {
        _ = term.recv() => tracing::warn!("second signal: exiting now"),
        _ = int.recv() => tracing::warn!("second signal: exiting now"),
        _ = tokio::time::sleep(STOP_DEADLINE) => {
            tracing::error!("not stopped {STOP_DEADLINE:?} after the signal: exiting now");
        }
    }
    log_output::flush(Duration::from_millis(200));
    std::process::exit(130);
}

/// A graceful stop takes well under a second; past this something is wedged, and the process
/// exits rather than ignore the signal that asked it to stop.
const STOP_DEADLINE: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_threads_are_one_per_cpu_up_to_a_cap_unless_the_operator_sets_them() {
        assert_eq!(worker_threads(false, 1), Some(1));
        assert_eq!(worker_threads(false, 2), Some(2));
        assert_eq!(worker_threads(false, 4), Some(4));
        assert_eq!(worker_threads(false, 64), Some(MAX_WORKER_THREADS));
        assert_eq!(worker_threads(false, 0), Some(1));
        assert_eq!(worker_threads(true, 64), None, "TOKIO_WORKER_THREADS is tokio's to read");
    }
}
