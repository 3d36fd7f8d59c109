//! FIFO queues of blocked clients, one per key, shared by every kind that
//! waits on keys (a kind plugs in through [`Kind`]). The only home of the
//! blocking FFI.
//!
//! Invariant — exactly one reply per blocked request:
//! - a waiter's reply is decided by warden alone: its grant, nil at its
//!   deadline (a module timer per waiter, never Redis' cron), or an error;
//! - the decided answer is written at once, in the same call: `deliver` runs
//!   `CLIENT UNBLOCK <id>` through `RedisModule_Call`, which calls
//!   `on_timeout` synchronously (it writes the answer) and clears the
//!   client's blocked state before returning. So there is no window in which
//!   Redis' own timeout, a user's `CLIENT UNBLOCK [ERROR]` or a kill could see
//!   the client still blocked with an answer already decided;
//! - a user's `CLIENT UNBLOCK` reaches `on_timeout` with no decided answer:
//!   the waiter leaves its queue and is answered nil; a disconnect reaches
//!   `on_disconnect`: the waiter leaves its queue and is never answered;
//! - every handle is released with `RedisModule_UnblockClient` exactly once:
//!   in `on_timeout`, in `on_disconnect`, or (fallback) in `deliver`;
//! - nothing is granted to a waiter whose deadline has passed: `serve` answers
//!   such heads nil before asking the kind;
//! - no `RefCell` borrow is held while Redis is called (opening a key or
//!   running a command can come back here).
//!
//! Anything that may free a key with waiters (a lease ending, `DEL`, a flush,
//! an overwrite, a waiter leaving the head) marks the key dirty; a timer then
//! serves it from a clean context — never while the server avoids writes
//! (`CLIENT PAUSE`, `FAILOVER`, a `SHUTDOWN` waiting for replicas: Redis does
//! not delete expired keys then, and writing to one crashes it), and never on a
//! replica.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::os::raw::{c_char, c_int, c_longlong, c_void};
use std::ptr;

use redis_module::{raw, Context, ContextFlags, RedisString};

use crate::command::Arg;
use crate::error;
use crate::guard;
use crate::keyspace::now_ms;
use crate::stats;

type Handle = *mut raw::RedisModuleBlockedClient;
type TimerId = raw::RedisModuleTimerID;

/// How long to wait before trying again while the server avoids writes.
const PAUSED_RETRY_MS: i64 = 10;

/// A kind of request that waits on keys (exclusive lock, read-write lock, ...).
pub trait Kind: Sync {
    /// The key may have changed and the oldest waiter is of this kind: answer
    /// what the kind's rules allow, from the head of the queue, with [`pop_head`]
    /// and [`answer`].
    fn serve(&self, ctx: &Context, name: &Arg) -> Served;

    /// What a waiter of this kind is answered when its deadline passes (or a
    /// user's `CLIENT UNBLOCK` ends its wait).
    fn timed_out(&self) -> Answer {
        Answer::Nil
    }
}

/// What serving the head of a queue did.
pub enum Served {
    /// At least one waiter was answered: look at the new head.
    Progress,
    /// The head keeps waiting; `Some(t)`: the key may free itself at `t`.
    Wait(Option<i64>),
    /// The key holds another type: the head is answered `WRONGTYPE`.
    WrongType,
}

/// What a waiter asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Exclusive,
    Read,
    Write,
    /// A cache reader waiting for a fill; `Fresh`: a stale value will not do.
    Fill,
    FillFresh,
}

/// A blocked request: which kind, who, for how long, in which mode.
pub struct Waiter {
    pub kind: &'static dyn Kind,
    pub owner: Vec<u8>,
    pub ttl_ms: i64,
    pub mode: Mode,
    /// Absolute deadline of the wait; `i64::MAX`: forever.
    deadline_ms: i64,
    handle: Handle,
    client_id: u64,
    timer: Option<TimerId>,
}

