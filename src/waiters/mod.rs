//! FIFO queues of blocked clients, one per key, shared by every kind that
//! waits on keys (a kind plugs in through [`Kind`]). The only home of the
//! blocking FFI.
//!
//! Invariant — exactly one reply per blocked request:
//! - a client is blocked with `RedisModule_BlockClient`, Redis' own timeout 0
//!   and, where Redis' timeout path could drop a decided reply (before 7.4),
//!   no timeout callback: then nothing in Redis answers a waiter on its own,
//!   and `CLIENT UNBLOCK` of a waiter answers 0;
//! - warden alone decides each answer (a grant, nil at the deadline — a
//!   module timer per waiter —, an error) and hands it to
//!   `RedisModule_UnblockClient` exactly once, in [`answer`]; Redis writes it
//!   from `on_reply` and clears the blocked state in the same step;
//! - between that decision and the reply, the only ways out of the block
//!   (a disconnect, `CLIENT KILL`, a cluster redirect, `REPLICAOF`, and on
//!   7.4+ `CLIENT UNBLOCK … ERROR`) write their own reply and drop ours:
//!   Redis then calls `on_disconnect` with the decided answer, and a grant in
//!   it is revoked on the next tick by key and token — never a second reply;
//! - a queued waiter leaves its queue exactly once: answered, at its
//!   deadline, by `CLIENT UNBLOCK` (7.4+), or gone; every handle is passed to
//!   `RedisModule_UnblockClient` exactly once on each of those paths;
//! - nothing is granted to a waiter whose deadline has passed: [`pop_head`]
//!   answers such heads nil before the kind sees them;
//! - no `RefCell` borrow is held while Redis is called (opening a key or
//!   unblocking a client can come back here).
//!
//! Queues hold handles in arrival order; a waiter that leaves from the
//! middle (deadline, disconnect) is dropped from the table at once and its
//! slot skipped when it reaches the head, so no exit is linear in the queue.
//!
//! Anything that may free a key with waiters (a lease ending, `DEL`, a flush,
//! an overwrite, a waiter leaving the head) marks the key dirty; a timer then
//! serves it from a clean context — never while the server avoids writes
//! (`CLIENT PAUSE`, `FAILOVER`, a `SHUTDOWN` waiting for replicas: Redis does
//! not delete expired keys then, and writing to one crashes it), and never on a
//! replica.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{raw, Context, ContextFlags, RedisString};
use rustc_hash::{FxHashMap, FxHashSet};

use crate::acks;
use crate::command::Arg;
use crate::error;
use crate::events::{self, Listener, Server};
use crate::guard;
use crate::keyspace::now_ms;
use crate::stats;

type Handle = *mut raw::RedisModuleBlockedClient;
type TimerId = raw::RedisModuleTimerID;
type Ctx = *mut raw::RedisModuleCtx;

/// How long to wait before trying again while the server avoids writes.
const PAUSED_RETRY_MS: i64 = 10;

/// How many kinds wait on keys: each has a queue of its own on every key.
pub const KINDS: usize = 5;

/// A kind of request that waits on keys (exclusive lock, read-write lock, ...).
/// Kinds never wait on each other: one queue per key and kind.
pub trait Kind: Sync {
    /// Its queue among a key's queues, below [`KINDS`].
    fn index(&self) -> usize;

    /// Its name in `WARDEN.CONTENDED`.
    fn name(&self) -> &'static str;

    /// The key may have changed and the oldest waiter is of this kind: answer
    /// what the kind's rules allow, from the head of the queue, with [`pop_head`]
    /// and [`answer`].
    fn serve(&self, ctx: &Context, name: &Arg) -> Served;

    /// What a waiter of this kind is answered when its deadline passes (or a
    /// user's `CLIENT UNBLOCK` ends its wait).
    fn timed_out(&self) -> Answer {
        Answer::Nil
    }

    /// A grant this kind made under `token` never reached its client (it
    /// left first): undo it, if the key still holds that grant.
    fn revoke(&self, ctx: &Context, name: &Arg, token: i64);
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
    /// A semaphore request for `permits`, stating the semaphore's `limit`.
    Permits {
        permits: u64,
        limit: u64,
    },
    /// A rate limiter request for `cost` tokens, stating the limiter's rate.
    Tokens {
        cost: u64,
        count: u64,
        period_ms: u64,
        burst: u64,
    },
}

/// A blocked request: which kind, who, for how long, in which mode.
pub struct Waiter {
    pub kind: &'static dyn Kind,
    pub owner: Vec<u8>,
    pub ttl_ms: i64,
    pub mode: Mode,
    /// Absolute deadline of the wait; `i64::MAX`: forever.
    deadline_ms: i64,
    /// When the wait began (unix ms).
    since_ms: i64,
    handle: Handle,
    client_id: u64,
    timer: Option<TimerId>,
    /// Where it waits.
    key: QueueKey,
    /// Tells this waiter's slot from an older one of a reused handle.
    seq: u64,
}

impl Waiter {
    pub fn new(kind: &'static dyn Kind, owner: &[u8], ttl_ms: i64, mode: Mode) -> Self {
        Self {
            kind,
            owner: owner.to_vec(),
            ttl_ms,
            mode,
            deadline_ms: i64::MAX,
            since_ms: 0,
            handle: ptr::null_mut(),
            client_id: 0,
            timer: None,
            key: QueueKey {
                db: 0,
                name: Vec::new(),
            },
            seq: 0,
        }
    }

    /// The id of the waiting client.
    pub fn client_id(&self) -> u64 {
        self.client_id
    }

    /// The absolute deadline of the wait (`i64::MAX`: none).
    pub fn deadline_ms(&self) -> i64 {
        self.deadline_ms
    }

    /// What it asks for, as its queue sums it (a rate limiter's tokens).
    fn weight(&self) -> u64 {
        match self.mode {
            Mode::Tokens { cost, .. } => cost,
            _ => 0,
        }
    }

