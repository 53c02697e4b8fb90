//! Logging setup: human-readable by default, JSON with
//! `SENDONCE_LOG_FORMAT=json`; `RUST_LOG` filters. Logs go to stderr so that
//! stdout carries only what a command prints for scripts. Colours (ANSI
//! escapes) only when stderr is a terminal and `NO_COLOR` is unset: a log
//! written to a file or a pipe is plain text.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Whether text logs are coloured.
pub fn coloured(stderr_is_terminal: bool, no_color: Option<&str>) -> bool {
    stderr_is_terminal && no_color.is_none_or(str::is_empty)
}

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,hyper=warn,reqwest=warn"));
    let no_color = std::env::var("NO_COLOR").ok();
    let ansi = coloured(std::io::stderr().is_terminal(), no_color.as_deref());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    // `try_init`: a second call (tests) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::coloured;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        for (terminal, no_color, want) in [
            (true, None, true),
            (true, Some(""), true),
            (true, Some("1"), false),
            (false, None, false),
            (false, Some("1"), false),
        ] {
            assert_eq!(
                coloured(terminal, no_color),
                want,
                "{terminal} {no_color:?}"
            );
        }
    }
}