impl Waiter {
    pub fn new(kind: &'static dyn Kind, owner: &[u8], ttl_ms: i64, mode: Mode) -> Self {
        Self {
            kind,
            owner: owner.to_vec(),
            ttl_ms,
            mode,
            deadline_ms: i64::MAX,
            handle: ptr::null_mut(),
            client_id: 0,
            timer: None,
        }
    }

    /// The id of the waiting client.
    pub fn client_id(&self) -> u64 {
        self.client_id
    }

    fn is_of(&self, kind: &'static dyn Kind) -> bool {
        ptr::addr_eq(self.kind, kind)
    }
}

/// What a waiter is answered with.
pub enum Answer {
    Integer(i64),
    Nil,
    Error(&'static str),
    /// `[value, lease]`, each possibly nil (cache reads).
    Pair(Option<Vec<u8>>, Option<i64>),
}

/// A key in a database.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct QueueKey {
    pub db: c_int,
    pub name: Vec<u8>,
}

#[derive(Default)]
struct Registry {
    queues: HashMap<QueueKey, VecDeque<Waiter>>,
    /// Queued handles and their key.
    blocked: HashMap<usize, QueueKey>,
    /// Answers decided and being written by `on_timeout`.
    answers: HashMap<usize, Answer>,
    lease_timers: HashMap<QueueKey, (TimerId, i64)>,
    dirty: HashSet<QueueKey>,
    tick: Option<TimerId>,
}

thread_local! {
    static REGISTRY: RefCell<Registry> = RefCell::new(Registry::default());
}

fn with<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    REGISTRY.with(|r| f(&mut r.borrow_mut()))
}

/// Gives memory back once a map has emptied out (a burst of 100k waiters must
/// not keep its tables forever).
fn shrink<K, V>(map: &mut HashMap<K, V>)
where
    K: std::hash::Hash + Eq,
{
    if map.capacity() > 64 && map.len() * 4 < map.capacity() {
        map.shrink_to_fit();
    }
}

pub fn queue_key(ctx: *mut raw::RedisModuleCtx, name: &[u8]) -> QueueKey {
    let db = unsafe { raw::RedisModule_GetSelectedDb.unwrap()(ctx) };
    QueueKey {
        db,
        name: name.to_vec(),
    }
}

/// The common case, answered without building a queue key.
fn nobody_waits() -> bool {
    with(|r| r.queues.is_empty())
}

/// Whether this client may block now (not inside MULTI, a script, the
/// replication stream or loading, and not on a replica).
pub fn can_block(ctx: &Context) -> bool {
    let flags = ctx.get_flags();
    !flags.intersects(
        ContextFlags::DENY_BLOCKING
            | ContextFlags::MULTI
            | ContextFlags::LUA
            | ContextFlags::REPLICATED
            | ContextFlags::LOADING
            | ContextFlags::SLAVE,
    )
}

/// Whether a timer may write to the keyspace now: not while Redis avoids
/// writes (paused clients, failover, shutdown waiting for replicas: expired
/// keys are not deleted then) and not on a replica.
pub fn may_write(ctx: &Context) -> bool {
    let avoid = unsafe { raw::RedisModule_AvoidReplicaTraffic.unwrap()() } != 0;
    !avoid && !ctx.get_flags().contains(ContextFlags::SLAVE)
}

/// Waiters queued on `name` in the selected database.
pub fn queued(ctx: &Context, name: &[u8]) -> usize {
    if nobody_waits() {
        return 0;
    }
    let q = queue_key(ctx.ctx, name);
    with(|r| r.queues.get(&q).map_or(0, VecDeque::len))
}

/// All clients waiting, on every key.
pub fn total_waiting() -> usize {
    with(|r| r.blocked.len())
}

