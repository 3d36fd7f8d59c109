//! The module-wide fencing-token counter shared by every lock kind.
//!
//! Tokens strictly increase across all grants of the server. The counter is
//! saved in RDB aux data, raised past every fence seen in a loaded key or a
//! replicated effect, and raised to at least `unix_ms << 10` on every draw, so
//! that even a failover that lost the last writes keeps new tokens above the
//! old ones (as long as fewer than 1024 tokens a millisecond were drawn).

use std::sync::atomic::{AtomicU64, Ordering};

/// Largest token: 2^53 − 1, so every token stays exact in every client
/// language (JavaScript numbers are doubles). Clock-derived tokens reach it in
/// the year 2248; loaded keys, restored payloads and effects above it are refused.
pub const MAX_FENCE: u64 = (1 << 53) - 1;

/// How far above the clock floor a token from outside (a loaded key, a
/// restored payload, an effect, aux data) may be: 2^40 tokens, about twelve
/// days of clock at 1024 tokens a millisecond. A payload crafted near 2^53
/// would otherwise push every later token past what clients can represent,
/// and an RDB holding such tokens could not be loaded again.
pub const MAX_LEAD: u64 = 1 << 40;

/// Whether a token from outside is plausible: positive, at most 2^53 − 1, and
/// not absurdly far ahead of the clock.
pub fn acceptable(fence: u64) -> bool {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    acceptable_at(fence, now_ms)
}

pub fn acceptable_at(fence: u64, now_ms: u64) -> bool {
    (1..=MAX_FENCE).contains(&fence) && fence <= (now_ms << 10).saturating_add(MAX_LEAD)
}

/// A fencing counter; pure, so its rule is unit-tested.
pub struct FenceCounter(AtomicU64);

impl FenceCounter {
    pub const fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// The next token: above every token drawn or observed, and at least `now_ms << 10`.
    pub fn draw(&self, now_ms: i64) -> u64 {
        let floor = (now_ms.max(0) as u64).saturating_mul(1 << 10);
        let next = self.last().saturating_add(1).max(floor);
        self.0.store(next, Ordering::Relaxed);
        next
    }

    /// Remembers a token granted elsewhere (a loaded key, a replicated effect, aux data).
    pub fn observe(&self, fence: u64) {
        self.0.fetch_max(fence, Ordering::Relaxed);
    }

    /// Moves past every token another server could have drawn up to `now_ms`
    /// (a replica promoted in the same millisecond as its old master's last
    /// draw would otherwise start at the same clock floor).
    pub fn skip_past(&self, now_ms: i64) {
        let next_floor = (now_ms.max(0) as u64 + 1).saturating_mul(1 << 10);
        self.observe(next_floor - 1);
    }

    pub fn last(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Default for FenceCounter {
    fn default() -> Self {
        Self::new()
    }
}

/// The counter of this server. Only the main thread draws; a forked child
/// saving the RDB reads its own copy.
pub static FENCES: FenceCounter = FenceCounter::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_strictly_increase_within_one_millisecond() {
        let c = FenceCounter::new();
        let a = c.draw(1000);
        let b = c.draw(1000);
        assert_eq!(a, 1000 << 10);
        assert_eq!(b, a + 1);
    }

    #[test]
    fn draw_jumps_to_the_clock_floor() {
        let c = FenceCounter::new();
        c.draw(1000);
        assert_eq!(c.draw(2000), 2000 << 10);
    }

    #[test]
    fn observed_fences_are_never_reissued() {
        let c = FenceCounter::new();
        c.observe(u64::from(u32::MAX) << 20);
        assert!(c.draw(5) > u64::from(u32::MAX) << 20);
        c.observe(3);
        assert!(c.last() > 3);
    }

    #[test]
    fn tokens_from_outside_stay_near_the_clock_and_below_two_pow_53() {
        let now = 1_800_000_000_000u64;
        assert!(acceptable_at(1, now));
        assert!(acceptable_at((now << 10) + MAX_LEAD, now));
        assert!(!acceptable_at((now << 10) + MAX_LEAD + 1, now));
        assert!(!acceptable_at(0, now));
        assert!(!acceptable_at(1 << 53, u64::MAX >> 12));
    }

    #[test]
    fn a_promotion_skips_the_current_millisecond() {
        let c = FenceCounter::new();
        c.skip_past(1000);
        assert_eq!(c.draw(1000), 1001 << 10);
    }

    #[test]
    fn clock_going_back_does_not_lower_tokens() {
        let c = FenceCounter::new();
        let a = c.draw(10_000);
        assert!(c.draw(5_000) > a);
    }
}
