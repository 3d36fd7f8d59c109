//! `INFO warden`.

use std::os::raw::c_int;

use redis_module::raw;

use crate::{fence::FENCES, guard, stats, waiters};

extern "C" fn report(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    guard::callback((), || {
        // No name: Redis prefixes the module's name, and "warden" would print
        // the section as `# warden_warden`.
        raw::add_info_section(ctx, None);
        let (batch_steps, batch_us) = crate::cache::commands::max_batch();
        let fields = [
            ("lock_keys", stats::LOCK_KEYS.get()),
            ("rwlock_keys", stats::RWLOCK_KEYS.get()),
            ("waiting_clients", waiters::total_waiting() as i64),
            ("grants", stats::GRANTS.get() as i64),
            ("handoffs", stats::HANDOFFS.get() as i64),
            ("lease_expiries", stats::LEASE_EXPIRIES.get() as i64),
            ("wait_timeouts", stats::WAIT_TIMEOUTS.get() as i64),
            ("refused_releases", stats::REFUSED_RELEASES.get() as i64),
            ("evicted_locks", stats::EVICTED_LOCKS.get() as i64),
            ("evicted_keys_taken", crate::evicted::count() as i64),
            ("bloom_filters", stats::BLOOM_FILTERS.get()),
            ("bloom_bytes", stats::BLOOM_BYTES.get()),
            ("bloom_subfilters", stats::BLOOM_SUBFILTERS.get()),
            ("cache_entries", crate::cache::commands::entries() as i64),
            ("cache_max_batch", batch_steps as i64),
            ("cache_max_batch_us", batch_us as i64),
            ("cache_hits", stats::CACHE_HITS.get() as i64),
            ("cache_misses", stats::CACHE_MISSES.get() as i64),
            ("cache_leases", stats::CACHE_LEASES.get() as i64),
            ("cache_fills", stats::CACHE_FILLS.get() as i64),
            (
                "cache_fills_refused",
                stats::CACHE_FILLS_REFUSED.get() as i64,
            ),
            ("cache_revoked", stats::CACHE_REVOKED.get() as i64),
            ("cache_waiters_woken", stats::CACHE_WOKEN.get() as i64),
            (
                "cache_wait_timeouts",
                stats::CACHE_WAIT_TIMEOUTS.get() as i64,
            ),
            ("cache_refreshes", stats::CACHE_REFRESHES.get() as i64),
            ("cache_stale_served", stats::CACHE_STALE_SERVED.get() as i64),
            ("last_fence", FENCES.last() as i64),
            ("module_memory", stats::MODULE_BYTES.get()),
            (
                "module_allocated_total",
                stats::MODULE_ALLOCATED.get() as i64,
            ),
            ("grace_remaining_ms", crate::grace::remaining_ms()),
            ("grace_windows", stats::GRACE_WINDOWS.get() as i64),
        ];
        for (name, value) in fields {
            raw::add_info_field_long_long(ctx, name, value);
        }
    })
}

pub fn register(ctx: *mut raw::RedisModuleCtx) -> bool {
    unsafe {
        raw::RedisModule_RegisterInfoFunc.unwrap()(ctx, Some(report))
            == raw::REDISMODULE_OK as c_int
    }
}