/// Blocks the calling client at the tail of `name`'s queue (timeout 0:
/// forever); it will be answered when served, at its deadline, or never if
/// it disconnects.
pub fn block(ctx: &Context, name: &[u8], mut waiter: Waiter, timeout_ms: i64) {
    // Timeout 0 for Redis: the deadline is ours (a module timer), so Redis'
    // cron never answers behind our back. The timeout callback stays, for
    // `CLIENT UNBLOCK`.
    let handle = unsafe {
        raw::RedisModule_BlockClient.unwrap()(
            ctx.ctx,
            Some(on_reply),
            Some(on_timeout),
            Some(free_answer),
            0,
        )
    };
    unsafe { raw::RedisModule_SetDisconnectCallback.unwrap()(handle, Some(on_disconnect)) };
    waiter.handle = handle;
    waiter.client_id = unsafe { raw::RedisModule_GetClientId.unwrap()(ctx.ctx) };
    if timeout_ms > 0 {
        waiter.deadline_ms = now_ms().saturating_add(timeout_ms);
        let data = handle.cast::<c_void>();
        waiter.timer = Some(unsafe {
            raw::RedisModule_CreateTimer.unwrap()(ctx.ctx, timeout_ms, Some(on_deadline), data)
        });
    }
    let q = queue_key(ctx.ctx, name);
    with(|r| {
        r.blocked.insert(handle as usize, q.clone());
        r.queues.entry(q).or_default().push_back(waiter);
    });
}

/// Takes the oldest waiter off `name`'s queue if it is of `kind` and `fits`
/// accepts it. The caller answers it with [`answer`].
pub fn pop_head(
    ctx: &Context,
    name: &[u8],
    kind: &'static dyn Kind,
    fits: impl FnOnce(&Waiter) -> bool,
) -> Option<Waiter> {
    if nobody_waits() {
        return None;
    }
    let q = queue_key(ctx.ctx, name);
    with(|r| {
        let queue = r.queues.get_mut(&q)?;
        let head = queue.front()?;
        if !head.is_of(kind) || !fits(head) {
            return None;
        }
        let waiter = queue.pop_front()?;
        forget(r, &q, &waiter);
        Some(waiter)
    })
}

/// Takes every waiter of `kind` that `wanted` accepts off `name`'s queue,
/// oldest first, wherever they stand. The caller answers them.
pub fn drain(
    ctx: &Context,
    name: &[u8],
    kind: &'static dyn Kind,
    wanted: impl Fn(&Waiter) -> bool,
) -> Vec<Waiter> {
    if nobody_waits() {
        return Vec::new();
    }
    let q = queue_key(ctx.ctx, name);
    with(|r| {
        let Some(queue) = r.queues.get_mut(&q) else {
            return Vec::new();
        };
        let (taken, kept): (VecDeque<Waiter>, VecDeque<Waiter>) = std::mem::take(queue)
            .into_iter()
            .partition(|w| w.is_of(kind) && wanted(w));
        *queue = kept;
        for w in &taken {
            forget(r, &q, w);
        }
        if r.queues.get(&q).is_some_and(VecDeque::is_empty) {
            r.queues.remove(&q);
        }
        taken.into()
    })
}

/// Removes a waiter's bookkeeping (its queue entry is already gone).
fn forget(r: &mut Registry, q: &QueueKey, waiter: &Waiter) {
    r.blocked.remove(&(waiter.handle as usize));
    shrink(&mut r.blocked);
    if r.queues.get(q).is_some_and(VecDeque::is_empty) {
        r.queues.remove(q);
        shrink(&mut r.queues);
    }
}

/// Answers a waiter taken off its queue (a grant, nil or an error): written
/// to the client before this returns.
pub fn answer(ctx: &Context, waiter: Waiter, answer: Answer) {
    if matches!(answer, Answer::Integer(_)) {
        stats::HANDOFFS.add(1);
    }
    deliver(ctx.ctx, waiter, answer);
}

