//! The one argument parser: owners, times and options of every command.
//! Pure: it sees byte strings only, so any argument vector can be fuzzed.

use std::ops::Deref;

use crate::error;

/// Largest ttl or timeout accepted, in milliseconds (2^46 ms is about 2,200 years).
pub const MAX_MS: i64 = 1 << 46;
/// Longest rate limiter period: a day, in ms (the slowest rate is 1 per day).
pub const MAX_PERIOD_MS: u64 = 86_400_000;
/// Fastest rate: 10^6 tokens per ms.
pub const MAX_PER_MS: u64 = 1_000_000;
/// Largest rate limiter burst (and so largest cost).
pub const MAX_BURST: u64 = 1_000_000_000;
/// Largest owner, in bytes.
pub const MAX_OWNER: usize = 1024;

/// A lock request: `key owner ttl [WAIT timeout] [QUEUE n]`.
#[derive(Debug, PartialEq, Eq)]
pub struct LockRequest<'a> {
    pub owner: &'a [u8],
    pub ttl_ms: i64,
    /// `None`: answer at once when busy; `Some(0)`: wait forever.
    pub wait_ms: Option<i64>,
    /// `QUEUE n`: answer at once instead of queueing behind `n` or more waiters.
    pub queue: Option<u64>,
}

/// `WAIT timeout` and `QUEUE n`, the options of every command that may wait.
#[derive(Debug, Default, PartialEq, Eq)]
struct WaitOptions {
    wait_ms: Option<i64>,
    queue: Option<u64>,
}

impl WaitOptions {
    /// Takes `arg` (and its value) if it is `WAIT` or `QUEUE`, each once.
    /// `Ok(false)`: not one of them.
    fn take<'a, A: Deref<Target = [u8]> + 'a>(
        &mut self,
        arg: &[u8],
        rest: &mut impl Iterator<Item = &'a A>,
    ) -> Result<bool, String> {
        if is_keyword(arg, "WAIT") && self.wait_ms.is_none() {
            self.wait_ms = Some(timeout(option_value(rest.next())?).map_err(str::to_string)?);
        } else if is_keyword(arg, "QUEUE") && self.queue.is_none() {
            self.queue = Some(queue_length(option_value(rest.next())?)?);
        } else {
            return Ok(false);
        }
        Ok(true)
    }
}

/// `QUEUE n`: 0..=2^46 waiters.
fn queue_length(bytes: &[u8]) -> Result<u64, &'static str> {
    match integer(bytes) {
        Some(n) if (0..=MAX_MS).contains(&n) => Ok(n as u64),
        _ => Err(error::INVALID_QUEUE),
    }
}

/// A decimal integer exactly as Redis writes one: optional `-`, digits, no spaces or `+`.
pub fn integer(bytes: &[u8]) -> Option<i64> {
    let (negative, digits) = match bytes {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, bytes),
    };
    match digits {
        [] => return None,
        // Redis' own rule: "-0" is not an integer.
        [b'0'] => return (!negative).then_some(0),
        [b'0', ..] => return None,
        _ if digits.len() > 20 => return None,
        _ => {}
    }
    // One pass, digits to a number without a detour through `str` (every
    // command parses some); 19 digits or more may overflow and are checked.
    let mut magnitude = 0u64;
    for &d in digits {
        let digit = d.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        magnitude = if digits.len() < 19 {
            magnitude * 10 + u64::from(digit)
        } else {
            magnitude.checked_mul(10)?.checked_add(u64::from(digit))?
        };
    }
    if negative {
        0i64.checked_sub_unsigned(magnitude)
    } else {
        i64::try_from(magnitude).ok()
    }
}

pub fn owner(bytes: &[u8]) -> Result<&[u8], &'static str> {
    if bytes.is_empty() || bytes.len() > MAX_OWNER {
        return Err(error::INVALID_OWNER);
    }
    Ok(bytes)
}

