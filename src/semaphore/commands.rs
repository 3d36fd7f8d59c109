//! `SEM.*`: parse, open the key, apply the pure rules, reply, replicate the
//! changed holds.
//!
//! Invariants kept here:
//! - at most `limit` permits held: every grant goes through
//!   `Semaphore::request` or [`grant_waiting`], both of which grant only what
//!   fits;
//! - strict FIFO: a request is granted at once only when nobody of this kind
//!   waits on the key; waiters are granted from the head only, and the first
//!   that does not fit stops the pass (no smaller request overtakes it);
//! - one reply per request: a waiter is answered only through
//!   `waiters::answer`, after it was taken off its queue.

use redis_module::{Context, RedisError, RedisResult, RedisValue};

use crate::acks;
use crate::args;
use crate::command::Arg;
use crate::datatypes::store;
use crate::error;
use crate::evicted;
use crate::fence::FENCES;
use crate::grace;
use crate::keyspace::{
    effects_needed, effects_only, notify, now_ms, refuse_on_replica, replicate_del, Key,
};
use crate::reply::{self, Field};
use crate::semaphore::datatype::{effect_words, valid_header, valid_hold, SEM_EFFECT, SEM_TYPE};
use crate::semaphore::state::{Gate, Hold, Outcome, Semaphore};
use crate::stats;
use crate::waiters::{self, held, Answer, Kind, Mode, Served, Waiter};

fn err(text: &'static str) -> RedisError {
    RedisError::Str(text)
}

/// The semaphore in `key`. The key's expiry is put back to the latest lease
/// end when it was lost (`PERSIST`, `RESTORE` without a ttl) or lies beyond
/// it (`PEXPIRE`): it never keeps the key longer than its holds.
pub(crate) fn sem_in(key: &Key) -> Result<Option<&mut Semaphore>, RedisError> {
    let sem = key.value::<Semaphore>(&SEM_TYPE).map_err(err)?;
    if let Some(deadline) = sem.as_ref().and_then(|s| s.deadline()) {
        if key.expire_at().is_none_or(|at| at > deadline) {
            key.restore_expire_at(deadline);
        }
    }
    Ok(sem)
}

/// The permits a waiter asks for, and the limit it stated.
fn request_of(w: &Waiter) -> (u64, u64) {
    match w.mode {
        Mode::Permits { permits, limit } => (permits, limit),
        _ => (1, 1),
    }
}

/// Writes the latest lease end to the key and sends the holds that changed
/// (not the whole semaphore: O(changes), whatever the number of holders) to
/// replicas and the AOF; a semaphore with no holds left is deleted.
fn publish(ctx: &Context, name: &Arg, key: &Key, sem: &mut Semaphore) {
    // Taken, not drained: a burst of ended holds keeps no room behind.
    for held_ms in std::mem::take(&mut sem.ended) {
        stats::SEM_HOLD.observe(held_ms);
    }
    let Some(deadline) = sem.deadline() else {
        key.delete();
        replicate_del(ctx, name);
        return;
    };
    key.set_expire_at(deadline);
    if !effects_needed(ctx) {
        // Nobody listens: the list of changed holds is dropped unsorted.
        sem.clear_changed();
        return;
    }
    let changed = sem.take_changed();
    let words = effect_words(sem, b"MERGE", &changed);
    let mut all: Vec<&[u8]> = Vec::with_capacity(words.len() + 1);
    all.push(&name[..]);
    all.extend(words.iter().map(|w| &w[..]));
    ctx.replicate(SEM_EFFECT, &all[..]);
}

/// Publishes what `prune` dropped where the command (or hand-off) changed
/// nothing else: a replica drops a lapsed hold only when told (it never
/// writes on its own), and must hold what the master holds. The effect then
/// names no hold: its time alone drops them. The key may be deleted (no hold
/// left): the caller uses `sem` no more.
fn publish_lapsed(ctx: &Context, name: &Arg, key: &Key, sem: &mut Semaphore) {
    if sem.lapsed() {
        publish(ctx, name, key, sem);
    }
}