fn deliver(ctx: *mut raw::RedisModuleCtx, waiter: Waiter, answer: Answer) {
    if let Some(id) = waiter.timer {
        stop_timer(ctx, id);
    }
    let handle = waiter.handle;
    with(|r| r.answers.insert(handle as usize, answer));
    // `CLIENT UNBLOCK` calls `on_timeout` synchronously, which writes the
    // answer, then unblocks the client at once (see the invariant above).
    let reply = unsafe {
        raw::RedisModule_Call.unwrap()(
            ctx,
            c"CLIENT".as_ptr(),
            c"cl".as_ptr(),
            c"UNBLOCK".as_ptr(),
            waiter.client_id as c_longlong,
        )
    };
    if !reply.is_null() {
        unsafe { raw::RedisModule_FreeCallReply.unwrap()(reply) };
    }
    if let Some(answer) = with(|r| r.answers.remove(&(handle as usize))) {
        // Not reached through CLIENT UNBLOCK: answer from the reply callback.
        let boxed = Box::into_raw(Box::new(answer)).cast::<c_void>();
        unsafe { raw::RedisModule_UnblockClient.unwrap()(handle, boxed) };
    }
}

/// Writes an answer to the client of the running callback.
fn reply(ctx: *mut raw::RedisModuleCtx, answer: &Answer) {
    match answer {
        Answer::Integer(n) => {
            raw::reply_with_long_long(ctx, *n);
        }
        Answer::Nil => {
            raw::reply_with_null(ctx);
        }
        Answer::Error(text) => {
            let line = std::ffi::CString::new(*text).unwrap_or_default();
            unsafe { raw::RedisModule_ReplyWithError.unwrap()(ctx, line.as_ptr()) };
        }
        Answer::Pair(value, lease) => {
            raw::reply_with_array(ctx, 2);
            match value {
                Some(v) => raw::reply_with_string_buffer(ctx, v.as_ptr().cast::<c_char>(), v.len()),
                None => raw::reply_with_null(ctx),
            };
            match lease {
                Some(n) => raw::reply_with_long_long(ctx, *n),
                None => raw::reply_with_null(ctx),
            };
        }
    }
}

/// Makes sure `name` is served again right after a lease ending at `deadline_ms`
/// (Redis expires keys lazily; the module timer makes the hand-off prompt).
pub fn watch_lease(ctx: &Context, name: &[u8], deadline_ms: i64) {
    if deadline_ms == i64::MAX || nobody_waits() {
        return;
    }
    let q = queue_key(ctx.ctx, name);
    let fire_at = deadline_ms.saturating_add(1);
    let stale = with(|r| {
        if !r.queues.contains_key(&q) {
            return None;
        }
        match r.lease_timers.get(&q) {
            Some(&(_, at)) if at <= fire_at => None,
            Some(&(id, _)) => Some(Some(id)),
            None => Some(None),
        }
    });
    let Some(stale) = stale else { return };
    if let Some(id) = stale {
        stop_lease_timer(ctx.ctx, id);
    }
    let delay = (fire_at - now_ms()).max(0);
    let data = Box::into_raw(Box::new(q.clone())).cast::<c_void>();
    let id =
        unsafe { raw::RedisModule_CreateTimer.unwrap()(ctx.ctx, delay, Some(on_lease_end), data) };
    with(|r| r.lease_timers.insert(q, (id, fire_at)));
}

/// Stops a waiter's deadline timer (its data is the handle, nothing to free).
fn stop_timer(ctx: *mut raw::RedisModuleCtx, id: TimerId) {
    unsafe { raw::RedisModule_StopTimer.unwrap()(ctx, id, ptr::null_mut()) };
}

/// Stops a lease timer and frees the key it carried.
fn stop_lease_timer(ctx: *mut raw::RedisModuleCtx, id: TimerId) {
    let mut data: *mut c_void = ptr::null_mut();
    let stopped = unsafe { raw::RedisModule_StopTimer.unwrap()(ctx, id, &mut data) };
    if stopped == raw::REDISMODULE_OK as c_int && !data.is_null() {
        drop(unsafe { Box::from_raw(data.cast::<QueueKey>()) });
    }
}

