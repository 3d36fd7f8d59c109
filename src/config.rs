//! Module configuration: `warden.*` in redis.conf, `CONFIG GET/SET`, or
//! `loadmodule <path> <name> <value> ...`.

use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicI64, AtomicPtr, AtomicU64, Ordering};

use redis_module::configuration::{
    get_i64_default_config_value, get_string_default_config_value, register_i64_configuration,
    ConfigurationFlags,
};
use redis_module::{raw, Context, RedisString};

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

/// The string `CONFIG GET` shows for the error rate. Redis copies what the
/// getter returns and does not free it, so the module keeps one string and
/// replaces it on every successful set (a fresh string per get would leak).
static ERROR_RATE_TEXT: AtomicPtr<raw::RedisModuleString> = AtomicPtr::new(ptr::null_mut());

extern "C" fn error_rate_get(
    _name: *const c_char,
    _privdata: *mut c_void,
) -> *mut raw::RedisModuleString {
    ERROR_RATE_TEXT.load(Ordering::Relaxed)
}

extern "C" fn error_rate_set(
    _name: *const c_char,
    value: *mut raw::RedisModuleString,
    _privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    let mut len = 0;
    let text = raw::string_ptr_len(value, &mut len);
    let bytes = unsafe { std::slice::from_raw_parts(text.cast::<u8>(), len) };
    match parse_float(bytes) {
        Some(rate) if rate > 0.0 && rate < 1.0 => {
            BF_ERROR_RATE.0.store(rate.to_bits(), Ordering::Relaxed);
            let copy =
                unsafe { raw::RedisModule_CreateStringFromString.unwrap()(ptr::null_mut(), value) };
            let old = ERROR_RATE_TEXT.swap(copy, Ordering::Relaxed);
            if !old.is_null() {
                unsafe { raw::RedisModule_FreeString.unwrap()(ptr::null_mut(), old) };
            }
            raw::REDISMODULE_OK as c_int
        }
        _ => {
            let msg = c"error rate must be a number between 0 and 1 (exclusive)";
            // Redis frees the error string.
            unsafe {
                *err = raw::RedisModule_CreateString.unwrap()(
                    ptr::null_mut(),
                    msg.as_ptr(),
                    msg.count_bytes(),
                )
            };
            raw::REDISMODULE_ERR as c_int
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
    let (Ok(name), Ok(default)) = (CString::new("bf-error-rate"), CString::new(rate)) else {
        return false;
    };
    let registered = unsafe {
        raw::RedisModule_RegisterStringConfig.unwrap()(
            ctx.ctx,
            name.as_ptr(),
            default.as_ptr(),
            raw::REDISMODULE_CONFIG_DEFAULT,
            Some(error_rate_get),
            Some(error_rate_set),
            None,
            ptr::null_mut(),
        )
    };
    if registered != raw::REDISMODULE_OK as c_int {
        return false;
    }
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