pub fn ttl(bytes: &[u8]) -> Result<i64, &'static str> {
    match integer(bytes) {
        Some(ms) if (1..=MAX_MS).contains(&ms) => Ok(ms),
        _ => Err(error::INVALID_TTL),
    }
}

pub fn timeout(bytes: &[u8]) -> Result<i64, &'static str> {
    match integer(bytes) {
        Some(ms) if (0..=MAX_MS).contains(&ms) => Ok(ms),
        _ => Err(error::INVALID_TIMEOUT),
    }
}

/// Parses `owner ttl` (the arguments after the key of an EXTEND).
pub fn owner_and_ttl<A: Deref<Target = [u8]>>(args: &[A]) -> Result<(&[u8], i64), &'static str> {
    match args {
        [owner_arg, ttl_arg] => Ok((owner(owner_arg)?, ttl(ttl_arg)?)),
        _ => Err(error::SYNTAX),
    }
}

/// Case-insensitive whole-word keyword match.
pub fn is_keyword(arg: &[u8], keyword: &str) -> bool {
    arg.eq_ignore_ascii_case(keyword.as_bytes())
}

/// Parses `owner ttl [WAIT timeout] [QUEUE n]` (the arguments after the key).
/// `Err` carries the full error line; arity is the caller's check.
pub fn lock_request<A: Deref<Target = [u8]>>(args: &[A]) -> Result<LockRequest<'_>, String> {
    let [owner_arg, ttl_arg, rest @ ..] = args else {
        return Err(error::SYNTAX.to_string());
    };
    let owner = owner(owner_arg).map_err(str::to_string)?;
    let ttl_ms = ttl(ttl_arg).map_err(str::to_string)?;
    let mut options = WaitOptions::default();
    let mut rest = rest.iter();
    while let Some(arg) = rest.next() {
        if !options.take(arg, &mut rest)? {
            return Err(error::SYNTAX.to_string());
        }
    }
    Ok(LockRequest {
        owner,
        ttl_ms,
        wait_ms: options.wait_ms,
        queue: options.queue,
    })
}

/// `CACHE.GET key lease_ms [WAIT timeout] [QUEUE n] [REFRESH ms] [FRESH]`.
#[derive(Debug, PartialEq, Eq)]
pub struct CacheGet {
    pub lease_ms: i64,
    pub wait_ms: Option<i64>,
    pub queue: Option<u64>,
    pub refresh_ms: Option<i64>,
    pub fresh: bool,
}

/// `CACHE.GET`'s `lease_ms` (a plain hit reads nothing else).
pub fn lease_ms(bytes: &[u8]) -> Result<i64, &'static str> {
    match integer(bytes) {
        Some(ms) if (1..=MAX_MS).contains(&ms) => Ok(ms),
        _ => Err(error::INVALID_LEASE_TIME),
    }
}

/// Parses the arguments after the key of a `CACHE.GET`.
pub fn cache_get<A: Deref<Target = [u8]>>(args: &[A]) -> Result<CacheGet, String> {
    let [lease_arg, rest @ ..] = args else {
        return Err(error::SYNTAX.to_string());
    };
    let lease_ms = lease_ms(lease_arg).map_err(str::to_string)?;
    let mut get = CacheGet {
        lease_ms,
        wait_ms: None,
        queue: None,
        refresh_ms: None,
        fresh: false,
    };
    let mut options = WaitOptions::default();
    let mut rest = rest.iter();
    while let Some(arg) = rest.next() {
        if options.take(arg, &mut rest)? {
            continue;
        } else if is_keyword(arg, "REFRESH") && get.refresh_ms.is_none() {
            let value = option_value(rest.next())?;
            get.refresh_ms = Some(ms_in(value, 1, error::INVALID_REFRESH)?);
        } else if is_keyword(arg, "FRESH") && !get.fresh {
            get.fresh = true;
        } else {
            return Err(error::SYNTAX.to_string());
        }
    }
    (get.wait_ms, get.queue) = (options.wait_ms, options.queue);
    Ok(get)
}

