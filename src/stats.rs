//! Counters reported by `INFO warden`.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Rate limiter requests admitted (at once or after waiting), and limited.
pub static RATE_ALLOWED: Counter = Counter::new();
pub static RATE_LIMITED: Counter = Counter::new();
/// Locks granted, at once or by hand-off.
pub static GRANTS: Counter = Counter::new();
/// Grants made to a waiter when a lock was freed.
pub static HANDOFFS: Counter = Counter::new();
/// Waiters answered nil after their `WAIT` timeout (or `CLIENT UNBLOCK`).
pub static WAIT_TIMEOUTS: Counter = Counter::new();
/// Requests answered at once by `QUEUE n` instead of queueing.
pub static SHED: Counter = Counter::new();
/// Grace windows opened (start, load from disk, promotion).
pub static GRACE_WINDOWS: Counter = Counter::new();
/// Grants answered once the replicas acknowledged them (`warden.sync-replicas`).
pub static SYNC_ACKED: Counter = Counter::new();
/// Grants taken back and answered busy: no acknowledgement within `sync-timeout`.
pub static SYNC_TIMEOUTS: Counter = Counter::new();
/// `REPLCONF GETACK` requests sent to the replicas for waiting grants.
pub static SYNC_GETACKS: Counter = Counter::new();
/// Releases refused because the caller did not hold the lock.
pub static REFUSED_RELEASES: Counter = Counter::new();

/// A level that goes up and down (values may be freed on a background thread).
pub struct Gauge(AtomicI64);

impl Gauge {
    const fn new() -> Self {
        Self(AtomicI64::new(0))
    }

    pub fn add(&self, n: i64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Keys holding an exclusive lock.
pub static LOCK_KEYS: Gauge = Gauge::new();
/// Keys holding a read-write lock.
pub static RWLOCK_KEYS: Gauge = Gauge::new();
/// Semaphore keys.
pub static SEM_KEYS: Gauge = Gauge::new();
/// Rate limiter keys.
pub static RATE_KEYS: Gauge = Gauge::new();
/// Bloom filter keys, their bytes and sub-filters.
pub static BLOOM_FILTERS: Gauge = Gauge::new();
pub static BLOOM_BYTES: Gauge = Gauge::new();
pub static BLOOM_SUBFILTERS: Gauge = Gauge::new();
/// Lock values that ended with their lease still unreleased.
pub static LEASE_EXPIRIES: Counter = Counter::new();
/// Held locks (either kind) that the server evicted.
pub static EVICTED_LOCKS: Counter = Counter::new();

/// Cache reads that found a value (fresh or stale).
pub static CACHE_HITS: Counter = Counter::new();
/// Cache reads that found none.
pub static CACHE_MISSES: Counter = Counter::new();
/// Fill leases granted (at once, by hand-off, refresh-ahead or stale refresh).
pub static CACHE_LEASES: Counter = Counter::new();
/// Fills stored, and fills refused (lease not current).
pub static CACHE_FILLS: Counter = Counter::new();
pub static CACHE_FILLS_REFUSED: Counter = Counter::new();
/// Leases revoked by an invalidation or another write.
pub static CACHE_REVOKED: Counter = Counter::new();
/// `INFO` sections the cache's command filter read to decide whether a
/// command ran (the slow way: a client not known yet, a transaction that
/// reaches a lease, Redis 7.0).
pub static CACHE_FILTER_READS: Counter = Counter::new();
/// Transactions decided from the count of commands alone (nothing ran
/// since they were noted: refused), their write counts not read again.
pub static CACHE_FILTER_NOTHING_RAN: Counter = Counter::new();
/// Waiters answered with a value, and waiters whose wait timed out.
pub static CACHE_WOKEN: Counter = Counter::new();
pub static CACHE_WAIT_TIMEOUTS: Counter = Counter::new();
/// Leases handed to a reader of a value about to expire (`REFRESH`).
pub static CACHE_REFRESHES: Counter = Counter::new();
/// Stale values served (after `INVALIDATE ... STALE`).
pub static CACHE_STALE_SERVED: Counter = Counter::new();

/// Bytes the module's own allocations hold now, and have asked for in all
/// (counted by its global allocator: a clock-free measure of copies and of
/// memory that lingers).
pub static MODULE_BYTES: Gauge = Gauge::new();
pub static MODULE_ALLOCATED: Counter = Counter::new();

/// Finite buckets of a [`Histogram`]: `<= 2^0 .. 2^20` ms (about 17 minutes).
pub const BUCKETS: usize = 21;

/// A distribution of durations in ms, in power-of-two buckets (Redis'
/// `LATENCY HISTOGRAM` style), reported cumulatively. Atomics: values are
/// freed, and so holds observed, on a background thread too.
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last is `> 2^20`.
    buckets: [AtomicU64; BUCKETS + 1],
    sum: AtomicU64,
}

impl Histogram {
    const fn new() -> Self {
        Self {
            buckets: [const { AtomicU64::new(0) }; BUCKETS + 1],
            sum: AtomicU64::new(0),
        }
    }