    /// The wait is over, whatever ended it: its length goes to its kind's histogram.
    fn ended(&self, now_ms: i64) {
        let histogram = match self.mode {
            Mode::Exclusive => &stats::LOCK_WAIT,
            Mode::Read | Mode::Write => &stats::RWLOCK_WAIT,
            Mode::Fill | Mode::FillFresh => &stats::CACHE_WAIT,
            Mode::Permits { .. } => &stats::SEM_WAIT,
            Mode::Tokens { .. } => &stats::RATE_WAIT,
        };
        histogram.observe(now_ms - self.since_ms);
    }
}

pub mod held;

/// What a waiter is answered with.
pub enum Answer {
    Integer(i64),
    Nil,
    Error(&'static str),
    /// An error built for this waiter (a `MOVED` to its key's new owner).
    Redirect(String),
    /// `[value, lease]`, each possibly nil (cache reads).
    /// The value is shared by every waiter a fill answers: one copy, however
    /// many wait.
    Pair(Option<std::rc::Rc<[u8]>>, Option<i64>),
    /// A rate limiter's decision (`RATE.ACQUIRE`'s five integers); `grant`:
    /// the tokens it took, to give back if the answer never arrives.
    Decision {
        grant: Option<i64>,
        words: [i64; 5],
    },
}

impl Answer {
    /// The token this answer grants, if it grants one.
    fn token(&self) -> Option<i64> {
        match self {
            Answer::Integer(t)
            | Answer::Pair(_, Some(t))
            | Answer::Decision { grant: Some(t), .. } => Some(*t),
            _ => None,
        }
    }
}

/// A key in a database.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct QueueKey {
    pub db: c_int,
    pub name: Vec<u8>,
}

/// A decided answer on its way to the client (the blocked client's private
/// data until Redis writes it or drops it).
struct InFlight {
    answer: Answer,
    /// For a grant: who made it and where, to revoke it if it is dropped.
    grant: Option<(&'static dyn Kind, QueueKey, i64)>,
}

/// One key's waiters of one kind in arrival order: (handle, seq) slots, some
/// of them left behind by waiters that went away (skipped at the head).
#[derive(Default)]
struct Queue {
    slots: VecDeque<(usize, u64)>,
    live: usize,
    /// The sum of the live waiters' `since_ms`: their total wait, in O(1).
    since_sum: i64,
    /// The sum of the live waiters' weights (a rate limiter's queued tokens).
    weight_sum: u64,
}

/// A key's queues, one per kind.
type Queues = [Queue; KINDS];

fn live(queues: &Queues) -> usize {
    queues.iter().map(|q| q.live).sum()
}

#[derive(Default)]
struct Registry {
    /// Per database, per key name: the queues.
    queues: FxHashMap<c_int, FxHashMap<Vec<u8>, Queues>>,
    /// Every queued waiter by handle.
    waiting: FxHashMap<usize, Waiter>,
    next_seq: u64,
    /// Per database, per key name: the timer that serves the key when its
    /// lease ends, and when it fires.
    lease_timers: FxHashMap<c_int, FxHashMap<Vec<u8>, (TimerId, i64)>>,
    dirty: FxHashSet<QueueKey>,
    tick: Option<TimerId>,
    /// Grants handed to Redis and not yet written or dropped (`InFlight`
    /// addresses): what a `REPLICAOF` about to run must take back first.
    in_flight: FxHashSet<usize>,
    /// Grants the replicas did not acknowledge in time, answered busy while
    /// writes were paused: taken back once writes resume.
    unacked: Vec<(&'static dyn Kind, QueueKey, i64)>,
}

thread_local! {
    static REGISTRY: RefCell<Registry> = RefCell::new(Registry::default());
}

fn with<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    REGISTRY.with(|r| f(&mut r.borrow_mut()))
}

/// Gives memory back once a map has emptied out (a burst of 100k waiters must
/// not keep its tables forever).
fn shrink<K, V>(map: &mut FxHashMap<K, V>)
where
    K: std::hash::Hash + Eq,
{
    // Emptied, the table goes, whatever the last shrink left of it (up to
    // 64 slots of waiters: tens of KB after a burst).
    let emptied = map.is_empty() && map.capacity() > 16;
    if emptied || (map.capacity() > 64 && map.len() * 4 < map.capacity()) {
        map.shrink_to_fit();
    }
}

fn selected_db(ctx: Ctx) -> c_int {
    unsafe { raw::RedisModule_GetSelectedDb.unwrap()(ctx) }
}

pub fn queue_key(ctx: Ctx, name: &[u8]) -> QueueKey {
    QueueKey {
        db: selected_db(ctx),
        name: name.to_vec(),
    }
}

impl Registry {
    /// The queues of a key with waiters.
    fn queue(&self, db: c_int, name: &[u8]) -> Option<&Queues> {
        self.queues.get(&db)?.get(name)
    }

    /// The live waiter at the head of a queue, dropping slots of waiters gone.
    fn head(&mut self, db: c_int, name: &[u8], kind: usize) -> Option<&Waiter> {
        let queue = &mut self.queues.get_mut(&db)?.get_mut(name)?[kind];
        loop {
            let &(handle, seq) = queue.slots.front()?;
            match self.waiting.get(&handle) {
                Some(w) if w.seq == seq => break,
                _ => {
                    queue.slots.pop_front();
                }
            }
        }
        let &(handle, _) = queue.slots.front()?;
        self.waiting.get(&handle)
    }

    /// Takes the head (found by [`Registry::head`]) off its queue.
    fn pop_head(&mut self, db: c_int, name: &[u8], kind: usize) -> Option<Waiter> {
        let queue = &mut self.queues.get_mut(&db)?.get_mut(name)?[kind];
        let (handle, _) = queue.slots.pop_front()?;
        queue.live -= 1;
        let w = self.waiting.remove(&handle)?;
        queue.since_sum -= w.since_ms;
        queue.weight_sum -= w.weight();
        self.dropped(db, name);
        Some(w)
    }

    /// Takes a waiter out wherever it stands (its slot is skipped later).
    fn take(&mut self, handle: Handle) -> Option<Waiter> {
        let w = self.waiting.remove(&(handle as usize))?;
        let waiting = &self.waiting;
        let queue = self
            .queues
            .get_mut(&w.key.db)
            .and_then(|q| q.get_mut(&w.key.name[..]))
            .map(|q| &mut q[w.kind.index()]);
        if let Some(queue) = queue {
            queue.live -= 1;
            queue.since_sum -= w.since_ms;
            queue.weight_sum -= w.weight();
            // Leftover slots stay bounded by the live ones (amortised O(1)).
            if queue.slots.len() > 2 * queue.live + 32 {
                queue
                    .slots
                    .retain(|(h, s)| waiting.get(h).is_some_and(|x| x.seq == *s));
                queue.slots.shrink_to_fit();
            }
        }
        self.dropped(w.key.db, &w.key.name);
        Some(w)
    }

