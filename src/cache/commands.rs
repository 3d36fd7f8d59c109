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
//!   disconnect, flush, role change) makes it not live before anyone else is
//!   served; the table's records of lapsed leases and of departed holders are
//!   removed by one timer, a bounded batch per event-loop turn;
//! - an expiry is not a write: it drops the stale mark, never the lease;
//! - other writes to a key with an entry (also those that find nothing to
//!   change, like `DEL` of a missing key) revoke through the command filter
//!   (`filter.rs`), registered only while the table has entries, and only
//!   for commands the server did not refuse; evictions through `evicted`;
//! - no lease is granted inside a script or function (its client outlives
//!   every caller, so the lease could not end with the caller's connection);
//! - a fill is stored only under the key's current lease;
//! - an entry exists only while a lease or a stale window does: memory goes
//!   back to its baseline when they end.

use std::cell::{Cell, RefCell};
use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::{
    raw, CallOptionsBuilder, CallResult, Context, ContextFlags, RedisError, RedisResult, RedisValue,
};

use crate::args;
use crate::cache::filter;
use crate::cache::state::{self, Entry, Lease, Options, Read, Seen};
use crate::cache::table::{self, Table};
use crate::command::Arg;
use crate::error;
use crate::events::{self, Listener, Server};
use crate::fence::FENCES;
use crate::guard;
use crate::memory;
// A replica has no lease table: every `CACHE.*` command is the master's.
use crate::keyspace::{self, notify, now_ms, refuse_on_replica, signal_modified, Key};
use crate::reply::{self, Field};
use crate::stats;
use crate::waiters::{self, Answer, Kind, Mode, QueueKey, Served, Waiter};

/// Most lease ends (or freed records of a flushed table) per callback: a
/// burst of lapses, a holder with many leases leaving or a flush is spread
/// over as many event-loop turns as it needs, each a fraction of a millisecond.
const BATCH: usize = 256;

thread_local! {
    static TABLE: RefCell<Table> = RefCell::new(Table::default());
    /// The one timer that ends leases (lapses, departed holders, flushed
    /// tables, revocations by the command filter): its id and when it fires.
    static REAPER: Cell<Option<(raw::RedisModuleTimerID, i64)>> = const { Cell::new(None) };
    /// The largest batch so far, in steps and in microseconds (`INFO warden`:
    /// `cache_max_batch`, `cache_max_batch_us`).
    static MAX_BATCH: Cell<(usize, u64)> = const { Cell::new((0, 0)) };
}

fn err(text: &'static str) -> RedisError {
    RedisError::Str(text)
}

/// The lengths of the names with entries (`Table::len_mask`), as of the
/// last change: a static, so that a hit's "no entry?" costs no thread-local
/// access (a call, in a shared library).
static LEN_MASK: AtomicU64 = AtomicU64::new(0);

fn with<T>(f: impl FnOnce(&mut Table) -> T) -> T {
    TABLE.with(|t| {
        let mut t = t.borrow_mut();
        let out = f(&mut t);
        LEN_MASK.store(t.len_mask(), Ordering::Relaxed);
        filter::set_screen(t.len_mask(), t.screen_changes());
        out
    })
}

/// Starts hearing writes and disconnects at the table's first entry (they
/// stop from the reaper once it is empty again).
fn listen() {
    if !filter::listening() {
        filter::listen(true);
        events::hear_clients(true);
    }
}

/// Whether `name` has an entry in some database (the command filter's test).
/// A read: the filter's masks stay as they are.
pub fn names(name: &[u8]) -> bool {
    LEN_MASK.load(Ordering::Relaxed) & table::len_bit(name.len()) != 0
        && TABLE.with(|t| t.borrow().names(name))
}

/// The entry of `q`, a copy (no borrow is held while Redis is called).
fn entry(q: &QueueKey) -> Entry {
    with(|t| t.entry(q))
}

/// The live lease of `q` at `now` (not lapsed, its holder connected).
fn live_lease(q: &QueueKey, now: i64) -> Option<Lease> {
    with(|t| {
        let e = t.entry(q);
        t.live(&e, now).copied()
    })
}

/// Entries in the lease table (`INFO warden`).
pub fn entries() -> usize {
    with(|t| t.len())
}

