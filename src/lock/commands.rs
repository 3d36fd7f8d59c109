//! `LOCK.*`: parse, open the key, apply the pure rules, reply, replicate the effect.

use redis_module::{Context, RedisError, RedisResult, RedisValue};

use crate::command::Arg;

use crate::acks;
use crate::args;
use crate::datatypes::{bounded_deadline, store, valid_lock, LOCK_EFFECT, LOCK_TYPE};
use crate::error;
use crate::evicted;
use crate::fence::FENCES;
use crate::grace;
use crate::keyspace::{
    effects_only, notify, now_ms, refuse_on_replica, replicate_del, replicate_key_bytes_3, Key,
};
use crate::lock::state::{Entry, Lock, Release};
use crate::reply::{self, Field};
use crate::stats;
use crate::waiters::{self, held, Answer, Kind, Mode, Served, Waiter};

fn err(text: &'static str) -> RedisError {
    RedisError::Str(text)
}

/// The lock in `key`, with its deadline read from the key's expiry. A lock
/// whose key lost its expiry (`PERSIST`) keeps the lease it was granted: the
/// key gets that deadline back, and a lock whose lease has ended is no lock.
/// Under `warden.max-lease` an expiry set by anything but warden (`PEXPIRE`,
/// `EXPIRE`, `RESTORE` with a ttl) may shorten the lease, never lengthen it;
/// a `RESTORE`'s ttl never lengthens the saved lease, with or without a cap.
pub(crate) fn lock_in(key: &Key) -> Result<Option<&mut Lock>, RedisError> {
    let Some(lock) = key.value::<Lock>(&LOCK_TYPE).map_err(err)? else {
        return Ok(None);
    };
    let now = now_ms();
    let at = key.expire_at();
    let lease = match at {
        Some(at) if lock.foreign_expiry => at.min(lock.deadline_ms),
        Some(at) => grace::cap_expiry(at, lock.deadline_ms, now),
        None => lock.deadline_ms,
    };
    // The flag stays until the key's expiry is the lease: a key opened for
    // reading (`LOCK.INFO`) is not written, and the next command reads it again.
    if at == Some(lease) || key.restore_expire_at(lease) {
        lock.foreign_expiry = false;
    }
    lock.deadline_ms = lease;
    Ok(lock.is_live(now).then_some(lock))
}

/// Writes the lock's lease to the key and sends its full state to replicas and the AOF.
fn publish(ctx: &Context, name: &Arg, key: &Key, lock: &Lock) {
    key.set_expire_at(lock.deadline_ms);
    let numbers = [lock.holds as i64, lock.fence as i64, lock.deadline_ms];
    replicate_key_bytes_3(ctx, LOCK_EFFECT, name, &lock.owner, numbers);
}

/// Stores a fresh grant in the empty `key` and publishes it.
fn install(ctx: &Context, name: &Arg, key: &Key, lock: Lock) {
    stats::GRANTS.add(1);
    store(key, &LOCK_TYPE, lock);
    if let Ok(Some(lock)) = key.value::<Lock>(&LOCK_TYPE) {
        publish(ctx, name, key, lock);
    }
}

/// Grants a free key to `owner`: a new token, one hold, a lease from now.
fn grant(ctx: &Context, name: &Arg, key: &Key, owner: &[u8], ttl_ms: i64) -> u64 {
    let now = now_ms();
    let lock = Lock::grant(owner, FENCES.draw(now), now, ttl_ms);
    let fence = lock.fence;
    install(ctx, name, key, lock);
    fence
}

