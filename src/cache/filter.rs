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
//! command the server refuses is no write. An unknown command or a wrong
//! number of arguments is told from the server's command table (read at
//! load); any other command naming a leased key is noted here, with the
//! server's count of refusals (`NOAUTH`, `NOPERM`, `OOM`, `NOREPLICAS`, ...
//! in `INFO errorstats`), and decided when the next command arrives (or on
//! the next timer turn, whichever is first: nothing else can reach the lease
//! table in between): a refused command moved that count, a command that ran
//! did not (an `ERR` after it — a script's own error, a malformed request —
//! does not count). Inside
//! `MULTI` (where the server says which client sent the command, Redis ≥ 7.2
//! and Valkey) the keys wait for that client's `EXEC`, which counts unless it
//! answered `EXECABORT`; `DISCARD` and a disconnect drop them.
//!
//! Which commands count: those the server flags `write` (module commands
//! included), but warden's cache commands.
//!
//! Invariant: a lease is revoked only for a command that named its key, may
//! write, and was not refused; revoking more than needed (a write that changed nothing,
//! a blocked or paused write) is safe: it only costs a reload.

use std::cell::{Cell, RefCell};
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis_module::{raw, Context, RedisValue};
use rustc_hash::FxHashMap;

use crate::cache::commands;
use crate::cache::table::{len_bit, tail_bit};
use crate::events;
use crate::guard;

type FilterCtx = *mut raw::RedisModuleCommandFilterCtx;

/// warden's cache commands: they keep the lease table themselves.
const OWN: &[&[u8]] = &[
    b"cache.get",
    b"cache.fill",
    b"cache.abandon",
    b"cache.invalidate",
    b"cache.info",
];

/// The error codes of commands the server refuses before running them
/// (`-ERR` ones, wrong arity and unknown command, are told apart when the
/// command is seen: an `ERR` after a write may be a script's own error or a
/// malformed request, and the write ran).
const REFUSALS: &[&CStr] = &[
    c"errorstat_NOAUTH",
    c"errorstat_NOPERM",
    c"errorstat_OOM",
    c"errorstat_READONLY",
    c"errorstat_NOREPLICAS",
    c"errorstat_MISCONF",
    c"errorstat_LOADING",
    c"errorstat_BUSY",
    c"errorstat_MASTERDOWN",
    c"errorstat_MOVED",
    c"errorstat_ASK",
    c"errorstat_TRYAGAIN",
    c"errorstat_CROSSSLOT",
    c"errorstat_CLUSTERDOWN",
];

/// The server's commands, read once at load (`COMMAND INFO`): each one's
/// arity and whether it is flagged `write` (module commands included, on
/// every version). A command the server does not know is refused as
/// unknown; one with the wrong number of arguments is refused too.
#[derive(Default)]
struct Catalogue {
    commands: FxHashMap<Vec<u8>, (i64, bool)>,
}

impl Catalogue {
    /// Whether the command may write what it names, and will not be refused
    /// for its name or its number of arguments.
    fn may_write(&self, name: &[u8], argc: c_int) -> bool {
        let lower = name.to_ascii_lowercase();
        let Some(&(arity, write)) = self.commands.get(&lower) else {
            return false;
        };
        let argc = i64::from(argc);
        let arity_ok = if arity >= 0 {
            argc == arity
        } else {
            argc >= -arity
        };
        write && arity_ok && !OWN.iter().any(|r| *r == &lower[..])
    }
}

fn text(v: &RedisValue) -> Option<Vec<u8>> {
    match v {
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => Some(s.as_bytes().to_vec()),
        RedisValue::SimpleStringStatic(s) => Some(s.as_bytes().to_vec()),
        RedisValue::BulkRedisString(s) => Some(s.as_slice().to_vec()),
        RedisValue::StringBuffer(b) => Some(b.clone()),
        _ => None,
    }
}

/// Reads the server's command table (at load, after warden's own commands
/// are registered).
pub fn read_catalogue(ctx: &Context) -> bool {
    let mut catalogue = Catalogue::default();
    if let Ok(RedisValue::Array(items)) = ctx.call("COMMAND", &["INFO"]) {
        for item in items {
            let RedisValue::Array(fields) = item else {
                continue;
            };
            let (Some(name), Some(RedisValue::Integer(arity)), Some(RedisValue::Array(flags))) =
                (fields.first().and_then(text), fields.get(1), fields.get(2))
            else {
                continue;
            };
            let write = flags.iter().filter_map(text).any(|f| f == b"write");
            catalogue
                .commands
                .insert(name.to_ascii_lowercase(), (*arity, write));
        }
    }
    let known = catalogue.commands.get(&b"set"[..]).is_some_and(|c| c.1);
    CATALOGUE.with(|c| *c.borrow_mut() = catalogue);
    known
}

/// A command that named leased keys, waiting to be decided.
struct Pending {
    names: Vec<Vec<u8>>,
    /// The server's refusal count before it (for an `EXEC`: its `EXECABORT` count).
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

/// Refusals the server has answered (`NOAUTH`, `NOPERM`, `OOM`, ...).
fn refusals() -> u64 {
    let ctx = events::detached();
    unsafe {
        let data = raw::RedisModule_GetServerInfo.unwrap()(ctx, c"errorstats".as_ptr());
        if data.is_null() {
            return 0;
        }
        let n = REFUSALS.iter().map(|f| count_field(data, f)).sum();
        raw::RedisModule_FreeServerInfo.unwrap()(ctx, data);
        n
    }
}

/// `errorstat_X:count=3` → 3.
unsafe fn count_field(data: *mut raw::RedisModuleServerInfoData, field: &CStr) -> u64 {
    let v = raw::RedisModule_ServerInfoGetFieldC.unwrap()(data, field.as_ptr());
    if v.is_null() {
        return 0;
    }
    CStr::from_ptr(v.cast::<c_char>())
        .to_bytes()
        .strip_prefix(b"count=")
        .and_then(|d| std::str::from_utf8(d).ok())
        .and_then(|d| d.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

fn exec_aborts() -> u64 {
    let ctx = events::detached();
    unsafe {
        let data = raw::RedisModule_GetServerInfo.unwrap()(ctx, c"errorstats".as_ptr());
        if data.is_null() {
            return 0;
        }
        let n = count_field(data, c"errorstat_EXECABORT");
        raw::RedisModule_FreeServerInfo.unwrap()(ctx, data);
        n
    }
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
        refusals() == p.errors
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
        if names.is_empty() || !CATALOGUE.with(|c| c.borrow().may_write(arg(fctx, 0), argc)) {
            return;
        }
        match sender(fctx) {
            Some(c) if in_multi(c) => {
                QUEUED.with(|q| q.borrow_mut().entry(c).or_default().extend(names));
                ANY_QUEUED.store(true, Ordering::Relaxed);
            }
            _ => note(Pending {
                names,
                errors: refusals(),
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
