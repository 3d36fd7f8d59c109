//! Module configuration: `warden.*` in redis.conf, `CONFIG GET/SET`, or
//! `loadmodule <path> <name> <value> ...`.
//!
//! Every source takes the same values (`64mb` included) and the same ranges.
//! A bad module argument — unknown name, unparsable or out-of-range value —
//! refuses the load with a log line naming it; `CONFIG SET` refuses values
//! with which implicitly created filters could not be built.

use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_longlong, c_void};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, AtomicU64, Ordering};

use redis_module::{logging, raw, Context, RedisString};

use crate::bloom::chain::{Chain, Params, Refusal, MAX_EXPANSION};

/// A float config (Redis has no float module configs: it travels as a string).
pub struct ErrorRate(AtomicU64);

impl ErrorRate {
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    fn set(&self, rate: f64) {
        self.0.store(rate.to_bits(), Ordering::Relaxed);
    }
}

pub static BF_ERROR_RATE: ErrorRate = ErrorRate(AtomicU64::new(0x3f847ae147ae147b)); // 0.01
pub static BF_INITIAL_CAPACITY: AtomicI64 = AtomicI64::new(100);
pub static BF_EXPANSION: AtomicI64 = AtomicI64::new(2);
pub static BF_MAX_MEMORY: AtomicI64 = AtomicI64::new(128 << 20);
/// Largest `ttl` a lock grant or extend may ask for, in ms (0: no cap).
pub static MAX_LEASE: AtomicI64 = AtomicI64::new(0);
/// How long no lock key gets a new holder after a restart or a promotion, in ms (0: off).
pub static GRACE: AtomicI64 = AtomicI64::new(0);
/// `warden.grace auto`: a window (of `max-lease` + `min-replicas-max-lag`) opens
/// only where an acknowledged grant may have been lost (`crate::grace`).
pub static GRACE_AUTO: AtomicBool = AtomicBool::new(false);
/// How many replicas must acknowledge a grant before it is answered (0: off).
pub static SYNC_REPLICAS: AtomicI64 = AtomicI64::new(0);
/// How long a grant waits for those acknowledgements, in ms.
pub static SYNC_TIMEOUT: AtomicI64 = AtomicI64::new(100);
/// Whether warden registers the `BF.*` commands (`bf-commands yes|no`).
static BF_COMMANDS: AtomicBool = AtomicBool::new(true);

pub fn bf_commands() -> bool {
    BF_COMMANDS.load(Ordering::Relaxed)
}

/// Whether wait and hold times are recorded in `INFO warden`'s histograms
/// (`latency-tracking yes|no`, like Redis' own `latency-tracking`).
static LATENCY_TRACKING: AtomicBool = AtomicBool::new(true);

pub fn latency_tracking() -> bool {
    LATENCY_TRACKING.load(Ordering::Relaxed)
}

/// Set once redis.conf has been applied: from then on every change is checked
/// against the other values (during loading they arrive in no fixed order).
static LOADED: AtomicBool = AtomicBool::new(false);

/// Parses an error rate the way Redis parses doubles; `None` if not a number.
pub fn parse_float(bytes: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(bytes).ok()?;
    let value: f64 = text.parse().ok()?;
    (!value.is_nan() && !text.starts_with('+')).then_some(value)
}

/// Parses a memory size as redis.conf does: digits with an optional unit
/// `b`, `k`/`kb`, `m`/`mb`, `g`/`gb` (case-insensitive; `k` = 1000, `kb` = 1024).
pub fn parse_memory(bytes: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(bytes).ok()?.to_ascii_lowercase();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    let multiplier: i64 = match unit {
        "" | "b" => 1,
        "k" => 1000,
        "kb" => 1 << 10,
        "m" => 1000 * 1000,
        "mb" => 1 << 20,
        "g" => 1000 * 1000 * 1000,
        "gb" => 1 << 30,
        _ => return None,
    };
    digits.parse::<i64>().ok()?.checked_mul(multiplier)
}

/// An integer config.
struct Number {
    name: &'static str,
    variable: &'static AtomicI64,
    default: i64,
    min: i64,
    max: i64,
    memory: bool,
}

