//! The commands that make this server follow a master — `REPLICAOF`,
//! `SLAVEOF`, `CLUSTER REPLICATE` — recognised by the command the server
//! will run, whatever name it was sent by (`rename-command`).
//!
//! Asked only by the waiters' role filter, which lives while grants are on
//! their way to their clients; it must stay cheap:
//! - Renames are fixed before any module loads (the config is read first),
//!   and a command has one name at a time. So when the server knows all
//!   three under their own names (read once at load), no other name can be
//!   one of them, and comparing the name sent is exact.
//! - Otherwise a name is looked up once (`COMMAND INFO name` gives the
//!   command's own name) and remembered. Only names the server knows are
//!   remembered (it says so first, without a call): at most its command
//!   table. A disabled command (renamed to "") is a name it does not know.

use std::cell::RefCell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{raw, Context, RedisValue};
use rustc_hash::FxHashMap;

use crate::events;

type FilterCtx = *mut raw::RedisModuleCommandFilterCtx;

/// What a command name stands for, here.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Named {
    /// `REPLICAOF` or `SLAVEOF`.
    Follow,
    /// `CLUSTER`: its `REPLICATE` subcommand follows a master.
    Cluster,
    Other,
}

const OWN_NAMES: [(&str, Named); 3] = [
    ("replicaof", Named::Follow),
    ("slaveof", Named::Follow),
    ("cluster", Named::Cluster),
];

/// Set at load when the server does not know one of the three under its
/// own name (renamed or disabled).
static RENAMED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Names the server knows, as sent (lowercase) → what they stand for.
    static LEARNT: RefCell<FxHashMap<Vec<u8>, Named>> = RefCell::default();
}

/// Reads at load whether the three commands are known under their own
/// names.
pub fn read_names_at_load(ctx: &Context) -> bool {
    let mut words = vec!["INFO"];
    words.extend(OWN_NAMES.map(|(n, _)| n));
    let renamed = match ctx.call("COMMAND", &words[..]) {
        Ok(RedisValue::Array(found)) => {
            found.len() != OWN_NAMES.len()
                || found
                    .iter()
                    .zip(OWN_NAMES)
                    .any(|(v, (own, _))| own_name(v).as_deref() != Some(own.as_bytes()))
        }
        _ => true,
    };
    RENAMED.store(renamed, Ordering::Relaxed);
    true
}

/// The command's own name in a `COMMAND INFO` entry, lowercase.
fn own_name(entry: &RedisValue) -> Option<Vec<u8>> {
    let RedisValue::Array(fields) = entry else {
        return None;
    };
    let name = match fields.first()? {
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => s.as_bytes().to_vec(),
        RedisValue::SimpleStringStatic(s) => s.as_bytes().to_vec(),
        RedisValue::BulkRedisString(s) => s.as_slice().to_vec(),
        RedisValue::StringBuffer(b) => b.clone(),
        _ => return None,
    };
    Some(name.to_ascii_lowercase())
}

fn arg(fctx: FilterCtx, pos: c_int) -> &'static [u8] {
    let s = unsafe { raw::RedisModule_CommandFilterArgGet.unwrap()(fctx, pos) };
    if s.is_null() {
        return &[];
    }
    let mut len = 0usize;
    let p = unsafe { raw::RedisModule_StringPtrLen.unwrap()(s, &mut len) };
    // The argument lives until the filter returns; the slice does not escape it.
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }
}

/// Whether the filtered command makes this server follow a master.
pub fn changes_master(fctx: FilterCtx) -> bool {
    // `REPLICAOF host port`, `SLAVEOF host port`, `CLUSTER REPLICATE id`.
    let argc = unsafe { raw::RedisModule_CommandFilterArgsCount.unwrap()(fctx) };
    if argc != 3 {
        return false;
    }
    match named(fctx, argc) {
        Named::Follow => {
            !(arg(fctx, 1).eq_ignore_ascii_case(b"no") && arg(fctx, 2).eq_ignore_ascii_case(b"one"))
        }
        Named::Cluster => arg(fctx, 1).eq_ignore_ascii_case(b"replicate"),
        Named::Other => false,
    }
}

fn named(fctx: FilterCtx, argc: c_int) -> Named {
    let sent = arg(fctx, 0);
    if !RENAMED.load(Ordering::Relaxed) {
        return OWN_NAMES
            .iter()
            .find(|(own, _)| sent.eq_ignore_ascii_case(own.as_bytes()))
            .map_or(Named::Other, |&(_, n)| n);
    }
    let lower = sent.to_ascii_lowercase();
    if let Some(n) = LEARNT.with(|l| l.borrow().get(&lower).copied()) {
        return n;
    }
    if !known(fctx, argc) {
        // The server refuses it: it follows no master.
        return Named::Other;
    }
    let n = ask(&lower);
    LEARNT.with(|l| l.borrow_mut().insert(lower, n));
    n
}

/// Whether the server knows the command (and its subcommand): it looks it
/// up as it will to run it, and sets `ENOENT` only when it does not.
fn known(fctx: FilterCtx, argc: c_int) -> bool {
    crate::cache::filter::server_lookup(fctx, argc)
        .is_none_or(|e| std::io::Error::from_raw_os_error(e).kind() != std::io::ErrorKind::NotFound)
}

/// What the server runs under `name` (the filter that asks does not see
/// this call: it is registered `NOSELF`).
fn ask(name: &[u8]) -> Named {
    let ctx = Context::new(events::detached());
    let words: [&[u8]; 2] = [b"INFO", name];
    let own = match ctx.call("COMMAND", &words[..]) {
        Ok(RedisValue::Array(items)) => items.first().and_then(own_name),
        _ => None,
    };
    OWN_NAMES
        .iter()
        .find(|(n, _)| own.as_deref() == Some(n.as_bytes()))
        .map_or(Named::Other, |&(_, n)| n)
}
