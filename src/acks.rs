//! Grants the replicas acknowledged (`warden.sync-replicas` N ≥ 1): a grant,
//! hand-off, new reader, semaphore hold or extend is answered only once N
//! replicas acknowledged the replication offset that carries it; past
//! `warden.sync-timeout` it is taken back and answered busy. The client
//! stays blocked meanwhile (`crate::waiters` holds it: [`waiters::held`]).
//!
//! How a module learns acknowledgements (`docs/replication.md` has the
//! measurements, on Redis 7.0, 8.2 and Valkey 9.1):
//! - `RedisModule_Call("WAIT")` cannot wait: its temporary client has no
//!   write offset, so `WAIT` counts the online replicas and returns at once.
//!   The fix of redis #12124 (#12220, in 7.0.12+) gives a client unblocked by
//!   a module its current offset, which helps a client's own `WAIT` after a
//!   warden command, not the module.
//! - So once per event-loop turn, in the `BeforeSleep` event (subscribed
//!   from the first grant that waits; none while `sync-replicas` is 0), warden
//!   reads `ROLE` (`master_repl_offset` and each online replica's
//!   acknowledged offset; `INFO replication` where `ROLE` does not answer
//!   as a master: [`read`]), gives every grant made since the
//!   last turn that offset as its target (every write of this turn's
//!   commands, timers and events is propagated by then), answers the grants
//!   whose target N replicas reached, and asks the replicas to acknowledge
//!   with one `REPLCONF GETACK *` for all of them: one round trip per turn,
//!   however many grants it made.
//! - The replica answers a `GETACK` with the offset before it, which covers
//!   every grant before it. The `GETACK` must be the only write of its
//!   execution unit (else it is wrapped in `MULTI`, and the offset the replica
//!   reports stops before the grants), and is never sent while clients are
//!   paused (Redis asserts that nothing is propagated then).
//! - Without a `GETACK` a replica acknowledges once a second (its cron), which
//!   is the fallback if `REPLCONF` cannot be sent.
//!
//! Invariants, kept here and in `crate::waiters`:
//! - no grant is answered before N online replicas acknowledged an offset at
//!   or past the one that carries it;
//! - a grant not acknowledged within `sync-timeout` (or its waiter's own
//!   deadline, whichever ends first) is taken back — the take-back is
//!   replicated like the grant — and answered as busy, never as granted;
//! - while a grant waits, the key holds it: nobody else is granted it.

use std::ffi::{CStr, CString};
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use redis_module::{raw, Context, RedisError};

use crate::config::{SYNC_REPLICAS, SYNC_TIMEOUT};
use crate::error;
use crate::guard;
use crate::keyspace::now_ms;
use crate::stats;
use crate::waiters::{self, held};

/// Whether grants wait for acknowledgements now: under `sync-replicas` N ≥ 1,
/// and after N dropped to 0 until every replica that holds a marker saying
/// "every grant is acknowledged" has the one that says otherwise
/// (`crate::roster::promised`): a grant answered at once before that could
/// be missing on a replica that `grace auto` would promote without a window.
pub fn required() -> bool {
    SYNC_REPLICAS.load(Ordering::Relaxed) > 0 || crate::roster::promised()
}

/// How long a grant waits for its acknowledgements, in ms.
pub fn timeout_ms() -> i64 {
    SYNC_TIMEOUT.load(Ordering::Relaxed)
}

/// A command that may grant or extend, where its client cannot wait for the
/// replicas (inside `MULTI`, a script or a function): refused before it
/// changes anything, since a grant answered there could still be lost.
pub fn check_can_wait(ctx: &Context) -> Result<(), RedisError> {
    if required() && !waiters::can_block(ctx) {
        return Err(RedisError::Str(error::SYNC_CANNOT_WAIT));
    }
    Ok(())
}

/// What one turn reads from `INFO replication`.
#[derive(Debug, Default, PartialEq)]
pub struct Replication {
    /// The offset after every write propagated so far.
    pub offset: i64,
    /// Each online replica's address (`ip:port`, as `INFO` shows it) and
    /// acknowledged offset.
    pub replicas: Vec<(String, i64)>,
}

