//! Counters reported by `INFO warden`.

use std::sync::atomic::{AtomicU64, Ordering};

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
/// Releases refused because the caller did not hold the lock.
pub static REFUSED_RELEASES: Counter = Counter::new();
