//! How one provider attempt ended, as stored in `attempts.outcome` and shown
//! by `GET /messages/{key}/attempts`.

use std::fmt;

/// The recorded end of one attempt. Stored as its [`as_str`](Self::as_str)
/// name; nothing compares those names as strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptOutcome {
    /// The provider accepted the message.
    Sent,
    /// The provider refused the message itself: no retry helps.
    Rejected,
    /// The provider refused everything we send (bad credentials, suspended
    /// account): it did not send it; another provider may.
    Refused,
    /// The provider certainly did not send it; a retry may succeed.
    Retryable,
    /// No clear answer: the provider may have sent it.
    Ambiguous,
    /// An earlier ambiguous attempt turned out to have been sent.
    Reconciled,
    /// An open attempt whose outcome can no longer be learned.
    Lost,
    /// The message outlived its validity before this attempt could run.
    Expired,
    /// The recipient opted out; the provider was not called.
    OptedOut,
    /// The message could not be handed to a provider (a sealed body whose
    /// secret is gone); the provider was not called.
    Unsendable,
}

impl AttemptOutcome {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sent => "sent",
            Self::Rejected => "rejected",
            Self::Refused => "refused",
            Self::Retryable => "retryable",
            Self::Ambiguous => "ambiguous",
            Self::Reconciled => "reconciled",
            Self::Lost => "lost",
            Self::Expired => "expired",
            Self::OptedOut => "opted_out",
            Self::Unsendable => "unsendable",
        }
    }

    /// The outcome a stored name stands for.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "sent" => Self::Sent,
            "rejected" => Self::Rejected,
            "refused" => Self::Refused,
            "retryable" => Self::Retryable,
            "ambiguous" => Self::Ambiguous,
            "reconciled" => Self::Reconciled,
            "lost" => Self::Lost,
            "expired" => Self::Expired,
            "opted_out" => Self::OptedOut,
            "unsendable" => Self::Unsendable,
            _ => return None,
        })
    }

    /// The provider may have acted on the message.
    pub fn maybe_sent(self) -> bool {
        matches!(self, Self::Ambiguous)
    }
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::AttemptOutcome::*;

    #[test]
    fn names_are_the_stored_ones() {
        let all = [
            (Sent, "sent"),
            (Rejected, "rejected"),
            (Refused, "refused"),
            (Retryable, "retryable"),
            (Ambiguous, "ambiguous"),
            (Reconciled, "reconciled"),
            (Lost, "lost"),
            (Expired, "expired"),
            (OptedOut, "opted_out"),
            (Unsendable, "unsendable"),
        ];
        for (outcome, name) in all {
            assert_eq!(outcome.as_str(), name);
            assert_eq!(super::AttemptOutcome::parse(name), Some(outcome));
            assert_eq!(outcome.maybe_sent(), name == "ambiguous");
        }
    }
}
