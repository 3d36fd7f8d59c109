//! FIFO queues of blocked clients, one per key, shared by every lock kind.
//! The only home of the blocking FFI.
//!
//! Invariants (each handle is unblocked exactly once):
//! - a queued waiter's handle is in `blocked`; it leaves the queue and
//!   `blocked` together, through exactly one of: a grant or failure
//!   (`answer_*`, `RedisModule_UnblockClient` with an `Answer`), its timeout
//!   or `CLIENT UNBLOCK` (`on_timeout`), or its disconnect (`on_disconnect`);
//!   the last two unblock it themselves with no answer;
//! - between a grant and its reply the handle sits in `granted`; if the client
//!   dies in that window the grant is revoked on the next timer tick, so a
//!   dead client never keeps a lock;
//! - the `Answer` box passed to `UnblockClient` is freed by `free_answer`;
//! - no `RefCell` borrow is held while Redis is called, since opening a key
//!   can fire keyspace events that come back here.
//!
//! Anything that may free a key with waiters (a lease ending, `DEL`, a
//! flush, an overwrite, a waiter leaving the head) marks the key dirty; a
//! zero-delay timer then asks the lock kind to serve it from a clean context
//! (writes made inside keyspace callbacks are not replicated safely).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;

use redis_module::{raw, Context, ContextFlags, RedisString};

use crate::command::Arg;
use crate::guard;
use crate::keyspace::now_ms;
use crate::stats;

type Handle = *mut raw::RedisModuleBlockedClient;

/// What a waiter asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Exclusive,
    Read,
    Write,
}

/// A blocked request: who wants the key, for how long, in which mode.
pub struct Waiter {
    pub owner: Vec<u8>,
    pub ttl_ms: i64,
    pub mode: Mode,
    handle: Handle,
}

impl Waiter {
    pub fn new(owner: &[u8], ttl_ms: i64, mode: Mode) -> Self {
        Self {
            owner: owner.to_vec(),
            ttl_ms,
            mode,
            handle: ptr::null_mut(),
        }
    }
}

/// A key in a database.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct QueueKey {
    db: c_int,
    name: Vec<u8>,
}

/// A grant made to a blocked client that has not been answered yet.
struct Pending {
    queue: QueueKey,
    owner: Vec<u8>,
    fence: u64,
    mode: Mode,
}

/// What a blocked client is answered with.
enum Answer {
    Granted { fence: u64, handle: usize },
    Failed(&'static str),
}

#[derive(Default)]
struct Registry {
    queues: HashMap<QueueKey, VecDeque<Waiter>>,
    blocked: HashMap<usize, QueueKey>,
    granted: HashMap<usize, Pending>,
    lease_timers: HashMap<QueueKey, (raw::RedisModuleTimerID, i64)>,
    dirty: HashSet<QueueKey>,
    revoke: Vec<Pending>,
    tick_armed: bool,
}

thread_local! {
    static REGISTRY: RefCell<Registry> = RefCell::new(Registry::default());
}

fn with<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    REGISTRY.with(|r| f(&mut r.borrow_mut()))
}

