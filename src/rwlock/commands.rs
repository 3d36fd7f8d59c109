//! `RWLOCK.*`: parse, open the key, apply the pure rules, reply, replicate the effect.

use redis_module::{Context, RedisError, RedisResult, RedisValue};

use crate::command::Arg;

use crate::acks;
use crate::args;
use crate::datatypes::{
    bounded_deadline, store, valid_lock, RWLOCK_DELTA, RWLOCK_EFFECT, RWLOCK_TYPE,
};
use crate::error;
use crate::evicted;
use crate::fence::FENCES;
use crate::grace;
use crate::keyspace::{
    effects_needed, effects_only, notify, now_ms, refuse_on_replica, replicate_del, Key,
};
use crate::reply::{self, Field};
use crate::rwlock::state::{DeltaHold, Gate, Hold, Mode, Outcome, RwLock, Unlock};
use crate::stats;
use crate::waiters::{self, held, Answer, Kind, Served, Waiter};

fn err(text: &'static str) -> RedisError {
    RedisError::Str(text)
}

fn waiter_mode(mode: Mode) -> waiters::Mode {
    match mode {
        Mode::Read => waiters::Mode::Read,
        Mode::Write => waiters::Mode::Write,
    }
}

/// The read-write lock in `key`. Its holds carry their own leases; the key's
/// expiry is put back to the latest of them when it was lost (`PERSIST`,
/// `RESTORE` without a ttl) or lies beyond it (`PEXPIRE`, `RESTORE` with a
/// longer ttl): it never keeps the key longer than its holds.
pub(crate) fn rw_in(key: &Key) -> Result<Option<&mut RwLock>, RedisError> {
    let lock = key.value::<RwLock>(&RWLOCK_TYPE).map_err(err)?;
    if let Some(deadline) = lock.as_ref().and_then(|l| l.deadline()) {
        if key.expire_at().is_none_or(|at| at > deadline) {
            key.restore_expire_at(deadline);
        }
    }
    Ok(lock)
}

/// Writes the state's expiry to the key and sends what `now_ms`'s command
/// changed to replicas and the AOF: the changed holds (`WARDEN.RWHOLD`), or
/// the whole state (`WARDEN.RWSET`) when that is no longer; a lock with no
/// holds left is deleted.
fn publish(ctx: &Context, name: &Arg, key: &Key, lock: &mut RwLock, now_ms: i64) {
    // Taken, not drained: a burst of 20k ended holds keeps no room behind.
    for held_ms in std::mem::take(&mut lock.ended) {
        stats::RWLOCK_HOLD.observe(held_ms);
    }
    let Some(deadline) = lock.deadline() else {
        key.delete();
        replicate_del(ctx, name);
        return;
    };
    key.set_expire_at(deadline);
    if !effects_needed(ctx) {
        lock.changed.clear();
        lock.lapsed_until = None;
        return;
    }
    match lock.take_delta(now_ms) {
        Some(delta) => replicate_delta(ctx, name, lock.fence, now_ms, &delta),
        None => replicate_whole(ctx, name, lock),
    }
}

/// Publishes what `prune` dropped where the command (or hand-off) changed
/// nothing else: a replica drops a lapsed hold only when told (it never
/// writes on its own), and must hold what the master holds. The key may be
/// deleted (no hold left): the caller uses `lock` no more.
fn publish_lapsed(ctx: &Context, name: &Arg, key: &Key, lock: &mut RwLock, now_ms: i64) {
    if lock.lapsed() {
        publish(ctx, name, key, lock, now_ms);
    }
}

/// `WARDEN.RWHOLD key now_ms fence (W|R owner holds fence deadline_ms)...`
fn replicate_delta(ctx: &Context, name: &Arg, fence: u64, now_ms: i64, delta: &[DeltaHold]) {
    let numbers: Vec<[String; 3]> = delta
        .iter()
        .map(|h| {
            [
                h.holds.to_string(),
                h.fence.to_string(),
                h.deadline_ms.to_string(),
            ]
        })
        .collect();
    let (now, fence) = (now_ms.to_string(), fence.to_string());
    let mut words: Vec<&[u8]> = vec![&name[..], now.as_bytes(), fence.as_bytes()];
    for (h, n) in delta.iter().zip(&numbers) {
        words.extend_from_slice(&[
            mode_tag(h.mode),
            &h.owner,
            n[0].as_bytes(),
            n[1].as_bytes(),
            n[2].as_bytes(),
        ]);
    }
    ctx.replicate(RWLOCK_DELTA, &words[..]);
}

