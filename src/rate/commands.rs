//! `RATE.*`: parse, open the key, apply the pure rules (`state`), reply,
//! replicate the new state.
//!
//! Invariants kept here:
//! - the bound: every admission goes through `Limiter::decide`, at the
//!   time it is made, with the floor a lost admission may have left
//!   (`grace::lost_until`, an evicted limiter's tombstone);
//! - strict FIFO: a request is decided at once only when nobody waits on
//!   the key; waiters are served from the head only, each at the first ms
//!   its tokens conform, and a later one never goes first, whatever its cost;
//! - no grant after a deadline: a waiter whose tokens cannot conform by its
//!   deadline is answered limited (with its retry-after) as soon as that is
//!   known — when it arrives, or when it reaches the head — never granted;
//! - one reply per request: a waiter is answered only through
//!   `waiters::answer`, after it was taken off its queue; a grant that never
//!   reached its client (it left, the replicas did not acknowledge it) gives
//!   its tokens back (`revoke`): an abandoned request consumes nothing;
//! - replicas and the AOF receive the state (`WARDEN.RATESET`), never a
//!   clock reading: a replica holds exactly what its master decided.

use redis_module::{Context, RedisError, RedisResult, RedisValue};

use crate::acks;
use crate::args;
use crate::command::Arg;
use crate::datatypes::store;
use crate::error;
use crate::evicted;
use crate::grace;
use crate::keyspace::{
    effects_needed, effects_only, notify, now_ms, refuse_on_replica, replicate_del, Key,
};
use crate::rate::datatype::{effect_words, RATE_EFFECT, RATE_TYPE};
use crate::rate::state::{Decision, Limiter, Rate};
use crate::reply::{self, Field};
use crate::stats;
use crate::waiters::{self, held, Answer, Kind, Mode, Served, Waiter};

fn err(text: &'static str) -> RedisError {
    RedisError::Str(text)
}

/// The limiter in `key`. Its key expires when the bucket is full again;
/// an expiry removed (`PERSIST`) or moved past that is put back.
pub fn limiter_in(key: &Key) -> Result<Option<&mut Limiter>, RedisError> {
    let l = key.value::<Limiter>(&RATE_TYPE).map_err(err)?;
    if let Some(l) = l.as_ref() {
        let full = l.full_at_ms();
        if key.expire_at().is_none_or(|at| at > full) {
            key.restore_expire_at(full);
        }
    }
    Ok(l)
}

/// The rate a waiter stated, and the tokens it asks for.
fn request_of(w: &Waiter) -> Option<(Rate, u64)> {
    match w.mode {
        Mode::Tokens {
            cost,
            count,
            period_ms,
            burst,
        } => Some((
            Rate {
                count,
                period_ms,
                burst,
            },
            cost,
        )),
        _ => None,
    }
}

/// A new limiter on a key that holds none: full, unless an evicted limiter
/// left a tombstone (then it resumes the evicted one's state: full at the
/// same time, rounded up to a ms).
fn fresh(ctx: &Context, name: &Arg, rate: Rate) -> Limiter {
    let mut l = Limiter::new(rate);
    if let Some(until) = evicted::taken_until(ctx, name) {
        l.tat = i128::from(until) * i128::from(rate.count);
    }
    l
}

/// Writes the key's expiry (when the bucket is full again) and sends the
/// state to replicas and the AOF; a full bucket is no limiter at all.
fn publish(ctx: &Context, name: &Arg, key: &Key, l: &Limiter, now: i64) {
    let full = l.full_at_ms();
    if full <= now {
        key.delete();
        replicate_del(ctx, name);
        return;
    }
    key.set_expire_at(full);
    if !effects_needed(ctx) {
        return;
    }
    let words = effect_words(l);
    let mut all: Vec<&[u8]> = Vec::with_capacity(words.len() + 1);
    all.push(&name[..]);
    all.extend(words.iter().map(|w| &w[..]));
    ctx.replicate(RATE_EFFECT, &all[..]);
}

