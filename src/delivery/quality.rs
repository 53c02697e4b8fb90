//! Routes that react to measured quality (issue 43): the decisions, pure.
//!
//! Each route's providers are measured over a sliding window from the
//! database ([`Measured`], one row per route and provider, the same for
//! every instance). [`verdict`] says whether a provider is slow, delivers
//! clearly less than the route's best other provider, or has its codes
//! entered clearly less; [`decide`] turns the verdicts into the route's next
//! order: the providers judged bad move below the others, in their
//! configured order among themselves, at most once per cooldown, never while
//! an operator's pin holds, and back as soon as they measure well again
//! (every provider that is not first keeps a floor of new messages for
//! measuring: [`first_for`]).
//!
//! The order chooses where a *new* message starts, and the order its
//! failover follows (stored with the message when it is not the configured
//! one). Nothing here moves a message already attempted: only the routing
//! rules of [`route`](super::route) do, and only when the provider certainly
//! did not send it.
//!
//! | situation                                             | change            |
//! |-------------------------------------------------------|-------------------|
//! | quality off, a pin, or fewer than two providers       | none              |
//! | within the cooldown of the last change                | none              |
//! | a provider with enough samples is slow / delivers or  | it moves below    |
//! | converts clearly less than the route's best other     | the others        |
//! | every measured provider is bad, none unmeasured       | configured order  |
//! | a demoted provider measures well again (relaxed bar)  | back in its place |
//! | too few samples                                       | unmeasured: kept  |
//! |                                                       | where it is       |
//! | prices set, prefer-cheaper margin: two good providers | cheaper first     |
//! | within the margin of the best delivery rate           |                   |

use std::time::Duration;

use time::OffsetDateTime;

pub use crate::domain::quality::{BUCKETS, Measured};

/// When a provider counts as bad, and how often an order may change.
#[derive(Clone, Debug, PartialEq)]
pub struct Thresholds {
    /// Share of messages without a final receipt `slow_after` after they
    /// were sent at which a provider is slow (0.15).
    pub slow_share: f64,
    /// How long after it was sent a message without a final receipt is
    /// slow (5 minutes).
    pub slow_after: Duration,
    /// How far (a share, 0.10) a provider's delivery rate or conversion may
    /// fall below the route's best other provider's before it is bad.
    pub gap: f64,
    /// Samples (judged messages, or codes sent) a provider needs in the
    /// window before it is judged at all.
    pub min_samples: u32,
    /// Least time between two changes of a route's order.
    pub cooldown: Duration,
    /// Share of new messages each provider that is not first starts
    /// (0.05): what keeps a demoted provider measured.
    pub floor: f64,
    /// With prices: a provider within this share of the best delivery rate
    /// that costs less per delivered message goes first. `None`: off.
    pub prefer_cheaper: Option<f64>,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            slow_share: 0.15,
            slow_after: Duration::from_secs(300),
            gap: 0.10,
            min_samples: 50,
            cooldown: Duration::from_secs(600),
            floor: 0.05,
            prefer_cheaper: None,
        }
    }
}

/// Route orders that follow quality (`SENDONCE_ROUTE_QUALITY*`): whether,
/// over which window, how often, and the thresholds.
#[derive(Clone, Debug, PartialEq)]
pub struct QualitySettings {
    /// On by default; it changes only routes of two or more providers.
    pub on: bool,
    /// Messages created this long ago at most are measured (15m).
    pub window: Duration,
    /// How often each instance measures and decides (30s, at most 30s).
    pub every: Duration,
    pub thresholds: Thresholds,
}

impl Default for QualitySettings {
    fn default() -> Self {
        Self {
            on: true,
            window: Duration::from_secs(15 * 60),
            every: Duration::from_secs(30),
            thresholds: Thresholds::default(),
        }
    }
}

/// What the measurements say of one provider on its route.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Too few samples to say.
    Unmeasured,
    Good,
    /// Why it is bad, in words an operator reads.
    Bad(String),
}

impl Verdict {
    pub fn is_bad(&self) -> bool {
        matches!(self, Verdict::Bad(_))
    }

    /// `unmeasured`, `good` or `bad`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Unmeasured => "unmeasured",
            Verdict::Good => "good",
            Verdict::Bad(_) => "bad",
        }
    }
}