const NUMBERS: [Number; 6] = [
    Number {
        name: "bf-initial-capacity",
        variable: &BF_INITIAL_CAPACITY,
        default: 100,
        min: 1,
        max: 1 << 40,
        memory: false,
    },
    Number {
        name: "bf-expansion",
        variable: &BF_EXPANSION,
        default: 2,
        min: 1,
        max: MAX_EXPANSION as i64,
        memory: false,
    },
    Number {
        name: "bf-max-memory",
        variable: &BF_MAX_MEMORY,
        default: 128 << 20,
        min: 1 << 10,
        max: 1 << 40,
        memory: true,
    },
    Number {
        name: "max-lease",
        variable: &MAX_LEASE,
        default: 0,
        min: 0,
        max: crate::args::MAX_MS,
        memory: false,
    },
    Number {
        name: "sync-replicas",
        variable: &SYNC_REPLICAS,
        default: 0,
        min: 0,
        max: 1024,
        memory: false,
    },
    Number {
        name: "sync-timeout",
        variable: &SYNC_TIMEOUT,
        default: 100,
        min: 1,
        max: 3_600_000,
        memory: false,
    },
];

const GRACE_NAME: &str = "grace";

/// `warden.grace`: milliseconds, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grace {
    Ms(i64),
    Auto,
}

impl Grace {
    fn parse(bytes: &[u8]) -> Option<Self> {
        if bytes.eq_ignore_ascii_case(b"auto") {
            return Some(Grace::Auto);
        }
        crate::args::integer(bytes)
            .filter(|ms| (0..=crate::args::MAX_MS).contains(ms))
            .map(Grace::Ms)
    }

    fn current() -> Self {
        if GRACE_AUTO.load(Ordering::Relaxed) {
            Grace::Auto
        } else {
            Grace::Ms(GRACE.load(Ordering::Relaxed))
        }
    }

    fn text(self) -> String {
        match self {
            Grace::Auto => "auto".into(),
            Grace::Ms(ms) => ms.to_string(),
        }
    }

    fn apply(self) {
        match self {
            Grace::Auto => GRACE_AUTO.store(true, Ordering::Relaxed),
            Grace::Ms(ms) => {
                GRACE.store(ms, Ordering::Relaxed);
                GRACE_AUTO.store(false, Ordering::Relaxed);
            }
        }
    }
}

/// `grace auto` sizes its windows from `max-lease`: without a cap no window
/// could outlast a lost lease.
fn grace_problem(grace: Grace, max_lease_ms: i64) -> Option<&'static str> {
    (grace == Grace::Auto && max_lease_ms == 0)
        .then_some("warden.grace auto needs warden.max-lease: no window outlasts an uncapped lease")
}

const RATE_NAME: &str = "bf-error-rate";
const COMMANDS_NAME: &str = "bf-commands";
const TRACKING_NAME: &str = "latency-tracking";
const GCRA_NAME: &str = "gcra-command";

/// Whether warden registers `GCRA` where the server has none (`gcra-command yes|no`).
static GCRA_COMMAND: AtomicBool = AtomicBool::new(true);

pub fn gcra_command() -> bool {
    GCRA_COMMAND.load(Ordering::Relaxed)
}

/// The values implicitly created filters are built with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Defaults {
    pub error_rate: f64,
    pub capacity: i64,
    pub expansion: i64,
    pub max_memory: i64,
}

impl Defaults {
    fn current() -> Self {
        Self {
            error_rate: BF_ERROR_RATE.get(),
            capacity: BF_INITIAL_CAPACITY.load(Ordering::Relaxed),
            expansion: BF_EXPANSION.load(Ordering::Relaxed),
            max_memory: BF_MAX_MEMORY.load(Ordering::Relaxed),
        }
    }

    /// Why a filter created implicitly with these values would be refused.
    pub fn problem(&self) -> Option<String> {
        let params = Params {
            capacity: self.capacity as u64,
            error: self.error_rate,
            expansion: Some(self.expansion as u32),
        };
        match Chain::fits(params, self.max_memory as u64) {
            Ok(_) => None,
            Err(Refusal::ErrorTooSmall) => Some(format!(
                "bf-error-rate {} is too small: a filter needs an error rate of at least 2^-63",
                self.error_rate
            )),
            Err(_) => Some(format!(
                "a filter of bf-initial-capacity {} at bf-error-rate {} would exceed \
                 bf-max-memory {} bytes",
                self.capacity, self.error_rate, self.max_memory
            )),
        }
    }
}

