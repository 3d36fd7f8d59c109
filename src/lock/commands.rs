//! `LOCK.*`: parse, open the key, apply the pure rules, reply, replicate the effect.

use redis_module::{Context, RedisError, RedisResult, RedisValue};

use crate::command::Arg;

use crate::args;
use crate::datatypes::{store, valid_lock, LOCK_EFFECT, LOCK_TYPE};
use crate::error;
use crate::fence::FENCES;
use crate::keyspace::{notify, now_ms, replicate_del, replicate_key_bytes_3, Key};
use crate::lock::state::{Entry, Lock, Release};
use crate::reply::{self, Field};
use crate::stats;
use crate::waiters::{self, Mode, Waiter};

fn err(text: &'static str) -> RedisError {
    RedisError::Str(text)
}

/// The lock in `key`, with its deadline read from the key's expiry.
fn lock_in(key: &Key) -> Result<Option<&mut Lock>, RedisError> {
    let mut lock = key.value::<Lock>(&LOCK_TYPE).map_err(err)?;
    if let Some(lock) = lock.as_deref_mut() {
        lock.deadline_ms = key.expire_at().unwrap_or(i64::MAX);
    }
    Ok(lock)
}

/// Writes the lock's lease to the key and sends its full state to replicas and the AOF.
fn publish(ctx: &Context, name: &Arg, key: &Key, lock: &Lock) {
    key.set_expire_at(lock.deadline_ms);
    let numbers = [lock.holds as i64, lock.fence as i64, lock.deadline_ms];
    replicate_key_bytes_3(ctx, LOCK_EFFECT, name, &lock.owner, numbers);
}

/// Grants a free key to `owner`: a new token, one hold, a lease from now.
fn grant(ctx: &Context, name: &Arg, key: &Key, owner: &[u8], ttl_ms: i64) -> u64 {
    let now = now_ms();
    let lock = Lock::grant(owner, FENCES.draw(now), now, ttl_ms);
    let fence = lock.fence;
    stats::GRANTS.add(1);
    store(key, &LOCK_TYPE, lock);
    if let Ok(Some(lock)) = key.value::<Lock>(&LOCK_TYPE) {
        publish(ctx, name, key, lock);
    }
    fence
}

/// The key is free: the oldest live waiter becomes the holder. Returns whether one did.
fn hand_off(ctx: &Context, name: &Arg, key: &Key) -> bool {
    match waiters::pop_if(ctx, name, |w| w.mode == Mode::Exclusive) {
        Some(waiter) => {
            let fence = grant(ctx, name, key, &waiter.owner, waiter.ttl_ms);
            notify(ctx, c"lock.handoff", name);
            waiters::answer_grant(ctx, waiter, name, fence);
            true
        }
        None => false,
    }
}

/// Frees the key: hand it to the next waiter, or delete it.
fn free(ctx: &Context, name: &Arg, key: &Key) {
    if !hand_off(ctx, name, key) {
        key.delete();
        replicate_del(ctx, name);
    }
}

/// `LOCK.ACQUIRE key owner ttl [WAIT timeout]`
pub fn acquire(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() < 4 {
        return Err(RedisError::WrongArity);
    }
    let req = args::lock_request(&args[2..]).map_err(RedisError::String)?;
    let name = &args[1];
    let key = Key::write(ctx, &args[1]);
    let now = now_ms();
    let lock = match lock_in(&key)? {
        None if !hand_off(ctx, name, &key) => {
            let fence = grant(ctx, name, &key, req.owner, req.ttl_ms);
            notify(ctx, c"lock.acquire", name);
            return Ok(RedisValue::Integer(fence as i64));
        }
        None => lock_in(&key)?.ok_or_else(|| err(error::INTERNAL))?,
        Some(lock) => lock,
    };
    match lock.enter(req.owner, now, req.ttl_ms) {
        Entry::Reentered { fence } => {
            publish(ctx, name, &key, lock);
            notify(ctx, c"lock.acquire", name);
            Ok(RedisValue::Integer(fence as i64))
        }
        Entry::Overflow => Err(err(error::HOLDS_OVERFLOW)),
        Entry::Busy => match req.wait_ms {
            Some(timeout_ms) if waiters::can_block(ctx) => {
                let waiter = Waiter::new(req.owner, req.ttl_ms, Mode::Exclusive);
                waiters::block(ctx, name, waiter, timeout_ms);
                waiters::watch_lease(ctx, name, lock.deadline_ms);
                Ok(RedisValue::NoReply)
            }
            _ => Ok(RedisValue::Null),
        },
    }
}

/// `LOCK.RELEASE key owner`
pub fn release(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let owner = args::owner(&args[2]).map_err(err)?;
    let name = &args[1];
    let key = Key::write(ctx, &args[1]);
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
            free(ctx, name, &key);
            Ok(RedisValue::Integer(1))
        }
    }
}

/// `LOCK.EXTEND key owner ttl`
pub fn extend(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 4 {
        return Err(RedisError::WrongArity);
    }
    let (owner, ttl_ms) = args::owner_and_ttl(&args[2..]).map_err(err)?;
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
    Ok(RedisValue::Integer(1))
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
    let ttl = match lock.deadline_ms {
        i64::MAX => -1,
        _ => lock.ttl_left(now_ms()),
    };
    let waiting = waiters::queued(ctx, &args[1]) as i64;
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
/// command as replicas and the AOF receive it (deadline 0: no expiry of its own).
pub fn set(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 6 {
        return Err(RedisError::WrongArity);
    }
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
    FENCES.observe(fence);
    let key = Key::write(ctx, &args[1]);
    let lock = Lock {
        owner: owner.to_vec(),
        holds,
        fence,
        deadline_ms,
    };
    match key.value::<Lock>(&LOCK_TYPE) {
        Ok(Some(existing)) => *existing = lock,
        _ => store(&key, &LOCK_TYPE, lock),
    }
    if deadline_ms > 0 {
        key.set_expire_at(deadline_ms);
    }
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// Takes back a grant whose client died before it was answered.
pub fn revoke(ctx: &Context, name: &Arg, owner: &[u8], fence: u64) {
    let key = Key::write(ctx, name);
    if let Ok(Some(lock)) = lock_in(&key) {
        if lock.owner == owner && lock.fence == fence {
            free(ctx, name, &key);
        }
    }
}

/// Called for a key with waiters when something may have freed it (lease end,
/// `DEL`, flush, overwrite): hand it off, or fail the waiters if the key now
/// holds another type, or watch the new lease.
pub fn serve_waiters(ctx: &Context, name: &Arg) {
    let key = Key::write(ctx, name);
    match lock_in(&key) {
        Err(_) => waiters::fail_all(ctx, name, error::WRONGTYPE),
        Ok(None) => {
            hand_off(ctx, name, &key);
        }
        Ok(Some(lock)) => waiters::watch_lease(ctx, name, lock.deadline_ms),
    }
}
