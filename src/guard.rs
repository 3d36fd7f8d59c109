//! The panic guard: a panic inside a module aborts redis-server, so every
//! callback runs inside `catch_unwind` (commands: see `command`), and the
//! panic hook writes what happened to the Redis log.

use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::logging;

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
