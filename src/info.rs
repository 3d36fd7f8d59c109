//! `INFO warden`.

use std::os::raw::c_int;

use redis_module::raw;

use crate::stats::Histogram;
use crate::{fence::FENCES, guard, stats, waiters};

/// The one version of warden: the crate's, also the module's `ver`, the
/// `version` field of `INFO warden` and the log line at load.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `VERSION` as the module `ver` Redis shows (`MODULE LIST`):
/// major * 10000 + minor * 100 + patch, as Redis numbers its own modules.
pub const VERSION_NUMBER: i32 = version_number(VERSION.as_bytes());

const fn version_number(v: &[u8]) -> i32 {
    let (mut parts, mut part, mut i) = ([0i32; 3], 0, 0);
    while i < v.len() && part < 3 {
        match v[i] {
            b'.' => part += 1,
            b'0'..=b'9' => parts[part] = parts[part] * 10 + (v[i] - b'0') as i32,
            _ => break,
        }
        i += 1;
    }
    parts[0] * 10000 + parts[1] * 100 + parts[2]
}

/// One NOTICE line at load: which warden, on which server.
pub fn log_loaded(ctx: &redis_module::Context) {
    let server = unsafe { raw::RedisModule_GetServerVersion.map_or(0, |f| f()) };
    ctx.log_notice(&format!(
        "warden {VERSION} loaded (server {}.{}.{}; INFO warden shows its metrics)",
        server >> 16,
        (server >> 8) & 0xff,
        server & 0xff
    ));
}

/// A histogram as one dict field: `le_1=..,le_2=..,...,le_inf=..,count=..,sum=..`.
fn add_histogram(ctx: *mut raw::RedisModuleInfoCtx, name: &str, h: &Histogram) {
    let (buckets, sum) = h.cumulative();
    raw::add_info_begin_dict_field(ctx, name);
    let mut count = 0;
    for (le, n) in buckets {
        match le {
            Some(le) => raw::add_info_field_unsigned_long_long(ctx, &format!("le_{le}"), n),
            None => raw::add_info_field_unsigned_long_long(ctx, "le_inf", n),
        };
        count = n;
    }
    raw::add_info_field_unsigned_long_long(ctx, "count", count);
    raw::add_info_field_unsigned_long_long(ctx, "sum", sum);
    raw::add_info_end_dict_field(ctx);
}

extern "C" fn report(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    guard::callback((), || {
        // No name: Redis prefixes the module's name, and "warden" would print
        // the section as `# warden_warden`.
        raw::add_info_section(ctx, None);
        raw::add_info_field_str(ctx, "version", VERSION);
        let (batch_steps, batch_us) = crate::cache::commands::max_batch();
        let fields = [
            ("lock_keys", stats::LOCK_KEYS.get()),
            ("rwlock_keys", stats::RWLOCK_KEYS.get()),
            ("semaphore_keys", stats::SEM_KEYS.get()),
            ("rate_limiters", stats::RATE_KEYS.get()),
            ("rate_allowed", stats::RATE_ALLOWED.get() as i64),
            ("rate_limited", stats::RATE_LIMITED.get() as i64),
            ("waiting_clients", waiters::total_waiting() as i64),
            ("grants", stats::GRANTS.get() as i64),
            ("handoffs", stats::HANDOFFS.get() as i64),
            ("lease_expiries", stats::LEASE_EXPIRIES.get() as i64),
            ("wait_timeouts", stats::WAIT_TIMEOUTS.get() as i64),
            ("shed", stats::SHED.get() as i64),
            ("refused_releases", stats::REFUSED_RELEASES.get() as i64),
            ("evicted_locks", stats::EVICTED_LOCKS.get() as i64),
            ("evicted_keys_taken", crate::evicted::count() as i64),
            ("bloom_filters", stats::BLOOM_FILTERS.get()),
            ("bloom_bytes", stats::BLOOM_BYTES.get()),
            ("bloom_subfilters", stats::BLOOM_SUBFILTERS.get()),
            ("cache_entries", crate::cache::commands::entries() as i64),
            (
                "cache_listening",
                i64::from(crate::cache::filter::listening() && crate::events::hearing_clients()),
            ),
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
            (
                "cache_filter_info_reads",
                stats::CACHE_FILTER_READS.get() as i64,
            ),
            (
                "cache_filter_nothing_ran",
                stats::CACHE_FILTER_NOTHING_RAN.get() as i64,
            ),
            ("cache_waiters_woken", stats::CACHE_WOKEN.get() as i64),
            (
                "cache_wait_timeouts",
                stats::CACHE_WAIT_TIMEOUTS.get() as i64,
            ),
            ("cache_refreshes", stats::CACHE_REFRESHES.get() as i64),
            ("cache_stale_served", stats::CACHE_STALE_SERVED.get() as i64),
            (
                "cache_leases_unfilled",
                crate::cache::commands::leases_unfilled() as i64,
            ),
            ("last_fence", FENCES.last() as i64),
            ("module_memory", stats::MODULE_BYTES.get()),
            (
                "module_allocated_total",
                stats::MODULE_ALLOCATED.get() as i64,
            ),
            ("grace_remaining_ms", crate::grace::remaining_ms()),
            ("grace_windows", stats::GRACE_WINDOWS.get() as i64),
            ("sync_waiting", crate::waiters::held::count() as i64),
            ("sync_acked", stats::SYNC_ACKED.get() as i64),
            ("sync_timeouts", stats::SYNC_TIMEOUTS.get() as i64),
            ("sync_getacks", stats::SYNC_GETACKS.get() as i64),
        ];
        for (name, value) in fields {
            raw::add_info_field_long_long(ctx, name, value);
        }
        let tracking = crate::config::latency_tracking();
        raw::add_info_field_long_long(ctx, "latency_tracking", i64::from(tracking));
        let histograms = [
            ("lock_wait_ms", &stats::LOCK_WAIT),
            ("rwlock_wait_ms", &stats::RWLOCK_WAIT),
            ("cache_wait_ms", &stats::CACHE_WAIT),
            ("semaphore_wait_ms", &stats::SEM_WAIT),
            ("rate_wait_ms", &stats::RATE_WAIT),
            ("lock_hold_ms", &stats::LOCK_HOLD),
            ("rwlock_hold_ms", &stats::RWLOCK_HOLD),
            ("semaphore_hold_ms", &stats::SEM_HOLD),
        ];
        for (name, h) in histograms {
            add_histogram(ctx, name, h);
        }
    })
}

pub fn register(ctx: *mut raw::RedisModuleCtx) -> bool {
    unsafe {
        raw::RedisModule_RegisterInfoFunc.unwrap()(ctx, Some(report))
            == raw::REDISMODULE_OK as c_int
    }
}

#[cfg(test)]
mod tests {
    use super::version_number;

    #[test]
    fn module_ver_is_major_minor_patch() {
        assert_eq!(version_number(b"1.1.0"), 10100);
        assert_eq!(version_number(b"2.14.7"), 21407);
        assert_eq!(version_number(b"1.2.3-rc1"), 10203);
    }
}
