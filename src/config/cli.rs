//! The command line: subcommands, and every setting as a flag with its
//! environment variable. Values are kept as written (no defaults here: those
//! live in `Settings::default()`); `Settings::from_args` parses and checks them.

use clap::{Arg, ArgAction, ArgMatches, Args, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::provider::registry::Vars;

#[derive(Debug, Parser)]
#[command(
    name = "sendonce",
    version,
    about = "Exactly-once SMS/OTP sending over HTTP"
)]
pub struct Cli {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
}

impl Cli {
    /// The command line as parsed: [`Cli::command_line`]'s, so each
    /// subcommand's help shows its own flags.
    pub fn parse_args() -> Self {
        let matches = Self::command_line().get_matches();
        Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }

    /// The command with the server's settings (global flags, taken by
    /// every subcommand) shown in the help of `sendonce` and `sendonce
    /// serve` only: `sendonce tenant --help` lists the tenant commands' own
    /// flags. They are still taken everywhere (`sendonce tenant list
    /// --database-url …`).
    pub fn command_line() -> clap::Command {
        let total = ConfigArgs::augment_args(clap::Command::new("count"))
            .get_arguments()
            .count();
        let summary = format!(
            "The server's settings ({total} flags, each also an environment variable) are listed by \
             `sendonce --help`, grouped: {}. docs/configuration.md describes each.",
            HEADINGS.join(", ")
        );
        // `-h` shows the few settings most runs start with; `--help` all,
        // under their headings.
        let mut cmd = <Self as clap::CommandFactory>::command()
            .mut_args(|a| {
                let id = a.get_id().as_str();
                if a.is_global_set() && !SHORT_HELP.contains(&id) {
                    a.hide_short_help(true)
                } else {
                    a
                }
            })
            .after_help(summary.clone())
            .after_long_help(LONG_HELP_END)
            .mut_subcommand("serve", |serve| {
                serve.after_help(summary).after_long_help(LONG_HELP_END)
            });
        // Propagates the global flags into every subcommand, so they can be
        // hidden there; a built command is not built again.
        cmd.build();
        let names: Vec<String> = cmd
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .filter(|n| n != "serve")
            .collect();
        names
            .iter()
            .fold(cmd, |cmd, name| cmd.mut_subcommand(name, hide_globals))
    }
}

/// The headings of the server's settings in `sendonce --help`, in order;
/// each adapter's variables follow [`PROVIDERS`], under
/// [`HELP_HEADINGS`](crate::provider::HELP_HEADINGS).
pub const DATABASE: &str = "Database";
pub const SERVER: &str = "Server";
pub const PROVIDERS: &str = "Providers and routes";
pub const DELIVERY: &str = "Delivery and retries";
pub const CACHES: &str = "Caches";
pub const LIMITS: &str = "Limits";
pub const RETENTION: &str = "Retention";
pub const LOGGING: &str = "Logging";
pub const VERIFICATIONS: &str = "Verifications (one-time codes)";
pub const WEBHOOKS: &str = "Webhooks";
const HEADINGS: &[&str] = &[
    DATABASE,
    SERVER,
    PROVIDERS,
    "each provider's variables",
    DELIVERY,
    CACHES,
    LIMITS,
    RETENTION,
    LOGGING,
    VERIFICATIONS,
    WEBHOOKS,
];

/// The settings `sendonce -h` shows (by argument id); the others are in
/// `sendonce --help` only.
pub const SHORT_HELP: &[&str] = &["database_url", "listen", "provider", "routes", "public_url"];

const LONG_HELP_END: &str = "Every setting is also read from its environment variable (shown in \
    [env: ...]); a flag wins. docs/configuration.md describes each, with its default.";