fn mode_tag(mode: Mode) -> &'static [u8] {
    match mode {
        Mode::Write => b"W",
        Mode::Read => b"R",
    }
}

/// `WARDEN.RWSET key fence (W|R owner holds fence deadline_ms)...`
fn replicate_whole(ctx: &Context, name: &Arg, lock: &RwLock) {
    let numbers: Vec<[String; 3]> = lock
        .writer
        .iter()
        .chain(&lock.readers)
        .map(|h| {
            [
                h.holds.to_string(),
                h.fence.to_string(),
                h.deadline_ms.to_string(),
            ]
        })
        .collect();
    let fence = lock.fence.to_string();
    let mut words: Vec<&[u8]> = vec![&name[..], fence.as_bytes()];
    let tagged = lock
        .writer
        .iter()
        .map(|h| (Mode::Write, h))
        .chain(lock.readers.iter().map(|h| (Mode::Read, h)));
    for ((mode, hold), n) in tagged.zip(&numbers) {
        words.extend_from_slice(&[
            mode_tag(mode),
            &hold.owner,
            n[0].as_bytes(),
            n[1].as_bytes(),
            n[2].as_bytes(),
        ]);
    }
    ctx.replicate(RWLOCK_EFFECT, &words[..]);
}

/// Takes the waiters at the head of the queue that fit `lock` — a writer
/// alone, or the run of readers — and records their holds in it. The caller
/// publishes the lock, then answers each with its token.
fn grant_waiting(ctx: &Context, name: &Arg, lock: &mut RwLock, now: i64) -> Vec<(Waiter, u64)> {
    let mut granted = Vec::new();
    if grace::closed_until(now).is_some() {
        // No new holder inside a grace window: the waiters wait for its end.
        return granted;
    }
    let mut readers: Vec<Waiter> = Vec::new();
    while let Some(w) = waiters::pop_head(ctx, name, &KIND, |w| match w.mode {
        waiters::Mode::Read => lock.admits(Mode::Read, &w.owner),
        // Not while readers of this pass are still to be recorded.
        waiters::Mode::Write => readers.is_empty() && lock.admits(Mode::Write, &w.owner),
        _ => false,
    }) {
        if w.mode == waiters::Mode::Write {
            let fence = lock.grant(Mode::Write, &w.owner, now, w.ttl_ms, FENCES.draw(now));
            stats::GRANTS.add(1);
            granted.push((w, fence));
        } else {
            readers.push(w);
        }
    }
    if !readers.is_empty() {
        let requests: Vec<(&[u8], i64)> =
            readers.iter().map(|w| (&w.owner[..], w.ttl_ms)).collect();
        let fences = lock.grant_reads(&requests, now, &mut || FENCES.draw(now));
        stats::GRANTS.add(readers.len() as u64);
        granted.extend(readers.into_iter().zip(fences));
    }
    granted
}

fn answer_granted(ctx: &Context, granted: Vec<(Waiter, u64)>) {
    for (w, fence) in granted {
        waiters::answer(ctx, w, Answer::Integer(fence as i64));
    }
}

