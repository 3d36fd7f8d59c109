//! Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`). The server
//! refuses it while a loaded module does not declare that it handles it.
//!
//! What moves, and how: the source sends the target its slots' keys as the
//! commands an AOF rewrite writes (each type's `aof_rewrite`: `WARDEN.LOCKSET`,
//! `WARDEN.RWSET`, `WARDEN.SEMSET`, `BF.LOADCHUNK`), then every write to those
//! slots as the replication stream carries it — warden's effects included,
//! from commands and from its timers alike; the target applies both like a
//! master's stream (its token counter rises past every token it receives).
//! The source pauses writes (warden's timers grant nothing then), the target
//! takes the slots, and the source deletes their keys.
//!
//! What stays in the source's memory: its waiters and its cache leases. When
//! the slots are gone, nothing there may be granted: the keys' deletion would
//! otherwise hand each lock, read-write lock and semaphore to its next waiter
//! on a node that no longer serves it, while the target's holder keeps it.
//! So on the event that says the slots now belong to the target, every waiter
//! on a key of those slots is answered `MOVED` (its client sends the command
//! again to the new owner), and the cache leases of those keys are revoked (a
//! fill with one is refused on either node).

use std::os::raw::{c_char, c_int, c_void};

use redis_module::{raw, Context, RedisValue};

/// `VALKEYMODULE_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION` (Valkey 9.0+). Redis
/// may give this bit another meaning: it is passed only to a Valkey that
/// lists it among its options.
const HANDLE_ATOMIC_SLOT_MIGRATION: c_int = 1 << 5;

/// `VALKEYMODULE_EVENT_ATOMIC_SLOT_MIGRATION` and the subevent that says the
/// slots of an export now belong to its target.
pub const EVENT: u64 = 19;
pub const EXPORT_COMPLETED: u64 = 5;

const SLOTS: usize = 16384;

/// Whether this server has atomic slot migration and takes the option:
/// Valkey (which registers its API under the `ValkeyModule_` names too)
/// from 9.0 on, where `GetModuleOptionsAll` lists the bit.
pub fn supported() -> bool {
    let mut api: *mut c_void = std::ptr::null_mut();
    let valkey = unsafe {
        raw::RedisModule_GetApi.is_some_and(|get| {
            get(
                c"ValkeyModule_GetServerVersion".as_ptr(),
                (&mut api as *mut *mut c_void).cast::<c_void>(),
            ) == raw::REDISMODULE_OK as c_int
        })
    };
    let version = unsafe { raw::RedisModule_GetServerVersion.map_or(0, |f| f()) };
    let options = unsafe { raw::RedisModule_GetModuleOptionsAll.map_or(0, |f| f()) };
    valkey && version >= 0x0009_0000 && options & HANDLE_ATOMIC_SLOT_MIGRATION != 0
}

/// Declares the options: I/O errors handled everywhere; atomic slot
/// migration where the server has it (see the module comment for why
/// nothing is lost or doubled).
pub fn set_options(ctx: &Context) {
    let mut options = raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS as c_int;
    if supported() {
        options |= HANDLE_ATOMIC_SLOT_MIGRATION;
    }
    unsafe { raw::RedisModule_SetModuleOptions.unwrap()(ctx.ctx, options) };
}

/// A set of hash slots.
pub struct Slots(Box<[u64; SLOTS / 64]>);

impl Slots {
    pub fn new() -> Self {
        Self(Box::new([0; SLOTS / 64]))
    }

    pub fn insert(&mut self, slot: u16) {
        self.0[usize::from(slot) / 64] |= 1 << (slot % 64);
    }

    pub fn contains(&self, slot: u16) -> bool {
        self.0[usize::from(slot) / 64] & (1 << (slot % 64)) != 0
    }

    /// Whether the key named `name` hashes into this set.
    pub fn has_key(&self, name: &[u8]) -> bool {
        self.contains(key_slot(name))
    }
}

impl Default for Slots {
    fn default() -> Self {
        Self::new()
    }
}

/// `ValkeyModuleSlotRange`: inclusive bounds.
#[repr(C)]
struct SlotRange {
    start: c_int,
    end: c_int,
}

/// `ValkeyModuleAtomicSlotMigrationInfoV1`.
#[repr(C)]
struct MigrationInfo {
    version: u64,
    job_name: [c_char; 41],
    slot_ranges: *const SlotRange,
    num_slot_ranges: u32,
}

