//! `CACHE.*`: fill leases beside plain string values. The values are ordinary
//! Redis strings (written with `SET`, deleted with `DEL`, through
//! `RedisModule_Call` so that replication, the AOF, `WATCH`, client tracking
//! and keyspace events see exactly those commands); the lease table lives in
//! module memory, per database and key, and is neither saved nor replicated.
//!
//! Invariants:
//! - at most one outstanding lease per key, so at most one load per key in
//!   flight: a lease is granted only when none is live, and every way a lease
//!   ends (fill, abandon, lapse, revocation by another write, its holder's
//!   disconnect, flush, role change) removes it before anyone else is served;
//! - a fill is stored only under the key's current lease;
//! - an entry exists only while a lease or a stale window does: memory goes
//!   back to its baseline when they end.

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::raw::{c_int, c_void};

use redis_module::{
    raw, CallOptionsBuilder, CallResult, Context, RedisError, RedisResult, RedisValue,
};

use crate::args;
use crate::cache::state::{self, Entry, Lease, Options, Read, Seen};
use crate::command::Arg;
use crate::error;
use crate::fence::FENCES;
use crate::guard;
// A replica has no lease table: every `CACHE.*` command is the master's.
use crate::keyspace::{notify, now_ms, refuse_on_replica, Key};
use crate::reply::{self, Field};
use crate::stats;
use crate::waiters::{self, Answer, Kind, Mode, QueueKey, Served, Waiter};

thread_local! {
    static TABLE: RefCell<HashMap<QueueKey, Entry>> = RefCell::new(HashMap::new());
    /// Keys whose lease each client holds (to end them when it disconnects).
    static HOLDERS: RefCell<HashMap<u64, Vec<QueueKey>>> = RefCell::new(HashMap::new());
}

fn err(text: &'static str) -> RedisError {
    RedisError::Str(text)
}

fn shrink<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() * 4 < map.capacity() {
        map.shrink_to_fit();
    }
}

/// The entry of `q`, a copy (no borrow is held while Redis is called).
fn entry(q: &QueueKey) -> Entry {
    TABLE.with(|t| t.borrow().get(q).cloned().unwrap_or_default())
}

/// Stores `e` for `q`, or forgets `q` when nothing is left to remember.
fn put(q: &QueueKey, e: Entry) {
    TABLE.with(|t| {
        let mut t = t.borrow_mut();
        if e.is_empty() {
            t.remove(q);
            shrink(&mut t);
        } else {
            t.insert(q.clone(), e);
        }
    });
}

/// Entries in the lease table (`INFO warden`).
pub fn entries() -> usize {
    TABLE.with(|t| t.borrow().len())
}

fn client_id(ctx: &Context) -> u64 {
    unsafe { raw::RedisModule_GetClientId.unwrap()(ctx.ctx) }
}

/// Grants a new lease on `q` to client `holder` for `lease_ms`; its token.
fn grant(ctx: &Context, q: &QueueKey, holder: u64, lease_ms: i64) -> u64 {
    let now = now_ms();
    let token = FENCES.draw(now);
    let deadline_ms = now.saturating_add(lease_ms);
    let data = Box::into_raw(Box::new((q.clone(), token))).cast::<c_void>();
    let delay = (deadline_ms + 1 - now).max(0);
    let timer =
        unsafe { raw::RedisModule_CreateTimer.unwrap()(ctx.ctx, delay, Some(on_lease_end), data) };
    let mut e = entry(q);
    e.lease = Some(Lease {
        token,
        deadline_ms,
        holder,
        timer,
    });
    put(q, e);
    HOLDERS.with(|h| h.borrow_mut().entry(holder).or_default().push(q.clone()));
    stats::CACHE_LEASES.add(1);
    token
}