/// Leases that ended without a fill: every lease granted ends filled (one
/// stored fill each), ends otherwise (lapsed, abandoned, revoked, its holder
/// gone, its table flushed), or is still in the table.
pub fn leases_unfilled() -> u64 {
    let live = with(|t| t.leases()) as u64;
    stats::CACHE_LEASES
        .get()
        .saturating_sub(stats::CACHE_FILLS.get())
        .saturating_sub(live)
}

/// The most steps one callback has taken to end leases, and the longest such
/// callback in microseconds (`INFO warden`).
pub fn max_batch() -> (usize, u64) {
    MAX_BATCH.with(Cell::get)
}

/// Whether no lease, stale mark or pending work exists: the command filter's
/// fast way out.
pub fn idle() -> bool {
    with(|t| t.is_empty())
}

fn client_id(ctx: &Context) -> u64 {
    unsafe { raw::RedisModule_GetClientId.unwrap()(ctx.ctx) }
}

/// Inside a script or function the client is the script engine's own, which
/// outlives every caller: a lease granted there could not end with its
/// caller's connection, so none is granted.
fn in_script(ctx: &Context) -> bool {
    ctx.get_flags().contains(ContextFlags::LUA)
}

/// Grants a new lease on `q` to `holder` for `lease_ms`; its token.
fn grant(ctx: &Context, q: &QueueKey, holder: Option<u64>, lease_ms: i64) -> u64 {
    let now = now_ms();
    let token = FENCES.draw(now);
    let deadline_ms = now.saturating_add(lease_ms);
    with(|t| {
        t.grant(
            q,
            Lease {
                token,
                deadline_ms,
                holder,
            },
        )
    });
    listen();
    filter::granted(&q.name);
    arm_reaper(ctx.ctx, deadline_ms.saturating_add(1));
    stats::CACHE_LEASES.add(1);
    token
}

/// Ends the lease of `q` if it is `token` (any token if `None`); whether one ended.
fn end_lease(q: &QueueKey, token: Option<u64>) -> bool {
    with(|t| t.take(q, token)).is_some()
}

/// A lease of `q` ended unfilled: if anyone waits, the oldest gets a new one.
/// `ctx` has `q`'s database selected.
fn lease_ended(ctx: &Context, q: QueueKey) {
    if waiters::queued(ctx, &q.name, &KIND) > 0 {
        waiters::mark_dirty(ctx.ctx, q);
    }
}

/// Makes sure the reaper runs at `at_ms` or earlier.
fn arm_reaper(ctx: *mut raw::RedisModuleCtx, at_ms: i64) {
    if ctx.is_null() {
        return;
    }
    if let Some((id, fire_at)) = REAPER.with(Cell::get) {
        if fire_at <= at_ms {
            return;
        }
        unsafe { raw::RedisModule_StopTimer.unwrap()(ctx, id, std::ptr::null_mut()) };
    }
    let delay = (at_ms - now_ms()).max(0);
    let id = unsafe {
        raw::RedisModule_CreateTimer.unwrap()(ctx, delay, Some(on_reap), std::ptr::null_mut())
    };
    REAPER.with(|r| r.set(Some((id, at_ms))));
}

/// Arms the reaper from a place without a context (the command filter).
pub fn reap_soon() {
    arm_reaper(events::detached(), now_ms());
}

/// How long revoked entries may wait to be tidied when no client waits to
/// be served: one timer for all the revocations meanwhile.
pub const REAP_LATER_MS: i64 = 50;

/// Arms the reaper for revoked entries nobody waits on.
pub fn reap_later() {
    arm_reaper(events::detached(), now_ms() + REAP_LATER_MS);
}

extern "C" fn on_reap(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard::callback((), || {
        REAPER.with(|r| r.set(None));
        filter::decide();
        let started = std::time::Instant::now();
        let ctx = Context::new(ctx);
        let now = now_ms();
        let batch = with(|t| t.batch(now, BATCH));
        for q in batch.ended {
            unsafe { raw::RedisModule_SelectDb.unwrap()(ctx.ctx, q.db) };
            lease_ended(&ctx, q);
        }
        let us = started.elapsed().as_micros() as u64;
        MAX_BATCH.with(|m| {
            let (steps, longest) = m.get();
            m.set((steps.max(batch.steps), longest.max(us)));
        });
        if batch.more {
            // The rest in the next turns: other clients are served in between.
            arm_reaper(ctx.ctx, now);
        } else if let Some(at) = with(|t| t.next_deadline()) {
            arm_reaper(ctx.ctx, at.saturating_add(1));
        } else if idle() && filter::listening() {
            // Nothing to hear any more: other commands go back to costing nothing.
            filter::listen(false);
            events::hear_clients(false);
        }
    })
}

