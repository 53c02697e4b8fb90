//! What a channel's inbound update does (issue 40): the same for every
//! channel whose adapter declares an inbound route
//! (`provider::registry::Inbound`), taken once by the store under the
//! unique (channel, source, event id) of its row, with its event and its
//! opt-out in the same transaction.

/// What an update does, besides being taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Nothing (not a new text message).
    None,
    /// A new text message: its event, and the opt-out it asks for, if any
    /// (`Some(true)`: out, `Some(false)`: back in).
    Received {
        address: String,
        event: Vec<u8>,
        opt_out: Option<bool>,
    },
}

/// An update read and decided by its channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Update {
    /// Its id at the source (unique per source, as long as it is kept).
    pub event_id: i64,
    pub effect: Effect,
}