/// Ends the lease of `q` if it is `token` (any token if `None`); whether one
/// ended. Its timer goes with it.
fn end_lease(ctx: *mut raw::RedisModuleCtx, q: &QueueKey, token: Option<u64>) -> bool {
    let Some(lease) = take_lease(q, token) else {
        return false;
    };
    let mut data: *mut c_void = std::ptr::null_mut();
    if unsafe { raw::RedisModule_StopTimer.unwrap()(ctx, lease.timer, &mut data) }
        == raw::REDISMODULE_OK as c_int
        && !data.is_null()
    {
        drop(unsafe { Box::from_raw(data.cast::<(QueueKey, u64)>()) });
    }
    true
}

/// Removes the lease of `q` (if it is `token`) from the table and its holder's list.
fn take_lease(q: &QueueKey, token: Option<u64>) -> Option<Lease> {
    let mut e = entry(q);
    let lease = e.lease.take_if(|l| token.is_none_or(|t| l.token == t))?;
    put(q, e);
    HOLDERS.with(|h| {
        let mut h = h.borrow_mut();
        if let Some(keys) = h.get_mut(&lease.holder) {
            if let Some(at) = keys.iter().position(|k| k == q) {
                keys.swap_remove(at);
            }
            if keys.is_empty() {
                h.remove(&lease.holder);
                shrink(&mut h);
            }
        }
    });
    Some(lease)
}

/// A lease ended unfilled: the oldest waiter, if any, gets a new one.
fn lease_ended(ctx: *mut raw::RedisModuleCtx, q: QueueKey) {
    waiters::mark_dirty(ctx, q);
}

extern "C" fn on_lease_end(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard::callback((), || {
        let (q, token) = *unsafe { Box::from_raw(data.cast::<(QueueKey, u64)>()) };
        // Not `end_lease`: Redis frees this timer itself once it returns.
        if take_lease(&q, Some(token)).is_some() {
            lease_ended(ctx, q);
        }
    })
}

/// From the keyspace events: any other write to `name` (set, del, expiry,
/// eviction, rename, move, restore...) revokes its lease and its stale mark.
pub fn on_key_event(ctx: *mut raw::RedisModuleCtx, name: &[u8]) {
    if TABLE.with(|t| t.borrow().is_empty()) {
        return;
    }
    let q = waiters::queue_key(ctx, name);
    let mut e = entry(&q);
    if e.is_empty() {
        return;
    }
    e.stale_until = None;
    put(&q, e);
    if end_lease(ctx, &q, None) {
        stats::CACHE_REVOKED.add(1);
    }
    lease_ended(ctx, q);
}

/// A flush of `db` (-1: all), a `SWAPDB` or a role change: every lease of
/// those databases ends (their values are gone or moved).
pub fn forget_db(ctx: *mut raw::RedisModuleCtx, db: c_int) {
    let keys: Vec<QueueKey> = TABLE.with(|t| {
        t.borrow()
            .keys()
            .filter(|q| db == -1 || q.db == db)
            .cloned()
            .collect()
    });
    for q in keys {
        end_lease(ctx, &q, None);
        put(&q, Entry::default());
        lease_ended(ctx, q);
    }
}

/// A client disconnected: its leases end and pass to the oldest waiters.
fn holder_left(ctx: *mut raw::RedisModuleCtx, client: u64) {
    let keys = HOLDERS.with(|h| h.borrow().get(&client).cloned().unwrap_or_default());
    for q in keys {
        if entry(&q).lease.is_some_and(|l| l.holder == client) && end_lease(ctx, &q, None) {
            lease_ended(ctx, q);
        }
    }
}

extern "C" fn on_client_change(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    guard::callback((), || {
        if subevent != raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED
            || HOLDERS.with(|h| h.borrow().is_empty())
        {
            return;
        }
        let info = data.cast::<raw::RedisModuleClientInfo>();
        if let Some(info) = unsafe { info.as_ref() } {
            holder_left(ctx, info.id);
        }
    })
}