    /// Forgets a queue with nobody left in it; gives memory back.
    fn dropped(&mut self, db: c_int, name: &[u8]) {
        shrink(&mut self.waiting);
        let Some(queues) = self.queues.get_mut(&db) else {
            return;
        };
        if queues.get(name).is_some_and(|q| live(q) == 0) {
            queues.remove(name);
            shrink(queues);
            if queues.is_empty() {
                self.queues.remove(&db);
            }
        }
    }
}

/// The common case, answered without looking a key up.
fn nobody_waits() -> bool {
    with(|r| r.waiting.is_empty())
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

/// Waiters of `kind` queued on `name` in the selected database.
pub fn queued(ctx: &Context, name: &[u8], kind: &'static dyn Kind) -> usize {
    if nobody_waits() {
        return 0;
    }
    let db = selected_db(ctx.ctx);
    with(|r| r.queue(db, name).map_or(0, |q| q[kind.index()].live))
}

/// The summed weights of the waiters of `kind` queued on `name` (a rate
/// limiter's: the tokens they ask for), in O(1).
pub fn queued_weight(ctx: &Context, name: &[u8], kind: &'static dyn Kind) -> u64 {
    if nobody_waits() {
        return 0;
    }
    let db = selected_db(ctx.ctx);
    with(|r| r.queue(db, name).map_or(0, |q| q[kind.index()].weight_sum))
}

/// Load shedding (`QUEUE n`): whether a request that would queue on `name`
/// is answered at once instead, because `n` or more of its kind already wait.
/// Decided before anything is queued, so a shed request changes nothing.
pub fn shed(ctx: &Context, name: &[u8], kind: &'static dyn Kind, limit: Option<u64>) -> bool {
    let Some(limit) = limit else {
        return false;
    };
    let shed = queued(ctx, name, kind) as u64 >= limit;
    if shed {
        stats::SHED.add(1);
    }
    shed
}

/// Whether waiters of another kind are queued on `name`: a request that
/// finds the key free lets them be served first (they were there when it
/// was freed; their turn may still be on its way from the next tick).
pub fn others_queued(ctx: &Context, name: &[u8], kind: &'static dyn Kind) -> bool {
    if nobody_waits() {
        return false;
    }
    let db = selected_db(ctx.ctx);
    let k = kind.index();
    with(|r| {
        r.queue(db, name)
            .is_some_and(|q| q.iter().enumerate().any(|(i, q)| i != k && q.live > 0))
    })
}

/// All clients waiting, on every key.
pub fn total_waiting() -> usize {
    with(|r| r.waiting.len())
}

/// One key and kind with clients waiting, as `WARDEN.CONTENDED` reports it.
#[derive(Debug, PartialEq, Eq)]
pub struct Contention {
    pub db: c_int,
    pub name: Vec<u8>,
    /// What its waiters wait for: `lock`, `rwlock` or `cache`.
    pub kind: &'static str,
    pub waiters: usize,
    pub oldest_wait_ms: i64,
    pub total_wait_ms: i64,
}

/// The `n` keys with the most clients waiting now (ties: the longest wait,
/// then the name). One pass over the contended keys; the memory it takes is
/// bounded by `n`, whatever their number.
pub fn contended(n: usize) -> Vec<Contention> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let now = now_ms();
    with(|r| {
        // The best `n` so far, the worst of them on top (Reverse: a min-heap).
        let mut best = BinaryHeap::with_capacity(n.min(r.waiting.len()) + 1);
        for (&db, names) in &r.queues {
            for (name, queues) in names {
                for queue in queues.iter().filter(|q| q.live > 0) {
                    let head = queue
                        .slots
                        .iter()
                        .find_map(|(h, s)| r.waiting.get(h).filter(|w| w.seq == *s));
                    let oldest = head.map_or(0, |w| now - w.since_ms);
                    let kind = head.map_or("", |w| w.kind.name());
                    let rank = (queue.live, oldest, Reverse((&name[..], db, kind)));
                    best.push(Reverse((rank, queue.since_sum)));
                    if best.len() > n {
                        best.pop();
                    }
                }
            }
        }
        best.into_sorted_vec()
            .into_iter()
            .map(
                |Reverse(((live, oldest, Reverse((name, db, kind))), since_sum))| Contention {
                    db,
                    name: name.to_vec(),
                    kind,
                    waiters: live,
                    oldest_wait_ms: oldest.max(0),
                    total_wait_ms: (live as i64 * now - since_sum).max(0),
                },
            )
            .collect()
    })
}

/// Whether `CLIENT UNBLOCK` may end a wait: only where Redis' timeout path
/// never drops a reply already handed over (Redis 7.4+, Valkey 8+); set at load.
static UNBLOCK_ENDS_WAIT: AtomicBool = AtomicBool::new(false);

pub fn unblock_ends_wait() -> bool {
    UNBLOCK_ENDS_WAIT.load(Ordering::Relaxed)
}

/// Blocks the calling client at the tail of `name`'s queue (timeout 0:
/// forever); it will be answered when served, at its deadline, or never if
/// it disconnects.
pub fn block(ctx: &Context, name: &[u8], mut waiter: Waiter, timeout_ms: i64) {
    let handle = block_client(ctx);
    waiter.handle = handle;
    waiter.client_id = unsafe { raw::RedisModule_GetClientId.unwrap()(ctx.ctx) };
    waiter.key = queue_key(ctx.ctx, name);
    waiter.since_ms = now_ms();
    if timeout_ms > 0 {
        waiter.deadline_ms = waiter.since_ms.saturating_add(timeout_ms);
        let data = handle.cast::<c_void>();
        waiter.timer = Some(unsafe {
            raw::RedisModule_CreateTimer.unwrap()(ctx.ctx, timeout_ms, Some(on_deadline), data)
        });
    }
    with(|r| {
        r.next_seq += 1;
        waiter.seq = r.next_seq;
        let slot = (handle as usize, waiter.seq);
        let queues = r.queues.entry(waiter.key.db).or_default();
        if !queues.contains_key(name) {
            queues.insert(name.to_vec(), Queues::default());
        }
        if let Some(all) = queues.get_mut(name) {
            let queue = &mut all[waiter.kind.index()];
            queue.slots.push_back(slot);
            queue.live += 1;
            queue.since_sum += waiter.since_ms;
            queue.weight_sum += waiter.weight();
        }
        r.waiting.insert(handle as usize, waiter);
    });
}

/// Blocks the calling client, to be answered through [`deliver`] or [`held`]
/// (Redis' timeout 0: every deadline is a module timer of warden's).
fn block_client(ctx: &Context) -> Handle {
    let timeout_cb: raw::RedisModuleCmdFunc = if unblock_ends_wait() {
        Some(on_timeout)
    } else {
        None
    };
    let handle = unsafe {
        raw::RedisModule_BlockClient.unwrap()(
            ctx.ctx,
            Some(on_reply),
            timeout_cb,
            Some(free_in_flight),
            0,
        )
    };
    unsafe { raw::RedisModule_SetDisconnectCallback.unwrap()(handle, Some(on_disconnect)) };
    handle
}

/// Takes the oldest waiter off `name`'s queue of `kind` if `fits` accepts it.
/// Heads whose deadline passed are answered nil first. The caller answers the
/// waiter with [`answer`].
pub fn pop_head(
    ctx: &Context,
    name: &[u8],
    kind: &'static dyn Kind,
    fits: impl Fn(&Waiter) -> bool,
) -> Option<Waiter> {
    if nobody_waits() {
        return None;
    }
    let db = selected_db(ctx.ctx);
    loop {
        let now = now_ms();
        let k = kind.index();
        let found = with(|r| {
            let head = r.head(db, name, k)?;
            if head.deadline_ms <= now {
                return r.pop_head(db, name, k).map(Err);
            }
            if !fits(head) {
                return None;
            }
            r.pop_head(db, name, k).map(Ok)
        });
        match found? {
            Ok(w) => return Some(w),
            Err(late) => time_out(ctx.ctx, late),
        }
    }
}

/// What `look` makes of the oldest live waiter of `kind` on `name`, if any.
pub fn peek<T>(
    ctx: &Context,
    name: &[u8],
    kind: &'static dyn Kind,
    look: impl FnOnce(&Waiter) -> T,
) -> Option<T> {
    if nobody_waits() {
        return None;
    }
    let db = selected_db(ctx.ctx);
    with(|r| r.head(db, name, kind.index()).map(look))
}

/// Lets `change` rewrite the request of every waiter of `kind` on `name`
/// (its place in the queue stays).
pub fn update(
    ctx: &Context,
    name: &[u8],
    kind: &'static dyn Kind,
    mut change: impl FnMut(&mut Waiter),
) {
    if nobody_waits() {
        return;
    }
    let db = selected_db(ctx.ctx);
    with(|r| {
        let Some(queues) = r.queues.get(&db).and_then(|q| q.get(name)) else {
            return;
        };
        for (h, s) in &queues[kind.index()].slots {
            if let Some(w) = r.waiting.get_mut(h).filter(|w| w.seq == *s) {
                change(w);
            }
        }
    });
}

/// Takes every waiter of `kind` that `wanted` accepts off `name`'s queue,
/// oldest first, wherever they stand. The caller answers them. Those whose
/// deadline passed (the timer has not fired yet: the server was busy) are
/// answered nil here instead: nothing reaches a waiter after its deadline.
pub fn drain(
    ctx: &Context,
    name: &[u8],
    kind: &'static dyn Kind,
    wanted: impl Fn(&Waiter) -> bool,
) -> Vec<Waiter> {
    if nobody_waits() {
        return Vec::new();
    }
    let db = selected_db(ctx.ctx);
    let now = now_ms();
    let (late, taken): (Vec<Waiter>, Vec<Waiter>) = with(|r| {
        let Some(queues) = r.queue(db, name) else {
            return (Vec::new(), Vec::new());
        };
        let chosen: Vec<usize> = queues[kind.index()]
            .slots
            .iter()
            .filter(|(h, s)| r.waiting.get(h).is_some_and(|w| w.seq == *s && wanted(w)))
            .map(|&(h, _)| h)
            .collect();
        chosen
            .into_iter()
            .filter_map(|h| r.take(h as Handle))
            .partition(|w| w.deadline_ms <= now)
    });
    for waiter in late {
        time_out(ctx.ctx, waiter);
    }
    taken
}

/// `WARDEN.WITHDRAW`: takes every waiter of `owner` still queued on `name`
/// (any kind; kinds without an owner never match a valid one) out of its
/// queue, wherever it stands, and answers it as at its deadline. Returns how
/// many. Invariant: a withdrawn waiter is answered here, once, and never
/// granted; a grant already decided (in flight, or held for the replicas) is
/// not in any queue, so it is not touched.
pub fn withdraw(ctx: &Context, name: &[u8], owner: &[u8]) -> usize {
    if nobody_waits() {
        return 0;
    }
    let db = selected_db(ctx.ctx);
    let taken: Vec<Waiter> = with(|r| {
        let Some(queues) = r.queue(db, name) else {
            return Vec::new();
        };
        let chosen: Vec<usize> = queues
            .iter()
            .flat_map(|q| q.slots.iter())
            .filter(|(h, s)| {
                r.waiting
                    .get(h)
                    .is_some_and(|w| w.seq == *s && w.owner == owner)
            })
            .map(|&(h, _)| h)
            .collect();
        chosen
            .into_iter()
            .filter_map(|h| r.take(h as Handle))
            .collect()
    });
    let n = taken.len();
    for waiter in taken {
        let q = waiter.key.clone();
        time_out(ctx.ctx, waiter);
        drop_lease_timer(ctx.ctx, &q);
        // The head may have changed: those behind may be served now.
        mark_dirty(ctx.ctx, q);
    }
    n
}

/// Answers a waiter taken off its queue (a grant, nil or an error). Redis
/// writes it before the client runs anything else.
pub fn answer(ctx: &Context, waiter: Waiter, answer: Answer) {
    if matches!(answer, Answer::Integer(_)) {
        stats::HANDOFFS.add(1);
    }
    deliver(ctx.ctx, waiter, answer);
}

/// The one place a decided answer leaves: exactly one `UnblockClient` per
/// handle, now or — for a grant that waits for the replicas — once they
/// acknowledged it or it was taken back ([`held`]).
fn deliver(ctx: Ctx, waiter: Waiter, answer: Answer) {
    waiter.ended(now_ms());
    if let Some(id) = waiter.timer {
        stop_timer(ctx, id);
    }
    let grant = answer.token().map(|t| (waiter.kind, waiter.key, t));
    // Lock kinds' grants (integers) wait for the replicas; cache leases are
    // neither replicated nor kept across a failover.
    let waits = grant.is_some()
        && matches!(answer, Answer::Integer(_) | Answer::Decision { .. })
        && acks::required();
    if waits {
        // Not acknowledged in time: a limiter's grant is answered busy
        // (limited, nothing taken), as the command's own grant is; the
        // other kinds' busy answer is their nil.
        let otherwise = match &answer {
            Answer::Decision { words, .. } => Answer::Decision {
                grant: None,
                words: [1, words[1], 0, 0, 0],
            },
            _ => waiter.kind.timed_out(),
        };
        let in_flight = Box::into_raw(Box::new(InFlight { answer, grant }));
        held::hold(ctx, waiter.handle, in_flight, otherwise, waiter.deadline_ms);
        return;
    }
    unblock(
        waiter.handle,
        Box::into_raw(Box::new(InFlight { answer, grant })),
    );
}

/// Hands a decided answer to Redis, which writes it in this turn's beforeSleep.
fn unblock(handle: Handle, in_flight: *mut InFlight) {
    // Safety: ours until Redis frees it (`free_in_flight`).
    let grant = unsafe { (*in_flight).grant.is_some() };
    // Only a server with replicas (or one that forked: they may come) has a
    // next master a taken-back grant must reach.
    let granting = grant && crate::keyspace::effects_listened();
    if granting {
        let first = with(|r| {
            r.in_flight.insert(in_flight as usize);
            r.in_flight.len() == 1
        });
        if first {
            watch_role_changes(true);
        }
        GRANTS_IN_FLIGHT.store(true, Ordering::Relaxed);
    }
    unsafe { raw::RedisModule_UnblockClient.unwrap()(handle, in_flight.cast::<c_void>()) };
}

/// A waiter whose deadline passed (taken off its queue): its kind's nil.
fn time_out(ctx: Ctx, waiter: Waiter) {
    stats::WAIT_TIMEOUTS.add(1);
    let answer = waiter.kind.timed_out();
    deliver(ctx, waiter, answer);
}

/// Writes an answer to the client of the running callback.
fn reply(ctx: Ctx, answer: &Answer) {
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
        Answer::Redirect(text) => {
            let line = std::ffi::CString::new(text.as_str()).unwrap_or_default();
            unsafe { raw::RedisModule_ReplyWithError.unwrap()(ctx, line.as_ptr()) };
        }
        Answer::Decision { words, .. } => {
            raw::reply_with_array(ctx, words.len() as _);
            for w in words {
                raw::reply_with_long_long(ctx, *w);
            }
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
    let db = selected_db(ctx.ctx);
    let fire_at = deadline_ms.saturating_add(1);
    // The common case (a timer fires no later already) allocates nothing.
    let stale = with(|r| {
        r.queue(db, name)?;
        match r.lease_timers.get(&db).and_then(|t| t.get(name)) {
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
    let q = QueueKey {
        db,
        name: name.to_vec(),
    };
    let data = Box::into_raw(Box::new(q)).cast::<c_void>();
    let id =
        unsafe { raw::RedisModule_CreateTimer.unwrap()(ctx.ctx, delay, Some(on_lease_end), data) };
    with(|r| {
        r.lease_timers
            .entry(db)
            .or_default()
            .insert(name.to_vec(), (id, fire_at))
    });
}

/// Forgets the lease timer of `q` (it fired, or is being stopped).
fn forget_lease_timer(r: &mut Registry, q: &QueueKey) -> Option<TimerId> {
    let timers = r.lease_timers.get_mut(&q.db)?;
    let (id, _) = timers.remove(&q.name[..])?;
    shrink(timers);
    if timers.is_empty() {
        r.lease_timers.remove(&q.db);
    }
    Some(id)
}

/// Stops a waiter's deadline timer (its data is the handle, nothing to free).
fn stop_timer(ctx: Ctx, id: TimerId) {
    unsafe { raw::RedisModule_StopTimer.unwrap()(ctx, id, ptr::null_mut()) };
}

/// Stops a lease timer and frees the key it carried.
fn stop_lease_timer(ctx: Ctx, id: TimerId) {
    let mut data: *mut c_void = ptr::null_mut();
    let stopped = unsafe { raw::RedisModule_StopTimer.unwrap()(ctx, id, &mut data) };
    if stopped == raw::REDISMODULE_OK as c_int && !data.is_null() {
        drop(unsafe { Box::from_raw(data.cast::<QueueKey>()) });
    }
}

/// Drops a key's lease timer once nobody waits on it any more.
fn drop_lease_timer(ctx: Ctx, q: &QueueKey) {
    let timer = with(|r| {
        if r.queue(q.db, &q.name).is_some() {
            return None;
        }
        forget_lease_timer(r, q)
    });
    if let Some(id) = timer {
        stop_lease_timer(ctx, id);
    }
}

/// Marks a key to be served on the next tick.
pub fn mark_dirty(ctx: Ctx, q: QueueKey) {
    with(|r| r.dirty.insert(q));
    arm_tick(ctx, 0);
}

fn arm_tick(ctx: Ctx, delay_ms: i64) {
    if with(|r| r.tick.is_some()) {
        return;
    }
    let id = unsafe {
        raw::RedisModule_CreateTimer.unwrap()(ctx, delay_ms, Some(on_tick), ptr::null_mut())
    };
    with(|r| r.tick = Some(id));
}

/// Marks every key with waiters (after a flush, `SWAPDB`, a reload, or the
/// end of a window in which nothing was granted).
pub fn mark_all_dirty(ctx: Ctx) {
    let keys: Vec<QueueKey> = with(|r| {
        r.queues
            .iter()
            .flat_map(|(&db, names)| {
                names.keys().map(move |name| QueueKey {
                    db,
                    name: name.clone(),
                })
            })
            .collect()
    });
    for q in keys {
        mark_dirty(ctx, q);
    }
}

/// Serves the queue of `name`: answers nil to heads whose deadline passed,
/// then lets the head's kind grant what it can, until the head must wait.
pub fn serve(ctx: &Context, name: &Arg) {
    if nobody_waits() {
        return;
    }
    let q = queue_key(ctx.ctx, name);
    if grants_held() {
        // Taking a grant back while writes are paused: nobody new is granted
        // until they resume (the next tick serves the key).
        with(|r| r.dirty.insert(q));
        return;
    }
    serve_queue(ctx, &q, name);
}

/// Set while undelivered grants are taken back with writes paused (a
/// static: a thread-local costs a call on every hand-off in a shared library).
static GRANTS_HELD: AtomicBool = AtomicBool::new(false);

/// Whether kinds must grant nothing now (a grant is being taken back while
/// writes are paused: deleting a live hold is safe then, granting is not).
pub fn grants_held() -> bool {
    GRANTS_HELD.load(Ordering::Relaxed)
}

/// Takes back a grant that never reached its client, on this master, now —
/// also while writes are paused: a `FAILOVER` or `REPLICAOF` right after must
/// not hand the grant to the next master. A replica takes nothing back: its
/// master's effects decide.
fn take_back(ctx: &Context, (kind, q, token): (&'static dyn Kind, QueueKey, i64)) {
    if ctx.get_flags().contains(ContextFlags::SLAVE) {
        return;
    }
    let paused = unsafe { raw::RedisModule_AvoidReplicaTraffic.unwrap()() } != 0;
    GRANTS_HELD.store(paused, Ordering::Relaxed);
    select_db(ctx, q.db);
    let name = RedisString::create_from_slice(ctx.ctx, &q.name);
    kind.revoke(ctx, Arg::of(&name), token);
    GRANTS_HELD.store(false, Ordering::Relaxed);
    with(|r| r.dirty.insert(q));
}

/// Serves each kind's queue of the key in turn.
fn serve_queue(ctx: &Context, q: &QueueKey, name: &Arg) {
    for kind in 0..KINDS {
        serve_kind(ctx, q, name, kind);
    }
    drop_lease_timer(ctx.ctx, q);
}

fn serve_kind(ctx: &Context, q: &QueueKey, name: &Arg, k: usize) {
    loop {
        let now = now_ms();
        let head = with(|r| {
            let head = r.head(q.db, &q.name, k)?;
            if head.deadline_ms <= now {
                return r.pop_head(q.db, &q.name, k).map(Err);
            }
            Some(Ok(head.kind))
        });
        match head {
            None => return,
            Some(Err(late)) => time_out(ctx.ctx, late),
            Some(Ok(kind)) => match kind.serve(ctx, name) {
                Served::Progress => {}
                Served::Wait(until) => {
                    if let Some(at) = until {
                        watch_lease(ctx, name, at);
                    }
                    return;
                }
                Served::WrongType => {
                    if let Some(w) = with(|r| r.pop_head(q.db, &q.name, k)) {
                        deliver(ctx.ctx, w, Answer::Error(error::WRONGTYPE));
                    }
                }
            },
        }
    }
}

/// Serves dirty keys — unless writes must wait (then it tries again shortly).
fn tick(ctx: &Context) {
    with(|r| r.tick = None);
    crate::cache::filter::decide();
    if !may_write(ctx) {
        let replica = ctx.get_flags().contains(ContextFlags::SLAVE);
        if replica {
            // Replicas never grant nor take back: the master's effects decide.
            with(|r| {
                r.dirty.clear();
                r.unacked.clear();
            });
        } else if with(|r| !r.dirty.is_empty() || !r.unacked.is_empty()) {
            arm_tick(ctx.ctx, PAUSED_RETRY_MS);
        }
        return;
    }
    for grant in with(|r| std::mem::take(&mut r.unacked)) {
        take_back(ctx, grant);
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

/// Removes a still-queued waiter (`CLIENT UNBLOCK`, a disconnect): the waiter,
/// if it was queued.
fn leave(ctx: Ctx, handle: Handle) -> Option<Waiter> {
    let mut w = with(|r| r.take(handle))?;
    w.ended(now_ms());
    if let Some(id) = w.timer.take() {
        stop_timer(ctx, id);
    }
    drop_lease_timer(ctx, &w.key);
    // The head may have changed: readers behind a departed writer may go.
    mark_dirty(ctx, w.key.clone());
    Some(w)
}

/// Answers every queued waiter with `answer_of(kind)` (this server stops
/// granting: it became a replica).
fn answer_everyone(ctx: Ctx, answer_of: impl Fn(&'static dyn Kind) -> Answer) {
    let all: Vec<Waiter> = with(|r| {
        r.queues.clear();
        r.dirty.clear();
        let all = r.waiting.drain().map(|(_, w)| w).collect();
        r.waiting.shrink_to_fit();
        all
    });
    for w in all {
        let answer = answer_of(w.kind);
        deliver(ctx, w, answer);
    }
    held::answer_all(error::READONLY);
    with(|r| r.unacked.clear());
    let timers: Vec<TimerId> = with(|r| {
        r.lease_timers
            .drain()
            .flat_map(|(_, t)| t.into_values().map(|(id, _)| id))
            .collect()
    });
    for id in timers {
        stop_lease_timer(ctx, id);
    }
}

/// The slots of `slots` now belong to another node: every waiter on one of
/// their keys is answered `MOVED` at once. Their keys are deleted next, and
/// serving the queues then would grant each key here while the new owner
/// has its holders. Nothing new queues on those keys: the server redirects
/// their commands before they run.
fn slots_moved(ctx: Ctx, slots: &crate::migration::Slots) {
    let moved = |q: &QueueKey| slots.has_key(&q.name);
    if !with(|r| r.waiting.values().any(|w| moved(&w.key))) {
        return;
    }
    let owners = crate::migration::owners(&Context::new(ctx));
    let leaving: Vec<Waiter> = with(|r| {
        let handles: Vec<usize> = r
            .waiting
            .iter()
            .filter(|(_, w)| moved(&w.key))
            .map(|(&h, _)| h)
            .collect();
        handles
            .into_iter()
            .filter_map(|h| r.take(h as Handle))
            .collect()
    });
    for w in leaving {
        let slot = crate::migration::key_slot(&w.key.name);
        deliver(
            ctx,
            w,
            Answer::Redirect(crate::migration::redirect(&owners, slot)),
        );
    }
}

extern "C" fn on_reply(ctx: Ctx, _argv: *mut *mut raw::RedisModuleString, _argc: c_int) -> c_int {
    guard::callback(raw::REDISMODULE_OK as c_int, || {
        let in_flight = unsafe { raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx) }
            .cast::<InFlight>();
        match unsafe { in_flight.as_ref() } {
            Some(f) => reply(ctx, &f.answer),
            None => {
                raw::reply_with_null(ctx);
            }
        }
        raw::REDISMODULE_OK as c_int
    })
}

/// Registered only where `CLIENT UNBLOCK` cannot reach a handed-over answer
/// (Redis 7.4+, Valkey 8+): a user's `CLIENT UNBLOCK` of a queued waiter.
extern "C" fn on_timeout(ctx: Ctx, _argv: *mut *mut raw::RedisModuleString, _argc: c_int) -> c_int {
    guard::callback(raw::REDISMODULE_OK as c_int, || {
        let handle = unsafe { raw::RedisModule_GetBlockedClientHandle.unwrap()(ctx) };
        match leave(ctx, handle) {
            Some(w) => {
                stats::WAIT_TIMEOUTS.add(1);
                reply(ctx, &w.kind.timed_out());
                // Redis unblocks the client; the handle still needs its one UnblockClient.
                unsafe { raw::RedisModule_UnblockClient.unwrap()(handle, ptr::null_mut()) };
            }
            // A grant waiting for the replicas: taken back, answered busy.
            None => match held::give_up(ctx, handle) {
                Some(otherwise) => {
                    reply(ctx, &otherwise);
                    unsafe { raw::RedisModule_UnblockClient.unwrap()(handle, ptr::null_mut()) };
                }
                None => {
                    raw::reply_with_null(ctx);
                }
            },
        }
        raw::REDISMODULE_OK as c_int
    })
}

/// The client left while blocked: a queued waiter leaves its queue; an answer
/// already handed over is dropped by Redis, and a grant in it is revoked.
extern "C" fn on_disconnect(ctx: Ctx, handle: Handle) {
    guard::callback((), || {
        if leave(ctx, handle).is_some() || held::give_up(ctx, handle).is_some() {
            unsafe { raw::RedisModule_UnblockClient.unwrap()(handle, ptr::null_mut()) };
            return;
        }
        let in_flight = unsafe { raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx) }
            .cast::<InFlight>();
        // Safety: ours, alive until Redis calls `free_in_flight`.
        if let Some(f) = unsafe { in_flight.as_mut() } {
            if let Some(grant) = f.grant.take() {
                // Taken back at once, inside whatever disconnected the client
                // (a `CLIENT KILL` pipelined before a `FAILOVER` or
                // `REPLICAOF`): replicated before the role can change.
                take_back(&Context::new(ctx), grant);
                arm_tick(ctx, 0);
            }
        }
    })
}

extern "C" fn free_in_flight(_ctx: Ctx, data: *mut c_void) {
    if !data.is_null() {
        if GRANTS_IN_FLIGHT.load(Ordering::Relaxed) {
            let last = with(|r| {
                r.in_flight.remove(&(data as usize)) && r.in_flight.is_empty() && {
                    shrink_set(&mut r.in_flight);
                    true
                }
            });
            if last {
                GRANTS_IN_FLIGHT.store(false, Ordering::Relaxed);
                watch_role_changes(false);
            }
        }
        drop(unsafe { Box::from_raw(data.cast::<InFlight>()) });
    }
}

fn shrink_set(set: &mut FxHashSet<usize>) {
    if set.capacity() > 64 {
        set.shrink_to_fit();
    }
}

/// Set while `in_flight` holds a grant (the filter is registered then).
static GRANTS_IN_FLIGHT: AtomicBool = AtomicBool::new(false);

/// The answer of a waiter whose grant was taken back because the server is
/// about to follow another master (written only if that command then fails:
/// otherwise Redis answers `-UNBLOCKED` itself).
const GRANT_TAKEN_BACK: &str =
    "UNBLOCKED the grant was taken back: the instance is becoming a replica";

/// The command filter that sees a `REPLICAOF` coming, registered only while
/// grants are on their way to their clients (from a hand-off until Redis
/// has written or dropped its reply, within the same event-loop turn) on a
/// server whose effects reach replicas. The rest of the time the server's
/// commands pass no filter of warden's.
struct RoleFilter(*mut raw::RedisModuleCommandFilter);

// Safety: only the main thread registers, reads and unregisters it.
unsafe impl Send for RoleFilter {}

static ROLE_FILTER: std::sync::Mutex<RoleFilter> =
    std::sync::Mutex::new(RoleFilter(ptr::null_mut()));

fn watch_role_changes(on: bool) {
    let Ok(mut filter) = ROLE_FILTER.lock() else {
        return;
    };
    let ctx = events::detached();
    match (on, filter.0.is_null()) {
        (true, true) => {
            // NOSELF: warden's own calls (the take-back's, `follow`'s
            // look-up of a renamed command) do not pass it again.
            let flags = raw::REDISMODULE_CMDFILTER_NOSELF as c_int;
            filter.0 = unsafe {
                raw::RedisModule_RegisterCommandFilter.unwrap()(ctx, Some(on_command), flags)
            };
        }
        (false, false) => {
            unsafe { raw::RedisModule_UnregisterCommandFilter.unwrap()(ctx, filter.0) };
            filter.0 = ptr::null_mut();
        }
        _ => {}
    }
}

/// Invariant — a grant cut off by a role change is taken back on the server
/// that becomes master:
/// - `REPLICAOF host port` (and `CLUSTER REPLICATE`) run inside a command:
///   Redis unblocks our waiters (`disconnectAllBlockedClients`, which drops a
///   grant on its way and calls `on_disconnect`) while still a master, but a
///   write made there is only queued (`alsoPropagate`) and propagated when
///   the command ends, after `masterhost` is set: `propagateNow` →
///   `shouldPropagate` then drops it (7.0, 7.2+, Valkey alike). Nothing lets
///   a module propagate at once from inside a command (a thread-safe
///   context's lock is the main thread's own GIL).
/// - So the take-back happens before the command runs: this filter sees it
///   first (`processCommand`, outside any execution unit; under whatever
///   name the server knows it by, `crate::follow`), takes every grant
///   still on its way back (nothing new is granted meanwhile), turns its
///   answer into an error, and flushes the effects to replicas and the AOF
///   with a module call (its end propagates what is pending: 7.0 through
///   `moduleFreeContext`, 7.2+ through `postExecutionUnitOperations`).
/// - Left to `on_disconnect` (and lost on the next master): a `REPLICAOF`
///   inside `MULTI`/`EXEC` after a hand-off in the same transaction, or one
///   sent from a script or another module's call.
extern "C" fn on_command(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    if !GRANTS_IN_FLIGHT.load(Ordering::Relaxed) {
        return;
    }
    guard::callback((), || {
        // While writes are paused an effect must not be propagated (Redis
        // asserts): the take-back is left to `on_disconnect` then.
        let paused = unsafe { raw::RedisModule_AvoidReplicaTraffic.unwrap()() } != 0;
        if !paused && crate::follow::changes_master(fctx) && !crate::keyspace::maybe_replica() {
            take_back_in_flight();
        }
    })
}

/// Takes back every grant on its way to a client, with nothing granted in
/// its place, and sends the effects on before the role can change.
fn take_back_in_flight() {
    let ctx = events::detached();
    let mut taken = false;
    // A kind that hands a taken-back grant on (read-write locks) adds to
    // the list: again until no grant is on its way (each waiter once).
    while let Some(p) = with(|r| {
        r.in_flight
            .iter()
            .copied()
            // Safety: listed only until Redis frees it (`free_in_flight`).
            .find(|&p| unsafe { (*(p as *const InFlight)).grant.is_some() })
    }) {
        // Safety: listed only until Redis frees it (`free_in_flight`).
        let f = unsafe { &mut *(p as *mut InFlight) };
        let Some((kind, q, token)) = f.grant.take() else {
            continue;
        };
        f.answer = Answer::Error(GRANT_TAKEN_BACK);
        let c = Context::new(ctx);
        GRANTS_HELD.store(true, Ordering::Relaxed);
        select_db(&c, q.db);
        let name = RedisString::create_from_slice(ctx, &q.name);
        kind.revoke(&c, Arg::of(&name), token);
        GRANTS_HELD.store(false, Ordering::Relaxed);
        with(|r| r.dirty.insert(q));
        taken = true;
    }
    if !taken {
        return;
    }
    // Propagates the pending effects now, while this server is a master.
    let reply =
        unsafe { raw::RedisModule_Call.unwrap()(ctx, c"WARDEN.CONTENDED".as_ptr(), c"!".as_ptr()) };
    if !reply.is_null() {
        unsafe { raw::RedisModule_FreeCallReply.unwrap()(reply) };
    }
    // Should the command fail, the keys are served again.
    arm_tick(ctx, 0);
}

extern "C" fn on_tick(ctx: Ctx, _data: *mut c_void) {
    guard::callback((), || tick(&Context::new(ctx)))
}

/// A waiter's deadline: answered nil, whatever the state of the key.
extern "C" fn on_deadline(ctx: Ctx, data: *mut c_void) {
    guard::callback((), || {
        let handle = data.cast::<raw::RedisModuleBlockedClient>();
        let Some(mut w) = with(|r| r.take(handle)) else {
            return;
        };
        w.timer = None; // this timer has fired
        let q = w.key.clone();
        time_out(ctx, w);
        drop_lease_timer(ctx, &q);
        // Readers behind a timed-out writer may go now.
        mark_dirty(ctx, q);
    })
}

extern "C" fn on_lease_end(ctx: Ctx, data: *mut c_void) {
    guard::callback((), || {
        let q = *unsafe { Box::from_raw(data.cast::<QueueKey>()) };
        with(|r| forget_lease_timer(r, &q));
        mark_dirty(ctx, q);
    })
}

/// A key of a lock kind left the keyspace (its type's `unlink` callback): if
/// anyone waits on it, it is served on the next tick.
pub fn key_removed(db: c_int, name: &[u8]) {
    if nobody_waits() || with(|r| r.queue(db, name).is_none()) {
        return;
    }
    let q = QueueKey {
        db,
        name: name.to_vec(),
    };
    mark_dirty(events::detached(), q);
}

fn on_server(ctx: Ctx, event: &Server) {
    match event {
        Server::Flushed { .. } | Server::Swapped { .. } | Server::Loaded => mark_all_dirty(ctx),
        // A replica never grants: its waiters learn at once (Valkey 9 leaves
        // module waiters blocked across a role change).
        Server::Role { master: false } => answer_everyone(ctx, |_| Answer::Error(error::READONLY)),
        Server::SlotsMoved { slots } => slots_moved(ctx, slots),
        Server::Role { master: true }
        | Server::ClientGone { .. }
        | Server::LoadingAof
        | Server::LoadingSync => {}
    }
}

/// What the waiting core hears: flushes, `SWAPDB`, loads, role changes and
/// slots moved away (a key of its own leaving the keyspace arrives through `key_removed`).
pub static EVENTS: Listener = Listener {
    key: events::ignore_key,
    server: on_server,
};

/// Decides at load whether `CLIENT UNBLOCK` may end a wait on this server.
pub fn init() -> bool {
    let version = unsafe { raw::RedisModule_GetServerVersion.map_or(0, |f| f()) };
    UNBLOCK_ENDS_WAIT.store(version >= 0x0007_0400, Ordering::Relaxed);
    true
}
