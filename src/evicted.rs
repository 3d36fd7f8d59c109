//! Held locks that the server evicted anyway.
//!
//! Invariant — at most one holder, even under eviction: when a held lock or
//! read-write lock is evicted, its key stays taken in module memory until the
//! evicted lease's deadline, so nobody else is granted it before the old
//! holder's lease would have ended (the old holder's `RELEASE`/`EXTEND` answer
//! that it no longer holds it, as for any lost lock). Lock keys belong on a
//! server that does not evict: the log warns at load and when a config change
//! makes eviction possible.
//!
//! The `evicted` keyspace event (heard once eviction is possible) comes after
//! the value is gone, so the type's `unlink` callback remembers the last lock
//! unlinked (only while eviction is possible) and the event turns it into a
//! tombstone. Its deadline is the lock's lease, which a lock value always
//! holds as a finite time: the key's expiry as warden last read it (every
//! command that opens the lock reads it), and a key without expiry keeps the
//! lease it was granted.
//! Tombstones move with `SWAPDB`, are cleared by `FLUSHALL`/`FLUSHDB` (as a
//! held lock would be), and are saved in the RDB's aux data where the server
//! can save aux data only when there is some (see `datatypes`), so a reload
//! or a restart keeps them there.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{logging, raw, Context};

use crate::args::MAX_MS;
use crate::events::{Listener, Server};
use crate::guard;
use crate::keyspace::now_ms;
use crate::stats;
use crate::waiters::{self, QueueKey};

/// Whether the server may evict keys now (a limit and a policy that evicts).
static EVICTION_POSSIBLE: AtomicBool = AtomicBool::new(false);

struct Tombstone {
    deadline_ms: i64,
    /// Whether a timer ends it (entries loaded from an RDB get one once loading ends).
    armed: bool,
}

thread_local! {
    /// The last lock unlinked from the keyspace: key and lease deadline.
    static LAST_UNLINKED: RefCell<Option<(QueueKey, i64, bool)>> = const { RefCell::new(None) };
    static TOMBSTONES: RefCell<HashMap<QueueKey, Tombstone>> = RefCell::new(HashMap::new());
}

pub fn eviction_possible() -> bool {
    EVICTION_POSSIBLE.load(Ordering::Relaxed)
}

/// From a lock type's `unlink` callback (`lock`), or a rate limiter's:
/// remember what may be about to be reported as evicted.
pub fn on_unlink(db: c_int, name: &[u8], deadline_ms: i64, lock: bool) {
    if EVICTION_POSSIBLE.load(Ordering::Relaxed) {
        let q = QueueKey {
            db,
            name: name.to_vec(),
        };
        LAST_UNLINKED.with(|l| *l.borrow_mut() = Some((q, deadline_ms, lock)));
    }
}

/// From the `evicted` keyspace event (the selected db is the key's).
pub fn on_evicted(ctx: *mut raw::RedisModuleCtx, name: &[u8]) {
    let q = waiters::queue_key(ctx, name);
    let Some((_, deadline_ms, lock)) =
        LAST_UNLINKED.with(|l| l.borrow_mut().take_if(|(k, _, _)| *k == q))
    else {
        return;
    };
    if lock {
        stats::EVICTED_LOCKS.add(1);
    }
    let now = now_ms();
    if !(now < deadline_ms && deadline_ms <= now.saturating_add(MAX_MS)) {
        return;
    }
    logging::log_warning(if lock {
        format!(
            "warden: a held lock was evicted; its key stays taken until its lease ends in {} ms \
             (set maxmemory-policy noeviction on lock servers)",
            deadline_ms - now
        )
    } else {
        format!(
            "warden: a rate limiter was evicted; a new one on its key resumes its state until it \
             would have been full in {} ms (set maxmemory-policy noeviction on limiter servers)",
            deadline_ms - now
        )
    });
    TOMBSTONES.with(|t| {
        t.borrow_mut().insert(
            q.clone(),
            Tombstone {
                deadline_ms,
                armed: false,
            },
        )
    });
    arm(ctx);
}