/// Called on a change of role by `waiters`, which owns that event (Redis
/// keeps one callback per module and event).
pub extern "C" fn on_role_change(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    guard::callback((), || {
        // Leases are not replicated: a promoted replica must not hand out a
        // token its old master drew in this same millisecond.
        FENCES.skip_past(now_ms());
        forget_db(ctx, -1)
    })
}

/// Ends leases with their holders' connections (and, see `on_role_change`, with a change of role).
pub fn subscribe(ctx: &Context) -> bool {
    let events: [(u64, raw::RedisModuleEventCallback); 1] =
        [(raw::REDISMODULE_EVENT_CLIENT_CHANGE, Some(on_client_change))];
    events.iter().all(|&(id, callback)| {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        let status =
            unsafe { raw::RedisModule_SubscribeToServerEvent.unwrap()(ctx.ctx, event, callback) };
        status == raw::REDISMODULE_OK as c_int
    })
}

/// A cached value (copied) and its remaining ttl (`None`: no expiry).
type Cached = (Vec<u8>, Option<i64>);

/// The key's cached value; `Err` if it holds another type.
fn read_value(ctx: &Context, name: &Arg) -> Result<Option<Cached>, RedisError> {
    let key = Key::read(ctx, name);
    let Some(value) = key.string().map_err(err)? else {
        return Ok(None);
    };
    let ttl_left = key.expire_at().map(|at| (at - now_ms()).max(0));
    Ok(Some((value.to_vec(), ttl_left)))
}

/// The cache fill as a kind of waiter: a value answers every waiter at once;
/// a key with no value and no live lease gives the oldest waiter a lease.
pub struct CacheKind;
pub static KIND: CacheKind = CacheKind;

impl Kind for CacheKind {
    fn serve(&self, ctx: &Context, name: &Arg) -> Served {
        let Ok(value) = read_value(ctx, name) else {
            return Served::WrongType;
        };
        let q = waiters::queue_key(ctx.ctx, name);
        let now = now_ms();
        let e = entry(&q);
        if let Some((value, _)) = value {
            let stale = e.is_stale(now);
            let woken = waiters::drain(ctx, name, &KIND, |w| !stale || w.mode == Mode::Fill);
            if !woken.is_empty() {
                stats::CACHE_WOKEN.add(woken.len() as u64);
                for w in woken {
                    waiters::answer(ctx, w, Answer::Pair(Some(value.clone()), None));
                }
                return Served::Progress;
            }
        }
        if e.live_lease(now).is_some() {
            return Served::Wait(None);
        }
        let Some(w) = waiters::pop_head(ctx, name, &KIND, |_| true) else {
            return Served::Wait(None);
        };
        let token = grant(ctx, &q, w.client_id(), w.ttl_ms);
        waiters::answer(ctx, w, Answer::Pair(None, Some(token as i64)));
        Served::Progress
    }

    fn timed_out(&self) -> Answer {
        stats::CACHE_WAIT_TIMEOUTS.add(1);
        Answer::Pair(None, None)
    }
}

fn pair(value: Option<Vec<u8>>, lease: Option<u64>) -> RedisValue {
    RedisValue::Array(vec![
        value.map_or(RedisValue::Null, RedisValue::StringBuffer),
        lease.map_or(RedisValue::Null, |t| RedisValue::Integer(t as i64)),
    ])
}

