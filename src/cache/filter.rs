//! How cache leases hear of other writes to their keys — at no cost to the
//! rest of the server, and only for commands that run.
//!
//! A write to a key with a lease must end that lease, also a write that finds
//! nothing to change (`DEL` of a missing key, `EXPIRE k 0`, a `*STORE` with an
//! empty result): Redis sends no keyspace event for those, and a keyspace
//! subscription taxes every write of every key. So the cache listens with a
//! command filter, registered only while the lease table has an entry (the
//! table's name screen answers "may this argument name an entry?" with a bit
//! test or two for most arguments; a command none of whose arguments may,
//! when nothing waits to be decided, costs a few instructions an argument).
//!
//! A filter sees a command before the server decides to run it (before
//! authentication, ACL, arity, `OOM`, `READONLY`, `MULTI` queueing). A
//! command the server refuses is no write. An unknown command or a wrong
//! number of arguments is told by the server's own lookup (see `Catalogue`);
//! any other command naming a leased key is noted here and decided when the
//! next command of a client arrives (or on the next timer turn, whichever is
//! first: nothing else can reach the lease table in between): it ran if the
//! server's count of commands run moved since it was noted (`INFO stats`,
//! one read whatever the server ran; a command is counted as it returns, a
//! refused one never). An error reply, whatever its code (a script's own
//! `NOPERM` after its write), cannot hide a write that ran. A command run
//! inside another (a script's, a module's `RedisModule_Call`, which also
//! pass the filter) is no client's (Redis ≥ 7.2 and Valkey say so): what is
//! noted is not decided then — the command around it has not returned — but
//! only revoked if it shows it ran; and a command noted there is told to
//! have run by the calls of write commands and the dataset's changes (the
//! command around it is counted too). Redis 7.0 does not say who sent a
//! command, so there a command inside a module's command is decided when it
//! passes (a write of that module's command, after its inner call, can go
//! unseen), and a script's refused write counts as run (the script ran). A
//! command the server postponed or blocked has not run yet but will,
//! unseen: it counts (see below).
//!
//! Transactions. Where the server says which client sent a command (Redis ≥
//! 7.2, Valkey) a `MULTI` seen here opens a record for its client, and every
//! command flagged `write` queued after it keeps its arguments there (up to
//! 1 MiB, past which it counts as writing every key) whether or not they have
//! a lease *now*: at `EXEC` they are checked against the lease table as it is
//! when the `EXEC` has run (unless it answered `EXECABORT`), so a lease
//! granted between the queueing and the `EXEC` ends too. `DISCARD`, `RESET`
//! and a disconnect drop the record; a `MULTI` the server refused opens
//! none (the client's `MULTI` flag is checked at its next command). A
//! transaction opened before the filter was registered may hold writes
//! warden never saw, and no module API lists a transaction's queued
//! commands: its `EXEC` ends every lease — if a write ran in it (a
//! read-only, aborted or `WATCH`-ed out transaction revokes nothing). Redis
//! 7.0 does not say who sent a command, so there every `EXEC` is such a
//! transaction.
//!
//! The filter is registered by the grant that creates the table's first
//! entry, possibly inside an `EXEC` or while the server runs clients it had
//! postponed: whatever the server runs from there to the next command or
//! timer turn without passing the filter (the rest of that transaction, a
//! postponed command reprocessed) may write the keys just leased. So the
//! server's count of changes (`rdb_changes_since_last_save`) is read at
//! registration; if it moved by the next decision, every lease (all granted
//! in that window) ends.
//!
//! Commands that have not run when decided. A command the server postponed
//! (`CLIENT PAUSE WRITE`, `FAILOVER`) or blocked (on keys) is decided at the
//! next command like any other, which revokes early; its client (where the
//! server names it) is then watched until it is no longer blocked and has
//! run (`CLIENT LIST` flag `u`, asked from a timer; a fill asks first), and
//! its keys' leases end again then: a lease granted while it waited came
//! before its write. While the server postpones writes, a write command
//! naming no leased key keeps all its arguments the same way (only there:
//! a pause is one call to ask). Redis 7.0 passes a postponed command through
//! the filter again when it runs; Redis 8.2.3 and Valkey 9.1.2 do not
//! always (a reader postponed before a writer got its lease first, then
//! the write ran unseen, under load).
//!
//! Which commands count: those the server flags `write` (module commands
//! included), but warden's cache commands.
//!
//! Invariant: a lease is revoked only for a command that named its key (or,
//! in the cases above, a write whose keys warden cannot know), may write,
//! and was not refused; revoking more than needed (a write that changed
//! nothing, a blocked or paused write, an unseen transaction) is safe: it
//! only costs a reload.

use std::cell::{Cell, RefCell};
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis_module::{raw, Context, RedisValue};
use rustc_hash::FxHashMap;

use crate::cache::commands;
use crate::cache::table::{len_bit, screen_slot, SCREEN_WORDS};
use crate::cache::unseen::{self, Unnamed};
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
    b"cache.peek",
];

/// What the catalogue knows of one command.
#[derive(Clone, Copy)]
struct Entry {
    arity: i64,
    /// Flagged `write` (module commands included, on every version).
    write: bool,
    /// A container (`XGROUP`, `CONFIG`, ...): its subcommands have entries of
    /// their own, `name|sub`, and say whether they write.
    container: bool,
    /// Flagged `blocking`: it may run later, without passing the filter.
    blocking: bool,
    /// Flagged `no_auth`: an unauthenticated client may run it (`AUTH`,
    /// `HELLO`, `RESET`, a module's own login command).
    no_auth: bool,
    /// May grant a cache lease while it runs, or run commands the filter
    /// does not see again inside a transaction: warden's `CACHE.GET`, a
    /// script (`EVAL*`, `FCALL*`), a module's command.
    grants: bool,
    /// Changes who must authenticate (`ACL`, `CONFIG`, `MODULE`).
    admin: bool,
    /// May write keys it does not name (`cache/unseen.rs`).
    unnamed: Unnamed,
}

/// The server's commands (`COMMAND INFO`): whether each one (and each
/// subcommand) is flagged `write`. Read at load, again on the first timer
/// turn (modules loaded after warden are there by then); a command the
/// server knows under a name the catalogue does not (`rename-command`, a
/// `MODULE LOAD` since) counts as a write until it is learnt (`COMMAND INFO
/// name`) on the next timer turn. Whether the server will run
/// a command — it knows the name (also one given by `rename-command`, or a
/// command of a module loaded after warden), the number of arguments fits —
/// is asked of the server itself when a command names a leased key
/// (`RedisModule_GetCommandKeysWithFlags`, which looks the command up as the
/// server will). A command the catalogue does not know under the name it
/// was sent by (renamed, or a later module's) is learnt (below).
#[derive(Default)]
struct Catalogue {
    commands: FxHashMap<Vec<u8>, Entry>,
    /// A name given by `rename-command` → the command's own.
    aliases: FxHashMap<Vec<u8>, Vec<u8>>,
    /// `cmdstat_<name>` of every command that may write (warden's cache
    /// commands but): how a transaction warden did not see queued is told
    /// from one that wrote nothing.
    write_stats: Vec<std::ffi::CString>,
    /// The same names (`cmdstat_<name>`), to find in `INFO commandstats`'s
    /// text.
    write_names: rustc_hash::FxHashSet<Vec<u8>>,
}

/// What the server says of a command before running it.
enum Lookup {
    /// Unknown, or the wrong number of arguments: refused.
    Refused,
    /// It names no key (the server checks no arity then).
    NoKeys,
    /// It names keys, with the right number of arguments.
    Keys,
}

/// Looks the command up as the server will (`rename-command` and modules
/// loaded since included): `None` if it names keys, else the `errno` the
/// server set — `ENOENT` (unknown command), `EINVAL` (wrong number of
/// arguments), 0 (the command names no key).
pub(crate) fn server_lookup(fctx: FilterCtx, argc: c_int) -> Option<i32> {
    let get = unsafe { raw::RedisModule_CommandFilterArgGet.unwrap() };
    let mut argv: Vec<*mut raw::RedisModuleString> =
        (0..argc).map(|i| unsafe { get(fctx, i) }).collect();
    let mut count: c_int = 0;
    // No key flags are asked: for commands with a legacy key range the
    // server reports none.
    let keys = unsafe {
        raw::RedisModule_GetCommandKeysWithFlags.unwrap()(
            events::detached(),
            argv.as_mut_ptr(),
            argc,
            &mut count,
            std::ptr::null_mut(),
        )
    };
    if keys.is_null() {
        return Some(std::io::Error::last_os_error().raw_os_error().unwrap_or(-1));
    }
    unsafe { raw::RedisModule_Free.unwrap()(keys.cast()) };
    None
}

fn lookup(fctx: FilterCtx, argc: c_int) -> Lookup {
    match server_lookup(fctx, argc) {
        None => Lookup::Keys,
        Some(0) => Lookup::NoKeys,
        Some(_) => Lookup::Refused,
    }
}

impl Catalogue {
    /// Whether the command may write what it names, and will not be refused
    /// for its name or its number of arguments.
    fn may_write(&self, fctx: FilterCtx, argc: c_int) -> bool {
        match self.entry_of(fctx, argc) {
            // Known under the name sent: its flag, and its arity as the
            // server checks it (warden's cache commands are no writes here).
            Some(e) => e.write && arity_fits(e.arity, argc),
            None => match lookup(fctx, argc) {
                Lookup::Refused => false,
                // Renamed, or a later module's: it counts as a write until
                // its flags are learnt, on the next timer turn.
                Lookup::NoKeys | Lookup::Keys => {
                    learn(arg(fctx, 0).to_ascii_lowercase());
                    true
                }
            },
        }
    }
}

