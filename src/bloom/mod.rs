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

use redis_module::{Context, RedisValue};

/// Whether to register the `BF.*` commands: `requested` (the module
/// argument), and only if no other module — RedisBloom loaded first, or a
/// server with Bloom built in — serves them already (registering the same
/// name would fail the whole load). The `warden-bf` type is registered
/// either way, so saved filters still load. Says in the log when it stands
/// aside.
pub fn commands_wanted(ctx: &Context, requested: bool) -> bool {
    if !requested {
        ctx.log_notice("BF.* commands not registered (module argument bf-commands no)");
        return false;
    }
    if served_elsewhere(ctx) {
        ctx.log_notice(
            "BF.* commands not registered: another module (RedisBloom, or Bloom built into the server) already serves BF.ADD; the lock commands are registered",
        );
        return false;
    }
    // A module loaded later that registers the same commands or the
    // `MBbloom--` type fails, and the server exits with only that module's
    // "initialization failed" in the log: say here what to do.
    ctx.log_notice(
        "warden serves BF.* and RedisBloom's MBbloom-- type: RedisBloom (or another Bloom module) loaded after warden fails to load and the server exits. Load RedisBloom before warden (warden then stands aside), or give warden the argument bf-commands no",
    );
    true
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