/// Drops a key's lease timer once nobody waits on it any more.
fn drop_lease_timer(ctx: *mut raw::RedisModuleCtx, q: &QueueKey) {
    let timer = with(|r| {
        if r.queues.contains_key(q) {
            return None;
        }
        let t = r.lease_timers.remove(q).map(|(id, _)| id);
        shrink(&mut r.lease_timers);
        t
    });
    if let Some(id) = timer {
        stop_lease_timer(ctx, id);
    }
}

/// Marks a key to be served on the next tick.
pub fn mark_dirty(ctx: *mut raw::RedisModuleCtx, q: QueueKey) {
    with(|r| r.dirty.insert(q));
    arm_tick(ctx, 0);
}

fn arm_tick(ctx: *mut raw::RedisModuleCtx, delay_ms: i64) {
    if with(|r| r.tick.is_some()) {
        return;
    }
    let id = unsafe {
        raw::RedisModule_CreateTimer.unwrap()(ctx, delay_ms, Some(on_tick), ptr::null_mut())
    };
    with(|r| r.tick = Some(id));
}

/// Marks every key with waiters (after a flush, `SWAPDB` or a reload).
fn mark_all_dirty(ctx: *mut raw::RedisModuleCtx) {
    let keys: Vec<QueueKey> = with(|r| r.queues.keys().cloned().collect());
    for q in keys {
        mark_dirty(ctx, q);
    }
}

/// Serves the queue of `name`: answers nil to heads whose deadline passed,
/// then lets the head's kind grant what it can, until the head must wait.
pub fn serve(ctx: &Context, name: &Arg) {
    let q = queue_key(ctx.ctx, name);
    serve_queue(ctx, &q, name);
}

fn serve_queue(ctx: &Context, q: &QueueKey, name: &Arg) {
    loop {
        let now = now_ms();
        let head = with(|r| {
            let queue = r.queues.get_mut(q)?;
            let head = queue.front()?;
            if head.deadline_ms <= now {
                let w = queue.pop_front()?;
                forget(r, q, &w);
                return Some(Err(w));
            }
            Some(Ok(head.kind))
        });
        match head {
            None => {
                drop_lease_timer(ctx.ctx, q);
                return;
            }
            Some(Err(late)) => {
                stats::WAIT_TIMEOUTS.add(1);
                let answer = late.kind.timed_out();
                deliver(ctx.ctx, late, answer);
            }
            Some(Ok(kind)) => match kind.serve(ctx, name) {
                Served::Progress => {}
                Served::Wait(until) => {
                    if let Some(at) = until {
                        watch_lease(ctx, name, at);
                    }
                    return;
                }
                Served::WrongType => {
                    let w = with(|r| {
                        let w = r.queues.get_mut(q)?.pop_front()?;
                        forget(r, q, &w);
                        Some(w)
                    });
                    if let Some(w) = w {
                        deliver(ctx.ctx, w, Answer::Error(error::WRONGTYPE));
                    }
                }
            },
        }
    }
}

/// Serves dirty keys, unless writes must wait (then it tries again shortly).
fn tick(ctx: &Context) {
    with(|r| r.tick = None);
    if !may_write(ctx) {
        let replica = ctx.get_flags().contains(ContextFlags::SLAVE);
        if replica {
            // Replicas never grant: the master's effects decide.
            with(|r| r.dirty.clear());
        } else if with(|r| !r.dirty.is_empty()) {
            arm_tick(ctx.ctx, PAUSED_RETRY_MS);
        }
        return;
    }
    let dirty = with(|r| {
        let d = std::mem::take(&mut r.dirty);
        r.dirty.shrink_to_fit();
        d
    });
    for q in dirty {
        select_db(ctx, q.db);
        let name = RedisString::create_from_slice(ctx.ctx, &q.name);
        serve_queue(ctx, &q, Arg::of(&name));
    }
}