/// From the `evicted` keyspace event: an evicted value ends its lease and
/// its stale mark. (An expiry is not a write and is not heard: a stale mark
/// ends by itself, and a refresh lease stays the key's one lease.)
fn on_key_event(ctx: *mut raw::RedisModuleCtx, name: &[u8], event: &CStr) {
    if idle() || event != c"evicted" {
        return;
    }
    let q = waiters::queue_key(ctx, name);
    let (lease, had) = with(|t| t.clear(&q));
    if lease.is_some() {
        stats::CACHE_REVOKED.add(1);
    }
    if had {
        lease_ended(&Context::new(ctx), q);
    }
}

/// Revokes the leases of `name` in every database, from the command filter
/// (no context: waiters are served by the reaper).
pub fn revoke_everywhere(name: &[u8]) {
    let revoked = with(|t| t.revoke_everywhere(name));
    stats::CACHE_REVOKED.add(revoked as u64);
}

/// Revokes every lease, from the command filter: a write ran whose keys
/// warden could not see (waiters are served by the reaper).
pub fn revoke_all() {
    let revoked = with(|t| t.revoke_all());
    stats::CACHE_REVOKED.add(revoked as u64);
}

/// A flush of `db` (-1: all), a `SWAPDB` or a role change: every lease of
/// those databases ends at once (their values are gone or moved); the memory
/// is freed in batches. The waiting core serves the keys with waiters.
pub fn forget_db(ctx: *mut raw::RedisModuleCtx, db: c_int) {
    with(|t| t.forget_db(db));
    arm_reaper(ctx, now_ms());
}

fn on_server(ctx: *mut raw::RedisModuleCtx, event: &Server) {
    match event {
        Server::ClientGone { id } => {
            filter::client_gone(*id);
            // Its leases stop being live now and end in batches.
            if !idle() && with(|t| t.depart(*id)) {
                arm_reaper(ctx, now_ms());
            }
        }
        Server::Role { .. } => {
            // Leases are not replicated: a promoted replica must not hand out a
            // token its old master drew in this same millisecond.
            FENCES.skip_past(now_ms());
            forget_db(ctx, -1);
        }
        Server::Flushed { db } => forget_db(ctx, *db),
        Server::Swapped { .. } => forget_db(ctx, -1),
        // Leases are not migrated: a fill with one is refused by the new
        // owner, and must be here too should the slots come back.
        Server::SlotsMoved { slots } => {
            if !idle() {
                let revoked = with(|t| t.revoke_where(|name| slots.has_key(name)));
                stats::CACHE_REVOKED.add(revoked as u64);
                arm_reaper(ctx, now_ms());
            }
        }
        Server::Loaded | Server::LoadingAof | Server::LoadingSync => {}
    }
}

/// Leases end with any other write to their key, with their holders'
/// connections, with flushes and `SWAPDB`, and with a change of role.
pub static EVENTS: Listener = Listener {
    key: on_key_event,
    server: on_server,
};

/// The key's cached value, copied for the waiters it answers; `Err` if it
/// holds another type.
fn read_value(ctx: &Context, name: &Arg) -> Result<Option<std::rc::Rc<[u8]>>, RedisError> {
    let key = Key::read(ctx, name);
    Ok(key.string().map_err(err)?.map(std::rc::Rc::from))
}

/// The cache fill as a kind of waiter: a value answers every waiter at once;
/// a key with no value and no live lease gives the oldest waiter a lease.
pub struct CacheKind;
pub static KIND: CacheKind = CacheKind;

impl Kind for CacheKind {
    fn index(&self) -> usize {
        2
    }

