//! Where a message starts: its provider, who its first attempt sends as,
//! and the route that chose them. Delivery picks it, verify and the send
//! path write it on the message; in `domain`, below all three.

/// The provider a message starts on, and who its first attempt sends as
/// there.
#[derive(Clone, Debug)]
pub struct Via {
    pub provider: String,
    pub sender: Option<String>,
    /// The route (`SENDONCE_ROUTES` prefix) the number took, if routed.
    pub route: Option<String>,
    /// The providers the message takes, in order, when not its route's
    /// configured order (issue 43): stored with it, its failover follows it.
    pub order: Option<String>,
}
