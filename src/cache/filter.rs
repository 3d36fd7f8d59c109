//! How cache leases hear of other writes to their keys — at no cost to the
//! rest of the server, and only for commands that run.
//!
//! A write to a key with a lease must end that lease, also a write that finds
//! nothing to change (`DEL` of a missing key, `EXPIRE k 0`, a `*STORE` with an
//! empty result): Redis sends no keyspace event for those, and a keyspace
//! subscription taxes every write of every key. So the cache listens with a
//! command filter, registered only while the lease table has an entry (the
//! table's name index answers "does this argument name an entry?" with an
//! array index for most arguments).
//!
//! A filter sees a command before the server decides to run it (before
//! authentication, ACL, arity, `OOM`, `READONLY`, `MULTI` queueing). A
//! command the server refuses is no write, so a command naming a leased key
//! is only noted here, with the server's count of error replies, and decided
//! when the next command arrives (or on the next timer turn, whichever is
//! first: nothing else can reach the lease table in between): a refused
//! command was answered with an error, a command that ran with none. Inside
//! `MULTI` (where the server says which client sent the command, Redis ≥ 7.2
//! and Valkey) the keys wait for that client's `EXEC`, which counts unless it
//! answered `EXECABORT`; `DISCARD` and a disconnect drop them.
//!
//! Which commands count: those the server lists in `@write`, and commands it
//! does not list at all (another module's) but warden's own reads.
//!
//! Invariant: a lease is revoked only for a command that named its key, may
//! write, and was not refused; revoking more than needed (a write that changed nothing,
//! a blocked or paused write) is safe: it only costs a reload.

use std::cell::{Cell, RefCell};
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis_module::{raw, Context, RedisValue};
use rustc_hash::{FxHashMap, FxHashSet};

use crate::cache::commands;
use crate::cache::table::{len_bit, tail_bit};
use crate::events;
use crate::guard;

type FilterCtx = *mut raw::RedisModuleCommandFilterCtx;

/// warden's commands that never write the key they name as a cache value
/// does (reads, and the cache commands, which keep the table themselves).
const OWN_READS: &[&[u8]] = &[
    b"cache.get",
    b"cache.fill",
    b"cache.abandon",
    b"cache.invalidate",
    b"cache.info",
    b"lock.info",
    b"rwlock.info",
    b"bf.exists",
    b"bf.mexists",
    b"bf.info",
    b"bf.card",
    b"bf.debug",
    b"bf.scandump",
];

/// The server's commands, read once at load (`COMMAND LIST`): those that may
/// write (ACL category `@write`) and all of them. A command the server does
/// not list there (another module's, on Redis 7.0 where module commands have
/// no category) counts as a write unless it is one of warden's reads.
/// Scripts and functions are not writes themselves: the commands they run
/// pass the filter one by one.
#[derive(Default)]
struct Catalogue {
    writes: FxHashSet<Vec<u8>>,
    all: FxHashSet<Vec<u8>>,
}

impl Catalogue {
    fn may_write(&self, name: &[u8]) -> bool {
        let lower = name.to_ascii_lowercase();
        if self.writes.contains(&lower) {
            return true;
        }
        !self.all.contains(&lower) && !OWN_READS.iter().any(|r| *r == &lower[..])
    }
}

fn names_of(ctx: &Context, args: &[&str]) -> FxHashSet<Vec<u8>> {
    let mut set = FxHashSet::default();
    if let Ok(RedisValue::Array(items)) = ctx.call("COMMAND", args) {
        for item in items {
            let name = match item {
                RedisValue::SimpleString(s) | RedisValue::BulkString(s) => s.into_bytes(),
                RedisValue::BulkRedisString(s) => s.as_slice().to_vec(),
                RedisValue::StringBuffer(b) => b,
                _ => continue,
            };
            set.insert(name.to_ascii_lowercase());
        }
    }
    set
}

/// Reads the server's command table (at load, after warden's own commands
/// are registered).
pub fn read_catalogue(ctx: &Context) -> bool {
    let catalogue = Catalogue {
        writes: names_of(ctx, &["LIST", "FILTERBY", "ACLCAT", "write"]),
        all: names_of(ctx, &["LIST"]),
    };
    let known = !catalogue.all.is_empty() && catalogue.writes.contains(&b"set"[..]);
    CATALOGUE.with(|c| *c.borrow_mut() = catalogue);
    known
}

