//! The command filter: Redis sends no keyspace event for a write that finds
//! nothing to change — `DEL`/`UNLINK`/`GETDEL` of a missing (or just expired)
//! key, a `*STORE` with an empty result onto a missing key — yet a reader
//! that loaded before such a write must not fill afterwards. The filter sees
//! every command (from clients, inside `MULTI` when queued, from scripts and
//! the replication stream) before it runs, and revokes the leases of the keys
//! it names, in every database (a filter does not know the client's).
//!
//! Revoking early or more than needed is safe: it only costs a reload (a
//! command that then fails, a `MULTI` that is discarded). The filter runs on
//! every command, so it returns at once while the lease table is empty.

use std::os::raw::c_int;

use redis_module::{raw, Context};

use crate::cache::commands;
use crate::guard;

/// Commands whose every argument after the name may be a key they remove or
/// overwrite, and whether they do so only with a `STORE`/`STOREDIST` option.
const WRITES: &[(&[u8], bool)] = &[
    (b"del", false),
    (b"unlink", false),
    (b"getdel", false),
    (b"sinterstore", false),
    (b"sunionstore", false),
    (b"sdiffstore", false),
    (b"zinterstore", false),
    (b"zunionstore", false),
    (b"zdiffstore", false),
    (b"zrangestore", false),
    (b"geosearchstore", false),
    (b"bitop", false),
    (b"sort", true),
    (b"georadius", true),
    (b"georadiusbymember", true),
];

fn arg(fctx: *mut raw::RedisModuleCommandFilterCtx, pos: c_int) -> &'static [u8] {
    let s = unsafe { raw::RedisModule_CommandFilterArgGet.unwrap()(fctx, pos) };
    if s.is_null() {
        return &[];
    }
    let mut len = 0;
    let ptr = raw::string_ptr_len(s, &mut len);
    // The argument lives until the filter returns; the slice does not escape it.
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
}

extern "C" fn on_command(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    guard::callback((), || {
        if commands::idle() {
            return;
        }
        let argc = unsafe { raw::RedisModule_CommandFilterArgsCount.unwrap()(fctx) };
        if argc < 2 {
            return;
        }
        let name = arg(fctx, 0);
        let Some(&(_, needs_store)) = WRITES.iter().find(|(w, _)| w.eq_ignore_ascii_case(name))
        else {
            return;
        };
        let args = || (1..argc).map(|i| arg(fctx, i));
        if needs_store
            && !args()
                .any(|a| a.eq_ignore_ascii_case(b"store") || a.eq_ignore_ascii_case(b"storedist"))
        {
            return;
        }
        for key in args() {
            commands::revoke_everywhere(key);
        }
        // Waiters on those keys are served from the reaper's next turn.
        commands::reap_soon();
    })
}

/// Registers the filter (not for warden's own calls: `CACHE.*` revokes itself).
pub fn register(ctx: &Context) -> bool {
    let filter = unsafe {
        raw::RedisModule_RegisterCommandFilter.unwrap()(
            ctx.ctx,
            Some(on_command),
            raw::REDISMODULE_CMDFILTER_NOSELF as c_int,
        )
    };
    !filter.is_null()
}
