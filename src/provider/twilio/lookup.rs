//! Matching Twilio's listed messages against the attempt being reconciled:
//! a pure verdict per listed message, and a tally that answers only when
//! exactly one candidate remains.

use super::*;

/// How a listed message compares with the one an attempt may have created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Match {
    /// To, direction, sender and body are ours, created within the window.
    Same,
    /// Nothing rules it out, but something needed to tell is missing (a
    /// redacted body, no sender, no readable date): it may be ours.
    Maybe,
    /// Certainly not the message this attempt created.
    Other,
}

impl Match {
    pub(super) fn and(self, other: Match) -> Match {
        match (self, other) {
            (Match::Other, _) | (_, Match::Other) => Match::Other,
            (Match::Maybe, _) | (_, Match::Maybe) => Match::Maybe,
            _ => Match::Same,
        }
    }
}

/// `Same` when `listed` is `ours`, `Other` when it is something else,
/// `Maybe` when Twilio did not show it.
pub(super) fn field(listed: Option<&str>, ours: impl Fn(&str) -> bool) -> Match {
    match listed {
        None | Some("") => Match::Maybe,
        Some(v) if ours(v) => Match::Same,
        Some(_) => Match::Other,
    }
}

/// When a listed message was created, if Twilio says so readably.
pub(super) fn created(m: &TwilioMessage) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(m.date_created.as_deref()?, &Rfc2822).ok()
}

/// Whether `m` is the message `sms`, sent as `sender` by an attempt that
/// started at `not_before` + [`CLOCK_SLACK`], may have created. Its status
/// does not matter: a `queued`, `accepted`, `scheduled` or `sending`
/// message was created as surely as a `delivered` one.
pub(super) fn compare(
    m: &TwilioMessage,
    sms: &OutgoingSms,
    sender: &Sender,
    not_before: OffsetDateTime,
) -> Match {
    let to = field(m.to.as_deref(), |to| sms.to == to);
    // What a create through the API makes; `outbound-reply`/`outbound-call`
    // come from TwiML, never from this adapter.
    let direction = field(m.direction.as_deref(), |d| d == "outbound-api");
    // Equal, or with the trial-account prefix: nothing else (a message that
    // merely ends with ours is someone else's, e.g. "Your code is 1234"
    // against our "1234").
    let body = field(m.body.as_deref(), |b| {
        b == sms.body || b.strip_prefix(TRIAL_PREFIX) == Some(sms.body.as_str())
    });
    let service = match &sender.messaging_service_sid {
        Some(ours) => field(m.messaging_service_sid.as_deref(), |s| s == ours),
        None => Match::Same,
    };
    let from = match (&sender.from, m.from.as_deref()) {
        (None, _) => Match::Same,
        (Some(ours), Some(f)) if !f.is_empty() => field(Some(f), |f| f == ours),
        // No sender shown: only a message sent through a messaging service
        // lacks one, while the service chooses it.
        (Some(_), _) => match (
            m.messaging_service_sid.as_deref().filter(|s| !s.is_empty()),
            &sender.messaging_service_sid,
        ) {
            (Some(theirs), Some(ours)) => field(Some(theirs), |s| s == ours),
            (Some(_), None) => Match::Other,
            (None, _) => Match::Maybe,
        },
    };
    let when = match created(m) {
        Some(at) if at >= not_before => Match::Same,
        Some(_) => Match::Other,
        None => Match::Maybe,
    };
    [to, direction, body, service, from, when]
        .into_iter()
        .fold(Match::Same, Match::and)
}

/// What the listed messages read so far say.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Sids of the messages that are ours by every field.
    pub(super) same: Vec<String>,
    /// Messages that may be ours (or are, but show no sid).
    pub(super) maybe: usize,
}

impl Tally {
    pub(super) fn add(&mut self, m: &TwilioMessage, verdict: Match) {
        match (verdict, m.sid.as_deref().filter(|s| !s.is_empty())) {
            (Match::Same, Some(sid)) => self.same.push(sid.to_string()),
            (Match::Same | Match::Maybe, _) => self.maybe += 1,
            (Match::Other, _) => {}
        }
    }

    /// The answer once the whole window has been read: exactly one message
    /// that is ours and none that may be, sent; none at all, not known
    /// yet (Twilio documents no bound on how soon a message it created is
    /// listed: asked again, never resent); anything else, nobody can tell
    /// which (never a guess).
    pub(super) fn verdict(self) -> Reconciled {
        match (self.same.as_slice(), self.maybe) {
            ([], 0) => Reconciled::Pending(
                "Twilio lists no such message yet (its list may lag: Twilio documents no \
                 bound); asking again, never resending"
                    .into(),
            ),
            ([sid], 0) => Reconciled::Sent {
                provider_message_id: sid.clone(),
            },
            (same, maybe) => {
                let mut reason = format!(
                    "Twilio lists {} messages that may be this one",
                    same.len() + maybe
                );
                if !same.is_empty() {
                    let shown: Vec<&str> = same.iter().take(3).map(String::as_str).collect();
                    reason.push_str(&format!(" ({}", shown.join(", ")));
                    if same.len() > shown.len() {
                        reason.push_str(", ...");
                    }
                    reason.push(')');
                }
                Reconciled::Unknown(reason)
            }
        }
    }
}
