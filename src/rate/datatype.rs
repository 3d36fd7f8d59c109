//! The rate limiter type `warden-rl` and its `extern "C"` callbacks (RDB,
//! AOF, copy, memory, free, unlink). Decoding validates every field:
//! `RESTORE` hands hostile bytes to `rdb_load`, which must answer with an
//! error, never a crash.

use std::os::raw::{c_int, c_void};

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::datatypes::{boxed, emit_aof, note_unlink_of, release_value, Tracked};
use crate::guard;
use crate::rate::state::{Limiter, Rate};
use crate::restored;
use crate::stats;

impl Tracked for Limiter {
    fn track(&self, sign: i64) {
        stats::RATE_KEYS.add(sign);
    }
}

/// Encoding version of `warden-rl` values. 1: count, period, burst, then the
/// theoretical arrival time as whole ms and a remainder in `1/count` ms.
const RATE_ENCVER: c_int = 1;

/// The name of the command that carries a limiter's state to replicas and
/// the AOF: `WARDEN.RATESET key count period burst tat_ms tat_rem`.
pub const RATE_EFFECT: &str = "WARDEN.RATESET";

pub static RATE_TYPE: RedisType = RedisType::new(
    "warden-rl",
    RATE_ENCVER,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rate_rdb_load),
        rdb_save: Some(rate_rdb_save),
        aof_rewrite: Some(rate_aof_rewrite),
        mem_usage: Some(rate_mem_usage),
        digest: None,
        free: Some(rate_free),
        aux_load: None,
        aux_save: None,
        aux_save2: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy: None,
        defrag: None,
        copy2: Some(rate_copy),
        free_effort2: None,
        mem_usage2: None,
        unlink2: Some(rate_unlink),
    },
);

/// The words of `WARDEN.RATESET` after the key.
pub fn effect_words(l: &Limiter) -> [Vec<u8>; 5] {
    let (ms, rem) = l.tat_parts();
    [
        l.rate.count.to_string().into_bytes(),
        l.rate.period_ms.to_string().into_bytes(),
        l.rate.burst.to_string().into_bytes(),
        ms.to_string().into_bytes(),
        rem.to_string().into_bytes(),
    ]
}

unsafe fn load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> Option<Limiter> {
    if encver != 1 {
        return None;
    }
    let count = raw::load_unsigned(rdb).ok()?;
    let period_ms = raw::load_unsigned(rdb).ok()?;
    let burst = raw::load_unsigned(rdb).ok()?;
    let tat_ms = raw::load_signed(rdb).ok()?;
    let tat_rem = raw::load_unsigned(rdb).ok()?;
    let rate = Rate {
        count,
        period_ms,
        burst,
    };
    Limiter::from_parts(rate, tat_ms, tat_rem)
}

unsafe extern "C" fn rate_rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard::callback(std::ptr::null_mut(), || match load(rdb, encver) {
        Some(l) => {
            // A `RESTORE` sets the ttl it was given (0: none), not the time
            // the bucket is full again: put back right after the command.
            if !restored::loading() {
                restored::note_loaded(rdb);
            }
            boxed(l)
        }
        None => std::ptr::null_mut(),
    })
}

unsafe extern "C" fn rate_rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    let l = &*value.cast::<Limiter>();
    let (ms, rem) = l.tat_parts();
    raw::save_unsigned(rdb, l.rate.count);
    raw::save_unsigned(rdb, l.rate.period_ms);
    raw::save_unsigned(rdb, l.rate.burst);
    raw::save_signed(rdb, ms);
    raw::save_unsigned(rdb, rem);
}

unsafe extern "C" fn rate_aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    let words = effect_words(&*value.cast::<Limiter>());
    emit_aof(aof, c"WARDEN.RATESET", key, &words);
}

unsafe extern "C" fn rate_mem_usage(value: *const c_void) -> usize {
    crate::memory::block_size(value.cast::<u8>(), std::mem::size_of::<Limiter>())
}

unsafe extern "C" fn rate_free(value: *mut c_void) {
    release_value::<Limiter>(value, |_, _| false);
}

/// An evicted limiter leaves a tombstone until it would have been full
/// again: a new one on its key resumes from that time (`commands::fresh`).
unsafe extern "C" fn rate_unlink(ctx: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    let full_at = (*value.cast::<Limiter>()).full_at_ms();
    guard::callback((), || note_unlink_of(ctx, full_at, false))
}

unsafe extern "C" fn rate_copy(
    ctx: *mut raw::RedisModuleKeyOptCtx,
    value: *const c_void,
) -> *mut c_void {
    // The copy's expiry is its source's, which a `PERSIST` may have removed.
    restored::note_copied(ctx);
    boxed((*value.cast::<Limiter>()).clone())
}
