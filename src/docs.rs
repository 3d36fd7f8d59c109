//! `COMMAND DOCS` / `COMMAND INFO`: summary, complexity, arity, key spec and
//! arguments of every command, given to Redis with `RedisModule_SetCommandInfo`
//! (which copies everything, so the C structures here live only for the call).
//! docs/commands.md documents the same commands; tests/command_docs.rs
//! fails when the two disagree (syntax, summary, complexity, since, flags,
//! tips).

use std::ffi::CString;
use std::os::raw::{c_char, c_int};
use std::ptr;

use redis_module::{raw, Context};

use crate::command::Command;

type ArgType = raw::RedisModuleCommandArgType;

const KEY: ArgType = raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY;
const STRING: ArgType = raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING;
const INTEGER: ArgType = raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER;
const DOUBLE: ArgType = raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE;
const TOKEN: ArgType = raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN;
const ONEOF: ArgType = raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF;
const BLOCK: ArgType = raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK;

/// One argument of a command's documentation.
pub struct ArgDoc {
    name: &'static str,
    ty: ArgType,
    token: Option<&'static str>,
    flags: u32,
    sub: &'static [ArgDoc],
}

const fn arg(name: &'static str, ty: ArgType) -> ArgDoc {
    ArgDoc {
        name,
        ty,
        token: None,
        flags: 0,
        sub: &[],
    }
}

/// `[TOKEN value]`.
const fn option(token: &'static str, name: &'static str, ty: ArgType) -> ArgDoc {
    ArgDoc {
        name,
        ty,
        token: Some(token),
        flags: raw::REDISMODULE_CMD_ARG_OPTIONAL,
        sub: &[],
    }
}

/// `[TOKEN]`.
const fn flag(token: &'static str) -> ArgDoc {
    ArgDoc {
        name: token,
        ty: TOKEN,
        token: Some(token),
        flags: raw::REDISMODULE_CMD_ARG_OPTIONAL,
        sub: &[],
    }
}

/// `TOKEN value`, required (inside an optional block).
const fn keyword(token: &'static str, name: &'static str, ty: ArgType) -> ArgDoc {
    ArgDoc {
        name,
        ty,
        token: Some(token),
        flags: 0,
        sub: &[],
    }
}

/// `TOKEN value`, required, an integer.
const fn keyword_arg(token: &'static str, name: &'static str) -> ArgDoc {
    keyword(token, name, INTEGER)
}

const fn many(name: &'static str, ty: ArgType) -> ArgDoc {
    ArgDoc {
        name,
        ty,
        token: None,
        flags: raw::REDISMODULE_CMD_ARG_MULTIPLE,
        sub: &[],
    }
}

const fn choice(token: &'static str) -> ArgDoc {
    ArgDoc {
        name: token,
        ty: TOKEN,
        token: Some(token),
        flags: 0,
        sub: &[],
    }
}

/// One command's documentation.
pub struct Doc {
    name: &'static str,
    summary: &'static str,
    complexity: &'static str,
    arity: c_int,
    writes: bool,
    args: &'static [ArgDoc],
}

const KEY_ARG: ArgDoc = arg("key", KEY);
const OWNER: ArgDoc = arg("owner", STRING);
const TTL: ArgDoc = arg("ttl", INTEGER);
const WAIT: ArgDoc = option("WAIT", "timeout", INTEGER);
const QUEUE: ArgDoc = option("QUEUE", "n", INTEGER);
const ITEM: ArgDoc = arg("item", STRING);
const ITEMS: ArgDoc = many("item", STRING);