/// Takes the waiters at the head of the queue while they fit and records
/// their holds (the first that does not fit stops the pass: FIFO, no
/// overtaking). A waiter whose owner already holds, or that asks for more
/// than the limit, is answered its error. The caller publishes, then answers.
fn grant_waiting(
    ctx: &Context,
    name: &Arg,
    sem: &mut Semaphore,
    now: i64,
) -> Vec<(Waiter, Answer)> {
    let mut answered = Vec::new();
    if waiters::grants_held() || grace::closed_until(now).is_some() {
        // No new holder inside a grace window: the waiters wait for its end.
        return answered;
    }
    while let Some(w) = waiters::pop_head(ctx, name, &KIND, |w| {
        let (permits, limit) = request_of(w);
        limit != sem.limit
            || sem.hold(&w.owner).is_some()
            || permits > sem.limit
            || sem.fits(permits)
    }) {
        let (permits, limit) = request_of(&w);
        let answer = if limit != sem.limit {
            // The key was replaced (`RESTORE`, `COPY`, `RENAME`) by a
            // semaphore of another limit than the one this request stated.
            Answer::Error(error::LIMIT_REPLACED)
        } else if sem.hold(&w.owner).is_some() {
            Answer::Error(error::ALREADY_HOLDS)
        } else if permits > sem.limit {
            Answer::Error(error::PERMITS_ABOVE_LIMIT)
        } else {
            let fence = sem.grant(&w.owner, permits, now, w.ttl_ms, FENCES.draw(now));
            stats::GRANTS.add(1);
            Answer::Integer(fence as i64)
        };
        answered.push((w, answer));
    }
    answered
}

fn answer_all(ctx: &Context, name: &Arg, answered: Vec<(Waiter, Answer)>) {
    if answered
        .iter()
        .any(|(_, a)| matches!(a, Answer::Integer(_)))
    {
        notify(ctx, c"sem.handoff", name);
    }
    for (w, answer) in answered {
        waiters::answer(ctx, w, answer);
    }
}

/// The limit the waiters on `name` stated (a semaphore whose key is gone:
/// its waiters remember it).
fn waiting_limit(ctx: &Context, name: &Arg) -> Option<u64> {
    waiters::peek(ctx, name, &KIND, |w| request_of(w).1)
}

/// Serves the queue with the key open: grants what fits, publishes, answers.
fn serve_open(ctx: &Context, name: &Arg, key: &Key) -> Served {
    let existing = match sem_in(key) {
        Err(_) => return Served::WrongType,
        Ok(existing) => existing,
    };
    if existing.is_none() {
        if let Some(until) = evicted::taken_until(ctx, name) {
            return Served::Wait(Some(until));
        }
    }
    let now = now_ms();
    if let Some(until) = grace::closed_until(now) {
        return Served::Wait(Some(until));
    }
    let answered = match existing {
        Some(sem) => {
            sem.prune(now);
            let answered = grant_waiting(ctx, name, sem, now);
            if answered.is_empty() {
                let next = sem.next_lease_end();
                publish_lapsed(ctx, name, key, sem);
                return Served::Wait(next);
            }
            publish(ctx, name, key, sem);
            answered
        }
        None => {
            let Some(limit) = waiting_limit(ctx, name) else {
                return Served::Wait(None);
            };
            let mut fresh = Semaphore::new(limit);
            let answered = grant_waiting(ctx, name, &mut fresh, now);
            if !fresh.is_free() {
                store(key, &SEM_TYPE, fresh);
                if let Ok(Some(sem)) = sem_in(key) {
                    publish(ctx, name, key, sem);
                }
            }
            answered
        }
    };
    let next = sem_in(key).ok().flatten().and_then(|s| s.next_lease_end());
    answer_all(ctx, name, answered);
    // Later heads wait for a lease to end: one watch.
    Served::Wait(next)
}

/// The semaphore as a kind of waiter: grants every waiter at the head of the
/// queue that fits.
pub struct SemaphoreKind;
pub static KIND: SemaphoreKind = SemaphoreKind;

impl Kind for SemaphoreKind {
    fn index(&self) -> usize {
        3
    }

