//! Bloom filters: bits and hashing (`filter`), scaling (`chain`), the byte
//! format of `SCANDUMP`/RDB (`codec`), `BF.DEBUG`'s lines (`debug`), the type
//! and its callbacks (`datatype`), and the Redis side (`commands`).
//! `redisbloom` and `murmur` read, write and answer like RedisBloom's own
//! filters, so that they move over unchanged.

pub mod chain;
pub mod codec;
pub mod commands;
pub mod datatype;
pub mod debug;
pub mod filter;
pub mod murmur;
pub mod redisbloom;

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{raw, Context, RedisValue};

/// Whether to register the `BF.*` commands: `requested` (the module
/// argument), and only if no other module — RedisBloom loaded first, or a
/// server with Bloom built in — serves them already (registering the same
/// name would fail the whole load). The `warden-bf` type is registered
/// either way, so saved filters still load. Says in the log when it stands
/// aside, and what to do if a Bloom module loaded after it fails.
pub fn commands_wanted(ctx: &Context, requested: bool) -> bool {
    if !requested {
        ctx.log_notice("BF.* commands not registered (module argument bf-commands no)");
        return false;
    }
    if served_elsewhere(ctx) {
        ctx.log_notice(
            "BF.* commands not registered: another module (RedisBloom, or Bloom built into the server) already serves BF.ADD; the lock commands are registered",
        );
        warn_of_cached_reads(ctx);
        return false;
    }
    explain_a_failed_start(ctx);
    true
}

/// Set once the server is past loading its modules: it heard a server
/// event (a dataset begins to load after every module), or its event loop
/// turned.
static STARTED: AtomicBool = AtomicBool::new(false);

/// The server is past loading its modules.
pub fn started() {
    STARTED.store(true, Ordering::Relaxed);
}

/// A module loaded later that registers the same commands or the
/// `MBbloom--` type (RedisBloom, another Bloom module) fails, and the
/// server exits with only that module's "initialization failed" in the
/// log. Nothing tells warden beforehand what loads after it, so what to do
/// is said when the server exits before it started, and only then: a start
/// that succeeds (the usual one, RedisBloom nowhere) logs nothing about it.
/// (warden cannot be unloaded, its types stay registered: the exit handler
/// stays valid.)
fn explain_a_failed_start(ctx: &Context) {
    extern "C" {
        fn atexit(callback: extern "C" fn()) -> c_int;
    }
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    if !REGISTERED.swap(true, Ordering::Relaxed) {
        unsafe { atexit(at_exit) };
    }
    let timer = unsafe {
        raw::RedisModule_CreateTimer.unwrap()(ctx.ctx, 0, Some(on_started), std::ptr::null_mut())
    };
    if timer == 0 {
        started();
    }
}

extern "C" fn on_started(_ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    started();
}

/// warden loaded whole: until then the server may drop the module (and
/// with it the context the exit handler logs through) and exit for
/// warden's own reasons, which warden has logged.
static LOADED: AtomicBool = AtomicBool::new(false);

pub fn loaded() {
    LOADED.store(true, Ordering::Relaxed);
}

extern "C" fn at_exit() {
    if STARTED.load(Ordering::Relaxed) || !LOADED.load(Ordering::Relaxed) {
        return;
    }
    Context::new(crate::events::detached()).log_warning(
        "warden: the server exits while it loads its modules. warden serves BF.* and RedisBloom's MBbloom-- type: RedisBloom (or another Bloom module) loaded after warden fails to load. Load RedisBloom before warden (warden then stands aside), or give warden the argument bf-commands no",
    );
}

/// The `BF.*` reads whose replies no client may keep (docs/commands.md, "Tips").
const UNCACHED_READS: [&str; 3] = ["bf.info", "bf.debug", "bf.scandump"];

/// With `BF.*` served by another module, their tips are its own: says which
/// of the reads warden marks `dont_cache` lack it there, and so would be
/// kept by client-side caches.
fn warn_of_cached_reads(ctx: &Context) {
    let mut args = vec!["INFO"];
    args.extend(UNCACHED_READS);
    let Ok(RedisValue::Array(infos)) = ctx.call("COMMAND", &args[..]) else {
        return;
    };
    let cached: Vec<&str> = UNCACHED_READS
        .iter()
        .zip(&infos)
        .filter(|(_, info)| !may_not_be_cached(&tips_of(info)))
        .map(|(name, _)| *name)
        .collect();
    if !cached.is_empty() {
        ctx.log_notice(&format!(
            "the BF.* module loaded before warden gives {} no dont_cache tip: client-side caches may keep their replies",
            cached.join(", ").to_uppercase()
        ));
    }
}

/// The tips of one `COMMAND INFO` entry (its eighth field).
fn tips_of(info: &RedisValue) -> Vec<String> {
    let RedisValue::Array(fields) = info else {
        return Vec::new();
    };
    let Some(RedisValue::Array(tips)) = fields.get(7) else {
        return Vec::new();
    };
    tips.iter()
        .filter_map(|t| String::try_from(t.clone()).ok())
        .collect()
}

/// Whether tips keep a read out of client-side caches.
fn may_not_be_cached(tips: &[String]) -> bool {
    tips.iter().any(|t| {
        t.eq_ignore_ascii_case("dont_cache") || t.eq_ignore_ascii_case("nondeterministic_output")
    })
}

/// Whether the server already knows `BF.ADD`. (`RedisModule_GetCommand`
/// answers NULL for commands of other modules, so ask `COMMAND INFO`.)
fn served_elsewhere(ctx: &Context) -> bool {
    match ctx.call("COMMAND", &["INFO", "bf.add"][..]) {
        Ok(RedisValue::Array(found)) => found
            .iter()
            .any(|v| !matches!(v, RedisValue::Null | RedisValue::NoReply)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tips: &[&str]) -> RedisValue {
        let mut fields: Vec<RedisValue> = (0..7).map(|_| RedisValue::Null).collect();
        fields.push(RedisValue::Array(
            tips.iter()
                .map(|t| RedisValue::SimpleString(t.to_string()))
                .collect(),
        ));
        RedisValue::Array(fields)
    }

    #[test]
    fn a_read_with_either_tip_is_not_cached() {
        let table: [(&[&str], bool); 5] = [
            (&[], false),
            (&["request_policy:all_shards"], false),
            (&["dont_cache"], true),
            (&["nondeterministic_output"], true),
            (&["NONDETERMINISTIC_OUTPUT", "dont_cache"], true),
        ];
        for (tips, uncached) in table {
            assert_eq!(
                may_not_be_cached(&tips_of(&entry(tips))),
                uncached,
                "{tips:?}"
            );
        }
        assert!(tips_of(&RedisValue::Null).is_empty());
    }
}