/// The slots an `EXPORT_COMPLETED` event names; `None` if its data does not
/// have the shape asked for (version 1, valid ranges).
///
/// Safety: `data` is what the server passes with that event.
pub unsafe fn exported(data: *mut c_void) -> Option<Slots> {
    let info = unsafe { data.cast::<MigrationInfo>().as_ref() }?;
    if info.version != 1 || info.num_slot_ranges as usize > SLOTS || info.slot_ranges.is_null() {
        return None;
    }
    let ranges =
        unsafe { std::slice::from_raw_parts(info.slot_ranges, info.num_slot_ranges as usize) };
    let mut slots = Slots::new();
    for r in ranges {
        let (Ok(start), Ok(end)) = (u16::try_from(r.start), u16::try_from(r.end)) else {
            return None;
        };
        if start > end || usize::from(end) >= SLOTS {
            return None;
        }
        (start..=end).for_each(|s| slots.insert(s));
    }
    Some(slots)
}

/// The hash slot of a key: CRC16 (XMODEM) of its hash tag — the part between
/// the first `{` and the next `}`, when not empty — or of the whole name.
pub fn key_slot(name: &[u8]) -> u16 {
    let tagged = name.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &name[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(name)) & (SLOTS as u16 - 1)
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Who serves each slot now (`CLUSTER SLOTS`: inclusive ranges and the
/// master's preferred endpoint), for the `MOVED` answers. Read once per
/// completed export that has waiters; empty if the command fails (renamed).
pub fn owners(ctx: &Context) -> Vec<(u16, u16, String)> {
    let Ok(RedisValue::Array(ranges)) = ctx.call("CLUSTER", &["SLOTS"]) else {
        return Vec::new();
    };
    let number = |v: &RedisValue| match v {
        RedisValue::Integer(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    let text = |v: &RedisValue| match v {
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => Some(s.clone()),
        RedisValue::StringBuffer(b) => String::from_utf8(b.clone()).ok(),
        RedisValue::BulkRedisString(s) => s.try_as_str().ok().map(str::to_string),
        _ => None,
    };
    ranges
        .iter()
        .filter_map(|range| {
            let RedisValue::Array(fields) = range else {
                return None;
            };
            let RedisValue::Array(master) = fields.get(2)? else {
                return None;
            };
            let (start, end) = (number(fields.first()?)?, number(fields.get(1)?)?);
            let port = match master.get(1)? {
                RedisValue::Integer(p) => *p,
                _ => return None,
            };
            Some((start, end, format!("{}:{port}", text(master.first()?)?)))
        })
        .collect()
}

/// The answer for a waiter on a key of slot `slot`: `MOVED` to its owner,
/// or `TRYAGAIN` when the owner is unknown (the retry then gets the server's
/// own `MOVED`).
pub fn redirect(owners: &[(u16, u16, String)], slot: u16) -> String {
    match owners.iter().find(|(a, b, _)| (*a..=*b).contains(&slot)) {
        Some((_, _, endpoint)) => format!("MOVED {slot} {endpoint}"),
        None => crate::error::SLOT_MOVED.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_those_of_the_cluster_spec() {
        // CRC16-XMODEM check value, and slots redis-cli CLUSTER KEYSLOT gives.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        for (key, slot) in [
            (&b"foo"[..], 12182),
            (b"bar", 5061),
            (b"{user1000}.following", 3443),
            (b"{user1000}.followers", 3443),
            (b"foo{}{bar}", 8363),
            (b"foo{{bar}}zap", 4015),
            (b"foo{bar}{zap}", 5061),
            (b"", 0),
        ] {
            assert_eq!(key_slot(key), slot, "{}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn a_slot_set_holds_what_was_put_in() {
        let mut s = Slots::new();
        s.insert(0);
        s.insert(16383);
        s.insert(12182);
        assert!(s.contains(0) && s.contains(16383) && s.has_key(b"foo"));
        assert!(!s.contains(1) && !s.has_key(b"bar"));
    }

    #[test]
    fn redirects_name_the_owner_or_ask_for_a_retry() {
        let owners = vec![(0, 100, "127.0.0.1:7001".to_string())];
        assert_eq!(redirect(&owners, 69), "MOVED 69 127.0.0.1:7001");
        assert!(redirect(&owners, 101).starts_with("TRYAGAIN "));
    }
}