/// A command that named leased keys, waiting to be decided.
struct Pending {
    names: Vec<Vec<u8>>,
    /// The server's error count before it (for an `EXEC`: its `EXECABORT` count).
    errors: u64,
    exec: bool,
}

/// The lengths and last bytes of the names in the lease table
/// (`Table::len_mask`, `Table::tail_mask`), kept where the filter reads them
/// with a load each.
static LEN_MASK: AtomicU64 = AtomicU64::new(0);
static TAIL_MASK: AtomicU64 = AtomicU64::new(0);
/// Whether a command waits to be decided, and whether a transaction holds
/// keys: statics, not thread-locals (each thread-local costs a call in a
/// shared library, on every command).
static ANY_PENDING: AtomicBool = AtomicBool::new(false);
static ANY_QUEUED: AtomicBool = AtomicBool::new(false);

pub fn set_masks(len_mask: u64, tail_mask: u64) {
    LEN_MASK.store(len_mask, Ordering::Relaxed);
    TAIL_MASK.store(tail_mask, Ordering::Relaxed);
}

thread_local! {
    static FILTER: Cell<*mut raw::RedisModuleCommandFilter> = const { Cell::new(std::ptr::null_mut()) };
    static PENDING: RefCell<Option<Pending>> = const { RefCell::new(None) };
    /// Per client in `MULTI`: the leased keys its queued commands name.
    static QUEUED: RefCell<FxHashMap<u64, Vec<Vec<u8>>>> = RefCell::new(FxHashMap::default());
    static CATALOGUE: RefCell<Catalogue> = RefCell::new(Catalogue::default());
}

fn arg(fctx: FilterCtx, pos: c_int) -> &'static [u8] {
    let s = unsafe { raw::RedisModule_CommandFilterArgGet.unwrap()(fctx, pos) };
    if s.is_null() {
        return &[];
    }
    let mut len = 0;
    let ptr = raw::string_ptr_len(s, &mut len);
    // The argument lives until the filter returns; the slice does not escape it.
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
}

/// The client that sent the command, where the server says (Redis ≥ 7.2, Valkey).
fn sender(fctx: FilterCtx) -> Option<u64> {
    let get = unsafe { raw::RedisModule_CommandFilterGetClientId }?;
    Some(unsafe { get(fctx) })
}

fn in_multi(client: u64) -> bool {
    let Some(get) = (unsafe { raw::RedisModule_GetClientInfoById }) else {
        return false;
    };
    let mut info = raw::RedisModuleClientInfoV1 {
        version: 1,
        flags: 0,
        id: 0,
        addr: [0; 46],
        port: 0,
        db: 0,
    };
    let found = unsafe {
        get(
            (&mut info as *mut raw::RedisModuleClientInfoV1).cast(),
            client,
        )
    };
    found == raw::REDISMODULE_OK as c_int
        && info.flags & u64::from(raw::REDISMODULE_CLIENTINFO_FLAG_MULTI) != 0
}

/// A number from the server's INFO `section` (0 if it has none).
fn info_number(section: &CStr, field: &CStr, errorstat: bool) -> u64 {
    let ctx = events::detached();
    unsafe {
        let data = raw::RedisModule_GetServerInfo.unwrap()(ctx, section.as_ptr());
        if data.is_null() {
            return 0;
        }
        let n = if errorstat {
            // `errorstat_EXECABORT:count=3`
            let v = raw::RedisModule_ServerInfoGetFieldC.unwrap()(data, field.as_ptr());
            if v.is_null() {
                0
            } else {
                let text = CStr::from_ptr(v.cast::<c_char>()).to_bytes();
                text.strip_prefix(b"count=")
                    .and_then(|d| std::str::from_utf8(d).ok())
                    .and_then(|d| d.split(',').next()?.parse().ok())
                    .unwrap_or(0)
            }
        } else {
            let mut err = 0;
            raw::RedisModule_ServerInfoGetFieldUnsigned.unwrap()(data, field.as_ptr(), &mut err)
        };
        raw::RedisModule_FreeServerInfo.unwrap()(ctx, data);
        n
    }
}

/// Error replies the server has sent (refused commands among them).
fn error_replies() -> u64 {
    info_number(c"stats", c"total_error_replies", false)
}

fn exec_aborts() -> u64 {
    info_number(c"errorstats", c"errorstat_EXECABORT", true)
}

fn note(pending: Pending) {
    PENDING.with(|p| *p.borrow_mut() = Some(pending));
    ANY_PENDING.store(true, Ordering::Relaxed);
    // Decided on the next command, or on the next timer turn.
    unsafe {
        raw::RedisModule_CreateTimer.unwrap()(
            events::detached(),
            0,
            Some(on_decide),
            std::ptr::null_mut(),
        )
    };
}