pub const DOCS: &[Doc] = &[
    Doc { name: "lock.acquire", summary: "Acquires an exclusive lock (re-entrant), optionally waiting in a FIFO queue; returns a fencing token or nil", complexity: "O(1)", arity: -4, writes: true, args: &[KEY_ARG, OWNER, TTL, WAIT, QUEUE] },
    Doc { name: "lock.release", summary: "Releases one hold of an exclusive lock and hands it to the oldest waiter", complexity: "O(1)", arity: 3, writes: true, args: &[KEY_ARG, OWNER] },
    Doc { name: "lock.extend", summary: "Resets the lease of an exclusive lock held by the owner", complexity: "O(1)", arity: 4, writes: true, args: &[KEY_ARG, OWNER, TTL] },
    Doc { name: "lock.info", summary: "Returns the owner, holds, remaining ttl, fencing token and waiters of an exclusive lock", complexity: "O(1)", arity: 2, writes: false, args: &[KEY_ARG] },
    Doc { name: "warden.lockset", summary: "Sets the whole state of an exclusive lock (replication stream and AOF)", complexity: "O(1)", arity: 6, writes: true, args: &[KEY_ARG, OWNER, arg("holds", INTEGER), arg("fence", INTEGER), arg("deadline", INTEGER)] },
    Doc { name: "rwlock.read", summary: "Acquires a shared read lock, optionally waiting in a FIFO queue; returns a fencing token or nil", complexity: "O(N) where N is the number of readers", arity: -4, writes: true, args: &[KEY_ARG, OWNER, TTL, WAIT, QUEUE] },
    Doc { name: "rwlock.write", summary: "Acquires the exclusive write lock, optionally waiting in a FIFO queue; returns a fencing token or nil", complexity: "O(N) where N is the number of readers", arity: -4, writes: true, args: &[KEY_ARG, OWNER, TTL, WAIT, QUEUE] },
    Doc { name: "rwlock.unlock", summary: "Releases one hold of the owner (in the mode named, else write holds first), and hands the lock to waiters", complexity: "O(N) where N is the number of readers", arity: -3, writes: true, args: &[KEY_ARG, OWNER, ArgDoc { name: "mode", ty: ONEOF, token: None, flags: raw::REDISMODULE_CMD_ARG_OPTIONAL, sub: &[choice("READ"), choice("WRITE")] }] },
    Doc { name: "rwlock.extend", summary: "Resets every lease of the owner on a read-write lock", complexity: "O(N) where N is the number of readers", arity: 4, writes: true, args: &[KEY_ARG, OWNER, TTL] },
    Doc { name: "rwlock.info", summary: "Returns the mode, writer, readers, holds, ttl, fencing token and waiters of a read-write lock", complexity: "O(N) where N is the number of readers", arity: 2, writes: false, args: &[KEY_ARG] },
    Doc { name: "warden.rwset", summary: "Sets the whole state of a read-write lock (replication stream and AOF)", complexity: "O(N) where N is the number of holds", arity: -8, writes: true, args: &[KEY_ARG, arg("fence", INTEGER), ArgDoc { name: "hold", ty: BLOCK, token: None, flags: raw::REDISMODULE_CMD_ARG_MULTIPLE, sub: &[arg("mode", STRING), OWNER, arg("holds", INTEGER), arg("fence", INTEGER), arg("deadline", INTEGER)] }] },
    Doc { name: "sem.acquire", summary: "Acquires permits of a semaphore (at most LIMIT held at once), optionally waiting in a FIFO queue; returns a fencing token or nil", complexity: "O(log N + W) where N is the number of holders and W the waiters granted", arity: -6, writes: true, args: &[KEY_ARG, OWNER, TTL, keyword_arg("LIMIT", "limit"), option("PERMITS", "permits", INTEGER), WAIT, QUEUE] },
    Doc { name: "sem.release", summary: "Releases the owner's permits of a semaphore and grants the waiters that now fit", complexity: "O(log N + W) where N is the number of holders and W the waiters granted", arity: 3, writes: true, args: &[KEY_ARG, OWNER] },
    Doc { name: "sem.extend", summary: "Resets the lease of the owner's permits of a semaphore", complexity: "O(log N) where N is the number of holders", arity: 4, writes: true, args: &[KEY_ARG, OWNER, TTL] },
    Doc { name: "sem.setlimit", summary: "Changes the limit of a semaphore; waiters that now fit are granted at once", complexity: "O(Q + W) where Q is the number of waiters", arity: 3, writes: true, args: &[KEY_ARG, arg("limit", INTEGER)] },
    Doc { name: "sem.info", summary: "Returns the limit, permits used, holders and waiters of a semaphore, and optionally one owner's permits and ttl", complexity: "O(N) where N is the number of holders", arity: -2, writes: false, args: &[KEY_ARG, ArgDoc { name: "owner", ty: STRING, token: None, flags: raw::REDISMODULE_CMD_ARG_OPTIONAL, sub: &[] }] },
    Doc { name: "warden.semset", summary: "Sets the changed holds (or the whole state) of a semaphore (replication stream and AOF)", complexity: "O(H log N) where H is the number of holds named", arity: -6, writes: true, args: &[KEY_ARG, arg("limit", INTEGER), arg("fence", INTEGER), arg("now", INTEGER), ArgDoc { name: "mode", ty: ONEOF, token: None, flags: 0, sub: &[choice("SET"), choice("MERGE")] }, ArgDoc { name: "hold", ty: BLOCK, token: None, flags: raw::REDISMODULE_CMD_ARG_OPTIONAL | raw::REDISMODULE_CMD_ARG_MULTIPLE, sub: &[OWNER, arg("permits", INTEGER), arg("fence", INTEGER), arg("deadline", INTEGER)] }] },
    Doc { name: "rate.acquire", summary: "Takes tokens of a rate limiter (GCRA: COUNT per PERIOD ms, at most BURST at once), answering at once or, with WAIT, queueing in FIFO order until they conform; returns [limited, burst, remaining, retry_after, reset_after]", complexity: "O(1 + W) where W is the number of waiters served", arity: -4, writes: true, args: &[KEY_ARG, arg("count", INTEGER), arg("period", INTEGER), option("BURST", "burst", INTEGER), option("COST", "cost", INTEGER), WAIT, QUEUE] },
    Doc { name: "rate.refund", summary: "Gives tokens back to a rate limiter (never beyond a full bucket) and serves the waiters that now conform", complexity: "O(1 + W) where W is the number of waiters served", arity: 3, writes: true, args: &[KEY_ARG, arg("cost", INTEGER)] },
    Doc { name: "rate.config", summary: "Changes the rate and burst of a rate limiter, keeping the tokens it owes", complexity: "O(1 + W) where W is the number of waiters served", arity: -4, writes: true, args: &[KEY_ARG, arg("count", INTEGER), arg("period", INTEGER), option("BURST", "burst", INTEGER)] },
    Doc { name: "rate.info", summary: "Returns the rate, burst, tokens remaining, ms until full and waiters of a rate limiter", complexity: "O(1)", arity: 2, writes: false, args: &[KEY_ARG] },
    Doc { name: "warden.rateset", summary: "Sets the whole state of a rate limiter (replication stream and AOF)", complexity: "O(1)", arity: 7, writes: true, args: &[KEY_ARG, arg("count", INTEGER), arg("period", INTEGER), arg("burst", INTEGER), arg("tat_ms", INTEGER), arg("tat_rem", INTEGER)] },
    Doc { name: "gcra", summary: "The core GCRA proposal's rate limiter, for clients that send it (Redisson RGcra): takes TOKENS of a limiter of max_burst + 1 tokens refilled tokens_per_period per period seconds; returns [limited, max_burst + 1, remaining, retry_after, full_burst_after] in seconds", complexity: "O(1)", arity: -5, writes: true, args: &[KEY_ARG, arg("max_burst", INTEGER), arg("tokens_per_period", INTEGER), arg("period", DOUBLE), option("TOKENS", "count", INTEGER)] },
    Doc { name: "warden.rwhold", summary: "Applies the holds one command changed to a read-write lock, after dropping those whose lease ended (replication stream and AOF)", complexity: "O(N + C) where N is the number of holds and C the number of changed holds", arity: -9, writes: true, args: &[KEY_ARG, arg("now", INTEGER), arg("fence", INTEGER), ArgDoc { name: "hold", ty: BLOCK, token: None, flags: raw::REDISMODULE_CMD_ARG_MULTIPLE, sub: &[arg("mode", STRING), OWNER, arg("holds", INTEGER), arg("fence", INTEGER), arg("deadline", INTEGER)] }] },
    Doc { name: "cache.get", summary: "Reads a cached string value; on a miss grants one fill lease per key, and with WAIT queues until the fill answers with the value; returns [value, lease]", complexity: "O(1)", arity: -3, writes: true, args: &[KEY_ARG, arg("lease_ms", INTEGER), WAIT, QUEUE, option("REFRESH", "ms", INTEGER), flag("FRESH")] },
    Doc { name: "cache.fill", summary: "Stores a value under the key's current fill lease and answers every waiter with it; refused if the lease is not current", complexity: "O(1 + W) where W is the number of waiters", arity: -4, writes: true, args: &[KEY_ARG, arg("lease", INTEGER), arg("value", STRING), ArgDoc { name: "expiry", ty: BLOCK, token: None, flags: raw::REDISMODULE_CMD_ARG_OPTIONAL, sub: &[keyword("PX", "ms", INTEGER), option("JITTER", "ms", INTEGER)] }] },
    Doc { name: "cache.abandon", summary: "Ends a fill lease unfilled; the oldest waiter gets a new lease", complexity: "O(1)", arity: 3, writes: true, args: &[KEY_ARG, arg("lease", INTEGER)] },
    Doc { name: "cache.invalidate", summary: "Deletes a cached value (or keeps it as stale for a while) and revokes its fill lease, even for a missing key", complexity: "O(1)", arity: -2, writes: true, args: &[KEY_ARG, option("STALE", "ms", INTEGER)] },
    Doc { name: "cache.info", summary: "Returns whether the key is a hit, stale or a miss, its ttl, its fill lease and lease ttl, and its waiters", complexity: "O(1)", arity: 2, writes: false, args: &[KEY_ARG] },
    Doc { name: "cache.peek", summary: "Returns the cached value, its absolute expiry and its stale mark, or nil; grants no lease, so a client-side cache may keep the reply until the key is written", complexity: "O(1)", arity: 2, writes: false, args: &[KEY_ARG] },
    Doc { name: "warden.syncstate", summary: "Records which replicas acknowledge grants and whether the AOF is fsynced before each reply (replication stream and AOF)", complexity: "O(N) where N is the number of replicas", arity: 4, writes: true, args: &[arg("sync-replicas", INTEGER), arg("always", INTEGER), arg("replicas", STRING)] },
    Doc { name: "warden.contended", summary: "Lists the keys with clients waiting right now, most waiters first: key, db, kind, waiters, oldest and total wait in ms", complexity: "O(K * log(n)) where K is the number of keys with waiters and n the count", arity: -1, writes: false, args: &[option("COUNT", "count", INTEGER)] },
    Doc { name: "warden.withdraw", summary: "Takes the requests of owner still queued on key out of their queue; each is answered nil, as at its deadline; returns how many", complexity: "O(W) where W is the number of requests queued on the key", arity: 3, writes: false, args: &[KEY_ARG, OWNER] },
    Doc { name: "bf.reserve", summary: "Creates an empty Bloom filter for a capacity and an error rate", complexity: "O(1)", arity: -4, writes: true, args: &[KEY_ARG, arg("error_rate", DOUBLE), arg("capacity", INTEGER), option("EXPANSION", "expansion", INTEGER), flag("NONSCALING")] },
    Doc { name: "bf.add", summary: "Adds an item to a Bloom filter, creating it if needed", complexity: "O(k + i) where k is the number of probes and i the number of sub-filters", arity: 3, writes: true, args: &[KEY_ARG, ITEM] },
    Doc { name: "bf.madd", summary: "Adds items to a Bloom filter, creating it if needed", complexity: "O(n * (k + i))", arity: -3, writes: true, args: &[KEY_ARG, ITEMS] },
    Doc { name: "bf.insert", summary: "Adds items to a Bloom filter, creating it with the given parameters if needed", complexity: "O(n * (k + i))", arity: -4, writes: true, args: &[KEY_ARG, option("CAPACITY", "capacity", INTEGER), option("ERROR", "error", DOUBLE), option("EXPANSION", "expansion", INTEGER), flag("NOCREATE"), flag("NONSCALING"), ArgDoc { name: "item", ty: STRING, token: Some("ITEMS"), flags: raw::REDISMODULE_CMD_ARG_MULTIPLE, sub: &[] }] },
    Doc { name: "bf.exists", summary: "Tells whether an item may be in a Bloom filter", complexity: "O(k * i)", arity: 3, writes: false, args: &[KEY_ARG, ITEM] },
    Doc { name: "bf.mexists", summary: "Tells for each item whether it may be in a Bloom filter", complexity: "O(n * k * i)", arity: -3, writes: false, args: &[KEY_ARG, ITEMS] },
    Doc { name: "bf.info", summary: "Returns the capacity, size, sub-filters, items and expansion of a Bloom filter", complexity: "O(i)", arity: -2, writes: false, args: &[KEY_ARG, ArgDoc { name: "field", ty: ONEOF, token: None, flags: raw::REDISMODULE_CMD_ARG_OPTIONAL, sub: &[choice("CAPACITY"), choice("SIZE"), choice("FILTERS"), choice("ITEMS"), choice("EXPANSION")] }] },
    Doc { name: "bf.card", summary: "Returns the number of items added to a Bloom filter", complexity: "O(i)", arity: 2, writes: false, args: &[KEY_ARG] },
    Doc { name: "bf.debug", summary: "Describes a Bloom filter: items, then bytes, bits, hashes, capacity, items and error rate of each sub-filter", complexity: "O(i)", arity: 2, writes: false, args: &[KEY_ARG] },
    Doc { name: "bf.scandump", summary: "Dumps a Bloom filter in chunks of at most 4 MiB, for BF.LOADCHUNK", complexity: "O(n) where n is the chunk size", arity: 3, writes: false, args: &[KEY_ARG, arg("iterator", INTEGER)] },
    Doc { name: "bf.loadchunk", summary: "Restores a Bloom filter from BF.SCANDUMP chunks, validating every byte", complexity: "O(n) where n is the chunk size", arity: 4, writes: true, args: &[KEY_ARG, arg("iterator", INTEGER), arg("data", STRING)] },
];