    fn name(&self) -> &'static str {
        "semaphore"
    }

    fn serve(&self, ctx: &Context, name: &Arg) -> Served {
        serve_open(ctx, name, &Key::write(ctx, name))
    }

    /// Drops the hold the undelivered grant `token` made, if it is still there.
    fn revoke(&self, ctx: &Context, name: &Arg, token: i64) {
        let key = Key::write(ctx, name);
        let Ok(Some(sem)) = sem_in(&key) else {
            return;
        };
        if !sem.revoke(token as u64, now_ms()) {
            publish_lapsed(ctx, name, &key, sem);
            return;
        }
        publish(ctx, name, &key, sem);
        notify(ctx, c"sem.release", name);
        drop(key);
        waiters::serve(ctx, name);
    }
}

/// `SEM.ACQUIRE key owner ttl LIMIT n [PERMITS k] [WAIT timeout]`
pub fn acquire(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() < 6 {
        return Err(RedisError::WrongArity);
    }
    let req = args::sem_request(&args[2..]).map_err(grace::argument_error)?;
    grace::check_lease(req.ttl_ms).map_err(RedisError::String)?;
    refuse_on_replica(ctx)?;
    acks::check_can_wait(ctx)?;
    let name = &args[1];
    if waiters::others_queued(ctx, name, &KIND) {
        waiters::serve(ctx, name);
    }
    let key = Key::write(ctx, name);
    sem_in(&key)?;
    if waiters::queued(ctx, name, &KIND) > 0 {
        // Waiters are served first: they go before any new request.
        serve_open(ctx, name, &key);
    }
    let now = now_ms();
    // A semaphore whose last hold ended is none (its key only outlived it
    // by a `PERSIST` or `PEXPIRE`): a new one, under the limit stated now.
    let mut existing = sem_in(&key)?;
    if let Some(sem) = existing.as_mut() {
        sem.prune(now);
        if sem.is_free() {
            // Emptied by lapses: deleted, on replicas too (a new one may
            // be stored in its place below).
            publish_lapsed(ctx, name, &key, sem);
            existing = None;
        }
    }
    let is_new = existing.is_none();
    let taken = if is_new {
        evicted::taken_until(ctx, name)
    } else {
        None
    };
    let gate = if taken.is_some() || grace::closed_until(now).is_some() {
        Gate::Closed
    } else if waiters::queued(ctx, name, &KIND) > 0 {
        Gate::Queued
    } else {
        Gate::Open
    };
    // A semaphore whose key is gone while waiters remain keeps their limit.
    let limit = if is_new {
        waiting_limit(ctx, name).unwrap_or(req.limit)
    } else {
        0
    };
    let mut fresh = Semaphore::new(limit);
    let sem = existing.unwrap_or(&mut fresh);
    let outcome = sem.request(&req, now, gate, &mut || FENCES.draw(now));
    let next = taken.or(sem.next_lease_end());
    if !matches!(outcome, Outcome::Granted { .. }) {
        if let Some(sem) = sem_in(&key)? {
            publish_lapsed(ctx, name, &key, sem);
        }
    }
    match outcome {
        Outcome::Granted { fence } => {
            stats::GRANTS.add(1);
            if is_new {
                store(&key, &SEM_TYPE, fresh);
            }
            if let Some(sem) = sem_in(&key)? {
                publish(ctx, name, &key, sem);
            }
            notify(ctx, c"sem.acquire", name);
            drop(key);
            let fence = fence as i64;
            held::reply(
                ctx,
                Some((&KIND, &name[..], fence)),
                fence,
                Answer::Nil,
                req.wait_ms,
            )
        }
        Outcome::AlreadyHeld => Err(err(error::ALREADY_HOLDS)),
        Outcome::OtherLimit(limit) => Err(RedisError::String(error::other_limit(limit, req.limit))),
        Outcome::Busy => match req.wait_ms {
            Some(timeout_ms)
                if waiters::can_block(ctx) && !waiters::shed(ctx, name, &KIND, req.queue) =>
            {
                drop(key);
                let mode = Mode::Permits {
                    permits: req.permits,
                    limit: req.limit,
                };
                waiters::block(
                    ctx,
                    name,
                    Waiter::new(&KIND, req.owner, req.ttl_ms, mode),
                    timeout_ms,
                );
                if let Some(at) = next {
                    waiters::watch_lease(ctx, name, at);
                }
                Ok(RedisValue::NoReply)
            }
            _ => Ok(RedisValue::Null),
        },
    }
}