/// `5m`, `90s`, `1h`: a duration as the settings write it.
pub fn humantime(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s >= 60 && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

/// The verdict on `m` among the route's other providers' measurements. A
/// provider already demoted must clear a stricter bar to come back (two
/// thirds of the slow share, half the gap): an order does not flap on a
/// threshold.
pub fn verdict(m: &Measured, others: &[&Measured], t: &Thresholds, demoted: bool) -> Verdict {
    let (slow_bar, gap) = if demoted {
        (t.slow_share * 2.0 / 3.0, t.gap / 2.0)
    } else {
        (t.slow_share, t.gap)
    };
    let mut measured = false;
    if m.judged >= t.min_samples {
        measured = true;
        if let Some(s) = m.slow_share()
            && s >= slow_bar
        {
            return Verdict::Bad(format!(
                "{} of its {} messages had no delivery report {} after they were sent (at most {} allowed)",
                pct(s),
                m.judged,
                humantime(t.slow_after),
                pct(slow_bar)
            ));
        }
    }
    let enough = |o: &Measured| o.delivered + o.undelivered >= t.min_samples;
    if enough(m)
        && let Some(rate) = m.delivery_rate()
    {
        measured = true;
        let best = others
            .iter()
            .filter(|o| enough(o))
            .filter_map(|o| o.delivery_rate().map(|r| (r, o.provider.as_str())))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((best, name)) = best
            && rate < best - gap
        {
            return Verdict::Bad(format!(
                "it delivered {} of {} reported messages, {name} {}",
                pct(rate),
                m.delivered + m.undelivered,
                pct(best)
            ));
        }
    }
    if m.codes >= t.min_samples
        && let Some(conv) = m.conversion()
    {
        measured = true;
        let best = others
            .iter()
            .filter(|o| o.codes >= t.min_samples)
            .filter_map(|o| o.conversion().map(|r| (r, o.provider.as_str())))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((best, name)) = best
            && conv < best - gap
        {
            return Verdict::Bad(format!(
                "{} of its {} codes were entered, {name}'s {}",
                pct(conv),
                m.codes,
                pct(best)
            ));
        }
    }
    if measured {
        Verdict::Good
    } else {
        Verdict::Unmeasured
    }
}

/// A route's stored order, as [`decide`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Current {
    /// The providers in their current order (the configured one when the
    /// route was never shifted).
    pub providers: Vec<String>,
    pub pinned: bool,
    /// When it last changed; `None`: never.
    pub changed_at: Option<OffsetDateTime>,
}

/// A new order for a route, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub providers: Vec<String>,
    pub reason: String,
}

/// The order `configured`'s providers take from `stored` (a stored order,
/// if any): the stored one's providers that the route still names, then
/// any it did not name, in configured order. The route's configuration is
/// the truth; a stored order only orders it.
pub fn effective(configured: &[&str], stored: Option<&[String]>) -> Vec<String> {
    let Some(stored) = stored else {
        return configured.iter().map(|s| s.to_string()).collect();
    };
    let mut out: Vec<String> = stored
        .iter()
        .filter(|s| configured.contains(&s.as_str()))
        .cloned()
        .collect();
    for c in configured {
        if !out.iter().any(|s| s == c) {
            out.push(c.to_string());
        }
    }
    out
}

