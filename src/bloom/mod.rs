//! Bloom filters: bits and hashing (`filter`), scaling (`chain`), the byte
//! format of `SCANDUMP`/RDB (`codec`), `BF.DEBUG`'s lines (`debug`), the type
//! and its callbacks (`datatype`), and the Redis side (`commands`).

pub mod chain;
pub mod codec;
pub mod commands;
pub mod datatype;
pub mod debug;
pub mod filter;

use std::ffi::CString;

use redis_module::{raw, Context, RedisString};

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
                "warden: invalid module argument {COMMANDS_ARG} '{}': allowed values are yes and no",
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
            "warden: module argument {COMMANDS_ARG} needs a value: yes or no"
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
        ctx.log_notice("warden: BF.* commands not registered (module argument bf-commands no)");
        return false;
    }
    let name = CString::new("bf.add").expect("no NUL");
    let taken = unsafe { !raw::RedisModule_GetCommand.unwrap()(ctx.ctx, name.as_ptr()).is_null() };
    if taken {
        ctx.log_notice(
            "warden: BF.* commands not registered: another module (RedisBloom or the server's own Bloom) already serves BF.ADD; lock commands are registered",
        );
    }
    !taken
}