/// Gives every tombstone without one a timer that ends it at its deadline.
pub fn arm(ctx: *mut raw::RedisModuleCtx) {
    let unarmed: Vec<(QueueKey, i64)> = TOMBSTONES.with(|t| {
        t.borrow_mut()
            .iter_mut()
            .filter(|(_, s)| !s.armed)
            .map(|(q, s)| {
                s.armed = true;
                (q.clone(), s.deadline_ms)
            })
            .collect()
    });
    for (q, deadline_ms) in unarmed {
        let data = Box::into_raw(Box::new((q, deadline_ms))).cast::<c_void>();
        let delay = (deadline_ms + 1 - now_ms()).max(0);
        unsafe { raw::RedisModule_CreateTimer.unwrap()(ctx, delay, Some(on_tombstone_end), data) };
    }
}

/// What the RDB keeps: (db, key, deadline) of every evicted lock still taking its key.
pub fn snapshot() -> Vec<(c_int, Vec<u8>, i64)> {
    TOMBSTONES.with(|t| {
        t.borrow()
            .iter()
            .map(|(q, s)| (q.db, q.name.clone(), s.deadline_ms))
            .collect()
    })
}

/// An entry read back from the RDB (armed once loading ends); one that ended
/// already, or lies further ahead than any lease can reach, is dropped.
pub fn restore(db: c_int, name: &[u8], deadline_ms: i64) {
    if deadline_ms <= now_ms() || crate::datatypes::bounded_deadline(deadline_ms) != deadline_ms {
        return;
    }
    let q = QueueKey {
        db,
        name: name.to_vec(),
    };
    TOMBSTONES.with(|t| {
        t.borrow_mut().entry(q).or_insert(Tombstone {
            deadline_ms,
            armed: false,
        });
    });
}

/// `FLUSHALL` (`db` -1) or `FLUSHDB`: the evicted locks of those databases go,
/// as held ones do. (`DEBUG RELOAD` flushes too; the aux data brings them back.)
pub fn forget_db(db: c_int) {
    TOMBSTONES.with(|t| t.borrow_mut().retain(|q, _| db != -1 && q.db != db));
}

/// Whether any evicted lock still keeps its key taken (aux data is saved then).
pub fn any() -> bool {
    TOMBSTONES.with(|t| !t.borrow().is_empty())
}

/// `SWAPDB`: evicted locks move with their database, as held ones do.
pub fn swap_dbs(a: c_int, b: c_int) {
    TOMBSTONES.with(|t| {
        let mut t = t.borrow_mut();
        let moved: Vec<(QueueKey, Tombstone)> = t.drain().collect();
        for (mut q, s) in moved {
            if q.db == a {
                q.db = b;
            } else if q.db == b {
                q.db = a;
            }
            t.insert(q, s);
        }
    });
}

extern "C" fn on_tombstone_end(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard::callback((), || {
        let (q, deadline_ms) = *unsafe { Box::from_raw(data.cast::<(QueueKey, i64)>()) };
        let ended = TOMBSTONES.with(|t| {
            let mut t = t.borrow_mut();
            let ended = t.get(&q).is_some_and(|s| s.deadline_ms == deadline_ms);
            if ended {
                t.remove(&q);
                if t.capacity() > 64 && t.len() * 4 < t.capacity() {
                    t.shrink_to_fit();
                }
            }
            ended
        });
        if ended {
            waiters::mark_dirty(ctx, q);
        }
    })
}

/// Until when `name` (in the selected db) stays taken by an evicted lock.
pub fn taken_until(ctx: &Context, name: &[u8]) -> Option<i64> {
    if TOMBSTONES.with(|t| t.borrow().is_empty()) {
        return None;
    }
    let q = waiters::queue_key(ctx.ctx, name);
    let now = now_ms();
    TOMBSTONES.with(|t| {
        t.borrow()
            .get(&q)
            .map(|s| s.deadline_ms)
            .filter(|&d| d > now)
    })
}