impl Replication {
    /// The highest offset `n` online replicas acknowledged (None: fewer
    /// than `n` are online).
    pub fn reached_by(&self, n: usize) -> Option<i64> {
        if n == 0 {
            return Some(self.offset);
        }
        let mut acked: Vec<i64> = self.replicas.iter().map(|(_, o)| *o).collect();
        acked.sort_unstable_by(|a, b| b.cmp(a));
        acked.get(n - 1).copied()
    }
}

/// Parses one `slaveN` line of `INFO replication`: `ip=…,port=…,state=…,
/// offset=…,lag=…` (Valkey 9 adds `type=replica|rdb-channel|main-channel`).
/// Only online replicas that stream count, as the server's own `WAIT` counts
/// them; None for the others.
pub fn parse_replica(line: &str) -> Option<(String, i64)> {
    let (mut ip, mut port, mut online, mut offset, mut streams) = ("", "", false, None, true);
    for field in line.split(',') {
        let (name, value) = field.split_once('=')?;
        match name {
            "ip" => ip = value,
            "port" => port = value,
            "state" => online = value == "online",
            "offset" => offset = value.parse::<i64>().ok(),
            "type" => streams = value == "replica",
            _ => {}
        }
    }
    (online && streams).then(|| (format!("{ip}:{port}"), offset.unwrap_or(0)))
}

/// Reads the replication offsets: from `ROLE` on a master (a few thousand
/// instructions), else from `INFO replication` (about 74,000: it formats and
/// files the whole section; a replica, or `ROLE` renamed away). None if
/// neither answers.
pub fn read(ctx: *mut raw::RedisModuleCtx) -> Option<Replication> {
    read_role(ctx).or_else(|| read_info(ctx))
}

/// `ROLE` on a master: `[master, offset, [[ip, port, acknowledged], …]]`,
/// its online replicas only, as the server's own `WAIT` counts them (and as
/// [`parse_replica`] keeps them from `INFO`). None for any other reply.
/// Read through the raw reply API: converting it to `RedisValue`s cost
/// more than the command.
fn read_role(ctx: *mut raw::RedisModuleCtx) -> Option<Replication> {
    let reply = unsafe { raw::RedisModule_Call.unwrap()(ctx, c"ROLE".as_ptr(), c"".as_ptr()) };
    if reply.is_null() {
        return None;
    }
    let view = unsafe { parse_role(reply) };
    unsafe { raw::RedisModule_FreeCallReply.unwrap()(reply) };
    view
}

type Reply = *mut raw::RedisModuleCallReply;

/// The type of an element of a reply (`REDISMODULE_REPLY_UNKNOWN` if absent).
unsafe fn kind(r: Reply) -> isize {
    if r.is_null() {
        return raw::REDISMODULE_REPLY_UNKNOWN;
    }
    unsafe { raw::RedisModule_CallReplyType.unwrap()(r) as isize }
}

unsafe fn len(r: Reply) -> usize {
    unsafe { raw::RedisModule_CallReplyLength.unwrap()(r) }
}

unsafe fn at(r: Reply, i: usize) -> Reply {
    unsafe { raw::RedisModule_CallReplyArrayElement.unwrap()(r, i) }
}

/// A string element's bytes, valid while the reply is held.
unsafe fn text<'a>(r: Reply) -> Option<&'a [u8]> {
    if unsafe { kind(r) } != raw::REDISMODULE_REPLY_STRING {
        return None;
    }
    let mut n = 0;
    let p = unsafe { raw::RedisModule_CallReplyStringPtr.unwrap()(r, &mut n) };
    (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) })
}

