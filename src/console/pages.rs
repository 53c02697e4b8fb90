//! The console's pages (maud templates): HTML only, no script; style comes
//! from `/console/console.css`.

use std::collections::BTreeMap;
use std::time::Duration;

use maud::{DOCTYPE, Markup, html};
use time::OffsetDateTime;

use super::decide::{self, Entry, Zone, human, when, when_in};

/// A time in the session's zone, its UTC time on hover (`title`) and in
/// `datetime`; in UTC alone when the tenant has no home country.
pub(super) fn at(t: OffsetDateTime, zone: Zone) -> Markup {
    let utc = t
        .to_offset(time::UtcOffset::UTC)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    html! {
        @if zone.is_some() {
            time datetime=(utc) title=(when(t)) { (when_in(t, zone)) }
        } @else {
            time datetime=(utc) { (when(t)) }
        }
    }
}
use super::{Session, enc};
use crate::store::{
    MessageRecord, MessageSummary, MessageWebhookDelivery, OptOut, OutboxEntry, OverviewCounts,
    VerificationRecord,
};

pub(super) fn layout(title: &str, session: Option<&Session>, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · sendonce console" }
                link rel="stylesheet" href="/console/console.css";
            }
            body {
                header {
                    a.brand href="/console" { "sendonce console" }
                    @if session.is_some_and(Session::is_test) {
                        span.test-mode { "Test mode: test data only; nothing reaches a provider" }
                    }
                    @if let Some(s) = session {
                        nav aria-label="Console" {
                            a href="/console/overview" { "Overview" }
                            a href="/console/search" { "Find a message" }
                            a href="/console/opt-outs" { "Opt-outs" }
                            a href="/console/outbox" { "Outbox" }
                            @if s.scopes.contains(crate::scopes::Scope::Admin) {
                                a href="/console/routes" { "Routes" }
                            }
                        }
                        form method="post" action="/console/logout" {
                            input type="hidden" name="csrf" value=(s.csrf);
                            span.muted { "Signed in with " (s.key_prefix) "… " }
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main { (content) }
            }
        }
    }
}

pub fn error(title: &str, detail: &str, session: Option<&Session>) -> Markup {
    layout(
        title,
        session,
        html! {
            h1 { (title) }
            p { (detail) }
            p { a href="/console" { "Back to the console" } }
        },
    )
}

pub fn login(token: &str, error: Option<Markup>) -> Markup {
    layout(
        "Sign in",
        None,
        html! {
            h1 { "Sign in" }
            p { "Sign in with one of your account's API keys (they start with " code { "so_" } ")." }
            @if let Some(e) = error {
                p.error role="alert" { (e) }
            }
            form method="post" action="/console/login" {
                input type="hidden" name="csrf" value=(token);
                label for="api_key" { "API key" }
                input #api_key type="password" name="api_key" autocomplete="off" required;
                p { button.primary type="submit" { "Sign in" } }
            }
        },
    )
}

fn search_form(q: &str) -> Markup {
    html! {
        form method="get" action="/console/search" role="search" {
            label for="q" { "Idempotency key or part of one, metadata value, message id, verification id, provider message id or phone number" }
            div.row {
                input #q type="search" name="q" value=(q) dir="auto" maxlength="255";
                button.primary type="submit" { "Find" }
            }
        }
    }
}

fn status(s: crate::domain::Status) -> Markup {
    html! { span class={"status status-" (s.as_str())} { (s.as_str()) } }
}

fn message_table(caption: &str, list: &[MessageSummary], zone: Zone) -> Markup {
    html! {
        div.table-wrap {
            table.stack {
                caption.visually-hidden { (caption) }
                thead { tr { th scope="col" { "Created" } th scope="col" { "Message" } th scope="col" { "Status" } th scope="col" { "To" } th scope="col" { "Provider" } th scope="col" { "Attempts" } } }
                tbody {
                    @for m in list {
                        tr {
                            td data-label="Created" { (at(m.created_at, zone)) }
                            td.long data-label="Message" { a href={"/console/messages/" (m.id)} { (m.idempotency_key) } }
                            td data-label="Status" { (status(m.status)) }
                            td data-label="To" { (m.to) }
                            td data-label="Provider" { (m.provider) }
                            td data-label="Attempts" { (m.attempts) }
                        }
                    }
                }
            }
        }
    }
}