impl Catalogue {
    /// The entry of a command by the name it was sent under (renamed ones
    /// once learnt); no allocation for names of up to 32 bytes.
    fn resolve(&self, name: &[u8]) -> Option<Entry> {
        let mut buf = [0u8; 32];
        let long;
        let sent: &[u8] = if name.len() <= buf.len() {
            buf[..name.len()].copy_from_slice(name);
            buf[..name.len()].make_ascii_lowercase();
            &buf[..name.len()]
        } else {
            long = name.to_ascii_lowercase();
            &long
        };
        match self.aliases.is_empty() {
            true => self.commands.get(sent).copied(),
            false => match self.aliases.get(sent) {
                Some(own) => self.commands.get(own).copied(),
                None => self.commands.get(sent).copied(),
            },
        }
    }

    /// The entry of the command in `fctx`, its subcommand's for a container
    /// (`XGROUP CREATE`), without asking the server.
    fn entry_of(&self, fctx: FilterCtx, argc: c_int) -> Option<Entry> {
        let top = self.resolve(arg(fctx, 0))?;
        if !top.container || argc < 2 {
            return Some(top);
        }
        let mut sub = arg(fctx, 0).to_ascii_lowercase();
        if let Some(own) = self.aliases.get(&sub) {
            sub = own.clone();
        }
        sub.push(b'|');
        sub.extend(arg(fctx, 1).iter().map(u8::to_ascii_lowercase));
        self.commands.get(&sub).copied().or(Some(top))
    }

    /// Whether the command, if it runs, may write keys it does not name
    /// (`cache/unseen.rs`): then every lease ends once it has run.
    fn writes_unnamed(&self, fctx: FilterCtx, argc: c_int) -> bool {
        let Some(e) = self.resolve(arg(fctx, 0)) else {
            return false;
        };
        arity_fits(e.arity, argc)
            && match e.unnamed {
                Unnamed::No => false,
                Unnamed::Always => true,
                Unnamed::BySubcommand => unseen::subcommand_writes(
                    arg(fctx, 0),
                    arg(fctx, 1),
                    (2..argc).map(|i| arg(fctx, i)),
                ),
            }
    }

    /// Whether the command may block (one the catalogue does not know may).
    fn may_block(&self, name: &[u8]) -> bool {
        self.resolve(name).is_none_or(|e| e.blocking)
    }
}

