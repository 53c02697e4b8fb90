//! The chaos run: sendonce instances as separate processes on one Postgres,
//! a mock provider that misbehaves at random, a load of unique keys plus
//! duplicates, and instances hit while the load runs: SIGKILLed (and
//! restarted), SIGTERMed (a graceful shutdown, then restarted) or paused
//! (SIGSTOP, then SIGCONT after 0.5 to 2 times the lease, so the lease runs
//! out while the process is frozen, maybe mid-call). With `--clock-step` the
//! database runs under a clock of its own that is stepped forward by more
//! than the lease while calls are in flight (every lease expires at once on
//! the database's clock).
//!
//! The provider counts what it creates. By default the instances use
//! Twilio's API (`SENDONCE_PROVIDER=twilio`) at the mock, which never
//! de-duplicates: every accepted call creates a message, so a message sent
//! twice shows as its (To, Body) created twice (every key has its own body).
//! `--provider http` uses the mock's `/messages` instead, which then
//! de-duplicates as the IETF Idempotency-Key draft says (`MOCK_DEDUP=ietf`):
//! the `http` provider's contract is a bridge that de-duplicates on
//! `Idempotency-Key`, so a mock that does not would count its own missing
//! de-duplication as ours. With `--two-providers` every instance runs
//! `SENDONCE_PROVIDER=twilio,http`, both aimed at the one mock (Twilio's
//! endpoint never de-duplicating, `/messages` as with `--provider http`), so
//! the faults hit both providers, messages fail over and circuits open and
//! close; a phone getting one SMS twice through either or both providers
//! counts as a duplicate.
//!
//! `--infobip` runs every instance with `SENDONCE_PROVIDER=infobip,http`:
//! Infobip's SMS API at the mock first, its idempotency off (as Infobip
//! leaves it unless asked: a repeated `messageId` is a second message), its
//! logs lagging by `--infobip-log-lag-ms` behind every message it creates
//! (Infobip documents no bound), its answers dropped after accepting at
//! `--accept-then-drop`, and each instance's sends queued for
//! `--max-concurrent-sends` slots (4 by default here), so that attempts
//! wait for a slot as in a brownout; `/messages` after it, de-duplicating
//! as with `--provider http`. A phone getting one SMS twice through either
//! or both providers counts as a duplicate; an ambiguous send Infobip's
//! logs never show (a 500 that created nothing) ends `unknown` at the
//! retry deadline, never resent and never moved on.
//!
//! The instances' retry deadline is `--retry-deadline-secs` (30 s; 600 s
//! with `--gateway`): a send whose provider's lookup shows nothing yet is
//! asked again until then (a client retrying its key meanwhile is answered
//! 409), and the run waits for it (at least the deadline and 30 s after the
//! load) before judging anything stuck.
//!
//! `--provider smpp` runs every instance as an SMPP client
//! (`SENDONCE_PROVIDER=smpp`, two binds each) of the npm `smpp` package's
//! server (`testkit/smsc/smsc.js`, the SMPP adapter's test SMSC, started
//! through `scripts/smsc.sh`), which never de-duplicates and reports every
//! `submit_sm` it receives. Messages created are counted there per
//! destination and body: a single-part submit it took (accepted, or held
//! without an answer) is one message, the parts taken under one
//! concatenation reference are one message, and a part taken twice under one
//! reference counts again (every fifth key's body is a three-part UCS-2
//! message, every fifth a two-part GSM-7 one). Faults at the SMSC: throttled
//! (0x58, `--rate-limit`), message queue full (0x14, `--fail-500`), a submit
//! taken and never answered (`--hang`), one taken and its session destroyed
//! without an answer (`--accept-then-drop`; `--accept-then-500` has no SMPP
//! meaning), and every session dropped at once every ~`--smsc-drop-every-ms`.
//! SMPP cannot be asked whether a message was sent, so a message cut off
//! mid-submit ends `unknown`, never resent: each `unknown` key must have a
//! cause the run can show (a submit the SMSC held unanswered, a session that
//! closed within seconds of its submit, an attempt left open by an instance
//! the run hit, or a fault that overlapped its attempt), else the run fails.
//!
//! The mock runs inside this process (testkit's [`MockProvider`], the one
//! the `mock-provider` binary serves), so that at the end the run reads its
//! counts per (To, Body). After the load it waits for every key to be final
//! and checks each key against what the mock created for it: no key created
//! more than once (duplicate), none acknowledged and missing (lost), none
//! left `processing` or `scheduled` (stuck), no false final (`sent` or
//! `delivered` with nothing created, `failed` or `canceled` with a message
//! created). `unknown` with 0 or 1 creations is allowed and counted. It exits
//! non-zero on any of them, and prints the attempts, events and instance log
//! lines of each offending key (and of each `unknown` one).
//!
//! `--gateway` starts verifications instead (`POST /verifications`,
//! channels telegram then sms): the first message through the mock's
//! Telegram Gateway (which makes a message for every accepted send: no
//! de-duplication on `request_id`), then, after `--fallback-after-secs`,
//! one SMS with the same code unless the Gateway reported the message
//! delivered first. The starts are spread over `--spread-secs` (30) so
//! that the faults hit the fallbacks too; the faults above hit the
//! Gateway's sends (429s, 5xx, answers dropped after the message was
//! made); `--gateway-check-failures` (0.8) of the `checkSendAbility`
//! calls fail, so that some sends are still waiting for a retry when
//! their fallback is due; revokes take up to `--gateway-revoke-ms` to be
//! answered; `--gateway-delivered` (0.5) of the Gateway's messages are
//! reported delivered during the load (signed reports posted to the
//! instances, as the Gateway posts them); and `--gateway-cancels` (0.15)
//! of the verifications are canceled at a random moment. At the end every
//! key must have had one verification id (replays included), every phone
//! one code, no Gateway message or SMS created twice, no phone with the
//! code on both channels (a Telegram message delivered at the Gateway and
//! an SMS made), no SMS written after its Telegram message's delivery
//! report was answered 200, nothing sent or written for a verification
//! later than a second after its cancel was answered, every message final
//! with one SMS per undelivered Telegram message, no report answered 200
//! lost, and no false final (a Telegram message `failed` or `canceled`
//! that the Gateway created, an SMS `sent` that the mock never created).
//!
//! `--gateway --channels whatsapp,telegram,sms` puts WhatsApp first (the
//! mock's Cloud API, which makes a message for every accepted send; the
//! faults above answered as Meta's error objects: 130429 for a 429, 131000
//! for a 5xx, accept-then-drop). `--whatsapp-delivered` (0.3),
//! `--whatsapp-read` (0.15) and `--whatsapp-failed` (0.15) of its messages
//! get a signed status notification posted to the instances after a delay
//! of up to 1.5 x `--fallback-after-secs` (so some come after the move on).
//! Checked besides, per phone: one WhatsApp message at most, a message per
//! step as above; no later step (Telegram or SMS) written after a WhatsApp
//! `delivered`/`read` status was answered 200; every status answered 200
//! applied (`delivered`, or `undelivered` for `failed`); no false final of
//! the WhatsApp message. A WhatsApp message cannot be withdrawn and has no
//! lookup, so after its silence the next channel goes (docs/channels.md):
//! the code on WhatsApp and a later channel is counted and printed (WhatsApp
//! delivered with its status after the move, after its failure, after
//! silence or an ambiguous send), not failed. The Telegram-to-SMS rules
//! stay as above (the Gateway can revoke and be asked).
//!
//! `scripts/chaos.sh` builds the binaries and runs it.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use clap::Parser;
use rand::Rng;
use rand::seq::SliceRandom;
use sendonce_bench::db::{Database, create_database, drop_database};
use sendonce_bench::pg::{Cluster, clock_ahead, find_libfaketime};
use sendonce_bench::procs::{self, free_port};
use sendonce_bench::smsc::{self, Smsc, Submit};
use sqlx::{Connection, PgConnection};
use testkit::mock_provider::{Dedup, Faults, MockProvider};
use tokio::process::{Child, Command};
use tokio::sync::{Mutex, Semaphore};

/// The instances' lease (`SENDONCE_LEASE_SECS`): short, so that pauses and
/// clock steps outlast it. The configuration wants at least twice the
/// provider timeout plus 2 s.
const LEASE: Duration = Duration::from_secs(4);
/// The instances' provider timeout (`SENDONCE_PROVIDER_TIMEOUT_MS`).
const PROVIDER_TIMEOUT: Duration = Duration::from_millis(1000);
/// How long a SIGTERMed instance may take to stop before it is SIGKILLed
/// (its grace is 1 s; then it stops its tasks and releases leases).
const TERM_WAIT: Duration = Duration::from_secs(20);
/// What the instances log: warnings, and the delivery's own steps (the
/// lines printed for a key that went wrong).
const INSTANCE_LOG: &str =
    "warn,sendonce::delivery=info,sendonce::app=info,sendonce::shutdown=info";

/// The provider the instances use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ProviderChoice {
    /// Twilio's API at the mock: no de-duplication, ever.
    Twilio,
    /// The mock's `/messages`, de-duplicating as the IETF draft says.
    Http,
    /// SMPP v3.4 to the npm `smpp` package's SMSC: no de-duplication, no
    /// lookup.
    Smpp,
}

#[derive(Parser, Debug)]
#[command(about = "Hit sendonce instances under load and count duplicates, lost and stuck keys")]
struct Args {
    /// Unique idempotency keys to send.
    #[arg(long, default_value_t = 3000)]
    keys: usize,
    /// Extra requests per key with the same key and body (duplicates).
    #[arg(long, default_value_t = 2)]
    duplicates: usize,
    /// sendonce instances.
    #[arg(long, default_value_t = 3)]
    instances: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Mean time between two faults on the instances (a SIGKILL, a SIGTERM
    /// or a pause), in ms (0: none).
    #[arg(long, default_value_t = 800)]
    kill_every_ms: u64,
    /// Share of the faults that are SIGTERMs (a graceful shutdown; the
    /// instance is started again once it has exited).
    #[arg(long, default_value_t = 0.25)]
    sigterm_share: f64,
    /// Share of the faults that are pauses: SIGSTOP, then SIGCONT after a
    /// random 0.5 to 2 times the lease (4 s). The rest of the faults are
    /// SIGKILLs.
    #[arg(long, default_value_t = 0.25)]
    pause_share: f64,
    /// Instances paused at once, at most (never all of them); a pause drawn
    /// beyond it is a SIGKILL or a SIGTERM instead.
    #[arg(long, default_value_t = 1)]
    max_paused: usize,
    /// The provider: `twilio` (Twilio's API at the mock, which never
    /// de-duplicates), `http` (the mock's `/messages`, de-duplicating on
    /// `Idempotency-Key` as the `http` contract requires) or `smpp` (the npm
    /// SMSC, which never de-duplicates and cannot be asked). Ignored with
    /// --two-providers.
    #[arg(long, value_enum, default_value_t = ProviderChoice::Twilio)]
    provider: ProviderChoice,
    /// Restart Postgres once, after the first two faults. The run then
    /// starts a throwaway cluster of its own (initdb and pg_ctl, on a free
    /// port; as root the server runs as user postgres) instead of using
    /// --admin-url, and restarts only that one.
    #[arg(long)]
    restart_postgres: bool,
    /// Run the database under a stepped clock: a throwaway cluster of the
    /// run's own (as --restart-postgres) with Debian's libfaketime preloaded,
    /// its wall clock stepped forward by --clock-step-secs every
    /// --clock-step-every-ms during the load (checked with `SELECT now()`).
    #[arg(long)]
    clock_step: bool,
    /// How far each clock step goes forward, in seconds (more than the
    /// lease, so every lease expires at once on the database's clock).
    #[arg(long, default_value_t = 30)]
    clock_step_secs: u64,
    /// Time between two clock steps (the first comes after half of it).
    #[arg(long, default_value_t = 4000)]
    clock_step_every_ms: u64,
    /// Clock steps at most.
    #[arg(long, default_value_t = 3)]
    clock_steps: usize,
    /// libfaketime.so.1 (default: Debian's, package libfaketime).
    #[arg(long, env = "CHAOS_LIBFAKETIME")]
    libfaketime: Option<PathBuf>,
    /// How long one client request may go on being retried (refused, cut,
    /// timed out, 5xx, 409) before the client gives up on it; a request
    /// given up on fails the run.
    #[arg(long, default_value_t = 60)]
    client_deadline_secs: u64,
    /// How long to wait for every key to be final after the load.
    #[arg(long, default_value_t = 120)]
    settle_secs: u64,
    /// Server for the run's own database (unused with --restart-postgres
    /// or --clock-step).
    #[arg(
        long,
        env = "TEST_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    admin_url: String,
    /// Where `sendonce` and `mock-provider` are (default: next to this
    /// binary; the run serves the mock itself, from the same code).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Injected provider faults (probabilities).
    #[arg(long, default_value_t = 0.05)]
    fail_500: f64,
    #[arg(long, default_value_t = 0.05)]
    rate_limit: f64,
    #[arg(long, default_value_t = 0.01)]
    hang: f64,
    #[arg(long, default_value_t = 0.03)]
    accept_then_drop: f64,
    #[arg(long, default_value_t = 0.02)]
    accept_then_500: f64,
    /// With --provider smpp: mean time between two drops of every session
    /// at the SMSC, in ms (0: none).
    #[arg(long, default_value_t = 3000)]
    smsc_drop_every_ms: u64,
    /// Run every instance with two providers (Twilio first, then http),
    /// both on the mock, with a circuit that opens after 3 failures in a
    /// row and probes after 2 s.
    #[arg(long)]
    two_providers: bool,
    /// Run every instance with Infobip first, then http
    /// (`SENDONCE_PROVIDER=infobip,http`), both on the mock: Infobip's
    /// idempotency off, its logs lagging by --infobip-log-lag-ms, its
    /// answers dropped after accepting at --accept-then-drop, sends queued
    /// for --max-concurrent-sends slots; circuits as with --two-providers.
    #[arg(long)]
    infobip: bool,
    /// With --infobip: how long a message Infobip created stays out of its
    /// logs, in ms.
    #[arg(long, default_value_t = 3000)]
    infobip_log_lag_ms: u64,
    /// Each instance's SENDONCE_MAX_CONCURRENT_SENDS (default: the
    /// service's own, 64; 4 with --infobip).
    #[arg(long)]
    max_concurrent_sends: Option<usize>,
    /// Each instance's SENDONCE_RETRY_DEADLINE, in seconds (default 30;
    /// 600 with --gateway); --clock-step adds its steps to it.
    #[arg(long)]
    retry_deadline_secs: Option<u64>,
    /// The instances' `DATABASE_URL` names these hosts (`h1:p1,h2:p2`, a
    /// highly available cluster, `scripts/ha.sh`) instead of the admin
    /// server alone, with `target_session_attrs=read-write`.
    #[arg(long)]
    hosts: Option<String>,
    /// A shell command run once during the load (a failover, `scripts/ha.sh`);
    /// the run then reports the time from it to the first acknowledged
    /// request sent after it.
    #[arg(long)]
    switch_cmd: Option<String>,
    /// When to run --switch-cmd, in ms after the load starts.
    #[arg(long, default_value_t = 3000)]
    switch_after_ms: u64,
    /// Start verifications instead of sending messages: every key is a
    /// `POST /verifications` with `"channels": ["telegram", "sms"]`, its
    /// first message through the Telegram Gateway at the mock (which sends
    /// no delivery reports), then one SMS with the same code after
    /// --fallback-after-secs. Checked at the end: one verification id per
    /// key, one code per phone, no Gateway message or SMS created twice,
    /// every message final and one SMS per undelivered Telegram message,
    /// no false final.
    #[arg(long)]
    gateway: bool,
    /// Spread the requests evenly over this many seconds, so that the
    /// faults go on for as long (default: 30 with --gateway, whose
    /// fallback SMS go --fallback-after-secs after each start, else 0: as
    /// fast as --concurrency allows).
    #[arg(long)]
    spread_secs: Option<u64>,
    /// With --gateway: each start's `fallback_after_seconds`.
    #[arg(long, default_value_t = 5)]
    fallback_after_secs: u64,
    /// With --gateway: each start's `ttl_seconds`. A message whose
    /// outcome the provider cannot tell yet (an ambiguous send that the
    /// Gateway's `checkVerificationStatus` or Twilio's message list does
    /// not show) is asked again until its verification's validity ends,
    /// then ends `unknown`: the settling waits for every verification's
    /// expiry (plus --settle-secs' slack), so the default is short.
    #[arg(long, default_value_t = 60)]
    ttl_secs: u64,
    /// With --gateway: the share of `checkSendAbility` calls the Gateway
    /// answers 500, so that some Telegram sends are still being checked
    /// (no request id, never sent) when their fallback is due: those must
    /// end `canceled` with their one SMS, and never reach the Gateway.
    #[arg(long, default_value_t = 0.8)]
    gateway_check_failures: f64,
    /// With --gateway: the share of Gateway messages the Gateway reports
    /// `delivered` during the load (a signed report posted to a random
    /// instance until one answers 200): those verifications need no SMS,
    /// unless the report came after the fallback; every report answered
    /// 200 must show as `delivered`.
    #[arg(long, default_value_t = 0.5)]
    gateway_delivered: f64,
    /// With --gateway: how long the Gateway takes to act on a revoke (up
    /// to this, drawn per call), so that reports of delivery arrive while
    /// a fallback is revoking.
    #[arg(long, default_value_t = 1000)]
    gateway_revoke_ms: u64,
    /// With --gateway: the share of verifications canceled at a random
    /// moment of their first --fallback-after-secs + 2 s (retried until
    /// answered): nothing of theirs may be sent after the cancel was
    /// answered.
    #[arg(long, default_value_t = 0.15)]
    gateway_cancels: f64,
    /// With --gateway: the verifications' channels, in order:
    /// `telegram,sms` (the default) or `whatsapp,telegram,sms` (WhatsApp
    /// first, through the mock's Cloud API, which makes a message for every
    /// accepted send and answers the faults above as Meta's error objects:
    /// 130429 for a 429, 131000 for a 5xx; its status notifications come
    /// from --whatsapp-delivered, --whatsapp-read and --whatsapp-failed).
    #[arg(long, default_value = "telegram,sms")]
    channels: String,
    /// With --channels whatsapp,...: the share of WhatsApp messages
    /// reported `delivered` (a signed notification, `sent` then
    /// `delivered`, posted to a random instance until one answers 200),
    /// after a delay drawn up to 1.5 x --fallback-after-secs, so that some
    /// come after the move to Telegram (a WhatsApp message cannot be
    /// withdrawn: the code may then reach two channels, as documented).
    #[arg(long, default_value_t = 0.3)]
    whatsapp_delivered: f64,
    /// With --channels whatsapp,...: the share reported `read` (`sent`,
    /// `delivered`, `read`), as --whatsapp-delivered.
    #[arg(long, default_value_t = 0.15)]
    whatsapp_read: f64,
    /// With --channels whatsapp,...: the share reported `failed` (error
    /// 131026): the next channel goes at once, and the code may be on both.
    #[arg(long, default_value_t = 0.15)]
    whatsapp_failed: f64,
}

impl Args {
    /// With --gateway: whether WhatsApp is the verifications' first channel.
    fn whatsapp(&self) -> bool {
        self.gateway && self.channels.starts_with("whatsapp")
    }