/// What a search found.
pub struct Results {
    /// Messages matched by id, key or provider message id, and how.
    pub exact: Vec<(&'static str, MessageSummary)>,
    /// The number searched, a page of its messages (newest first) and the
    /// cursor of the next, older page.
    pub by_phone: Option<(String, Vec<MessageSummary>, Option<String>)>,
    /// This is not the first page.
    pub paged: bool,
    /// The entry was a national-format number and the tenant has no home
    /// country to read it in.
    pub national_without_home: bool,
}

/// What the search box finds, said when nothing matched or the entry was
/// unreadable.
pub const SEARCHABLE: &str = "Search by part of an idempotency key or of a metadata value (any case, messages of the last 30 days), a message id (msg_…), a verification id (ver_…), a provider message id, or a phone number in international form (+…), or in national form once the account has a home country.";

pub fn search(session: &Session, q: &str, results: Option<&Results>) -> Markup {
    layout(
        "Find a message",
        Some(session),
        html! {
            h1 { "Find a message" }
            (search_form(q))
            @if let Some(r) = results {
                @if !r.exact.is_empty() {
                    h2 { "Matches" }
                    div.table-wrap {
                        table.stack {
                            caption.visually-hidden { "Messages matching the search" }
                            thead { tr { th scope="col" { "Matched by" } th scope="col" { "Message" } th scope="col" { "Status" } th scope="col" { "Created" } } }
                            tbody {
                                @for (how, m) in &r.exact {
                                    tr {
                                        td data-label="Matched by" { (how) }
                                        td.long data-label="Message" { a href={"/console/messages/" (m.id)} { (m.idempotency_key) } }
                                        td data-label="Status" { (status(m.status)) }
                                        td data-label="Created" { (at(m.created_at, session.zone)) }
                                    }
                                }
                            }
                        }
                    }
                }
                @if let Some((number, list, older)) = &r.by_phone {
                    h2 { "Recent messages to " (number) }
                    @if list.is_empty() {
                        p { "No messages to this number" @if r.paged { " before these" } "." }
                    } @else {
                        (message_table(&format!("Messages to {number}, newest first"), list, session.zone))
                    }
                    @if let Some(c) = older {
                        p { a href={"/console/search?q=" (enc(number)) "&before=" (enc(c))} { "Older messages" } }
                    }
                }
                @if r.exact.is_empty() && r.by_phone.is_none() {
                    p role="status" { "Nothing matched “" (q) "”." }
                    p.muted { (SEARCHABLE) }
                    @if r.national_without_home {
                        p.muted {
                            "“" (q) "” looks like a national number, but this account has no home country to read it in: search in international form (+…), or set one with "
                            code { "sendonce tenant home-country NAME CC" }
                            " (e.g. US)."
                        }
                    }
                }
            }
        },
    )
}

pub fn timeline(
    session: &Session,
    m: &MessageRecord,
    body: &str,
    verification: Option<&VerificationRecord>,
    entries: &[Entry],
    webhooks: &[MessageWebhookDelivery],
) -> Markup {
    let title = format!("Message {}", m.idempotency_key);
    layout(
        &title,
        Some(session),
        html! {
            h1 { "Message " code { (m.idempotency_key) } }
            p.say { strong { "Tell the customer: " } (decide::plain_words(m, session.zone)) }
            dl.facts {
                dt { "Status" } dd { (status(m.status)) }
                dt { "Message id" } dd { code { (m.id) } }
                dt { "To" } dd { a href={"/console/search?q=" (enc(m.to.as_str()))} { (m.to) } @if m.recipient_opted_out { " (opted out)" } }
                @if let Some(f) = &m.from { dt { "From" } dd { (f) } }
                dt { "Provider" } dd { (m.provider) }
                @if let Some(r) = &m.route { dt { "Route" } dd { code { (r) } } }
                @if let Some(p) = &m.provider_message_id { dt { "Provider message id" } dd { code { (p) } } }
                dt { "Attempts" } dd { (m.attempts) }
                dt { "Created" } dd { (at(m.created_at, session.zone)) }
                @for (k, v) in &m.metadata { dt { "Metadata " code { (k) } } dd dir="auto" { (v) } }
                @if let Some(due) = m.next_attempt_at { dt { "Next attempt due" } dd { (at(due, session.zone)) } }
                @if let Some(v) = verification {
                    @let vid = crate::verify::public_id(v.id);
                    dt { "Verification" } dd { a href={"/console/verifications/" (vid)} { (vid) } }
                }
            }
            h2 { "Text" }
            pre.body dir="auto" { (body) }
            @if !webhooks.is_empty() {
                h2 { "Webhook deliveries" }
                div.table-wrap {
                    table.stack {
                        caption.visually-hidden { "Webhook deliveries of this message" }
                        thead {
                            tr {
                                th scope="col" { "Event" }
                                th scope="col" { "Endpoint" }
                                th scope="col" { "Attempts" }
                                th scope="col" { "State" }
                            }
                        }
                        tbody {
                            @for d in webhooks {
                                tr {
                                    td data-label="Event" { code { (d.event_type) } }
                                    td.long data-label="Endpoint" { (d.url) }
                                    td data-label="Attempts" { (d.attempts.len()) }
                                    td data-label="State" { (decide::webhook_state(d, session.zone)) }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "Timeline" }
            ol.timeline {
                @for e in entries {
                    li {
                        span.kind { (e.kind.as_str()) }
                        span.at { (at(e.at, session.zone)) }
                        " "
                        strong { (e.title) }
                        @if !e.facts.is_empty() {
                            dl {
                                @for (name, value) in &e.facts {
                                    dt { (name) } dd { (value) }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// The tone of a status's bar and its colour (readable on white): only
/// the outcomes that went wrong are red; waiting or withdrawn ones
/// (`scheduled`, `canceled`) are grey, in-flight ones blue.
fn bar_tone(status: &str) -> (&'static str, &'static str) {
    match status {
        "delivered" | "sent" => ("good", "#116329"),
        "processing" => ("info", "#0b5cad"),
        "unknown" => ("warn", "#6b4a00"),
        "failed" | "undelivered" => ("bad", "#a40e26"),
        _ => ("neutral", "#57606a"),
    }
}

/// Messages per status as horizontal bars, drawn as inline SVG.
fn chart(totals: &BTreeMap<String, i64>) -> Markup {
    let max = totals.values().copied().max().unwrap_or(0).max(1);
    let row = 28;
    #[allow(clippy::cast_possible_wrap, clippy::cast_possible_truncation)]
    let height = (totals.len().max(1) * row) as i64 + 8;
    let label = totals
        .iter()
        .map(|(s, n)| format!("{s}: {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    html! {
        svg.chart xmlns="http://www.w3.org/2000/svg" role="img" width="480" height=(height)
            viewBox={"0 0 480 " (height)} aria-labelledby="chart-title" {
            title #chart-title { "Messages in the last 24 hours by status: " (label) }
            @for (i, (s, n)) in totals.iter().enumerate() {
                @let y = i * row + 4;
                @let w = (n * 300 / max).max(1);
                text x="0" y=(y + 17) font-size="14" fill="#1b1f24" { (s) }
                @let (tone, colour) = bar_tone(s);
                rect class={"bar bar-" (tone)} x="110" y=(y + 3) width=(w) height="18" fill=(colour) {}
                text x=(115 + w) y=(y + 17) font-size="14" fill="#1b1f24" { (n) }
            }
        }
    }
}

/// One line of the overview's spend table: what was spent (or sent) and
/// the cap with the share of it used, or "no cap".
pub fn spend_line(spent: i64, cap: Option<i64>, money: bool) -> (String, String) {
    let shown = |v: i64| {
        if money {
            crate::spend::format_amount(v)
        } else {
            v.to_string()
        }
    };
    let cap_text = match cap {
        None => "no cap".to_string(),
        Some(0) => format!("{} (nothing allowed)", shown(0)),
        Some(c) => format!(
            "{} ({} % used)",
            shown(c),
            i128::from(spent) * 100 / i128::from(c)
        ),
    };
    (shown(spent), cap_text)
}

pub fn overview(
    session: &Session,
    c: &OverviewCounts,
    spend: &crate::store::SpendSummary,
    now: OffsetDateTime,
) -> Markup {
    let currency = spend.currency.clone().unwrap_or_default();
    let spend_rows = [
        (
            "Today (UTC)",
            spend_line(spend.today_micros, spend.caps.daily, true),
            true,
        ),
        (
            "This month (UTC)",
            spend_line(spend.month_micros, spend.caps.monthly, true),
            true,
        ),
        (
            "International messages today",
            spend_line(
                spend.international_today,
                spend.caps.international_daily_messages,
                false,
            ),
            false,
        ),
    ];
    let mut totals: BTreeMap<String, i64> = BTreeMap::new();
    let mut providers: BTreeMap<&str, BTreeMap<&str, i64>> = BTreeMap::new();
    for (s, p, n) in &c.by_status_provider {
        *totals.entry(s.clone()).or_default() += n;
        *providers.entry(p).or_default().entry(s).or_default() += n;
    }
    let total: i64 = totals.values().sum();
    let statuses = [
        "scheduled",
        "processing",
        "sent",
        "delivered",
        "undelivered",
        "failed",
        "unknown",
        "canceled",
    ];
    let oldest = c
        .oldest_processing
        .map(|t| human(Duration::try_from(now - t).unwrap_or_default()));
    layout(
        "Overview",
        Some(session),
        html! {
            h1 { "Overview: the last 24 hours" }
            @if let Some(w) = decide::warning(c) {
                p.warning role="alert" { strong { "Warning: " } (w) }
            }
            (search_form(""))
            h2 { "Messages by status" }
            @if totals.is_empty() {
                p { "No messages in the last 24 hours." }
            } @else {
                p.total { "Total: " strong { (total) } }
                (chart(&totals))
            }
            h2 { "By provider" }
            div.table-wrap {
                table.stack {
                    caption.visually-hidden { "Messages in the last 24 hours by provider and status" }
                    thead { tr { th scope="col" { "Provider" } @for s in statuses { th scope="col" { (s) } } th scope="col" { "Total" } } }
                    tbody {
                        @for (p, by) in &providers {
                            tr { th scope="row" { (p) } @for s in statuses { td data-label=(s) { (by.get(s).copied().unwrap_or(0)) } } td data-label="Total" { (by.values().sum::<i64>()) } }
                        }
                    }
                }
            }
            h2 { "Provider error rate" }
            div.table-wrap {
                table.stack {
                    caption.visually-hidden { "Provider attempts and errors in the last 24 hours" }
                    thead { tr { th scope="col" { "Provider" } th scope="col" { "Attempts" } th scope="col" { "Errors" } th scope="col" { "Error rate" } } }
                    tbody {
                        @for (p, attempts, errors) in &c.attempts_by_provider {
                            tr {
                                th scope="row" { (p) }
                                td data-label="Attempts" { (attempts) }
                                td data-label="Errors" { (errors) }
                                td data-label="Error rate" { (rate(*errors, *attempts)) }
                            }
                        }
                    }
                }
            }
            h2 { "Spend" }
            div.table-wrap {
                table.stack {
                    caption.visually-hidden { "Estimated spend against the account's caps" }
                    thead { tr { th scope="col" { "Period" } th scope="col" { "Spent" } th scope="col" { "Cap" } } }
                    tbody {
                        @for (label, (spent, cap), money) in &spend_rows {
                            tr {
                                th scope="row" { (label) }
                                td data-label="Spent" { (spent) @if *money && !currency.is_empty() { " " (currency) } }
                                td data-label="Cap" { (cap) }
                            }
                        }
                    }
                }
            }
            h2 { "Waiting" }
            dl.facts {
                dt { "Processing now" } dd { (c.processing) }
                dt { "Waiting for a retry" } dd { (c.waiting_retries) }
                dt { "Webhook deliveries waiting for a retry" } dd { (c.waiting_webhooks) }
                // Scheduled messages join this list when they land.
                dt { "Oldest processing" } dd { (oldest.unwrap_or_else(|| "none".into())) }
            }
            p.muted { "The warning shows when more than "
                (format!("{:.0} %", decide::WARN_FAILURE_RATE * 100.0))
                " of at least " (decide::WARN_MIN_FINISHED)
                " finished messages failed (failed, unknown or undelivered)." }
        },
    )
}

pub fn opt_outs(
    session: &Session,
    q: &str,
    list: &[OptOut],
    next: Option<&str>,
    notice: Option<&str>,
) -> Markup {
    layout(
        "Opt-outs",
        Some(session),
        html! {
            h1 { "Opt-outs" }
            p { "Numbers on this list get no messages: a send to them ends " code { "failed" } " and never reaches the provider." }
            @if let Some(n) = notice { p.notice role="status" { (n) } }
            @if session.may_edit_opt_outs() {
                h2 { "Add a number" }
                form method="post" action="/console/opt-outs" {
                    input type="hidden" name="csrf" value=(session.csrf);
                    label for="number" { "Phone number (international form, e.g. +14155550100)" }
                    div.row {
                        input #number type="text" name="number" inputmode="tel" autocomplete="off" required;
                        button.primary type="submit" { "Add to opt-outs" }
                    }
                }
            } @else {
                p { "This key can view opt-outs but not change them (it has no " code { "opt-outs" } " scope)." }
            }
            h2 { "Find" }
            form method="get" action="/console/opt-outs" role="search" {
                label for="oq" { "Number or its beginning" }
                div.row {
                    input #oq type="search" name="q" value=(q);
                    button type="submit" { "Search" }
                }
            }
            @if list.is_empty() {
                p { "No opt-outs" @if !q.is_empty() { " match “" (q) "”" } "." }
            } @else {
                div.table-wrap {
                    table.stack {
                        caption.visually-hidden { "Opted-out numbers" }
                        thead { tr { th scope="col" { "Number" } th scope="col" { "Added by" } th scope="col" { "When" } @if session.may_edit_opt_outs() { th scope="col" { "Remove" } } } }
                        tbody {
                            @for o in list {
                                tr {
                                    td data-label="Number" { (o.number) }
                                    td data-label="Added by" { (who(o)) }
                                    td data-label="When" { (at(o.created_at, session.zone)) }
                                    @if session.may_edit_opt_outs() {
                                        td data-label="Remove" {
                                            form method="post" action="/console/opt-outs/remove" {
                                                input type="hidden" name="csrf" value=(session.csrf);
                                                input type="hidden" name="number" value=(o.number);
                                                button type="submit" aria-label={"Remove " (o.number)} { "Remove" }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @if let Some(n) = next {
                p { a href={"/console/opt-outs?q=" (enc(q)) "&after=" (enc(n))} { "More" } }
            }
        },
    )
}

/// The local outbox: what the simulated provider was handed, newest first,
/// bodies (codes included) in full; with a real provider, `refusal` and
/// nothing else.
pub fn outbox(session: &Session, refusal: Option<&str>, entries: &[OutboxEntry]) -> Markup {
    layout(
        "Outbox",
        Some(session),
        html! {
            h1 { "Outbox" }
            @if let Some(why) = refusal {
                p.notice role="status" { "The outbox is only for the simulated provider: nothing is shown. (" (why) ".)" }
            } @else {
                p { "What the " code { "simulated" } " provider would have sent (nothing left this machine), newest first, codes included. " code { "sendonce outbox --follow" } " prints the same in a terminal." }
                @if entries.is_empty() {
                    p { "Nothing was sent through the simulated provider yet." }
                } @else {
                    div.table-wrap {
                        table.stack {
                            caption.visually-hidden { "Messages the simulated provider was handed" }
                            thead { tr { th scope="col" { "Sent" } th scope="col" { "To" } th scope="col" { "Message" } th scope="col" { "Provider message id" } th scope="col" { "Body" } } }
                            tbody {
                                @for e in entries.iter().rev() {
                                    tr {
                                        td data-label="Sent" { (at(e.sent_at, session.zone)) }
                                        td data-label="To" { (e.to) }
                                        td.long data-label="Message" { a href={"/console/messages/" (e.message_id)} { (e.idempotency_key) } }
                                        td.long data-label="Provider message id" { (e.provider_message_id.as_deref().unwrap_or("-")) }
                                        td.long data-label="Body" { pre.body dir="auto" { (e.body) } }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// `errors` of `attempts` as a percentage.
#[allow(clippy::cast_precision_loss)]
fn rate(errors: i64, attempts: i64) -> String {
    if attempts > 0 {
        format!("{:.1} %", errors as f64 * 100.0 / attempts as f64)
    } else {
        "0.0 %".into()
    }
}

fn who(o: &OptOut) -> String {
    match (o.source.as_str(), &o.added_by) {
        ("console", Some(k)) => format!("console, key {k}…"),
        ("inbound", _) => "the recipient (STOP reply)".into(),
        ("api", _) => "the API".into(),
        (s, _) => s.to_string(),
    }
}

pub fn verification(
    session: &Session,
    v: &VerificationRecord,
    status: &str,
    messages: &[MessageSummary],
) -> Markup {
    let id = crate::verify::public_id(v.id);
    layout(
        &format!("Verification {id}"),
        Some(session),
        html! {
            h1 { "Verification " code { (id) } }
            dl.facts {
                dt { "Status" } dd { span.status { (status) } }
                dt { "To" } dd { a href={"/console/search?q=" (enc(&v.to))} { (v.to) } }
                dt { "Idempotency key" } dd { code { (v.idempotency_key) } }
                dt { "Created" } dd { (at(v.created_at, session.zone)) }
                dt { "Expires" } dd { (at(v.expires_at, session.zone)) }
                dt { "Channels" } dd { (v.channels.names().join(", then ")) @if v.channels.len() > 1 { " (the next channel when one did not report delivery within " (fallback_after_words(&v.fallback_after)) ")" } }
                dt { "Codes sent" } dd { (v.sends) ", the last at " (at(v.last_sent_at, session.zone)) }
                dt { "Checks left" } dd { (v.checks_remaining) }
                @if let Some(a) = v.approved_at { dt { "Approved" } dd { (at(a, session.zone)) } }
            }
            h2 { "Text" }
            pre.body dir="auto" { (crate::verify::masked(v)) }
            h2 { "Its messages" }
            @if messages.is_empty() {
                p { "None left (they were purged after the retention period)." }
            } @else {
                (message_table("The verification's messages", messages, session.zone))
            }
        },
    )
}

/// A verification's `fallback_after_seconds`, as the console says it.
fn fallback_after_words(after: &crate::domain::FallbackAfter) -> String {
    match after {
        crate::domain::FallbackAfter::Every(n) => format!("{n} s"),
        crate::domain::FallbackAfter::Each(list) => list
            .iter()
            .map(|n| format!("{n} s"))
            .collect::<Vec<_>>()
            .join(", then "),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn spend_lines() {
        #[rustfmt::skip]
        let cases = [
            (100_000, Some(200_000), true, ("0.10", "0.20 (50 % used)")),
            (0, None, true, ("0.00", "no cap")),
            (3, Some(4), false, ("3", "4 (75 % used)")),
            (0, Some(0), true, ("0.00", "0.00 (nothing allowed)")),
        ];
        for (spent, cap, money, (a, b)) in cases {
            let (x, y) = super::spend_line(spent, cap, money);
            assert_eq!((x.as_str(), y.as_str()), (a, b));
        }
    }
}