/// `CACHE.FILL key lease value [PX ms [JITTER ms]]`.
#[derive(Debug, PartialEq, Eq)]
pub struct CacheFill<'a> {
    pub lease: u64,
    pub value: &'a [u8],
    pub px_ms: Option<i64>,
    pub jitter_ms: i64,
}

/// Parses the arguments after the key of a `CACHE.FILL`.
pub fn cache_fill<A: Deref<Target = [u8]>>(args: &[A]) -> Result<CacheFill<'_>, String> {
    let [lease_arg, value, rest @ ..] = args else {
        return Err(error::SYNTAX.to_string());
    };
    let mut fill = CacheFill {
        lease: lease(lease_arg).map_err(str::to_string)?,
        value,
        px_ms: None,
        jitter_ms: 0,
    };
    let mut jitter = false;
    let mut rest = rest.iter();
    while let Some(arg) = rest.next() {
        if is_keyword(arg, "PX") && fill.px_ms.is_none() {
            let value = option_value(rest.next())?;
            fill.px_ms = Some(ms_in(value, 1, error::INVALID_PX)?);
        } else if is_keyword(arg, "JITTER") && !jitter {
            if fill.px_ms.is_none() {
                return Err(error::JITTER_WITHOUT_PX.to_string());
            }
            let value = option_value(rest.next())?;
            fill.jitter_ms = ms_in(value, 0, error::INVALID_JITTER)?;
            jitter = true;
        } else {
            return Err(error::SYNTAX.to_string());
        }
    }
    Ok(fill)
}

/// A lease token: a positive integer.
pub fn lease(bytes: &[u8]) -> Result<u64, &'static str> {
    match integer(bytes) {
        Some(n) if n >= 1 => Ok(n as u64),
        _ => Err(error::INVALID_LEASE),
    }
}

/// Parses `[STALE ms]` (the arguments after the key of a `CACHE.INVALIDATE`).
pub fn stale_option<A: Deref<Target = [u8]>>(args: &[A]) -> Result<Option<i64>, String> {
    match args {
        [] => Ok(None),
        [keyword, value] if is_keyword(keyword, "STALE") => {
            Ok(Some(ms_in(value, 1, error::INVALID_STALE)?))
        }
        _ => Err(error::SYNTAX.to_string()),
    }
}

/// A semaphore acquire: `key owner ttl LIMIT n [PERMITS k] [WAIT timeout] [QUEUE n]`.
#[derive(Debug, PartialEq, Eq)]
pub struct SemRequest<'a> {
    pub owner: &'a [u8],
    pub ttl_ms: i64,
    pub limit: u64,
    pub permits: u64,
    /// `None`: answer at once when busy; `Some(0)`: wait forever.
    pub wait_ms: Option<i64>,
    pub queue: Option<u64>,
}

/// A semaphore limit, 1..=2^31.
pub fn limit(bytes: &[u8]) -> Result<u64, &'static str> {
    match integer(bytes) {
        Some(n) if (1..=crate::semaphore::state::MAX_LIMIT as i64).contains(&n) => Ok(n as u64),
        _ => Err(error::INVALID_LIMIT),
    }
}