    /// With --gateway: the verifications' channels, in order.
    fn channel_list(&self) -> Vec<&str> {
        self.channels.split(',').collect()
    }

    fn check(&self) -> Result<(), String> {
        let share = |name: &str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(format!("--{name} must be between 0 and 1"))
            }
        };
        share("sigterm-share", self.sigterm_share)?;
        share("pause-share", self.pause_share)?;
        share("gateway-check-failures", self.gateway_check_failures)?;
        share("gateway-delivered", self.gateway_delivered)?;
        share("gateway-cancels", self.gateway_cancels)?;
        if self.sigterm_share + self.pause_share > 1.0 {
            return Err("--sigterm-share and --pause-share add up to more than 1".into());
        }
        if self.instances == 0 {
            return Err("--instances must be at least 1".into());
        }
        if self.clock_step && self.hosts.is_some() {
            return Err("--clock-step runs a cluster of its own: not with --hosts".into());
        }
        if self.smpp() && self.keys > 10_000 {
            // Each key has a number of its own: the SMSC's counts are per
            // destination (a long message's parts carry no key).
            return Err("--provider smpp: at most 10000 --keys".into());
        }
        if self.gateway && (self.smpp() || self.keys > 10_000) {
            // Each verification has a number of its own: the mock's
            // Gateway messages and SMS are told apart per phone.
            return Err("--gateway: not over smpp, and at most 10000 --keys".into());
        }
        if self.infobip && (self.two_providers || self.gateway || self.smpp()) {
            return Err("--infobip: not with --two-providers, --gateway or --provider smpp".into());
        }
        share("whatsapp-delivered", self.whatsapp_delivered)?;
        share("whatsapp-read", self.whatsapp_read)?;
        share("whatsapp-failed", self.whatsapp_failed)?;
        if self.whatsapp_delivered + self.whatsapp_read + self.whatsapp_failed > 1.0 {
            return Err(
                "--whatsapp-delivered, --whatsapp-read and --whatsapp-failed add up to more than 1"
                    .into(),
            );
        }
        match (self.gateway, self.channels.as_str()) {
            (_, "telegram,sms") | (true, "whatsapp,telegram,sms") => {}
            _ => {
                return Err(
                    "--channels: telegram,sms or whatsapp,telegram,sms (with --gateway)".into(),
                );
            }
        }
        if self.gateway && self.fallback_after_secs >= self.ttl_secs {
            return Err("--fallback-after-secs must be less than --ttl-secs".into());
        }
        if self.clock_step && Duration::from_secs(self.clock_step_secs) <= LEASE {
            return Err(format!(
                "--clock-step-secs must be more than the lease ({} s)",
                LEASE.as_secs()
            ));
        }
        Ok(())
    }

    /// `SENDONCE_PROVIDER`.
    fn providers(&self) -> &'static str {
        if self.infobip {
            return "infobip,http";
        }
        match (self.two_providers, self.provider) {
            (true, _) => "twilio,http",
            (false, ProviderChoice::Twilio) => "twilio",
            (false, ProviderChoice::Http) => "http",
            (false, ProviderChoice::Smpp) => "smpp",
        }
    }

    fn smpp(&self) -> bool {
        self.providers() == "smpp"
    }

    fn uses_http(&self) -> bool {
        self.providers().contains("http")
    }

    /// Whether the instances fail over between two providers.
    fn failover(&self) -> bool {
        self.providers().contains(',')
    }

    /// `SENDONCE_RETRY_DEADLINE` of the instances, before clock steps.
    fn retry_deadline(&self) -> Duration {
        Duration::from_secs(
            self.retry_deadline_secs
                .unwrap_or(if self.gateway { 600 } else { 30 }),
        )
    }

    /// `SENDONCE_MAX_CONCURRENT_SENDS` of the instances, when not the
    /// service's default.
    fn max_concurrent_sends(&self) -> Option<usize> {
        self.max_concurrent_sends
            .or(if self.infobip { Some(4) } else { None })
    }
}

struct Instance {
    port: u16,
    child: Option<Child>,
    /// SIGSTOPped now: not to be killed, stopped or counted dead.
    paused: bool,
}

struct Run {
    args: Args,
    /// The run's own copy of `sendonce` (in the log directory): every
    /// instance, restarts included, runs the binary the run started with,
    /// whatever is rebuilt meanwhile.
    sendonce: PathBuf,
    log_dir: PathBuf,
    database_url: String,
    /// The mock's base URL (its Twilio API is under it, its `http`
    /// endpoint at `/messages`).
    mock_base: String,
    mock: MockProvider,
    api_key: String,
    client: reqwest::Client,
    /// The run's own cluster (with --restart-postgres or --clock-step): the
    /// only one it restarts or whose clock it steps.
    cluster: Option<Cluster>,
    /// With --provider smpp: the SMSC.
    smsc: Option<Smsc>,
    /// When the run hit an instance (this machine's wall clock, ms): a
    /// SIGKILL or SIGTERM as (at, at), a pause as (SIGSTOP, SIGCONT).
    hit_at: std::sync::Mutex<Vec<(i64, i64)>>,
}

impl Run {
    fn sendonce(&self) -> Command {
        let mut cmd = Command::new(&self.sendonce);
        cmd.env("SENDONCE_PROVIDER", self.args.providers());
        if self.args.providers().contains("twilio") {
            cmd.env("TWILIO_BASE_URL", &self.mock_base)
                .env("TWILIO_ACCOUNT_SID", "AC0123456789abcdef0123456789abcdef")
                .env("TWILIO_AUTH_TOKEN", "chaos-twilio-token")
                .env("TWILIO_FROM", "+14155550000");
        }
        if let Some(smsc) = &self.smsc {
            cmd.env("SMPP_HOST", "127.0.0.1")
                .env("SMPP_PORT", smsc.port.to_string())
                .env("SMPP_SYSTEM_ID", "chaos")
                .env("SMPP_PASSWORD", "secret")
                .env("SMPP_SOURCE_ADDR", "sendonce")
                .env("SMPP_BINDS", "2")
                .env("SMPP_WINDOW", "10")
                .env("SMPP_RATE", "10000")
                // 1 s is the least SMPP_RESPONSE_TIMEOUT takes (the
                // provider timeout is 1 s too: whichever ends the call
                // first, no answer is ambiguous).
                .env("SMPP_RESPONSE_TIMEOUT", "1")
                .env("SMPP_ENQUIRE_LINK_INTERVAL", "5");
        }
        if self.args.uses_http() {
            cmd.env(
                "SENDONCE_HTTP_PROVIDER_URL",
                format!("{}/messages", self.mock_base),
            );
        }
        if self.args.providers().contains("infobip") {
            cmd.env("INFOBIP_BASE_URL", &self.mock_base)
                .env("INFOBIP_API_KEY", "chaos-infobip-key")
                .env("INFOBIP_FROM", "ChaosSMS");
        }
        if let Some(n) = self.args.max_concurrent_sends() {
            cmd.env("SENDONCE_MAX_CONCURRENT_SENDS", n.to_string());
        }
        if self.args.gateway {
            // The mock's Gateway checks no token unless told to; the
            // verifications' limits and pauses are off (one tenant, one
            // number range, no checks ever made).
            cmd.env("TELEGRAM_GATEWAY_TOKEN", GATEWAY_TOKEN)
                .env("TELEGRAM_GATEWAY_URL", &self.mock_base)
                .env(
                    "SENDONCE_VERIFY_SECRET",
                    "chaos-verify-secret-0123456789abcdef0123456789abcdef",
                )
                .env("SENDONCE_VERIFY_STARTS_PER_PREFIX_PER_HOUR", "0")
                .env("SENDONCE_VERIFY_PAUSE_MIN_STARTS", "0")
                .env("SENDONCE_VERIFY_PAUSE_COUNTRY_MIN_STARTS", "0");
            if self.args.whatsapp() {
                // The mock's Cloud API checks none of these unless told to;
                // its notifications are signed with the app secret.
                cmd.env("WHATSAPP_ACCESS_TOKEN", "chaos-whatsapp-token")
                    .env("WHATSAPP_PHONE_NUMBER_ID", WHATSAPP_PHONE_NUMBER_ID)
                    .env("WHATSAPP_TEMPLATE_NAME", "verification_code")
                    .env("WHATSAPP_APP_SECRET", WHATSAPP_APP_SECRET)
                    .env("WHATSAPP_VERIFY_TOKEN", "chaos-whatsapp-verify")
                    .env("WHATSAPP_BASE_URL", format!("{}/v21.0", self.mock_base));
            }
        }
        if self.args.failover() {
            cmd.env("SENDONCE_CIRCUIT_FAILURES", "3")
                .env("SENDONCE_CIRCUIT_OPEN_FOR", "2s");
        }
        // The clock steps must not eat the retry deadline (it is kept on
        // the database's clock).
        let stepped = if self.args.clock_step {
            self.args.clock_steps as u64 * self.args.clock_step_secs
        } else {
            0
        };
        // A request waits this long for its send before answering 202.
        // Over SMPP sends wait for binds after every drop: a request
        // waiting 2 s would be cut by the next hit on its instance (every
        // ~2 s at CI's fault rate) again and again, never answered.
        let sync_wait = if self.args.smpp() { "500" } else { "2000" };
        cmd.env("DATABASE_URL", &self.database_url)
            .env("SENDONCE_BOOTSTRAP_API_KEY", &self.api_key)
            .env(
                "SENDONCE_PROVIDER_TIMEOUT_MS",
                PROVIDER_TIMEOUT.as_millis().to_string(),
            )
            .env("SENDONCE_LEASE_SECS", LEASE.as_secs().to_string())
            .env("SENDONCE_POLL_INTERVAL_MS", "200")
            .env("SENDONCE_RETRY_BASE_MS", "50")
            .env("SENDONCE_RETRY_CAP_MS", "1000")
            .env("SENDONCE_RETRY_MAX_ATTEMPTS", "30")
            .env(
                "SENDONCE_RETRY_DEADLINE_SECS",
                (self.args.retry_deadline().as_secs() + stepped).to_string(),
            )
            .env("SENDONCE_RETRY_AFTER_MAX_SECS", "2")
            .env("SENDONCE_SYNC_WAIT_MS", sync_wait)
            .env("SENDONCE_SHUTDOWN_GRACE_SECS", "1")
            .env("SENDONCE_DB_MAX_CONNECTIONS", "8")
            // The run is one tenant hammering one number range on purpose.
            .env("SENDONCE_RATE_TENANT_RPS", "0")
            .env("SENDONCE_RATE_NUMBER_PER_HOUR", "0")
            .env("SENDONCE_RATE_PREFIX_PER_HOUR", "0")
            .env(
                "RUST_LOG",
                if self.args.gateway {
                    format!("{INSTANCE_LOG},sendonce::verify=info,sendonce::send=info")
                } else {
                    INSTANCE_LOG.to_string()
                },
            )
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    /// Key `k`'s body (see [`body_of`]; over SMPP every fifth is three
    /// UCS-2 parts and every fifth two GSM-7 parts).
    fn body(&self, k: usize) -> String {
        if self.args.smpp() {
            smpp_body_of(k)
        } else {
            body_of(k)
        }
    }

    /// Notes that the run hit an instance from `from` to `to` (ms).
    fn hit(&self, from: i64, to: i64) {
        if let Ok(mut h) = self.hit_at.lock() {
            h.push((from, to));
        }
    }

    fn log_path(&self, n: usize) -> PathBuf {
        self.log_dir.join(format!("instance-{n}.log"))
    }

    /// Appends a line of the run's own to instance `n`'s log (what was
    /// done to it, and when), so its lines can be read in context.
    fn mark(&self, n: usize, what: &str) {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(n))
        {
            let _ = writeln!(f, "{} === chaos: {what} ===", utc_now());
        }
    }

    async fn start_instance(&self, port: u16, n: usize) -> std::io::Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(n))?;
        let child = self
            .sendonce()
            .env("SENDONCE_LISTEN", format!("127.0.0.1:{port}"))
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.mark(
            n,
            &format!("started pid {}", child.id().unwrap_or_default()),
        );
        Ok(child)
    }

    async fn wait_healthy(&self, port: u16) -> bool {
        let base = format!("http://127.0.0.1:{port}");
        procs::wait_ready(&self.client, &base, "/healthz", None)
            .await
            .is_ok()
    }
}

/// This machine's time as RFC 3339 UTC with milliseconds (as the
/// instances' log lines show it).
fn utc_now() -> String {
    utc(SystemTime::now())
}

/// `at` in RFC 3339, UTC, with milliseconds.
fn utc(at: SystemTime) -> String {
    let since = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        since.subsec_millis()
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("chaos: {e}");
            ExitCode::from(2)
        }
    }
}

/// What the load saw from the clients' side.
#[derive(Default)]
struct Load {
    acknowledged: std::sync::Mutex<HashSet<String>>,
    reused: AtomicUsize,
    gave_up: AtomicUsize,
    /// When --switch-cmd started and returned, and the first
    /// acknowledgement of a request sent after it returned.
    switch_began: std::sync::Mutex<Option<Instant>>,
    switched_at: std::sync::Mutex<Option<Instant>>,
    first_ack_after_switch: std::sync::Mutex<Option<Duration>>,
    /// When each 201/202 came back.
    acks: std::sync::Mutex<Vec<Instant>>,
    /// What the clients got, every try counted: a status, or how the
    /// request failed.
    answers: std::sync::Mutex<std::collections::BTreeMap<String, usize>>,
    /// With --gateway: per key, the verification id of every 201, and when
    /// the first came back.
    verifications: std::sync::Mutex<HashMap<usize, Vec<String>>>,
    first_ack: std::sync::Mutex<HashMap<usize, Instant>>,
    /// With --gateway: keys a request of which was refused (4xx other than
    /// 409 and 429) or given up on, and how.
    refused: std::sync::Mutex<Vec<(usize, String)>>,
    /// With --gateway: the request ids whose `delivered` report an
    /// instance answered 200, and when it answered.
    reported: std::sync::Mutex<HashSet<String>>,
    reported_at: std::sync::Mutex<HashMap<String, SystemTime>>,
    /// With --gateway: the keys whose verification a cancel ended, and
    /// when the cancel was answered (the wall clock, and this process's).
    canceled: std::sync::Mutex<HashMap<usize, (SystemTime, Instant)>>,
    /// With --gateway: every 20 ms while the run goes on, how many calls
    /// the mock had taken and Gateway messages it had made, so that a
    /// call's place in the mock's lists dates it (no earlier than the
    /// last sample that did not have it yet).
    samples: std::sync::Mutex<Vec<(Instant, usize, usize)>>,
    /// With --channels whatsapp,...: the status each WhatsApp message was
    /// given (`delivered`, `read`, `failed`; none: not in the map), by
    /// wamid. Those answered 200 are in `reported` and `reported_at`.
    whatsapp_outcome: std::sync::Mutex<HashMap<String, &'static str>>,
}

impl Load {
    /// The latest moment the run saw the mock without its `nth` call
    /// (`calls`) or Gateway message: the call or message came after it.
    fn not_before(&self, nth: usize, calls: bool) -> Option<Instant> {
        let samples = self.samples.lock().ok()?;
        samples
            .iter()
            .filter(|(_, c, g)| if calls { *c <= nth } else { *g <= nth })
            .map(|(at, _, _)| *at)
            .max()
    }
}

impl Load {
    fn tally(&self, what: String) {
        if let Ok(mut a) = self.answers.lock() {
            *a.entry(what).or_default() += 1;
        }
    }
}

/// What was done to the instances and the database.
#[derive(Default, Clone, Copy)]
struct Hits {
    sigkills: usize,
    sigterms: usize,
    pauses: usize,
    /// SIGTERMed instances still running after [`TERM_WAIT`] (then SIGKILLed).
    slow_stops: usize,
    /// SIGTERMed instances that exited with another status than 0.
    unclean_stops: usize,
    /// Signals that could not be sent (the process had gone).
    failed_signals: usize,
    /// Instances that exited by themselves (then started again).
    died: usize,
    pg_restarted: bool,
}