fn queue_key(ctx: *mut raw::RedisModuleCtx, name: &[u8]) -> QueueKey {
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
/// replication stream or loading).
pub fn can_block(ctx: &Context) -> bool {
    let flags = ctx.get_flags();
    !flags.intersects(
        ContextFlags::DENY_BLOCKING
            | ContextFlags::MULTI
            | ContextFlags::LUA
            | ContextFlags::REPLICATED
            | ContextFlags::LOADING,
    )
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

/// Blocks the calling client at the tail of `name`'s queue (timeout 0: forever).
pub fn block(ctx: &Context, name: &[u8], mut waiter: Waiter, timeout_ms: i64) {
    let handle = unsafe {
        raw::RedisModule_BlockClient.unwrap()(
            ctx.ctx,
            Some(on_reply),
            Some(on_timeout),
            Some(free_answer),
            timeout_ms,
        )
    };
    unsafe { raw::RedisModule_SetDisconnectCallback.unwrap()(handle, Some(on_disconnect)) };
    waiter.handle = handle;
    let q = queue_key(ctx.ctx, name);
    with(|r| {
        r.blocked.insert(handle as usize, q.clone());
        r.queues.entry(q).or_default().push_back(waiter);
    });
}

/// The mode of the oldest waiter on `name`.
pub fn head_mode(ctx: &Context, name: &[u8]) -> Option<Mode> {
    if nobody_waits() {
        return None;
    }
    let q = queue_key(ctx.ctx, name);
    with(|r| r.queues.get(&q).and_then(|w| w.front()).map(|w| w.mode))
}

/// Takes the oldest waiter off `name`'s queue if `fits` accepts it.
pub fn pop_if(ctx: &Context, name: &[u8], fits: impl FnOnce(&Waiter) -> bool) -> Option<Waiter> {
    if nobody_waits() {
        return None;
    }
    let q = queue_key(ctx.ctx, name);
    with(|r| {
        let queue = r.queues.get_mut(&q)?;
        let waiter = if fits(queue.front()?) {
            queue.pop_front()
        } else {
            None
        };
        if queue.is_empty() {
            r.queues.remove(&q);
        }
        if let Some(w) = &waiter {
            r.blocked.remove(&(w.handle as usize));
        }
        waiter
    })
}

/// Answers a popped waiter with its grant; the lock kind already recorded it.
pub fn answer_grant(ctx: &Context, waiter: Waiter, name: &[u8], fence: u64) {
    let handle = waiter.handle as usize;
    let pending = Pending {
        queue: queue_key(ctx.ctx, name),
        owner: waiter.owner,
        fence,
        mode: waiter.mode,
    };
    with(|r| r.granted.insert(handle, pending));
    stats::HANDOFFS.add(1);
    unblock(waiter.handle, Answer::Granted { fence, handle });
}

/// Answers every waiter on `name` with an error (the key now holds another type).
pub fn fail_all(ctx: &Context, name: &[u8], error: &'static str) {
    while let Some(waiter) = pop_if(ctx, name, |_| true) {
        unblock(waiter.handle, Answer::Failed(error));
    }
}

fn unblock(handle: Handle, answer: Answer) {
    let answer = Box::into_raw(Box::new(answer)).cast::<c_void>();
    unsafe { raw::RedisModule_UnblockClient.unwrap()(handle, answer) };
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
        stop_timer(ctx.ctx, id);
    }
    let delay = (fire_at - now_ms()).max(0);
    let data = Box::into_raw(Box::new(q.clone())).cast::<c_void>();
    let id =
        unsafe { raw::RedisModule_CreateTimer.unwrap()(ctx.ctx, delay, Some(on_lease_end), data) };
    with(|r| r.lease_timers.insert(q, (id, fire_at)));
}

fn stop_timer(ctx: *mut raw::RedisModuleCtx, id: raw::RedisModuleTimerID) {
    let mut data: *mut c_void = ptr::null_mut();
    let stopped = unsafe { raw::RedisModule_StopTimer.unwrap()(ctx, id, &mut data) };
    if stopped == raw::REDISMODULE_OK as c_int && !data.is_null() {
        drop(unsafe { Box::from_raw(data.cast::<QueueKey>()) });
    }
}

/// Marks a key to be served on the next tick.
fn mark_dirty(ctx: *mut raw::RedisModuleCtx, q: QueueKey) {
    let arm = with(|r| {
        r.dirty.insert(q);
        !std::mem::replace(&mut r.tick_armed, true)
    });
    if arm {
        unsafe { raw::RedisModule_CreateTimer.unwrap()(ctx, 0, Some(on_tick), ptr::null_mut()) };
    }
}

/// Marks every key with waiters (after a flush, `SWAPDB` or a reload).
fn mark_all_dirty(ctx: *mut raw::RedisModuleCtx) {
    let keys: Vec<QueueKey> = with(|r| r.queues.keys().cloned().collect());
    for q in keys {
        mark_dirty(ctx, q);
    }
}

/// Serves dirty keys and revokes grants whose client died before the reply.
fn tick(ctx: &Context) {
    let (dirty, revoke) = with(|r| {
        r.tick_armed = false;
        (std::mem::take(&mut r.dirty), std::mem::take(&mut r.revoke))
    });
    for p in revoke {
        select_db(ctx, p.queue.db);
        let name = RedisString::create_from_slice(ctx.ctx, &p.queue.name);
        match p.mode {
            Mode::Exclusive => {
                crate::lock::commands::revoke(ctx, Arg::of(&name), &p.owner, p.fence)
            }
            Mode::Read | Mode::Write => {
                crate::rwlock::commands::revoke(ctx, Arg::of(&name), &p.owner, p.fence)
            }
        }
    }
    for q in dirty {
        select_db(ctx, q.db);
        let name = RedisString::create_from_slice(ctx.ctx, &q.name);
        match head_mode(ctx, &q.name) {
            Some(Mode::Exclusive) => crate::lock::commands::serve_waiters(ctx, Arg::of(&name)),
            Some(Mode::Read | Mode::Write) => {
                crate::rwlock::commands::serve_waiters(ctx, Arg::of(&name))
            }
            None => {}
        }
    }
}

fn select_db(ctx: &Context, db: c_int) {
    unsafe { raw::RedisModule_SelectDb.unwrap()(ctx.ctx, db) };
}

/// Removes a still-queued waiter; true if it was queued.
fn leave(ctx: *mut raw::RedisModuleCtx, handle: Handle) -> bool {
    let left = with(|r| {
        let q = r.blocked.remove(&(handle as usize))?;
        if let Some(queue) = r.queues.get_mut(&q) {
            queue.retain(|w| w.handle != handle);
            if queue.is_empty() {
                r.queues.remove(&q);
            }
        }
        Some(q)
    });
    match left {
        Some(q) => {
            // The head may have changed: readers behind a departed writer may go.
            mark_dirty(ctx, q);
            unsafe { raw::RedisModule_UnblockClient.unwrap()(handle, ptr::null_mut()) };
            true
        }
        None => false,
    }
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
            Some(Answer::Granted { fence, handle }) => {
                with(|r| r.granted.remove(handle));
                raw::reply_with_long_long(ctx, *fence as i64);
            }
            Some(Answer::Failed(text)) => {
                let line = std::ffi::CString::new(*text).unwrap_or_default();
                unsafe { raw::RedisModule_ReplyWithError.unwrap()(ctx, line.as_ptr()) };
            }
            None => {
                raw::reply_with_null(ctx);
            }
        }
        raw::REDISMODULE_OK as c_int
    })
}