/// Parses `owner ttl LIMIT n [PERMITS k] [WAIT timeout] [QUEUE n]` (the arguments
/// after the key; options in any order, each once). `PERMITS` is 1..=`LIMIT`.
pub fn sem_request<A: Deref<Target = [u8]>>(args: &[A]) -> Result<SemRequest<'_>, String> {
    let [owner_arg, ttl_arg, rest @ ..] = args else {
        return Err(error::SYNTAX.to_string());
    };
    let owner = owner(owner_arg).map_err(str::to_string)?;
    let ttl_ms = ttl(ttl_arg).map_err(str::to_string)?;
    let (mut limit_n, mut permits) = (None, None);
    let mut options = WaitOptions::default();
    let mut rest = rest.iter();
    while let Some(arg) = rest.next() {
        if is_keyword(arg, "LIMIT") && limit_n.is_none() {
            limit_n = Some(limit(option_value(rest.next())?).map_err(str::to_string)?);
        } else if is_keyword(arg, "PERMITS") && permits.is_none() {
            permits = Some(integer(option_value(rest.next())?).ok_or(error::INVALID_PERMITS)?);
        } else if !options.take(arg, &mut rest)? {
            return Err(error::SYNTAX.to_string());
        }
    }
    let limit = limit_n.ok_or(error::LIMIT_MISSING)?;
    let permits = match permits {
        None => 1,
        Some(k) if (1..=limit as i64).contains(&k) => k as u64,
        Some(_) => return Err(error::INVALID_PERMITS.to_string()),
    };
    Ok(SemRequest {
        owner,
        ttl_ms,
        limit,
        permits,
        wait_ms: options.wait_ms,
        queue: options.queue,
    })
}

/// A rate limiter request: `count period [BURST b] [COST n] [WAIT timeout] [QUEUE n]`.
#[derive(Debug, PartialEq, Eq)]
pub struct RateRequest {
    pub count: u64,
    pub period_ms: u64,
    pub burst: u64,
    pub cost: u64,
    /// `None`: answer at once when limited; `Some(0)`: wait as long as it takes.
    pub wait_ms: Option<i64>,
    pub queue: Option<u64>,
}

/// `count period [BURST burst]`'s numbers: a period of 1 ms to a day, at
/// most 10^6 tokens per ms, a burst of 1 to 10^9 (default: `count`).
pub fn rate_numbers(count: &[u8], period: &[u8]) -> Result<(u64, u64), &'static str> {
    let period_ms = match integer(period) {
        Some(p) if (1..=MAX_PERIOD_MS as i64).contains(&p) => p as u64,
        _ => return Err(error::RATE_INVALID_PERIOD),
    };
    match integer(count) {
        Some(c) if c >= 1 && (c as u64) <= MAX_PER_MS * period_ms => Ok((c as u64, period_ms)),
        _ => Err(error::RATE_INVALID_COUNT),
    }
}

/// A burst, 1..=10^9.
pub fn burst(bytes: &[u8]) -> Result<u64, &'static str> {
    match integer(bytes) {
        Some(b) if (1..=MAX_BURST as i64).contains(&b) => Ok(b as u64),
        _ => Err(error::RATE_INVALID_BURST),
    }
}

/// Parses `count period [BURST burst] [COST cost] [WAIT timeout] [QUEUE n]`
/// (the arguments after the key; options in any order, each once).
pub fn rate_request<A: Deref<Target = [u8]>>(args: &[A]) -> Result<RateRequest, String> {
    let [count_arg, period_arg, rest @ ..] = args else {
        return Err(error::SYNTAX.to_string());
    };
    let (count, period_ms) = rate_numbers(count_arg, period_arg).map_err(str::to_string)?;
    let (mut burst_n, mut cost) = (None, None);
    let mut options = WaitOptions::default();
    let mut rest = rest.iter();
    while let Some(arg) = rest.next() {
        if is_keyword(arg, "BURST") && burst_n.is_none() {
            burst_n = Some(burst(option_value(rest.next())?).map_err(str::to_string)?);
        } else if is_keyword(arg, "COST") && cost.is_none() {
            cost = Some(integer(option_value(rest.next())?).ok_or(error::RATE_INVALID_COST)?);
        } else if !options.take(arg, &mut rest)? {
            return Err(error::SYNTAX.to_string());
        }
    }
    let burst = match burst_n {
        Some(b) => b,
        None => count.min(MAX_BURST),
    };
    let cost = match cost {
        None => 1,
        Some(n) if (1..=burst as i64).contains(&n) => n as u64,
        Some(_) => return Err(error::RATE_INVALID_COST.to_string()),
    };
    Ok(RateRequest {
        count,
        period_ms,
        burst,
        cost,
        wait_ms: options.wait_ms,
        queue: options.queue,
    })
}