    fn name(&self) -> &'static str {
        "cache"
    }

    fn serve(&self, ctx: &Context, name: &Arg) -> Served {
        let Ok(value) = read_value(ctx, name) else {
            return Served::WrongType;
        };
        let q = waiters::queue_key(ctx.ctx, name);
        let now = now_ms();
        if let Some(value) = value {
            let stale = entry(&q).is_stale(now);
            let woken = waiters::drain(ctx, name, &KIND, |w| !stale || w.mode == Mode::Fill);
            if !woken.is_empty() {
                stats::CACHE_WOKEN.add(woken.len() as u64);
                for w in woken {
                    waiters::answer(ctx, w, Answer::Pair(Some(value.clone()), None));
                }
                return Served::Progress;
            }
        }
        if live_lease(&q, now).is_some() {
            return Served::Wait(None);
        }
        let Some(w) = waiters::pop_head(ctx, name, &KIND, |_| true) else {
            return Served::Wait(None);
        };
        let token = grant(ctx, &q, Some(w.client_id()), w.ttl_ms);
        waiters::answer(ctx, w, Answer::Pair(None, Some(token as i64)));
        Served::Progress
    }

    fn timed_out(&self) -> Answer {
        stats::CACHE_WAIT_TIMEOUTS.add(1);
        Answer::Pair(None, None)
    }

    /// A lease handed to a waiter that left before the answer reached it ends.
    fn revoke(&self, ctx: &Context, name: &Arg, token: i64) {
        let q = waiters::queue_key(ctx.ctx, name);
        if end_lease(&q, Some(token as u64)) {
            lease_ended(ctx, q);
        }
    }
}

/// Whether the key holds a cached value, and its remaining ttl (`None`: no
/// expiry) — without copying the value; `Err` if it holds another type.
fn peek_value(ctx: &Context, name: &Arg) -> Result<Option<Option<i64>>, RedisError> {
    let key = Key::read(ctx, name);
    if key.string().map_err(err)?.is_none() {
        return Ok(None);
    }
    Ok(Some(key.expire_at().map(|at| (at - now_ms()).max(0))))
}

/// Replies `[value, lease]` straight from the stored string: a hit costs the
/// module no copy of the value, whatever its size.
fn reply_stored(ctx: &Context, name: &Arg, lease: Option<u64>) -> RedisResult {
    let key = Key::read(ctx, name);
    let value = key.string().map_err(err)?;
    raw::reply_with_array(ctx.ctx, 2);
    match value {
        Some(v) => raw::reply_with_string_buffer(ctx.ctx, v.as_ptr().cast(), v.len()),
        None => raw::reply_with_null(ctx.ctx),
    };
    match lease {
        Some(t) => raw::reply_with_long_long(ctx.ctx, t as i64),
        None => raw::reply_with_null(ctx.ctx),
    };
    Ok(RedisValue::NoReply)
}

fn pair(value: Option<Vec<u8>>, lease: Option<u64>) -> RedisValue {
    RedisValue::Array(vec![
        value.map_or(RedisValue::Null, RedisValue::StringBuffer),
        lease.map_or(RedisValue::Null, |t| RedisValue::Integer(t as i64)),
    ])
}

/// What `CACHE.GET`'s entry found before the command wrapper runs.
enum Plain {
    /// A hit, answered.
    Answered,
    /// The key holds another type.
    WrongType,
    /// No value (the key was looked up once already).
    Missing,
    /// Not the plain form, an entry exists, a replica: `get` decides all.
    Other,
}

/// `CACHE.GET`'s entry point. The common hit — `CACHE.GET key lease_ms` of a
/// string value whose key has no entry (lease, stale mark, waiters), on a
/// master — is answered here, as lean as `GET`: one key open, no allocation,
/// no command wrapper. Everything else goes through `get`.
pub extern "C" fn get_command(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    let plain = if argc == 3 && !argv.is_null() && !ctx.is_null() {
        // Safety: Redis hands a command `argc` live strings in `argv`, kept for
        // the whole command; `Arg` is `repr(transparent)` over those pointers.
        let args = unsafe { std::slice::from_raw_parts(argv.cast::<Arg>(), 3) };
        guard::callback(Plain::Other, || plain_hit(ctx, args))
    } else {
        Plain::Other
    };
    match plain {
        Plain::Answered => raw::REDISMODULE_OK as c_int,
        Plain::WrongType => {
            crate::command::dispatch(ctx, argv, argc, |_, _| Err(err(error::WRONGTYPE)))
        }
        Plain::Missing => crate::command::dispatch(ctx, argv, argc, get_looked_up),
        Plain::Other => crate::command::dispatch(ctx, argv, argc, get),
    }
}

/// `args`: `CACHE.GET key lease_ms` (`args::cache_get` reads the same lease).
fn plain_hit(ctx: *mut raw::RedisModuleCtx, args: &[Arg]) -> Plain {
    if keyspace::maybe_replica() || names(&args[1]) || args::lease_ms(&args[2]).is_err() {
        return Plain::Other;
    }
    let context = Context::new(ctx);
    let key = Key::read(&context, &args[1]);
    match key.string() {
        Err(_) => Plain::WrongType,
        Ok(None) => Plain::Missing,
        Ok(Some(v)) => {
            stats::CACHE_HITS.add(1);
            raw::reply_with_array(ctx, 2);
            raw::reply_with_string_buffer(ctx, v.as_ptr().cast(), v.len());
            raw::reply_with_null(ctx);
            Plain::Answered
        }
    }
}

