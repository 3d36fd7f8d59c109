//! What `maxmemory` leaves for a large allocation. Redis checks its limit
//! only before a `deny-oom` command runs, and counts calloc'd memory at its
//! full size at once: a command that allocates much (a filter, a scale-out, a
//! loaded chunk) must check the room itself, before allocating.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis_module::raw;

/// `maxmemory` in bytes (0: none), and whether the policy evicts.
static MAXMEMORY: AtomicU64 = AtomicU64::new(0);
static EVICTS: AtomicBool = AtomicBool::new(false);

/// Records the server's settings (read at load and on every config change).
pub fn set_limit(maxmemory: u64, evicts: bool) {
    MAXMEMORY.store(maxmemory, Ordering::Relaxed);
    EVICTS.store(evicts, Ordering::Relaxed);
}

/// Bytes the server can still take before `maxmemory`; `u64::MAX` without a
/// limit. Under a policy that evicts, an allocation may pass the limit by
/// 1% of it (what eviction then frees, as for any write), never by more: a
/// filter that needs the room of many other keys is refused instead of
/// evicting them, held locks included.
pub fn room() -> u64 {
    let max = MAXMEMORY.load(Ordering::Relaxed);
    if max == 0 {
        return u64::MAX;
    }
    let used = (f64::from(used_ratio()) * max as f64) as u64;
    room_at(max, used, EVICTS.load(Ordering::Relaxed))
}

/// Whether the server is over `maxmemory` now (Redis has run its evictions
/// before the command: what is left over could not be evicted).
pub fn over_limit() -> bool {
    MAXMEMORY.load(Ordering::Relaxed) != 0 && used_ratio() > 1.0
}

/// Used memory as eviction counts it (replication and AOF buffers left
/// out), as a fraction of `maxmemory`.
fn used_ratio() -> f32 {
    unsafe { raw::RedisModule_GetUsedMemoryRatio }.map_or(0.0, |f| unsafe { f() })
}

/// Bytes the server's allocator counts (in `used_memory`) for the block of
/// `size` bytes at `ptr`, which this allocator gave: its size class, not
/// just what was asked for. `size` where there is no block, or no Redis.
pub fn block_size(ptr: *const u8, size: usize) -> usize {
    if size == 0 {
        return 0;
    }
    match unsafe { raw::RedisModule_MallocSize } {
        Some(malloc_size) => unsafe { malloc_size(ptr.cast_mut().cast::<std::os::raw::c_void>()) },
        None => size,
    }
}

fn room_at(max: u64, used: u64, evicts: bool) -> u64 {
    let slack = if evicts { max / 100 } else { 0 };
    (max + slack).saturating_sub(used)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_what_maxmemory_leaves_plus_one_percent_when_evicting() {
        assert_eq!(room_at(1000, 300, false), 700);
        assert_eq!(room_at(1000, 300, true), 710);
        assert_eq!(room_at(1000, 1200, false), 0);
        assert_eq!(room_at(1000, 1005, true), 5);
    }
}