/// The reply of `ROLE`, while its caller holds it.
unsafe fn parse_role(reply: *mut raw::RedisModuleCallReply) -> Option<Replication> {
    if kind(reply) != raw::REDISMODULE_REPLY_ARRAY || len(reply) != 3 {
        return None;
    }
    let (role, offset, listed) = (at(reply, 0), at(reply, 1), at(reply, 2));
    if text(role)? != b"master"
        || kind(offset) != raw::REDISMODULE_REPLY_INTEGER
        || kind(listed) != raw::REDISMODULE_REPLY_ARRAY
    {
        return None;
    }
    let count = len(listed);
    let mut view = Replication {
        offset: unsafe { raw::RedisModule_CallReplyInteger.unwrap()(offset) },
        replicas: Vec::with_capacity(count),
    };
    for i in 0..count {
        let replica = at(listed, i);
        if kind(replica) != raw::REDISMODULE_REPLY_ARRAY || len(replica) != 3 {
            return None;
        }
        let (ip, port) = (text(at(replica, 0))?, text(at(replica, 1))?);
        let acked = std::str::from_utf8(text(at(replica, 2))?)
            .ok()?
            .parse::<i64>()
            .ok()?;
        let address = format!(
            "{}:{}",
            String::from_utf8_lossy(ip),
            String::from_utf8_lossy(port)
        );
        view.replicas.push((address, acked));
    }
    Some(view)
}

/// Reads the replication offsets from `INFO replication` (None if the
/// server gives no section).
fn read_info(ctx: *mut raw::RedisModuleCtx) -> Option<Replication> {
    let data = unsafe { raw::RedisModule_GetServerInfo.unwrap()(ctx, c"replication".as_ptr()) };
    if data.is_null() {
        return None;
    }
    let mut err: c_int = 0;
    let offset = unsafe {
        raw::RedisModule_ServerInfoGetFieldSigned.unwrap()(
            data,
            c"master_repl_offset".as_ptr(),
            &mut err,
        )
    };
    let mut view = Replication {
        offset: if err == 0 { offset } else { 0 },
        replicas: Vec::new(),
    };
    // `connected_slaves` may differ from the lines shown: read until one is missing.
    for i in 0.. {
        let Ok(name) = CString::new(format!("slave{i}")) else {
            break;
        };
        let line = unsafe { raw::RedisModule_ServerInfoGetFieldC.unwrap()(data, name.as_ptr()) };
        if line.is_null() {
            break;
        }
        let text = unsafe { CStr::from_ptr(line) }.to_string_lossy();
        if let Some(replica) = parse_replica(&text) {
            view.replicas.push(replica);
        }
    }
    unsafe { raw::RedisModule_FreeServerInfo.unwrap()(ctx, data) };
    Some(view)
}

/// The offset the last `GETACK` asked about, and when it was sent.
static ASKED_OFFSET: AtomicI64 = AtomicI64::new(-1);
static ASKED_AT: AtomicI64 = AtomicI64::new(0);
/// Whether `REPLCONF GETACK` could not be sent (logged once).
static GETACK_REFUSED: AtomicBool = AtomicBool::new(false);

/// Whether a `GETACK` is due: a grant made since the last one, or none
/// answered for a quarter of the timeout (a replica that reconnected missed it).
fn getack_due(newest_target: i64, now: i64) -> bool {
    newest_target > ASKED_OFFSET.load(Ordering::Relaxed)
        || now - ASKED_AT.load(Ordering::Relaxed) >= (timeout_ms() / 4).max(10)
}

/// Asks every replica to acknowledge what it has (`REPLCONF GETACK *`, not
/// written to the AOF). The only write of this callback's execution unit.
fn ask_for_acks(ctx: *mut raw::RedisModuleCtx, offset: i64, now: i64) {
    let sent = unsafe {
        raw::RedisModule_Replicate.unwrap()(
            ctx,
            c"REPLCONF".as_ptr(),
            c"Acc".as_ptr(),
            c"GETACK".as_ptr(),
            c"*".as_ptr(),
        )
    };
    if sent != raw::REDISMODULE_OK as c_int {
        if !GETACK_REFUSED.swap(true, Ordering::Relaxed) {
            Context::new(ctx).log_warning(
                "cannot send REPLCONF GETACK to replicas: grants wait for their \
                 once-a-second acknowledgements",
            );
        }
        return;
    }
    stats::SYNC_GETACKS.add(1);
    ASKED_OFFSET.store(offset, Ordering::Relaxed);
    ASKED_AT.store(now, Ordering::Relaxed);
}