/// Evicted locks still keeping their keys taken.
pub fn count() -> usize {
    TOMBSTONES.with(|t| t.borrow().len())
}

/// A field of `INFO memory` (`maxmemory`, `maxmemory_policy`): read there,
/// not with `CONFIG GET`, which servers often rename or disable.
fn memory_info(ctx: &Context, field: &CStr) -> String {
    unsafe {
        let data = raw::RedisModule_GetServerInfo.unwrap()(ctx.ctx, c"memory".as_ptr());
        if data.is_null() {
            return String::new();
        }
        let v = raw::RedisModule_ServerInfoGetFieldC.unwrap()(data, field.as_ptr());
        let value = if v.is_null() {
            String::new()
        } else {
            CStr::from_ptr(v).to_string_lossy().into_owned()
        };
        raw::RedisModule_FreeServerInfo.unwrap()(ctx.ctx, data);
        value
    }
}

/// Which keys a `maxmemory-policy` evicts once `maxmemory` is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evicts {
    /// `noeviction`: none; writes that need memory answer `OOM`.
    Nothing,
    /// `volatile-*`: keys with an expiry, and every held lock has one (its lease).
    KeysWithExpiry,
    /// `allkeys-*`: any key.
    AnyKey,
    /// A name warden does not know (a later server's policy), or none could
    /// be read: treated as `AnyKey`. Taking it for `noeviction` would leave
    /// evicted locks unguarded, and two holders; the other way round costs a
    /// warning and a tombstone nobody needed.
    Unknown,
}

impl Evicts {
    /// Whether held locks may be evicted under this policy.
    pub fn locks(self) -> bool {
        self != Evicts::Nothing
    }

    /// What the load-time warning says the policy evicts.
    fn what(self) -> &'static str {
        match self {
            Evicts::Nothing => "no key",
            Evicts::KeysWithExpiry => "keys with an expiry, which every held lock has (its lease)",
            Evicts::AnyKey => "any key",
            Evicts::Unknown => "keys warden cannot tell (an unknown policy: taken as any key)",
        }
    }
}

/// Classifies a `maxmemory-policy` as `INFO memory` names it. Redis 7.0+ and
/// Valkey have `noeviction`, the `-lru`, `-lfu` and `-random` policies of
/// both kinds and `volatile-ttl`; Redis 8.6 added `volatile-lrm` and
/// `allkeys-lrm` (least recently modified: reads do not count).
pub fn classify(policy: &str) -> Evicts {
    match policy.to_ascii_lowercase().as_str() {
        "noeviction" => Evicts::Nothing,
        "volatile-lru" | "volatile-lfu" | "volatile-lrm" | "volatile-random" | "volatile-ttl" => {
            Evicts::KeysWithExpiry
        }
        "allkeys-lru" | "allkeys-lfu" | "allkeys-lrm" | "allkeys-random" => Evicts::AnyKey,
        _ => Evicts::Unknown,
    }
}

/// Whether the server may evict held locks: a `maxmemory` (`0` is none)
/// and a policy that evicts them.
pub fn locks_evictable(policy: &str, maxmemory: &str) -> bool {
    maxmemory != "0" && classify(policy).locks()
}

/// Reads the eviction settings; warns when lock keys could be evicted.
fn check_policy(ctx: &Context) {
    let policy = memory_info(ctx, c"maxmemory_policy");
    let limit = memory_info(ctx, c"maxmemory");
    let possible = locks_evictable(&policy, &limit);
    crate::memory::set_limit(limit.parse().unwrap_or(0), possible);
    let was = EVICTION_POSSIBLE.swap(possible, Ordering::Relaxed);
    if possible {
        crate::events::hear_evictions();
    }
    if possible && !was {
        logging::log_warning(format!(
            "warden: maxmemory-policy {policy} with maxmemory {limit} can evict lock keys \
             (it evicts {}); keep locks on a server with maxmemory-policy noeviction (an evicted \
             lock keeps its key taken until its lease ends)",
            classify(&policy).what()
        ));
    }
}