fn select_db(ctx: &Context, db: c_int) {
    unsafe { raw::RedisModule_SelectDb.unwrap()(ctx.ctx, db) };
}

/// Removes a still-queued waiter (timed out by `CLIENT UNBLOCK`, or
/// disconnected); its kind if it was queued.
fn leave(ctx: *mut raw::RedisModuleCtx, handle: Handle) -> Option<&'static dyn Kind> {
    let left = with(|r| {
        let q = r.blocked.remove(&(handle as usize))?;
        shrink(&mut r.blocked);
        let queue = r.queues.get_mut(&q)?;
        let at = queue.iter().position(|w| w.handle == handle)?;
        let w = queue.remove(at)?;
        if queue.is_empty() {
            r.queues.remove(&q);
            shrink(&mut r.queues);
        }
        Some((q, w.timer, w.kind))
    });
    let (q, timer, kind) = left?;
    if let Some(id) = timer {
        stop_timer(ctx, id);
    }
    drop_lease_timer(ctx, &q);
    // The head may have changed: readers behind a departed writer may go.
    mark_dirty(ctx, q);
    Some(kind)
}

extern "C" fn on_reply(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard::callback(raw::REDISMODULE_OK as c_int, || {
        let answer =
            unsafe { raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx) }.cast::<Answer>();
        match unsafe { answer.as_ref() } {
            Some(answer) => reply(ctx, answer),
            None => {
                raw::reply_with_null(ctx);
            }
        }
        raw::REDISMODULE_OK as c_int
    })
}

/// Called synchronously by `CLIENT UNBLOCK`: ours (from `deliver`, with a
/// decided answer) or a user's (no answer: the waiter leaves, nil).
extern "C" fn on_timeout(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard::callback(raw::REDISMODULE_OK as c_int, || {
        let handle = unsafe { raw::RedisModule_GetBlockedClientHandle.unwrap()(ctx) };
        match with(|r| r.answers.remove(&(handle as usize))) {
            Some(answer) => reply(ctx, &answer),
            None => match leave(ctx, handle) {
                Some(kind) => {
                    stats::WAIT_TIMEOUTS.add(1);
                    reply(ctx, &kind.timed_out());
                }
                None => {
                    raw::reply_with_null(ctx);
                }
            },
        }
        unsafe { raw::RedisModule_UnblockClient.unwrap()(handle, ptr::null_mut()) };
        raw::REDISMODULE_OK as c_int
    })
}

extern "C" fn on_disconnect(ctx: *mut raw::RedisModuleCtx, handle: Handle) {
    guard::callback((), || {
        if leave(ctx, handle).is_some() {
            unsafe { raw::RedisModule_UnblockClient.unwrap()(handle, ptr::null_mut()) };
        }
    })
}

extern "C" fn free_answer(_ctx: *mut raw::RedisModuleCtx, answer: *mut c_void) {
    if !answer.is_null() {
        drop(unsafe { Box::from_raw(answer.cast::<Answer>()) });
    }
}

extern "C" fn on_tick(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard::callback((), || tick(&Context::new(ctx)))
}

/// A waiter's deadline: answered nil, whatever the state of the key.
extern "C" fn on_deadline(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard::callback((), || {
        let handle = data.cast::<raw::RedisModuleBlockedClient>();
        let found = with(|r| {
            let q = r.blocked.get(&(handle as usize))?.clone();
            let queue = r.queues.get_mut(&q)?;
            let at = queue.iter().position(|w| w.handle == handle)?;
            let mut w = queue.remove(at)?;
            w.timer = None; // this timer has fired
            forget(r, &q, &w);
            Some((q, w))
        });
        if let Some((q, w)) = found {
            stats::WAIT_TIMEOUTS.add(1);
            let answer = w.kind.timed_out();
            deliver(ctx, w, answer);
            drop_lease_timer(ctx, &q);
            // Readers behind a timed-out writer may go now.
            mark_dirty(ctx, q);
        }
    })
}