/// The version that added a command, where it is not 1.0.0.
const SINCE: &[(&str, &str)] = &[
    ("warden.contended", "1.1.0"),
    ("sem.acquire", "1.1.0"),
    ("sem.release", "1.1.0"),
    ("sem.extend", "1.1.0"),
    ("sem.setlimit", "1.1.0"),
    ("sem.info", "1.1.0"),
    ("warden.semset", "1.1.0"),
    ("warden.rwhold", "1.1.0"),
    ("warden.syncstate", "1.1.0"),
    ("rate.acquire", "1.1.0"),
    ("rate.refund", "1.1.0"),
    ("rate.config", "1.1.0"),
    ("rate.info", "1.1.0"),
    ("warden.rateset", "1.1.0"),
    ("gcra", "1.1.0"),
    ("cache.peek", "1.1.0"),
    ("warden.withdraw", "1.1.0"),
];

/// Arguments added after their command: (command, argument, version,
/// the history line `COMMAND DOCS` gives the command for it).
const ADDED: &[(&str, &str, &str, &str)] = &[(
    "rwlock.unlock",
    "mode",
    "1.1.0",
    "Added the optional `READ | WRITE` argument.",
)];

/// The reply can differ for the same arguments and the same value of the
/// key: it reports time left or waiters, or carries a token the server draws.
const NONDETERMINISTIC: &str = "nondeterministic_output";
/// A client-side cache must not keep the reply of this read.
const DONT_CACHE: &str = "dont_cache";
/// A read of both kinds: every read whose reply varies is also not cached.
const VARIES_DONT_CACHE: &str = "nondeterministic_output dont_cache";