extern "C" fn on_config_change(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    guard::callback((), || {
        let ctx = Context::new(ctx);
        check_policy(&ctx);
        crate::cache::filter::check_settings(&ctx);
        crate::roster::mark_durability(&ctx);
    })
}

fn on_key(ctx: *mut raw::RedisModuleCtx, name: &[u8], event: &CStr) {
    if event == c"evicted" {
        on_evicted(ctx, name);
    }
}

fn on_server(ctx: *mut raw::RedisModuleCtx, event: &Server) {
    match event {
        Server::Swapped { first, second } => swap_dbs(*first, *second),
        Server::Loaded => arm(ctx),
        Server::Flushed { db } => forget_db(*db),
        _ => {}
    }
}

/// What eviction tombstones hear: evictions, flushes, `SWAPDB`, the end of a load.
pub static EVENTS: Listener = Listener {
    key: on_key,
    server: on_server,
};

/// Checks the eviction policy now and on every config change.
pub fn watch_policy(ctx: &Context) -> bool {
    check_policy(ctx);
    crate::cache::filter::check_settings(ctx);
    let event = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_CONFIG,
        dataver: 1,
    };
    let status = unsafe {
        raw::RedisModule_SubscribeToServerEvent.unwrap()(ctx.ctx, event, Some(on_config_change))
    };
    status == raw::REDISMODULE_OK as c_int
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every policy name of Redis 7.0 to 8.6 and Valkey 9, some it may
    /// meet later, and the spellings `CONFIG SET` accepts.
    #[test]
    fn every_policy_is_classified() {
        let table = [
            ("noeviction", Evicts::Nothing),
            ("volatile-lru", Evicts::KeysWithExpiry),
            ("volatile-lfu", Evicts::KeysWithExpiry),
            ("volatile-lrm", Evicts::KeysWithExpiry),
            ("volatile-random", Evicts::KeysWithExpiry),
            ("volatile-ttl", Evicts::KeysWithExpiry),
            ("allkeys-lru", Evicts::AnyKey),
            ("allkeys-lfu", Evicts::AnyKey),
            ("allkeys-lrm", Evicts::AnyKey),
            ("allkeys-random", Evicts::AnyKey),
            ("ALLKEYS-LRM", Evicts::AnyKey),
            ("Volatile-LRM", Evicts::KeysWithExpiry),
            // Names no server had when this was written: taken as any key.
            ("volatile-xyz", Evicts::Unknown),
            ("allkeys-xyz", Evicts::Unknown),
            ("lrm", Evicts::Unknown),
            ("no-eviction", Evicts::Unknown),
            ("noeviction ", Evicts::Unknown),
            ("", Evicts::Unknown),
        ];
        for (policy, evicts) in table {
            assert_eq!(classify(policy), evicts, "{policy:?}");
        }
    }

    #[test]
    fn locks_are_evictable_under_every_policy_but_noeviction_when_maxmemory_is_set() {
        let table = [
            ("noeviction", "1048576", false),
            ("noeviction", "0", false),
            ("volatile-lru", "1048576", true),
            ("volatile-lfu", "1048576", true),
            ("volatile-lrm", "1048576", true),
            ("volatile-random", "1048576", true),
            ("volatile-ttl", "1048576", true),
            ("allkeys-lru", "1048576", true),
            ("allkeys-lfu", "1048576", true),
            ("allkeys-lrm", "1048576", true),
            ("allkeys-random", "1048576", true),
            ("volatile-lrm", "0", false),
            ("allkeys-lrm", "0", false),
            ("some-later-policy", "1048576", true),
            ("some-later-policy", "0", false),
            ("", "1048576", true),
        ];
        for (policy, maxmemory, evictable) in table {
            assert_eq!(
                locks_evictable(policy, maxmemory),
                evictable,
                "{policy:?} with maxmemory {maxmemory}"
            );
        }
    }
}