extern "C" fn on_timeout(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard::callback(raw::REDISMODULE_OK as c_int, || {
        let handle = unsafe { raw::RedisModule_GetBlockedClientHandle.unwrap()(ctx) };
        if leave(ctx, handle) {
            stats::WAIT_TIMEOUTS.add(1);
        }
        raw::reply_with_null(ctx);
        raw::REDISMODULE_OK as c_int
    })
}

extern "C" fn on_disconnect(ctx: *mut raw::RedisModuleCtx, handle: Handle) {
    guard::callback((), || {
        if leave(ctx, handle) {
            return;
        }
        // Granted, but the client died before hearing it: give the lock back.
        if let Some(p) = with(|r| r.granted.remove(&(handle as usize))) {
            let q = p.queue.clone();
            with(|r| r.revoke.push(p));
            mark_dirty(ctx, q);
        }
    })
}

extern "C" fn free_answer(_ctx: *mut raw::RedisModuleCtx, answer: *mut c_void) {
    if !answer.is_null() {
        let answer = unsafe { Box::from_raw(answer.cast::<Answer>()) };
        if let Answer::Granted { handle, .. } = *answer {
            with(|r| r.granted.remove(&handle));
        }
    }
}

extern "C" fn on_tick(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard::callback((), || tick(&Context::new(ctx)))
}

extern "C" fn on_lease_end(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard::callback((), || {
        let q = *unsafe { Box::from_raw(data.cast::<QueueKey>()) };
        with(|r| r.lease_timers.remove(&q));
        with(|r| r.dirty.insert(q));
        tick(&Context::new(ctx));
    })
}

extern "C" fn on_keyspace_event(
    ctx: *mut raw::RedisModuleCtx,
    _type: c_int,
    _event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    guard::callback(raw::REDISMODULE_OK as c_int, || {
        if nobody_waits() {
            return raw::REDISMODULE_OK as c_int;
        }
        let mut len = 0;
        let ptr = raw::string_ptr_len(key, &mut len);
        let name = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
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
    _data: *mut c_void,
) {
    guard::callback((), || {
        let after_flush = event.id == raw::REDISMODULE_EVENT_FLUSHDB
            && subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_END;
        let after_load = event.id == raw::REDISMODULE_EVENT_LOADING
            && subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED;
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