/// Parses `GCRA`'s `max_burst tokens_per_period period [TOKENS count]` (the
/// arguments after the key) into `(count, period_ms, burst)` and the tokens,
/// with the core proposal's error texts, checking in its order. `period` is
/// seconds: warden takes whole ms from 1 ms to a day.
pub fn gcra_request<A: Deref<Target = [u8]>>(args: &[A]) -> Result<((u64, u64, u64), u64), String> {
    let positive = |bytes: &[u8]| match integer(bytes) {
        None => Err(error::GCRA_NOT_INTEGER),
        Some(n) if n < 1 => Err(error::GCRA_INTEGER_RANGE),
        Some(n) => Ok(n as u64),
    };
    let (max_burst, count, period, rest) = match args {
        [b, c, p, rest @ ..] => (b, c, p, rest),
        _ => return Err(error::SYNTAX.to_string()),
    };
    let max_burst = match integer(max_burst) {
        Some(b) if b >= 0 => b as u64,
        _ => return Err(error::GCRA_BURST_RANGE.to_string()),
    };
    let count = positive(count)?;
    let seconds = std::str::from_utf8(period)
        .ok()
        .filter(|t| !t.starts_with('+'))
        .and_then(|t| t.parse::<f64>().ok())
        .filter(|s| !s.is_nan())
        .ok_or(error::GCRA_NOT_FLOAT)?;
    if !(seconds > 0.0 && seconds < 1e12) {
        return Err(error::GCRA_PERIOD_RANGE.to_string());
    }
    let tokens = match rest {
        [] => 1,
        [keyword] if is_keyword(keyword, "TOKENS") => {
            return Err(error::GCRA_TOKENS_MISSING.to_string())
        }
        [keyword, n] if is_keyword(keyword, "TOKENS") => positive(n)?,
        _ => return Err(error::SYNTAX.to_string()),
    };
    let ms = seconds * 1000.0;
    let period_ms = ms.round();
    if (ms - period_ms).abs() > 1e-6 * ms.max(1.0)
        || !(1.0..=MAX_PERIOD_MS as f64).contains(&period_ms)
    {
        return Err(error::GCRA_PERIOD_MS.to_string());
    }
    let period_ms = period_ms as u64;
    if count > MAX_PER_MS * period_ms {
        return Err(error::GCRA_TOO_FAST.to_string());
    }
    if max_burst >= MAX_BURST {
        return Err(error::GCRA_BURST_TOO_LARGE.to_string());
    }
    Ok(((count, period_ms, max_burst + 1), tokens))
}

/// The value after an option's keyword; none is Redis' `ERR syntax error`.
fn option_value<A: Deref<Target = [u8]>>(value: Option<&A>) -> Result<&[u8], String> {
    value
        .map(|v| &v[..])
        .ok_or_else(|| error::SYNTAX.to_string())
}