/// `cmd` and its subcommands with the global flags hidden from their help.
fn hide_globals(cmd: clap::Command) -> clap::Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    let cmd = cmd.mut_args(|a| if a.is_global_set() { a.hide(true) } else { a });
    names
        .iter()
        .fold(cmd, |cmd, name| cmd.mut_subcommand(name, hide_globals))
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the API (the default). Applies pending migrations first.
    Serve,
    /// Apply pending migrations and exit.
    Migrate,
    /// Manage tenants.
    Tenant {
        #[command(subcommand)]
        command: TenantCommand,
    },
    /// Manage API keys.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
    /// Inspect delivery receipts.
    Receipts {
        #[command(subcommand)]
        command: ReceiptsCommand,
    },
    /// What the simulated provider would have sent, codes included.
    ///
    /// Oldest first, one a line: sent at, tenant, to, message id, idempotency key,
    /// provider message id, body (tab-separated; a line break in a body is
    /// written `\n`). Only while every configured provider is `simulated`:
    /// with a real one it shows nothing.
    Outbox {
        /// Only this tenant's messages.
        #[arg(long)]
        tenant: Option<String>,
        /// How many of the newest to show first.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Keep printing what is sent from now on, until interrupted.
        #[arg(long)]
        follow: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ReceiptsCommand {
    /// List receipts that matched no message, newest first: received at,
    /// provider, provider message id, provider status, event id.
    Unmatched {
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Create a tenant and print its new API key as the only line on stdout.
    /// A name is 1 to 64 ASCII letters, digits, `.`, `_` and `-`, starting
    /// with a letter or digit.
    Create { name: String },
    /// List tenants, one a line: id, name, created, quiet hours, senders,
    /// allowed countries, home country (tab-separated).
    List,
    /// Show one tenant's settings.
    Show { name: String },
    /// The country national-format numbers are read in (the API and the
    /// console's search) and whose main zone the console shows times in
    /// (ISO 3166-1 alpha-2, e.g. `US`), or `off`.
    HomeCountry { name: String, country: String },
    /// Disable a tenant: its keys are refused (401 `tenant-disabled`) on
    /// every instance once this returns.
    Disable { name: String },
    /// Enable a disabled tenant again.
    Enable { name: String },
    /// A tenant's spend caps: amounts in the prices file's currency
    /// (`5.00`) per UTC day and month, and messages per UTC day to countries
    /// other than its home country; `off` clears one, one not given stays.
    /// Without an option, prints the caps.
    SpendCaps {
        name: String,
        #[arg(long)]
        daily: Option<String>,
        #[arg(long)]
        monthly: Option<String>,
        #[arg(long)]
        international_daily_messages: Option<String>,
    },
    /// Limit a tenant's destinations to these countries (ISO 3166-1 codes,
    /// e.g. `US CA`); with none, allow every country again.
    AllowCountries {
        name: String,
        countries: Vec<String>,
    },
    /// Quiet hours in the recipient's local time: `21:00-08:00`, or `off`.
    /// A message due inside the window is scheduled for its end (requests
    /// may opt out with `"quiet_hours": false`; verifications never wait).
    QuietHours { name: String, window: String },
    /// The senders (`from`) a tenant may use. Without a list a tenant sends
    /// only from the provider's default sender; tenant `default` accepts any
    /// sender until a list is set.
    Senders {
        name: String,
        #[command(subcommand)]
        command: SendersCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum SendersCommand {
    /// Allow a sender: an E.164 number or an alphanumeric id (1 to 11 characters).
    Add { sender: String },
    /// Disallow a sender (removing the last leaves an empty list: the
    /// provider's default sender only).
    Remove { sender: String },
    /// Print the tenant's senders, one a line (`(no list)` when none was set).
    List,
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Create another API key for a tenant and print it as the only line on
    /// stdout (what was created goes to stderr).
    Create {
        tenant: String,
        /// Comma-separated: send, read, opt-outs, webhooks, admin (default:
        /// all but admin).
        #[arg(long, value_delimiter = ',')]
        scopes: Vec<String>,
        /// A label to recognise the key by in listings and the audit log.
        #[arg(long)]
        label: Option<String>,
        /// A test-mode key (`so_test_`): its messages go to the simulated
        /// provider only, apart from live data (docs/api.md, "Test mode").
        #[arg(long)]
        test: bool,
    },
    /// Revoke an API key by its id (see `key list`); it is refused at once.
    Revoke { key_id: uuid::Uuid },
    /// List API keys (id, tenant, prefix, state, scopes, label, last used),
    /// never the keys themselves.
    List,
}

/// What sits between sendonce and Postgres (`SENDONCE_DATABASE_POOLER`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Pooler {
    /// A direct connection, or a pooler in session mode: a client keeps
    /// its server connection.
    #[default]
    None,
    /// A pooler in transaction mode (PgBouncer `pool_mode = transaction`):
    /// consecutive transactions may run on different server connections,
    /// so nothing that lives in a session goes through it.
    Transaction,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Every setting as given, `None` when not given. Durations come in pairs:
/// the new variable takes `30s`/`10m`/`1h 30m`/`250ms`, the older one with a
/// unit suffix a bare number; setting both is an error.
#[derive(Clone, Debug, Default, Args)]
pub struct ConfigArgs {
    // Database.
    /// postgres://user:password@host/db, or sqlite://path (default: sqlite://sendonce.db, created if missing, in the working directory).
    #[arg(help_heading = DATABASE, long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,
    /// What sits between sendonce and Postgres: none (a direct connection, or a pooler in session mode) or transaction (PgBouncer and the like in transaction mode; needs --database-direct-url).
    #[arg(help_heading = DATABASE, long, env = "SENDONCE_DATABASE_POOLER", global = true, value_enum)]
    pub database_pooler: Option<Pooler>,
    /// A direct postgres:// URL (several hosts allowed) for what needs a session of its own: LISTEN, migrations (advisory lock), change acknowledgements.
    #[arg(
        help_heading = DATABASE,
        long,
        env = "SENDONCE_DATABASE_DIRECT_URL",
        global = true,
        hide_env_values = true
    )]
    pub database_direct_url: Option<String>,
    /// Database connections per instance.
    #[arg(help_heading = DATABASE, long, env = "SENDONCE_DB_MAX_CONNECTIONS", global = true)]
    pub db_max_connections: Option<String>,
    /// How long a request waits for a database connection before answering 503 (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = DATABASE, long, env = "SENDONCE_DB_ACQUIRE_TIMEOUT", global = true)]
    pub db_acquire_timeout: Option<String>,
    /// Older form of --db-acquire-timeout, in ms; setting both is an error.
    #[arg(help_heading = DATABASE, long, env = "SENDONCE_DB_ACQUIRE_TIMEOUT_MS", global = true)]
    pub db_acquire_timeout_ms: Option<String>,
    // Server.
    /// Address to listen on (default 127.0.0.1:8080).
    #[arg(help_heading = SERVER, long, env = "SENDONCE_LISTEN", global = true)]
    pub listen: Option<String>,
    /// Serve GET /metrics on this address instead of on --listen (recommended in production: keep it off the public listener).
    #[arg(help_heading = SERVER, long, env = "SENDONCE_METRICS_LISTEN", global = true)]
    pub metrics_listen: Option<String>,
    /// Most client connections served at once.
    #[arg(help_heading = SERVER, long, env = "SENDONCE_MAX_CONNECTIONS", global = true)]
    pub max_connections: Option<String>,
    /// The whole request head must arrive within this (slow clients are cut off) (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = SERVER, long, env = "SENDONCE_HEADER_READ_TIMEOUT", global = true)]
    pub header_read_timeout: Option<String>,
    /// Older form of --header-read-timeout, in ms; setting both is an error.
    #[arg(help_heading = SERVER, long, env = "SENDONCE_HEADER_READ_TIMEOUT_MS", global = true)]
    pub header_read_timeout_ms: Option<String>,
    /// The whole request body must arrive within this (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = SERVER, long, env = "SENDONCE_BODY_READ_TIMEOUT", global = true)]
    pub body_read_timeout: Option<String>,
    /// Older form of --body-read-timeout, in ms; setting both is an error.
    #[arg(help_heading = SERVER, long, env = "SENDONCE_BODY_READ_TIMEOUT_MS", global = true)]
    pub body_read_timeout_ms: Option<String>,
    /// On SIGTERM, how long in-flight sends may finish before their leases are released (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = SERVER, long, env = "SENDONCE_SHUTDOWN_GRACE", global = true)]
    pub shutdown_grace: Option<String>,
    /// Older form of --shutdown-grace, in seconds; setting both is an error.
    #[arg(help_heading = SERVER, long, env = "SENDONCE_SHUTDOWN_GRACE_SECS", global = true)]
    pub shutdown_grace_secs: Option<String>,
    /// How long POST /messages waits for the outcome by default (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = SERVER, long, env = "SENDONCE_SYNC_WAIT", global = true)]
    pub sync_wait: Option<String>,
    /// Older form of --sync-wait, in ms; setting both is an error.
    #[arg(help_heading = SERVER, long, env = "SENDONCE_SYNC_WAIT_MS", global = true)]
    pub sync_wait_ms: Option<String>,
    /// Largest wait a client may ask for with `Prefer: wait=N` (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = SERVER, long, env = "SENDONCE_MAX_WAIT", global = true)]
    pub max_wait: Option<String>,
    /// Older form of --max-wait, in ms; setting both is an error.
    #[arg(help_heading = SERVER, long, env = "SENDONCE_MAX_WAIT_MS", global = true)]
    pub max_wait_ms: Option<String>,
    /// This service's public base URL (https://sms.example.com): receipt callbacks are built from it and Twilio signatures are checked against it.
    #[arg(help_heading = SERVER, long, env = "SENDONCE_PUBLIC_URL", global = true)]
    pub public_url: Option<String>,
    /// Ensures tenant `default` exists with exactly this API key.
    #[arg(
        help_heading = SERVER,
        long,
        env = "SENDONCE_BOOTSTRAP_API_KEY",
        global = true,
        hide_env_values = true
    )]
    pub bootstrap_api_key: Option<String>,
    // Provider.
    /// SMS providers in order, comma-separated (default simulated): the
    /// first is the primary, the others take over when it certainly did not
    /// send a message.
    #[arg(
        help_heading = PROVIDERS,
        long,
        env = "SENDONCE_PROVIDER",
        global = true,
        value_parser = clap::builder::PossibleValuesParser::new(crate::provider::registry::provider_values()),
        value_delimiter = ','
    )]
    pub provider: Vec<String>,
    /// Routes by destination, replacing --provider: `prefix=provider,provider`
    /// entries separated by `;`, the longest prefix a number starts with
    /// winning, `*` the default (e.g. `+966=infobip,twilio; *=twilio`).
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_ROUTES", global = true)]
    pub routes: Option<String>,
    /// A CSV file of prices per SMS segment (header
    /// `country,provider,price_per_segment,currency`, `*` wildcards, one
    /// currency); unset: every segment USD 0.10.
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_PRICES", global = true)]
    pub prices: Option<String>,
    /// Provider failures in a row that open its circuit (0: never).
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_CIRCUIT_FAILURES", global = true)]
    pub circuit_failures: Option<String>,
    /// A run of failures counts only within this window (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_CIRCUIT_WINDOW", global = true)]
    pub circuit_window: Option<String>,
    /// How long an open circuit stays open before one send probes the provider (a duration).
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_CIRCUIT_OPEN_FOR", global = true)]
    pub circuit_open_for: Option<String>,
    /// How long an instance uses its copy of the shared circuits before reading them again (a duration).
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_CIRCUIT_REFRESH", global = true)]
    pub circuit_refresh: Option<String>,
    /// Routes whose order follows measured quality: on (default; only routes of two or more providers change) or off.
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_ROUTE_QUALITY", global = true)]
    pub route_quality: Option<String>,
    /// Quality is measured over the messages of this window (a duration; 15m).
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_ROUTE_QUALITY_WINDOW", global = true)]
    pub route_quality_window: Option<String>,
    /// A message still without a delivery report this long after it was sent is slow (a duration; 5m).
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_ROUTE_QUALITY_SLOW_AFTER", global = true)]
    pub route_quality_slow_after: Option<String>,
    /// Least time between two changes of a route's order (a duration; 10m).
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_ROUTE_QUALITY_COOLDOWN", global = true)]
    pub route_quality_cooldown: Option<String>,
    /// Messages a provider needs in the window before it is judged (50).
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_ROUTE_QUALITY_MIN_SAMPLES", global = true)]
    pub route_quality_min_samples: Option<String>,
    /// How often quality is measured and orders decided (a duration; 30s, at most 30s).
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_ROUTE_QUALITY_EVERY", global = true)]
    pub route_quality_every: Option<String>,
    /// Share of slow messages that moves a provider down (15%).
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_ROUTE_QUALITY_SLOW_SHARE", global = true)]
    pub route_quality_slow_share: Option<String>,
    /// How far a delivery rate or code conversion may fall below the route's best other provider (10%).
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_ROUTE_QUALITY_GAP", global = true)]
    pub route_quality_gap: Option<String>,
    /// Share of new messages each provider that is not first still starts, to stay measured (5%).
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_ROUTE_QUALITY_FLOOR", global = true)]
    pub route_quality_floor: Option<String>,
    /// With prices: of providers within this share of the best delivery rate, the cheaper per delivered message goes first (off).
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_ROUTE_QUALITY_PREFER_CHEAPER", global = true)]
    pub route_quality_prefer_cheaper: Option<String>,
    /// Each adapter's own variables (`src/provider/`: its `Var`s).
    #[command(flatten)]
    pub adapters: AdapterArgs,
    /// Upper bound of one provider call (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_PROVIDER_TIMEOUT", global = true)]
    pub provider_timeout: Option<String>,
    /// Older form of --provider-timeout, in ms; setting both is an error.
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_PROVIDER_TIMEOUT_MS", global = true)]
    pub provider_timeout_ms: Option<String>,
    /// Upper bound of connecting to the provider (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_PROVIDER_CONNECT_TIMEOUT", global = true)]
    pub provider_connect_timeout: Option<String>,
    /// Older form of --provider-connect-timeout, in ms; setting both is an error.
    #[arg(help_heading = PROVIDERS, long, env = "SENDONCE_PROVIDER_CONNECT_TIMEOUT_MS", global = true)]
    pub provider_connect_timeout_ms: Option<String>,
    // Delivery and retries.
    /// Ceiling of the first retry's delay (full jitter below it) (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = DELIVERY, long, env = "SENDONCE_RETRY_BASE", global = true)]
    pub retry_base: Option<String>,
    /// Older form of --retry-base, in ms; setting both is an error.
    #[arg(help_heading = DELIVERY, long, env = "SENDONCE_RETRY_BASE_MS", global = true)]
    pub retry_base_ms: Option<String>,
    /// Largest delay between two attempts (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = DELIVERY, long, env = "SENDONCE_RETRY_CAP", global = true)]
    pub retry_cap: Option<String>,
    /// Older form of --retry-cap, in ms; setting both is an error.
    #[arg(help_heading = DELIVERY, long, env = "SENDONCE_RETRY_CAP_MS", global = true)]
    pub retry_cap_ms: Option<String>,
    /// Attempts in all, the first included.
    #[arg(help_heading = DELIVERY, long, env = "SENDONCE_RETRY_MAX_ATTEMPTS", global = true)]
    pub retry_max_attempts: Option<String>,
    /// No attempt starts later than this after a message was accepted (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = DELIVERY, long, env = "SENDONCE_RETRY_DEADLINE", global = true)]
    pub retry_deadline: Option<String>,
    /// Older form of --retry-deadline, in seconds; setting both is an error.
    #[arg(help_heading = DELIVERY, long, env = "SENDONCE_RETRY_DEADLINE_SECS", global = true)]
    pub retry_deadline_secs: Option<String>,
    /// Largest provider Retry-After honoured (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = DELIVERY, long, env = "SENDONCE_RETRY_AFTER_MAX", global = true)]
    pub retry_after_max: Option<String>,
    /// Older form of --retry-after-max, in seconds; setting both is an error.
    #[arg(help_heading = DELIVERY, long, env = "SENDONCE_RETRY_AFTER_MAX_SECS", global = true)]
    pub retry_after_max_secs: Option<String>,
    /// Simultaneous provider calls per instance; more wait their turn.
    #[arg(help_heading = DELIVERY, long, env = "SENDONCE_MAX_CONCURRENT_SENDS", global = true)]
    pub max_concurrent_sends: Option<String>,
    /// New sends whose delivery may wait for a provider-call slot; beyond this a new send is refused with 503.
    #[arg(help_heading = DELIVERY, long, env = "SENDONCE_MAX_QUEUED_SENDS", global = true)]
    pub max_queued_sends: Option<String>,
    /// Send slots a tenant alone, or above its fair share, leaves free for other tenants' next sends (default: a sixteenth of the slots; below SENDONCE_MAX_CONCURRENT_SENDS).
    #[arg(help_heading = DELIVERY, long, env = "SENDONCE_SPARE_SEND_SLOTS", global = true)]
    pub spare_send_slots: Option<String>,
    /// Requests per tenant that may wait at once for a message another request is sending; beyond this 409 at once.
    #[arg(help_heading = DELIVERY, long, env = "SENDONCE_MAX_WAITERS_PER_TENANT", global = true)]
    pub max_waiters_per_tenant: Option<String>,
    /// How long a cached API key is trusted while no change notifications arrive (a duration: 30s, 10m, 1h 30m, 250ms; 0 disables).
    #[arg(help_heading = CACHES, long, env = "SENDONCE_KEY_CACHE_TTL", global = true)]
    pub key_cache_ttl: Option<String>,
    /// Final responses kept in memory for replays (0 disables).
    #[arg(help_heading = CACHES, long, env = "SENDONCE_REPLAY_CACHE_ENTRIES", global = true)]
    pub replay_cache_entries: Option<String>,
    /// Lease on a message being delivered (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = DELIVERY, long, env = "SENDONCE_LEASE", global = true)]
    pub lease: Option<String>,
    /// Older form of --lease, in seconds; setting both is an error.
    #[arg(help_heading = DELIVERY, long, env = "SENDONCE_LEASE_SECS", global = true)]
    pub lease_secs: Option<String>,
    /// How often each instance looks for due retries and expired leases (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = DELIVERY, long, env = "SENDONCE_POLL_INTERVAL", global = true)]
    pub poll_interval: Option<String>,
    /// Older form of --poll-interval, in ms; setting both is an error.
    #[arg(help_heading = DELIVERY, long, env = "SENDONCE_POLL_INTERVAL_MS", global = true)]
    pub poll_interval_ms: Option<String>,
    // Limits.
    /// Most SMS segments one message may take.
    #[arg(help_heading = LIMITS, long, env = "SENDONCE_MAX_SEGMENTS", global = true)]
    pub max_segments: Option<String>,
    /// Requests per tenant per second, steady rate: each POST /messages,
    /// batch item, POST /verifications and resend counts (0: no limit).
    #[arg(help_heading = LIMITS, long, env = "SENDONCE_RATE_TENANT_RPS", global = true)]
    pub rate_tenant_rps: Option<String>,
    /// Requests per tenant in a burst (counted as for --rate-tenant-rps).
    #[arg(help_heading = LIMITS, long, env = "SENDONCE_RATE_TENANT_BURST", global = true)]
    pub rate_tenant_burst: Option<String>,
    /// New messages per destination number per hour, per tenant (0: no limit).
    #[arg(help_heading = LIMITS, long, env = "SENDONCE_RATE_NUMBER_PER_HOUR", global = true)]
    pub rate_number_per_hour: Option<String>,
    /// New messages per destination prefix (number less its last 4 digits) per hour, per tenant (0: no limit).
    #[arg(help_heading = LIMITS, long, env = "SENDONCE_RATE_PREFIX_PER_HOUR", global = true)]
    pub rate_prefix_per_hour: Option<String>,
    // Retention.
    /// Messages are kept this long, then purged and their keys free again (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = RETENTION, long, env = "SENDONCE_RETENTION", global = true)]
    pub retention: Option<String>,
    /// Older form of --retention, in days; setting both is an error.
    #[arg(help_heading = RETENTION, long, env = "SENDONCE_RETENTION_DAYS", global = true)]
    pub retention_days: Option<String>,
    /// How often the purge runs (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = RETENTION, long, env = "SENDONCE_PURGE_INTERVAL", global = true)]
    pub purge_interval: Option<String>,
    /// Older form of --purge-interval, in seconds; setting both is an error.
    #[arg(help_heading = RETENTION, long, env = "SENDONCE_PURGE_INTERVAL_SECS", global = true)]
    pub purge_interval_secs: Option<String>,
    // Logging.
    /// Log format (default text).
    #[arg(help_heading = LOGGING, long, env = "SENDONCE_LOG_FORMAT", global = true, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log message bodies (off: bodies may hold one-time codes).
    #[arg(help_heading = LOGGING, long, env = "SENDONCE_LOG_BODIES", global = true)]
    pub log_bodies: bool,
    // Verifications (one-time codes).
    /// Secret the codes are stored under (HMAC) and sealed with; at least 32 characters. Unset: one is generated on first use and kept in the database.
    #[arg(
        help_heading = VERIFICATIONS,
        long,
        env = "SENDONCE_VERIFY_SECRET",
        global = true,
        hide_env_values = true
    )]
    pub verify_secret: Option<String>,
    /// Checks per verification; the last wrong one ends it (max_attempts_reached).
    #[arg(help_heading = VERIFICATIONS, long, env = "SENDONCE_VERIFY_MAX_CHECKS", global = true)]
    pub verify_max_checks: Option<String>,
    /// Least time between two sends of one verification (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = VERIFICATIONS, long, env = "SENDONCE_VERIFY_RESEND_COOLDOWN", global = true)]
    pub verify_resend_cooldown: Option<String>,
    /// Most sends of one verification, the first included.
    #[arg(help_heading = VERIFICATIONS, long, env = "SENDONCE_VERIFY_MAX_SENDS", global = true)]
    pub verify_max_sends: Option<String>,
    /// Pause a destination prefix when fewer than this % of its recent verifications were approved.
    #[arg(
        help_heading = VERIFICATIONS,
        long,
        env = "SENDONCE_VERIFY_PAUSE_MIN_APPROVAL_PERCENT",
        global = true
    )]
    pub verify_pause_min_approval_percent: Option<String>,
    /// Concluded verifications of a prefix needed before its approval rate is judged (0: never pause).
    #[arg(help_heading = VERIFICATIONS, long, env = "SENDONCE_VERIFY_PAUSE_MIN_STARTS", global = true)]
    pub verify_pause_min_starts: Option<String>,
    /// Concluded verifications to a country, across its prefixes, needed before its approval rate is judged (0: never pause a country).
    #[arg(help_heading = VERIFICATIONS, long, env = "SENDONCE_VERIFY_PAUSE_COUNTRY_MIN_STARTS", global = true)]
    pub verify_pause_country_min_starts: Option<String>,
    /// Verifications started per destination prefix per hour, per tenant, counted in the database (0: no limit).
    #[arg(
        help_heading = VERIFICATIONS,
        long,
        env = "SENDONCE_VERIFY_STARTS_PER_PREFIX_PER_HOUR",
        global = true
    )]
    pub verify_starts_per_prefix_per_hour: Option<String>,
    /// The approval rate is judged over verifications started within this (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = VERIFICATIONS, long, env = "SENDONCE_VERIFY_PAUSE_WINDOW", global = true)]
    pub verify_pause_window: Option<String>,
    /// How long an automatic pause of a destination prefix lasts (a duration: 30s, 10m, 1h 30m, 250ms).
    #[arg(help_heading = VERIFICATIONS, long, env = "SENDONCE_VERIFY_PAUSE_DURATION", global = true)]
    pub verify_pause_duration: Option<String>,
    // Webhooks.
    /// Allow webhook endpoints on loopback, private, link-local and metadata addresses, and plain http (tests, local setups).
    #[arg(help_heading = WEBHOOKS, long, env = "SENDONCE_WEBHOOK_ALLOW_PRIVATE", global = true)]
    pub webhook_allow_private: bool,
}