/// Command tips (`COMMAND INFO`), by the rule of docs/commands.md
/// ("Tips"); a command not listed has none. A read that answers from the
/// key's value alone (`BF.EXISTS`, `BF.MEXISTS`, `BF.CARD`) has none, so
/// client-side caches keep it until the key is written. Redis splits the
/// text at single spaces and copies it as given (7.0 onwards, Valkey).
const TIPS: &[(&str, &str)] = &[
    ("lock.acquire", NONDETERMINISTIC),
    ("lock.info", VARIES_DONT_CACHE),
    ("rwlock.read", NONDETERMINISTIC),
    ("rwlock.write", NONDETERMINISTIC),
    ("rwlock.info", VARIES_DONT_CACHE),
    ("sem.acquire", NONDETERMINISTIC),
    ("sem.info", VARIES_DONT_CACHE),
    ("rate.acquire", NONDETERMINISTIC),
    ("gcra", NONDETERMINISTIC),
    ("rate.info", VARIES_DONT_CACHE),
    ("cache.get", NONDETERMINISTIC),
    ("cache.info", VARIES_DONT_CACHE),
    ("warden.contended", VARIES_DONT_CACHE),
    ("warden.withdraw", VARIES_DONT_CACHE),
    ("bf.info", DONT_CACHE),
    ("bf.debug", DONT_CACHE),
    ("bf.scandump", DONT_CACHE),
];