/// Checks a new value against the others once loading is over.
fn refuse_if_unusable(new: Defaults) -> Result<(), String> {
    if !LOADED.load(Ordering::Relaxed) {
        return Ok(());
    }
    match new.problem() {
        Some(why) => Err(format!("{why}; implicitly created filters would fail")),
        None => Ok(()),
    }
}

fn valid_rate(rate: f64) -> bool {
    rate > 0.0 && rate < 1.0
}

/// What a config accepts, for error messages.
fn allowed(name: &str) -> Option<String> {
    let name = name.strip_prefix("warden.").unwrap_or(name);
    if name == RATE_NAME {
        return Some("a number between 0 and 1 (exclusive)".into());
    }
    if name == COMMANDS_NAME || name == TRACKING_NAME || name == GCRA_NAME {
        return Some("yes or no".into());
    }
    if name == GRACE_NAME {
        return Some(format!(
            "auto, or an integer from 0 to {} milliseconds (0: off)",
            crate::args::MAX_MS
        ));
    }
    let n = NUMBERS.iter().find(|n| n.name == name)?;
    let unit = if n.memory {
        " bytes (units b, kb, mb, gb accepted)"
    } else if n.min == 0 {
        " milliseconds (0: off)"
    } else {
        ""
    };
    Some(format!("an integer from {} to {}{unit}", n.min, n.max))
}

/// The parsed `loadmodule` arguments.
#[derive(Debug, Default, PartialEq)]
pub struct ModuleArgs {
    pub error_rate: Option<f64>,
    pub numbers: [Option<i64>; 6],
    pub grace: Option<Grace>,
    pub bf_commands: Option<bool>,
    pub gcra_command: Option<bool>,
    pub latency_tracking: Option<bool>,
}

fn invalid(name: &str, shown: &str) -> String {
    format!(
        "{name} '{shown}' is invalid: {}",
        allowed(name).unwrap_or_default()
    )
}