/// Serves the queue with the key already open: grants what fits, publishes,
/// answers.
fn serve_open(ctx: &Context, name: &Arg, key: &Key) -> Served {
    let existing = match rw_in(key) {
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
    let mut fresh = RwLock::default();
    let is_new = existing.is_none();
    let lock = existing.unwrap_or(&mut fresh);
    lock.prune(now);
    let granted = grant_waiting(ctx, name, lock, now);
    if granted.is_empty() {
        let served = match lock.next_lease_end() {
            // Free, and the head is of another kind: let it be served.
            None if waiters::queued(ctx, name, &KIND) > 0 && lock.is_free() => Served::Progress,
            next => Served::Wait(next),
        };
        publish_lapsed(ctx, name, key, lock, now);
        return served;
    }
    let next = lock.next_lease_end();
    if is_new {
        store(key, &RWLOCK_TYPE, fresh);
    }
    if let Ok(Some(lock)) = rw_in(key) {
        publish(ctx, name, key, lock, now);
    }
    notify(ctx, c"rwlock.handoff", name);
    answer_granted(ctx, granted);
    // Later heads wait for a lease to end: one watch.
    Served::Wait(next)
}

/// The read-write lock as a kind of waiter: grants every waiter at the head
/// of the queue that fits the holders (a writer alone, or a run of readers).
pub struct RwLockKind;
pub static KIND: RwLockKind = RwLockKind;

impl Kind for RwLockKind {
    fn index(&self) -> usize {
        1
    }

    fn name(&self) -> &'static str {
        "rwlock"
    }

    fn serve(&self, ctx: &Context, name: &Arg) -> Served {
        serve_open(ctx, name, &Key::write(ctx, name))
    }

    /// Drops the one hold the undelivered grant `token` made, if it is still there.
    fn revoke(&self, ctx: &Context, name: &Arg, token: i64) {
        let key = Key::write(ctx, name);
        let Ok(Some(lock)) = rw_in(&key) else {
            return;
        };
        let now = now_ms();
        if !lock.revoke(token as u64, now) {
            publish_lapsed(ctx, name, &key, lock, now);
            return;
        }
        publish(ctx, name, &key, lock, now);
        notify(ctx, c"rwlock.unlock", name);
        drop(key);
        waiters::serve(ctx, name);
    }
}