/// `CACHE.GET` after its entry found no value for the key.
fn get_looked_up(ctx: &Context, args: &[Arg]) -> RedisResult {
    get_from(ctx, args, false)
}

/// `CACHE.GET key lease_ms [WAIT timeout] [REFRESH ms] [FRESH]`
pub fn get(ctx: &Context, args: &[Arg]) -> RedisResult {
    get_from(ctx, args, true)
}

/// `CACHE.GET`; `look` says whether a plain hit is still to be tried.
fn get_from(ctx: &Context, args: &[Arg], look: bool) -> RedisResult {
    if args.len() < 3 {
        return Err(RedisError::WrongArity);
    }
    let req = args::cache_get(&args[2..]).map_err(RedisError::String)?;
    if keyspace::maybe_replica() {
        refuse_on_replica(ctx)?;
    }
    let name = &args[1];
    // The common case, as lean as `GET`: a value, no entry (lease, stale
    // mark, waiters) for its key, no refresh due: one key open, no allocation.
    if look && !names(name) {
        let key = Key::read(ctx, name);
        if let Some(v) = key.string().map_err(err)? {
            let due = req.refresh_ms.is_some_and(|ms| {
                key.expire_at()
                    .is_some_and(|at| at.saturating_sub(now_ms()) < ms)
            });
            if !due {
                stats::CACHE_HITS.add(1);
                raw::reply_with_array(ctx.ctx, 2);
                raw::reply_with_string_buffer(ctx.ctx, v.as_ptr().cast(), v.len());
                raw::reply_with_null(ctx.ctx);
                return Ok(RedisValue::NoReply);
            }
        }
    }
    let mut value = peek_value(ctx, name)?;
    let q = waiters::queue_key(ctx.ctx, name);
    if waiters::queued(ctx, name, &KIND) > 0 && live_lease(&q, now_ms()).is_none() {
        // Waiters first: a lease that just ended goes to the oldest of them.
        waiters::serve(ctx, name);
        value = peek_value(ctx, name)?;
    }
    let now = now_ms();
    let e = entry(&q);
    let seen = match &value {
        None => Seen::Missing,
        Some(ttl_left) => Seen::Value {
            ttl_left: *ttl_left,
            stale: e.is_stale(now),
        },
    };
    let opts = Options {
        refresh_ms: req.refresh_ms,
        fresh: req.fresh,
    };
    let outstanding = live_lease(&q, now).is_some() || waiters::queued(ctx, name, &KIND) > 0;
    let read = match state::read(seen, outstanding, opts) {
        // A script serves the value; a reader outside it refreshes.
        Read::HitAndLease { stale } if in_script(ctx) => Read::Hit { stale },
        Read::MissAndLease if in_script(ctx) => return Err(err(error::LEASE_IN_SCRIPT)),
        // Over `maxmemory` a hit is served without the refresh lease, and a
        // miss gets the server's own OOM: nothing is allocated.
        Read::HitAndLease { stale } if memory::over_limit() => Read::Hit { stale },
        Read::MissAndLease if memory::over_limit() => return Err(err(error::OOM)),
        read => read,
    };
    match read {
        Read::Hit { stale } => {
            stats::CACHE_HITS.add(1);
            if stale {
                stats::CACHE_STALE_SERVED.add(1);
            }
            reply_stored(ctx, name, None)
        }
        Read::HitAndLease { stale } => {
            stats::CACHE_HITS.add(1);
            if stale {
                stats::CACHE_STALE_SERVED.add(1);
            } else {
                stats::CACHE_REFRESHES.add(1);
            }
            let token = grant(ctx, &q, Some(client_id(ctx)), req.lease_ms);
            reply_stored(ctx, name, Some(token))
        }
        Read::MissAndLease => {
            stats::CACHE_MISSES.add(1);
            let token = grant(ctx, &q, Some(client_id(ctx)), req.lease_ms);
            Ok(pair(None, Some(token)))
        }
        Read::MissBusy => {
            stats::CACHE_MISSES.add(1);
            let waits = req.wait_ms.is_some()
                && waiters::can_block(ctx)
                && !waiters::shed(ctx, name, &KIND, req.queue);
            match req.wait_ms {
                Some(_) if waits && memory::over_limit() => Err(err(error::OOM)),
                Some(timeout_ms) if waits => {
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
    // A write that was blocked when the filter saw it may have run since.
    filter::settle();
    let now = now_ms();
    let current = live_lease(&q, now).is_some_and(|l| l.token == req.lease);
    if !current {
        stats::CACHE_FILLS_REFUSED.add(1);
        return Ok(RedisValue::Integer(0));
    }
    if Key::read(ctx, name).string().is_err() {
        // Something else took the key meanwhile: it is not a cache value.
        end_lease(&q, None);
        lease_ended(ctx, q);
        return Err(err(error::WRONGTYPE));
    }
    // The lease and the entry's stale mark go with the old value.
    with(|t| t.clear(&q));
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
    let live = live_lease(&q, now_ms()).is_some_and(|l| l.token == token);
    if !live || !end_lease(&q, Some(token)) {
        return Ok(RedisValue::Integer(0));
    }
    if waiters::queued(ctx, &args[1], &KIND) > 0 {
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
    if with(|t| t.clear(&q)).0.is_some() {
        stats::CACHE_REVOKED.add(1);
    }
    let changed = match (stale_ms, is_string) {
        (Some(ms), true) => {
            let now = now_ms();
            let until = now.saturating_add(ms);
            if expires.is_none_or(|at| at > until) {
                let at = until.to_string();
                call_replicated(ctx, "PEXPIREAT", &[name, at.as_bytes()])?;
            }
            // The key may have expired inside that call (a window of 1 ms):
            // then there is nothing to mark stale.
            if !Key::read(ctx, name).is_empty() {
                let end = expires.map_or(until, |at| at.min(until));
                with(|t| t.set_stale(&q, Some(end)));
                // A value turned stale is a change of the key's state
                // (`CACHE.PEEK` shows it) even when its expiry stays: tracking
                // clients and `WATCH` hear it.
                signal_modified(ctx, name);
                listen();
                arm_reaper(ctx.ctx, end.saturating_add(1));
            }
            true
        }
        _ if exists => {
            call_replicated(ctx, "DEL", &[name])?;
            true
        }
        _ => false,
    };
    notify(ctx, c"cache.invalidate", name);
    if waiters::queued(ctx, name, &KIND) > 0 {
        waiters::serve(ctx, name);
    }
    Ok(RedisValue::Integer(i64::from(changed)))
}

/// `CACHE.PEEK key`: `[value, expires_at, stale]` of a string value, nil
/// without one. A read that grants, queues and counts nothing, whose reply
/// follows from the key alone — its value, its absolute expiry and the stale
/// mark `CACHE.INVALIDATE … STALE` gives it (which always comes with a
/// signal that the key changed) — so `CLIENT TRACKING` tracks it and a
/// client may keep the reply until the key is written.
pub fn peek(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    let name = &args[1];
    let key = Key::read(ctx, name);
    let Some(v) = key.string().map_err(err)? else {
        return Ok(RedisValue::Null);
    };
    // A replica has no lease table: nothing it holds is marked stale.
    let stale = names(name) && entry(&waiters::queue_key(ctx.ctx, name)).is_stale(now_ms());
    raw::reply_with_array(ctx.ctx, 3);
    raw::reply_with_string_buffer(ctx.ctx, v.as_ptr().cast(), v.len());
    raw::reply_with_long_long(ctx.ctx, key.expire_at().unwrap_or(-1));
    raw::reply_with_long_long(ctx.ctx, i64::from(stale));
    Ok(RedisValue::NoReply)
}

/// `CACHE.INFO key`
pub fn info(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    // Not a write: a replica answers from its keys (it has no lease table,
    // so no lease and no waiters).
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
    let q = waiters::queue_key(ctx.ctx, name);
    let replica = ctx.get_flags().contains(ContextFlags::SLAVE);
    let (stale, lease, waiting) = if replica {
        (false, None, 0)
    } else {
        let stale = entry(&q).is_stale(now);
        (
            stale,
            live_lease(&q, now),
            waiters::queued(ctx, name, &KIND),
        )
    };
    let value = match (present, stale) {
        (false, _) => "miss",
        (true, true) => "stale",
        (true, false) => "hit",
    };
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
            ("waiters", Field::Int(waiting as i64)),
        ],
    )
}
