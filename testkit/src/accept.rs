//! The mock provider's accept loop. An accept error (EMFILE when the process
//! is out of file descriptors, ECONNABORTED, ...) usually persists for a
//! while: retrying at once would spin a core, so the loop waits, doubling the
//! wait from [`FIRST_DELAY`] up to [`MAX_DELAY`], and starts over after the
//! next successful accept.

use std::fmt::Display;
use std::time::Duration;

/// The wait after the first of a run of accept errors.
pub const FIRST_DELAY: Duration = Duration::from_millis(5);
/// The longest wait between two accept attempts.
pub const MAX_DELAY: Duration = Duration::from_secs(1);

/// How long to wait before the next accept attempt.
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    last: Option<Duration>,
}

impl AcceptBackoff {
    /// An accept failed: the wait before trying again.
    pub fn on_error(&mut self) -> Duration {
        let next = match self.last {
            None => FIRST_DELAY,
            Some(d) => (d * 2).min(MAX_DELAY),
        };
        self.last = Some(next);
        next
    }

    /// An accept succeeded: the next error starts from the first wait again.
    pub fn on_success(&mut self) {
        self.last = None;
    }
}

/// Calls `accept` until it returns `None` (a real listener never does),
/// handing each connection to `handle` and backing off after errors.
pub async fn accept_loop<C, E, A, F, H>(mut accept: A, mut handle: H)
where
    A: FnMut() -> F,
    F: Future<Output = Option<Result<C, E>>>,
    E: Display,
    H: FnMut(C),
{
    let mut backoff = AcceptBackoff::default();
    while let Some(accepted) = accept().await {
        match accepted {
            Ok(conn) => {
                backoff.on_success();
                handle(conn);
            }
            Err(e) => {
                let wait = backoff.on_error();
                tracing::warn!(error = %e, ?wait, "mock provider: accept failed; backing off");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    #[test]
    fn waits_double_up_to_the_cap_and_reset_after_a_success() {
        let mut b = AcceptBackoff::default();
        let waits: Vec<u64> = (0..10).map(|_| b.on_error().as_millis() as u64).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.on_success();
        assert_eq!(b.on_error(), FIRST_DELAY);
    }

    /// Errors on every accept: the loop must not retry at once (a spin);
    /// on paused time the attempts are spread by the growing waits.
    #[tokio::test(start_paused = true)]
    async fn persistent_accept_errors_are_retried_with_growing_waits() {
        let start = Instant::now();
        let mut attempts = Vec::new();
        accept_loop(
            || {
                attempts.push(start.elapsed());
                let stop = attempts.len() > 12;
                async move { (!stop).then_some(Err::<(), _>("EMFILE")) }
            },
            |()| {},
        )
        .await;
        let gaps: Vec<Duration> = attempts.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(gaps[0], FIRST_DELAY);
        assert!(gaps.windows(2).all(|w| w[1] >= w[0]), "{gaps:?}");
        assert_eq!(gaps.last(), Some(&MAX_DELAY));
    }

    /// A success in between: the next error waits the first delay again.
    #[tokio::test(start_paused = true)]
    async fn a_successful_accept_resets_the_wait() {
        let start = Instant::now();
        let mut attempts = Vec::new();
        let mut handled = 0;
        // err, err, err, ok, err, stop
        let script = [false, false, false, true, false];
        accept_loop(
            || {
                attempts.push(start.elapsed());
                let next = script.get(attempts.len() - 1).copied();
                async move { next.map(|ok| if ok { Ok(()) } else { Err("EMFILE") }) }
            },
            |()| handled += 1,
        )
        .await;
        assert_eq!(handled, 1);
        let gaps: Vec<Duration> = attempts.windows(2).map(|w| w[1] - w[0]).collect();
        let ms = Duration::from_millis;
        assert_eq!(gaps, [ms(5), ms(10), ms(20), ms(0), ms(5)]);
    }
}
