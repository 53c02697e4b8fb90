//! What route quality measures (issue 43): one provider on one route over
//! a window, as the database counts it, and the ratios read from it. The
//! decisions on it are `delivery::quality`'s.

/// Upper edges of the delivery-time buckets, in seconds: a percentile is
/// read as the edge of the bucket it falls in.
pub const BUCKETS: [u32; 11] = [1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800];

/// One provider on one route over the window, as the database counts it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Measured {
    /// The route's prefix (`*` the default); empty for a channel of its own.
    pub route: String,
    pub provider: String,
    /// Messages created in the window that ended on this provider.
    pub messages: u32,
    /// Of those, handed to the provider (accepted).
    pub sent: u32,
    pub delivered: u32,
    pub undelivered: u32,
    /// Ended `failed` (refused before anything was sent) or `unknown`.
    pub failed: u32,
    pub unknown: u32,
    /// Sent at least `slow_after` ago: old enough to say whether slow.
    pub judged: u32,
    /// Of the judged, those without a final receipt `slow_after` after
    /// they were sent.
    pub slow: u32,
    /// Delivered within each of [`BUCKETS`] (cumulative).
    pub within: [u32; BUCKETS.len()],
    /// Verification codes sent through it, and of those the ones whose
    /// verification was approved with this as its last code sent.
    pub codes: u32,
    pub approved: u32,
    /// What its sent messages cost (micros), when priced.
    pub cost_micros: i64,
    pub currency: Option<String>,
}

impl Measured {
    /// Delivered / final receipts; `None` without any.
    pub fn delivery_rate(&self) -> Option<f64> {
        ratio(self.delivered, self.delivered + self.undelivered)
    }

    /// Slow / judged; `None` with none judged.
    pub fn slow_share(&self) -> Option<f64> {
        ratio(self.slow, self.judged)
    }

    /// Approved / codes sent; `None` without codes.
    pub fn conversion(&self) -> Option<f64> {
        ratio(self.approved, self.codes)
    }

    /// The upper edge (seconds) of the bucket the `q` quantile of the
    /// delivered messages' time to delivery falls in; `None` without
    /// deliveries, or past the last bucket.
    pub fn delivery_seconds(&self, q: f64) -> Option<u32> {
        if self.delivered == 0 {
            return None;
        }
        let need = (f64::from(self.delivered) * q).ceil();
        BUCKETS
            .iter()
            .zip(self.within)
            .find(|(_, n)| f64::from(*n) >= need)
            .map(|(edge, _)| *edge)
    }

    /// Cost per delivered message (micros); `None` unpriced or none delivered.
    pub fn cost_per_delivered(&self) -> Option<i64> {
        (self.currency.is_some() && self.delivered > 0)
            .then(|| self.cost_micros / i64::from(self.delivered))
    }

    /// Cost per approved code (micros).
    pub fn cost_per_approved(&self) -> Option<i64> {
        (self.currency.is_some() && self.approved > 0)
            .then(|| self.cost_micros / i64::from(self.approved))
    }
}

fn ratio(n: u32, of: u32) -> Option<f64> {
    (of > 0).then(|| f64::from(n) / f64::from(of))
}