/// Parses `name value ...`; `Err` says which argument is wrong and what is allowed.
pub fn parse_module_args(args: &[&[u8]]) -> Result<ModuleArgs, String> {
    let mut parsed = ModuleArgs::default();
    if !args.len().is_multiple_of(2) {
        let last = args[args.len() - 1];
        return Err(format!(
            "module arguments come in pairs (name value); '{}' has no value{}",
            crate::error::printable(last),
            allowed(&String::from_utf8_lossy(last).to_ascii_lowercase())
                .map_or(String::new(), |a| format!(" ({a})"))
        ));
    }
    for pair in args.chunks(2) {
        let raw_name = String::from_utf8_lossy(pair[0]).to_ascii_lowercase();
        let name = raw_name.strip_prefix("warden.").unwrap_or(&raw_name);
        let value = pair[1];
        let shown = crate::error::printable(value);
        if name == RATE_NAME {
            match parse_float(value).filter(|r| valid_rate(*r)) {
                Some(rate) => parsed.error_rate = Some(rate),
                None => return Err(invalid(name, &shown)),
            }
        } else if name == COMMANDS_NAME || name == TRACKING_NAME || name == GCRA_NAME {
            let on = match &value.to_ascii_lowercase()[..] {
                b"yes" => true,
                b"no" => false,
                _ => return Err(invalid(name, &shown)),
            };
            if name == COMMANDS_NAME {
                parsed.bf_commands = Some(on);
            } else if name == GCRA_NAME {
                parsed.gcra_command = Some(on);
            } else {
                parsed.latency_tracking = Some(on);
            }
        } else if name == GRACE_NAME {
            match Grace::parse(value) {
                Some(g) => parsed.grace = Some(g),
                None => return Err(invalid(name, &shown)),
            }
        } else if let Some(i) = NUMBERS.iter().position(|n| n.name == name) {
            let n = &NUMBERS[i];
            let number = if n.memory {
                parse_memory(value)
            } else {
                crate::args::integer(value)
            };
            match number.filter(|v| (n.min..=n.max).contains(v)) {
                Some(v) => parsed.numbers[i] = Some(v),
                None => return Err(invalid(name, &shown)),
            }
        } else {
            let known: Vec<&str> = [
                RATE_NAME,
                COMMANDS_NAME,
                GCRA_NAME,
                TRACKING_NAME,
                GRACE_NAME,
            ]
            .into_iter()
            .chain(NUMBERS.iter().map(|n| n.name))
            .collect();
            return Err(format!(
                "unknown module argument '{}' (known: {})",
                crate::error::printable(pair[0]),
                known.join(", ")
            ));
        }
    }
    Ok(parsed)
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

/// Hands Redis an error message for a refused `CONFIG SET` (Redis frees it).
fn refuse(err: *mut *mut raw::RedisModuleString, message: &str) -> c_int {
    unsafe {
        *err = raw::RedisModule_CreateString.unwrap()(
            ptr::null_mut(),
            message.as_ptr().cast::<c_char>(),
            message.len(),
        )
    };
    raw::REDISMODULE_ERR as c_int
}

extern "C" fn error_rate_set(
    _name: *const c_char,
    value: *mut raw::RedisModuleString,
    _privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    let bytes = bytes_of(value);
    let Some(rate) = parse_float(bytes).filter(|r| valid_rate(*r)) else {
        return refuse(
            err,
            "error rate must be a number between 0 and 1 (exclusive)",
        );
    };
    if let Err(why) = refuse_if_unusable(Defaults {
        error_rate: rate,
        ..Defaults::current()
    }) {
        return refuse(err, &why);
    }
    BF_ERROR_RATE.set(rate);
    keep_text(&ERROR_RATE_TEXT, value);
    raw::REDISMODULE_OK as c_int
}

/// The bytes of a string Redis hands a config setter (alive for the call).
fn bytes_of<'a>(value: *mut raw::RedisModuleString) -> &'a [u8] {
    let mut len = 0;
    let text = raw::string_ptr_len(value, &mut len);
    unsafe { std::slice::from_raw_parts(text.cast::<u8>(), len) }
}

/// Keeps a copy of `value` as what `CONFIG GET` shows, freeing the one before.
fn keep_text(slot: &AtomicPtr<raw::RedisModuleString>, value: *mut raw::RedisModuleString) {
    let copy = unsafe { raw::RedisModule_CreateStringFromString.unwrap()(ptr::null_mut(), value) };
    let old = slot.swap(copy, Ordering::Relaxed);
    if !old.is_null() {
        unsafe { raw::RedisModule_FreeString.unwrap()(ptr::null_mut(), old) };
    }
}

/// What `CONFIG GET warden.grace` shows (kept like the error rate's).
static GRACE_TEXT: AtomicPtr<raw::RedisModuleString> = AtomicPtr::new(ptr::null_mut());

extern "C" fn grace_get(
    _name: *const c_char,
    _privdata: *mut c_void,
) -> *mut raw::RedisModuleString {
    GRACE_TEXT.load(Ordering::Relaxed)
}

extern "C" fn grace_set(
    _name: *const c_char,
    value: *mut raw::RedisModuleString,
    _privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    let bytes = bytes_of(value);
    let Some(grace) = Grace::parse(bytes) else {
        return refuse(err, &invalid(GRACE_NAME, &crate::error::printable(bytes)));
    };
    if LOADED.load(Ordering::Relaxed) {
        if let Some(why) = grace_problem(grace, MAX_LEASE.load(Ordering::Relaxed)) {
            return refuse(err, why);
        }
    }
    grace.apply();
    keep_text(&GRACE_TEXT, value);
    if grace == Grace::Auto && LOADED.load(Ordering::Relaxed) {
        crate::keyspace::hear_forks();
    }
    raw::REDISMODULE_OK as c_int
}

extern "C" fn tracking_get(_name: *const c_char, _privdata: *mut c_void) -> c_int {
    c_int::from(latency_tracking())
}

extern "C" fn tracking_set(
    _name: *const c_char,
    value: c_int,
    _privdata: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    LATENCY_TRACKING.store(value != 0, Ordering::Relaxed);
    raw::REDISMODULE_OK as c_int
}

extern "C" fn number_get(_name: *const c_char, privdata: *mut c_void) -> c_longlong {
    let n = unsafe { &*privdata.cast::<Number>() };
    n.variable.load(Ordering::Relaxed)
}

extern "C" fn number_set(
    _name: *const c_char,
    value: c_longlong,
    privdata: *mut c_void,
    err: *mut *mut raw::RedisModuleString,
) -> c_int {
    let n = unsafe { &*privdata.cast::<Number>() };
    let mut next = Defaults::current();
    match n.name {
        "bf-initial-capacity" => next.capacity = value,
        "bf-expansion" => next.expansion = value,
        "bf-max-memory" => next.max_memory = value,
        "max-lease" if LOADED.load(Ordering::Relaxed) => {
            if let Some(why) = grace_problem(Grace::current(), value) {
                return refuse(err, why);
            }
        }
        // Lock settings: Redis checked the range; a new cap applies to
        // later requests only, a new grace to later windows only.
        _ => {}
    }
    if let Err(why) = refuse_if_unusable(next) {
        return refuse(err, &why);
    }
    n.variable.store(value, Ordering::Relaxed);
    raw::REDISMODULE_OK as c_int
}

type TextGet = extern "C" fn(*const c_char, *mut c_void) -> *mut raw::RedisModuleString;
type TextSet = extern "C" fn(
    *const c_char,
    *mut raw::RedisModuleString,
    *mut c_void,
    *mut *mut raw::RedisModuleString,
) -> c_int;

/// Registers a config Redis keeps as text (`warden.<name>`).
fn register_text(ctx: &Context, name: &str, default: &str, get: TextGet, set: TextSet) -> bool {
    let (Ok(name), Ok(default)) = (CString::new(name), CString::new(default)) else {
        return false;
    };
    let registered = unsafe {
        raw::RedisModule_RegisterStringConfig.unwrap()(
            ctx.ctx,
            name.as_ptr(),
            default.as_ptr(),
            raw::REDISMODULE_CONFIG_DEFAULT,
            Some(get),
            Some(set),
            None,
            ptr::null_mut(),
        )
    };
    registered == raw::REDISMODULE_OK as c_int
}

fn fail(why: &str) -> bool {
    logging::log_warning(format!("warden: not loaded: {why}"));
    false
}

/// Registers every config, taking defaults from the `loadmodule` arguments,
/// then applies redis.conf. False (with a log line saying why) if a value is
/// invalid: the module does not load.
pub fn register(ctx: &Context, args: &[RedisString]) -> bool {
    let words: Vec<&[u8]> = args.iter().map(RedisString::as_slice).collect();
    let parsed = match parse_module_args(&words) {
        Ok(parsed) => parsed,
        Err(why) => return fail(&why),
    };
    if let Some(on) = parsed.bf_commands {
        BF_COMMANDS.store(on, Ordering::Relaxed);
    }
    if let Some(on) = parsed.gcra_command {
        GCRA_COMMAND.store(on, Ordering::Relaxed);
    }
    let rate = parsed.error_rate.unwrap_or(0.01);
    BF_ERROR_RATE.set(rate);
    if !register_text(
        ctx,
        RATE_NAME,
        &rate.to_string(),
        error_rate_get,
        error_rate_set,
    ) {
        return fail("cannot register warden.bf-error-rate");
    }
    let tracking = parsed.latency_tracking.unwrap_or(true);
    LATENCY_TRACKING.store(tracking, Ordering::Relaxed);
    let Ok(name) = CString::new(TRACKING_NAME) else {
        return false;
    };
    let registered = unsafe {
        raw::RedisModule_RegisterBoolConfig.unwrap()(
            ctx.ctx,
            name.as_ptr(),
            c_int::from(tracking),
            raw::REDISMODULE_CONFIG_DEFAULT,
            Some(tracking_get),
            Some(tracking_set),
            None,
            ptr::null_mut(),
        )
    };
    if registered != raw::REDISMODULE_OK as c_int {
        return fail("cannot register warden.latency-tracking");
    }
    let grace = parsed.grace.unwrap_or(Grace::Ms(0));
    grace.apply();
    if !register_text(ctx, GRACE_NAME, &grace.text(), grace_get, grace_set) {
        return fail("cannot register warden.grace");
    }
    for (n, value) in NUMBERS.iter().zip(parsed.numbers) {
        let default = value.unwrap_or(n.default);
        n.variable.store(default, Ordering::Relaxed);
        let Ok(name) = CString::new(n.name) else {
            return false;
        };
        let flags = if n.memory {
            raw::REDISMODULE_CONFIG_MEMORY
        } else {
            raw::REDISMODULE_CONFIG_DEFAULT
        };
        let status = unsafe {
            raw::RedisModule_RegisterNumericConfig.unwrap()(
                ctx.ctx,
                name.as_ptr(),
                default,
                flags,
                n.min,
                n.max,
                Some(number_get),
                Some(number_set),
                None,
                ptr::from_ref(n).cast_mut().cast::<c_void>(),
            )
        };
        if status != raw::REDISMODULE_OK as c_int {
            return fail(&format!("cannot register warden.{}", n.name));
        }
    }
    if unsafe { raw::RedisModule_LoadConfigs.unwrap()(ctx.ctx) } != raw::REDISMODULE_OK as c_int {
        return fail("a warden.* value in the configuration file is invalid (see above)");
    }
    if let Some(why) = Defaults::current().problem() {
        return fail(&format!("{why}; implicitly created filters would fail"));
    }
    if let Some(why) = grace_problem(Grace::current(), MAX_LEASE.load(Ordering::Relaxed)) {
        return fail(why);
    }
    LOADED.store(true, Ordering::Relaxed);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Result<ModuleArgs, String> {
        let v: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
        parse_module_args(&v)
    }

    #[test]
    fn memory_takes_the_units_redis_conf_takes() {
        assert_eq!(parse_memory(b"64mb"), Some(64 << 20));
        assert_eq!(parse_memory(b"2GB"), Some(2 << 30));
        assert_eq!(parse_memory(b"16gb"), Some(16 << 30));
        assert_eq!(parse_memory(b"1k"), Some(1000));
        assert_eq!(parse_memory(b"1kb"), Some(1024));
        assert_eq!(parse_memory(b"4096"), Some(4096));
        for bad in [
            "",
            "mb",
            "1tb",
            "-1",
            "1.5gb",
            "1 gb",
            "99999999999999999999gb",
        ] {
            assert_eq!(parse_memory(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn module_arguments_accept_names_with_or_without_prefix() {
        let a = args(&["bf-max-memory", "64mb", "warden.bf-expansion", "4"]).unwrap();
        assert_eq!(a.numbers, [None, Some(4), Some(64 << 20), None, None, None]);
        let a = args(&["max-lease", "30000", "warden.grace", "31000"]).unwrap();
        assert_eq!(a.numbers[3], Some(30000));
        assert_eq!(a.grace, Some(Grace::Ms(31000)));
        let a = args(&["grace", "AUTO", "sync-replicas", "1", "sync-timeout", "250"]).unwrap();
        assert_eq!(a.grace, Some(Grace::Auto));
        assert_eq!(a.numbers[4..], [Some(1), Some(250)]);
        let a = args(&["bf-error-rate", "0.001", "bf-commands", "no"]).unwrap();
        assert_eq!((a.error_rate, a.bf_commands), (Some(0.001), Some(false)));
    }

    #[test]
    fn bad_module_arguments_name_the_argument_and_what_is_allowed() {
        let cases = [
            (
                vec!["bf-eror-rate", "0.1"],
                "unknown module argument 'bf-eror-rate'",
            ),
            (vec!["bf-expansion", "0"], "bf-expansion '0' is invalid"),
            (
                vec!["bf-max-memory", "2tb"],
                "bf-max-memory '2tb' is invalid",
            ),
            (
                vec!["bf-max-memory", "2048gb"],
                "bf-max-memory '2048gb' is invalid",
            ),
            (vec!["bf-error-rate", "1"], "bf-error-rate '1' is invalid"),
            (
                vec!["bf-commands", "maybe"],
                "bf-commands 'maybe' is invalid",
            ),
            (vec!["bf-expansion"], "has no value"),
            (
                vec!["grace", "-1"],
                "grace '-1' is invalid: auto, or an integer from 0 to 70368744177664 milliseconds",
            ),
            (vec!["grace", "automatic"], "grace 'automatic' is invalid"),
            (vec!["sync-timeout", "0"], "sync-timeout '0' is invalid"),
            (vec!["sync-replicas", "-1"], "sync-replicas '-1' is invalid"),
            (vec!["max-lease", "10s"], "max-lease '10s' is invalid"),
        ];
        for (words, expected) in cases {
            let why = args(&words).unwrap_err();
            assert!(why.contains(expected), "{words:?}: {why}");
        }
    }

    #[test]
    fn defaults_that_implicit_filters_cannot_use_are_named() {
        let ok = Defaults {
            error_rate: 0.01,
            capacity: 100,
            expansion: 2,
            max_memory: 128 << 20,
        };
        assert_eq!(ok.problem(), None);
        let tiny = Defaults {
            error_rate: 1e-30,
            ..ok
        };
        assert!(tiny.problem().unwrap().contains("too small"));
        let huge = Defaults {
            capacity: 10_000_000_000,
            ..ok
        };
        assert!(huge.problem().unwrap().contains("exceed"));
    }
}
