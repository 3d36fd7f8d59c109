//! The rate limiter: GCRA (the generic cell rate algorithm) in exact
//! integer arithmetic. Pure rules; the time is an argument.
//!
//! Time is counted in *units* of `1/count` ms, so the emission interval
//! (`period / count` ms, one token's worth of time) is exactly `period`
//! units and nothing is ever rounded per token: a limiter of 3 per second
//! admits exactly 3 per second for ever, not one more per 10^6. Only the
//! reply rounds, and only up (a retry-after is the first whole ms at which
//! the request conforms).
//!
//! Invariant — the bound: a request of `cost` tokens is admitted at `now`
//! only when the theoretical arrival time it leaves behind (`tat`) is at
//! most `burst` intervals ahead of `now`: over any stretch of `d` ms at most
//! `burst + d × count / period` tokens are admitted. Every admission goes
//! through [`Limiter::decide`] (or [`Limiter::conform_at`] followed by it).
//! `tat` only moves back by a refund, and never behind `now`.

use crate::args::{RateRequest, MAX_BURST, MAX_PERIOD_MS, MAX_PER_MS};

/// The latest `tat` a limiter can have, in unix ms (about the year
/// 5,000,000): now plus the most a limiter can owe (`MAX_BURST` tokens of a
/// rate of 1 per day is about 8.6 × 10^16 ms) fits well below it. A state
/// from outside (`RESTORE`, an RDB, a replicated effect) beyond it is
/// refused, so that no arithmetic on it overflows.
pub const MAX_TAT_MS: i64 = 100_000_000_000_000_000;

/// A rate: `count` tokens per `period_ms`, at most `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub count: u64,
    pub period_ms: u64,
    pub burst: u64,
}

impl Rate {
    pub fn of(req: &RateRequest) -> Self {
        Self {
            count: req.count,
            period_ms: req.period_ms,
            burst: req.burst,
        }
    }

    /// Whether every field is in range (a request's, or one read from
    /// outside: an RDB, `RESTORE`, a replicated effect).
    pub fn valid(&self) -> bool {
        (1..=MAX_PERIOD_MS).contains(&self.period_ms)
            && self.count >= 1
            && self.count <= MAX_PER_MS * self.period_ms
            && (1..=MAX_BURST).contains(&self.burst)
    }

    /// `ms` in units.
    fn units(&self, ms: i64) -> i128 {
        i128::from(ms) * i128::from(self.count)
    }

    /// One token's worth of time, in units.
    fn interval(&self) -> i128 {
        i128::from(self.period_ms)
    }

    /// The burst's worth of time, in units.
    fn tolerance(&self) -> i128 {
        i128::from(self.burst) * self.interval()
    }

    /// `units` as whole ms, rounded up.
    fn ms_up(&self, units: i128) -> i64 {
        let c = i128::from(self.count);
        let ms = if units >= 0 {
            (units + c - 1) / c
        } else {
            -((-units) / c)
        };
        clamp_i64(ms)
    }
}

fn clamp_i64(n: i128) -> i64 {
    n.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// A limiter's state: its rate and its theoretical arrival time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limiter {
    pub rate: Rate,
    /// When the bucket is full again, in units of `1/count` ms since the
    /// epoch. At or before now: full.
    pub tat: i128,
}

/// What a request was answered (`RATE.ACQUIRE`'s reply, in ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub limited: bool,
    pub burst: u64,
    /// Whole tokens left after the decision.
    pub remaining: u64,
    /// ms until this request would conform; -1 when it was admitted.
    pub retry_after_ms: i64,
    /// ms until the bucket is full again.
    pub reset_after_ms: i64,
}

impl Decision {
    pub fn words(&self) -> [i64; 5] {
        [
            i64::from(self.limited),
            self.burst as i64,
            self.remaining.min(i64::MAX as u64) as i64,
            self.retry_after_ms,
            self.reset_after_ms,
        ]
    }
}

impl Limiter {
    /// A full bucket.
    pub fn new(rate: Rate) -> Self {
        Self { rate, tat: 0 }
    }

    /// The theoretical arrival time the limiter is judged by at `now_ms`:
    /// never behind `now`, and never behind `floor_ms` + a burst: a server
    /// that may have lost admissions made up to `floor_ms` (a restart, a
    /// promotion) starts every limiter empty from then.
    fn base(&self, now_ms: i64, floor_ms: Option<i64>) -> i128 {
        let mut base = self.tat.max(self.rate.units(now_ms));
        if let Some(floor) = floor_ms {
            base = base.max(self.rate.units(floor) + self.rate.tolerance());
        }
        base
    }