/// The order the route should take now, and why, or `None` to keep it.
/// `measured` holds the route's rows (any provider not in it is
/// unmeasured); `prices_set` allows the prefer-cheaper option.
pub fn decide(
    configured: &[&str],
    current: &Current,
    measured: &[Measured],
    t: &Thresholds,
    now: OffsetDateTime,
) -> Option<Change> {
    if current.pinned || configured.len() < 2 {
        return None;
    }
    if let Some(at) = current.changed_at
        && now - at < t.cooldown
    {
        return None;
    }
    let empty = Measured::default();
    let of = |name: &str| {
        measured
            .iter()
            .find(|m| m.provider == name)
            .unwrap_or(&empty)
    };
    let position_now = |name: &str| current.providers.iter().position(|p| p == name);
    let position_configured = |name: &str| configured.iter().position(|p| *p == name);
    let verdicts: Vec<(&str, Verdict)> = configured
        .iter()
        .map(|name| {
            let m = of(name);
            let others: Vec<&Measured> = configured
                .iter()
                .filter(|o| *o != name)
                .map(|o| of(o))
                .collect();
            // Demoted: it stands lower now than it was configured.
            let demoted = match (position_now(name), position_configured(name)) {
                (Some(now), Some(conf)) => now > conf,
                _ => false,
            };
            (*name, verdict(m, &others, t, demoted))
        })
        .collect();
    let demoted = |name: &str| {
        matches!(
            (position_now(name), position_configured(name)),
            (Some(now), Some(conf)) if now > conf
        )
    };
    // Below the others: the bad, and the demoted too little measured to
    // say they recovered (kept where they are).
    let mut good: Vec<&str> = Vec::new();
    let mut bad: Vec<(&str, &str)> = Vec::new();
    for (name, v) in &verdicts {
        match v {
            Verdict::Bad(why) => bad.push((name, why)),
            Verdict::Unmeasured if demoted(name) => bad.push((name, "")),
            _ => good.push(name),
        }
    }
    // Nothing better to put first: the configured order.
    let all_bad = good.is_empty();
    if all_bad {
        good = configured.to_vec();
        bad.clear();
    }
    if let Some(margin) = t.prefer_cheaper {
        prefer_cheaper(&mut good, &verdicts, &of, margin);
    }
    let target: Vec<String> = good
        .iter()
        .chain(bad.iter().map(|(n, _)| n))
        .map(|s| s.to_string())
        .collect();
    if target == current.providers {
        return None;
    }
    let reason = if all_bad {
        "every provider measures badly: the configured order".to_string()
    } else if bad.is_empty()
        && target == configured.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    {
        let back: Vec<&str> = configured.iter().filter(|n| demoted(n)).copied().collect();
        if back.is_empty() {
            "the configured order".to_string()
        } else {
            format!("{} measures well again: back in its place", back.join(", "))
        }
    } else {
        let mut parts: Vec<String> = bad
            .iter()
            .filter(|(_, why)| !why.is_empty())
            .map(|(n, why)| format!("{n} moved down: {why}"))
            .collect();
        if parts.is_empty() {
            parts.push("cheaper at the same quality first".to_string());
        }
        parts.join("; ")
    };
    Some(Change {
        providers: target,
        reason,
    })
}

/// Among `good` (configured order), the measured providers within
/// `margin` of the best delivery rate go first, cheapest per delivered
/// message first; the rest keep their order after them.
fn prefer_cheaper<'a>(
    good: &mut Vec<&'a str>,
    verdicts: &[(&str, Verdict)],
    of: &dyn Fn(&str) -> &'a Measured,
    margin: f64,
) {
    let measured_good = |n: &str| verdicts.iter().any(|(v, x)| *v == n && *x == Verdict::Good);
    let best = good
        .iter()
        .filter(|n| measured_good(n))
        .filter_map(|n| of(n).delivery_rate())
        .fold(None::<f64>, |a, r| Some(a.map_or(r, |a| a.max(r))));
    let Some(best) = best else { return };
    let close = |n: &str| {
        measured_good(n)
            && of(n).cost_per_delivered().is_some()
            && of(n).delivery_rate().is_some_and(|r| r >= best - margin)
    };
    let mut front: Vec<&'a str> = good.iter().copied().filter(|n| close(n)).collect();
    if front.len() < 2 {
        return;
    }
    front.sort_by_key(|n| of(n).cost_per_delivered().unwrap_or(i64::MAX));
    let rest: Vec<&'a str> = good.iter().copied().filter(|n| !close(n)).collect();
    *good = front.into_iter().chain(rest).collect();
}

/// The order a new message takes, given the route's current `order` and
/// this route's `n`th new message on this instance: each provider that is
/// not first starts one message in every `1 / floor` (the floor that keeps
/// it measured); the message then fails over along the rest in order.
/// `floor` 0 (or a pin) sends every message along `order`.
pub fn first_for(order: &[String], n: u64, floor: f64) -> Vec<String> {
    let k = order.len() as u64;
    if k < 2 || floor <= 0.0 {
        return order.to_vec();
    }
    let every = (1.0 / floor).round().max(2.0) as u64;
    let slot = n % every;
    // The last k-1 slots of every cycle go to the providers after the
    // first, one each.
    let others = (k - 1).min(every - 1);
    let from_end = every - slot;
    if from_end > others {
        return order.to_vec();
    }
    let i = from_end as usize;
    let mut out = Vec::with_capacity(order.len());
    out.push(order[i].clone());
    out.extend(
        order
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, p)| p.clone()),
    );
    out
}

#[cfg(test)]
#[path = "quality_tests.rs"]
mod tests;
