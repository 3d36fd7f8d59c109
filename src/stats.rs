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

/// Locks granted, at once or by hand-off.
pub static GRANTS: Counter = Counter::new();
/// Grants made to a waiter when a lock was freed.
pub static HANDOFFS: Counter = Counter::new();
/// Waiters answered nil after their `WAIT` timeout (or `CLIENT UNBLOCK`).
pub static WAIT_TIMEOUTS: Counter = Counter::new();
/// Grace windows opened (start, load from disk, promotion).
pub static GRACE_WINDOWS: Counter = Counter::new();
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
