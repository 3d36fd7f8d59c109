//! Every error text warden sends, in one place. Each starts with an error code.

pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
pub const INTERNAL: &str = "ERR internal error";
pub const SYNTAX: &str = "ERR syntax error";
pub const INVALID_COUNT: &str = "ERR invalid count: expected an integer from 1 to 1000";
pub const INVALID_TTL: &str = "ERR invalid ttl: expected an integer from 1 to 70368744177664 (ms)";
pub const INVALID_TIMEOUT: &str =
    "ERR invalid timeout: expected an integer from 0 to 70368744177664 (ms)";
pub const INVALID_QUEUE: &str =
    "ERR invalid QUEUE: expected an integer from 0 to 70368744177664 (waiters)";
pub const INVALID_OWNER: &str = "ERR invalid owner: expected a string of 1 to 1024 bytes";
pub const HOLDS_OVERFLOW: &str =
    "ERR hold count overflow: an owner may stack at most 9223372036854775807 holds";
pub const UPGRADE: &str = "ERR cannot upgrade a read lock to a write lock";
pub const INVALID_EFFECT: &str = "ERR invalid replicated effect";
pub const EFFECT_FROM_CLIENT: &str =
    "ERR effect commands are accepted only from the master link and the AOF";
pub const INVALID_LEASE: &str =
    "ERR invalid lease: expected an integer from 1 to 9223372036854775807";
pub const INVALID_LEASE_TIME: &str =
    "ERR invalid lease_ms: expected an integer from 1 to 70368744177664 (ms)";
pub const INVALID_REFRESH: &str =
    "ERR invalid REFRESH: expected an integer from 1 to 70368744177664 (ms)";
pub const INVALID_PX: &str = "ERR invalid PX: expected an integer from 1 to 70368744177664 (ms)";
pub const INVALID_JITTER: &str =
    "ERR invalid JITTER: expected an integer from 0 to 70368744177664 (ms)";
pub const INVALID_STALE: &str =
    "ERR invalid STALE: expected an integer from 1 to 70368744177664 (ms)";
pub const JITTER_WITHOUT_PX: &str = "ERR JITTER needs PX";
pub const LEASE_IN_SCRIPT: &str =
    "ERR CACHE.GET grants no lease inside a script or function: a lease must end with its caller's connection";
pub const INVALID_LIMIT: &str = "ERR invalid limit: expected an integer from 1 to 2147483648";
pub const LIMIT_MISSING: &str = "ERR LIMIT is required: every acquire states the semaphore's limit";
pub const INVALID_PERMITS: &str = "ERR invalid permits: expected an integer from 1 to the limit";
pub const ALREADY_HOLDS: &str = "ERR owner already holds this semaphore";
/// A waiter asking for more permits than a lowered limit allows.
pub const PERMITS_ABOVE_LIMIT: &str =
    "ERR the semaphore's limit was lowered below the permits this request asks for";
/// A waiter whose key now holds a semaphore of another limit than it stated.
pub const LIMIT_REPLACED: &str =
    "ERR the semaphore was replaced by one of another limit while this request waited";
/// A command that may grant, where its client cannot wait for the replicas.
pub const SYNC_CANNOT_WAIT: &str =
    "ERR warden.sync-replicas is set: a grant or extend waits for replicas, which cannot happen inside MULTI, a script or a function";
pub const READONLY: &str = "READONLY You can't write against a read only replica.";
/// A waiter whose key's slot moved to another node, where that node is not
/// known: cluster clients send the command again (and then get `MOVED`).
pub const SLOT_MOVED: &str =
    "TRYAGAIN the key's slot moved to another node while this request waited: send it again";
// Rate limiters.
pub const RATE_INVALID_COUNT: &str =
    "ERR invalid count: expected an integer from 1 to 1000000 per ms of the period";
pub const RATE_INVALID_PERIOD: &str =
    "ERR invalid period: expected an integer from 1 to 86400000 (ms)";
pub const RATE_INVALID_BURST: &str = "ERR invalid BURST: expected an integer from 1 to 1000000000";
pub const RATE_INVALID_COST: &str = "ERR invalid COST: expected an integer from 1 to the burst";
pub const RATE_INVALID_REFUND: &str = "ERR invalid cost: expected an integer from 1 to 1000000000";
/// A waiter whose limiter's rate changed (`RATE.CONFIG`, `RESTORE`) while it waited.
pub const RATE_CHANGED: &str = "ERR the limiter's rate was changed while this request waited";
// `GCRA`: the core proposal's texts, and warden's own narrower ranges.
pub const GCRA_BURST_RANGE: &str = "ERR value is out of range, must be positive";
pub const GCRA_NOT_INTEGER: &str = "ERR value is not an integer or out of range";
pub const GCRA_INTEGER_RANGE: &str =
    "ERR value is out of range, value must between 1 and 9223372036854775807";