fn decision(d: &Decision, grant: Option<u64>) -> Answer {
    if d.limited {
        stats::RATE_LIMITED.add(1);
    } else {
        stats::RATE_ALLOWED.add(1);
    }
    Answer::Decision {
        grant: grant.map(|c| c as i64),
        words: d.words(),
    }
}

/// Serves the queue with the key open: each head at the first ms its tokens
/// conform; a head that cannot conform by its deadline is answered limited.
fn serve_open(ctx: &Context, name: &Arg, key: &Key) -> Served {
    let existing = match limiter_in(key) {
        Err(_) => return Served::WrongType,
        Ok(existing) => existing,
    };
    if waiters::grants_held() {
        // A grant is being taken back while writes are paused: nothing new.
        return Served::Wait(None);
    }
    let mut made = None;
    let l: &mut Limiter = match existing {
        Some(l) => l,
        None => {
            let Some(Some((rate, _))) = waiters::peek(ctx, name, &KIND, request_of) else {
                return Served::Wait(None);
            };
            made.insert(fresh(ctx, name, rate))
        }
    };
    let now = now_ms();
    let floor = grace::lost_until();
    let mut answered: Vec<(Waiter, Answer)> = Vec::new();
    let mut admitted = false;
    let mut next = None;
    while let Some((id, request, deadline)) = waiters::peek(ctx, name, &KIND, |w| {
        (w.client_id(), request_of(w), w.deadline_ms())
    }) {
        let Some((rate, cost)) = request else { break };
        let conform = l.conform_at(now, floor, 0, cost);
        let wait_more = rate == l.rate && conform > now && conform <= deadline;
        if wait_more {
            next = Some(conform - 1);
            break;
        }
        let Some(w) = waiters::pop_head(ctx, name, &KIND, |w| w.client_id() == id) else {
            continue; // the head timed out meanwhile: look again
        };
        let answer = if rate != l.rate {
            Answer::Error(error::RATE_CHANGED)
        } else if conform <= now {
            admitted = true;
            let d = l.decide(now, floor, cost);
            debug_assert!(!d.limited);
            decision(&d, Some(cost))
        } else {
            decision(&l.limited_until(now, floor, conform), None)
        };
        answered.push((w, answer));
    }
    if admitted {
        let snapshot = l.clone();
        if let Some(l) = made {
            store(key, &RATE_TYPE, l);
        }
        publish(ctx, name, key, &snapshot, now);
        notify(ctx, c"rate.acquire", name);
    }
    for (w, answer) in answered {
        waiters::answer(ctx, w, answer);
    }
    Served::Wait(next)
}

/// The rate limiter as a kind of waiter.
pub struct RateKind;
pub static KIND: RateKind = RateKind;

impl Kind for RateKind {
    fn index(&self) -> usize {
        4
    }

    fn name(&self) -> &'static str {
        "rate"
    }

    fn serve(&self, ctx: &Context, name: &Arg) -> Served {
        serve_open(ctx, name, &Key::write(ctx, name))
    }

    /// Gives back the tokens (`token`) of a grant that never reached its client.
    fn revoke(&self, ctx: &Context, name: &Arg, token: i64) {
        let key = Key::write(ctx, name);
        let Ok(Some(l)) = limiter_in(&key) else {
            return;
        };
        let now = now_ms();
        if l.refund(now, token.max(0) as u64) {
            let snapshot = l.clone();
            publish(ctx, name, &key, &snapshot, now);
        }
        drop(key);
        waiters::serve(ctx, name);
    }
}

/// What a request decided at once made of it.
enum Now {
    /// Its tokens were taken: the reply (now, or once the replicas
    /// acknowledged them).
    Taken(RedisResult),
    /// Limited now, or others wait ahead: when its tokens would conform,
    /// the limited answer, and the tokens asked by the waiters ahead.
    Later {
        conform: i64,
        limited: Decision,
        ahead: u64,
    },
}

