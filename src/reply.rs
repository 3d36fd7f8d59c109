//! Replies beyond a single value: ordered maps that are maps under RESP3 and
//! flat field/value arrays under RESP2 (Redis flattens them for us).

use std::os::raw::{c_char, c_long};

use redis_module::{raw, Context, RedisResult, RedisValue};

/// One value of a map reply.
pub enum Field<'a> {
    Int(i64),
    Bytes(&'a [u8]),
    Null,
}

/// Replies with `fields` as a map, in the order given.
pub fn map(ctx: &Context, fields: &[(&str, Field)]) -> RedisResult {
    raw::reply_with_map(ctx.ctx, fields.len() as c_long);
    for (name, value) in fields {
        simple(ctx, name);
        match value {
            Field::Int(n) => raw::reply_with_long_long(ctx.ctx, *n),
            Field::Bytes(b) => {
                raw::reply_with_string_buffer(ctx.ctx, b.as_ptr().cast::<c_char>(), b.len())
            }
            Field::Null => raw::reply_with_null(ctx.ctx),
        };
    }
    Ok(RedisValue::NoReply)
}

fn simple(ctx: &Context, s: &str) {
    raw::reply_with_string_buffer(ctx.ctx, s.as_ptr().cast::<c_char>(), s.len());
}