pub const GCRA_NOT_FLOAT: &str = "ERR value is not a valid float";
pub const GCRA_PERIOD_RANGE: &str = "ERR period must be > 0 and < 1e12";
pub const GCRA_TOKENS_MISSING: &str = "ERR Missing TOKENS value";
pub const GCRA_PERIOD_MS: &str =
    "ERR warden's GCRA takes a period of whole milliseconds, from 0.001 to 86400 seconds";
pub const GCRA_TOO_FAST: &str =
    "ERR warden's GCRA takes at most 1000000 tokens per millisecond of the period";
pub const GCRA_BURST_TOO_LARGE: &str = "ERR warden's GCRA takes a max_burst of at most 999999999";
/// The server's own text for a command refused over `maxmemory`.
pub const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";

/// An acquire stating another limit than the semaphore's.
pub fn other_limit(limit: u64, stated: u64) -> String {
    format!("ERR semaphore limit is {limit}, not {stated}")
}

/// An acquire stating another rate than the limiter's.
pub fn other_rate(has: (u64, u64, u64), stated: (u64, u64, u64)) -> String {
    let (count, period, burst) = has;
    let (stated_count, stated_period, stated_burst) = stated;
    format!(
        "ERR limiter rate is {count} per {period} ms burst {burst}, not {stated_count} per {stated_period} ms burst {stated_burst}"
    )
}

/// A `ttl` that is no integer in range, under `warden.max-lease` (`max_ms`, not 0).
pub fn invalid_ttl(max_ms: i64) -> String {
    format!("ERR invalid ttl: expected an integer from 1 to {max_ms} (ms)")
}

/// A `ttl` above `warden.max-lease` (`max_ms`, not 0).
pub fn ttl_above_max_lease(max_ms: i64) -> String {
    format!("ERR ttl exceeds warden.max-lease: expected an integer from 1 to {max_ms} (ms)")
}

/// `ERR unknown argument '<arg>'` (`BF.RESERVE`), with the argument made safe for an error line.
pub fn unknown_argument(arg: &[u8]) -> String {
    let arg = printable(arg);
    format!("ERR unknown argument '{arg}'")
}

/// At most 64 printable ASCII characters of `bytes`, so an error line stays one line.
pub fn printable(bytes: &[u8]) -> String {
    let mut out: String = bytes
        .iter()
        .take(64)
        .map(|&b| {
            if (0x20..0x7f).contains(&b) {
                b as char
            } else {
                '?'
            }
        })
        .collect();
    if bytes.len() > 64 {
        out.push_str("...");
    }
    out
}

// Bloom filters: RedisBloom 2.8's texts, so existing clients see what they expect.
pub const BF_EXISTS: &str = "ERR item exists";
pub const BF_NOT_FOUND: &str = "ERR not found";
pub const BF_BAD_ERROR_RATE: &str = "ERR bad error rate";
pub const BF_ERROR_RATE_RANGE: &str = "ERR (0 < error rate range < 1) ";
pub const BF_CAPACITY_RANGE: &str = "ERR (capacity should be larger than 0)";
pub const BF_BAD_CAPACITY: &str = "ERR bad capacity";
pub const BF_NO_EXPANSION: &str = "ERR no expansion";
pub const BF_BAD_EXPANSION: &str = "ERR bad expansion";
pub const BF_EXPANSION_RANGE: &str = "ERR expansion should be greater or equal to 1";
pub const BF_NONSCALING_EXPANSION: &str = "Nonscaling filters cannot expand";
pub const BF_FULL: &str = "ERR non scaling filter is full";
pub const BF_PROBLEM_INSERTING: &str = "ERR problem inserting into filter";
pub const BF_INSERT_BAD_ERROR_RATE: &str = "Bad error rate";
pub const BF_INSERT_BAD_CAPACITY: &str = "Bad capacity";
pub const BF_INSERT_BAD_EXPANSION: &str = "Bad expansion";
pub const BF_INSERT_BAD_ARGUMENT: &str = "Bad argument received";
pub const BF_INSERT_UNKNOWN: &str = "Unknown argument received";
pub const BF_INFO_FIELD: &str = "Invalid information value";
pub const BF_SCANDUMP_ITERATOR: &str = "Second argument must be numeric";
pub const BF_LOADCHUNK_ITERATOR: &str = "ERR Second argument must be numeric";
pub const BF_BAD_DATA: &str = "ERR received bad data";
// Where warden is deliberately stricter than RedisBloom.
pub const BF_EXPANSION_TOO_LARGE: &str = "ERR expansion should be at most 32768";
pub const BF_TOO_LARGE: &str = "ERR filter would exceed warden.bf-max-memory";
pub const BF_ERROR_TOO_SMALL: &str = "ERR error rate too small: a filter needs at least 2^-64";

/// A filter (or a scale-out) that does not fit in what `maxmemory` leaves.
pub fn no_room(need: u64, room: u64) -> String {
    format!("ERR filter needs {need} bytes; maxmemory leaves {room}")
}

/// A `LOADCHUNK` header describing more than `maxmemory` leaves.
pub fn no_room_for_chunk(room: u64) -> String {
    format!("ERR filter needs more than maxmemory leaves ({room} bytes)")
}