/// Milliseconds in `min..=MAX_MS`, else `invalid`.
fn ms_in(bytes: &[u8], min: i64, invalid: &'static str) -> Result<i64, String> {
    match integer(bytes) {
        Some(ms) if (min..=MAX_MS).contains(&ms) => Ok(ms),
        _ => Err(invalid.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(args: &[&str]) -> Vec<Vec<u8>> {
        args.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    #[test]
    fn semaphore_requests_need_a_limit_and_fitting_permits() {
        let args = v(&["o", "100", "permits", "3", "LIMIT", "5", "wait", "0"]);
        let req = sem_request(&args).unwrap();
        assert_eq!((req.limit, req.permits, req.wait_ms), (5, 3, Some(0)));
        assert_eq!(
            sem_request(&v(&["o", "100", "LIMIT", "5"]))
                .unwrap()
                .permits,
            1
        );
        let err = |a: &[&str]| sem_request(&v(a)).unwrap_err();
        assert_eq!(err(&["o", "100"]), error::LIMIT_MISSING);
        assert_eq!(err(&["o", "100", "PERMITS", "1"]), error::LIMIT_MISSING);
        assert_eq!(err(&["o", "100", "LIMIT", "0"]), error::INVALID_LIMIT);
        assert_eq!(
            err(&["o", "100", "LIMIT", "2147483649"]),
            error::INVALID_LIMIT
        );
        assert_eq!(
            err(&["o", "100", "LIMIT", "5", "PERMITS", "6"]),
            error::INVALID_PERMITS
        );
        assert_eq!(
            err(&["o", "100", "LIMIT", "5", "PERMITS", "0"]),
            error::INVALID_PERMITS
        );
        assert_eq!(
            err(&["o", "100", "LIMIT", "5", "LIMIT", "5"]),
            error::SYNTAX
        );
        assert_eq!(err(&["o", "100", "LIMIT"]), error::SYNTAX);
        assert_eq!(err(&["o", "100", "LIMITS", "5"]), error::SYNTAX);
        assert_eq!(err(&["o", "0", "LIMIT", "5"]), error::INVALID_TTL);
    }

    #[test]
    fn integers_follow_redis_rules() {
        assert_eq!(integer(b"0"), Some(0));
        assert_eq!(integer(b"-12"), Some(-12));
        assert_eq!(integer(b"9223372036854775807"), Some(i64::MAX));
        for bad in [
            &b""[..],
            b"-",
            b"+1",
            b" 1",
            b"1 ",
            b"01",
            b"1.5",
            b"1e3",
            b"99999999999999999999",
            b"-0",
        ] {
            assert_eq!(integer(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn ttl_range_is_one_to_two_pow_46() {
        assert_eq!(ttl(b"1"), Ok(1));
        assert_eq!(ttl(b"70368744177664"), Ok(MAX_MS));
        assert_eq!(ttl(b"70368744177665"), Err(error::INVALID_TTL));
        assert_eq!(ttl(b"0"), Err(error::INVALID_TTL));
        assert_eq!(ttl(b"-5"), Err(error::INVALID_TTL));
        assert_eq!(timeout(b"0"), Ok(0));
    }

    #[test]
    fn owner_is_one_to_1024_bytes() {
        assert!(owner(b"").is_err());
        assert!(owner(&[0u8; 1024]).is_ok());
        assert!(owner(&[b'a'; 1025]).is_err());
    }

    #[test]
    fn lock_request_parses_wait_in_any_case() {
        let args = v(&["me", "100", "wait", "5"]);
        let req = lock_request(&args).unwrap();
        assert_eq!(
            (req.owner, req.ttl_ms, req.wait_ms),
            (&b"me"[..], 100, Some(5))
        );
        assert_eq!(lock_request(&v(&["me", "100"])).unwrap().wait_ms, None);
    }

    #[test]
    fn queue_goes_with_wait_on_every_command_that_waits() {
        let args = v(&["me", "100", "queue", "3", "WAIT", "5"]);
        let lock = lock_request(&args).unwrap();
        assert_eq!((lock.wait_ms, lock.queue), (Some(5), Some(3)));
        let get = cache_get(&v(&["100", "QUEUE", "0", "FRESH"])).unwrap();
        assert_eq!((get.wait_ms, get.queue, get.fresh), (None, Some(0), true));
        let args = v(&["o", "100", "QUEUE", "7", "LIMIT", "2"]);
        let sem = sem_request(&args).unwrap();
        assert_eq!((sem.limit, sem.queue), (2, Some(7)));
        for bad in [
            &["QUEUE", "-1"][..],
            &["QUEUE", "70368744177665"],
            &["QUEUE", "x"],
        ] {
            let words = [&["me", "100"][..], bad].concat();
            let args = v(&words);
            assert_eq!(lock_request(&args).unwrap_err(), error::INVALID_QUEUE);
        }
    }

    #[test]
    fn cache_get_takes_its_options_in_any_order_once() {
        let g = cache_get(&v(&["100", "fresh", "REFRESH", "20", "wait", "0"])).unwrap();
        assert_eq!(
            g,
            CacheGet {
                lease_ms: 100,
                wait_ms: Some(0),
                queue: None,
                refresh_ms: Some(20),
                fresh: true
            }
        );
        for bad in [
            &["0"][..],
            &["100", "FRESH", "FRESH"],
            &["100", "REFRESH"],
            &["100", "REFRESH", "0"],
            &["100", "WAIT", "-0"],
            &["100", "STALE", "5"],
        ] {
            assert!(cache_get(&v(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cache_fill_needs_px_before_jitter() {
        let args = v(&["7", "", "PX", "100", "JITTER", "0"]);
        let f = cache_fill(&args).unwrap();
        assert_eq!(
            (f.lease, f.value, f.px_ms, f.jitter_ms),
            (7, &b""[..], Some(100), 0)
        );
        assert_eq!(
            cache_fill(&v(&["7", "v", "JITTER", "5"])).unwrap_err(),
            error::JITTER_WITHOUT_PX
        );
        for bad in [
            &["0", "v"][..],
            &["x", "v"],
            &["7"],
            &["7", "v", "PX", "0"],
            &["7", "v", "EX", "1"],
        ] {
            assert!(cache_fill(&v(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn invalidate_takes_only_stale() {
        assert_eq!(stale_option(&v(&[])), Ok(None));
        assert_eq!(stale_option(&v(&["stale", "5"])), Ok(Some(5)));
        assert_eq!(stale_option(&v(&["STALE"])).unwrap_err(), error::SYNTAX);
        assert_eq!(
            stale_option(&v(&["STALE", "0"])).unwrap_err(),
            error::INVALID_STALE
        );
        assert_eq!(stale_option(&v(&["KEEP", "5"])).unwrap_err(), error::SYNTAX);
        assert_eq!(
            stale_option(&v(&["STALE", "5", "STALE", "6"])).unwrap_err(),
            error::SYNTAX
        );
    }

    #[test]
    fn lock_request_answers_redis_syntax_error_for_unknown_repeated_or_valueless_options() {
        for bad in [
            &["me", "100", "WAITX", "5"][..],
            &["me", "100", "WAIT", "5", "WAIT", "6"],
            &["me", "100", "WAIT"],
        ] {
            assert_eq!(lock_request(&v(bad)).unwrap_err(), error::SYNTAX, "{bad:?}");
        }
        assert_eq!(
            lock_request(&v(&["me", "100", "WAIT", "-1"])).unwrap_err(),
            error::INVALID_TIMEOUT
        );
    }

    #[test]
    fn cache_options_without_a_value_are_a_syntax_error() {
        assert_eq!(cache_get(&v(&["100", "WAIT"])).unwrap_err(), error::SYNTAX);
        assert_eq!(
            cache_get(&v(&["100", "REFRESH"])).unwrap_err(),
            error::SYNTAX
        );
        assert_eq!(
            cache_fill(&v(&["7", "v", "PX"])).unwrap_err(),
            error::SYNTAX
        );
        assert_eq!(
            cache_fill(&v(&["7", "v", "PX", "5", "JITTER"])).unwrap_err(),
            error::SYNTAX
        );
    }

    /// The texts state the ranges these parsers enforce.
    #[test]
    fn range_errors_name_the_range_they_enforce() {
        let max = MAX_MS.to_string();
        for (text, min) in [
            (error::INVALID_TTL, 1),
            (error::INVALID_TIMEOUT, 0),
            (error::INVALID_LEASE_TIME, 1),
            (error::INVALID_REFRESH, 1),
            (error::INVALID_PX, 1),
            (error::INVALID_JITTER, 0),
            (error::INVALID_STALE, 1),
        ] {
            assert!(
                text.ends_with(&format!("expected an integer from {min} to {max} (ms)")),
                "{text}"
            );
        }
        assert!(error::INVALID_OWNER.ends_with(&format!("of 1 to {MAX_OWNER} bytes")));
        assert!(error::INVALID_LEASE.ends_with(&format!("to {}", i64::MAX)));
        assert!(error::HOLDS_OVERFLOW.contains(&crate::lock::state::MAX_HOLDS.to_string()));
        assert_eq!(ttl(b"0"), Err(error::INVALID_TTL));
        assert_eq!(timeout(b"70368744177665"), Err(error::INVALID_TIMEOUT));
        assert_eq!(lease(b"0"), Err(error::INVALID_LEASE));
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Any argument vector is an error or a request within the contract — never a panic.
        #[test]
        fn lock_requests_are_valid_or_refused(args in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..24), 0..8)) {
            if let Ok(req) = lock_request(&args) {
                prop_assert!((1..=MAX_OWNER).contains(&req.owner.len()));
                prop_assert!((1..=MAX_MS).contains(&req.ttl_ms));
                prop_assert!(req.wait_ms.is_none_or(|w| (0..=MAX_MS).contains(&w)));
            }
        }

        #[test]
        fn integers_round_trip(n in any::<i64>()) {
            prop_assert_eq!(integer(n.to_string().as_bytes()), Some(n));
        }

        #[test]
        fn integer_parsing_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..32)) {
            let _ = integer(&bytes);
        }

        /// The one-pass parser agrees with Redis' rules written out plainly,
        /// on strings made mostly of digits and signs (near-misses included).
        #[test]
        fn integers_as_redis_reads_them(bytes in proptest::collection::vec(
            prop_oneof![8 => b'0'..=b'9', 1 => Just(b'-'), 1 => any::<u8>()], 0..24)) {
            prop_assert_eq!(integer(&bytes), redis_integer(&bytes));
        }
    }

    /// `string2ll`'s rules: optional `-`, digits without a leading zero,
    /// no `-0`, within `i64`.
    fn redis_integer(bytes: &[u8]) -> Option<i64> {
        let text = std::str::from_utf8(bytes).ok()?;
        let digits = text.strip_prefix('-').unwrap_or(text);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        if digits.starts_with('0') && (digits.len() > 1 || text.len() > 1) {
            return None;
        }
        text.parse().ok()
    }
}

/// What the `arguments` fuzz target runs on each input (and the unit tests on
/// every kept input): NUL-separated words through every parser.
#[cfg(any(test, fuzzing))]
pub fn exercise(data: &[u8]) {
    let args: Vec<Vec<u8>> = data.split(|&b| b == 0).map(<[u8]>::to_vec).collect();
    if let Ok(req) = lock_request(&args) {
        assert!(!req.owner.is_empty() && req.ttl_ms >= 1);
    }
    if let Ok(get) = cache_get(&args) {
        assert!(get.lease_ms >= 1);
    }
    if let Ok(fill) = cache_fill(&args) {
        assert!(fill.lease >= 1 && fill.jitter_ms >= 0);
    }
    let _ = stale_option(&args);
    for a in &args {
        let _ = integer(a);
        let _ = crate::config::parse_float(a);
    }
}

/// Replays every input kept in fuzz/regressions/<target> through `run`.
#[cfg(test)]
pub(crate) fn replay_kept_fuzz_inputs(target: &str, run: fn(&[u8])) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        run(&std::fs::read(entry.unwrap().path()).unwrap());
        n += 1;
    }
    assert!(n > 0, "no kept inputs in {}", dir.display());
}

#[cfg(test)]
#[test]
fn kept_argument_fuzz_inputs_still_pass() {
    replay_kept_fuzz_inputs("arguments", exercise);
}
