//! A module the tests load after warden (`make test` builds it as an
//! example): its commands are not in the server's command table when warden
//! reads it at load. `LATE.SET key value` writes a string and replicates;
//! `LATE.GET key` only reads; `LATE.CALLSET key value` calls `EXISTS key`
//! through `RedisModule_Call` first, then writes like `LATE.SET` (a command
//! that runs another inside itself). `LATE.POPULATE count prefix` writes
//! `prefix:0` .. `prefix:<count-1>` (as `DEBUG POPULATE` does): a write that
//! names none of the keys it writes.

use redis_module::{redis_module, Context, RedisError, RedisResult, RedisString, RedisValue};

fn late_set(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let [_, key, value] = &args[..] else {
        return Err(RedisError::WrongArity);
    };
    ctx.open_key_writable(key).write(value.try_as_str()?)?;
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

fn late_callset(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let [_, key, value] = &args[..] else {
        return Err(RedisError::WrongArity);
    };
    ctx.call("EXISTS", &[key])?;
    ctx.open_key_writable(key).write(value.try_as_str()?)?;
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

fn late_populate(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let [_, count, prefix] = &args[..] else {
        return Err(RedisError::WrongArity);
    };
    let count = count.parse_integer()?;
    for i in 0..count {
        let name = format!("{}:{i}", prefix.try_as_str()?);
        let key = ctx.create_string(name.as_bytes());
        ctx.open_key_writable(&key).write(&format!("value:{i}"))?;
    }
    Ok(RedisValue::SimpleStringStatic("OK"))
}

fn late_get(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let [_, key] = &args[..] else {
        return Err(RedisError::WrongArity);
    };
    Ok(ctx
        .open_key(key)
        .read()?
        .map_or(RedisValue::Null, |v| RedisValue::StringBuffer(v.to_vec())))
}

redis_module! {
    name: "late",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    commands: [
        ["late.set", late_set, "write", 1, 1, 1, ""],
        ["late.get", late_get, "readonly", 1, 1, 1, ""],
        ["late.callset", late_callset, "write", 1, 1, 1, ""],
        ["late.populate", late_populate, "write", 0, 0, 0, ""],
    ],
}