/// One step of the database's clock.
struct ClockStep {
    /// Seconds into the load.
    at_secs: f64,
    /// The offset set (seconds ahead of this machine).
    offset: i64,
    /// How far ahead `SELECT now()` was after it.
    measured: f64,
    /// Leases live just before it, and just after.
    live_before: i64,
    live_after: i64,
    /// Attempts open (calls in flight, or owners gone) just before it.
    open_attempts: i64,
}

/// What one key came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Ok,
    Unknown { created: u32 },
    Duplicate,
    Lost,
    Stuck,
    FalseFinal,
}

/// What the run saw at the end.
struct Outcome {
    load_secs: f64,
    hits: Hits,
    steps: Vec<ClockStep>,
    stuck: i64,
    statuses: HashMap<String, i64>,
    stored: HashSet<String>,
    stats: serde_json::Value,
    /// Messages by the provider that has them, and failovers recorded.
    by_provider: Vec<(String, i64)>,
    failovers: i64,
    /// Messages `sent` whose provider was asked about them (an ambiguous
    /// answer, or an attempt taken over) and showed them.
    found_by_lookup: i64,
    /// Per key: creations at the mock and the verdict.
    keys: Vec<(usize, u32, Verdict)>,
    /// Messages the mock created that are no key's (To, Body).
    unmatched: i64,
    /// With --provider smpp: the times the SMSC dropped every session, and
    /// per `unknown` key the cause the run found (None: none found).
    drops: usize,
    causes: Vec<(usize, Option<&'static str>)>,
}

async fn run(args: Args) -> Result<bool, String> {
    args.check()?;
    sendonce::install_crypto_provider();
    let bin_dir = procs::bin_dir(args.bin_dir.as_deref(), " (scripts/chaos.sh does)")?;
    let log_dir = procs::log_dir("chaos")?;
    // With --restart-postgres or --clock-step, a cluster of its own: the
    // one it restarts, or whose clock it steps.
    let cluster = if args.clock_step {
        let lib = args
            .libfaketime
            .clone()
            .or_else(find_libfaketime)
            .ok_or("--clock-step: libfaketime.so.1 not found (apt-get install libfaketime)")?;
        Some(
            Cluster::start_with_fake_clock(&lib)
                .map_err(|e| format!("throwaway Postgres under libfaketime: {e}"))?,
        )
    } else if args.restart_postgres {
        Some(Cluster::start().map_err(|e| format!("throwaway Postgres: {e}"))?)
    } else {
        None
    };
    let admin_url = cluster
        .as_ref()
        .map_or_else(|| args.admin_url.clone(), Cluster::admin_url);
    let mut admin = PgConnection::connect(&admin_url)
        .await
        .map_err(|e| format!("connect to {admin_url}: {e}"))?;
    let mut db = create_database(&mut admin, &admin_url, "chaos").await?;
    if let Some(hosts) = &args.hosts {
        db.url = format!(
            "postgres://postgres@{hosts}/{}?target_session_attrs=read-write",
            db.name
        );
    }
    let sendonce = log_dir.join("sendonce");
    std::fs::copy(bin_dir.join("sendonce"), &sendonce)
        .map_err(|e| format!("copy sendonce to {}: {e}", sendonce.display()))?;
    let outcome = run_on(args, sendonce.clone(), log_dir, &db, cluster).await;
    drop_database(&mut admin, &db).await;
    let _ = std::fs::remove_file(&sendonce);
    outcome
}

async fn run_on(
    args: Args,
    sendonce: PathBuf,
    log_dir: PathBuf,
    db: &Database,
    cluster: Option<Cluster>,
) -> Result<bool, String> {
    // The misbehaving provider, in this process.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("mock provider: {e}"))?;
    let mock_addr = listener.local_addr().map_err(|e| e.to_string())?;
    let mock = MockProvider::with_faults(mock_faults(&args));
    if args.gateway {
        mock.set_gateway_check_failures(args.gateway_check_failures);
        mock.set_gateway_revoke_latency(Duration::from_millis(args.gateway_revoke_ms));
    }
    if args.infobip {
        mock.infobip_set_log_lag(Duration::from_millis(args.infobip_log_lag_ms));
    }
    // The `http` contract is a provider (or bridge) that de-duplicates on
    // Idempotency-Key; Twilio's endpoint never does, whatever this says.
    mock.set_dedup(if args.uses_http() {
        Dedup::Ietf
    } else {
        Dedup::None
    });
    let mock_task = mock.serve(listener);
    let smsc = if args.smpp() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .ok_or("no repository root")?;
        let smsc = Smsc::start(root).await?;
        smsc.set_faults(&smsc_faults(&args)).await?;
        Some(smsc)
    } else {
        None
    };
    let run = Arc::new(Run {
        sendonce,
        log_dir,
        database_url: db.url.clone(),
        mock_base: format!("http://{mock_addr}"),
        mock,
        api_key: sendonce::apikey::generate().secret,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.to_string())?,
        args,
        cluster,
        smsc,
        hit_at: std::sync::Mutex::new(Vec::new()),
    });
    procs::migrate(run.sendonce()).await?;
    let instances = start_instances(&run).await?;
    let ports: Vec<u16> = instances.iter().map(|i| i.port).collect();
    let instances = Arc::new(Mutex::new(instances));
    print_setup(&run);

    let load = Arc::new(Load::default());
    let load_done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let killer = tokio::spawn(kill_loop(
        Arc::clone(&run),
        Arc::clone(&instances),
        Arc::clone(&load_done),
    ));
    let stepper = tokio::spawn(step_clock(
        Arc::clone(&run),
        Arc::clone(&load_done),
        started,
    ));
    let switcher = tokio::spawn(switch(Arc::clone(&run), Arc::clone(&load)));
    let dropper = tokio::spawn(drop_sessions(Arc::clone(&run), Arc::clone(&load_done)));
    let reporter = tokio::spawn(report_deliveries(
        Arc::clone(&run),
        ports.clone(),
        Arc::clone(&load),
        Arc::clone(&load_done),
    ));
    let wa_reporter = tokio::spawn(report_whatsapp(
        Arc::clone(&run),
        ports.clone(),
        Arc::clone(&load),
        Arc::clone(&load_done),
    ));
    let _sampler = tokio::spawn(sample_mock(
        Arc::clone(&run),
        Arc::clone(&load),
        Arc::clone(&load_done),
    ));
    send_load(&run, &ports, &load).await;
    load_done.store(true, Ordering::SeqCst);
    let drops = dropper.await.unwrap_or_default();
    let _ = reporter.await;
    let _ = wa_reporter.await;
    let load_ended = Instant::now();
    let load_secs = started.elapsed().as_secs_f64();
    // Every pause is over and every stopped instance started again once
    // the killer returns.
    let hits = killer.await.unwrap_or_default();
    let (steps, mut clock_ok) = match stepper.await {
        Ok(Ok(steps)) => (steps, true),
        Ok(Err(e)) => {
            eprintln!("chaos: clock step: {e}");
            (Vec::new(), false)
        }
        Err(e) => {
            eprintln!("chaos: clock step: {e}");
            (Vec::new(), false)
        }
    };
    if run.args.clock_step && steps.is_empty() && clock_ok {
        eprintln!(
            "chaos: no clock step during the load ({load_secs:.1} s): ask for more keys or a shorter --clock-step-every-ms"
        );
        clock_ok = false;
    }
    let mut switch_ok = switcher.await.unwrap_or(false);
    // A switch after the last answer tested nothing under load: a failure,
    // not a pass (ask for more keys or an earlier --switch-after-ms).
    let began = load.switch_began.lock().ok().and_then(|a| *a);
    if run.args.switch_cmd.is_some() && began.is_none_or(|at| at >= load_ended) {
        eprintln!(
            "chaos: the switch began after the load ended ({load_secs:.1} s): nothing was tested under load"
        );
        switch_ok = false;
    }

    let mut hits = hits;
    hits.died += restart_missing(&run, &instances).await;
    if run.args.gateway {
        let ok = gateway_settle(&run, &ports, &db.url, &load, load_secs, hits).await?;
        for inst in instances.lock().await.iter_mut() {
            if let Some(mut c) = inst.child.take() {
                procs::kill(&mut c).await;
            }
        }
        mock_task.abort();
        return Ok(ok && switch_ok && clock_ok);
    }
    let outcome = settle(&run, &db.url, &load).await?;
    let outcome = Outcome {
        load_secs,
        hits,
        steps,
        drops,
        ..outcome
    };
    let ok = report(&run, &load, &outcome) && switch_ok && clock_ok;
    let unknown = outcome
        .keys
        .iter()
        .any(|(_, _, v)| matches!(v, Verdict::Unknown { .. }));
    if !ok || unknown {
        explain(&run, &db.url, &outcome).await;
    }

    // Tidy up: stop everything (the caller drops the database).
    for inst in instances.lock().await.iter_mut() {
        if let Some(mut c) = inst.child.take() {
            procs::kill(&mut c).await;
        }
    }
    mock_task.abort();
    Ok(ok)
}

fn print_setup(run: &Run) {
    let a = &run.args;
    println!(
        "chaos: {} keys x {} requests, {} instances, concurrency {}, logs in {}",
        a.keys,
        1 + a.duplicates,
        a.instances,
        a.concurrency,
        run.log_dir.display()
    );
    let dedup = match (a.providers(), a.uses_http()) {
        ("twilio", _) => "Twilio's API never de-duplicates",
        ("smpp", _) => "the npm smpp SMSC never de-duplicates and cannot be asked",
        (_, true) if a.two_providers => {
            "Twilio's API never de-duplicates; /messages de-duplicates (MOCK_DEDUP=ietf)"
        }
        (_, true) if a.infobip => {
            "Infobip's idempotency is off (a repeated messageId is a second message); /messages de-duplicates (MOCK_DEDUP=ietf)"
        }
        _ => "/messages de-duplicates (MOCK_DEDUP=ietf)",
    };
    match &run.smsc {
        Some(smsc) => println!(
            "chaos: provider smpp at the npm smpp SMSC on port {} ({dedup}); faults {:?}; every session dropped every ~{} ms",
            smsc.port,
            smsc_faults(a),
            a.smsc_drop_every_ms
        ),
        None => println!("chaos: provider {} at the mock ({dedup})", a.providers()),
    }
    if a.infobip {
        println!(
            "chaos: Infobip's logs lag {} ms behind each message; {} send slots per instance",
            a.infobip_log_lag_ms,
            a.max_concurrent_sends().unwrap_or(64)
        );
    }
    println!("chaos: retry deadline {} s", a.retry_deadline().as_secs());
    if a.whatsapp() {
        println!(
            "chaos: first whatsapp: the Cloud API at the mock (a message for every accepted send; faults as above, worded as Meta's error objects), {:.0}% of its messages reported delivered, {:.0}% read, {:.0}% failed, each after up to {} ms",
            a.whatsapp_delivered * 100.0,
            a.whatsapp_read * 100.0,
            a.whatsapp_failed * 100.0,
            a.fallback_after_secs * 1500
        );
    }
    if a.gateway {
        println!(
            "chaos: verifications, channels telegram then sms: the Telegram Gateway at the mock (a message for every accepted send: no de-duplication on request_id; faults as above on its sends, {:.0}% of its checks failing, revokes answered within {} ms, {:.0}% of its messages reported delivered), {:.0}% of the verifications canceled, fallback after {} s, ttl {} s",
            a.gateway_check_failures * 100.0,
            a.gateway_revoke_ms,
            a.gateway_delivered * 100.0,
            a.gateway_cancels * 100.0,
            a.fallback_after_secs,
            a.ttl_secs
        );
    }
    if a.kill_every_ms > 0 {
        let kill = 1.0 - a.sigterm_share - a.pause_share;
        println!(
            "chaos: a fault every ~{} ms: SIGKILL {:.0}%, SIGTERM {:.0}%, pause {:.0}% ({:.1}-{:.1} s, lease {} s; at most {} paused at once)",
            a.kill_every_ms,
            kill * 100.0,
            a.sigterm_share * 100.0,
            a.pause_share * 100.0,
            LEASE.as_secs_f64() / 2.0,
            LEASE.as_secs_f64() * 2.0,
            LEASE.as_secs(),
            a.max_paused
        );
    }
    if a.clock_step {
        println!(
            "chaos: database under libfaketime: up to {} steps of +{} s, every {} ms",
            a.clock_steps, a.clock_step_secs, a.clock_step_every_ms
        );
    }
}

/// The mock provider's injected faults.
fn mock_faults(args: &Args) -> Faults {
    Faults {
        latency: (Duration::ZERO, Duration::from_millis(20)),
        error_500: args.fail_500,
        rate_limited: args.rate_limit,
        retry_after_secs: 1,
        hang: args.hang,
        accept_then_drop: args.accept_then_drop,
        accept_then_500: args.accept_then_500,
    }
}

/// The SMSC's answers other than `ok`, with their probabilities.
fn smsc_faults(args: &Args) -> Vec<(&'static str, f64)> {
    vec![
        ("0x58", args.rate_limit),
        ("0x14", args.fail_500),
        ("silent", args.hang),
        ("drop", args.accept_then_drop),
    ]
}

/// With --provider smpp, until the load is done: every so often (a random
/// half to one and a half --smsc-drop-every-ms) the SMSC destroys every
/// session, each instance's binds included. The drops made.
async fn drop_sessions(run: Arc<Run>, load_done: Arc<AtomicBool>) -> usize {
    let Some(smsc) = &run.smsc else { return 0 };
    let mean = run.args.smsc_drop_every_ms;
    if mean == 0 {
        return 0;
    }
    let mut drops = 0;
    loop {
        let wait = rand::rng().random_range(mean / 2..=mean * 3 / 2);
        // Checked every 100 ms, so the load's end is not held up.
        let until = Instant::now() + Duration::from_millis(wait);
        while Instant::now() < until && !load_done.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if load_done.load(Ordering::SeqCst) {
            return drops;
        }
        match smsc.drop_sessions().await {
            Ok(()) => drops += 1,
            Err(e) => eprintln!("chaos: smsc drop: {e}"),
        }
    }
}

/// This machine's wall clock in ms since the epoch.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Starts every instance on a free port and waits for each to be healthy.
async fn start_instances(run: &Run) -> Result<Vec<Instance>, String> {
    let mut instances = Vec::new();
    for n in 0..run.args.instances {
        let port = free_port().map_err(|e| e.to_string())?;
        let child = run
            .start_instance(port, n)
            .await
            .map_err(|e| e.to_string())?;
        instances.push(Instance {
            port,
            child: Some(child),
            paused: false,
        });
    }
    for i in &instances {
        if !run.wait_healthy(i.port).await {
            return Err(format!(
                "instance on {} did not start; logs in {}",
                i.port,
                run.log_dir.display()
            ));
        }
    }
    Ok(instances)
}

/// Sends `sig` (`TERM`, `STOP`, `CONT`) to `pid`.
async fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

/// The end of a SIGTERM or a pause, run beside the kill loop.
enum Ended {
    Stopped {
        slow: bool,
        clean: bool,
        signalled: bool,
    },
    Resumed {
        signalled: bool,
    },
    /// It had exited by itself before the SIGTERM.
    Died,
}

/// Starts again every instance in `list` that exited by itself (not one
/// that is paused or that a fault took out); the number of them.
async fn revive(run: &Run, list: &mut [Instance]) -> usize {
    let mut died = 0;
    for (n, inst) in list.iter_mut().enumerate() {
        let Some(child) = inst.child.as_mut().filter(|_| !inst.paused) else {
            continue;
        };
        let pid = child.id().unwrap_or_default();
        if let Ok(Some(status)) = child.try_wait() {
            run.mark(n, &format!("pid {pid} exited by itself: {status}"));
            died += 1;
            inst.child = run.start_instance(inst.port, n).await.ok();
        }
    }
    died
}