extern "C" fn on_lease_end(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard::callback((), || {
        let q = *unsafe { Box::from_raw(data.cast::<QueueKey>()) };
        with(|r| r.lease_timers.remove(&q));
        mark_dirty(ctx, q);
    })
}

extern "C" fn on_keyspace_event(
    ctx: *mut raw::RedisModuleCtx,
    _type: c_int,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    guard::callback(raw::REDISMODULE_OK as c_int, || {
        let mut len = 0;
        let ptr = raw::string_ptr_len(key, &mut len);
        let name = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
        if !event.is_null() && unsafe { std::ffi::CStr::from_ptr(event) } == c"evicted" {
            crate::evicted::on_evicted(ctx, name);
        }
        crate::cache::commands::on_key_event(ctx, event, name);
        if nobody_waits() {
            return raw::REDISMODULE_OK as c_int;
        }
        let q = queue_key(ctx, name);
        if with(|r| r.queues.contains_key(&q)) {
            mark_dirty(ctx, q);
        }
        raw::REDISMODULE_OK as c_int
    })
}

extern "C" fn on_server_event(
    ctx: *mut raw::RedisModuleCtx,
    event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    guard::callback((), || {
        let after_flush = event.id == raw::REDISMODULE_EVENT_FLUSHDB
            && subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_END;
        let after_load = event.id == raw::REDISMODULE_EVENT_LOADING
            && subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED;
        if after_flush {
            let info = data.cast::<raw::RedisModuleFlushInfoV1>();
            let db = unsafe { info.as_ref() }.map_or(-1, |i| i.dbnum);
            crate::cache::commands::forget_db(ctx, db);
        }
        if event.id == raw::REDISMODULE_EVENT_SWAPDB {
            let info = data.cast::<raw::RedisModuleSwapDbInfo>();
            if let Some(info) = unsafe { info.as_ref() } {
                crate::evicted::swap_dbs(info.dbnum_first, info.dbnum_second);
            }
            crate::cache::commands::forget_db(ctx, -1);
        }
        if after_load {
            crate::evicted::arm(ctx);
        }
        if after_flush || after_load || event.id == raw::REDISMODULE_EVENT_SWAPDB {
            mark_all_dirty(ctx);
        }
    })
}

/// Subscribes to what may free a key with waiters: keyspace events, flushes,
/// `SWAPDB` and the end of a reload.
pub fn subscribe(ctx: &Context) -> bool {
    let events = raw::REDISMODULE_NOTIFY_GENERIC
        | raw::REDISMODULE_NOTIFY_STRING
        | raw::REDISMODULE_NOTIFY_LIST
        | raw::REDISMODULE_NOTIFY_SET
        | raw::REDISMODULE_NOTIFY_HASH
        | raw::REDISMODULE_NOTIFY_ZSET
        | raw::REDISMODULE_NOTIFY_EXPIRED
        | raw::REDISMODULE_NOTIFY_EVICTED
        | raw::REDISMODULE_NOTIFY_STREAM;
    // Not the module class: warden's own events never free a key, and hearing
    // them would cost every command a callback.
    let ok = unsafe {
        raw::RedisModule_SubscribeToKeyspaceEvents.unwrap()(
            ctx.ctx,
            events as c_int,
            Some(on_keyspace_event),
        )
    } == raw::REDISMODULE_OK as c_int;
    let server_events = [
        raw::REDISMODULE_EVENT_FLUSHDB,
        raw::REDISMODULE_EVENT_SWAPDB,
        raw::REDISMODULE_EVENT_LOADING,
    ];
    server_events.iter().fold(ok, |ok, &id| {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        ok && unsafe {
            raw::RedisModule_SubscribeToServerEvent.unwrap()(ctx.ctx, event, Some(on_server_event))
        } == raw::REDISMODULE_OK as c_int
    })
}