fn arity_fits(arity: i64, argc: c_int) -> bool {
    let argc = i64::from(argc);
    if arity >= 0 {
        argc == arity
    } else {
        argc >= -arity
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

impl Catalogue {
    /// Adds one `COMMAND INFO` entry, and its subcommands (`name|sub`).
    fn add(&mut self, item: &RedisValue) {
        let RedisValue::Array(fields) = item else {
            return;
        };
        let (Some(name), Some(RedisValue::Integer(arity)), Some(RedisValue::Array(flags))) =
            (fields.first().and_then(text), fields.get(1), fields.get(2))
        else {
            return;
        };
        let flagged = |name: &[u8]| flags.iter().filter_map(text).any(|f| f == name);
        let lower = name.to_ascii_lowercase();
        // warden's cache commands keep the lease table themselves.
        let write = flagged(b"write") && !OWN.iter().any(|r| *r == &lower[..]);
        let blocking = flagged(b"blocking");
        let no_auth = flagged(b"no_auth");
        // Scripts grant no lease (the cache's commands refuse one there),
        // nor do warden's other commands; another module's may call
        // `CACHE.GET`.
        let grants = lower == b"cache.get" || (flagged(b"module") && !warden_command(&lower));
        let base = lower.split(|b| *b == b'|').next().unwrap_or(&lower);
        let admin = matches!(base, b"acl" | b"config" | b"module");
        let first_key = match fields.get(3) {
            Some(RedisValue::Integer(k)) => *k,
            _ => 0,
        };
        let specs = match fields.get(8) {
            Some(RedisValue::Array(s)) => s.len(),
            _ => 0,
        };
        let module = flagged(b"module") && !warden_command(&lower);
        let unnamed = unseen::classify(&lower, write, module, first_key, specs);
        // A transaction that called one is told to have written by its calls.
        if write || unnamed != Unnamed::No {
            let mut field = b"cmdstat_".to_vec();
            field.extend_from_slice(&lower);
            if let Ok(f) = std::ffi::CString::new(field) {
                self.write_names.insert(f.as_bytes().to_vec());
                self.write_stats.push(f);
            }
        }
        let subcommands = match fields.get(9) {
            Some(RedisValue::Array(subs)) if !subs.is_empty() => subs.as_slice(),
            _ => &[],
        };
        for sub in subcommands {
            self.add(sub);
        }
        let entry = Entry {
            arity: *arity,
            write,
            container: !subcommands.is_empty(),
            blocking,
            no_auth,
            grants,
            admin,
            unnamed,
        };
        if unnamed != Unnamed::No {
            UNNAMED_LENS.fetch_or(len_bit(lower.len()), Ordering::Relaxed);
        }
        self.commands.insert(lower, entry);
    }
}

/// One of warden's own commands (which grant no cache lease but
/// `CACHE.GET`).
fn warden_command(name: &[u8]) -> bool {
    [
        &b"lock."[..],
        b"rwlock.",
        b"sem.",
        b"bf.",
        b"cache.",
        b"warden.",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

/// Names the server knows and the catalogue does not, to learn on the next
/// timer turn (at most the server's commands: only names it knows come here).
fn learn(name: Vec<u8>) {
    let first = TO_LEARN.with(|t| {
        let mut t = t.borrow_mut();
        let first = t.is_empty();
        t.insert(name);
        first
    });
    if first {
        decide_soon(0);
    }
}

/// Learns the names seen since the last timer turn: each one's entry (a
/// later module's command), or the command it names (`rename-command`).
fn learn_now(ctx: &Context) {
    let names = TO_LEARN.with(|t| std::mem::take(&mut *t.borrow_mut()));
    for name in names {
        let Ok(sent) = std::str::from_utf8(&name) else {
            continue;
        };
        let Ok(RedisValue::Array(items)) = ctx.call("COMMAND", &["INFO", sent]) else {
            continue;
        };
        let Some(item @ RedisValue::Array(fields)) = items.first() else {
            continue;
        };
        let Some(own) = fields
            .first()
            .and_then(text)
            .map(|n| n.to_ascii_lowercase())
        else {
            continue;
        };
        if !CATALOGUE.with(|c| c.borrow().commands.contains_key(&own)) {
            // A module loaded since: all of its commands at once.
            read_catalogue(ctx);
            CATALOGUE.with(|c| {
                let mut c = c.borrow_mut();
                if !c.commands.contains_key(&own) {
                    c.add(item);
                }
            });
        }
        if own != name {
            let unnamed = CATALOGUE.with(|c| {
                c.borrow()
                    .commands
                    .get(&own)
                    .is_some_and(|e| e.unnamed != Unnamed::No)
            });
            if unnamed {
                UNNAMED_LENS.fetch_or(len_bit(name.len()), Ordering::Relaxed);
            }
            CATALOGUE.with(|c| c.borrow_mut().aliases.insert(name, own));
        }
    }
}

/// Reads the server's command table (at load, after warden's own commands
/// are registered), and again on the first timer turn, when modules loaded
/// after warden are there too.
pub fn read_catalogue_at_load(ctx: &Context) -> bool {
    if !read_catalogue(ctx) {
        redis_module::logging::log_warning(
            "warden: cannot read the server's command table (COMMAND INFO): \
             warden needs COMMAND under its own name",
        );
        return false;
    }
    // warden writes cached values and lease ends with SET, DEL and
    // PEXPIREAT, and replicates lock expiries as PEXPIREAT and DEL: under
    // other names both would fail. It follows transactions by MULTI, EXEC,
    // DISCARD and RESET: under other names their writes would go unseen.
    let needed = [
        "set",
        "del",
        "pexpireat",
        "multi",
        "exec",
        "discard",
        "reset",
    ];
    let mut words = vec!["INFO"];
    words.extend(needed);
    let missing: Vec<&str> = match ctx.call("COMMAND", &words[..]) {
        Ok(RedisValue::Array(found)) => needed
            .iter()
            .zip(found.iter().chain(std::iter::repeat(&RedisValue::Null)))
            .filter(|(_, v)| !matches!(v, RedisValue::Array(_)))
            .map(|(n, _)| *n)
            .collect(),
        _ => needed.to_vec(),
    };
    if !missing.is_empty() {
        redis_module::logging::log_warning(format!(
            "warden: the server does not know {} under its own name (rename-command): \
             warden writes and replicates through SET, DEL and PEXPIREAT, follows \
             transactions by MULTI, EXEC, DISCARD and RESET, and does not load",
            missing.join(", ").to_uppercase()
        ));
        return false;
    }
    // ACL, CONFIG and MODULE under their own names: while a client is known
    // unauthenticated, the filter looks for them by name alone.
    let admin = ["acl", "config", "module"];
    let mut words = vec!["INFO"];
    words.extend(admin);
    let renamed = match ctx.call("COMMAND", &words[..]) {
        Ok(RedisValue::Array(found)) => {
            found.len() != admin.len() || found.iter().any(|v| !matches!(v, RedisValue::Array(_)))
        }
        _ => true,
    };
    ADMIN_RENAMED.store(renamed, Ordering::Relaxed);
    let timer = unsafe {
        raw::RedisModule_CreateTimer.unwrap()(ctx.ctx, 0, Some(on_loaded), std::ptr::null_mut())
    };
    timer != 0
}

extern "C" fn on_loaded(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard::callback((), || {
        read_catalogue(&Context::new(ctx));
    })
}

fn read_catalogue(ctx: &Context) -> bool {
    let mut catalogue = Catalogue::default();
    if let Ok(RedisValue::Array(items)) = ctx.call("COMMAND", &["INFO"]) {
        for item in &items {
            catalogue.add(item);
        }
    }
    let known = catalogue.commands.get(&b"set"[..]).is_some_and(|c| c.write);
    CATALOGUE.with(|c| {
        let mut c = c.borrow_mut();
        catalogue.aliases = std::mem::take(&mut c.aliases);
        *c = catalogue;
    });
    known
}

/// What a command may have written, if it ran.
#[derive(Default)]
struct Writes {
    /// Names it may have written: their leases (as they are when it is
    /// decided) end.
    names: Vec<Vec<u8>>,
    /// Bytes in `names` (a transaction keeps at most `RECORD_BYTES`).
    bytes: usize,
    /// It may have written keys warden never saw: every lease ends.
    all: bool,
}

impl Writes {
    fn all() -> Self {
        Writes {
            names: Vec::new(),
            bytes: 0,
            all: true,
        }
    }

    /// Keeps one argument, counted with what keeping it costs (an empty one
    /// too): past `RECORD_BYTES` for this record, or `ALL_RECORDS_BYTES` for
    /// all of them, the record counts as writing every key instead.
    fn add(&mut self, name: &[u8]) {
        if self.all {
            return;
        }
        let cost = name.len() + ARG_COST;
        let total = RECORDED.fetch_add(cost, Ordering::Relaxed) + cost;
        self.bytes += cost;
        if self.bytes > RECORD_BYTES || total > ALL_RECORDS_BYTES {
            *self = Writes::all();
        } else {
            self.names.push(name.to_vec());
        }
    }

    /// Ends the leases these writes reach (waiters are served by the reaper:
    /// at once if any client waits, else within `commands::REAP_LATER_MS`,
    /// one timer for every revocation meanwhile).
    fn revoke(&self) {
        if self.all {
            commands::revoke_all();
        } else {
            for name in &self.names {
                commands::revoke_everywhere(name);
            }
        }
        if crate::waiters::total_waiting() == 0 {
            commands::reap_later();
        } else {
            commands::reap_soon();
        }
    }
}

/// The most argument bytes kept for one transaction or postponed command:
/// past it, the command counts as writing every key.
const RECORD_BYTES: usize = 1 << 20;
/// The most kept for all of them together (clients in `MULTI` are many).
const ALL_RECORDS_BYTES: usize = 16 << 20;
/// What one kept argument costs besides its bytes.
const ARG_COST: usize = 32;
/// Bytes kept in every record now.
static RECORDED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Drop for Writes {
    fn drop(&mut self) {
        if self.bytes > 0 {
            RECORDED.fetch_sub(self.bytes, Ordering::Relaxed);
        }
    }
}

/// What tells that a noted command ran, read before it and when it is
/// decided.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Evidence {
    /// For one command: the server's count of commands run
    /// (`total_commands_processed`, counted as a command returns; a refused
    /// command is not run). One `INFO stats` read, whatever the server ran.
    Commands(u64),
    /// For an `EXEC`, or a command run inside another (a script's, a
    /// module's, which is counted as a command too): the calls of write
    /// commands and the dataset's changes (`writes_done`). A transaction
    /// that ran only reads revokes nothing. With them the count of commands
    /// run: a decision that finds it unmoved (nothing ran: the command was
    /// refused) reads the others no more and keeps them as the next note's
    /// baseline — `INFO commandstats` and `persistence` cost twice and half
    /// again what `INFO stats` does, and a refused `EXEC` is what an
    /// unauthenticated client can send for free (Redis 7.0, where the
    /// sender is not known).
    Writes(u64, u64, u64),
}

/// What has been read since anything last ran (a decision's reads are the
/// next note's baseline, in the same filter call).
#[derive(Default, Clone, Copy)]
struct Fresh {
    commands: Option<u64>,
    writes: Option<(u64, u64)>,
}

impl Fresh {
    fn evidence(&mut self, exec: bool) -> Evidence {
        if exec {
            let (c, d) = *self.writes.get_or_insert_with(writes_done);
            let n = *self.commands.get_or_insert_with(commands_done);
            Evidence::Writes(c, d, n)
        } else {
            Evidence::Commands(*self.commands.get_or_insert_with(commands_done))
        }
    }
}

/// A command that may write, waiting to be decided.
struct Pending {
    writes: Writes,
    /// What tells that it ran, before it.
    before: Evidence,
    /// Who sent it, where the server says (Redis ≥ 7.2, Valkey).
    client: Option<u64>,
    /// What its decision teaches of its client.
    learn: Learn,
    /// A `MODULE LOAD`: once it ran, the server's commands are read again
    /// (before the next command is looked at).
    reread: bool,
}

/// What a decision teaches of the client that sent the command.
#[derive(Clone, Copy)]
enum Learn {
    Nothing,
    /// Whether it is authenticated: `NOAUTH` refusals counted before its
    /// command (a command that ran says yes; a refusal counted as `NOAUTH`
    /// says no).
    Client(u64),
    /// Whether an `AUTH`/`HELLO` (or any command an unauthenticated client
    /// may run) of a client known unauthenticated left it so: `WRONGPASS`
    /// and `NOAUTH` refusals counted before it.
    Auth(u64),
}

impl Pending {
    /// `fresh`: what was read since anything last ran.
    fn new(writes: Writes, client: Option<u64>, exec: bool, fresh: &mut Fresh) -> Self {
        Pending {
            writes,
            before: fresh.evidence(exec),
            client,
            learn: Learn::Nothing,
            reread: false,
        }
    }
}

/// The most commands waiting to be decided at once (noted inside a running
/// command: a script's, a module's): past it, a command joins the last one.
const MAX_PENDING: usize = 64;

/// Lease grants counted (a transaction compares it at its `EXEC`).
static GRANTS: AtomicU64 = AtomicU64::new(0);
/// The most recent grants remembered, with their count.
const RECENT_GRANTS: usize = 4096;

/// A lease was granted on `name` (while the filter listens).
pub fn granted(name: &[u8]) {
    let seq = GRANTS.fetch_add(1, Ordering::Relaxed) + 1;
    if !ANY_QUEUED.load(Ordering::Relaxed) {
        // No transaction is followed: none needs to know.
        return;
    }
    RECENT.with(|r| {
        let mut r = r.borrow_mut();
        if r.len() >= RECENT_GRANTS {
            r.pop_front();
        }
        r.push_back((seq, name.to_vec()));
    });
}

/// An argument's bit among a transaction's `others`.
fn other_bit(name: &[u8]) -> u64 {
    1 << (screen_slot(name) & 63)
}

/// A transaction opened while the filter listened: the writes queued in it.
struct Transaction {
    /// Whether the server confirmed the client is in `MULTI` (a `MULTI` the
    /// server refused opens none).
    confirmed: bool,
    /// The arguments of its queued writes that may have named a leased key
    /// when they were queued, or were queued after a command that may grant
    /// one inside the `EXEC` (kept whole).
    writes: Writes,
    /// A command queued in it may grant a lease while the `EXEC` runs.
    grants: bool,
    /// A command queued in it may change who must authenticate (`ACL`,
    /// `CONFIG`, `MODULE`, or one not known yet): its `EXEC` forgets which
    /// clients are unauthenticated.
    admin: bool,
    /// The lease grants counted when it opened (`GRANTS`).
    since: u64,
    /// The other arguments of its queued writes, a bit each (of 64, by the
    /// name screen's hash): a lease granted while it was queued on a name
    /// with one of these bits ends at its `EXEC`. Nothing is copied or
    /// allocated for them.
    others: u64,
}

impl Transaction {
    fn new(confirmed: bool, writes: Writes) -> Self {
        Transaction {
            confirmed,
            // One warden did not see opened may hold anything.
            admin: writes.all,
            writes,
            grants: false,
            since: GRANTS.load(Ordering::Relaxed),
            others: 0,
        }
    }

    /// At its `EXEC`: the leases granted since it opened, on names its
    /// writes not kept whole may name, join its writes (every lease, if
    /// more were granted than `RECENT_GRANTS` remembers).
    fn add_granted_since(&mut self) {
        if self.others == 0 || GRANTS.load(Ordering::Relaxed) == self.since {
            return;
        }
        let since = self.since;
        let others = self.others;
        let reached = RECENT.with(|r| {
            let r = r.borrow();
            if r.front().is_none_or(|(seq, _)| *seq > since + 1) && r.len() >= RECENT_GRANTS {
                return None;
            }
            Some(
                r.iter()
                    .filter(|(seq, name)| *seq > since && others & other_bit(name) != 0)
                    .map(|(_, name)| name.clone())
                    .collect::<Vec<_>>(),
            )
        });
        match reached {
            Some(names) => names.iter().for_each(|n| self.writes.add(n)),
            None => self.writes = Writes::all(),
        }
    }

    /// Whether its `EXEC` may end a lease: it may grant one while it runs,
    /// may write keys warden never saw, or queued a write of a name leased
    /// now (nothing else runs from here to the `EXEC`'s end).
    fn reaches_leases(&self) -> bool {
        self.grants || self.writes.all || self.writes.names.iter().any(|n| commands::names(n))
    }
}

/// A client whose command was not refused but has not run yet (postponed by
/// a pause, blocked on keys): the filter does not see it again when it runs
/// (Redis ≥ 7.2, Valkey), so the leases its names reach end once it has.
struct Watched {
    client: u64,
    writes: Writes,
    /// Seen unblocked: it has run, or is about to; a timer turn tells which.
    unblocked: bool,
}

/// The lengths of the names in the lease table (`Table::len_mask`) and the
/// name screen (`Table::screen_changes`), kept where the filter reads them
/// with a load each.
static LEN_MASK: AtomicU64 = AtomicU64::new(0);
static SCREEN: [AtomicU64; SCREEN_WORDS] = [const { AtomicU64::new(0) }; SCREEN_WORDS];
/// Whether something waits to be decided (a command, the window since the
/// filter was registered, a watched client), and whether a transaction is
/// followed: statics, not thread-locals (each thread-local costs a call in a
/// shared library, on every command).
static ANY_PENDING: AtomicBool = AtomicBool::new(false);
static ANY_QUEUED: AtomicBool = AtomicBool::new(false);
static ANY_WATCHED: AtomicBool = AtomicBool::new(false);
/// The lengths of the names (aliases included) of commands that may write
/// keys they do not name (`Catalogue::writes_unnamed`): a command whose
/// name has none of them passes at a load and a bit test.
static UNNAMED_LENS: AtomicU64 = AtomicU64::new(0);
/// Some client is known unauthenticated (`TRUST`): every command is looked
/// at, for what may authenticate it or change who must.
static ANY_NOAUTH: AtomicBool = AtomicBool::new(false);
/// A decision timer is armed.
static DECIDE_ARMED: AtomicBool = AtomicBool::new(false);

/// Follows the lease table: its length mask, and the words of its name
/// screen that changed.
pub fn set_screen(len_mask: u64, changes: impl Iterator<Item = (usize, u64)>) {
    LEN_MASK.store(len_mask, Ordering::Relaxed);
    for (word, bits) in changes {
        SCREEN[word].store(bits, Ordering::Relaxed);
    }
}

/// Whether an argument may name an entry of the lease table: never false for
/// one that does (a length test, then, for a length a name has, a bit of the
/// name screen).
#[inline(always)]
fn may_name(a: &[u8]) -> bool {
    if LEN_MASK.load(Ordering::Relaxed) & len_bit(a.len()) == 0 {
        return false;
    }
    let slot = screen_slot(a);
    SCREEN[slot / 64].load(Ordering::Relaxed) & (1 << (slot % 64)) != 0
}

thread_local! {
    static FILTER: Cell<*mut raw::RedisModuleCommandFilter> = const { Cell::new(std::ptr::null_mut()) };
    static PENDING: RefCell<Vec<Pending>> = const { RefCell::new(Vec::new()) };
    /// The server's count of changes when the filter was registered, until
    /// the next command or timer turn.
    static WINDOW: Cell<Option<u64>> = const { Cell::new(None) };
    /// Per client in `MULTI` (opened while the filter listened).
    static QUEUED: RefCell<FxHashMap<u64, Transaction>> = RefCell::new(FxHashMap::default());
    static WATCHED: RefCell<Vec<Watched>> = const { RefCell::new(Vec::new()) };
    /// The most recent lease grants while a transaction was followed.
    static RECENT: RefCell<std::collections::VecDeque<(u64, Vec<u8>)>> = const { RefCell::new(std::collections::VecDeque::new()) };
    /// What was learnt of clients that wrote names with leases.
    static TRUST: RefCell<FxHashMap<u64, Trust>> = RefCell::new(FxHashMap::default());
    /// Clients seen outside any transaction at an `EXEC` with no record.
    static OUTSIDE: RefCell<rustc_hash::FxHashSet<u64>> = RefCell::new(rustc_hash::FxHashSet::default());
    static CATALOGUE: RefCell<Catalogue> = RefCell::new(Catalogue::default());
    static TO_LEARN: RefCell<rustc_hash::FxHashSet<Vec<u8>>> = RefCell::new(rustc_hash::FxHashSet::default());
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

/// The client's flags (`REDISMODULE_CLIENTINFO_FLAG_*`), `None` if it is gone.
fn client_flags(client: u64) -> Option<u64> {
    let get = unsafe { raw::RedisModule_GetClientInfoById }?;
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
    (found == raw::REDISMODULE_OK as c_int).then_some(info.flags)
}

/// Whether the client is one of the server's connections (a script's or a
/// module's command is sent by a client that is not): a lookup by id, with
/// nothing filled in (the address would cost a system call).
fn connected(client: u64) -> bool {
    let Some(get) = (unsafe { raw::RedisModule_GetClientInfoById }) else {
        return false;
    };
    unsafe { get(std::ptr::null_mut(), client) == raw::REDISMODULE_OK as c_int }
}

fn in_multi(client: u64) -> bool {
    client_flags(client).is_some_and(|f| f & u64::from(raw::REDISMODULE_CLIENTINFO_FLAG_MULTI) != 0)
}

/// Whether the server postpones write commands now (`CLIENT PAUSE WRITE|ALL`,
/// `FAILOVER`, a `SHUTDOWN` waiting for replicas).
fn paused() -> bool {
    unsafe { raw::RedisModule_AvoidReplicaTraffic.is_some_and(|f| f() != 0) }
}

/// `INFO` calls warden made (each is counted as a command run).
static OWN_INFO_CALLS: AtomicU64 = AtomicU64::new(0);

/// One `INFO` section's text, asked as a client asks it: a tenth of what
/// `RedisModule_GetServerInfo` costs (it files every field of the section
/// in a radix tree: about 250,000 instructions for `stats` on Redis 7.0).
/// `None` if the server will not run `INFO` under its name (renamed); the
/// `INFO` calls made before this one.
fn info_text(section: &str) -> Option<(Vec<u8>, u64)> {
    let before = OWN_INFO_CALLS.load(Ordering::Relaxed);
    let reply = Context::new(events::detached()).call("INFO", &[section]);
    let text = reply.ok().as_ref().and_then(text)?;
    OWN_INFO_CALLS.fetch_add(1, Ordering::Relaxed);
    Some((text, before))
}

/// `name:` at a line's start → the number after it (or after `count=`,
/// `calls=`).
fn field_in(text: &[u8], name: &[u8]) -> Option<u64> {
    text.split(|b| *b == b'\n')
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(b":"))
        .map(leading_number)
}

/// `count=3,…` → 3; `7\r` → 7.
fn leading_number(v: &[u8]) -> u64 {
    let v = v
        .strip_prefix(b"count=")
        .or_else(|| v.strip_prefix(b"calls="))
        .unwrap_or(v);
    v.iter()
        .take_while(|b| b.is_ascii_digit())
        .fold(0u64, |n, d| {
            n.wrapping_mul(10).wrapping_add(u64::from(d - b'0'))
        })
}

/// Reads fields of one `INFO` section (summed).
fn info_counts(section: &CStr, fields: &[&CStr]) -> u64 {
    crate::stats::CACHE_FILTER_READS.add(1);
    if let Some((text, _)) = section.to_str().ok().and_then(info_text) {
        return fields
            .iter()
            .filter_map(|f| field_in(&text, f.to_bytes()))
            .fold(0, u64::wrapping_add);
    }
    let ctx = events::detached();
    unsafe {
        let data = raw::RedisModule_GetServerInfo.unwrap()(ctx, section.as_ptr());
        if data.is_null() {
            return 0;
        }
        let n = fields.iter().map(|f| count_field(data, f)).sum();
        raw::RedisModule_FreeServerInfo.unwrap()(ctx, data);
        n
    }
}

/// `errorstat_X:count=3` → 3; `rdb_changes_since_last_save:7` → 7.
unsafe fn count_field(data: *mut raw::RedisModuleServerInfoData, field: &CStr) -> u64 {
    let v = raw::RedisModule_ServerInfoGetFieldC.unwrap()(data, field.as_ptr());
    if v.is_null() {
        return 0;
    }
    let v = CStr::from_ptr(v.cast::<c_char>()).to_bytes();
    std::str::from_utf8(v.strip_prefix(b"count=").unwrap_or(v))
        .ok()
        .and_then(|d| d.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// How many times commands that may write have been called (`INFO
/// commandstats`), also those that changed nothing (`DEL` of a missing key).
fn write_calls() -> u64 {
    crate::stats::CACHE_FILTER_READS.add(1);
    if let Some((text, _)) = info_text("commandstats") {
        return CATALOGUE.with(|c| {
            let c = c.borrow();
            text.split(|b| *b == b'\n')
                .filter_map(|line| {
                    let colon = line.iter().position(|b| *b == b':')?;
                    c.write_names
                        .contains(&line[..colon])
                        .then(|| leading_number(&line[colon + 1..]))
                })
                .fold(0, u64::wrapping_add)
        });
    }
    let ctx = events::detached();
    CATALOGUE.with(|c| {
        let c = c.borrow();
        unsafe {
            let data = raw::RedisModule_GetServerInfo.unwrap()(ctx, c"commandstats".as_ptr());
            if data.is_null() {
                return 0;
            }
            let n = c
                .write_stats
                .iter()
                .map(|f| calls_field(data, f))
                .fold(0u64, u64::wrapping_add);
            raw::RedisModule_FreeServerInfo.unwrap()(ctx, data);
            n
        }
    })
}

/// `cmdstat_set:calls=3,usec=…` → 3.
unsafe fn calls_field(data: *mut raw::RedisModuleServerInfoData, field: &CStr) -> u64 {
    let v = raw::RedisModule_ServerInfoGetFieldC.unwrap()(data, field.as_ptr());
    if v.is_null() {
        return 0;
    }
    CStr::from_ptr(v.cast::<c_char>())
        .to_bytes()
        .strip_prefix(b"calls=")
        .and_then(|d| std::str::from_utf8(d).ok())
        .and_then(|d| d.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// What tells whether a transaction wrote: calls of the commands flagged
/// `write` (a `DEL` of a missing key included), and the server's count of
/// changes (a command of a module loaded after warden, which the catalogue
/// does not list, counts there when it replicates).
fn writes_done() -> (u64, u64) {
    (write_calls(), changes())
}

/// `commands_done` and `noauth_refusals` in one `INFO stats errorstats`.
fn commands_and_noauth() -> (u64, u64) {
    crate::stats::CACHE_FILTER_READS.add(1);
    let before = OWN_INFO_CALLS.load(Ordering::Relaxed);
    let reply = Context::new(events::detached()).call("INFO", &["stats", "errorstats"]);
    match reply.ok().as_ref().and_then(text) {
        Some(text) => {
            OWN_INFO_CALLS.fetch_add(1, Ordering::Relaxed);
            let commands = field_in(&text, b"total_commands_processed").unwrap_or(0);
            (commands.wrapping_sub(before), noauth_in(&text))
        }
        None => (commands_done(), noauth_refusals()),
    }
}

/// How many commands the server has run (`INFO stats`).
fn commands_done() -> u64 {
    crate::stats::CACHE_FILTER_READS.add(1);
    // warden's own `INFO` calls are counted as commands run: taken off, so
    // that a refused command between two reads still moves nothing.
    match info_text("stats") {
        Some((text, own)) => field_in(&text, b"total_commands_processed")
            .unwrap_or(0)
            .wrapping_sub(own),
        None => info_counts(c"stats", &[c"total_commands_processed"]),
    }
}

/// The server's count of changes to the dataset (it only grows between
/// saves: a change of any kind means something was written).
fn changes() -> u64 {
    info_counts(c"persistence", &[c"rdb_changes_since_last_save"])
}

/// Decided on the next command, or on the next timer turn (one timer armed
/// at a time).
fn decide_soon(delay_ms: i64) {
    ANY_PENDING.store(true, Ordering::Relaxed);
    if DECIDE_ARMED.swap(true, Ordering::Relaxed) {
        return;
    }
    unsafe {
        raw::RedisModule_CreateTimer.unwrap()(
            events::detached(),
            delay_ms,
            Some(on_decide),
            std::ptr::null_mut(),
        )
    };
}

fn note(pending: Pending) {
    PENDING.with(|p| {
        let mut p = p.borrow_mut();
        let full = p.len() >= MAX_PENDING;
        if full {
            if let (Learn::Auth(_), Some(c)) = (pending.learn, pending.client) {
                // Not followed: it may have authenticated.
                forget_trust(c);
                return;
            }
        }
        match p.last_mut() {
            Some(last) if full => {
                last.reread |= pending.reread;
                if pending.writes.all {
                    last.writes = Writes::all();
                }
                for name in &pending.writes.names {
                    last.writes.add(name);
                }
            }
            _ => p.push(pending),
        }
    });
    decide_soon(0);
}

/// Decides the commands noted (their keys' leases end if they ran) and the
/// window since the filter was registered: from a timer, or a command of a
/// client (no command runs then).
pub fn decide() {
    decide_now(true);
}

/// `decide`. Not `conclusive` (a command a script or a module runs, inside
/// another command still running): a noted command that has not run yet is
/// kept for a later decision, not taken as refused. What was read is
/// returned: until something else runs, the next note's baseline.
fn decide_now(conclusive: bool) -> Fresh {
    let mut fresh = Fresh::default();
    if !ANY_PENDING.load(Ordering::Relaxed) || !ANY_PENDING.swap(false, Ordering::Relaxed) {
        return fresh;
    }
    if let Some(before) = WINDOW.with(Cell::take) {
        // Commands the filter never saw (postponed by a pause or queued in a
        // transaction before it was registered, run by the server since)
        // changed the dataset after the leases now in the table were granted.
        if changes() != before {
            commands::revoke_all();
            commands::reap_soon();
        }
    }
    let pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    // A client to learn: the count of commands run and of NOAUTH refusals
    // in one INFO call.
    let mut noauth_now = None;
    if pending.iter().any(|p| matches!(p.learn, Learn::Client(_))) && fresh.commands.is_none() {
        let (commands, noauth) = commands_and_noauth();
        fresh.commands = Some(commands);
        noauth_now = Some(noauth);
    }
    let mut keep = Vec::new();
    for p in pending {
        if let (Learn::Auth(before), Some(c)) = (p.learn, p.client) {
            // Not refused: it may have authenticated.
            if auth_refusals() == before {
                forget_trust(c);
            }
            continue;
        }
        // It ran if a write command was called (also one that changed
        // nothing, a `DEL` of a missing key) or the dataset changed since it
        // was noted: a refused command, an `EXEC` that aborted or was
        // WATCH-ed out, runs none. An error reply with a refusal's code
        // (a script's own, another client's) cannot pass for a refusal.
        // Not yet run but not refused either: a command the server postponed
        // or blocked (it runs later, unseen, so it counts now and its client
        // is watched); on Redis 7.0, which does not say who sent it, a
        // command that may block counts unless a refusal was counted.
        let blocked = p.client.is_some_and(|c| {
            client_flags(c)
                .is_some_and(|f| f & u64::from(raw::REDISMODULE_CLIENTINFO_FLAG_BLOCKED) != 0)
        });
        let ran = match p.before {
            // Nothing ran since the baseline (outside any command): the
            // write counts are what they were, and are not read again.
            Evidence::Writes(calls, changes, commands)
                if conclusive && *fresh.commands.get_or_insert_with(commands_done) == commands =>
            {
                crate::stats::CACHE_FILTER_NOTHING_RAN.add(1);
                fresh.writes.get_or_insert((calls, changes));
                blocked
            }
            Evidence::Writes(calls, changes, _) => {
                let now = *fresh.writes.get_or_insert_with(writes_done);
                now != (calls, changes) || blocked
            }
            Evidence::Commands(_) => fresh.evidence(false) != p.before || blocked,
        };
        if let (Learn::Client(noauth), Some(c)) = (p.learn, p.client) {
            // Authentication is checked before anything else that refuses a
            // command the server knows: a command that ran, or was refused
            // for another reason, comes from an authenticated client.
            // Without error counts (`UNKNOWN`), only a command that ran
            // tells.
            if ran {
                if connected(c) {
                    trust(c, Trust::Runs);
                }
            } else if conclusive {
                let now = noauth_now.unwrap_or_else(noauth_refusals);
                if noauth != UNKNOWN && now != UNKNOWN {
                    if now != noauth {
                        trust(c, Trust::NoAuth);
                    } else if connected(c) {
                        trust(c, Trust::Runs);
                    }
                }
            }
        }
        if !ran {
            if !conclusive {
                keep.push(p);
            }
            continue;
        }
        {
            p.writes.revoke();
            if p.reread {
                read_catalogue(&Context::new(events::detached()));
            }
            if let Some(client) = p.client {
                if blocked {
                    WATCHED.with(|w| {
                        w.borrow_mut().push(Watched {
                            client,
                            writes: p.writes,
                            unblocked: false,
                        })
                    });
                    if !ANY_WATCHED.swap(true, Ordering::Relaxed) {
                        watch_soon(WATCH_POLL_MS);
                    }
                }
            }
        }
    }
    if !keep.is_empty() {
        PENDING.with(|p| *p.borrow_mut() = keep);
        decide_soon(0);
    }
    fresh
}

/// How often a blocked client's state is looked at, for cleanup only (a
/// fill looks first).
const WATCH_POLL_MS: i64 = 100;

fn watch_soon(delay_ms: i64) {
    unsafe {
        raw::RedisModule_CreateTimer.unwrap()(
            events::detached(),
            delay_ms,
            Some(on_watch),
            std::ptr::null_mut(),
        )
    };
}

extern "C" fn on_watch(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard::callback((), || {
        decide();
        if ANY_WATCHED.load(Ordering::Relaxed) {
            check_watched(Some(ctx));
        }
    })
}

/// Before a fill: a watched client that has run (or is about to) ends the
/// leases its command reaches, so a lease granted while it was blocked
/// stores nothing.
pub fn settle() {
    if ANY_WATCHED.load(Ordering::Relaxed) {
        check_watched(None);
    }
}

/// The watched clients: a client still blocked goes on waiting; one that
/// left or has run ends the leases its command reaches (again: a lease
/// granted while it was blocked came before its write).
fn check_watched(ctx: Option<*mut raw::RedisModuleCtx>) {
    let watched = WATCHED.with(|w| std::mem::take(&mut *w.borrow_mut()));
    let mut keep = Vec::new();
    let mut timer = false;
    for mut w in watched {
        let blocked = match client_flags(w.client) {
            None => false,
            Some(f) => f & u64::from(raw::REDISMODULE_CLIENTINFO_FLAG_BLOCKED) != 0,
        };
        if blocked {
            keep.push(w);
            continue;
        }
        // Unblocked: it has run, or runs before the server next waits for
        // events. Until a timer turn tells which, every decision ends its
        // leases again.
        w.writes.revoke();
        let pending = match ctx {
            Some(ctx) => client_flags(w.client).is_some() && awaits_run(ctx, w.client),
            None => client_flags(w.client).is_some(),
        };
        if pending {
            timer |= !w.unblocked || ctx.is_some();
            w.unblocked = true;
            keep.push(w);
        }
    }
    let any = !keep.is_empty();
    WATCHED.with(|w| w.borrow_mut().extend(keep));
    ANY_WATCHED.store(any, Ordering::Relaxed);
    if timer {
        // An unblocked client is looked at again on the next timer turn.
        watch_soon(0);
    } else if any && ctx.is_some() {
        watch_soon(WATCH_POLL_MS);
    } else if !any && commands::idle() {
        // The filter goes once the table is empty and nothing is watched.
        commands::reap_soon();
    }
}

/// Whether an unblocked client's command still waits to run (`CLIENT LIST`
/// flag `u`). If the server will not say, it is taken to have run.
fn awaits_run(ctx: *mut raw::RedisModuleCtx, client: u64) -> bool {
    let id = client.to_string();
    let reply = Context::new(ctx).call("CLIENT", &["LIST", "ID", &id]);
    let Ok(line) = reply.as_ref().map(text) else {
        return false;
    };
    let Some(line) = line else { return false };
    line.split(|b| *b == b' ')
        .find_map(|f| f.strip_prefix(b"flags="))
        .is_some_and(|flags| flags.contains(&b'u'))
}

extern "C" fn on_decide(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    DECIDE_ARMED.store(false, Ordering::Relaxed);
    guard::callback((), || {
        decide();
        if TO_LEARN.with(|t| !t.borrow().is_empty()) {
            learn_now(&Context::new(ctx));
        }
    })
}

/// What a decision taught of a client (where the server names the sender:
/// Redis ≥ 7.2, Valkey), so that its next write naming a leased key is
/// decided before it runs, at a few hundred instructions, with no `INFO`
/// read:
///
/// - `Runs`: a command of its ran, so it is authenticated — and stays so
///   until `RESET` or it leaves (a failed `AUTH` keeps the user it had; a
///   user disabled keeps its connections). Its next write naming a leased
///   key ends the lease before it runs if nothing else can refuse it: the
///   ACL allows it (asked of the server, as `processCommand` asks), the
///   client is not in `MULTI`, and the server is not a replica, out of memory, loading, in a cluster or
///   running a script (any of which sends it the slow way, below). A write
///   the server then refuses for a reason no module can see (`MISCONF` after
///   a failed save, a module's long command) ends the lease anyway: a
///   reload, never a stale fill. While `min-replicas-to-write` is set, it
///   goes the slow way.
/// - `NoAuth`: a command of its was refused with `NOAUTH`, so every command
///   it sends is refused before it runs, until it sends one an
///   unauthenticated client may run (`AUTH`, `HELLO`, `RESET`, a module's
///   login: decided after, by whether a `WRONGPASS`/`NOAUTH` was counted),
///   or anyone sends what may change who must authenticate (`ACL`,
///   `CONFIG`, `MODULE`, a renamed command not yet learnt): then all of it
///   is forgotten.
///
/// A client not known yet takes the slow way once: its command is noted and
/// decided when the next command arrives (one `INFO stats` read, and one
/// `INFO errorstats` read if it was refused).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Trust {
    Runs,
    NoAuth,
}

fn trust_of(client: u64) -> Option<Trust> {
    TRUST.with(|t| t.borrow().get(&client).copied())
}

/// `ACL`, `CONFIG` or `MODULE` is renamed (or disabled): every command is
/// looked at while a client is known unauthenticated.
static ADMIN_RENAMED: AtomicBool = AtomicBool::new(true);

/// Whether the command is `ACL`, `CONFIG` or `MODULE` (by name: none is
/// renamed, `ADMIN_RENAMED`).
fn names_admin(fctx: FilterCtx) -> bool {
    let name = arg(fctx, 0);
    [&b"acl"[..], b"config", b"module"]
        .iter()
        .any(|a| name.eq_ignore_ascii_case(a))
}

/// `BLMOVE` or `BRPOPLPUSH` (by name; renamed, they go unwatched): when a
/// client blocked in one is served, it writes its destination without
/// passing the filter.
fn names_blocking_move(fctx: FilterCtx) -> bool {
    let name = arg(fctx, 0);
    name.eq_ignore_ascii_case(b"blmove") || name.eq_ignore_ascii_case(b"brpoplpush")
}

/// Clients known unauthenticated (`ANY_NOAUTH` while there are any).
static NOAUTH_CLIENTS: AtomicU64 = AtomicU64::new(0);

fn trust(client: u64, what: Trust) {
    let was = TRUST.with(|t| t.borrow_mut().insert(client, what));
    count_noauth(was, Some(what));
}

/// Follows how many clients are known unauthenticated, from what a client
/// was known as and is now.
fn count_noauth(was: Option<Trust>, now: Option<Trust>) {
    let (was, now) = (was == Some(Trust::NoAuth), now == Some(Trust::NoAuth));
    if now && !was {
        NOAUTH_CLIENTS.fetch_add(1, Ordering::Relaxed);
    } else if was && !now {
        NOAUTH_CLIENTS.fetch_sub(1, Ordering::Relaxed);
    }
    ANY_NOAUTH.store(
        NOAUTH_CLIENTS.load(Ordering::Relaxed) > 0,
        Ordering::Relaxed,
    );
}

fn forget_trust(client: u64) {
    let was = TRUST.with(|t| {
        let mut t = t.borrow_mut();
        let was = t.remove(&client);
        if t.capacity() > 64 && t.len() * 4 < t.capacity() {
            t.shrink_to_fit();
        }
        was
    });
    count_noauth(was, None);
}

/// Forgets which clients are unauthenticated (who must authenticate may
/// have changed).
fn forget_unauthenticated() {
    TRUST.with(|t| t.borrow_mut().retain(|_, w| *w != Trust::NoAuth));
    NOAUTH_CLIENTS.store(0, Ordering::Relaxed);
    ANY_NOAUTH.store(false, Ordering::Relaxed);
}

/// `min-replicas-to-write` is set: the server may refuse a write with
/// `NOREPLICAS`, which no module can see coming.
static REPLICAS_REQUIRED: AtomicBool = AtomicBool::new(false);

/// Reads the settings that decide whether the server may refuse a write
/// for a reason no module can see (at load and on every `CONFIG SET`):
/// `INFO replication` lists `min_slaves_good_slaves` only while
/// `min-replicas-to-write` is on.
pub fn check_settings(ctx: &Context) {
    let on = unsafe {
        let data = raw::RedisModule_GetServerInfo.unwrap()(ctx.ctx, c"replication".as_ptr());
        if data.is_null() {
            return;
        }
        let v =
            raw::RedisModule_ServerInfoGetFieldC.unwrap()(data, c"min_slaves_good_slaves".as_ptr());
        raw::RedisModule_FreeServerInfo.unwrap()(ctx.ctx, data);
        !v.is_null()
    };
    REPLICAS_REQUIRED.store(on, Ordering::Relaxed);
}

/// Refusals of authentication counted (`INFO errorstats`).
fn auth_refusals() -> u64 {
    info_counts(
        c"errorstats",
        &[c"errorstat_WRONGPASS", c"errorstat_NOAUTH"],
    )
}

/// `NOAUTH` refusals counted, or `UNKNOWN` once the server stopped counting
/// errors (past 128 error codes it lists only
/// `errorstat_ERRORSTATS_DISABLED`): then no refusal tells what a client is.
fn noauth_refusals() -> u64 {
    match info_text("errorstats") {
        Some((text, _)) => {
            crate::stats::CACHE_FILTER_READS.add(1);
            noauth_in(&text)
        }
        None if info_counts(c"errorstats", &[c"errorstat_ERRORSTATS_DISABLED"]) > 0 => UNKNOWN,
        None => info_counts(c"errorstats", &[c"errorstat_NOAUTH"]),
    }
}

const UNKNOWN: u64 = u64::MAX;

fn noauth_in(text: &[u8]) -> u64 {
    if text.windows(19).any(|w| w == b"ERRORSTATS_DISABLED") {
        return UNKNOWN;
    }
    field_in(text, b"errorstat_NOAUTH").unwrap_or(0)
}

/// While some client is known unauthenticated, every command passes here:
/// whether this one is refused for sure (a command of such a client that an
/// unauthenticated client may not run); what may authenticate the client,
/// or change who must authenticate, is followed.
fn refused_unauthenticated(fctx: FilterCtx, argc: c_int, client: Option<u64>) -> bool {
    let entry = CATALOGUE.with(|c| c.borrow().resolve(arg(fctx, 0)));
    let entry = match entry {
        Some(e) => e,
        // Unknown to the server: refused, and it changes nothing.
        None if matches!(lookup(fctx, argc), Lookup::Refused) => return false,
        // Renamed, or a later module's: it may be anything.
        None => {
            forget_unauthenticated();
            return false;
        }
    };
    if entry.admin {
        forget_unauthenticated();
        return false;
    }
    let Some(c) = client.filter(|&c| trust_of(c) == Some(Trust::NoAuth)) else {
        return false;
    };
    if !entry.no_auth {
        return true;
    }
    note(Pending {
        writes: Writes::default(),
        before: Evidence::Commands(0),
        client: Some(c),
        learn: Learn::Auth(auth_refusals()),
        reread: false,
    });
    false
}

/// Whether nothing a module can see would refuse the command of a client
/// known authenticated (see `Trust`).
fn will_run(fctx: FilterCtx, argc: c_int, client: u64) -> Option<bool> {
    let unsure = raw::REDISMODULE_CTX_FLAGS_LUA
        | raw::REDISMODULE_CTX_FLAGS_OOM
        | raw::REDISMODULE_CTX_FLAGS_SLAVE
        | raw::REDISMODULE_CTX_FLAGS_CLUSTER
        | raw::REDISMODULE_CTX_FLAGS_LOADING
        | raw::REDISMODULE_CTX_FLAGS_ASYNC_LOADING;
    let flags = unsafe { raw::RedisModule_GetContextFlags.unwrap()(events::detached()) };
    // A write the server postpones (a pause) runs later, unseen: the slow
    // way watches its client.
    if flags as u32 & unsure != 0 || REPLICAS_REQUIRED.load(Ordering::Relaxed) || paused() {
        return None;
    }
    // The client's flags are not asked (filling them in costs a system call
    // and `inet_ntop`, more than the rest): it is not blocked (a blocked
    // client's commands wait unread), and not in `MULTI` (it was not when
    // its write ran, and every `MULTI` since passed here: its commands go
    // to `queue`). A RESP2 subscriber's refused write revokes: a reload.
    if CATALOGUE.with(|c| c.borrow().may_block(arg(fctx, 0))) {
        return None;
    }
    acl_allows(fctx, argc, client)
}

/// Whether the client's user may run the command on its keys (the check
/// `processCommand` makes); `None` if the server will not say (a user
/// disabled since: its connections go on).
fn acl_allows(fctx: FilterCtx, argc: c_int, client: u64) -> Option<bool> {
    let (Some(name_of), Some(user_of), Some(check), Some(free_user), Some(free)) = (unsafe {
        (
            raw::RedisModule_GetClientUserNameById,
            raw::RedisModule_GetModuleUserFromUserName,
            raw::RedisModule_ACLCheckCommandPermissions,
            raw::RedisModule_FreeModuleUser,
            raw::RedisModule_FreeString,
        )
    }) else {
        return None;
    };
    let ctx = events::detached();
    let name = unsafe { name_of(ctx, client) };
    if name.is_null() {
        return None;
    }
    let user = unsafe { user_of(name) };
    unsafe { free(ctx, name) };
    if user.is_null() {
        return None;
    }
    let get = unsafe { raw::RedisModule_CommandFilterArgGet.unwrap() };
    let mut argv: Vec<*mut raw::RedisModuleString> =
        (0..argc).map(|i| unsafe { get(fctx, i) }).collect();
    let allowed = unsafe { check(user, argv.as_mut_ptr(), argc) } == raw::REDISMODULE_OK as c_int;
    unsafe { free_user(user) };
    Some(allowed)
}

/// A command of one argument that opens or ends a transaction.
enum Step {
    Multi,
    Exec,
    /// `DISCARD`.
    Drop,
    /// `RESET`: it also ends the client's authentication.
    Reset,
}

fn step(name: &[u8]) -> Option<Step> {
    if name.eq_ignore_ascii_case(b"multi") {
        Some(Step::Multi)
    } else if name.eq_ignore_ascii_case(b"exec") {
        Some(Step::Exec)
    } else if name.eq_ignore_ascii_case(b"discard") {
        Some(Step::Drop)
    } else if name.eq_ignore_ascii_case(b"reset") {
        Some(Step::Reset)
    } else {
        None
    }
}

fn forget_transaction(client: u64) -> Option<Transaction> {
    QUEUED.with(|q| {
        let t = q.borrow_mut().remove(&client);
        ANY_QUEUED.store(!q.borrow().is_empty(), Ordering::Relaxed);
        t
    })
}

/// `MULTI`, `EXEC`, `DISCARD` or `RESET` (they take no argument).
fn transaction_step(step: Step, client: Option<u64>, fresh: &mut Fresh) {
    match (step, client) {
        (Step::Multi, Some(c)) => {
            OUTSIDE.with(|o| o.borrow_mut().remove(&c));
            QUEUED.with(|q| {
                q.borrow_mut()
                    .entry(c)
                    .or_insert(Transaction::new(false, Writes::default()));
            });
            ANY_QUEUED.store(true, Ordering::Relaxed);
        }
        (Step::Exec, Some(c)) => {
            // A transaction opened before the filter listened may hold
            // writes warden never saw: every lease counts as written.
            let t = match forget_transaction(c) {
                Some(t) => t,
                None if !OUTSIDE.with(|o| o.borrow().contains(&c)) && in_multi(c) => {
                    Transaction::new(true, Writes::all())
                }
                None => {
                    // Outside any transaction: until its next MULTI (which
                    // passes here), its EXECs need no lookup.
                    OUTSIDE.with(|o| o.borrow_mut().insert(c));
                    return;
                }
            };
            let mut t = t;
            if t.admin {
                // Not known to run yet, but what it queued may let clients
                // in: what was learnt of them is forgotten (conservative).
                forget_unauthenticated();
            }
            t.add_granted_since();
            // Invariant: a transaction that reaches no lease is not noted —
            // no INFO read, no client lookup for transactions on other keys.
            if t.reaches_leases() && (t.confirmed || in_multi(c)) {
                note(Pending::new(t.writes, Some(c), true, fresh));
            }
        }
        // Redis 7.0 does not say who sends a command: any transaction may
        // hold writes warden did not see queued.
        (Step::Exec, None) => note(Pending::new(Writes::all(), None, true, fresh)),
        (Step::Drop, Some(c)) => {
            forget_transaction(c);
        }
        (Step::Reset, Some(c)) => {
            forget_transaction(c);
            forget_trust(c);
        }
        (Step::Multi | Step::Drop | Step::Reset, None) => {}
    }
}

/// A command from a client that sent `MULTI`: a write is queued with its
/// transaction (whether or not its keys have leases now); whether the
/// command was taken.
fn queue(fctx: FilterCtx, argc: c_int, client: u64) -> bool {
    let confirmed = QUEUED.with(|q| q.borrow().get(&client).map(|t| t.confirmed));
    let confirm = match confirmed {
        None => return false,
        // If its MULTI was refused this command runs now: that matters only
        // if it may name a leased key (then it is looked at as any other).
        // Otherwise it is kept unconfirmed; the EXEC confirms, if the
        // transaction reaches a lease.
        Some(false) if (1..argc).any(|i| may_name(arg(fctx, i))) => {
            if !in_multi(client) {
                forget_transaction(client);
                return false;
            }
            true
        }
        Some(c) => c,
    };
    // The catalogue alone, at a few instructions: a queued command the
    // server refuses aborts the whole transaction at its EXEC anyway. A
    // name the catalogue does not know (renamed, a later module's) counts
    // as a write that may grant until it is learnt.
    let (entry, unnamed) = CATALOGUE.with(|c| {
        let c = c.borrow();
        (c.entry_of(fctx, argc), c.writes_unnamed(fctx, argc))
    });
    let (write, grants, admin) = match entry {
        Some(e) => (e.write, e.grants, e.admin),
        None => match lookup(fctx, argc) {
            Lookup::Refused => (false, false, false),
            _ => {
                learn(arg(fctx, 0).to_ascii_lowercase());
                (true, true, true)
            }
        },
    };
    QUEUED.with(|q| {
        let mut q = q.borrow_mut();
        let Some(t) = q.get_mut(&client) else { return };
        t.confirmed |= confirm;
        t.grants |= grants;
        t.admin |= admin;
        if unnamed {
            // Its EXEC ends every lease, if a write ran in it.
            t.writes = Writes::all();
        }
        if write {
            for i in 1..argc {
                let a = arg(fctx, i);
                // After a command that may grant a lease inside the EXEC,
                // every argument is kept whole: the lease may be its.
                if t.grants || may_name(a) {
                    t.writes.add(a);
                } else {
                    t.others |= other_bit(a);
                }
            }
        }
    });
    true
}

/// Whether `examine` would let the command pass at once, told at a few
/// instructions an argument: nothing waits to be decided, no transaction is
/// followed, it is no transaction step, no argument may name an entry, and
/// no write is postponed that would be kept.
fn passes(fctx: FilterCtx) -> bool {
    if ANY_PENDING.load(Ordering::Relaxed) {
        return false;
    }
    // A command that may write keys it does not name (`DEBUG POPULATE`).
    if UNNAMED_LENS.load(Ordering::Relaxed) & len_bit(arg(fctx, 0).len()) != 0 {
        let argc = unsafe { raw::RedisModule_CommandFilterArgsCount.unwrap_unchecked()(fctx) };
        if CATALOGUE.with(|c| c.borrow().writes_unnamed(fctx, argc)) {
            return false;
        }
    }
    // While a client is known unauthenticated, its commands and what may
    // change who must authenticate are looked at; the rest pass as ever.
    if ANY_NOAUTH.load(Ordering::Relaxed) {
        let unauthenticated = || sender(fctx).is_some_and(|c| trust_of(c) == Some(Trust::NoAuth));
        if ADMIN_RENAMED.load(Ordering::Relaxed) || unauthenticated() || names_admin(fctx) {
            return false;
        }
    }
    // A blocking move may write a key leased after it blocked.
    if names_blocking_move(fctx) && sender(fctx).is_some() {
        return false;
    }
    // Only the clients in a followed transaction are looked at for it.
    if ANY_QUEUED.load(Ordering::Relaxed) {
        let queued = sender(fctx).is_some_and(|c| QUEUED.with(|q| q.borrow().contains_key(&c)));
        if queued {
            return false;
        }
    }
    // Read once, not per argument (as far as the compiler knows, every call
    // into the server may change them). Set, since `listen` registers the
    // filter only if they are, and the server sets them once, at load.
    let (count, get, ptr_len) = unsafe {
        (
            raw::RedisModule_CommandFilterArgsCount.unwrap_unchecked(),
            raw::RedisModule_CommandFilterArgGet.unwrap_unchecked(),
            raw::RedisModule_StringPtrLen.unwrap_unchecked(),
        )
    };
    let argc = unsafe { count(fctx) };
    if argc == 1 {
        return false;
    }
    for i in 1..argc {
        let s = unsafe { get(fctx, i) };
        let a = if s.is_null() {
            &[][..]
        } else {
            let mut len = 0;
            let ptr = unsafe { ptr_len(s, &mut len) };
            // The argument lives until the filter returns; the slice does
            // not outlive this loop.
            unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
        };
        if may_name(a) {
            return false;
        }
    }
    // Redis 7.0 does not say who sent a command, and `examine` keeps no
    // postponed write there: the pause is asked only where it is kept.
    let names_sender = unsafe { raw::RedisModule_CommandFilterGetClientId }.is_some();
    !(names_sender && paused())
}

extern "C" fn on_command(fctx: FilterCtx) {
    guard::callback((), || {
        if !passes(fctx) {
            examine(fctx);
        }
    })
}

/// The filter, for a command `passes` did not let through (its own panic
/// guard is the same as `on_command`'s: nested, it costs nothing).
fn examine(fctx: FilterCtx) {
    guard::callback((), || {
        // The command before this one has been answered by now — unless
        // this one is run by a script or a module inside a command still
        // running (its sender is no client of the server's): then what has
        // not run yet waits. Nothing runs from here to this command's note:
        // the counts read to decide are its baseline.
        // Asked only when needed (a client lookup per command adds up).
        let inside_once = std::cell::OnceCell::new();
        let inside = || *inside_once.get_or_init(|| sender(fctx).is_some_and(|c| !connected(c)));
        let mut fresh = if ANY_PENDING.load(Ordering::Relaxed) {
            decide_now(!inside())
        } else {
            Fresh::default()
        };
        let argc = unsafe { raw::RedisModule_CommandFilterArgsCount.unwrap()(fctx) };
        let real = || sender(fctx).filter(|_| !inside());
        if ANY_NOAUTH.load(Ordering::Relaxed) && refused_unauthenticated(fctx, argc, real()) {
            return;
        }
        if argc == 1 {
            if let Some(s) = step(arg(fctx, 0)) {
                transaction_step(s, sender(fctx), &mut fresh);
            }
            return;
        }
        if ANY_QUEUED.load(Ordering::Relaxed) {
            if let Some(c) = sender(fctx) {
                if queue(fctx, argc, c) {
                    return;
                }
            }
        }
        // A command that may write keys it does not name ends every lease
        // once it is known to have run (decided as any other: one the
        // server refuses — `DEBUG` disabled, `NOAUTH`, `NOPERM` — ends none).
        if CATALOGUE.with(|c| c.borrow().writes_unnamed(fctx, argc)) {
            let mut pending = Pending::new(Writes::all(), sender(fctx), inside(), &mut fresh);
            pending.reread = names_admin(fctx);
            note(pending);
            return;
        }
        let mut writes = Writes::default();
        for i in 1..argc {
            let a = arg(fctx, i);
            if may_name(a) && commands::names(a) {
                writes.names.push(a.to_vec());
            }
        }
        // A write the server postpones (a pause) may run after leases are
        // granted on keys it names, without passing the filter again (seen
        // on Redis 8.2 and Valkey 9.1): all its arguments are kept.
        // So is a `BLMOVE`'s or `BRPOPLPUSH`'s: if it blocks, it writes its
        // destination when served — later, unseen — and a lease granted on
        // that key meanwhile must end then (its client is watched).
        let postponed = writes.names.is_empty() && (paused() || names_blocking_move(fctx));
        if (writes.names.is_empty() && !postponed)
            || !CATALOGUE.with(|c| c.borrow().may_write(fctx, argc))
        {
            return;
        }
        let client = sender(fctx);
        if postponed {
            if client.is_none() {
                // Redis 7.0 passes a postponed command through the filter
                // again when it runs (a served `BLMOVE` it does not: a gap
                // there, since it does not say who sent a command).
                return;
            }
            for i in 1..argc {
                writes.add(arg(fctx, i));
            }
        }
        // A client known to have run a write is in no transaction warden
        // did not see open (every MULTI since passed here).
        if let Some(c) = client.filter(|&c| trust_of(c) != Some(Trust::Runs) && in_multi(c)) {
            // A transaction opened before the filter listened: it may hold
            // writes warden never saw.
            QUEUED.with(|q| {
                q.borrow_mut()
                    .insert(c, Transaction::new(true, Writes::all()));
            });
            ANY_QUEUED.store(true, Ordering::Relaxed);
            return;
        }
        let mut learn = Learn::Nothing;
        if let Some(c) = real().filter(|_| !postponed) {
            match trust_of(c) {
                // Refused before it runs (`refused_unauthenticated` says so first).
                Some(Trust::NoAuth) => return,
                // Invariant: a lease ends before the command runs only if
                // the server will run it; one the ACL refuses ends none.
                Some(Trust::Runs) => match will_run(fctx, argc, c) {
                    Some(true) => {
                        writes.revoke();
                        return;
                    }
                    Some(false) => return,
                    None => {}
                },
                None => {
                    let noauth = match fresh.commands {
                        Some(_) => noauth_refusals(),
                        None => {
                            let (commands, noauth) = commands_and_noauth();
                            fresh.commands = Some(commands);
                            noauth
                        }
                    };
                    learn = Learn::Client(noauth);
                }
            }
        }
        // A command run inside another is told to have run by the write
        // calls (the command around it is counted as a command too). On
        // Redis 7.0 a command that blocks is counted when it is called, a
        // refused one (a RESP2 subscriber's `BLMOVE`) never.
        let mut pending = Pending::new(writes, client, inside(), &mut fresh);
        pending.learn = learn;
        note(pending);
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
    forget_trust(client);
    OUTSIDE.with(|o| o.borrow_mut().remove(&client));
}

/// Listens while the table has entries, and only then: registered at the
/// first entry, unregistered (from a timer, never from inside the filter)
/// once the table is empty; what waits to be decided is decided first.
pub fn listen(on: bool) {
    let filter = FILTER.with(Cell::get);
    let ctx = events::detached();
    if on && filter.is_null() {
        let readable = unsafe {
            (
                raw::RedisModule_CommandFilterArgsCount,
                raw::RedisModule_CommandFilterArgGet,
                raw::RedisModule_StringPtrLen,
            )
        };
        let readable = readable.0.is_some() && readable.1.is_some() && readable.2.is_some();
        // `passes` reads them unchecked.
        assert!(readable, "the server's module API cannot read commands");
        let f = unsafe {
            raw::RedisModule_RegisterCommandFilter.unwrap()(
                ctx,
                Some(on_command),
                raw::REDISMODULE_CMDFILTER_NOSELF as c_int,
            )
        };
        FILTER.with(|c| c.set(f));
        // What the server runs from now to the next command or timer turn
        // without passing the filter may write the keys just leased.
        WINDOW.with(|w| w.set(Some(changes())));
        decide_soon(0);
    } else if !on && !filter.is_null() {
        decide();
        QUEUED.with(|q| *q.borrow_mut() = FxHashMap::default());
        ANY_QUEUED.store(false, Ordering::Relaxed);
        // Disconnects are not heard without leases: what was learnt of
        // clients is dropped with them.
        TRUST.with(|t| *t.borrow_mut() = FxHashMap::default());
        OUTSIDE.with(|o| *o.borrow_mut() = rustc_hash::FxHashSet::default());
        RECENT.with(|r| *r.borrow_mut() = std::collections::VecDeque::new());
        NOAUTH_CLIENTS.store(0, Ordering::Relaxed);
        ANY_NOAUTH.store(false, Ordering::Relaxed);
        // Watched clients stay watched (by a timer, and before each fill): a
        // client blocked for good must not keep the filter on the rest of
        // the server once no lease is left.
        unsafe { raw::RedisModule_UnregisterCommandFilter.unwrap()(ctx, filter) };
        FILTER.with(|c| c.set(std::ptr::null_mut()));
    }
}

/// Whether the filter is registered (`INFO warden`, tests).
pub fn listening() -> bool {
    !FILTER.with(Cell::get).is_null()
}