/// `SEM.RELEASE key owner`
pub fn release(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let owner = args::owner(&args[2]).map_err(err)?;
    refuse_on_replica(ctx)?;
    let name = &args[1];
    let key = Key::write(ctx, name);
    let Some(sem) = sem_in(&key)? else {
        stats::REFUSED_RELEASES.add(1);
        return Ok(RedisValue::Integer(0));
    };
    let now = now_ms();
    if !sem.release(owner, now) {
        publish_lapsed(ctx, name, &key, sem);
        stats::REFUSED_RELEASES.add(1);
        return Ok(RedisValue::Integer(0));
    }
    // Hand-off in place: the waiters that now fit join the holders in this
    // same value, published once.
    let answered = if waiters::queued(ctx, name, &KIND) > 0 {
        grant_waiting(ctx, name, sem, now)
    } else {
        Vec::new()
    };
    let next = sem.next_lease_end();
    publish(ctx, name, &key, sem);
    notify(ctx, c"sem.release", name);
    drop(key);
    answer_all(ctx, name, answered);
    if let Some(at) = next {
        waiters::watch_lease(ctx, name, at);
    }
    Ok(RedisValue::Integer(1))
}

/// `SEM.EXTEND key owner ttl`
pub fn extend(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 4 {
        return Err(RedisError::WrongArity);
    }
    let (owner, ttl_ms) = args::owner_and_ttl(&args[2..]).map_err(grace::argument_error)?;
    grace::check_lease(ttl_ms).map_err(RedisError::String)?;
    refuse_on_replica(ctx)?;
    acks::check_can_wait(ctx)?;
    let name = &args[1];
    let key = Key::write(ctx, name);
    let Some(sem) = sem_in(&key)? else {
        return Ok(RedisValue::Integer(0));
    };
    if !sem.extend(owner, now_ms(), ttl_ms) {
        publish_lapsed(ctx, name, &key, sem);
        return Ok(RedisValue::Integer(0));
    }
    let next = sem.next_lease_end();
    publish(ctx, name, &key, sem);
    notify(ctx, c"sem.extend", name);
    if let Some(at) = next {
        waiters::watch_lease(ctx, name, at);
    }
    drop(key);
    held::reply(ctx, None, 1, Answer::Integer(0), None)
}

/// `SEM.SETLIMIT key n`
pub fn setlimit(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let limit = args::limit(&args[2]).map_err(err)?;
    refuse_on_replica(ctx)?;
    let name = &args[1];
    let key = Key::write(ctx, name);
    let Some(sem) = sem_in(&key)? else {
        return Ok(RedisValue::Integer(0));
    };
    let now = now_ms();
    sem.prune(now);
    if sem.is_free() {
        publish_lapsed(ctx, name, &key, sem);
        return Ok(RedisValue::Integer(0));
    }
    sem.limit = limit;
    // Waiters keep their place under the new limit; those that can never
    // fit it are answered now instead of blocking the queue for ever.
    let too_big = waiters::drain(ctx, name, &KIND, |w| request_of(w).0 > limit);
    waiters::update(ctx, name, &KIND, |w| {
        if let Mode::Permits { permits, .. } = w.mode {
            w.mode = Mode::Permits { permits, limit };
        }
    });
    let mut answered: Vec<(Waiter, Answer)> = too_big
        .into_iter()
        .map(|w| (w, Answer::Error(error::PERMITS_ABOVE_LIMIT)))
        .collect();
    answered.extend(grant_waiting(ctx, name, sem, now));
    let next = sem.next_lease_end();
    publish(ctx, name, &key, sem);
    notify(ctx, c"sem.setlimit", name);
    drop(key);
    answer_all(ctx, name, answered);
    if let Some(at) = next {
        waiters::watch_lease(ctx, name, at);
    }
    Ok(RedisValue::Integer(1))
}