    /// Whole tokens available at `now` when the limiter is judged at `base`.
    fn tokens(&self, now_ms: i64, base: i128) -> u64 {
        let room = self.rate.units(now_ms) + self.rate.tolerance() - base;
        (room.max(0) / self.rate.interval()).min(i128::from(self.rate.burst)) as u64
    }

    /// The first ms at which a request of `cost` tokens conforms, with
    /// `ahead` tokens asked by requests served before it.
    pub fn conform_at(&self, now_ms: i64, floor_ms: Option<i64>, ahead: u64, cost: u64) -> i64 {
        let base = self.base(now_ms, floor_ms);
        let new = base + i128::from(ahead.saturating_add(cost)) * self.rate.interval();
        self.rate.ms_up(new - self.rate.tolerance()).max(now_ms)
    }

    /// Decides a request of `cost` tokens (`cost <= burst`) at `now_ms`:
    /// admitted (the tokens are taken) when it conforms, else limited and
    /// nothing changes.
    pub fn decide(&mut self, now_ms: i64, floor_ms: Option<i64>, cost: u64) -> Decision {
        let base = self.base(now_ms, floor_ms);
        let now = self.rate.units(now_ms);
        let new = base + i128::from(cost) * self.rate.interval();
        if new - now <= self.rate.tolerance() {
            self.tat = new;
            Decision {
                limited: false,
                burst: self.rate.burst,
                remaining: self.tokens(now_ms, new),
                retry_after_ms: -1,
                reset_after_ms: self.rate.ms_up(new - now),
            }
        } else {
            Decision {
                limited: true,
                burst: self.rate.burst,
                remaining: self.tokens(now_ms, base),
                retry_after_ms: self.rate.ms_up(new - self.rate.tolerance() - now),
                reset_after_ms: self.rate.ms_up(base - now),
            }
        }
    }

    /// A limited answer for a request of `cost` tokens that would conform
    /// at `conform_ms` (a waiter that cannot be served before its deadline).
    pub fn limited_until(&self, now_ms: i64, floor_ms: Option<i64>, conform_ms: i64) -> Decision {
        let base = self.base(now_ms, floor_ms);
        Decision {
            limited: true,
            burst: self.rate.burst,
            remaining: self.tokens(now_ms, base),
            retry_after_ms: (conform_ms - now_ms).max(0),
            reset_after_ms: self.rate.ms_up(base - self.rate.units(now_ms)),
        }
    }

    /// The tokens available at `now_ms` and when the bucket is full again.
    pub fn peek(&self, now_ms: i64, floor_ms: Option<i64>) -> (u64, i64) {
        let base = self.base(now_ms, floor_ms);
        (
            self.tokens(now_ms, base),
            self.rate.ms_up(base - self.rate.units(now_ms)),
        )
    }

    /// Gives back `cost` tokens (never more than were taken: `tat` stops at
    /// now, a full bucket). True if anything was given back.
    pub fn refund(&mut self, now_ms: i64, cost: u64) -> bool {
        let now = self.rate.units(now_ms);
        if self.tat <= now {
            return false;
        }
        self.tat = (self.tat - i128::from(cost) * self.rate.interval()).max(now);
        true
    }

    /// Moves to a new rate, keeping the tokens owed, all of them (rounded
    /// up, so that the new state is never more permissive).
    ///
    /// Invariant: no sequence of rate changes refills anything. The debt is
    /// not capped at the new burst: a limiter that owed 1000 tokens and
    /// moves to a burst of 1 still owes 1000, so that moving back to a
    /// burst of 1000 (or `GCRA` calls that alternate two bursts) admits
    /// nothing early. At most `MAX_BURST` tokens can be owed (a request
    /// takes at most a burst), which bounds the arithmetic.
    pub fn reconfigure(&mut self, now_ms: i64, rate: Rate) {
        let old = self.rate;
        let most = i128::from(MAX_BURST) * old.interval();
        let owed = (self.tat - old.units(now_ms)).clamp(0, most);
        // owed / old.period tokens, each new.period new units: rounded up.
        let num = owed * rate.interval();
        let den = old.interval();
        let debt = (num + den - 1) / den;
        self.rate = rate;
        self.tat = rate.units(now_ms) + debt;
    }

    /// When the bucket is full again (unix ms, rounded up): the key may go then.
    pub fn full_at_ms(&self) -> i64 {
        self.rate.ms_up(self.tat)
    }