/// Until the load is done: every so often, hit a random instance that is
/// neither paused nor down: SIGKILL it and start it again, SIGTERM it and
/// start it again once it has exited, or pause it for 0.5 to 2 times the
/// lease (at most --max-paused at once, never all of them). An instance
/// that exited by itself is started again. Once, after two faults, restart
/// the run's own Postgres (with --restart-postgres). Returns once every
/// pause is over and every stopped instance runs again.
async fn kill_loop(
    run: Arc<Run>,
    instances: Arc<Mutex<Vec<Instance>>>,
    load_done: Arc<AtomicBool>,
) -> Hits {
    let mut hits = Hits::default();
    let restart_pg = run.args.restart_postgres && run.cluster.is_some();
    if run.args.kill_every_ms == 0 && !restart_pg {
        return hits;
    }
    let mut ending = tokio::task::JoinSet::new();
    let mut terms_started = 0usize;
    while !load_done.load(Ordering::SeqCst) {
        let mean = run.args.kill_every_ms.max(100);
        let wait = rand::rng().random_range(mean / 2..=mean * 3 / 2);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        if load_done.load(Ordering::SeqCst) {
            break;
        }
        if restart_pg && !hits.pg_restarted && hits.sigkills + terms_started + hits.pauses >= 2 {
            if let Some(cluster) = &run.cluster {
                hits.pg_restarted = cluster.restart().await;
            }
            continue;
        }
        if run.args.kill_every_ms == 0 {
            continue;
        }
        let mut list = instances.lock().await;
        hits.died += revive(&run, &mut list).await;
        let up: Vec<usize> = (0..list.len())
            .filter(|n| list[*n].child.is_some() && !list[*n].paused)
            .collect();
        let paused = list.iter().filter(|i| i.paused).count();
        let Some(&n) = up.get(rand::rng().random_range(0..up.len().max(1))) else {
            continue;
        };
        // One instance at least keeps serving.
        let may_pause = paused < run.args.max_paused && paused + 1 < list.len();
        let roll: f64 = if may_pause {
            rand::rng().random()
        } else {
            rand::rng().random_range(run.args.pause_share.min(1.0)..=1.0)
        };
        if roll < run.args.pause_share {
            let Some(pid) = list[n].child.as_ref().and_then(Child::id) else {
                continue;
            };
            list[n].paused = true;
            drop(list);
            hits.pauses += 1;
            let (run, instances) = (Arc::clone(&run), Arc::clone(&instances));
            ending.spawn(async move {
                let lease = LEASE.as_millis() as u64;
                let pause = rand::rng().random_range(lease / 2..=lease * 2);
                run.mark(n, &format!("SIGSTOP pid {pid} for {pause} ms"));
                let from = now_ms();
                let stopped = signal(pid, "STOP").await;
                tokio::time::sleep(Duration::from_millis(pause)).await;
                let resumed = signal(pid, "CONT").await;
                run.hit(from, now_ms());
                run.mark(n, &format!("SIGCONT pid {pid}"));
                instances.lock().await[n].paused = false;
                Ended::Resumed {
                    signalled: stopped && resumed,
                }
            });
        } else if roll < run.args.pause_share + run.args.sigterm_share {
            let Some(mut child) = list[n].child.take() else {
                continue;
            };
            let port = list[n].port;
            drop(list);
            terms_started += 1;
            let (run, instances) = (Arc::clone(&run), Arc::clone(&instances));
            ending.spawn(async move {
                // A graceful shutdown of an instance at work (one still
                // starting would die of the signal before its handler is
                // installed).
                let _ = run.wait_healthy(port).await;
                let pid = child.id().unwrap_or_default();
                if let Ok(Some(status)) = child.try_wait() {
                    run.mark(n, &format!("pid {pid} exited by itself: {status}"));
                    if let Ok(child) = run.start_instance(port, n).await {
                        instances.lock().await[n].child = Some(child);
                    }
                    return Ended::Died;
                }
                run.mark(n, &format!("SIGTERM pid {pid}"));
                let from = now_ms();
                let signalled = signal(pid, "TERM").await;
                let (slow, clean) = match tokio::time::timeout(TERM_WAIT, child.wait()).await {
                    Ok(status) => {
                        let said = status
                            .as_ref()
                            .map_or_else(|e| e.to_string(), |s| s.to_string());
                        run.mark(n, &format!("pid {pid} exited: {said}"));
                        (false, status.is_ok_and(|s| s.success()))
                    }
                    Err(_) => {
                        run.mark(n, &format!("pid {pid} still running: SIGKILL"));
                        procs::kill(&mut child).await;
                        (true, false)
                    }
                };
                run.hit(from, now_ms());
                if let Ok(child) = run.start_instance(port, n).await {
                    instances.lock().await[n].child = Some(child);
                }
                Ended::Stopped {
                    slow,
                    clean,
                    signalled,
                }
            });
        } else {
            if let Some(mut child) = list[n].child.take() {
                run.mark(
                    n,
                    &format!("SIGKILL pid {}", child.id().unwrap_or_default()),
                );
                procs::kill(&mut child).await; // SIGKILL
                run.hit(now_ms(), now_ms());
                hits.sigkills += 1;
            }
            let port = list[n].port;
            drop(list);
            tokio::time::sleep(Duration::from_millis(200)).await;
            if let Ok(child) = run.start_instance(port, n).await {
                instances.lock().await[n].child = Some(child);
            }
        }
    }
    while let Some(ended) = ending.join_next().await {
        match ended {
            Ok(Ended::Stopped {
                slow,
                clean,
                signalled,
            }) => {
                hits.sigterms += 1;
                hits.slow_stops += usize::from(slow);
                hits.unclean_stops += usize::from(!clean && !slow);
                hits.failed_signals += usize::from(!signalled);
            }
            Ok(Ended::Resumed { signalled }) => hits.failed_signals += usize::from(!signalled),
            Ok(Ended::Died) => hits.died += 1,
            Err(_) => hits.failed_signals += 1,
        }
    }
    hits
}

/// With --clock-step: during the load, steps the database's clock forward
/// by --clock-step-secs every --clock-step-every-ms (the first after half of
/// it), up to --clock-steps times, and checks with `SELECT now()` that each
/// step took effect. Fails if one did not.
async fn step_clock(
    run: Arc<Run>,
    load_done: Arc<AtomicBool>,
    started: Instant,
) -> Result<Vec<ClockStep>, String> {
    let mut steps = Vec::new();
    let Some(cluster) = run.cluster.as_ref().filter(|c| c.has_fake_clock()) else {
        return Ok(steps);
    };
    let step = i64::try_from(run.args.clock_step_secs).map_err(|e| e.to_string())?;
    let mut offset = 0i64;
    let mut next = started + Duration::from_millis(run.args.clock_step_every_ms / 2);
    while steps.len() < run.args.clock_steps {
        while Instant::now() < next && !load_done.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if load_done.load(Ordering::SeqCst) {
            break;
        }
        next += Duration::from_millis(run.args.clock_step_every_ms);
        let mut conn = connect_retrying(&run.database_url).await?;
        let (live_before, open_attempts) = in_flight(&mut conn).await;
        offset += step;
        cluster.set_clock_offset(offset)?;
        let at_secs = started.elapsed().as_secs_f64();
        // The server reads the file on every clock read: the step shows at
        // once (a little slack for a slow machine).
        let deadline = Instant::now() + Duration::from_secs(2);
        let off = |measured: f64| measured.is_nan() || (measured - offset as f64).abs() > 1.0;
        let mut measured = clock_ahead(&mut conn).await.unwrap_or(f64::NAN);
        while off(measured) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            measured = match clock_ahead(&mut conn).await {
                Ok(m) => m,
                // A Postgres restart (--restart-postgres) cut it.
                Err(_) => {
                    conn = connect_retrying(&run.database_url).await?;
                    f64::NAN
                }
            };
        }
        let (live_after, _) = in_flight(&mut conn).await;
        println!(
            "chaos: clock step {} at {at_secs:.1} s: database clock +{offset} s; SELECT now() is {measured:.1} s ahead of this machine; leases live {live_before} before, {live_after} after; {open_attempts} attempts open",
            steps.len() + 1
        );
        if off(measured) {
            return Err(format!(
                "the step to +{offset} s did not take effect: the database is {measured:.1} s ahead"
            ));
        }
        steps.push(ClockStep {
            at_secs,
            offset,
            measured,
            live_before,
            live_after,
            open_attempts,
        });
    }
    Ok(steps)
}