/// Decides a request of `cost` tokens at `rate` on the open `key` without
/// waiting (the waiters whose time came are served first; a request never
/// overtakes a waiter). `reconfigure`: a limiter of another rate takes the
/// stated one (`GCRA`'s rule) instead of refusing it (`RATE.ACQUIRE`'s).
/// `shape` turns the five integers into the command's reply.
#[allow(clippy::too_many_arguments)]
fn decide_now(
    ctx: &Context,
    name: &Arg,
    key: Key,
    rate: Rate,
    cost: u64,
    wait_ms: Option<i64>,
    reconfigure: bool,
    shape: fn([i64; 5]) -> [i64; 5],
) -> Result<Now, RedisError> {
    if waiters::queued(ctx, name, &KIND) > 0 {
        serve_open(ctx, name, &key);
    }
    let now = now_ms();
    let existing = limiter_in(&key)?;
    let mut changed = false;
    if let Some(l) = existing.as_ref() {
        if l.rate != rate && !reconfigure {
            let has = (l.rate.count, l.rate.period_ms, l.rate.burst);
            let stated = (rate.count, rate.period_ms, rate.burst);
            return Err(RedisError::String(error::other_rate(has, stated)));
        }
    }
    let floor = grace::lost_until();
    let mut made = None;
    let l: &mut Limiter = match existing {
        Some(l) => {
            if l.rate != rate {
                l.reconfigure(now, rate);
                changed = true;
            }
            l
        }
        None => made.insert(fresh(ctx, name, rate)),
    };
    let ahead = waiters::queued_weight(ctx, name, &KIND);
    let d = if ahead == 0 {
        Some(l.decide(now, floor, cost))
    } else {
        None
    };
    if let Some(d) = d.filter(|d| !d.limited) {
        let snapshot = l.clone();
        if let Some(l) = made {
            store(&key, &RATE_TYPE, l);
        }
        publish(ctx, name, &key, &snapshot, now);
        notify(ctx, c"rate.acquire", name);
        drop(key);
        stats::RATE_ALLOWED.add(1);
        let answer = Answer::Decision {
            grant: Some(cost as i64),
            words: shape(d.words()),
        };
        let busy = Answer::Decision {
            grant: None,
            words: shape([1, rate.burst as i64, 0, 0, 0]),
        };
        let grant = Some((&KIND as &'static dyn Kind, &name[..], cost as i64));
        return Ok(Now::Taken(held::reply_answer(
            ctx, grant, answer, busy, wait_ms,
        )));
    }
    let conform = l.conform_at(now, floor, ahead, cost);
    let limited = l.limited_until(now, floor, conform);
    if changed {
        let snapshot = l.clone();
        publish(ctx, name, &key, &snapshot, now);
    }
    Ok(Now::Later {
        conform,
        limited,
        ahead,
    })
}

fn integers(words: [i64; 5]) -> RedisValue {
    RedisValue::Array(words.iter().map(|&w| RedisValue::Integer(w)).collect())
}

/// `RATE.ACQUIRE key count period [BURST burst] [COST cost] [WAIT timeout] [QUEUE n]`
pub fn acquire(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() < 4 {
        return Err(RedisError::WrongArity);
    }
    let req = args::rate_request(&args[2..]).map_err(RedisError::String)?;
    refuse_on_replica(ctx)?;
    acks::check_can_wait(ctx)?;
    let name = &args[1];
    if waiters::others_queued(ctx, name, &KIND) {
        waiters::serve(ctx, name);
    }
    let key = Key::write(ctx, name);
    limiter_in(&key)?;
    let rate = Rate::of(&req);
    let (conform, limited, ahead) =
        match decide_now(ctx, name, key, rate, req.cost, req.wait_ms, false, |w| w)? {
            Now::Taken(reply) => return reply,
            Now::Later {
                conform,
                limited,
                ahead,
            } => (conform, limited, ahead),
        };
    let blocks = match req.wait_ms {
        Some(timeout_ms) => {
            let deadline = if timeout_ms == 0 {
                i64::MAX
            } else {
                now_ms().saturating_add(timeout_ms)
            };
            conform <= deadline
                && waiters::can_block(ctx)
                && !waiters::shed(ctx, name, &KIND, req.queue)
        }
        None => false,
    };
    if !blocks {
        stats::RATE_LIMITED.add(1);
        return Ok(integers(limited.words()));
    }
    let mode = Mode::Tokens {
        cost: req.cost,
        count: rate.count,
        period_ms: rate.period_ms,
        burst: rate.burst,
    };
    waiters::block(
        ctx,
        name,
        Waiter::new(&KIND, b"", 0, mode),
        req.wait_ms.unwrap_or(0),
    );
    if ahead == 0 {
        waiters::watch_lease(ctx, name, conform - 1);
    }
    Ok(RedisValue::NoReply)
}

/// `GCRA key max_burst tokens_per_period period [TOKENS count]`: the core
/// proposal's command (Redisson's `RGcra`), on warden's limiter: a burst of
/// `max_burst + 1`, `period` in seconds, the reply's times in whole seconds
/// (rounded up). Its parameters go with each call, as in the proposal: a
/// limiter of another rate takes the stated one, keeping the tokens it owes.
pub fn gcra(ctx: &Context, args: &[Arg]) -> RedisResult {
    if !(5..=7).contains(&args.len()) {
        return Err(RedisError::WrongArity);
    }
    let (rate, tokens) = args::gcra_request(&args[2..]).map_err(RedisError::String)?;
    refuse_on_replica(ctx)?;
    acks::check_can_wait(ctx)?;
    let name = &args[1];
    let key = Key::write(ctx, name);
    limiter_in(&key)?;
    let rate = Rate {
        count: rate.0,
        period_ms: rate.1,
        burst: rate.2,
    };
    if tokens > rate.burst {
        // Never conforms: the proposal answers a retry-after of -1.
        let now = now_ms();
        // What the limiter would hold at the stated rate (it keeps what it
        // owes), without changing it: this request takes nothing.
        let stated = match limiter_in(&key)? {
            Some(l) => {
                let mut l = l.clone();
                if l.rate != rate {
                    l.reconfigure(now, rate);
                }
                l
            }
            None => fresh(ctx, name, rate),
        };
        let (remaining, reset) = stated.peek(now, grace::lost_until());
        stats::RATE_LIMITED.add(1);
        return Ok(integers(in_seconds([
            1,
            rate.burst as i64,
            remaining as i64,
            -1,
            reset,
        ])));
    }
    match decide_now(ctx, name, key, rate, tokens, None, true, in_seconds)? {
        Now::Taken(reply) => reply,
        Now::Later { limited, .. } => {
            stats::RATE_LIMITED.add(1);
            Ok(integers(in_seconds(limited.words())))
        }
    }
}

/// Whether to register `GCRA`: asked for, and the server has none.
pub fn gcra_wanted(ctx: &Context, requested: bool) -> bool {
    if !requested {
        ctx.log_notice("GCRA not registered (module argument gcra-command no)");
        return false;
    }
    let served = match ctx.call("COMMAND", &["INFO", "gcra"][..]) {
        Ok(RedisValue::Array(found)) => found
            .iter()
            .any(|v| !matches!(v, RedisValue::Null | RedisValue::NoReply)),
        _ => false,
    };
    if served {
        ctx.log_notice("GCRA not registered: the server has its own");
    } else {
        ctx.log_notice(
            "GCRA registered (the server has none; module argument gcra-command no leaves it out)",
        );
    }
    !served
}

/// The five integers with their times in whole seconds, rounded up.
fn in_seconds(mut words: [i64; 5]) -> [i64; 5] {
    for w in &mut words[3..] {
        if *w > 0 {
            *w = (*w + 999) / 1000;
        }
    }
    words
}

/// `RATE.REFUND key cost`
pub fn refund(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let cost = args::burst(&args[2]).map_err(|_| err(error::RATE_INVALID_REFUND))?;
    refuse_on_replica(ctx)?;
    let name = &args[1];
    let key = Key::write(ctx, name);
    let Some(l) = limiter_in(&key)? else {
        return Ok(RedisValue::Integer(0));
    };
    let now = now_ms();
    if !l.refund(now, cost) {
        return Ok(RedisValue::Integer(0));
    }
    let snapshot = l.clone();
    publish(ctx, name, &key, &snapshot, now);
    notify(ctx, c"rate.refund", name);
    drop(key);
    waiters::serve(ctx, name);
    Ok(RedisValue::Integer(1))
}

/// `RATE.CONFIG key count period [BURST burst]`
pub fn config(ctx: &Context, args: &[Arg]) -> RedisResult {
    let burst = match args.len() {
        0..=3 => return Err(RedisError::WrongArity),
        4 => None,
        6 if args::is_keyword(&args[4], "BURST") => Some(args::burst(&args[5]).map_err(err)?),
        // An option without its value, twice, or unknown.
        _ => return Err(err(error::SYNTAX)),
    };
    let (count, period_ms) = args::rate_numbers(&args[2], &args[3]).map_err(err)?;
    let rate = Rate {
        count,
        period_ms,
        burst: burst.unwrap_or(count.min(args::MAX_BURST)),
    };
    refuse_on_replica(ctx)?;
    let name = &args[1];
    let key = Key::write(ctx, name);
    let Some(l) = limiter_in(&key)? else {
        return Ok(RedisValue::Integer(0));
    };
    let now = now_ms();
    l.reconfigure(now, rate);
    let snapshot = l.clone();
    publish(ctx, name, &key, &snapshot, now);
    notify(ctx, c"rate.config", name);
    drop(key);
    // Waiters that stated the old rate are answered; the rest may go sooner.
    waiters::serve(ctx, name);
    Ok(RedisValue::Integer(1))
}

/// `RATE.INFO key`
pub fn info(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    let name = &args[1];
    let key = Key::read(ctx, name);
    let waiting = waiters::queued(ctx, name, &KIND);
    let stored = key.value::<Limiter>(&RATE_TYPE).map_err(err)?;
    let now = now_ms();
    // No key while waiters queue (a full bucket under a floor, a `DEL`):
    // the limiter their head stated.
    let waited = || waiters::peek(ctx, name, &KIND, request_of).flatten();
    let l = match stored.filter(|l| l.full_at_ms() > now) {
        Some(l) => l.clone(),
        None => match waited() {
            Some((rate, _)) if waiting > 0 => fresh(ctx, name, rate),
            _ => return Ok(RedisValue::Null),
        },
    };
    let (remaining, reset_after) = l.peek(now, grace::lost_until());
    reply::map(
        ctx,
        &[
            ("count", Field::Int(l.rate.count as i64)),
            ("period", Field::Int(l.rate.period_ms as i64)),
            ("burst", Field::Int(l.rate.burst as i64)),
            ("remaining", Field::Int(remaining as i64)),
            ("reset_after", Field::Int(reset_after)),
            ("waiters", Field::Int(waiting as i64)),
        ],
    )
}

/// `WARDEN.RATESET key count period burst tat_ms tat_rem`: a limiter's state
/// as replicas and the AOF receive it.
pub fn set(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 7 {
        return Err(RedisError::WrongArity);
    }
    effects_only(ctx)?;
    let number = |a: &Arg| args::integer(a).and_then(|n| u64::try_from(n).ok());
    let parsed = (
        number(&args[2]),
        number(&args[3]),
        number(&args[4]),
        args::integer(&args[5]),
        number(&args[6]),
    );
    let (Some(count), Some(period_ms), Some(burst), Some(tat_ms), Some(tat_rem)) = parsed else {
        return Err(err(error::INVALID_EFFECT));
    };
    let rate = Rate {
        count,
        period_ms,
        burst,
    };
    let l = Limiter::from_parts(rate, tat_ms, tat_rem).ok_or(err(error::INVALID_EFFECT))?;
    let key = Key::write(ctx, &args[1]);
    key.value::<Limiter>(&RATE_TYPE).map_err(err)?;
    let full = l.full_at_ms();
    store(&key, &RATE_TYPE, l);
    key.set_expire_at(full);
    Ok(RedisValue::SimpleStringStatic("OK"))
}
