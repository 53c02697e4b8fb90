//! The `sendonce` binary: parse configuration, set up logging, run a command.
//! Failures are printed with their whole cause chain, on one line, a
//! cause that repeats what the line says left out (`commands::one_line`).

use std::process::ExitCode;

use anyhow::Context;
use sendonce::commands;
use sendonce::config::{Cli, Command, Settings};

fn main() -> ExitCode {
    let cli = Cli::parse_args();
    if let Err(e) = sendonce::failpoint::check_configuration() {
        eprintln!("sendonce: {e}");
        return ExitCode::from(2);
    }
    let settings = match Settings::from_args(&cli.config) {
        Ok(s) => s,
        Err(e) => {
            // Log setup needs the settings; this line goes straight to stderr.
            eprintln!("sendonce: {}", commands::one_line(&anyhow::Error::new(e)));
            return ExitCode::from(2);
        }
    };
    sendonce::telemetry::init(settings.log.format);
    sendonce::install_crypto_provider();
    match run(cli.command.unwrap_or(Command::Serve), settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sendonce: {}", commands::one_line(&e));
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command, settings: Settings) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        match command {
            Command::Serve => commands::serve(settings).await,
            Command::Migrate => commands::migrate(&settings).await,
            Command::Tenant { command } => commands::tenant(&settings, &command).await,
            Command::Key { command } => commands::key(&settings, &command).await,
            Command::Receipts { command } => commands::receipts(&settings, &command).await,
            Command::Outbox {
                tenant,
                limit,
                follow,
            } => commands::outbox(&settings, tenant.as_deref(), limit, follow).await,
        }
    })
}