fn request(ctx: &Context, args: &[Arg], mode: Mode) -> RedisResult {
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
    let mut key = Key::write(ctx, name);
    rw_in(&key)?;
    if waiters::queued(ctx, name, &KIND) > 0 {
        // Waiters are served first: they go before any new request.
        if let Served::Progress = serve_open(ctx, name, &key) {
            // A head of another kind: served with the key closed here.
            drop(key);
            waiters::serve(ctx, name);
            key = Key::write(ctx, name);
        }
    }
    let now = now_ms();
    // Inside a grace window every hold is busy, re-entry included: the
    // owner's release may have been lost with the old master.
    let gate = if grace::closed_until(now).is_some() {
        Gate::Closed
    } else if waiters::queued(ctx, name, &KIND) > 0 {
        Gate::Queued
    } else {
        Gate::Open
    };
    let mut fresh = RwLock::default();
    let existing = rw_in(&key)?;
    let is_new = existing.is_none();
    let taken = if is_new {
        evicted::taken_until(ctx, name)
    } else {
        None
    };
    let lock = existing.unwrap_or(&mut fresh);
    let outcome = match taken {
        Some(_) => Outcome::Busy,
        None => lock.request(mode, req.owner, now, req.ttl_ms, gate, &mut || {
            FENCES.draw(now)
        }),
    };
    let fence = match outcome {
        Outcome::Granted { fence } => {
            stats::GRANTS.add(1);
            fence
        }
        Outcome::Reentered { fence } => fence,
        Outcome::Upgrade => {
            publish_lapsed(ctx, name, &key, lock, now);
            return Err(err(error::UPGRADE));
        }
        Outcome::Overflow => {
            publish_lapsed(ctx, name, &key, lock, now);
            return Err(err(error::HOLDS_OVERFLOW));
        }
        Outcome::Busy => {
            let next = taken.or(lock.next_lease_end());
            publish_lapsed(ctx, name, &key, lock, now);
            return match req.wait_ms {
                Some(timeout_ms)
                    if waiters::can_block(ctx) && !waiters::shed(ctx, name, &KIND, req.queue) =>
                {
                    drop(key);
                    waiters::block(
                        ctx,
                        name,
                        Waiter::new(&KIND, req.owner, req.ttl_ms, waiter_mode(mode)),
                        timeout_ms,
                    );
                    if let Some(at) = next {
                        waiters::watch_lease(ctx, name, at);
                    }
                    Ok(RedisValue::NoReply)
                }
                _ => Ok(RedisValue::Null),
            };
        }
    };
    if is_new {
        store(&key, &RWLOCK_TYPE, fresh);
    }
    if let Some(lock) = rw_in(&key)? {
        publish(ctx, name, &key, lock, now);
    }
    notify(
        ctx,
        if mode == Mode::Read {
            c"rwlock.read"
        } else {
            c"rwlock.write"
        },
        name,
    );
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

/// `RWLOCK.READ key owner ttl [WAIT timeout]`
pub fn read(ctx: &Context, args: &[Arg]) -> RedisResult {
    request(ctx, args, Mode::Read)
}

/// `RWLOCK.WRITE key owner ttl [WAIT timeout]`
pub fn write(ctx: &Context, args: &[Arg]) -> RedisResult {
    request(ctx, args, Mode::Write)
}

/// `RWLOCK.UNLOCK key owner [READ | WRITE]`
pub fn unlock(ctx: &Context, args: &[Arg]) -> RedisResult {
    if !(3..=4).contains(&args.len()) {
        return Err(RedisError::WrongArity);
    }
    let owner = args::owner(&args[2]).map_err(err)?;
    let mode = match args.get(3) {
        None => None,
        Some(m) if m.eq_ignore_ascii_case(b"READ") => Some(Mode::Read),
        Some(m) if m.eq_ignore_ascii_case(b"WRITE") => Some(Mode::Write),
        Some(_) => return Err(err(error::SYNTAX)),
    };
    refuse_on_replica(ctx)?;
    let name = &args[1];
    let key = Key::write(ctx, &args[1]);
    let Some(lock) = rw_in(&key)? else {
        stats::REFUSED_RELEASES.add(1);
        return Ok(RedisValue::Integer(-1));
    };
    let now = now_ms();
    let reply = match lock.unlock_in(owner, mode, now) {
        Unlock::NotHeld => {
            publish_lapsed(ctx, name, &key, lock, now);
            stats::REFUSED_RELEASES.add(1);
            return Ok(RedisValue::Integer(-1));
        }
        Unlock::Remaining => 0,
        Unlock::Gone => 1,
    };
    // Hand-off in place: the waiters that now fit join the holders in this
    // same value, published once.
    let granted = if reply == 1 && waiters::queued(ctx, name, &KIND) > 0 {
        grant_waiting(ctx, name, lock, now)
    } else {
        Vec::new()
    };
    let next = lock.next_lease_end();
    publish(ctx, name, &key, lock, now);
    notify(ctx, c"rwlock.unlock", name);
    drop(key);
    if !granted.is_empty() {
        notify(ctx, c"rwlock.handoff", name);
        answer_granted(ctx, granted);
        if let Some(at) = next {
            waiters::watch_lease(ctx, name, at);
        }
    } else if reply == 1 {
        // The head may be of another kind, or the key free for it now.
        waiters::serve(ctx, name);
    }
    Ok(RedisValue::Integer(reply))
}

/// `RWLOCK.EXTEND key owner ttl`
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
    let Some(lock) = rw_in(&key)? else {
        return Ok(RedisValue::Integer(0));
    };
    let now = now_ms();
    if !lock.extend(owner, now, ttl_ms) {
        publish_lapsed(ctx, name, &key, lock, now);
        return Ok(RedisValue::Integer(0));
    }
    publish(ctx, name, &key, lock, now);
    notify(ctx, c"rwlock.extend", name);
    if let Some(at) = lock.next_lease_end() {
        waiters::watch_lease(ctx, name, at);
    }
    drop(key);
    held::reply(ctx, None, 1, Answer::Integer(0), None)
}

/// `RWLOCK.INFO key`
pub fn info(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    let key = Key::read(ctx, &args[1]);
    let Some(stored) = rw_in(&key)? else {
        return Ok(RedisValue::Null);
    };
    // A view at this instant: holds whose own lease ended are not counted.
    let now = now_ms();
    let mut lock = stored.clone();
    lock.prune(now);
    if lock.is_free() {
        return Ok(RedisValue::Null);
    }
    let mode = if lock.writer.is_some() {
        "write"
    } else {
        "read"
    };
    let writer = lock
        .writer
        .as_ref()
        .map_or(Field::Null, |w| Field::Bytes(&w.owner));
    reply::map(
        ctx,
        &[
            ("mode", Field::Bytes(mode.as_bytes())),
            ("writer", writer),
            ("readers", Field::Int(lock.readers.len() as i64)),
            ("holds", Field::Int(lock.holds() as i64)),
            (
                "ttl",
                Field::Int(lock.deadline().map_or(0, |d| (d - now).max(0))),
            ),
            ("fence", Field::Int(lock.fence as i64)),
            (
                "waiters",
                Field::Int(waiters::queued(ctx, &args[1], &KIND) as i64),
            ),
        ],
    )
}

