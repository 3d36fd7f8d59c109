//! `INFO warden`.

use std::os::raw::c_int;

use redis_module::raw;

use crate::{fence::FENCES, guard, stats, waiters};

extern "C" fn report(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    guard::callback((), || {
        // No name: Redis prefixes the module's name, and "warden" would print
        // the section as `# warden_warden`.
        raw::add_info_section(ctx, None);
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
            ("last_fence", FENCES.last() as i64),
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
