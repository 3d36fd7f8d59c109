//! The one argument parser: owners, times and options of every command.
//! Pure: it sees byte strings only, so any argument vector can be fuzzed.

use std::ops::Deref;

use crate::error;

/// Largest ttl or timeout accepted, in milliseconds (2^46 ms is about 2,200 years).
pub const MAX_MS: i64 = 1 << 46;
/// Largest owner, in bytes.
pub const MAX_OWNER: usize = 1024;

/// A lock request: `key owner ttl [WAIT timeout]`.
#[derive(Debug, PartialEq, Eq)]
pub struct LockRequest<'a> {
    pub owner: &'a [u8],
    pub ttl_ms: i64,
    /// `None`: answer at once when busy; `Some(0)`: wait forever.
    pub wait_ms: Option<i64>,
}

/// A decimal integer exactly as Redis writes one: optional `-`, digits, no spaces or `+`.
pub fn integer(bytes: &[u8]) -> Option<i64> {
    let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
    if digits.is_empty() || digits.len() > 20 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if digits.len() > 1 && digits[0] == b'0' {
        return None;
    }
    // Redis' own rule: "-0" is not an integer.
    if digits == b"0" && bytes.len() == 2 {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
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

/// Parses `owner ttl [WAIT timeout]` (the arguments after the key).
/// `Err` carries the full error line; arity is the caller's check.
pub fn lock_request<A: Deref<Target = [u8]>>(args: &[A]) -> Result<LockRequest<'_>, String> {
    let [owner_arg, ttl_arg, rest @ ..] = args else {
        return Err(error::SYNTAX.to_string());
    };
    let owner = owner(owner_arg).map_err(str::to_string)?;
    let ttl_ms = ttl(ttl_arg).map_err(str::to_string)?;
    let mut wait_ms = None;
    let mut rest = rest.iter();
    while let Some(arg) = rest.next() {
        if is_keyword(arg, "WAIT") && wait_ms.is_none() {
            let value = rest
                .next()
                .ok_or_else(|| error::INVALID_TIMEOUT.to_string())?;
            wait_ms = Some(timeout(value).map_err(str::to_string)?);
        } else {
            return Err(error::unknown_argument(arg));
        }
    }
    Ok(LockRequest {
        owner,
        ttl_ms,
        wait_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(args: &[&str]) -> Vec<Vec<u8>> {
        args.iter().map(|a| a.as_bytes().to_vec()).collect()
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
    fn lock_request_rejects_unknown_and_repeated_options() {
        assert!(lock_request(&v(&["me", "100", "WAITX", "5"]))
            .unwrap_err()
            .starts_with("ERR unknown argument"));
        assert!(lock_request(&v(&["me", "100", "WAIT", "5", "WAIT", "6"])).is_err());
        assert_eq!(
            lock_request(&v(&["me", "100", "WAIT"])).unwrap_err(),
            error::INVALID_TIMEOUT
        );
        assert_eq!(
            lock_request(&v(&["me", "100", "WAIT", "-1"])).unwrap_err(),
            error::INVALID_TIMEOUT
        );
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
