//! Stopping a message that carries a verification's code (issue 39): when
//! the verification moves on to its next channel, or ends, every message
//! of it that has not gone out must never go out. What that takes is a pure
//! function of the message's row as read inside the transaction of the
//! move or the end (row-locked on Postgres, under the single writer on
//! SQLite), so nothing decides on a row read before a wait:
//!
//! | the message, fresh                                   | the move to the next channel | the end         |
//! |------------------------------------------------------|------------------------------|-----------------|
//! | reported delivered (its status, or a receipt's)      | not made: no next channel    | nothing to stop |
//! | final (sent, failed, unknown, undelivered, canceled) | made                         | nothing to stop |
//! | processing, held by a lease (a call may be in flight)| not now: asked again later   | expired         |
//! | processing, cancelable (no lease, no open attempt,   | made, the message canceled   | canceled        |
//! | nothing maybe sent: waiting for a retry)             |                              |                 |
//! | processing, not cancelable (an open attempt: it is   | made, the message expired    | expired         |
//! | only ever looked up again; or maybe sent)            |                              |                 |
//!
//! "Expired" is its `expires_at` moved to now: no attempt starts after it
//! (`delivery::decide`), and a delivery checks it in a write right before
//! each provider call of such a message (`FallbackStore::guard_send`), so a
//! holder that read the row before the stop does not call after it. A
//! call already past that write was made before the stop.

use time::OffsetDateTime;

use super::Status;
use super::schedule::cancelable;

/// What the transaction does with the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// It cannot go out any more (final, or already past its validity).
    Nothing,
    /// Canceled: it never went out and now never will.
    Cancel,
    /// Its validity ends now: no provider call starts after this.
    Expire,
    /// Reported delivered: the verification needs no next channel.
    Delivered,
    /// Held by a lease: a call may be in flight; decide again later.
    Busy,
}

/// The message as the transaction read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fresh {
    pub status: Status,
    /// A receipt reported it delivered (or read), whatever its status can
    /// show: a message that ended `unknown` keeps its status when a report
    /// of delivery comes later (issue 40: WhatsApp's statuses of a send
    /// whose answer was lost).
    pub reported_delivered: bool,
    pub leased: bool,
    pub attempt_open: bool,
    pub maybe_sent: bool,
    pub expires_at: Option<OffsetDateTime>,
}

/// What moving on to the next channel does with the message it moves on
/// from, at `now`.
pub fn for_next_channel(m: &Fresh, now: OffsetDateTime) -> Stop {
    if m.reported_delivered {
        return Stop::Delivered;
    }
    match m.status {
        Status::Delivered => Stop::Delivered,
        Status::Processing | Status::Scheduled if m.leased => Stop::Busy,
        _ => stopped(m, now),
    }
}

/// What ending the verification does with one of its messages, at `now`:
/// a held message cannot be waited for (the end is now), so it is expired
/// and its holder's check before the call stops it.
pub fn for_end(m: &Fresh, now: OffsetDateTime) -> Stop {
    match m.status {
        Status::Delivered => Stop::Nothing,
        _ => stopped(m, now),
    }
}

fn stopped(m: &Fresh, now: OffsetDateTime) -> Stop {
    if !matches!(m.status, Status::Processing | Status::Scheduled) {
        return Stop::Nothing;
    }
    if cancelable(m.status, m.leased, m.attempt_open, m.maybe_sent) {
        return Stop::Cancel;
    }
    if m.expires_at.is_some_and(|e| e <= now) {
        return Stop::Nothing;
    }
    Stop::Expire
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_stop_does_as_a_table() {
        let now = OffsetDateTime::from_unix_timestamp(1_700_000_000).expect("time");
        let later = Some(now + time::Duration::minutes(5));
        let past = Some(now - time::Duration::seconds(1));
        let m = |status: Status, leased, attempt_open, maybe_sent, expires_at| Fresh {
            status,
            reported_delivered: false,
            leased,
            attempt_open,
            maybe_sent,
            expires_at,
        };
        use Status::{Canceled, Failed, Processing, Sent, Undelivered, Unknown};
        use Stop::{Busy, Cancel, Expire, Nothing};
        const DELIVERED: Status = Status::Delivered;
        // (message, next channel, end)
        #[rustfmt::skip]
        let rows = [
            (m(DELIVERED, false, false, false, later), Stop::Delivered, Nothing),
            (m(Sent, false, false, false, later), Nothing, Nothing),
            (m(Failed, false, false, false, later), Nothing, Nothing),
            (m(Unknown, false, false, true, later), Nothing, Nothing),
            (m(Undelivered, false, false, false, later), Nothing, Nothing),
            (m(Canceled, false, false, false, later), Nothing, Nothing),
            // A call may be in flight: the move waits; the end cannot.
            (m(Processing, true, true, false, later), Busy, Expire),
            (m(Processing, true, false, false, later), Busy, Expire),
            // Waiting for a retry (FLOOD_WAIT, a check being retried).
            (m(Processing, false, false, false, later), Cancel, Cancel),
            // Looked up again after an ambiguous answer: never sent again.
            (m(Processing, false, true, true, later), Expire, Expire),
            (m(Processing, false, false, true, later), Expire, Expire),
            // Left open to be looked up again (a recheck due).
            (m(Processing, false, true, false, later), Expire, Expire),
            (m(Processing, false, true, false, past), Nothing, Nothing),
            // Its owner died mid-call: the lease, though run out, holds it
            // until a rescuer takes it over and lets it go.
            (m(Processing, true, true, false, past), Busy, Nothing),
            // A send that ended `unknown` and was then reported delivered
            // (WhatsApp's status of a send whose answer was lost): no next
            // channel, though its status stays `unknown`.
            (Fresh { reported_delivered: true, ..m(Unknown, false, false, true, later) }, Stop::Delivered, Nothing),
            (Fresh { reported_delivered: true, ..m(Sent, false, false, false, later) }, Stop::Delivered, Nothing),
        ];
        for (fresh, next, end) in rows {
            assert_eq!(for_next_channel(&fresh, now), next, "{fresh:?}");
            assert_eq!(for_end(&fresh, now), end, "{fresh:?}");
        }
    }
}
