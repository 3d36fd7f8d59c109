//! Bloom filters: bits and hashing (`filter`), scaling (`chain`), the byte
//! format of `SCANDUMP`/RDB (`codec`), `BF.DEBUG`'s lines (`debug`), the type
//! and its callbacks (`datatype`), and the Redis side (`commands`).

pub mod chain;
pub mod codec;
pub mod commands;
pub mod datatype;
pub mod debug;
pub mod filter;

use redis_module::{Context, RedisString, RedisValue};

/// The module argument that turns the `BF.*` commands off.
const COMMANDS_ARG: &str = "bf-commands";

/// Takes `bf-commands yes|no` out of the module arguments (given as name
/// value pairs): whether the `BF.*` commands are wanted, and the other
/// arguments. An error names the argument, the value and what is allowed.
pub fn commands_arg(args: &[RedisString]) -> Result<(bool, Vec<RedisString>), String> {
    let mut wanted = true;
    let mut rest = Vec::with_capacity(args.len());
    let mut pairs = args.chunks(2);
    for pair in &mut pairs {
        let [name, value] = pair else {
            rest.extend(pair.iter().cloned());
            continue;
        };
        if !name
            .as_slice()
            .eq_ignore_ascii_case(COMMANDS_ARG.as_bytes())
        {
            rest.extend(pair.iter().cloned());
            continue;
        }
        let value = value.as_slice();
        wanted = if value.eq_ignore_ascii_case(b"yes") {
            true
        } else if value.eq_ignore_ascii_case(b"no") {
            false
        } else {
            return Err(format!(
                "invalid module argument {COMMANDS_ARG} '{}': allowed values are yes and no",
                crate::error::printable(value)
            ));
        };
    }
    if args.len() % 2 == 1
        && args
            .last()
            .is_some_and(|a| a.as_slice().eq_ignore_ascii_case(COMMANDS_ARG.as_bytes()))
    {
        return Err(format!(
            "module argument {COMMANDS_ARG} needs a value: yes or no"
        ));
    }
    Ok((wanted, rest))
}

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
