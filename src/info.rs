//! `INFO warden`.

use std::os::raw::c_int;

use redis_module::raw;

use crate::{fence::FENCES, guard, stats, waiters};

extern "C" fn report(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    guard::callback((), || {
        raw::add_info_section(ctx, Some("warden"));
        let fields = [
            ("waiting_clients", waiters::total_waiting() as u64),
            ("grants", stats::GRANTS.get()),
            ("handoffs", stats::HANDOFFS.get()),
            ("wait_timeouts", stats::WAIT_TIMEOUTS.get()),
            ("refused_releases", stats::REFUSED_RELEASES.get()),
            ("last_fence", FENCES.last()),
        ];
        for (name, value) in fields {
            raw::add_info_field_unsigned_long_long(ctx, name, value);
        }
    })
}

pub fn register(ctx: *mut raw::RedisModuleCtx) -> bool {
    unsafe {
        raw::RedisModule_RegisterInfoFunc.unwrap()(ctx, Some(report))
            == raw::REDISMODULE_OK as c_int
    }
}
