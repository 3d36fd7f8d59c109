//! The panic guard: a panic inside a module aborts redis-server, so every
//! handler and callback runs inside `catch_unwind`, and the panic hook writes
//! what happened to the Redis log.

use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{logging, Context, RedisError, RedisResult, RedisString};

use crate::error;

pub type Handler = fn(&Context, Vec<RedisString>) -> RedisResult;

/// Runs a command handler; a panic becomes `ERR internal error`.
pub fn command(ctx: &Context, args: Vec<RedisString>, handler: Handler) -> RedisResult {
    catch_unwind(AssertUnwindSafe(|| handler(ctx, args)))
        .unwrap_or(Err(RedisError::Str(error::INTERNAL)))
}

/// Runs a callback from Redis; a panic yields `fallback`.
pub fn callback<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// Sends panic messages to the Redis log instead of stderr.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        logging::log_warning(format!("warden: internal error (panic): {info}"));
    }));
}
