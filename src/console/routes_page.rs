//! The console's routes page (issue 43): each route's providers in their
//! current order, their measured quality in numbers and one small chart
//! each, why the order is what it is, and whether an operator pinned it.
//! For keys with the `admin` scope (routes are the installation's, not a
//! tenant's).

use maud::{Markup, html};

use super::decide::Zone;
use super::pages::{at, layout};
use super::session::Session;
use crate::delivery::quality::{Measured, Verdict, humantime};
use crate::delivery::route_quality::{Report, RouteReport};

fn pct(x: Option<f64>) -> String {
    x.map_or_else(|| "–".to_string(), |v| format!("{:.0} %", v * 100.0))
}

fn secs(x: Option<u32>) -> String {
    x.map_or_else(
        || "–".to_string(),
        |s| {
            format!(
                "≤ {}",
                humantime(std::time::Duration::from_secs(u64::from(s)))
            )
        },
    )
}

fn cost(m: &Measured, micros: Option<i64>) -> String {
    match (micros, &m.currency) {
        (Some(v), Some(c)) => format!("{} {c}", crate::spend::format_amount(v)),
        _ => "–".to_string(),
    }
}

/// What became of a provider's sent messages, as one stacked bar: delivered
/// within 5 s, within SLOW_AFTER, later; undelivered; no report yet.
fn bar(m: &Measured, slow_after_secs: u64, label: &str) -> Markup {
    let fast = m.within[2];
    let in_time = crate::delivery::quality::BUCKETS
        .iter()
        .zip(m.within)
        .filter(|(edge, _)| u64::from(**edge) <= slow_after_secs)
        .map(|(_, n)| n)
        .max()
        .unwrap_or(0)
        .max(fast);
    let parts = [
        ("delivered within 5 s", fast, "#116329"),
        ("delivered in time", in_time.saturating_sub(fast), "#4d9e5f"),
        (
            "delivered late",
            m.delivered.saturating_sub(in_time),
            "#6b4a00",
        ),
        ("undelivered", m.undelivered, "#a40e26"),
        (
            "no report",
            m.sent.saturating_sub(m.delivered + m.undelivered),
            "#57606a",
        ),
    ];
    let total: u32 = parts.iter().map(|p| p.1).sum();
    let width = 300u32;
    let words = parts
        .iter()
        .map(|(what, n, _)| format!("{what}: {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut x = 0u32;
    let mut rects = Vec::new();
    for (_, n, colour) in parts {
        let w = (n * width).checked_div(total).unwrap_or(0);
        if w > 0 {
            rects.push((x, w, colour));
        }
        x += w;
    }
    html! {
        svg.minibar xmlns="http://www.w3.org/2000/svg" role="img" width="80" height="18" preserveAspectRatio="none"
            viewBox={"0 0 " (width) " 20"} {
            title { (label) ": " (words) }
            @if total == 0 {
                rect x="0" y="2" width=(width) height="16" fill="#eaeef2" {}
            } @else {
                @for (x, w, colour) in &rects {
                    rect x=(x) y="2" width=(w) height="16" fill=(colour) {}
                }
            }
        }
    }
}

fn verdict(v: &Verdict) -> Markup {
    match v {
        Verdict::Bad(why) => html! { strong { "bad" } ": " (why) },
        Verdict::Good => html! { "good" },
        Verdict::Unmeasured => html! { span.muted { "too few samples" } },
    }
}

fn route(r: &RouteReport, slow_after_secs: u64, zone: Zone) -> Markup {
    let shifted = r
        .providers
        .iter()
        .map(|p| p.name.as_str())
        .ne(r.configured.iter().map(String::as_str));
    html! {
        section {
            h2 { "Route " (r.prefix) }
            p {
                "Order now: " strong { (r.providers.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(" → ")) }
                @if r.pinned { " (pinned by an operator)" }
                @if shifted && !r.pinned { " (shifted by quality; configured: " (r.configured.join(" → ")) ")" }
            }
            @if let (Some(why), Some(when)) = (&r.reason, r.changed_at) {
                p { "Since " (at(when, zone)) ": " (why) }
            }
            div.table-wrap {
                table.stack {
                    caption.visually-hidden { "Quality of route " (r.prefix) "'s providers, in their current order" }
                    thead { tr {
                        th scope="col" { "Provider" }
                        th scope="col" { "Verdict" }
                        th scope="col" { "Delivered" }
                        th scope="col" { "Delivery time p50 / p90" }
                        th scope="col" { "Slow" }
                        th scope="col" { "Messages" }
                        th scope="col" { "Failed / unknown" }
                        th scope="col" { "Codes entered" }
                        th scope="col" { "Cost per delivered" }
                        th scope="col" { "Outcome" }
                    } }
                    tbody {
                        @for p in &r.providers {
                            @let m = &p.measured;
                            tr {
                                th scope="row" { (p.name) }
                                td data-label="Verdict" { (verdict(&p.verdict)) }
                                td data-label="Delivered" { (pct(m.delivery_rate())) " of " (m.delivered + m.undelivered) " reported" }
                                td data-label="p50 / p90" { (secs(m.delivery_seconds(0.5))) " / " (secs(m.delivery_seconds(0.9))) }
                                td data-label="Slow" { (pct(m.slow_share())) " of " (m.judged) }
                                td data-label="Messages" { (m.messages) }
                                td data-label="Failed" { (m.failed) " / " (m.unknown) }
                                td data-label="Codes" { (pct(m.conversion())) " of " (m.codes) }
                                td data-label="Cost" { (cost(m, m.cost_per_delivered())) }
                                td data-label="Outcome" { (bar(m, slow_after_secs, &p.name)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

pub fn routes(session: &Session, report: &Report) -> Markup {
    let slow_after = report.slow_after.as_secs();
    layout(
        "Routes",
        Some(session),
        html! {
            h1 { "Routes and their quality" }
            p {
                "Measured over the last " (humantime(report.window)) " at " (at(report.at, session.zone)) ". "
                "A message still without a delivery report " (humantime(report.slow_after)) " after it was sent is slow. "
                @if report.on {
                    "Orders follow quality (SENDONCE_ROUTE_QUALITY=on): a bad provider moves down; only new messages follow."
                } @else {
                    "Quality is measured but orders do not follow it (SENDONCE_ROUTE_QUALITY=off)."
                }
            }
            p.muted { "Bars: delivered within 5 s (dark green), in time (green), late (brown), undelivered (red), no report yet (grey)." }
            @if report.routes.is_empty() {
                p { "No routes are configured (SENDONCE_ROUTES): every message takes SENDONCE_PROVIDER's order." }
            }
            @for r in &report.routes {
                (route(r, slow_after, session.zone))
            }
            @if !report.channels.is_empty() {
                section {
                    h2 { "Codes by channel" }
                    div.table-wrap {
                        table.stack {
                            caption.visually-hidden { "Codes sent and entered by channel and provider" }
                            thead { tr { th scope="col" { "Provider" } th scope="col" { "Codes sent" } th scope="col" { "Entered" } th scope="col" { "Delivered" } } }
                            tbody {
                                @for m in &report.channels {
                                    tr {
                                        th scope="row" { (m.provider) }
                                        td data-label="Codes sent" { (m.codes) }
                                        td data-label="Entered" { (pct(m.conversion())) }
                                        td data-label="Delivered" { (pct(m.delivery_rate())) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            p.muted { "To pin an order: PUT /routes/{prefix}/pin with {\"providers\": [...]} (admin scope); see docs/operators.md." }
        },
    )
}