/// A connection to the run's database, trying for up to 20 s (the run
/// may be restarting it).
async fn connect_retrying(url: &str) -> Result<PgConnection, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match PgConnection::connect(url).await {
            Ok(conn) => return Ok(conn),
            Err(e) if Instant::now() > deadline => return Err(format!("connect: {e}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// (Leases live now on the database's clock, attempts open.)
async fn in_flight(conn: &mut PgConnection) -> (i64, i64) {
    let live = sqlx::query_scalar(
        "SELECT count(*) FROM messages WHERE status = 'processing' AND lease_expires_at > now()",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap_or(-1);
    let open = sqlx::query_scalar("SELECT count(*) FROM attempts WHERE finished_at IS NULL")
        .fetch_one(&mut *conn)
        .await
        .unwrap_or(-1);
    (live, open)
}

/// Runs --switch-cmd once, --switch-after-ms into the load. False if it
/// failed.
async fn switch(run: Arc<Run>, load: Arc<Load>) -> bool {
    let Some(cmd) = &run.args.switch_cmd else {
        return true;
    };
    tokio::time::sleep(Duration::from_millis(run.args.switch_after_ms)).await;
    if let Ok(mut at) = load.switch_began.lock() {
        *at = Some(Instant::now());
    }
    println!("chaos: switching: {cmd}");
    let status = Command::new("sh").arg("-c").arg(cmd).status().await;
    if let Ok(mut at) = load.switched_at.lock() {
        *at = Some(Instant::now());
    }
    match status {
        Ok(s) if s.success() => true,
        other => {
            eprintln!("chaos: {cmd}: {other:?}");
            false
        }
    }
}

/// Every key once plus its duplicates, shuffled, `concurrency` at a time.
async fn send_load(run: &Arc<Run>, ports: &[u16], load: &Arc<Load>) {
    let mut requests: Vec<usize> = (0..run.args.keys)
        .flat_map(|k| std::iter::repeat_n(k, 1 + run.args.duplicates))
        .collect();
    requests.shuffle(&mut rand::rng());
    let permits = Arc::new(Semaphore::new(run.args.concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    let spread =
        Duration::from_secs(
            run.args
                .spread_secs
                .unwrap_or(if run.args.gateway { 30 } else { 0 }),
        );
    let (began, total) = (tokio::time::Instant::now(), requests.len().max(1));
    for (i, k) in requests.into_iter().enumerate() {
        if !spread.is_zero() {
            tokio::time::sleep_until(began + spread.mul_f64(i as f64 / total as f64)).await;
        }
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            break;
        };
        let run = Arc::clone(run);
        let ports = ports.to_vec();
        let load = Arc::clone(load);
        tasks.spawn(async move {
            let _permit = permit;
            if run.args.gateway {
                start_one(&run, &ports, k, &load).await;
            } else {
                send_one(&run, &ports, k, &load).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// Key `k`'s idempotency key.
fn key_of(k: usize) -> String {
    format!("CHAOS-{k:06}")
}

/// Key `k`'s recipient.
fn to_of(k: usize) -> String {
    format!("+1415555{:04}", k % 10_000)
}

/// Key `k`'s body: its own, so that what the provider created per (To,
/// Body) is per logical message.
fn body_of(k: usize) -> String {
    format!("chaos message {}", key_of(k))
}

/// Key `k`'s body over SMPP: as [`body_of`], except that every fifth is a
/// long UCS-2 message (three parts of at most 67 characters) and every
/// fifth a long GSM-7 one (two parts of at most 153).
fn smpp_body_of(k: usize) -> String {
    match k % 5 {
        1 => format!(
            "chaos message {} \u{2713} {}",
            key_of(k),
            "долгое сообщение ".repeat(9)
        ),
        3 => format!(
            "chaos message {} {}",
            key_of(k),
            "long gsm text ".repeat(15)
        ),
        _ => body_of(k),
    }
}

/// One request as a real client makes it: on a refused connection, a 5xx
/// or a 409, try again (maybe on another instance) until it gets an answer.
async fn send_one(run: &Run, ports: &[u16], k: usize, load: &Load) {
    let key = key_of(k);
    let body = serde_json::json!({
        "to": to_of(k),
        "body": run.body(k),
    });
    let deadline = Instant::now() + Duration::from_secs(run.args.client_deadline_secs);
    loop {
        let port = ports[rand::rng().random_range(0..ports.len())];
        let sent_at = Instant::now();
        let resp = run
            .client
            .post(format!("http://127.0.0.1:{port}/messages"))
            .bearer_auth(&run.api_key)
            .header("Idempotency-Key", &key)
            .json(&body)
            .send()
            .await;
        let status = resp.as_ref().map(|r| r.status().as_u16());
        load.tally(match &resp {
            Ok(r) => r.status().as_u16().to_string(),
            Err(e) if e.is_timeout() => "timeout".into(),
            Err(e) if e.is_connect() => "refused".into(),
            Err(_) => "cut".into(),
        });
        match status {
            Ok(201 | 202) => {
                if let Ok(mut a) = load.acknowledged.lock() {
                    a.insert(key.clone());
                }
                if let Ok(mut acks) = load.acks.lock() {
                    acks.push(Instant::now());
                }
                let switched = load.switched_at.lock().ok().and_then(|a| *a);
                if let Some(at) = switched.filter(|at| sent_at >= *at)
                    && let Ok(mut first) = load.first_ack_after_switch.lock()
                {
                    let took = Instant::now() - at;
                    *first = Some(first.map_or(took, |f| f.min(took)));
                }
                return;
            }
            Ok(422) => {
                load.reused.fetch_add(1, Ordering::SeqCst);
                return;
            }
            _ if Instant::now() > deadline => {
                load.gave_up.fetch_add(1, Ordering::SeqCst);
                return;
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Every instance up again for the rescue to finish.
async fn restart_missing(run: &Run, instances: &Mutex<Vec<Instance>>) -> usize {
    let mut list = instances.lock().await;
    let died = revive(run, &mut list).await;
    for (n, inst) in list.iter_mut().enumerate() {
        if inst.child.is_none() {
            inst.child = run.start_instance(inst.port, n).await.ok();
        }
    }
    died
}

/// Messages not final: `processing` or `scheduled` (-1 if the count fails).
async fn count_not_final(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM messages WHERE status IN ('processing', 'scheduled')")
        .fetch_one(conn)
        .await
        .unwrap_or(-1)
}

/// Waits (up to --settle-secs) for every message to be final, then reads
/// the messages' states and the mock's counts, and judges every key.
async fn settle(run: &Run, database_url: &str, load: &Load) -> Result<Outcome, String> {
    let mut db = connect_writable(database_url).await?;
    // A send whose provider shows nothing yet is asked again until its
    // retry deadline: never judged stuck before that has passed.
    let settle = Duration::from_secs(run.args.settle_secs)
        .max(run.args.retry_deadline() + Duration::from_secs(30));
    let settle_deadline = Instant::now() + settle;
    let mut stuck: i64;
    loop {
        stuck = count_not_final(&mut db).await;
        if stuck == 0 || Instant::now() > settle_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let by_status: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM messages GROUP BY status ORDER BY status")
            .fetch_all(&mut db)
            .await
            .map_err(|e| e.to_string())?;
    let rows: HashMap<String, String> =
        sqlx::query_as::<_, (String, String)>("SELECT idempotency_key, status FROM messages")
            .fetch_all(&mut db)
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .collect();
    let mut stats = serde_json::to_value(run.mock.stats()).map_err(|e| e.to_string())?;
    // With --provider smpp: every submit the SMSC reported, by destination.
    let submits = run.smsc.as_ref().map(Smsc::submits).unwrap_or_default();
    let by_provider: Vec<(String, i64)> = sqlx::query_as(
        "SELECT provider, count(*) FROM messages GROUP BY provider ORDER BY provider",
    )
    .fetch_all(&mut db)
    .await
    .map_err(|e| e.to_string())?;
    let failovers: i64 =
        sqlx::query_scalar("SELECT count(*) FROM message_events WHERE kind = 'failover'")
            .fetch_one(&mut db)
            .await
            .map_err(|e| e.to_string())?;
    let found_by_lookup: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT m.id) FROM messages m JOIN attempts a ON a.message_id = m.id \
         WHERE m.status IN ('sent', 'delivered') AND a.outcome IN ('ambiguous', 'reconciled') \
         AND a.number = m.attempts",
    )
    .fetch_one(&mut db)
    .await
    .map_err(|e| e.to_string())?;
    let acknowledged = load
        .acknowledged
        .lock()
        .map(|a| a.clone())
        .unwrap_or_default();
    let mut keys = Vec::with_capacity(run.args.keys);
    let mut matched = 0i64;
    for k in 0..run.args.keys {
        let key = key_of(k);
        let created = if run.smsc.is_some() {
            submits_to(&submits, &to_of(k)).map_or(0, |list| {
                smsc::created(&list.iter().collect::<Vec<_>>(), &run.body(k)).0
            })
        } else {
            run.mock.deliveries_to(&to_of(k), &body_of(k))
        };
        matched += i64::from(created);
        let verdict = judge(rows.get(&key).map(String::as_str), created, || {
            acknowledged.contains(&key)
        });
        keys.push((k, created, verdict));
    }
    let mut causes = Vec::new();
    if let Some(smsc) = &run.smsc {
        stats = smsc_stats(run, &submits, &keys);
        let closed = smsc.closed();
        let hits = run.hit_at.lock().map(|h| h.clone()).unwrap_or_default();
        for (k, _, verdict) in &keys {
            if !matches!(verdict, Verdict::Unknown { .. }) {
                continue;
            }
            let attempts = attempts_of(&mut db, &key_of(*k)).await?;
            let mine: Vec<&Submit> = submits_to(&submits, &to_of(*k))
                .map(|l| l.iter().collect())
                .unwrap_or_default();
            causes.push((*k, unknown_cause(&mine, &closed, &attempts, &hits)));
        }
    }
    let created_total = stats["created"].as_i64().unwrap_or(-1);
    Ok(Outcome {
        by_provider,
        failovers,
        found_by_lookup,
        load_secs: 0.0,
        hits: Hits::default(),
        steps: Vec::new(),
        stuck,
        statuses: by_status.into_iter().collect(),
        stored: rows.into_keys().collect(),
        stats,
        keys,
        unmatched: created_total - matched,
        drops: 0,
        causes,
    })
}

/// The submits made to `to` (E.164; on the wire without the `+`).
fn submits_to<'a>(submits: &'a HashMap<String, Vec<Submit>>, to: &str) -> Option<&'a Vec<Submit>> {
    submits.get(to.trim_start_matches('+'))
}

/// The SMSC's counts in the mock's words (`calls`, `created`,
/// `duplicate_recipient_bodies`, `duplicate_keys`), and its own: submits
/// taken, refused and left unanswered.
fn smsc_stats(
    run: &Run,
    submits: &HashMap<String, Vec<Submit>>,
    keys: &[(usize, u32, Verdict)],
) -> serde_json::Value {
    let all: Vec<&Submit> = submits.values().flatten().collect();
    // Every message created, a key's or not: a destination no key has
    // counts all it took as unmatched.
    let mut created = 0u64;
    for (dest, list) in submits {
        let k = dest
            .strip_prefix("1415555")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|k| *k < run.args.keys);
        let list: Vec<&Submit> = list.iter().collect();
        let (c, unmatched) = match k {
            Some(k) => smsc::created(&list, &run.body(k)),
            None => (0, list.iter().filter(|s| s.taken()).count() as u32),
        };
        created += u64::from(c) + u64::from(unmatched);
    }
    serde_json::json!({
        "calls": all.len(),
        "created": created,
        "duplicate_recipient_bodies": keys.iter().filter(|(_, c, _)| *c > 1).count(),
        "duplicate_keys": 0,
        "taken": all.iter().filter(|s| s.taken()).count(),
        "unanswered": all.iter().filter(|s| s.unanswered()).count(),
        "refused": all.iter().filter(|s| !s.taken()).count(),
        "parts": all.iter().filter(|s| s.udh.is_some()).count(),
        "binds": run.smsc.as_ref().map_or(0, Smsc::binds),
    })
}

/// One attempt as the cause of an `unknown` needs it: outcome, error, and
/// its start and end on this machine's wall clock (ms).
struct AttemptTimes {
    outcome: Option<String>,
    error: Option<String>,
    started: i64,
    finished: Option<i64>,
}

async fn attempts_of(db: &mut PgConnection, key: &str) -> Result<Vec<AttemptTimes>, String> {
    type Row = (Option<String>, Option<String>, i64, Option<i64>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT a.outcome, a.error, (extract(epoch FROM a.started_at) * 1000)::bigint, \
         (extract(epoch FROM a.finished_at) * 1000)::bigint \
         FROM attempts a JOIN messages m ON m.id = a.message_id \
         WHERE m.idempotency_key = $1 ORDER BY a.number",
    )
    .bind(key)
    .fetch_all(&mut *db)
    .await
    .map_err(|e| format!("attempts of {key}: {e}"))?;
    Ok(rows
        .into_iter()
        .map(|(outcome, error, started, finished)| AttemptTimes {
            outcome,
            error,
            started,
            finished,
        })
        .collect())
}

/// Why a key over SMPP ended `unknown`: the first cause found of those SMPP
/// allows (a submit cut off), or None. `submits` are those to its number,
/// `closed` when each SMSC session closed, `hits` when the run hit an
/// instance (all in ms on this machine's wall clock).
fn unknown_cause(
    submits: &[&Submit],
    closed: &HashMap<u64, i64>,
    attempts: &[AttemptTimes],
    hits: &[(i64, i64)],
) -> Option<&'static str> {
    /// A session that closed this soon after a submit on it (the 1 s
    /// response timeout and some slack) cut that submit off; later, the
    /// client had its answer or had given up on it.
    const CUT_MS: i64 = 1100;
    if submits.iter().any(|s| s.unanswered()) {
        return Some("the SMSC took a submit and never answered it");
    }
    if submits.iter().any(|s| {
        closed
            .get(&s.session)
            .is_some_and(|c| *c >= s.at_ms && *c - s.at_ms <= CUT_MS)
    }) {
        return Some(
            "its session closed within 1.1 s of its submit (an SMSC drop or an instance hit)",
        );
    }
    let outcome = |a: &AttemptTimes, o: &str| a.outcome.as_deref() == Some(o);
    if attempts.iter().any(|a| outcome(a, "lost")) {
        return Some("an attempt left open by an instance the run hit");
    }
    let ambiguous: Vec<&AttemptTimes> = attempts
        .iter()
        .filter(|a| outcome(a, "ambiguous"))
        .collect();
    // Our side saw its session drop, and the SMSC closed a session then: a
    // submit written but not yet read when the SMSC dropped every session
    // (the SMSC keeps no record of it), or a later part never written after
    // the first ones were taken. Both are cut off.
    const SLACK_MS: i64 = 200;
    if ambiguous.iter().any(|a| {
        let end = a.finished.unwrap_or(i64::MAX);
        a.error
            .as_deref()
            .is_some_and(|e| e.contains("session dropped"))
            && closed
                .values()
                .any(|c| *c >= a.started - SLACK_MS && *c <= end.saturating_add(SLACK_MS))
    }) {
        return Some("a session closed during its attempt, which saw its session drop");
    }
    if ambiguous.iter().any(|a| {
        let end = a.finished.unwrap_or(i64::MAX);
        hits.iter()
            .any(|(from, to)| a.started <= *to + 1000 && end >= *from)
    }) {
        return Some("a SIGKILL, SIGTERM or pause during its attempt");
    }
    let parts_cut = submits.iter().any(|s| {
        s.udh.is_some_and(|(r, _, part)| {
            !s.taken()
                && submits
                    .iter()
                    .any(|t| t.taken() && t.udh.is_some_and(|(r2, _, p2)| r2 == r && p2 < part))
        })
    });
    if parts_cut {
        return Some("a later part refused after earlier parts were taken");
    }
    if ambiguous.iter().any(|a| {
        a.error
            .as_deref()
            .is_some_and(|e| e.contains("no submit_sm_resp"))
            && a.finished.is_some_and(|f| f - a.started >= 900)
    }) {
        return Some("no submit_sm_resp within the 1 s timeout (a slow answer)");
    }
    None
}

/// One key's verdict from its final status (None: no row) and the messages
/// created for its (To, Body).
fn judge(status: Option<&str>, created: u32, acknowledged: impl Fn() -> bool) -> Verdict {
    match status {
        Some("processing" | "scheduled") => Verdict::Stuck,
        _ if created > 1 => Verdict::Duplicate,
        // Nothing stored: lost if acknowledged; a message created for a key
        // with no row is no answer anyone got.
        None if acknowledged() => Verdict::Lost,
        None if created > 0 => Verdict::FalseFinal,
        None => Verdict::Ok,
        Some("sent" | "delivered" | "undelivered") if created == 0 => Verdict::FalseFinal,
        Some("failed" | "canceled") if created > 0 => Verdict::FalseFinal,
        Some("unknown") => Verdict::Unknown { created },
        Some("sent" | "delivered" | "undelivered" | "failed" | "canceled") => Verdict::Ok,
        // A status this run does not know: not final as far as it can tell.
        Some(_) => Verdict::Stuck,
    }
}

/// A connection to the writable host of a (maybe multi-host) URL.
async fn connect_writable(url: &str) -> Result<PgConnection, String> {
    use sendonce::store::postgres::connect::{Targets, writable};
    use sqlx::ConnectOptions;
    let targets = Targets::parse(url).map_err(|e| e.to_string())?;
    for host in &targets.hosts {
        if let Ok(mut conn) = host.connect().await
            && writable(&mut conn).await.unwrap_or(false)
        {
            return Ok(conn);
        }
    }
    Err(format!("no writable host in {url}"))
}

/// Prints the counts; true if nothing is stuck, duplicated, lost, falsely
/// final, refused as a reused key or given up on.
fn report(run: &Run, load: &Load, o: &Outcome) -> bool {
    let acknowledged = load.acknowledged.lock().map(|a| a.len()).unwrap_or(0);
    let count = |v: Verdict| o.keys.iter().filter(|(_, _, x)| *x == v).count();
    let lost = count(Verdict::Lost);
    let false_finals = count(Verdict::FalseFinal);
    let stuck_keys = count(Verdict::Stuck);
    let unknown = |n: u32| count(Verdict::Unknown { created: n });
    let final_count: i64 = o
        .statuses
        .iter()
        .filter(|(s, _)| !matches!(s.as_str(), "processing" | "scheduled"))
        .map(|(_, n)| n)
        .sum();
    // Keys created more than once for their (To, Body), over both
    // protocols (each key has its own body), and the mock's own counts of
    // (To, Body) pairs and `http` keys created twice.
    let duplicates = count(Verdict::Duplicate).max(
        o.stats["duplicate_recipient_bodies"]
            .as_u64()
            .unwrap_or(u64::MAX)
            .max(o.stats["duplicate_keys"].as_u64().unwrap_or(u64::MAX)) as usize,
    );
    let max_created = o.keys.iter().map(|(_, c, _)| *c).max().unwrap_or(0);
    let creations = o.stats["created"].as_u64().unwrap_or(0);
    let reused = load.reused.load(Ordering::SeqCst);
    let gave_up = load.gave_up.load(Ordering::SeqCst);
    let stuck = o.stuck.max(stuck_keys as i64);
    let h = &o.hits;
    let stepped = o.steps.last().map_or(0, |s| s.offset);

    println!(
        "chaos: load took {:.1} s; {} SIGKILLs, {} SIGTERMs, {} pauses; {} clock steps (+{stepped} s); postgres restarted: {}",
        o.load_secs,
        h.sigkills,
        h.sigterms,
        h.pauses,
        o.steps.len(),
        h.pg_restarted
    );
    println!("provider:           {}", run.args.providers());
    println!("keys sent:          {}", run.args.keys);
    println!("keys acknowledged:  {acknowledged}");
    println!("keys accepted:      {}", o.stored.len());
    println!("keys final:         {final_count}  {:?}", o.statuses);
    println!("keys stuck:         {stuck}  (processing or scheduled after settling)");
    println!("keys lost:          {lost}  (acknowledged 201/202, no row)");
    println!(
        "false finals:       {false_finals}  (sent/delivered with nothing created, failed/canceled with a message created)"
    );
    println!(
        "unknown:            {}  ({} with nothing created, {} with one message created)",
        unknown(0) + unknown(1),
        unknown(0),
        unknown(1)
    );
    let unknown_keys: Vec<String> = o
        .keys
        .iter()
        .filter(|(_, _, v)| matches!(v, Verdict::Unknown { .. }))
        .take(5)
        .map(|(k, c, _)| format!("{} ({c} created)", key_of(*k)))
        .collect();
    if !unknown_keys.is_empty() {
        println!("unknown keys:       {}", unknown_keys.join(", "));
    }
    // Over SMPP an `unknown` must be a submit cut off: each one's cause.
    let mut by_cause: std::collections::BTreeMap<&str, usize> = Default::default();
    for (_, cause) in &o.causes {
        *by_cause.entry(cause.unwrap_or("NONE FOUND")).or_default() += 1;
    }
    let unexplained = by_cause.get("NONE FOUND").copied().unwrap_or(0);
    for (cause, n) in &by_cause {
        println!("unknown, cause:     {n}  {cause}");
    }
    if run.smsc.is_some() {
        println!(
            "SMSC drops:         {}  (every session destroyed at once)",
            o.drops
        );
        println!(
            "SMSC submits:       {} ({} parts of long messages): {} taken ({} never answered), {} refused; {} binds",
            o.stats["calls"],
            o.stats["parts"],
            o.stats["taken"],
            o.stats["unanswered"],
            o.stats["refused"],
            o.stats["binds"]
        );
    }
    println!("provider calls:     {}", o.stats["calls"]);
    if run.smsc.is_some() {
        println!(
            "creations:          {creations}  (messages the SMSC took: single submits, and long ones once per reference)"
        );
    } else {
        println!(
            "creations:          {creations}  (messages the mock created, over both protocols)"
        );
    }
    if o.unmatched != 0 {
        println!(
            "creations unmatched: {}  (no key's (To, Body))",
            o.unmatched
        );
    }
    println!("by provider:        {:?}", o.by_provider);
    println!("failovers:          {}", o.failovers);
    println!(
        "found by a lookup:  {}  (sent: the provider, asked after an ambiguous answer or a takeover, showed it)",
        o.found_by_lookup
    );
    println!("max sends per key:  {max_created}");
    println!(
        "duplicates:         {duplicates}  (keys created more than once, over both providers)"
    );
    print_clients(run, load, h, "requests with no 201/202");
    if h.slow_stops + h.unclean_stops + h.failed_signals > 0 {
        println!(
            "SIGTERM slow stops: {}  (still running {} s after SIGTERM); exits not 0: {}; signals not delivered: {}",
            h.slow_stops,
            TERM_WAIT.as_secs(),
            h.unclean_stops,
            h.failed_signals
        );
    }
    for (n, s) in o.steps.iter().enumerate() {
        println!(
            "clock step {}:       +{} s at {:.1} s (now() {:.1} s ahead), leases live {} -> {}, {} attempts open",
            n + 1,
            s.offset,
            s.at_secs,
            s.measured,
            s.live_before,
            s.live_after,
            s.open_attempts
        );
    }
    if run.args.switch_cmd.is_some() {
        let first = load.first_ack_after_switch.lock().ok().and_then(|f| *f);
        match first {
            Some(d) => println!(
                "switch to first ack: {:.2} s  (from the switch command's return to the first 201/202 to a request sent after it)",
                d.as_secs_f64()
            ),
            None => println!("switch to first ack: none"),
        }
        let switched = load.switch_began.lock().ok().and_then(|a| *a);
        let mut acks = load.acks.lock().map(|a| a.clone()).unwrap_or_default();
        acks.sort();
        let gap = switched.map(|at| {
            acks.windows(2)
                .filter(|w| w[1] >= at)
                .map(|w| w[1] - w[0].max(at))
                .max()
                .unwrap_or_default()
        });
        if let Some(gap) = gap {
            println!(
                "longest ack gap:    {:.2} s  (after the switch began: no request answered 201/202)",
                gap.as_secs_f64()
            );
        }
    }

    let ok = stuck == 0
        && unexplained == 0
        && duplicates == 0
        && lost == 0
        && false_finals == 0
        && o.unmatched == 0
        && reused == 0
        && gave_up == 0;
    println!(
        "chaos: summary: provider {}, {} keys; {} SIGKILLs, {} SIGTERMs, {} pauses, {} clock steps; {creations} creations; {duplicates} duplicates, {lost} lost, {stuck} stuck, {false_finals} false finals, {} unknown",
        run.args.providers(),
        run.args.keys,
        h.sigkills,
        h.sigterms,
        h.pauses,
        o.steps.len(),
        unknown(0) + unknown(1)
    );
    println!("chaos: {}", if ok { "PASS" } else { "FAIL" });
    ok
}

/// For each key that went wrong (a few of each kind): its row, attempts,
/// events, the calls the mock got for it and the instance log lines that
/// name it.
async fn explain(run: &Run, database_url: &str, o: &Outcome) {
    const PER_KIND: usize = 5;
    let mut shown: HashMap<&'static str, usize> = HashMap::new();
    let Ok(mut db) = connect_writable(database_url).await else {
        return;
    };
    let logs: Vec<(usize, String)> = (0..run.args.instances)
        .filter_map(|n| Some((n, std::fs::read_to_string(run.log_path(n)).ok()?)))
        .collect();
    for (k, created, verdict) in &o.keys {
        let kind = match verdict {
            Verdict::Duplicate => "duplicate",
            Verdict::Lost => "lost",
            Verdict::Stuck => "stuck",
            Verdict::FalseFinal => "false final",
            // Allowed, and shown: why nobody could tell; over SMPP the
            // ones with no cause found (what fails the run) first.
            Verdict::Unknown { .. }
                if o.causes.iter().any(|(c, cause)| c == k && cause.is_none()) =>
            {
                "unknown with no cause found"
            }
            Verdict::Unknown { .. } => "unknown",
            Verdict::Ok => continue,
        };
        let seen = shown.entry(kind).or_default();
        *seen += 1;
        if *seen > PER_KIND {
            continue;
        }
        let key = key_of(*k);
        println!(
            "chaos: {kind}: {key} (to {}, {created} created at the {})",
            to_of(*k),
            if run.smsc.is_some() { "SMSC" } else { "mock" }
        );
        let row: Option<(String, String)> = sqlx::query_as(
            "SELECT replace(id::text, '-', ''), format('status=%s attempts=%s maybe_sent=%s provider=%s provider_message_id=%s lease_owner=%s lease_expires_at=%s next_attempt_at=%s created_at=%s finalized_at=%s error=%s', \
             status, attempts, maybe_sent, provider, provider_message_id, lease_owner, lease_expires_at, next_attempt_at, created_at, finalized_at, error) \
             FROM messages WHERE idempotency_key = $1",
        )
        .bind(&key)
        .fetch_optional(&mut db)
        .await
        .ok()
        .flatten();
        let Some((id, row)) = row else {
            println!("  no row");
            continue;
        };
        println!("  message msg_{id}: {row}");
        let attempts: Vec<String> = sqlx::query_scalar(
            "SELECT format('attempt %s: owner=%s started=%s finished=%s outcome=%s http=%s code=%s provider=%s id=%s error=%s', \
             number, lease_owner, started_at, finished_at, outcome, http_status, provider_code, provider, provider_message_id, error) \
             FROM attempts WHERE replace(message_id::text, '-', '') = $1 ORDER BY number",
        )
        .bind(&id)
        .fetch_all(&mut db)
        .await
        .unwrap_or_default();
        for a in attempts {
            println!("  {a}");
        }
        let events: Vec<String> = sqlx::query_scalar(
            "SELECT format('event %s: %s %s -> %s: %s', at, kind, provider, to_provider, detail) \
             FROM message_events WHERE replace(message_id::text, '-', '') = $1 ORDER BY at",
        )
        .bind(&id)
        .fetch_all(&mut db)
        .await
        .unwrap_or_default();
        for e in events {
            println!("  {e}");
        }
        let (to, body) = (to_of(*k), run.body(*k));
        let calls = run.mock.calls();
        let mine: Vec<&testkit::mock_provider::Call> = calls
            .iter()
            .filter(|c| {
                let field = |a: &str, b: &str| {
                    c.body[a]
                        .as_str()
                        .or_else(|| c.body[b].as_str())
                        .unwrap_or_default()
                        .to_string()
                };
                // Infobip's JSON: the number without `+`, the text inside.
                let infobip = |p: &str| c.body.pointer(p).and_then(|v| v.as_str());
                (field("To", "to") == to && field("Body", "body") == body)
                    || (infobip("/messages/0/destinations/0/to") == Some(&to[1..])
                        && infobip("/messages/0/content/text") == Some(body.as_str()))
            })
            .collect();
        if let Some(smsc) = &run.smsc {
            let submits = smsc.submits();
            for sub in submits_to(&submits, &to).into_iter().flatten() {
                println!(
                    "  smsc: session {} at {} ms: udh {:?} answer {} ({} chars; session closed at {:?})",
                    sub.session,
                    sub.at_ms,
                    sub.udh,
                    sub.answer,
                    sub.text.chars().count(),
                    smsc.closed().get(&sub.session)
                );
            }
        }
        println!(
            "  mock: {} calls for it ({} twilio, {} http)",
            mine.len(),
            mine.iter().filter(|c| c.endpoint == "twilio").count(),
            mine.iter().filter(|c| c.endpoint == "http").count()
        );
        let needle = format!("msg_{id}");
        for (n, text) in &logs {
            for line in text
                .lines()
                .filter(|l| l.contains(&needle) || l.contains(&key))
                .take(40)
            {
                println!("  instance-{n}.log: {line}");
            }
        }
    }
}

/// The report's lines on the clients (retries refused, given up on, every
/// answer) and on instances that died by themselves; `gave_up`: what a
/// client that gave up had not got.
fn print_clients(run: &Run, load: &Load, h: &Hits, gave_up: &str) {
    println!("422 on a retry:     {}", load.reused.load(Ordering::SeqCst));
    println!(
        "clients gave up:    {}  ({gave_up} within {} s)",
        load.gave_up.load(Ordering::SeqCst),
        run.args.client_deadline_secs
    );
    if let Ok(answers) = load.answers.lock() {
        println!("client answers:     {answers:?}  (every try)");
    }
    if h.died > 0 {
        println!(
            "instances died:     {}  (exited by themselves, started again: see their logs)",
            h.died
        );
    }
}

// --gateway: verifications whose first channel is the Telegram Gateway.

/// The text of a verification's SMS (the service's default template).
const SMS_TEMPLATE_PREFIX: &str = "Your verification code is ";

/// One start as a real client makes it (as [`send_one`]): on a refused
/// connection, a timeout, a 5xx, a 409 or a 429, try again (maybe on another
/// instance) until a 201 comes back; each 201's verification id is noted.
async fn start_one(run: &Run, ports: &[u16], k: usize, load: &Load) {
    let key = key_of(k);
    let body = serde_json::json!({
        "to": to_of(k),
        "channels": run.args.channel_list(),
        "fallback_after_seconds": run.args.fallback_after_secs,
        "ttl_seconds": run.args.ttl_secs,
    });
    let deadline = Instant::now() + Duration::from_secs(run.args.client_deadline_secs);
    loop {
        let port = ports[rand::rng().random_range(0..ports.len())];
        let resp = run
            .client
            .post(format!("http://127.0.0.1:{port}/verifications"))
            .bearer_auth(&run.api_key)
            .header("Idempotency-Key", &key)
            .json(&body)
            .send()
            .await;
        load.tally(match &resp {
            Ok(r) => r.status().as_u16().to_string(),
            Err(e) if e.is_timeout() => "timeout".into(),
            Err(e) if e.is_connect() => "refused".into(),
            Err(_) => "cut".into(),
        });
        let status = resp.as_ref().map_or(0, |r| r.status().as_u16());
        match (status, resp) {
            (201, Ok(r)) => {
                // An answer cut in its body is no answer: asked again.
                let id = r
                    .json::<serde_json::Value>()
                    .await
                    .ok()
                    .and_then(|v| v["id"].as_str().map(str::to_string));
                if let Some(id) = id {
                    if let Ok(mut v) = load.verifications.lock() {
                        v.entry(k).or_default().push(id.clone());
                    }
                    if let Ok(mut f) = load.first_ack.lock() {
                        f.entry(k).or_insert_with(Instant::now);
                    }
                    if let Ok(mut a) = load.acknowledged.lock() {
                        a.insert(key.clone());
                    }
                    if canceled_key(run, k) {
                        cancel_one(run, ports, k, &id, load).await;
                    }
                    return;
                }
            }
            (409 | 429, _) | (500..=599, _) | (0, _) => {}
            (other, r) => {
                let text = match r {
                    Ok(r) => r.text().await.unwrap_or_default(),
                    Err(e) => e.to_string(),
                };
                if other == 422 {
                    load.reused.fetch_add(1, Ordering::SeqCst);
                }
                if let Ok(mut f) = load.refused.lock() {
                    f.push((
                        k,
                        format!("{other}: {}", text.chars().take(300).collect::<String>()),
                    ));
                }
                return;
            }
        }
        if Instant::now() > deadline {
            load.gave_up.fetch_add(1, Ordering::SeqCst);
            if let Ok(mut f) = load.refused.lock() {
                f.push((k, "given up on".into()));
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether key `k`'s verification is one --gateway-cancels cancels (the
/// same keys every run of the same size).
fn canceled_key(run: &Run, k: usize) -> bool {
    let share = run.args.gateway_cancels;
    share > 0.0 && ((k as f64 * 0.618_033_988_7).fract() < share)
}

/// Cancels verification `id` (key `k`) at a random moment of its first
/// --fallback-after-secs + 2 s, as a client would: tried again (maybe on
/// another instance) until an instance answers; the moment a 200 came
/// back is noted. A 409 (it ended otherwise first) is noted as no cancel.
async fn cancel_one(run: &Run, ports: &[u16], k: usize, id: &str, load: &Load) {
    let window = Duration::from_secs(run.args.fallback_after_secs + 2);
    let wait = Duration::from_millis(
        rand::rng().random_range(0..=u64::try_from(window.as_millis()).unwrap_or(0)),
    );
    tokio::time::sleep(wait).await;
    let deadline = Instant::now() + Duration::from_secs(run.args.client_deadline_secs);
    loop {
        let port = ports[rand::rng().random_range(0..ports.len())];
        let status = run
            .client
            .post(format!("http://127.0.0.1:{port}/verifications/{id}/cancel"))
            .bearer_auth(&run.api_key)
            .json(&serde_json::json!({}))
            .send()
            .await
            .map_or(0, |r| r.status().as_u16());
        match status {
            200 => {
                if let Ok(mut c) = load.canceled.lock() {
                    c.entry(k)
                        .or_insert_with(|| (SystemTime::now(), Instant::now()));
                }
                return;
            }
            409 => return,
            _ if Instant::now() > deadline => return,
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// With --gateway, while the run goes on: every 20 ms, how many calls the
/// mock took and Gateway messages it made (see [`Load::not_before`]).
async fn sample_mock(run: Arc<Run>, load: Arc<Load>, done: Arc<AtomicBool>) {
    if !run.args.gateway {
        return;
    }
    // Until well after the load: the settling fallbacks are judged too.
    let mut after_done: Option<Instant> = None;
    loop {
        let sample = (
            Instant::now(),
            run.mock.calls().len(),
            run.mock.gateway_messages().len(),
        );
        if let Ok(mut s) = load.samples.lock() {
            s.push(sample);
        }
        if done.load(Ordering::SeqCst) {
            let since = *after_done.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(run.args.settle_secs) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A verification as `GET /verifications/{id}` answers it, in the parts
/// the run judges.
#[derive(Clone, Debug, Default)]
struct VerView {
    status: String,
    /// (channel, status, idempotency key, message id) of each message.
    messages: Vec<(String, String, String, String)>,
    raw: serde_json::Value,
}

impl VerView {
    fn of(raw: serde_json::Value) -> Self {
        let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        let messages = raw["messages"]
            .as_array()
            .map(|list| {
                list.iter()
                    .map(|m| {
                        (
                            s(&m["channel"]),
                            s(&m["status"]),
                            s(&m["idempotency_key"]),
                            s(&m["id"]),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            status: s(&raw["status"]),
            messages,
            raw,
        }
    }

    fn on(&self, channel: &str) -> Vec<&(String, String, String, String)> {
        self.messages.iter().filter(|m| m.0 == channel).collect()
    }

    /// Every message final.
    fn all_final(&self) -> bool {
        self.messages
            .iter()
            .all(|m| !matches!(m.1.as_str(), "processing" | "scheduled" | "queued"))
    }

    /// Nothing more to come: every message final, and a message delivered
    /// or its one SMS sent (or the verification canceled).
    fn settled(&self) -> bool {
        let delivered = self.messages.iter().any(|m| m.1 == "delivered");
        self.all_final()
            && !self.messages.is_empty()
            && (delivered || self.on("sms").len() == 1 || self.status == "canceled")
    }
}

/// `GET /verifications/{id}` on any instance, tried for up to 10 s.
async fn fetch_verification(run: &Run, ports: &[u16], id: &str) -> Option<VerView> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let port = ports[rand::rng().random_range(0..ports.len())];
        let resp = run
            .client
            .get(format!("http://127.0.0.1:{port}/verifications/{id}"))
            .bearer_auth(&run.api_key)
            .send()
            .await;
        if let Ok(r) = resp
            && r.status().as_u16() == 200
            && let Ok(v) = r.json::<serde_json::Value>().await
        {
            return Some(VerView::of(v));
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The Gateway's API token the instances are given.
const GATEWAY_TOKEN: &str = "chaos-gateway-token";

/// The WhatsApp phone number id and Meta app secret the instances are given.
const WHATSAPP_PHONE_NUMBER_ID: &str = "100200300400500";
const WHATSAPP_APP_SECRET: &str = "chaos-whatsapp-app-secret";

/// With --gateway, while the load runs: every 100 ms, each new Gateway
/// message still `sent` at the mock is picked with --gateway-delivered's
/// odds (once), set `delivered` and its signed report posted to a random
/// instance, again on every tick until one answers 200 (instances are
/// being killed); the request ids answered 200 are noted in `load`.
async fn report_deliveries(run: Arc<Run>, ports: Vec<u16>, load: Arc<Load>, done: Arc<AtomicBool>) {
    if !run.args.gateway || run.args.gateway_delivered <= 0.0 {
        return;
    }
    let mut seen: HashSet<String> = HashSet::new();
    let mut due: Vec<String> = Vec::new();
    while !done.load(Ordering::SeqCst) {
        for m in run.mock.gateway_messages() {
            if seen.insert(m.request_id.clone())
                && m.status == "sent"
                && rand::rng().random_bool(run.args.gateway_delivered)
            {
                run.mock.gateway_set_status(&m.request_id, "delivered");
                due.push(m.request_id);
            }
        }
        let mut left = Vec::new();
        for id in due {
            let Some(status) = run.mock.gateway_report_of(&id) else {
                continue;
            };
            let at = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            let (body, signature) =
                testkit::providers::telegram_gateway::gateway_report(GATEWAY_TOKEN, at, &status);
            let port = ports[rand::rng().random_range(0..ports.len())];
            let answered = run
                .client
                .post(format!(
                    "http://127.0.0.1:{port}/channels/telegram/gateway/reports"
                ))
                .header("X-Request-Timestamp", at.to_string())
                .header("X-Request-Signature", signature)
                .header("Content-Type", "application/json")
                .body(body)
                .send()
                .await
                .map_or(0, |r| r.status().as_u16());
            if answered == 200 {
                if let Ok(mut r) = load.reported_at.lock() {
                    r.entry(id.clone()).or_insert_with(SystemTime::now);
                }
                if let Ok(mut r) = load.reported.lock() {
                    r.insert(id);
                }
            } else {
                left.push(id);
            }
        }
        due = left;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// With --channels whatsapp,..., while the load runs: every 100 ms, each
/// new WhatsApp message at the mock is given a status with the odds of
/// --whatsapp-delivered, --whatsapp-read and --whatsapp-failed (once), due
/// after a delay drawn up to 1.5 x --fallback-after-secs (so that some come
/// after the move on); when due, its signed notification (every status up
/// to it, as Meta posts them) goes to a random instance, again on every
/// tick until one answers 200 (instances are being killed); the wamids
/// answered 200 are noted in `load`.
async fn report_whatsapp(run: Arc<Run>, ports: Vec<u16>, load: Arc<Load>, done: Arc<AtomicBool>) {
    use testkit::providers::whatsapp::{notification, signature, status};
    if !run.args.whatsapp() {
        return;
    }
    let a = &run.args;
    let max_delay = a.fallback_after_secs * 1500;
    let mut seen: HashSet<String> = HashSet::new();
    let mut due: Vec<(
        Instant,
        &'static str,
        testkit::providers::whatsapp::WhatsAppMessage,
    )> = Vec::new();
    while !done.load(Ordering::SeqCst) {
        for m in run.mock.whatsapp_messages() {
            if !seen.insert(m.id.clone()) {
                continue;
            }
            let draw: f64 = rand::rng().random_range(0.0..1.0);
            let word = if draw < a.whatsapp_delivered {
                "delivered"
            } else if draw < a.whatsapp_delivered + a.whatsapp_read {
                "read"
            } else if draw < a.whatsapp_delivered + a.whatsapp_read + a.whatsapp_failed {
                "failed"
            } else {
                continue;
            };
            if let Ok(mut o) = load.whatsapp_outcome.lock() {
                o.insert(m.id.clone(), word);
            }
            let delay = Duration::from_millis(rand::rng().random_range(0..=max_delay));
            due.push((Instant::now() + delay, word, m));
        }
        let mut left = Vec::new();
        for (at, word, m) in due {
            if at > Instant::now() {
                left.push((at, word, m));
                continue;
            }
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            let words: &[&str] = match word {
                "delivered" => &["sent", "delivered"],
                "read" => &["sent", "delivered", "read"],
                _ => &["sent", "failed"],
            };
            let statuses = words
                .iter()
                .zip(0..)
                .map(|(w, i)| status(&m, w, now + i))
                .collect();
            let body = notification(statuses).to_string();
            let port = ports[rand::rng().random_range(0..ports.len())];
            let answered = run
                .client
                .post(format!("http://127.0.0.1:{port}/channels/whatsapp/webhook"))
                // A paused instance must not hold the other statuses back.
                .timeout(Duration::from_secs(1))
                .header(
                    "X-Hub-Signature-256",
                    signature(WHATSAPP_APP_SECRET, body.as_bytes()),
                )
                .header("Content-Type", "application/json")
                .body(body)
                .send()
                .await
                .map_or(0, |r| r.status().as_u16());
            if answered == 200 {
                if let Ok(mut r) = load.reported_at.lock() {
                    r.entry(m.id.clone()).or_insert_with(SystemTime::now);
                }
                if let Ok(mut r) = load.reported.lock() {
                    r.insert(m.id);
                }
            } else {
                left.push((at, word, m));
            }
        }
        due = left;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The views of `ids` (key, verification id), `concurrency` at a time.
async fn fetch_all(
    run: &Arc<Run>,
    ports: &[u16],
    ids: Vec<(usize, String)>,
) -> Vec<(usize, Option<VerView>)> {
    let permits = Arc::new(Semaphore::new(run.args.concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for (k, id) in ids {
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            break;
        };
        let (run, ports) = (Arc::clone(run), ports.to_vec());
        tasks.spawn(async move {
            let _permit = permit;
            (k, fetch_verification(&run, &ports, &id).await)
        });
    }
    let mut out = Vec::new();
    while let Some(r) = tasks.join_next().await {
        if let Ok(r) = r {
            out.push(r);
        }
    }
    out
}

/// What the mock created for one phone.
#[derive(Default)]
struct Created {
    /// `checkSendAbility` calls made after the phone's first SMS request
    /// (a Telegram send still being checked must end with the fallback).
    checks_after_sms: usize,
    /// Gateway messages: (code, request id, status at the mock).
    telegram: Vec<(String, String, String)>,
    /// WhatsApp messages: (code, wamid).
    whatsapp: Vec<(String, String)>,
    /// SMS created, per body.
    sms: Vec<(String, u32)>,
}

impl Created {
    fn sms_count(&self) -> u32 {
        self.sms.iter().map(|(_, n)| n).sum()
    }

    fn total(&self) -> u32 {
        (self.telegram.len() + self.whatsapp.len()) as u32 + self.sms_count()
    }

    /// The codes the phone got, over every channel (an SMS whose text is
    /// not the template's counts as a code of its own).
    fn codes(&self) -> std::collections::BTreeSet<String> {
        self.telegram
            .iter()
            .map(|(c, _, _)| c.clone())
            .chain(self.whatsapp.iter().map(|(c, _)| c.clone()))
            .chain(self.sms.iter().filter(|(_, n)| *n > 0).map(|(b, _)| {
                b.strip_prefix(SMS_TEMPLATE_PREFIX)
                    .map_or_else(|| format!("(text {b:?})"), str::to_string)
            }))
            .collect()
    }
}

fn digits(phone: &str) -> &str {
    phone.trim_start_matches('+')
}

/// What the mock created, per phone (digits only).
fn created_by_phone(run: &Run) -> HashMap<String, Created> {
    let mut by: HashMap<String, Created> = HashMap::new();
    for m in run.mock.gateway_messages() {
        by.entry(digits(&m.phone_number).to_string())
            .or_default()
            .telegram
            .push((
                m.code.clone().unwrap_or_default(),
                m.request_id.clone(),
                m.status.clone(),
            ));
    }
    for m in run.mock.whatsapp_messages() {
        by.entry(digits(&m.to).to_string())
            .or_default()
            .whatsapp
            .push((m.code.clone(), m.id.clone()));
    }
    let mut bodies: HashSet<(String, String)> = HashSet::new();
    let mut first_sms: HashMap<String, usize> = HashMap::new();
    for (i, c) in run.mock.calls().into_iter().enumerate() {
        if c.endpoint == "telegram_gateway" || c.endpoint == "whatsapp" {
            continue;
        }
        let field = |a: &str, b: &str| {
            c.body[a]
                .as_str()
                .or_else(|| c.body[b].as_str())
                .unwrap_or_default()
                .to_string()
        };
        first_sms
            .entry(digits(&field("To", "to")).to_string())
            .or_insert(i);
        bodies.insert((field("To", "to"), field("Body", "body")));
    }
    for (phone, before) in run.mock.gateway_checks_placed() {
        let phone = digits(&phone).to_string();
        if first_sms.get(&phone).is_some_and(|first| before > *first) {
            by.entry(phone).or_default().checks_after_sms += 1;
        }
    }
    for (to, body) in bodies {
        let n = run.mock.deliveries_to(&to, &body);
        if n > 0 {
            by.entry(digits(&to).to_string())
                .or_default()
                .sms
                .push((body, n));
        }
    }
    by
}

/// Whether message `key` was written (its row inserted) after `at`: its
/// `created_at`, on the same host's clock as `at`.
async fn written_after(db: &mut PgConnection, key: &str, at: SystemTime) -> bool {
    let created: Option<f64> = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM created_at)::float8 FROM messages WHERE idempotency_key = $1",
    )
    .bind(key)
    .fetch_optional(db)
    .await
    .ok()
    .flatten();
    let at = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    created.is_some_and(|c| c > at)
}

/// With --gateway, after the load: waits (up to --settle-secs) for every
/// verification to be settled, every message final in the database and the
/// mock idle, then judges every key, prints the report and explains the
/// keys that went wrong. True if none did.
async fn gateway_settle(
    run: &Arc<Run>,
    ports: &[u16],
    database_url: &str,
    load: &Load,
    load_secs: f64,
    hits: Hits,
) -> Result<bool, String> {
    let mut db = connect_writable(database_url).await?;
    let ids: HashMap<usize, Vec<String>> = load
        .verifications
        .lock()
        .map(|v| v.clone())
        .unwrap_or_default();
    let first_ack: HashMap<usize, Instant> =
        load.first_ack.lock().map(|f| f.clone()).unwrap_or_default();
    let settle_started = Instant::now();
    // A message the provider cannot tell about yet is asked again until
    // its verification expires: never judged stuck before the last expiry
    // (and --settle-secs after the load in any case).
    let last_expiry = first_ack
        .values()
        .max()
        .map(|at| *at + Duration::from_secs(run.args.ttl_secs + 30));
    let deadline = (settle_started + Duration::from_secs(run.args.settle_secs))
        .max(last_expiry.unwrap_or(settle_started));
    let mut views: HashMap<usize, VerView> = HashMap::new();
    let mut not_final;
    loop {
        let pending: Vec<(usize, String)> = ids
            .iter()
            .filter(|(k, _)| !views.get(k).is_some_and(VerView::settled))
            .filter_map(|(k, list)| Some((*k, list.first()?.clone())))
            .collect();
        for (k, view) in fetch_all(run, ports, pending).await {
            if let Some(view) = view {
                views.insert(k, view);
            }
        }
        not_final = count_not_final(&mut db).await;
        let unsettled = ids
            .keys()
            .filter(|k| !views.get(k).is_some_and(VerView::settled))
            .count();
        if (unsettled == 0 && not_final == 0 && run.mock.busy() == 0) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let settle_secs = settle_started.elapsed().as_secs_f64();
    // The last word on every verification, and what the mock created.
    let all: Vec<(usize, String)> = ids
        .iter()
        .filter_map(|(k, list)| Some((*k, list.first()?.clone())))
        .collect();
    for (k, view) in fetch_all(run, ports, all).await {
        if let Some(view) = view {
            views.insert(k, view);
        }
    }
    let not_final_after = count_not_final(&mut db).await;
    let created = created_by_phone(run);
    let stats = run.mock.stats();
    let refused: Vec<(usize, String)> = load.refused.lock().map(|r| r.clone()).unwrap_or_default();
    let reported: HashSet<String> = load.reported.lock().map(|r| r.clone()).unwrap_or_default();
    let reported_at: HashMap<String, SystemTime> = load
        .reported_at
        .lock()
        .map(|r| r.clone())
        .unwrap_or_default();
    let canceled: HashMap<usize, (SystemTime, Instant)> =
        load.canceled.lock().map(|c| c.clone()).unwrap_or_default();
    // Every send the mock took (a Gateway send or an SMS), and every
    // Gateway message it made, per phone, by place in its lists.
    let mut sends_of: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, c) in run.mock.calls().into_iter().enumerate() {
        let to = c.body["phone_number"]
            .as_str()
            .or_else(|| c.body["to"].as_str())
            .or_else(|| c.body["To"].as_str())
            .unwrap_or_default();
        sends_of.entry(digits(to).to_string()).or_default().push(i);
    }
    let mut gateway_of: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, m) in run.mock.gateway_messages().into_iter().enumerate() {
        gateway_of
            .entry(digits(&m.phone_number).to_string())
            .or_default()
            .push(i);
    }
    let cancel_slack = Duration::from_secs(1);
    let wa_outcome: HashMap<String, &'static str> = load
        .whatsapp_outcome
        .lock()
        .map(|o| o.clone())
        .unwrap_or_default();
    // With WhatsApp first: verifications whose code went on WhatsApp and a
    // later channel, by what the WhatsApp message was given (counted, not
    // failed: see 7b).
    let (mut wa_two_delivered, mut wa_two_after_failure, mut wa_two_after_silence) =
        (0usize, 0usize, 0usize);

    // Judge every key: its problems, by kind.
    let mut problems: Vec<(usize, &'static str, String)> = Vec::new();
    let mut matched = 0u32;
    let mut unknown = 0usize;
    let mut in_window = 0usize;
    let mut hist: std::collections::BTreeMap<String, usize> = Default::default();
    for k in 0..run.args.keys {
        let mut bad = |kind: &'static str, what: String| problems.push((k, kind, what));
        let to = to_of(k);
        let made = created.get(digits(&to));
        let empty = Created::default();
        let made = made.unwrap_or(&empty);
        matched += made.total();
        // 1. One verification per key.
        let mine = ids.get(&k).cloned().unwrap_or_default();
        let distinct: HashSet<&String> = mine.iter().collect();
        if mine.is_empty() {
            let why = refused
                .iter()
                .filter(|(r, _)| *r == k)
                .map(|(_, w)| w.as_str())
                .collect::<Vec<_>>()
                .join("; ");
            bad("no 201", why);
        } else if distinct.len() > 1 {
            bad("ids differ", format!("{mine:?}"));
        }
        // 2. One code per verification, each created once per channel.
        let codes = made.codes();
        if codes.len() > 1 {
            bad("more than one code", format!("{codes:?}"));
        }
        if made.telegram.len() > 1 {
            bad(
                "telegram duplicate",
                format!(
                    "{} Gateway messages: {:?}",
                    made.telegram.len(),
                    made.telegram
                ),
            );
        }
        if made.checks_after_sms > 0 {
            bad(
                "telegram after sms",
                format!(
                    "{} checkSendAbility calls after the SMS went",
                    made.checks_after_sms
                ),
            );
        }
        if made.sms_count() > 1 {
            bad(
                "sms duplicate",
                format!("{} SMS created: {:?}", made.sms_count(), made.sms),
            );
        }
        if mine.is_empty() {
            if made.total() > 0 {
                bad(
                    "false final",
                    format!("no verification, {} created", made.total()),
                );
            }
            continue;
        }
        // 3. Nothing stuck; 4. no false final.
        let Some(view) = views.get(&k) else {
            bad("stuck", "GET /verifications/{id} never answered".into());
            continue;
        };
        *hist
            .entry(format!("verification {}", view.status))
            .or_default() += 1;
        for m in &view.messages {
            *hist.entry(format!("{} {}", m.0, m.1)).or_default() += 1;
        }
        if !view.all_final() {
            bad("stuck", format!("a message not final: {:?}", view.messages));
        }
        let telegram = view.on("telegram");
        let sms = view.on("sms");
        let whatsapp = view.on("whatsapp");
        let was_canceled = canceled.get(&k).copied();
        let ended = was_canceled.is_some() || view.status == "canceled";
        // 2b. WhatsApp first: one message, created once, none false.
        // Delivered as the service knows it: its status, or a delivered or
        // read status it answered 200 for (a send that ended `unknown`
        // keeps its status, and the report still stops the next steps).
        let wa_delivered = whatsapp.iter().any(|m| m.1 == "delivered")
            || made.whatsapp.iter().any(|(_, wamid)| {
                reported.contains(wamid)
                    && matches!(wa_outcome.get(wamid).copied(), Some("delivered" | "read"))
            });
        if run.args.whatsapp() {
            if made.whatsapp.len() > 1 {
                bad(
                    "whatsapp duplicate",
                    format!(
                        "{} WhatsApp messages: {:?}",
                        made.whatsapp.len(),
                        made.whatsapp
                    ),
                );
            }
            match whatsapp.as_slice() {
                [] => bad("stuck", "no WhatsApp message".into()),
                [(_, status, _, _)] => match status.as_str() {
                    "failed" | "canceled" if !made.whatsapp.is_empty() => bad(
                        "false final",
                        format!("WhatsApp message {status}, created at the mock"),
                    ),
                    "sent" | "delivered" | "undelivered" if made.whatsapp.is_empty() => bad(
                        "false final",
                        format!("WhatsApp message {status}, nothing created at the mock"),
                    ),
                    "unknown" => unknown += 1,
                    _ => {}
                },
                more => bad(
                    "whatsapp duplicate",
                    format!("{} WhatsApp messages", more.len()),
                ),
            }
            // 5. A status answered 200 is never lost: delivered or read
            // makes a sent message delivered, failed makes it undelivered;
            // on a message that ended unknown (receipts move only a `sent`
            // message) it shows as its `delivery_report`.
            for (_, wamid) in &made.whatsapp {
                let Some(word) = wa_outcome.get(wamid).filter(|_| reported.contains(wamid)) else {
                    continue;
                };
                let want = if *word == "failed" {
                    "undelivered"
                } else {
                    "delivered"
                };
                let shown = view.raw["messages"].as_array().is_some_and(|list| {
                    list.iter().any(|m| {
                        m["channel"] == "whatsapp" && m["delivery_report"].as_str() == Some(*word)
                    })
                });
                if !shown && !whatsapp.iter().any(|m| m.1 == want) {
                    bad(
                        "report lost",
                        format!("{word} reported (200), the WhatsApp message {whatsapp:?}"),
                    );
                }
            }
            // 7b. No later step written after a delivered/read status the
            // instance had answered 200 (it had recorded it before).
            for (_, wamid) in &made.whatsapp {
                if !wa_outcome
                    .get(wamid)
                    .is_some_and(|w| matches!(*w, "delivered" | "read"))
                {
                    continue;
                }
                let Some(at) = reported_at.get(wamid) else {
                    continue;
                };
                for (_, _, key, _) in telegram.iter().chain(sms.iter()) {
                    if written_after(&mut db, key, *at).await {
                        bad(
                            "step after a delivery report",
                            format!(
                                "{key} written after {wamid}'s {} status was answered 200 at {}",
                                wa_outcome[wamid],
                                utc(*at)
                            ),
                        );
                    }
                }
            }
            // The code on two channels: counted (the documented rule lets
            // a silent WhatsApp message, which cannot be withdrawn, be
            // followed by the next channel), failed only by 7b above.
            let later = made.telegram.len() + made.sms_count() as usize;
            if !made.whatsapp.is_empty() && later > 0 {
                let words: Vec<&str> = made
                    .whatsapp
                    .iter()
                    .filter_map(|(_, id)| wa_outcome.get(id).copied())
                    .collect();
                if words.iter().any(|w| matches!(*w, "delivered" | "read")) {
                    wa_two_delivered += 1;
                } else if words.contains(&"failed") {
                    wa_two_after_failure += 1;
                } else {
                    wa_two_after_silence += 1;
                }
            }
        }
        match telegram.as_slice() {
            [] if run.args.whatsapp() && (wa_delivered || ended) => {}
            [] if run.args.whatsapp() && view.status == "expired" => bad(
                "no next step before expiry",
                "no Telegram message: the verification expired first".into(),
            ),
            [] if run.args.whatsapp()
                && first_ack.get(&k).is_some_and(|at| {
                    at.elapsed() < Duration::from_secs(run.args.fallback_after_secs)
                }) =>
            {
                in_window += 1;
            }
            [] => bad("stuck", "no Telegram message".into()),
            [(_, status, _, _)] => match status.as_str() {
                "failed" | "canceled" if !made.telegram.is_empty() => bad(
                    "false final",
                    format!("Telegram message {status}, created at the Gateway"),
                ),
                "sent" | "delivered" if made.telegram.is_empty() => bad(
                    "false final",
                    format!("Telegram message {status}, nothing created at the Gateway"),
                ),
                "unknown" => unknown += 1,
                _ => {}
            },
            more => bad(
                "telegram duplicate",
                format!("{} Telegram messages", more.len()),
            ),
        }
        let delivered = telegram.iter().any(|m| m.1 == "delivered") || wa_delivered;
        // 6. Nothing sent after the verification ended: no send reached
        // the mock, no Gateway message was made, later than a second
        // after the cancel was answered (a call already under way when it
        // committed may land just after), and no SMS was written after it.
        if let Some((ended_wall, ended_at)) = was_canceled {
            let phone = digits(&to);
            let late = |nth: &usize, calls: bool| {
                load.not_before(*nth, calls)
                    .is_some_and(|at| at > ended_at + cancel_slack)
            };
            let late_sends = sends_of
                .get(phone)
                .map_or(0, |l| l.iter().filter(|i| late(i, true)).count());
            let late_messages = gateway_of
                .get(phone)
                .map_or(0, |l| l.iter().filter(|i| late(i, false)).count());
            if late_sends + late_messages > 0 {
                bad(
                    "sent after end",
                    format!(
                        "{late_sends} sends, {late_messages} Gateway messages after the cancel was answered"
                    ),
                );
            }
            // (With WhatsApp first, the Telegram message is a later step.)
            let later_telegram = if run.args.whatsapp() {
                &telegram[..]
            } else {
                &[]
            };
            for (channel, _, key, _) in later_telegram.iter().chain(sms.iter()) {
                if written_after(&mut db, key, ended_wall).await {
                    bad(
                        "sent after end",
                        format!("the {channel} message {key} written after the cancel"),
                    );
                }
            }
        }
        // 7. One channel at a time: no SMS written after the Telegram
        // message's delivery report was answered 200, and no phone with
        // the code on both channels (a Telegram message delivered at the
        // Gateway and an SMS made: the fallback revokes, then asks).
        for (_, id, _) in &made.telegram {
            let Some(at) = reported_at.get(id) else {
                continue;
            };
            for (_, _, key, _) in &sms {
                if written_after(&mut db, key, *at).await {
                    bad(
                        "sms after a delivery report",
                        format!("the SMS {key} written after {id}'s report was answered 200"),
                    );
                }
            }
        }
        let reached = made
            .telegram
            .iter()
            .any(|(_, _, status)| matches!(status.as_str(), "delivered" | "read"));
        if reached && made.sms_count() > 0 {
            bad(
                "both channels",
                format!(
                    "the Telegram message {:?} reached the phone and {} SMS were made",
                    made.telegram,
                    made.sms_count()
                ),
            );
        }
        // 5. A delivery report answered 200 is never lost.
        if !delivered && made.telegram.iter().any(|(_, id, _)| reported.contains(id)) {
            bad(
                "report lost",
                format!("delivered reported (200), the Telegram message {telegram:?}"),
            );
        }
        match sms.as_slice() {
            [] if delivered || was_canceled.is_some() || view.status == "canceled" => {}
            [] => {
                let steps = run.args.channel_list().len() as u64 - 1;
                let window = Duration::from_secs(run.args.fallback_after_secs * steps);
                if first_ack.get(&k).is_some_and(|at| at.elapsed() < window) {
                    in_window += 1;
                } else if run.args.whatsapp() && view.status == "expired" {
                    bad(
                        "no next step before expiry",
                        "no SMS: the verification expired first".into(),
                    );
                } else {
                    bad("stuck", "no SMS after the fallback time".into());
                }
            }
            [(_, status, key, _)] => {
                if !key.ends_with(":send:1:sms") {
                    bad("stuck", format!("the SMS under key {key}"));
                }
                match status.as_str() {
                    "sent" | "delivered" | "undelivered" if made.sms_count() == 0 => {
                        bad("false final", format!("SMS {status}, none created"))
                    }
                    "failed" | "canceled" if made.sms_count() > 0 => {
                        bad("false final", format!("SMS {status}, created"))
                    }
                    "unknown" => unknown += 1,
                    _ => {}
                }
            }
            more => bad("sms duplicate", format!("{} SMS messages", more.len())),
        }
    }
    let unmatched = i64::from(run.mock.created()) - i64::from(matched);
    let gateway_messages = created.values().map(|c| c.telegram.len()).sum::<usize>();
    let sms_created = created.values().map(Created::sms_count).sum::<u32>();
    let revoked = run.mock.gateway_revoked().len();
    let replays = ids
        .values()
        .map(|l| l.len().saturating_sub(1))
        .sum::<usize>();

    let h = &hits;
    let count = |kind: &str| {
        problems
            .iter()
            .filter(|(_, x, _)| *x == kind)
            .map(|(k, _, _)| *k)
            .collect::<HashSet<_>>()
            .len()
    };
    let late = count("no next step before expiry");
    let stuck = count("stuck").max(usize::try_from(not_final_after.max(0)).unwrap_or(0));
    let duplicates =
        count("telegram duplicate") + count("sms duplicate") + count("whatsapp duplicate");
    let codes = count("more than one code");
    let false_finals = count("false final");
    let no_201 = count("no 201") + count("ids differ");
    let lost_reports = count("report lost");
    let telegram_after_sms = count("telegram after sms");
    let after_end = count("sent after end");
    let after_report = count("sms after a delivery report") + count("step after a delivery report");
    let whatsapp_messages = created.values().map(|c| c.whatsapp.len()).sum::<usize>();
    let both_channels = count("both channels");
    println!(
        "chaos: load took {load_secs:.1} s; settled in {settle_secs:.1} s; {} SIGKILLs, {} SIGTERMs, {} pauses",
        h.sigkills, h.sigterms, h.pauses
    );
    println!(
        "channels:           {}telegram (the Gateway at the mock), then sms over {}",
        if run.args.whatsapp() {
            "whatsapp (the Cloud API at the mock), then "
        } else {
            ""
        },
        run.args.providers()
    );
    if run.args.whatsapp() {
        println!(
            "whatsapp messages:  {whatsapp_messages} created ({} given a status: {} answered 200 by an instance); the code on WhatsApp and a later channel: {wa_two_delivered} with WhatsApp delivered/read (the status came after the move: allowed, WhatsApp cannot withdraw), {wa_two_after_failure} after WhatsApp failed, {wa_two_after_silence} after silence or an ambiguous send",
            wa_outcome.len(),
            wa_outcome
                .keys()
                .filter(|id| reported.contains(*id))
                .count()
        );
    }
    println!(
        "verifications:      {} keys, {} with a 201, {replays} replays answered",
        run.args.keys,
        ids.len()
    );
    println!("statuses:           {hist:?}");
    println!(
        "gateway messages:   {gateway_messages} created ({revoked} revokes asked, {} reported delivered); SMS created: {sms_created}",
        reported.len()
    );
    println!(
        "canceled:           {} verifications canceled during the run",
        canceled.len()
    );
    println!(
        "mock:               {} calls, {} created, max per (phone, code/text) {}, (phone, code/text) created twice {}",
        stats.calls,
        stats.created,
        stats.max_deliveries_per_recipient_body,
        stats.duplicate_recipient_bodies
    );
    if unmatched != 0 {
        println!("creations unmatched: {unmatched}  (no key's phone)");
    }
    println!("not final in db:    {not_final_after}  (messages processing or scheduled)");
    println!("unknown:            {unknown}  (messages ending unknown; allowed)");
    if in_window > 0 {
        println!(
            "in fallback window: {in_window}  (no SMS yet, Telegram message younger than {} s)",
            run.args.fallback_after_secs
        );
    }
    print_clients(run, load, h, "starts with no 201");
    let mut by_kind: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for (k, kind, _) in &problems {
        let list = by_kind.entry(kind).or_default();
        let key = key_of(*k);
        if !list.contains(&key) {
            list.push(key);
        }
    }
    for (kind, keys) in &by_kind {
        println!(
            "{kind}: {} keys: {}",
            keys.len(),
            keys.iter().take(20).cloned().collect::<Vec<_>>().join(", ")
        );
    }
    // Every problem in a line (the explanations below show a few per kind).
    for (k, kind, what) in problems.iter().take(300) {
        println!("chaos: problem: {} {kind}: {what}", key_of(*k));
    }
    let ok = problems.is_empty() && unmatched == 0 && not_final_after == 0 && refused.is_empty();
    println!(
        "chaos: summary: {} {}, {} verifications; {} SIGKILLs, {} SIGTERMs, {} pauses; {}{gateway_messages} Gateway messages, {sms_created} SMS; {no_201} without one id, {codes} with more than one code, {duplicates} duplicates, {both_channels} with the code on both channels{}, {after_report} {} after a delivery report, {after_end} sent after their verification ended, {stuck} stuck, {late} with no next step before their expiry, {false_finals} false finals, {lost_reports} reports lost, {telegram_after_sms} Telegram sends checked after their SMS, {unknown} unknown",
        if run.args.whatsapp() {
            "whatsapp, gateway then sms over"
        } else {
            "gateway then sms over"
        },
        run.args.providers(),
        run.args.keys,
        h.sigkills,
        h.sigterms,
        h.pauses,
        if run.args.whatsapp() {
            format!("{whatsapp_messages} WhatsApp messages, ")
        } else {
            String::new()
        },
        if run.args.whatsapp() {
            format!(
                " (Telegram delivered and an SMS; WhatsApp and a later channel, counted not failed: {wa_two_delivered} WhatsApp delivered late, {wa_two_after_failure} after its failure, {wa_two_after_silence} after silence)"
            )
        } else {
            String::new()
        },
        if run.args.whatsapp() { "steps" } else { "SMS" },
    );
    println!("chaos: {}", if ok { "PASS" } else { "FAIL" });
    if !ok {
        explain_gateway(run, &mut db, &problems, &views, &created).await;
    }
    Ok(ok)
}

/// For a few keys of each kind that went wrong: the verification as
/// answered, its messages' rows and attempts, what the mock created for its
/// phone, and the instance log lines that name it or its messages.
async fn explain_gateway(
    run: &Run,
    db: &mut PgConnection,
    problems: &[(usize, &'static str, String)],
    views: &HashMap<usize, VerView>,
    created: &HashMap<String, Created>,
) {
    const PER_KIND: usize = 5;
    let logs: Vec<(usize, String)> = (0..run.args.instances)
        .filter_map(|n| Some((n, std::fs::read_to_string(run.log_path(n)).ok()?)))
        .collect();
    let mut shown: HashMap<&str, usize> = HashMap::new();
    for (k, kind, what) in problems {
        let seen = shown.entry(kind).or_default();
        *seen += 1;
        if *seen > PER_KIND {
            continue;
        }
        let to = to_of(*k);
        println!("chaos: {kind}: {} (to {to}): {what}", key_of(*k));
        let mut needles = vec![key_of(*k)];
        if let Some(view) = views.get(k) {
            println!("  verification: {}", view.raw);
            if let Some(id) = view.raw["id"].as_str() {
                needles.push(id.to_string());
                let rows: Vec<String> = sqlx::query_scalar(
                    "SELECT format('message %s %s: status=%s attempts=%s maybe_sent=%s provider=%s provider_message_id=%s prepared=%s lease_owner=%s created_at=%s finalized_at=%s error=%s', \
                     idempotency_key, id, status, attempts, maybe_sent, provider, provider_message_id, prepared_token, lease_owner, created_at, finalized_at, error) \
                     FROM messages WHERE idempotency_key LIKE $1 || ':%' ORDER BY created_at",
                )
                .bind(id)
                .fetch_all(&mut *db)
                .await
                .unwrap_or_else(|e| vec![format!("(messages: {e})")]);
                for r in rows {
                    println!("  {r}");
                }
                let attempts: Vec<String> = sqlx::query_scalar(
                    "SELECT format('attempt %s of %s: owner=%s started=%s finished=%s outcome=%s http=%s code=%s provider=%s error=%s', \
                     a.number, m.idempotency_key, a.lease_owner, a.started_at, a.finished_at, a.outcome, a.http_status, a.provider_code, a.provider, a.error) \
                     FROM attempts a JOIN messages m ON m.id = a.message_id WHERE m.idempotency_key LIKE $1 || ':%' ORDER BY a.started_at",
                )
                .bind(id)
                .fetch_all(&mut *db)
                .await
                .unwrap_or_else(|e| vec![format!("(attempts: {e})")]);
                for a in attempts {
                    println!("  {a}");
                }
            }
            for m in &view.messages {
                needles.push(m.3.clone());
            }
        }
        if let Some(c) = created.get(digits(&to)) {
            println!(
                "  mock: WhatsApp messages {:?}; Gateway messages {:?}; SMS created {:?}",
                c.whatsapp, c.telegram, c.sms
            );
        } else {
            println!("  mock: nothing created");
        }
        let calls = run
            .mock
            .calls()
            .iter()
            .filter(|c| {
                let s = c.body.to_string();
                s.contains(&to) || s.contains(digits(&to))
            })
            .count();
        println!("  mock: {calls} calls for the phone");
        needles.retain(|n| !n.is_empty());
        for (n, text) in &logs {
            for line in text
                .lines()
                .filter(|l| needles.iter().any(|x| l.contains(x.as_str())))
                .take(40)
            {
                println!("  instance-{n}.log: {line}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_judged_by_its_status_and_its_creations() {
        let yes = || true;
        let no = || false;
        assert_eq!(judge(Some("sent"), 1, no), Verdict::Ok);
        assert_eq!(judge(Some("delivered"), 1, no), Verdict::Ok);
        assert_eq!(judge(Some("sent"), 0, no), Verdict::FalseFinal);
        assert_eq!(judge(Some("sent"), 2, no), Verdict::Duplicate);
        assert_eq!(judge(Some("failed"), 0, no), Verdict::Ok);
        assert_eq!(judge(Some("failed"), 1, no), Verdict::FalseFinal);
        assert_eq!(judge(Some("canceled"), 1, no), Verdict::FalseFinal);
        assert_eq!(
            judge(Some("unknown"), 0, no),
            Verdict::Unknown { created: 0 }
        );
        assert_eq!(
            judge(Some("unknown"), 1, no),
            Verdict::Unknown { created: 1 }
        );
        assert_eq!(judge(Some("unknown"), 2, no), Verdict::Duplicate);
        assert_eq!(judge(Some("processing"), 1, no), Verdict::Stuck);
        assert_eq!(judge(Some("scheduled"), 0, no), Verdict::Stuck);
        assert_eq!(judge(None, 0, yes), Verdict::Lost);
        assert_eq!(judge(None, 0, no), Verdict::Ok);
        assert_eq!(judge(None, 1, no), Verdict::FalseFinal);
    }

    #[test]
    fn an_unknown_over_smpp_needs_a_cut_off_submit() {
        let submit = |session: u64, answer: &str, udh, at_ms| Submit {
            session,
            dest: "14155550001".into(),
            text: "x".into(),
            udh,
            answer: answer.into(),
            at_ms,
        };
        let attempt = |outcome: &str, error: &str, started, finished| AttemptTimes {
            outcome: Some(outcome.into()),
            error: Some(error.into()),
            started,
            finished: Some(finished),
        };
        let none = HashMap::new();
        let ok = submit(1, "ok", None, 10_000);
        // Answered at once on a session that stayed up, with nothing else
        // going on: nothing cut it off.
        let amb = attempt("ambiguous", "the SMPP session dropped", 9_990, 10_050);
        assert_eq!(unknown_cause(&[&ok], &none, &[amb], &[]), None);
        // Its session dropped during the attempt, with its submit not read
        // by the SMSC (no record of it) or a later part never written; and
        // a drop seen by our side with no session closed anywhere near it.
        let dropped = || attempt("ambiguous", "the SMPP session dropped", 9_990, 10_050);
        let closed_then = HashMap::from([(2, 10_030)]);
        assert!(unknown_cause(&[], &closed_then, &[dropped()], &[]).is_some());
        let after_part = attempt(
            "ambiguous",
            "the SMPP session dropped after 1 of 2 parts were accepted (they are on the phone)",
            9_990,
            12_500,
        );
        let p1 = submit(1, "ok", Some((9, 2, 1)), 10_000);
        let closed_later = HashMap::from([(1, 12_400)]);
        assert!(unknown_cause(&[&p1], &closed_later, &[after_part], &[]).is_some());
        let closed_long_after = HashMap::from([(2, 15_000)]);
        assert_eq!(
            unknown_cause(&[], &closed_long_after, &[dropped()], &[]),
            None
        );
        // A submit taken and never answered.
        let silent = submit(1, "silent", None, 10_000);
        assert!(unknown_cause(&[&silent], &none, &[], &[]).is_some());
        // Its session closed right after it, or long after it.
        let soon = HashMap::from([(1, 10_500)]);
        let late = HashMap::from([(1, 15_000)]);
        assert!(unknown_cause(&[&ok], &soon, &[], &[]).is_some());
        assert_eq!(unknown_cause(&[&ok], &late, &[], &[]), None);
        // An attempt left open, taken over.
        let lost = attempt("lost", "cannot be asked", 9_990, 14_000);
        assert!(unknown_cause(&[&ok], &none, &[lost], &[]).is_some());
        // A hit during the ambiguous attempt, and one long before it.
        let amb = || {
            attempt(
                "ambiguous",
                "no submit_sm_resp within the timeout",
                9_990,
                10_200,
            )
        };
        assert!(unknown_cause(&[&ok], &none, &[amb()], &[(10_100, 10_100)]).is_some());
        assert_eq!(
            unknown_cause(&[&ok], &none, &[amb()], &[(1_000, 2_000)]),
            None
        );
        // A later part refused after the first was taken.
        let p1 = submit(1, "ok", Some((7, 2, 1)), 10_000);
        let p2 = submit(1, "0x0B", Some((7, 2, 2)), 10_010);
        assert!(unknown_cause(&[&p1, &p2], &none, &[], &[]).is_some());
        // A timeout that took the whole second.
        let slow = attempt(
            "ambiguous",
            "no submit_sm_resp within the timeout",
            9_990,
            11_000,
        );
        assert!(unknown_cause(&[&ok], &none, &[slow], &[]).is_some());
    }

    #[test]
    fn every_key_has_a_body_of_its_own() {
        assert_ne!(body_of(1), body_of(10_001));
        assert_eq!(to_of(1), to_of(10_001));
        assert!(body_of(7).contains(&key_of(7)));
    }

    #[test]
    fn a_verification_is_settled_once_its_one_sms_is_final() {
        let view = |messages: serde_json::Value| {
            VerView::of(serde_json::json!({"status": "pending", "messages": messages}))
        };
        let tg = |status: &str| serde_json::json!({"channel": "telegram", "status": status, "idempotency_key": "ver_1:send:1", "id": "msg_1"});
        let sms = |status: &str| serde_json::json!({"channel": "sms", "status": status, "idempotency_key": "ver_1:send:1:sms", "id": "msg_2"});
        assert!(!view(serde_json::json!([tg("processing")])).settled());
        assert!(!view(serde_json::json!([tg("sent")])).settled());
        assert!(view(serde_json::json!([tg("delivered")])).settled());
        assert!(!view(serde_json::json!([tg("sent"), sms("processing")])).settled());
        assert!(view(serde_json::json!([tg("sent"), sms("sent")])).settled());
        assert!(view(serde_json::json!([tg("failed"), sms("unknown")])).settled());
        assert!(!view(serde_json::json!([tg("sent"), sms("sent"), sms("sent")])).settled());
        // WhatsApp first: its delivery settles it; silence needs the rest.
        let wa = |status: &str| serde_json::json!({"channel": "whatsapp", "status": status, "idempotency_key": "ver_1:send:1", "id": "msg_0"});
        assert!(view(serde_json::json!([wa("delivered")])).settled());
        assert!(!view(serde_json::json!([wa("unknown")])).settled());
        assert!(!view(serde_json::json!([wa("unknown"), tg("sent")])).settled());
        assert!(
            view(serde_json::json!([
                wa("undelivered"),
                tg("canceled"),
                sms("sent")
            ]))
            .settled()
        );
    }

    #[test]
    fn the_codes_a_phone_got_are_read_from_both_channels() {
        let one = Created {
            telegram: vec![("123456".into(), "r1".into(), "revoked".into())],
            sms: vec![("Your verification code is 123456".into(), 1)],
            ..Created::default()
        };
        assert_eq!(one.codes().len(), 1);
        assert_eq!(one.total(), 2);
        let two = Created {
            telegram: vec![("123456".into(), "r1".into(), "sent".into())],
            sms: vec![("Your verification code is 654321".into(), 1)],
            ..Created::default()
        };
        assert_eq!(two.codes().len(), 2);
        let three = Created {
            whatsapp: vec![("123456".into(), "wamid.A".into())],
            telegram: vec![("123456".into(), "r1".into(), "sent".into())],
            sms: vec![("Your verification code is 123456".into(), 1)],
            ..Created::default()
        };
        assert_eq!(three.codes().len(), 1);
        assert_eq!(three.total(), 3);
        let other = Created {
            whatsapp: vec![("111111".into(), "wamid.A".into())],
            sms: vec![("Your verification code is 123456".into(), 1)],
            ..Created::default()
        };
        assert_eq!(other.codes().len(), 2);
        let text = Created {
            telegram: vec![],
            sms: vec![("something else".into(), 1)],
            ..Created::default()
        };
        assert_eq!(text.codes().len(), 1);
        assert!(text.codes().iter().all(|c| c.starts_with("(text")));
    }

    #[test]
    fn utc_now_reads_as_rfc_3339() {
        let now = utc_now();
        assert_eq!(now.len(), "2026-01-01T00:00:00.000Z".len());
        assert!(now.starts_with("20") && now.ends_with('Z'));
    }
}