    /// `tat` as the two integers effects and RDB files carry: whole ms
    /// (floor) and the remainder in units, `0..count`.
    pub fn tat_parts(&self) -> (i64, u64) {
        let c = i128::from(self.rate.count);
        let ms = self.tat.div_euclid(c);
        let rem = self.tat.rem_euclid(c);
        (clamp_i64(ms), rem as u64)
    }

    /// A limiter from its rate and `tat` parts, if they are in range.
    pub fn from_parts(rate: Rate, tat_ms: i64, tat_rem: u64) -> Option<Self> {
        if !rate.valid() || tat_rem >= rate.count || !(0..=MAX_TAT_MS).contains(&tat_ms) {
            return None;
        }
        Some(Self {
            rate,
            tat: rate.units(tat_ms) + i128::from(tat_rem),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(count: u64, period_ms: u64, burst: u64) -> Rate {
        Rate {
            count,
            period_ms,
            burst,
        }
    }

    const T0: i64 = 1_800_000_000_000;

    #[test]
    fn a_full_bucket_admits_the_burst_then_limits() {
        let mut l = Limiter::new(rate(10, 1000, 5));
        for left in (0..5).rev() {
            let d = l.decide(T0, None, 1);
            assert!(!d.limited);
            assert_eq!(d.remaining, left);
            assert_eq!(d.retry_after_ms, -1);
        }
        let d = l.decide(T0, None, 1);
        assert!(d.limited);
        assert_eq!(d.retry_after_ms, 100);
        assert_eq!(d.reset_after_ms, 500);
        // Exactly at the retry-after it conforms, one ms earlier it does not.
        assert!(l.clone().decide(T0 + 99, None, 1).limited);
        assert!(!l.decide(T0 + 100, None, 1).limited);
    }

    /// Over a long run at exactly the rate, nothing drifts: 3 per second
    /// admits exactly burst + 3 × seconds, never one more and never one
    /// fewer. The caller's clock counts whole ms, so the burst is made to
    /// cover one ms of lateness (with a burst of 1, a token not taken the
    /// instant it is due is lost: that is GCRA, not drift).
    #[test]
    fn no_drift_at_rates_that_do_not_divide_a_ms() {
        for (count, period) in [
            (3u64, 1000u64),
            (7, 1),
            (1, 86_400_000),
            (1_000_000, 1),
            (999_983, 997),
        ] {
            let burst = count.div_ceil(period) + 1;
            let r = rate(count, period, burst);
            let mut l = Limiter::new(r);
            let mut now = T0;
            let mut admitted: u64 = 0;
            for _ in 0..20_000 {
                let d = l.decide(now, None, 1);
                if d.limited {
                    assert!(d.retry_after_ms >= 1);
                    assert!(
                        l.clone()
                            .decide(now + d.retry_after_ms - 1, None, 1)
                            .limited
                    );
                    now += d.retry_after_ms;
                    assert!(!l.decide(now, None, 1).limited);
                }
                admitted += 1;
            }
            // Admitted over [T0, now]: at most burst + elapsed × rate, and
            // short of it by less than one ms's worth of tokens.
            let elapsed = (now - T0) as u128;
            let bound = u128::from(burst) + elapsed * u128::from(count) / u128::from(period);
            let admitted = u128::from(admitted);
            assert!(admitted <= bound, "{count}/{period}: {admitted} > {bound}");
            assert!(
                admitted + u128::from(count / period) >= bound,
                "{count}/{period}: {admitted} ≪ {bound}"
            );
            // And the state is exact: every admission moved tat by exactly
            // one interval from the first.
            assert_eq!(
                l.tat,
                r.units(T0) + (admitted as i128) * r.interval(),
                "{count}/{period}"
            );
        }
    }

    #[test]
    fn a_cost_takes_that_many_tokens() {
        let mut l = Limiter::new(rate(100, 1000, 100));
        assert_eq!(l.decide(T0, None, 60).remaining, 40);
        let d = l.decide(T0, None, 60);
        assert!(d.limited);
        assert_eq!(d.retry_after_ms, 200);
        assert_eq!(d.remaining, 40);
    }

    #[test]
    fn a_floor_starts_the_limiter_empty() {
        let mut l = Limiter::new(rate(10, 1000, 10));
        let d = l.decide(T0, Some(T0), 1);
        assert!(d.limited);
        assert_eq!(d.retry_after_ms, 100);
        assert_eq!(d.remaining, 0);
        // A floor long past changes nothing.
        assert!(!l.decide(T0 + 5000, Some(T0), 1).limited);
    }

    #[test]
    fn queued_requests_conform_one_interval_apart() {
        let mut l = Limiter::new(rate(100, 1000, 1));
        assert!(!l.decide(T0, None, 1).limited);
        for i in 0..10u64 {
            assert_eq!(l.conform_at(T0, None, i, 1), T0 + 10 * (i as i64 + 1));
        }
        // Served at its time, each leaves the next exactly 10 ms later.
        let mut now = T0;
        for _ in 0..10 {
            let at = l.conform_at(now, None, 0, 1);
            assert_eq!(at, now + 10);
            now = at;
            assert!(!l.decide(now, None, 1).limited);
        }
    }

    #[test]
    fn a_refund_gives_back_at_most_what_was_taken() {
        let mut l = Limiter::new(rate(10, 1000, 2));
        assert!(!l.refund(T0, 1));
        l.decide(T0, None, 2);
        assert!(l.decide(T0, None, 1).limited);
        assert!(l.refund(T0, 1));
        assert_eq!(l.peek(T0, None).0, 1);
        assert!(l.refund(T0, 5));
        assert_eq!(l.peek(T0, None).0, 2);
        assert!(!l.refund(T0, 1));
    }

    #[test]
    fn a_new_rate_keeps_what_is_owed_and_never_loosens() {
        let mut l = Limiter::new(rate(10, 1000, 10));
        l.decide(T0, None, 10);
        l.reconfigure(T0, rate(20, 1000, 20));
        // 10 tokens owed: half of the new burst.
        assert_eq!(l.peek(T0, None).0, 10);
        l.reconfigure(T0, rate(1, 1000, 4));
        assert_eq!(l.peek(T0, None).0, 0);
        // All 10 still owed, at the new rate: 10 s until full.
        assert_eq!(l.peek(T0, None).1, 10_000);
    }

    /// Alternating bursts (RATE.CONFIG back and forth, or GCRA calls that
    /// state two rates) refills nothing: over a second of flips at a
    /// thousand per second, burst 1000, no more than 1000 + 1000 admitted.
    #[test]
    fn flipping_the_burst_admits_nothing_extra() {
        let big = rate(1000, 1000, 1000);
        let small = rate(1000, 1000, 1);
        let mut l = Limiter::new(big);
        let mut admitted = 0u64;
        for ms in 0..1000 {
            for r in [big, small, big] {
                if l.rate != r {
                    l.reconfigure(T0 + ms, r);
                }
                let cost = if r.burst > 1 { 1000 } else { 1 };
                if !l.decide(T0 + ms, None, cost).limited {
                    admitted += cost;
                }
            }
        }
        assert!(admitted <= 2000, "{admitted} admitted in 1 s");
    }

    /// A state from outside at the extremes: no overflow, never looser.
    #[test]
    fn extreme_states_stay_in_range() {
        let slow = rate(1, MAX_PERIOD_MS, MAX_BURST);
        let fast = rate(MAX_PER_MS * MAX_PERIOD_MS, MAX_PERIOD_MS, MAX_BURST);
        assert_eq!(Limiter::from_parts(slow, MAX_TAT_MS + 1, 0), None);
        assert_eq!(Limiter::from_parts(slow, -1, 0), None);
        for (from, to) in [(slow, fast), (fast, slow), (slow, slow), (fast, fast)] {
            let mut l = Limiter::from_parts(from, MAX_TAT_MS, 0).unwrap();
            l.reconfigure(T0, to);
            assert!(l.decide(T0, None, 1).limited);
            assert_eq!(l.peek(T0, None).0, 0);
            assert!(l.full_at_ms() > T0);
        }
    }

    #[test]
    fn tat_parts_round_trip() {
        let mut l = Limiter::new(rate(3, 1000, 2));
        l.decide(T0, None, 1);
        l.decide(T0, None, 1);
        let (ms, rem) = l.tat_parts();
        assert!(rem < 3);
        assert_eq!(Limiter::from_parts(l.rate, ms, rem), Some(l.clone()));
        assert_eq!(Limiter::from_parts(l.rate, ms, 3), None);
        assert_eq!(Limiter::from_parts(rate(0, 1, 1), ms, 0), None);
    }

    #[test]
    fn rates_in_range() {
        assert!(rate(1, MAX_PERIOD_MS, 1).valid());
        assert!(rate(MAX_PER_MS, 1, MAX_BURST).valid());
        assert!(!rate(MAX_PER_MS + 1, 1, 1).valid());
        assert!(!rate(1, MAX_PERIOD_MS + 1, 1).valid());
        assert!(!rate(1, 1000, 0).valid());
        assert!(!rate(1, 1000, MAX_BURST + 1).valid());
    }
}