fn tips(name: &str) -> Option<&'static str> {
    TIPS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

fn since(name: &str) -> &'static str {
    SINCE
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("1.0.0", |(_, v)| v)
}

/// Keeps the C strings of one call alive.
struct Strings(Vec<CString>);

impl Strings {
    fn c(&mut self, s: &str) -> *const c_char {
        self.0
            .push(CString::new(s).expect("documentation has no NUL"));
        self.0.last().expect("just pushed").as_ptr()
    }

    fn opt(&mut self, s: Option<&str>) -> *const c_char {
        s.map_or(ptr::null(), |s| self.c(s))
    }
}

/// The version that added argument `arg` of `command`, if later than the command.
fn arg_since(command: &str, arg: &str) -> Option<&'static str> {
    ADDED
        .iter()
        .find(|(c, a, _, _)| *c == command && *a == arg)
        .map(|(_, _, v, _)| *v)
}

/// A zero-terminated C array of arguments (and their sub-arguments) of `command`.
fn c_args(
    command: &str,
    args: &[ArgDoc],
    strings: &mut Strings,
    arrays: &mut Vec<Vec<raw::RedisModuleCommandArg>>,
) -> *mut raw::RedisModuleCommandArg {
    let mut out: Vec<raw::RedisModuleCommandArg> = args
        .iter()
        .map(|a| raw::RedisModuleCommandArg {
            name: strings.c(a.name),
            type_: a.ty,
            key_spec_index: if a.ty == KEY { 0 } else { -1 },
            token: strings.opt(a.token),
            summary: ptr::null(),
            since: strings.opt(arg_since(command, a.name)),
            flags: a.flags as c_int,
            deprecated_since: ptr::null(),
            subargs: if a.sub.is_empty() {
                ptr::null_mut()
            } else {
                c_args(command, a.sub, strings, arrays)
            },
            display_text: ptr::null(),
        })
        .collect();
    out.push(unsafe { std::mem::zeroed() });
    let p = out.as_mut_ptr();
    arrays.push(out);
    p
}

