//! Grants waiting for the replicas' acknowledgements (`warden.sync-replicas`,
//! `crate::acks`): the client stays blocked with its answer decided, until
//! `acks` sees N replicas past the grant's offset, or the grant is taken back.
//!
//! Invariant — exactly one answer per held grant, never a grant unacknowledged:
//! - a held client leaves by exactly one of: [`answer_acknowledged`] (its
//!   grant, acknowledged), [`on_unacked`] (its deadline: `sync-timeout` or the
//!   waiter's own `WAIT`, whichever ends first; the grant is taken back and
//!   the answer is busy), [`give_up`] (it disconnected, or a `CLIENT UNBLOCK`
//!   on 7.4+; the grant is taken back), or [`answer_all`] (the server became a
//!   replica: the grant is the new master's to keep or lose, the answer an
//!   error). Each removes the entry first, so a second way finds nothing;
//! - a take-back is written at once where the server accepts writes, else
//!   (clients paused: propagating then crashes the server) queued and done
//!   by the next tick that may write; the client is told busy either way,
//!   and the key holds the grant meanwhile, so nobody else is granted it.

use std::sync::atomic::AtomicUsize;

use super::*;

struct Held {
    /// The decided answer, and the grant to take back if it is not acknowledged.
    in_flight: *mut InFlight,
    /// What the client is told if the acknowledgements do not come in time.
    otherwise: Answer,
    /// The replication offset that carries the grant (set at the end of the
    /// turn that made it).
    target: Option<i64>,
    timer: TimerId,
}

thread_local! {
    static HELD: RefCell<FxHashMap<usize, Held>> = RefCell::new(FxHashMap::default());
}

/// How many grants wait (`INFO warden`'s `sync_waiting`; read on every turn).
static COUNT: AtomicUsize = AtomicUsize::new(0);

pub fn count() -> usize {
    COUNT.load(Ordering::Relaxed)
}

fn with_held<T>(f: impl FnOnce(&mut FxHashMap<usize, Held>) -> T) -> T {
    HELD.with(|h| {
        let mut held = h.borrow_mut();
        let out = f(&mut held);
        COUNT.store(held.len(), Ordering::Relaxed);
        if held.is_empty() && held.capacity() > 64 {
            held.shrink_to_fit();
        }
        out
    })
}

fn take(handle: Handle) -> Option<Held> {
    with_held(|h| h.remove(&(handle as usize)))
}

/// Keeps the blocked client `handle` with its decided grant until the
/// replicas acknowledge it, at most `sync-timeout` and never past `deadline_ms`.
pub(super) fn hold(
    ctx: Ctx,
    handle: Handle,
    in_flight: *mut InFlight,
    otherwise: Answer,
    deadline_ms: i64,
) {
    let delay = acks::timeout_ms().min(deadline_ms.saturating_sub(now_ms()).max(0));
    let data = handle.cast::<c_void>();
    let timer =
        unsafe { raw::RedisModule_CreateTimer.unwrap()(ctx, delay, Some(on_unacked), data) };
    let held = Held {
        in_flight,
        otherwise,
        target: None,
        timer,
    };
    with_held(|h| h.insert(handle as usize, held));
    acks::watch();
}