/// The adapters' variables, each a global `--flag` with its environment
/// variable, taken from the registry: an adapter's variables are declared
/// in its own folder.
#[derive(Clone, Debug, Default)]
pub struct AdapterArgs(pub Vars);

impl Args for AdapterArgs {
    /// Each adapter's variables under a heading of its own
    /// ([`HELP_HEADINGS`](crate::provider::HELP_HEADINGS)).
    fn augment_args(cmd: clap::Command) -> clap::Command {
        let adapters = crate::provider::ADAPTERS
            .iter()
            .zip(crate::provider::HELP_HEADINGS);
        adapters.fold(cmd, |cmd, (a, heading)| {
            a.vars.iter().fold(cmd, |cmd, v| {
                cmd.arg(
                    Arg::new(v.env)
                        .long(v.flag)
                        .env(v.env)
                        .help(v.help)
                        .help_heading(*heading)
                        .global(true)
                        .hide_env_values(v.secret)
                        .action(ArgAction::Set),
                )
            })
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for AdapterArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut vars = Vars::default();
        for v in Vars::known() {
            let value = m
                .try_get_one::<String>(v.env)
                .map_err(|e| clap::Error::raw(clap::error::ErrorKind::ArgumentConflict, e))?;
            if let Some(value) = value {
                vars.set(v.env, value.clone());
            }
        }
        Ok(AdapterArgs(vars))
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}