/// `CACHE.GET key lease_ms [WAIT timeout] [REFRESH ms] [FRESH]`
pub fn get(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() < 3 {
        return Err(RedisError::WrongArity);
    }
    let req = args::cache_get(&args[2..]).map_err(RedisError::String)?;
    refuse_on_replica(ctx)?;
    let name = &args[1];
    let mut value = read_value(ctx, name)?;
    let q = waiters::queue_key(ctx.ctx, name);
    if waiters::queued(ctx, name) > 0 && entry(&q).live_lease(now_ms()).is_none() {
        // Waiters first: a lease that just ended goes to the oldest of them.
        waiters::serve(ctx, name);
        value = read_value(ctx, name)?;
    }
    let now = now_ms();
    let e = entry(&q);
    let seen = match &value {
        None => Seen::Missing,
        Some((_, ttl_left)) => Seen::Value {
            ttl_left: *ttl_left,
            stale: e.is_stale(now),
        },
    };
    let opts = Options {
        refresh_ms: req.refresh_ms,
        fresh: req.fresh,
    };
    let outstanding = e.live_lease(now).is_some() || waiters::queued(ctx, name) > 0;
    let value = value.map(|(v, _)| v);
    match state::read(seen, outstanding, opts) {
        Read::Hit { stale } => {
            stats::CACHE_HITS.add(1);
            if stale {
                stats::CACHE_STALE_SERVED.add(1);
            }
            Ok(pair(value, None))
        }
        Read::HitAndLease { stale } => {
            stats::CACHE_HITS.add(1);
            if stale {
                stats::CACHE_STALE_SERVED.add(1);
            } else {
                stats::CACHE_REFRESHES.add(1);
            }
            let token = grant(ctx, &q, client_id(ctx), req.lease_ms);
            Ok(pair(value, Some(token)))
        }
        Read::MissAndLease => {
            stats::CACHE_MISSES.add(1);
            let token = grant(ctx, &q, client_id(ctx), req.lease_ms);
            Ok(pair(None, Some(token)))
        }
        Read::MissBusy => {
            stats::CACHE_MISSES.add(1);
            match req.wait_ms {
                Some(timeout_ms) if waiters::can_block(ctx) => {
                    let mode = if req.fresh {
                        Mode::FillFresh
                    } else {
                        Mode::Fill
                    };
                    let waiter = Waiter::new(&KIND, b"", req.lease_ms, mode);
                    waiters::block(ctx, name, waiter, timeout_ms);
                    Ok(RedisValue::NoReply)
                }
                _ => Ok(pair(None, None)),
            }
        }
    }
}

/// Runs a command through Redis, replicated as it is.
fn call_replicated(ctx: &Context, command: &str, words: &[&[u8]]) -> Result<(), RedisError> {
    let options = CallOptionsBuilder::new()
        .replicate()
        .errors_as_replies()
        .build();
    let result: CallResult = ctx.call_ext(command, &options, words);
    result.map(|_| ()).map_err(|e| {
        RedisError::String(e.to_utf8_string().unwrap_or_else(|| error::INTERNAL.into()))
    })
}

/// `CACHE.FILL key lease value [PX ms [JITTER ms]]`
pub fn fill(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() < 4 {
        return Err(RedisError::WrongArity);
    }
    let req = args::cache_fill(&args[2..]).map_err(RedisError::String)?;
    refuse_on_replica(ctx)?;
    let name = &args[1];
    let q = waiters::queue_key(ctx.ctx, name);
    let now = now_ms();
    let current = entry(&q)
        .live_lease(now)
        .is_some_and(|l| l.token == req.lease);
    if !current {
        stats::CACHE_FILLS_REFUSED.add(1);
        return Ok(RedisValue::Integer(0));
    }
    if Key::read(ctx, name).string().is_err() {
        // Something else took the key meanwhile: it is not a cache value.
        end_lease(ctx.ctx, &q, None);
        lease_ended(ctx.ctx, q);
        return Err(err(error::WRONGTYPE));
    }
    end_lease(ctx.ctx, &q, None);
    // The entry's stale mark goes with the old value.
    put(&q, Entry::default());
    match req.px_ms {
        Some(px) => {
            let at = now
                .saturating_add(px)
                .saturating_add(state::jitter_from(random_u64(), req.jitter_ms));
            let at = at.to_string();
            call_replicated(ctx, "SET", &[name, req.value, b"PXAT", at.as_bytes()])?;
        }
        None => call_replicated(ctx, "SET", &[name, req.value])?,
    }
    stats::CACHE_FILLS.add(1);
    notify(ctx, c"cache.fill", name);
    // Every waiter is answered with the value, in this same turn.
    waiters::serve(ctx, name);
    Ok(RedisValue::Integer(1))
}

fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    unsafe {
        raw::RedisModule_GetRandomBytes.unwrap()(bytes.as_mut_ptr(), bytes.len());
    }
    u64::from_le_bytes(bytes)
}

/// `CACHE.ABANDON key lease`
pub fn abandon(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let token = args::lease(&args[2]).map_err(err)?;
    refuse_on_replica(ctx)?;
    let q = waiters::queue_key(ctx.ctx, &args[1]);
    let live = entry(&q)
        .live_lease(now_ms())
        .is_some_and(|l| l.token == token);
    if !live || !end_lease(ctx.ctx, &q, Some(token)) {
        return Ok(RedisValue::Integer(0));
    }
    if waiters::queued(ctx, &args[1]) > 0 {
        waiters::serve(ctx, &args[1]);
    }
    Ok(RedisValue::Integer(1))
}

/// `CACHE.INVALIDATE key [STALE ms]`
pub fn invalidate(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() < 2 {
        return Err(RedisError::WrongArity);
    }
    let stale_ms = args::stale_option(&args[2..]).map_err(RedisError::String)?;
    refuse_on_replica(ctx)?;
    let name = &args[1];
    // One look at the key, before anything changes (another type: WRONGTYPE).
    let key = Key::read(ctx, name);
    let exists = !key.is_empty();
    let is_string = key.string().map_err(err)?.is_some();
    let expires = key.expire_at();
    drop(key);
    let q = waiters::queue_key(ctx.ctx, name);
    // The lease goes, even for a key that does not exist: a reader that
    // loaded before this can never write its value back.
    if end_lease(ctx.ctx, &q, None) {
        stats::CACHE_REVOKED.add(1);
    }
    put(&q, Entry::default());
    let changed = match (stale_ms, is_string) {
        (Some(ms), true) => {
            let now = now_ms();
            let until = now.saturating_add(ms);
            if expires.is_none_or(|at| at > until) {
                let at = until.to_string();
                call_replicated(ctx, "PEXPIREAT", &[name, at.as_bytes()])?;
            }
            let end = expires.map_or(until, |at| at.min(until));
            put(
                &q,
                Entry {
                    lease: None,
                    stale_until: Some(end),
                },
            );
            true
        }
        _ if exists => {
            call_replicated(ctx, "DEL", &[name])?;
            true
        }
        _ => false,
    };
    notify(ctx, c"cache.invalidate", name);
    if waiters::queued(ctx, name) > 0 {
        waiters::serve(ctx, name);
    }
    Ok(RedisValue::Integer(i64::from(changed)))
}

/// `CACHE.INFO key`
pub fn info(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    refuse_on_replica(ctx)?;
    let name = &args[1];
    let key = Key::read(ctx, name);
    let present = key.string().map_err(err)?.is_some();
    let now = now_ms();
    let ttl = match (present, key.expire_at()) {
        (false, _) => -2,
        (true, None) => -1,
        (true, Some(at)) => (at - now).max(0),
    };
    drop(key);
    let e = entry(&waiters::queue_key(ctx.ctx, name));
    let value = match (present, e.is_stale(now)) {
        (false, _) => "miss",
        (true, true) => "stale",
        (true, false) => "hit",
    };
    let lease = e.live_lease(now);
    reply::map(
        ctx,
        &[
            ("value", Field::Bytes(value.as_bytes())),
            ("ttl", Field::Int(ttl)),
            (
                "lease",
                lease.map_or(Field::Null, |l| Field::Int(l.token as i64)),
            ),
            (
                "lease_ttl",
                lease.map_or(Field::Int(-2), |l| Field::Int((l.deadline_ms - now).max(0))),
            ),
            ("waiters", Field::Int(waiters::queued(ctx, name) as i64)),
        ],
    )
}
