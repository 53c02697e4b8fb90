//! What Infobip's log entries for our `messageId` say of the attempt asked
//! about: a pure verdict, tested as a table.
//!
//! Infobip documents five status groups (PENDING, UNDELIVERABLE,
//! DELIVERED, EXPIRED, REJECTED; group 5 is "rejected by Infobip or the
//! operator before it could be sent") and no bound on how soon a message
//! shows in its logs. So:
//!
//! | entries with our id                            | verdict                    |
//! |------------------------------------------------|----------------------------|
//! | one of a group but REJECTED                    | `Sent`, under our id       |
//! | REJECTED ones about the message, one of them   | `Answered`: that refusal,  |
//! | refusing the message or the account            | classified as a send's     |
//! | REJECTED ones, all retryable (Infobip's own    | `Answered` (retryable) if  |
//! | error), at least as many as attempts made      | one must be this attempt's;|
//! |                                                | else `Pending`             |
//! | only `REJECTED_DUPLICATE_MESSAGE_ID` (a        | `Pending`: about a repeat, |
//! | repeat's refusal), or none                     | nothing of the first       |
//! | one without a status of a documented group     | `Pending`                  |
//!
//! A refusal of the message or the account can only be this attempt's: an
//! earlier attempt answered so ended the message, or moved it off Infobip
//! for good. A retryable one may be an earlier attempt's (the message was
//! tried again after it), so it is this attempt's only when there are at
//! least as many as attempts made (each attempt leaves at most one entry:
//! one destination per request); otherwise this attempt's own entry may
//! still be on its way.

use super::classify::{classify_rejection, group_of, is_duplicate};
use super::{LogEntry, Status};
use crate::provider::{Reconciled, SendOutcome};

/// Groups Infobip documents for a message it has (any but REJECTED).
const HAS_IT: [&str; 5] = ["PENDING", "ACCEPTED", "UNDELIVERABLE", "DELIVERED", "EXPIRED"];

/// What `entries` (a log lookup by `ours`) say of attempt number `attempt`
/// of the message.
pub(super) fn read_logs(entries: &[LogEntry], ours: &str, attempt: u32) -> Reconciled {
    let mine: Vec<Option<&Status>> = entries
        .iter()
        .filter(|e| e.message_id.as_deref() == Some(ours))
        .map(|e| e.status.as_ref())
        .collect();
    if mine
        .iter()
        .flatten()
        .any(|s| HAS_IT.contains(&group_of(s).as_str()))
    {
        return Reconciled::Sent {
            provider_message_id: ours.to_string(),
        };
    }
    let undocumented = mine
        .iter()
        .filter(|s| s.is_none_or(|s| group_of(s) != "REJECTED"))
        .count();
    let refusals: Vec<SendOutcome> = mine
        .iter()
        .flatten()
        .filter_map(|s| classify_rejection(None, s))
        .collect();
    // The message refused (rather than the account): it goes nowhere else.
    let final_one = refusals
        .iter()
        .find(|o| matches!(o, SendOutcome::Rejected { .. }))
        .or_else(|| {
            refusals
                .iter()
                .find(|o| matches!(o, SendOutcome::Refused { .. }))
        });
    if let Some(own) = final_one {
        return Reconciled::Answered(own.clone());
    }
    if undocumented > 0 {
        return Reconciled::Pending(format!(
            "Infobip's logs show message {ours} with a status it does not document; asking again"
        ));
    }
    let retryable = refusals.len();
    if let Some(own) = refusals.into_iter().next()
        && u32::try_from(retryable).unwrap_or(u32::MAX) >= attempt
    {
        return Reconciled::Answered(own);
    }
    let repeats = mine.iter().flatten().filter(|s| is_duplicate(s)).count();
    Reconciled::Pending(if retryable > 0 {
        format!(
            "Infobip's logs show {retryable} rejection(s) of message {ours} that an earlier \
             attempt may have left, and not this attempt's (attempt {attempt}) yet; asking again, \
             never resending"
        )
    } else if repeats > 0 {
        format!(
            "Infobip's logs show only refusals of repeats of message {ours}, nothing of the \
             first; asking again, never resending"
        )
    } else {
        format!(
            "Infobip's logs show no message {ours} yet (they may lag: Infobip documents no \
             bound); asking again, never resending"
        )
    })
}