/// Gives the oldest waiter the lock in `key`, which is free (`lock` None: the
/// key is empty; `Some`: its last hold was just released, and the value is
/// handed over in place). Whether a waiter was granted; the key is left as it
/// was if not.
fn hand_off(ctx: &Context, name: &Arg, key: &Key, lock: Option<&mut Lock>) -> bool {
    if waiters::grants_held() || grace::closed_until(now_ms()).is_some() {
        // No new holder inside a grace window: the waiters wait for its end.
        return false;
    }
    let Some(mut waiter) = waiters::pop_head(ctx, name, &KIND, |_| true) else {
        return false;
    };
    let now = now_ms();
    let fence = FENCES.draw(now);
    let deadline_ms = now.saturating_add(waiter.ttl_ms);
    stats::GRANTS.add(1);
    match lock {
        Some(lock) => {
            // One value, one expiry, one effect: no delete and re-create.
            if let Some(held_ms) = lock.held_for(now) {
                stats::LOCK_HOLD.observe(held_ms);
            }
            lock.granted_ms = now;
            lock.owner = std::mem::take(&mut waiter.owner);
            lock.holds = 1;
            lock.fence = fence;
            lock.deadline_ms = deadline_ms;
            publish(ctx, name, key, lock);
        }
        None => {
            store(
                key,
                &LOCK_TYPE,
                Lock::grant(&waiter.owner, fence, now, waiter.ttl_ms),
            );
            if let Ok(Some(lock)) = key.value::<Lock>(&LOCK_TYPE) {
                publish(ctx, name, key, lock);
            }
        }
    }
    notify(ctx, c"lock.handoff", name);
    // The next waiter, if any, is served when this lease ends.
    waiters::watch_lease(ctx, name, deadline_ms);
    waiters::answer(ctx, waiter, Answer::Integer(fence as i64));
    true
}

/// Grants the oldest waiter its re-entry if it is the holder's own request
/// (one that waited for a grace window to end). Whether one was answered.
fn reenter_waiting(ctx: &Context, name: &Arg, key: &Key, lock: &mut Lock) -> bool {
    let Some(waiter) = waiters::pop_head(ctx, name, &KIND, |w| w.owner == lock.owner) else {
        return false;
    };
    let answer = match lock.enter(&waiter.owner, now_ms(), waiter.ttl_ms) {
        Entry::Reentered { fence } => {
            publish(ctx, name, key, lock);
            notify(ctx, c"lock.acquire", name);
            Answer::Integer(fence as i64)
        }
        Entry::Overflow => Answer::Error(error::HOLDS_OVERFLOW),
        // `lock_in` found it live and held by this owner.
        Entry::Busy => Answer::Nil,
    };
    waiters::answer(ctx, waiter, answer);
    true
}

/// The exclusive lock as a kind of waiter: the oldest waiter is granted a free key.
pub struct LockKind;
pub static KIND: LockKind = LockKind;

impl Kind for LockKind {
    fn index(&self) -> usize {
        0
    }

    fn name(&self) -> &'static str {
        "lock"
    }

    fn serve(&self, ctx: &Context, name: &Arg) -> Served {
        let key = Key::write(ctx, name);
        match lock_in(&key) {
            Err(_) => Served::WrongType,
            Ok(Some(lock)) => {
                if grace::closed_until(now_ms()).is_none() && reenter_waiting(ctx, name, &key, lock)
                {
                    Served::Progress
                } else {
                    Served::Wait(Some(lock.deadline_ms))
                }
            }
            Ok(None) => {
                let taken = evicted::taken_until(ctx, name);
                if let Some(until) = taken.or_else(|| grace::closed_until(now_ms())) {
                    return Served::Wait(Some(until));
                }
                if hand_off(ctx, name, &key, None) {
                    // Held now: `hand_off` watches its lease for the next head.
                    Served::Wait(None)
                } else {
                    // The head (if any) is of another kind.
                    Served::Progress
                }
            }
        }
    }

    /// Releases the one hold the undelivered grant `token` made, if the key
    /// still holds it (a re-entry by the same owner keeps its own hold).
    fn revoke(&self, ctx: &Context, name: &Arg, token: i64) {
        let key = Key::write(ctx, name);
        let Ok(Some(lock)) = lock_in(&key) else {
            return;
        };
        if lock.fence as i64 != token {
            return;
        }
        let owner = lock.owner.clone();
        if let Release::StillHeld = lock.release(&owner, now_ms()) {
            publish(ctx, name, &key, lock);
            return;
        }
        // No client ever held this grant: no hold time to record.
        lock.granted_ms = 0;
        notify(ctx, c"lock.release", name);
        if !hand_off(ctx, name, &key, Some(lock)) {
            key.delete();
            replicate_del(ctx, name);
        }
    }
}