/// `SEM.INFO key [owner]`
pub fn info(ctx: &Context, args: &[Arg]) -> RedisResult {
    if !(2..=3).contains(&args.len()) {
        return Err(RedisError::WrongArity);
    }
    let owner = match args.get(2) {
        Some(o) => Some(args::owner(o).map_err(err)?),
        None => None,
    };
    let name = &args[1];
    let key = Key::read(ctx, name);
    let waiting = waiters::queued(ctx, name, &KIND);
    // A view at this instant: holds whose own lease ended are not counted
    // (nothing is copied: a semaphore of 100k holders answers at once).
    let now = now_ms();
    let stored = sem_in(&key)?;
    let (used, holders) = stored.as_ref().map_or((0, 0), |s| s.live_counts(now));
    let limit = match (stored.as_ref(), waiting_limit(ctx, name)) {
        (Some(sem), _) if holders > 0 => sem.limit,
        (_, Some(limit)) if waiting > 0 => limit,
        _ => return Ok(RedisValue::Null),
    };
    let mut fields = vec![
        ("limit", Field::Int(limit as i64)),
        ("used", Field::Int(used as i64)),
        ("holders", Field::Int(holders as i64)),
        ("waiters", Field::Int(waiting as i64)),
    ];
    if let Some(owner) = owner {
        let hold = stored.and_then(|s| s.live_hold(owner, now));
        fields.push(("permits", Field::Int(hold.map_or(0, |h| h.permits as i64))));
        fields.push((
            "ttl",
            Field::Int(hold.map_or(-2, |h| (h.deadline_ms - now).max(0))),
        ));
    }
    reply::map(ctx, &fields)
}

/// `WARDEN.SEMSET key limit fence now SET|MERGE (owner permits fence deadline)...`:
/// a semaphore's changes as replicas and the AOF receive them. `SET`: the
/// whole state. `MERGE`: holds whose lease ended before `now` go (the
/// master dropped them at that time), then each named hold is set, or
/// removed with `permits` 0. Everything is checked before anything changes.
pub fn set(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() < 6 || !(args.len() - 6).is_multiple_of(4) {
        return Err(RedisError::WrongArity);
    }
    effects_only(ctx)?;
    let invalid = || err(error::INVALID_EFFECT);
    let number = |a: &Arg| args::integer(a).and_then(|n| u64::try_from(n).ok());
    let (Some(limit), Some(fence), Some(pruned_at)) =
        (number(&args[2]), number(&args[3]), number(&args[4]))
    else {
        return Err(invalid());
    };
    let whole = match &args[5][..] {
        b"SET" => true,
        b"MERGE" => false,
        _ => return Err(invalid()),
    };
    if !valid_header(limit, fence) || i64::try_from(pruned_at).is_err() {
        return Err(invalid());
    }
    let mut changes: Vec<(&[u8], Option<Hold>)> = Vec::with_capacity((args.len() - 6) / 4);
    let mut seen = rustc_hash::FxHashSet::default();
    for group in args[6..].chunks(4) {
        let owner = &group[0][..];
        let (Some(permits), Some(hold_fence), Some(deadline)) =
            (number(&group[1]), number(&group[2]), number(&group[3]))
        else {
            return Err(invalid());
        };
        if !seen.insert(owner) {
            return Err(invalid());
        }
        if permits == 0 && !whole && (1..=crate::args::MAX_OWNER).contains(&owner.len()) {
            changes.push((owner, None));
            continue;
        }
        let hold = Hold {
            permits,
            fence: hold_fence,
            deadline_ms: i64::try_from(deadline).map_err(|_| invalid())?,
            granted_ms: 0,
        };
        if !valid_hold(owner, &hold, fence) {
            return Err(invalid());
        }
        changes.push((owner, Some(hold)));
    }
    if whole && changes.is_empty() {
        return Err(invalid());
    }
    let key = Key::write(ctx, &args[1]);
    let existing = key.value::<Semaphore>(&SEM_TYPE).map_err(err)?;
    FENCES.observe(fence);
    let mut fresh = Semaphore::new(limit);
    let is_new = existing.is_none() || whole;
    let sem = match existing {
        Some(sem) if !whole => sem,
        _ => &mut fresh,
    };
    sem.limit = limit;
    sem.fence = sem.fence.max(fence);
    sem.prune(pruned_at as i64);
    for (owner, hold) in changes {
        match hold {
            Some(hold) => sem.insert(owner.to_vec(), hold),
            None => {
                sem.remove(owner);
            }
        }
    }
    sem.clear_changed();
    sem.ended.clear();
    let deadline = sem.deadline();
    match deadline {
        None => key.delete(),
        Some(at) => {
            if is_new {
                store(&key, &SEM_TYPE, fresh);
            }
            key.set_expire_at(at);
        }
    }
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}
