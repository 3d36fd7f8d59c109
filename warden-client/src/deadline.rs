//! A caller's deadline, turned into the `WAIT` a blocking command carries.

use std::time::Duration;

use tokio::time::Instant;

/// When a caller stops waiting, measured from its call (monotonic clock);
/// `None`: it waits until granted (`WAIT 0`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline(Option<Instant>);

impl Deadline {
    /// `wait` from now; zero waits forever.
    pub(crate) fn after(wait: Duration) -> Self {
        Deadline((!wait.is_zero()).then(|| Instant::now() + wait))
    }

    pub(crate) fn passed(&self) -> bool {
        self.0.is_some_and(|end| Instant::now() >= end)
    }

    /// Time left (None: no end). Zero once passed.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        self.0
            .map(|end| end.saturating_duration_since(Instant::now()))
    }

    /// The `WAIT` argument for a command sent now, in ms: `0` (forever) for
    /// no end, else what remains less a margin for the reply's way back
    /// (a tenth, 1..=5 ms), at least 1 — never 0, which would mean forever.
    /// `None` once nothing remains: the command must not be sent.
    pub(crate) fn wait_arg(&self) -> Option<u64> {
        let Some(remaining) = self.remaining() else {
            return Some(0);
        };
        if remaining.is_zero() {
            return None;
        }
        let margin = (remaining / 10).clamp(Duration::from_millis(1), Duration::from_millis(5));
        let ms = remaining.saturating_sub(margin).as_millis();
        Some(u64::try_from(ms).unwrap_or(u64::MAX).max(1))
    }

    /// Runs `f` until the deadline; `None` if it passed first.
    pub(crate) async fn within<F: std::future::Future>(&self, f: F) -> Option<F::Output> {
        match self.remaining() {
            None => Some(f.await),
            Some(left) => tokio::time::timeout(left, f).await.ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_wait_sent_is_what_remains_less_the_margin() {
        let ms = Duration::from_millis;
        // (deadline, time already spent, WAIT sent)
        let cases = [
            (ms(50), ms(0), Some(45)),
            (ms(50), ms(20), Some(27)),
            (ms(1000), ms(0), Some(995)),
            (ms(5), ms(0), Some(4)),
            (ms(2), ms(1), Some(1)),
            (ms(50), ms(50), None),
            (ms(50), ms(70), None),
        ];
        for (wait, spent, sent) in cases {
            let deadline = Deadline::after(wait);
            tokio::time::advance(spent).await;
            assert_eq!(deadline.wait_arg(), sent, "{wait:?} after {spent:?}");
        }
        assert_eq!(Deadline::after(Duration::ZERO).wait_arg(), Some(0));
        assert!(!Deadline::after(Duration::ZERO).passed());
    }
}
