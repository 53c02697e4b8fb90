//! The `sendonce` binary: parse configuration, set up logging, run a command.

use std::process::ExitCode;

use clap::Parser;
use sendonce::commands;
use sendonce::config::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    sendonce::telemetry::init(cli.config.log_format);
    let config = match cli.config.validate() {
        Ok(c) => c,
        Err(reason) => {
            eprintln!("sendonce: {reason}");
            return ExitCode::from(2);
        }
    };
    sendonce::install_crypto_provider();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sendonce: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command.unwrap_or(Command::Serve) {
            Command::Serve => commands::serve(config).await,
            Command::Migrate => commands::migrate(&config).await,
            Command::Tenant { command } => commands::tenant(&config, &command).await,
            Command::Key { command } => commands::key(&config, &command).await,
            Command::Receipts { command } => commands::receipts(&config, &command).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(reason) => {
            eprintln!("sendonce: {reason}");
            ExitCode::FAILURE
        }
    }
}