/// A command's own grant (`kind`'s `token` on `name`) or extend (no grant to
/// take back): answered now, or — while grants wait for replicas — once they
/// acknowledged it, within the request's own `WAIT` (`wait_ms`; None or 0:
/// `sync-timeout` alone), as for a grant handed to a queued waiter. The
/// command checked [`acks::check_can_wait`] before it changed anything.
pub fn reply(
    ctx: &Context,
    grant: Option<(&'static dyn Kind, &[u8], i64)>,
    answer: i64,
    otherwise: Answer,
    wait_ms: Option<i64>,
) -> redis_module::RedisResult {
    reply_answer(ctx, grant, Answer::Integer(answer), otherwise, wait_ms)
}

/// [`reply`] for any answer: an integer, or a rate limiter's decision.
pub fn reply_answer(
    ctx: &Context,
    grant: Option<(&'static dyn Kind, &[u8], i64)>,
    answer: Answer,
    otherwise: Answer,
    wait_ms: Option<i64>,
) -> redis_module::RedisResult {
    if !acks::required() {
        return Ok(match answer {
            Answer::Decision { words, .. } => redis_module::RedisValue::Array(
                words
                    .iter()
                    .map(|&w| redis_module::RedisValue::Integer(w))
                    .collect(),
            ),
            Answer::Integer(n) => redis_module::RedisValue::Integer(n),
            _ => redis_module::RedisValue::Null,
        });
    }
    let grant = grant.map(|(kind, name, token)| (kind, queue_key(ctx.ctx, name), token));
    if !can_block(ctx) {
        // Not reached (the command refused first); never answer unacknowledged.
        if let Some(grant) = grant {
            take_back(ctx, grant);
        }
        return Err(redis_module::RedisError::Str(error::SYNC_CANNOT_WAIT));
    }
    let handle = block_client(ctx);
    let in_flight = Box::into_raw(Box::new(InFlight { answer, grant }));
    // The deadline the request stated holds, whether the key was free or not.
    let deadline_ms = match wait_ms {
        Some(ms) if ms > 0 => now_ms().saturating_add(ms),
        _ => i64::MAX,
    };
    hold(ctx.ctx, handle, in_flight, otherwise, deadline_ms);
    Ok(redis_module::RedisValue::NoReply)
}

/// Gives every grant made since the last turn its offset: every write of
/// the turn (commands, timers, events) has been propagated by now.
pub fn assign_targets(offset: i64) {
    HELD.with(|h| {
        for held in h.borrow_mut().values_mut() {
            held.target.get_or_insert(offset);
        }
    });
}

/// The highest offset a held grant waits for.
pub fn newest_target() -> Option<i64> {
    HELD.with(|h| h.borrow().values().filter_map(|x| x.target).max())
}

/// Answers every held grant whose offset the replicas `reached`.
pub fn answer_acknowledged(ctx: Ctx, reached: Option<i64>) {
    let Some(reached) = reached else {
        return;
    };
    let done: Vec<(usize, Held)> = with_held(|h| {
        let ready: Vec<usize> = h
            .iter()
            .filter(|(_, x)| x.target.is_some_and(|t| t <= reached))
            .map(|(&k, _)| k)
            .collect();
        ready
            .into_iter()
            .filter_map(|k| h.remove(&k).map(|x| (k, x)))
            .collect()
    });
    for (handle, held) in done {
        stop_timer(ctx, held.timer);
        stats::SYNC_ACKED.add(1);
        unblock(handle as Handle, held.in_flight);
    }
}

/// Takes back what a held grant granted (now, or once writes resume) and
/// makes its answer the busy one. The caller answers the client.
fn take_back_held(ctx: Ctx, held: &mut Held) {
    // Safety: ours until Redis frees it (`free_in_flight`), and Redis has
    // not been handed it yet.
    let f = unsafe { &mut *held.in_flight };
    f.answer = std::mem::replace(&mut held.otherwise, Answer::Nil);
    let Some(grant) = f.grant.take() else {
        return;
    };
    let c = Context::new(ctx);
    if c.get_flags().contains(ContextFlags::SLAVE) {
        return;
    }
    if may_write(&c) {
        take_back(&c, grant);
        arm_tick(ctx, 0);
    } else {
        with(|r| r.unacked.push(grant));
        arm_tick(ctx, PAUSED_RETRY_MS);
    }
}

/// `sync-timeout` (or the waiter's deadline) passed before the acknowledgements.
extern "C" fn on_unacked(ctx: Ctx, data: *mut c_void) {
    guard::callback((), || {
        let handle = data.cast::<raw::RedisModuleBlockedClient>();
        let Some(mut held) = take(handle) else {
            return;
        };
        stats::SYNC_TIMEOUTS.add(1);
        take_back_held(ctx, &mut held);
        unblock(handle, held.in_flight);
    })
}

/// The client of a held grant left (a disconnect) or was unblocked (7.4+):
/// the grant is taken back; the busy answer, for the caller to write where
/// it can. None if `handle` holds no grant.
pub(super) fn give_up(ctx: Ctx, handle: Handle) -> Option<Answer> {
    let mut held = take(handle)?;
    stop_timer(ctx, held.timer);
    take_back_held(ctx, &mut held);
    // Safety: ours; Redis was never handed it, so it will not free it.
    let f = unsafe { Box::from_raw(held.in_flight) };
    Some(f.answer)
}

/// This server became a replica: every held grant is answered the error
/// `text`, untaken (a replica writes nothing; the new master's data decides).
pub(super) fn answer_all(text: &'static str) {
    let all: Vec<(usize, Held)> = with_held(|h| h.drain().collect());
    let ctx = events::detached();
    for (handle, held) in all {
        stop_timer(ctx, held.timer);
        // Safety: ours, not yet handed to Redis.
        let f = unsafe { &mut *held.in_flight };
        f.grant = None;
        f.answer = Answer::Error(text);
        unblock(handle as Handle, held.in_flight);
    }
}
