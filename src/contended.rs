//! `WARDEN.CONTENDED [COUNT n]`: the keys with clients waiting right now;
//! `WARDEN.WITHDRAW key owner`: an owner's queued requests taken out.

use redis_module::{raw, Context, RedisError, RedisResult, RedisValue};

use crate::args::{self, is_keyword};
use crate::command::Arg;
use crate::error;
use crate::reply::{self, Field};
use crate::waiters;

/// Keys listed when no COUNT is given, and the most one call lists.
const DEFAULT_COUNT: usize = 10;
pub const MAX_COUNT: usize = 1000;

/// `WARDEN.WITHDRAW key owner`: nothing in the keyspace changes (nothing is
/// replicated); a replica queues nobody and answers 0.
pub fn withdraw(ctx: &Context, args: &[Arg]) -> RedisResult {
    let [_, name, owner] = args else {
        return Err(RedisError::WrongArity);
    };
    let owner = args::owner(owner).map_err(RedisError::Str)?;
    Ok(RedisValue::Integer(
        waiters::withdraw(ctx, name, owner) as i64
    ))
}

pub fn contended(ctx: &Context, args: &[Arg]) -> RedisResult {
    let count = match &args[1..] {
        [] => DEFAULT_COUNT,
        [word, n] if is_keyword(word, "COUNT") => args::integer(n)
            .filter(|n| (1..=MAX_COUNT as i64).contains(n))
            .ok_or(RedisError::Str(error::INVALID_COUNT))?
            as usize,
        _ => return Err(RedisError::Str(error::SYNTAX)),
    };
    let keys = waiters::contended(count);
    raw::reply_with_array(ctx.ctx, keys.len() as _);
    for k in &keys {
        reply::map(
            ctx,
            &[
                ("key", Field::Bytes(&k.name)),
                ("db", Field::Int(i64::from(k.db))),
                ("kind", Field::Bytes(k.kind.as_bytes())),
                ("waiters", Field::Int(k.waiters as i64)),
                ("oldest_wait_ms", Field::Int(k.oldest_wait_ms)),
                ("total_wait_ms", Field::Int(k.total_wait_ms)),
            ],
        )?;
    }
    Ok(RedisValue::NoReply)
}
