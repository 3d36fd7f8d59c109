//! Keys whose value came from outside warden's own grants — `RESTORE` (a
//! client's, `MIGRATE`'s, the master's, the AOF's), `COPY`, a load that capped
//! a lease — get their expiry put back to their lease right after the
//! command, so that `PTTL` tells the lease again.
//!
//! Why a timer: the type callbacks that build such a value (`rdb_load`,
//! `copy2`) run before the server stores the key and sets its expiry from
//! `RESTORE`'s ttl or `COPY`'s source, so they cannot set it. A keyspace
//! subscription to `restore`/`copy_to` would be called for every generic
//! event of every key (`DEL`, `EXPIRE`, ...), and a write made in it reaches
//! replicas before the `RESTORE` itself on Redis 7.0. A timer of 0 ms runs in
//! the same event-loop turn, after the command (and its transaction or
//! script) has returned: what it replicates (`PEXPIREAT`) follows the
//! `RESTORE`/`COPY` on replicas and in the AOF, on every server. Until it
//! runs — commands of that turn, the rest of a `MULTI` — `PTTL` may show the
//! longer expiry; the lease itself is already the one in the value.
//!
//! A replica puts back nothing: the master's `PEXPIREAT` reaches it. What the
//! timer does is what the kind's next command on the key would do.
//!
//! Keys are noted by database and name: a `SWAPDB` before the timer runs
//! swaps the noted numbers, a flush forgets the keys it removed. A `MOVE` or
//! `RENAME` in between takes the key where the timer does not look; its lease
//! is still the one in the value, and the kind's next command puts its
//! expiry back.

use std::cell::{Cell, RefCell};
use std::os::raw::{c_char, c_int, c_void};
use std::sync::OnceLock;
use std::thread::ThreadId;

use redis_module::raw;

use crate::events::{self, Listener, Server};
use crate::guard;
use crate::keyspace::{maybe_replica, Key};

/// The thread the server runs commands on (type callbacks elsewhere note nothing).
static MAIN: OnceLock<ThreadId> = OnceLock::new();

thread_local! {
    /// Keys to look at, by database; a key noted twice is looked at twice.
    static PENDING: RefCell<Vec<(c_int, Vec<u8>)>> = const { RefCell::new(Vec::new()) };
    static ARMED: Cell<bool> = const { Cell::new(false) };
}

/// Called once, on the main thread, while the module loads.
pub fn init() -> bool {
    MAIN.get_or_init(|| std::thread::current().id());
    true
}

/// Whether the server is loading a dataset (an RDB, the AOF, a full sync).
pub fn loading() -> bool {
    let flags = unsafe { raw::RedisModule_GetContextFlags.unwrap()(std::ptr::null_mut()) };
    flags & raw::REDISMODULE_CTX_FLAGS_LOADING as c_int != 0
}

/// Notes the key `rdb_load` is building a value for (when the server says
/// which: `RESTORE` and loads do).
pub unsafe fn note_loaded(rdb: *mut raw::RedisModuleIO) {
    let name = raw::RedisModule_GetKeyNameFromIO.unwrap()(rdb);
    let db = raw::RedisModule_GetDbIdFromIO.unwrap()(rdb);
    if !name.is_null() && db >= 0 {
        note(db, name);
    }
}

/// Notes the key `COPY` is building a value for.
pub unsafe fn note_copied(ctx: *mut raw::RedisModuleKeyOptCtx) {
    let name = raw::RedisModule_GetToKeyNameFromOptCtx.unwrap()(ctx);
    let db = raw::RedisModule_GetToDbIdFromOptCtx.unwrap()(ctx);
    if !name.is_null() && db >= 0 {
        note(db, name);
    }
}

unsafe fn note(db: c_int, name: *const raw::RedisModuleString) {
    if MAIN.get() != Some(&std::thread::current().id()) {
        return;
    }
    let mut len = 0;
    let ptr = raw::string_ptr_len(name.cast_mut(), &mut len);
    let bytes = std::slice::from_raw_parts(ptr.cast::<u8>(), len).to_vec();
    PENDING.with_borrow_mut(|p| p.push((db, bytes)));
    if !ARMED.replace(true) {
        raw::RedisModule_CreateTimer.unwrap()(
            events::detached(),
            0,
            Some(on_timer),
            std::ptr::null_mut(),
        );
    }
}

/// Follows the noted keys where a `SWAPDB` takes them; forgets those a flush
/// removed (`db` -1: all).
fn on_server(_ctx: *mut raw::RedisModuleCtx, event: &Server) {
    PENDING.with_borrow_mut(|pending| match *event {
        Server::Swapped { first, second } => {
            for (db, _) in pending.iter_mut() {
                if *db == first {
                    *db = second;
                } else if *db == second {
                    *db = first;
                }
            }
        }
        Server::Flushed { db: -1 } => pending.clear(),
        Server::Flushed { db } => pending.retain(|(noted, _)| *noted != db),
        _ => {}
    });
}

/// What moves or removes noted keys: `SWAPDB`, flushes.
pub static EVENTS: Listener = Listener {
    key: events::ignore_key,
    server: on_server,
};

/// At most this many keys per timer run: a load that capped a million leases
/// does not stall the event loop in one go.
const BATCH: usize = 10_000;

extern "C" fn on_timer(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard::callback((), || {
        ARMED.set(false);
        let batch: Vec<(c_int, Vec<u8>)> = PENDING.with_borrow_mut(|p| {
            let rest = p.split_off(p.len().min(BATCH));
            std::mem::replace(p, rest)
        });
        if maybe_replica() {
            PENDING.with_borrow_mut(Vec::clear);
            return;
        }
        for (db, name) in batch {
            unsafe { put_back(ctx, db, &name) };
        }
        if PENDING.with_borrow(|p| !p.is_empty()) && !ARMED.replace(true) {
            unsafe {
                raw::RedisModule_CreateTimer.unwrap()(ctx, 0, Some(on_timer), std::ptr::null_mut())
            };
        }
    })
}

unsafe fn put_back(ctx: *mut raw::RedisModuleCtx, db: c_int, name: &[u8]) {
    if raw::RedisModule_SelectDb.unwrap()(ctx, db) != raw::REDISMODULE_OK as c_int {
        return;
    }
    let string = raw::RedisModule_CreateString.unwrap()(
        std::ptr::null_mut(),
        name.as_ptr().cast::<c_char>(),
        name.len(),
    );
    {
        let key = Key::write_raw(ctx, string);
        // Each reads the key's value only if it is its kind (the key may
        // hold anything by now); a key of no warden kind is left alone.
        let _ = crate::lock::commands::lock_in(&key);
        let _ = crate::rwlock::commands::rw_in(&key);
        let _ = crate::semaphore::commands::sem_in(&key);
        let _ = crate::rate::commands::limiter_in(&key);
    }
    raw::RedisModule_FreeString.unwrap()(std::ptr::null_mut(), string);
}
