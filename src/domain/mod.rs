//! What a message is, without I/O: validated newtypes (parse, don't validate),
//! the recipient (one variant per channel; SMS's is a phone number),
//! SMS segment counting, the canonical request and its fingerprint, and the
//! message's states.

pub mod attempt;
pub mod channels;
pub mod idempotency_key;
pub mod inbound;
pub mod message;
pub mod opt_out;
pub mod phone;
#[cfg(test)]
mod proptests;
pub mod quality;
pub mod quiet;
pub mod recipient;
pub mod request;
pub mod schedule;
pub mod sealed;
pub mod segments;
pub mod spend;
pub mod stop;
pub mod verification;
pub mod via;

pub use attempt::AttemptOutcome;
pub use channels::{Channel, Channels, FallbackAfter};
pub use idempotency_key::IdempotencyKey;
pub use message::{MessageError, MessageId, MessageOut, Status};
pub use phone::Phone;
pub use recipient::Recipient;
pub use request::{FieldError, SendRequest};
pub use segments::{Encoding, SegmentCount};
pub use via::Via;