/// A zero-terminated C array of `command`'s history entries (null if none).
fn c_history(
    command: &str,
    strings: &mut Strings,
    out: &mut Vec<raw::RedisModuleCommandHistoryEntry>,
) -> *mut raw::RedisModuleCommandHistoryEntry {
    out.extend(
        ADDED
            .iter()
            .filter(|(c, _, _, _)| *c == command)
            .map(
                |(_, _, since, changes)| raw::RedisModuleCommandHistoryEntry {
                    since: strings.c(since),
                    changes: strings.c(changes),
                },
            ),
    );
    if out.is_empty() {
        return ptr::null_mut();
    }
    out.push(unsafe { std::mem::zeroed() });
    out.as_mut_ptr()
}

/// Gives Redis the documentation of the commands of `commands` (from `DOCS`).
pub fn register(ctx: &Context, commands: &[Command]) -> bool {
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    };
    let registered = |doc: &&Doc| commands.iter().any(|c| c.name == doc.name);
    DOCS.iter().filter(registered).all(|doc| {
        let mut strings = Strings(Vec::new());
        let mut arrays = Vec::new();
        let mut history = Vec::new();
        let access = if doc.writes {
            raw::REDISMODULE_CMD_KEY_RW
                | raw::REDISMODULE_CMD_KEY_ACCESS
                | raw::REDISMODULE_CMD_KEY_UPDATE
        } else {
            raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS
        };
        let mut key_specs = [
            raw::RedisModuleCommandKeySpec {
                notes: ptr::null(),
                flags: u64::from(access),
                begin_search_type:
                    raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
                bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
                    index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 1 },
                },
                find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE,
                fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
                    range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                        lastkey: 0,
                        keystep: 1,
                        limit: 0,
                    },
                },
            },
            unsafe { std::mem::zeroed() },
        ];
        let info = raw::RedisModuleCommandInfo {
            version: &version,
            summary: strings.c(doc.summary),
            complexity: strings.c(doc.complexity),
            since: strings.c(since(doc.name)),
            history: c_history(doc.name, &mut strings, &mut history),
            tips: strings.opt(tips(doc.name)),
            arity: doc.arity,
            // A command without a key argument (WARDEN.CONTENDED) has no key spec.
            key_specs: if doc.args.iter().any(|a| a.ty == KEY) {
                key_specs.as_mut_ptr()
            } else {
                ptr::null_mut()
            },
            args: c_args(doc.name, doc.args, &mut strings, &mut arrays),
        };
        let name = CString::new(doc.name).expect("command name");
        unsafe {
            let command = raw::RedisModule_GetCommand.unwrap()(ctx.ctx, name.as_ptr());
            !command.is_null()
                && raw::RedisModule_SetCommandInfo.unwrap()(command, &info)
                    == raw::REDISMODULE_OK as c_int
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tips_name_documented_commands_and_split_at_single_spaces() {
        for (name, tips) in TIPS {
            assert!(DOCS.iter().any(|d| d.name == *name), "{name}: no Doc");
            assert!(tips.split(' ').all(|t| !t.is_empty()), "{name}: {tips:?}");
        }
    }

    #[test]
    fn every_read_whose_reply_varies_is_not_cached() {
        for doc in DOCS.iter().filter(|d| !d.writes) {
            let tips = tips(doc.name).unwrap_or_default();
            if tips.split(' ').any(|t| t == NONDETERMINISTIC) {
                assert!(tips.split(' ').any(|t| t == DONT_CACHE), "{}", doc.name);
            }
        }
    }

    #[test]
    fn only_reads_are_kept_out_of_caches() {
        for doc in DOCS.iter().filter(|d| d.writes) {
            let tips = tips(doc.name).unwrap_or_default();
            assert!(!tips.split(' ').any(|t| t == DONT_CACHE), "{}", doc.name);
        }
    }
}