/// `WARDEN.RWSET key fence (W|R owner holds fence deadline_ms)...`: the full
/// state of a read-write lock as replicas and the AOF receive it.
pub fn set(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() < 8 || !(args.len() - 3).is_multiple_of(5) {
        return Err(RedisError::WrongArity);
    }
    effects_only(ctx)?;
    let invalid = || err(error::INVALID_EFFECT);
    let fence = args::integer(&args[2])
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(invalid)?;
    let mut lock = RwLock {
        fence,
        ..RwLock::default()
    };
    for group in args[3..].chunks(5) {
        let number = |i: usize| args::integer(&group[i]).and_then(|n| u64::try_from(n).ok());
        let (Some(holds), Some(hold_fence), Some(deadline)) = (number(2), number(3), number(4))
        else {
            return Err(invalid());
        };
        if !valid_lock(&group[1], holds, hold_fence) || hold_fence > fence {
            return Err(invalid());
        }
        let hold = Hold {
            owner: group[1].to_vec(),
            holds,
            fence: hold_fence,
            deadline_ms: deadline as i64,
            granted_ms: 0,
        };
        match &group[0][..] {
            b"W" if lock.writer.is_none() => lock.writer = Some(hold),
            b"R" if !lock.readers.iter().any(|r| r.owner == hold.owner) => lock.readers.push(hold),
            _ => return Err(invalid()),
        }
    }
    if !crate::datatypes::valid_rwlock(&lock) {
        return Err(invalid());
    }
    let key = Key::write(ctx, &args[1]);
    let existing = key.value::<RwLock>(&RWLOCK_TYPE).map_err(err)?;
    FENCES.observe(fence);
    let deadline = lock.deadline();
    match existing {
        Some(existing) => *existing = lock,
        None => store(&key, &RWLOCK_TYPE, lock),
    }
    if let Some(at) = deadline {
        key.set_expire_at(at);
    }
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// `WARDEN.RWHOLD key now_ms fence (W|R owner holds fence deadline_ms)...`:
/// the holds one command on the master changed (holds 0: gone), applied
/// after dropping the holds whose lease ended before the master's `now_ms`.
/// The key's expiry becomes the latest lease end.
pub fn hold(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() < 9 || !(args.len() - 4).is_multiple_of(5) {
        return Err(RedisError::WrongArity);
    }
    effects_only(ctx)?;
    let invalid = || err(error::INVALID_EFFECT);
    let number = |arg: &Arg| args::integer(arg).and_then(|n| u64::try_from(n).ok());
    let (Some(now), Some(fence)) = (number(&args[2]), number(&args[3])) else {
        return Err(invalid());
    };
    if !crate::fence::acceptable(fence) {
        return Err(invalid());
    }
    let mut delta = Vec::with_capacity((args.len() - 4) / 5);
    for group in args[4..].chunks(5) {
        let mode = match &group[0][..] {
            b"W" => Mode::Write,
            b"R" => Mode::Read,
            _ => return Err(invalid()),
        };
        let (Some(holds), Some(hold_fence), Some(deadline)) =
            (number(&group[2]), number(&group[3]), number(&group[4]))
        else {
            return Err(invalid());
        };
        let owner = &group[1][..];
        let deadline = deadline as i64;
        let valid = match holds {
            0 => (1..=crate::args::MAX_OWNER).contains(&owner.len()),
            _ => valid_lock(owner, holds, hold_fence) && bounded_deadline(deadline) == deadline,
        };
        if !valid {
            return Err(invalid());
        }
        delta.push(DeltaHold {
            mode,
            owner: owner.to_vec(),
            holds,
            fence: hold_fence,
            deadline_ms: deadline,
        });
    }
    let key = Key::write(ctx, &args[1]);
    // A delta needs the state it follows: the master sends a new key whole.
    let Some(lock) = key.value::<RwLock>(&RWLOCK_TYPE).map_err(err)? else {
        return Err(invalid());
    };
    if !lock.apply_delta(now as i64, fence, &delta) {
        return Err(invalid());
    }
    FENCES.observe(fence);
    if let Some(at) = lock.deadline() {
        key.set_expire_at(at);
    }
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}