    /// Records one duration (negative ones count as 0), unless
    /// `warden.latency-tracking` is off.
    pub fn observe(&self, ms: i64) {
        if !crate::config::latency_tracking() {
            return;
        }
        let ms = ms.max(0) as u64;
        self.buckets[bucket_of(ms)].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(ms, Ordering::Relaxed);
    }

    /// `(upper bound in ms or None for +inf, cumulative count)` per bucket,
    /// then the total of the durations.
    pub fn cumulative(&self) -> ([(Option<u64>, u64); BUCKETS + 1], u64) {
        let mut out = [(None, 0); BUCKETS + 1];
        let mut total = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            total += b.load(Ordering::Relaxed);
            out[i] = ((i < BUCKETS).then_some(1 << i), total);
        }
        (out, self.sum.load(Ordering::Relaxed))
    }
}

/// The bucket of `ms`: the smallest `i` with `ms <= 2^i`, or the overflow one.
fn bucket_of(ms: u64) -> usize {
    if ms <= 1 {
        return 0;
    }
    ((64 - (ms - 1).leading_zeros()) as usize).min(BUCKETS)
}

/// How long clients waited in `WAIT` (whatever ended the wait), per kind.
pub static LOCK_WAIT: Histogram = Histogram::new();
pub static RWLOCK_WAIT: Histogram = Histogram::new();
pub static SEM_WAIT: Histogram = Histogram::new();
pub static RATE_WAIT: Histogram = Histogram::new();
pub static CACHE_WAIT: Histogram = Histogram::new();
/// How long holds lasted, from grant to release, lease end or deletion.
pub static LOCK_HOLD: Histogram = Histogram::new();
pub static RWLOCK_HOLD: Histogram = Histogram::new();
pub static SEM_HOLD: Histogram = Histogram::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_inclusive_above() {
        let cases = [
            (0, 0),
            (1, 0),
            (2, 1),
            (3, 2),
            (4, 2),
            (5, 3),
            (1 << 20, 20),
            ((1 << 20) + 1, BUCKETS),
            (u64::MAX, BUCKETS),
        ];
        for (ms, bucket) in cases {
            assert_eq!(bucket_of(ms), bucket, "{ms} ms");
        }
    }

    #[test]
    fn reported_counts_are_cumulative_and_end_with_the_total() {
        let h = Histogram::new();
        for ms in [0, 1, 3, 3, 100, 5_000_000] {
            h.observe(ms);
        }
        let (buckets, sum) = h.cumulative();
        assert_eq!(buckets[0], (Some(1), 2));
        assert_eq!(buckets[1], (Some(2), 2));
        assert_eq!(buckets[2], (Some(4), 4));
        assert_eq!(buckets[7], (Some(128), 5));
        assert_eq!(buckets[BUCKETS - 1], (Some(1 << 20), 5));
        assert_eq!(buckets[BUCKETS], (None, 6));
        assert_eq!(sum, 5_000_107);
    }
}
