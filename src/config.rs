//! Module configuration: `warden.*` in redis.conf, `CONFIG GET/SET`, or
//! `loadmodule <path> <name> <value> ...`.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use redis_module::configuration::{
    get_i64_default_config_value, get_string_default_config_value, register_i64_configuration,
    register_string_configuration, ConfigurationContext, ConfigurationFlags, ConfigurationValue,
};
use redis_module::{raw, Context, RedisError, RedisString};

use crate::bloom::chain::MAX_EXPANSION;

/// A float config (Redis has no float module configs: it travels as a string).
pub struct ErrorRate(AtomicU64);

impl ErrorRate {
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// Parses an error rate the way Redis parses doubles; `None` if not a number.
pub fn parse_float(bytes: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(bytes).ok()?;
    let value: f64 = text.parse().ok()?;
    (!value.is_nan() && !text.starts_with('+')).then_some(value)
}

impl ConfigurationValue<RedisString> for ErrorRate {
    fn get(&self, _ctx: &ConfigurationContext) -> RedisString {
        RedisString::create(None, format!("{}", ErrorRate::get(self)).as_str())
    }

    fn set(&self, _ctx: &ConfigurationContext, value: RedisString) -> Result<(), RedisError> {
        match parse_float(&value) {
            Some(rate) if rate > 0.0 && rate < 1.0 => {
                self.0.store(rate.to_bits(), Ordering::Relaxed);
                Ok(())
            }
            _ => Err(RedisError::Str(
                "error rate must be a number between 0 and 1 (exclusive)",
            )),
        }
    }
}

pub static BF_ERROR_RATE: ErrorRate = ErrorRate(AtomicU64::new(0x3f847ae147ae147b)); // 0.01
pub static BF_INITIAL_CAPACITY: AtomicI64 = AtomicI64::new(100);
pub static BF_EXPANSION: AtomicI64 = AtomicI64::new(2);
pub static BF_MAX_MEMORY: AtomicI64 = AtomicI64::new(128 << 20);

/// Registers every config, taking defaults from the `loadmodule` arguments,
/// then applies redis.conf. False if a value is invalid (the module does not load).
pub fn register(ctx: &Context, args: &[RedisString]) -> bool {
    let rate = match get_string_default_config_value(args, "bf-error-rate", "0.01") {
        Ok(v) => v.to_string(),
        Err(_) => return false,
    };
    register_string_configuration(
        ctx,
        "bf-error-rate",
        &BF_ERROR_RATE,
        &rate,
        ConfigurationFlags::DEFAULT,
        None,
    );
    let numbers: [(&str, &'static AtomicI64, i64, i64, i64, ConfigurationFlags); 3] = [
        (
            "bf-initial-capacity",
            &BF_INITIAL_CAPACITY,
            100,
            1,
            1 << 40,
            ConfigurationFlags::DEFAULT,
        ),
        (
            "bf-expansion",
            &BF_EXPANSION,
            2,
            1,
            i64::from(MAX_EXPANSION),
            ConfigurationFlags::DEFAULT,
        ),
        (
            "bf-max-memory",
            &BF_MAX_MEMORY,
            128 << 20,
            1 << 10,
            1 << 40,
            ConfigurationFlags::MEMORY,
        ),
    ];
    for (name, variable, default, min, max, flags) in numbers {
        let Ok(default) = get_i64_default_config_value(args, name, default) else {
            return false;
        };
        if !(min..=max).contains(&default) {
            return false;
        }
        register_i64_configuration(ctx, name, variable, default, min, max, flags, None);
    }
    unsafe { raw::RedisModule_LoadConfigs.unwrap()(ctx.ctx) == raw::REDISMODULE_OK as i32 }
}