/// One pass per event-loop turn while grants wait: targets, answers, one `GETACK`.
fn before_sleep(ctx: *mut raw::RedisModuleCtx) {
    if held::count() == 0 {
        return;
    }
    let Some(view) = read(ctx) else {
        return;
    };
    held::assign_targets(view.offset);
    // 0 while a promise is withdrawn (`required`): answered once the
    // marker withdrawing it is acknowledged (the floor), by nobody else.
    let needed = SYNC_REPLICAS.load(Ordering::Relaxed).max(0) as usize;
    // Under the roster's marker only (`crate::roster`): what a promoted
    // replica reads to know it lost nothing.
    let floor = crate::roster::floor(ctx, &view);
    if let Some(floor) = floor {
        let reached = view.reached_by(needed).filter(|r| *r >= floor);
        held::answer_acknowledged(ctx, reached);
    }
    let Some(newest) = held::newest_target() else {
        return;
    };
    // What the replicas must acknowledge: the grants, and the marker they wait on.
    let wanted = newest.max(floor.unwrap_or(view.offset));
    let now = now_ms();
    let paused = unsafe { raw::RedisModule_AvoidReplicaTraffic.unwrap()() } != 0;
    if !paused && !view.replicas.is_empty() && getack_due(wanted, now) {
        ask_for_acks(ctx, view.offset, now);
    }
}

extern "C" fn on_event_loop(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    if subevent != raw::REDISMODULE_SUBEVENT_EVENTLOOP_BEFORE_SLEEP {
        return;
    }
    guard::callback((), || before_sleep(ctx));
}

static SUBSCRIBED: AtomicBool = AtomicBool::new(false);

/// Hears every event-loop turn from the first grant that waits for replicas
/// (a server that never sets `sync-replicas` never subscribes). The only
/// subscriber of this event in warden.
pub fn watch() {
    if SUBSCRIBED.swap(true, Ordering::Relaxed) {
        return;
    }
    let event = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_EVENTLOOP,
        dataver: 1,
    };
    unsafe {
        raw::RedisModule_SubscribeToServerEvent.unwrap()(
            crate::events::detached(),
            event,
            Some(on_event_loop),
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_online_streaming_replicas_count() {
        let cases = [
            (
                "ip=127.0.0.1,port=6380,state=online,offset=4242,lag=0",
                Some(("127.0.0.1:6380", 4242)),
            ),
            (
                "ip=10.0.0.2,port=6379,state=online,offset=7,lag=1,type=replica",
                Some(("10.0.0.2:6379", 7)),
            ),
            (
                "ip=10.0.0.2,port=6379,state=online,offset=0,lag=0,type=rdb-channel",
                None,
            ),
            (
                "ip=127.0.0.1,port=6381,state=wait_bgsave,offset=0,lag=0",
                None,
            ),
            ("ip=127.0.0.1,port=6381,state=send_bulk", None),
            ("garbage", None),
        ];
        for (line, expected) in cases {
            let got = parse_replica(line);
            let expected = expected.map(|(a, o)| (a.to_string(), o));
            assert_eq!(got, expected, "{line}");
        }
    }

    #[test]
    fn the_offset_n_replicas_reached_is_the_nth_highest_ack() {
        let view = Replication {
            offset: 100,
            replicas: vec![("a:1".into(), 40), ("b:1".into(), 90), ("c:1".into(), 70)],
        };
        assert_eq!(view.reached_by(0), Some(100));
        assert_eq!(view.reached_by(1), Some(90));
        assert_eq!(view.reached_by(2), Some(70));
        assert_eq!(view.reached_by(3), Some(40));
        assert_eq!(view.reached_by(4), None);
    }
}