/// A busy request: block until served (with `WAIT`, where blocking is
/// allowed and `QUEUE` does not shed it), else nil at once. `until`: when the
/// key may free itself.
fn busy(ctx: &Context, name: &Arg, req: &args::LockRequest, until: i64) -> RedisResult {
    match req.wait_ms {
        Some(timeout_ms)
            if waiters::can_block(ctx) && !waiters::shed(ctx, name, &KIND, req.queue) =>
        {
            let waiter = Waiter::new(&KIND, req.owner, req.ttl_ms, Mode::Exclusive);
            waiters::block(ctx, name, waiter, timeout_ms);
            waiters::watch_lease(ctx, name, until);
            Ok(RedisValue::NoReply)
        }
        _ => Ok(RedisValue::Null),
    }
}

/// `LOCK.ACQUIRE key owner ttl [WAIT timeout] [QUEUE n]`
pub fn acquire(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() < 4 {
        return Err(RedisError::WrongArity);
    }
    let req = args::lock_request(&args[2..]).map_err(grace::argument_error)?;
    grace::check_lease(req.ttl_ms).map_err(RedisError::String)?;
    refuse_on_replica(ctx)?;
    acks::check_can_wait(ctx)?;
    let name = &args[1];
    if waiters::others_queued(ctx, name, &KIND) {
        waiters::serve(ctx, name);
    }
    let key = Key::write(ctx, name);
    let now = now_ms();
    let Some(lock) = lock_in(&key)? else {
        let taken = evicted::taken_until(ctx, name);
        if let Some(until) = taken.or_else(|| grace::closed_until(now)) {
            drop(key);
            return busy(ctx, name, &req, until);
        }
        if waiters::queued(ctx, name, &KIND) > 0 {
            // Waiters go first: the oldest takes the free key, this request
            // queues behind the rest.
            if !hand_off(ctx, name, &key, None) {
                drop(key);
                waiters::serve(ctx, name);
            }
            return busy(ctx, name, &req, i64::MAX);
        }
        let fence = grant(ctx, name, &key, req.owner, req.ttl_ms) as i64;
        notify(ctx, c"lock.acquire", name);
        drop(key);
        return held::reply(
            ctx,
            Some((&KIND, &name[..], fence)),
            fence,
            Answer::Nil,
            req.wait_ms,
        );
    };
    if let Some(until) = grace::closed_until(now) {
        if lock.is_held_by(req.owner, now) {
            // A re-entry is a new hold: none inside a grace window.
            drop(key);
            return busy(ctx, name, &req, until);
        }
    }
    match lock.enter(req.owner, now, req.ttl_ms) {
        Entry::Reentered { fence } => {
            publish(ctx, name, &key, lock);
            notify(ctx, c"lock.acquire", name);
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
        Entry::Overflow => Err(err(error::HOLDS_OVERFLOW)),
        Entry::Busy => {
            let until = lock.deadline_ms;
            drop(key);
            busy(ctx, name, &req, until)
        }
    }
}

/// `LOCK.RELEASE key owner`
pub fn release(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let owner = args::owner(&args[2]).map_err(err)?;
    refuse_on_replica(ctx)?;
    let name = &args[1];
    let key = Key::write(ctx, name);
    let Some(lock) = lock_in(&key)? else {
        stats::REFUSED_RELEASES.add(1);
        return Ok(RedisValue::Integer(-1));
    };
    match lock.release(owner, now_ms()) {
        Release::NotOwner => {
            stats::REFUSED_RELEASES.add(1);
            Ok(RedisValue::Integer(-1))
        }
        Release::StillHeld => {
            publish(ctx, name, &key, lock);
            notify(ctx, c"lock.release", name);
            Ok(RedisValue::Integer(0))
        }
        Release::Freed => {
            notify(ctx, c"lock.release", name);
            if hand_off(ctx, name, &key, Some(lock)) {
                return Ok(RedisValue::Integer(1));
            }
            key.delete();
            replicate_del(ctx, name);
            drop(key);
            // Waiters of another kind at the head (the key was re-typed).
            waiters::serve(ctx, name);
            Ok(RedisValue::Integer(1))
        }
    }
}

/// `LOCK.EXTEND key owner ttl`
pub fn extend(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 4 {
        return Err(RedisError::WrongArity);
    }
    let (owner, ttl_ms) = args::owner_and_ttl(&args[2..]).map_err(grace::argument_error)?;
    grace::check_lease(ttl_ms).map_err(RedisError::String)?;
    refuse_on_replica(ctx)?;
    acks::check_can_wait(ctx)?;
    let name = &args[1];
    let key = Key::write(ctx, &args[1]);
    let Some(lock) = lock_in(&key)? else {
        return Ok(RedisValue::Integer(0));
    };
    if !lock.extend(owner, now_ms(), ttl_ms) {
        return Ok(RedisValue::Integer(0));
    }
    publish(ctx, name, &key, lock);
    notify(ctx, c"lock.extend", name);
    waiters::watch_lease(ctx, name, lock.deadline_ms);
    drop(key);
    // Unacknowledged, the longer lease may be lost: the owner is told it
    // does not hold the lock any more (the lease stays until it ends).
    held::reply(ctx, None, 1, Answer::Integer(0), None)
}

/// `LOCK.INFO key`
pub fn info(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    let key = Key::read(ctx, &args[1]);
    let Some(lock) = lock_in(&key)? else {
        return Ok(RedisValue::Null);
    };
    let ttl = lock.ttl_left(now_ms());
    let waiting = waiters::queued(ctx, &args[1], &KIND) as i64;
    reply::map(
        ctx,
        &[
            ("owner", Field::Bytes(&lock.owner)),
            ("holds", Field::Int(lock.holds as i64)),
            ("ttl", Field::Int(ttl)),
            ("fence", Field::Int(lock.fence as i64)),
            ("waiters", Field::Int(waiting)),
        ],
    )
}

/// `WARDEN.LOCKSET key owner holds fence deadline_ms`: the effect of a lock
/// command as replicas and the AOF receive it (deadline 0, from AOF files of
/// earlier versions: the key's `PEXPIREAT` follows and sets it).
pub fn set(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 6 {
        return Err(RedisError::WrongArity);
    }
    effects_only(ctx)?;
    let parsed = (
        args::integer(&args[3]).and_then(|n| u64::try_from(n).ok()),
        args::integer(&args[4]).and_then(|n| u64::try_from(n).ok()),
        args::integer(&args[5]).filter(|n| *n >= 0),
    );
    let (Some(holds), Some(fence), Some(deadline_ms)) = parsed else {
        return Err(err(error::INVALID_EFFECT));
    };
    let owner = &args[2][..];
    if !valid_lock(owner, holds, fence) {
        return Err(err(error::INVALID_EFFECT));
    }
    let key = Key::write(ctx, &args[1]);
    let existing = key.value::<Lock>(&LOCK_TYPE).map_err(err)?;
    FENCES.observe(fence);
    let lock = Lock {
        owner: owner.to_vec(),
        holds,
        fence,
        deadline_ms: bounded_deadline(deadline_ms),
        granted_ms: 0,
        foreign_expiry: false,
    };
    match existing {
        Some(existing) => *existing = lock,
        None => store(&key, &LOCK_TYPE, lock),
    }
    if deadline_ms > 0 {
        key.set_expire_at(deadline_ms);
    }
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}