/// Decides the command noted last: its keys' leases end if it was not refused.
pub fn decide() {
    if !ANY_PENDING.load(Ordering::Relaxed) || !ANY_PENDING.swap(false, Ordering::Relaxed) {
        return;
    }
    let Some(p) = PENDING.with(|p| p.borrow_mut().take()) else {
        return;
    };
    let ran = if p.exec {
        exec_aborts() == p.errors
    } else {
        error_replies() == p.errors
    };
    if ran {
        for name in &p.names {
            commands::revoke_everywhere(name);
        }
        // Waiters on those keys are served from the reaper's next turn.
        commands::reap_soon();
    }
}

extern "C" fn on_decide(_ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard::callback((), decide)
}

/// `EXEC` or `DISCARD` from a client with queued keys.
fn transaction_end(name: &[u8], client: u64) -> bool {
    let exec = name.eq_ignore_ascii_case(b"exec");
    if !exec && !name.eq_ignore_ascii_case(b"discard") {
        return false;
    }
    let Some(names) = QUEUED.with(|q| q.borrow_mut().remove(&client)) else {
        return false;
    };
    ANY_QUEUED.store(QUEUED.with(|q| !q.borrow().is_empty()), Ordering::Relaxed);
    if exec {
        note(Pending {
            names,
            errors: exec_aborts(),
            exec: true,
        });
    }
    true
}

extern "C" fn on_command(fctx: FilterCtx) {
    guard::callback((), || {
        // The command before this one has been answered by now.
        decide();
        let argc = unsafe { raw::RedisModule_CommandFilterArgsCount.unwrap()(fctx) };
        if ANY_QUEUED.load(Ordering::Relaxed) {
            if let Some(c) = sender(fctx) {
                if transaction_end(arg(fctx, 0), c) {
                    return;
                }
            }
        }
        // The common case costs two loads and a bit test or two per argument.
        let mask = LEN_MASK.load(Ordering::Relaxed);
        let tails = TAIL_MASK.load(Ordering::Relaxed);
        let mut names: Vec<Vec<u8>> = Vec::new();
        for i in 1..argc {
            let a = arg(fctx, i);
            if mask & len_bit(a.len()) != 0 && tails & tail_bit(a) != 0 && commands::names(a) {
                names.push(a.to_vec());
            }
        }
        if names.is_empty() || !CATALOGUE.with(|c| c.borrow().may_write(arg(fctx, 0))) {
            return;
        }
        match sender(fctx) {
            Some(c) if in_multi(c) => {
                QUEUED.with(|q| q.borrow_mut().entry(c).or_default().extend(names));
                ANY_QUEUED.store(true, Ordering::Relaxed);
            }
            _ => note(Pending {
                names,
                errors: error_replies(),
                exec: false,
            }),
        }
    })
}

/// A client left: its queued transaction never runs.
pub fn client_gone(client: u64) {
    QUEUED.with(|q| {
        let mut q = q.borrow_mut();
        if q.remove(&client).is_some() && q.capacity() > 64 && q.len() * 4 < q.capacity() {
            q.shrink_to_fit();
        }
        ANY_QUEUED.store(!q.is_empty(), Ordering::Relaxed);
    });
}

/// Listens while the table has entries, and only then: registered at the
/// first entry, unregistered (from a timer, never from inside the filter)
/// once the table is empty and nothing waits to be decided.
pub fn listen(on: bool) {
    let filter = FILTER.with(Cell::get);
    let ctx = events::detached();
    if on && filter.is_null() {
        let f = unsafe {
            raw::RedisModule_RegisterCommandFilter.unwrap()(
                ctx,
                Some(on_command),
                raw::REDISMODULE_CMDFILTER_NOSELF as c_int,
            )
        };
        FILTER.with(|c| c.set(f));
    } else if !on && !filter.is_null() {
        decide();
        QUEUED.with(|q| *q.borrow_mut() = FxHashMap::default());
        ANY_QUEUED.store(false, Ordering::Relaxed);
        unsafe { raw::RedisModule_UnregisterCommandFilter.unwrap()(ctx, filter) };
        FILTER.with(|c| c.set(std::ptr::null_mut()));
    }
}

/// Whether the filter is registered (`INFO warden`, tests).
pub fn listening() -> bool {
    !FILTER.with(Cell::get).is_null()
}
