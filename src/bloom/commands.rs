//! `BF.*`: drop-in for RedisBloom 2.8's Bloom commands.

use std::os::raw::{c_char, c_long};
use std::sync::atomic::Ordering;

use redis_module::{raw, Context, ContextFlags, RedisError, RedisResult, RedisValue};

use crate::command::Arg;

use crate::args::{integer, is_keyword};
use crate::bloom::chain::{Chain, Limit, Params, Refusal, Scheme, MAX_EXPANSION};
use crate::bloom::codec::{self, BadData};
use crate::bloom::datatype::{type_of, BLOOM_TYPE, REDISBLOOM_TYPE};
use crate::bloom::debug;
use crate::bloom::redisbloom;
use crate::config::{parse_float, BF_ERROR_RATE, BF_EXPANSION, BF_INITIAL_CAPACITY, BF_MAX_MEMORY};
use crate::datatypes::store;
use crate::error;
use crate::keyspace::{effects_needed, notify, Key};
use crate::memory;
use crate::stats;

fn err(text: &'static str) -> RedisError {
    RedisError::Str(text)
}

fn refusal(r: Refusal, limit: Limit) -> String {
    match r {
        Refusal::TooLarge => error::BF_TOO_LARGE.to_string(),
        Refusal::NoRoom { need } => error::no_room(need, limit.room),
        Refusal::ErrorTooSmall => error::BF_ERROR_TOO_SMALL.to_string(),
        Refusal::Full => error::BF_FULL.to_string(),
        Refusal::Failed => error::BF_PROBLEM_INSERTING.to_string(),
    }
}

/// The memory limits for this call: effects from the master or the AOF are
/// applied whatever this server's own limits say.
fn max_bytes(ctx: &Context) -> Limit {
    if ctx
        .get_flags()
        .intersects(ContextFlags::REPLICATED | ContextFlags::LOADING)
    {
        Limit::from(u64::MAX)
    } else {
        Limit {
            filter: BF_MAX_MEMORY.load(Ordering::Relaxed) as u64,
            room: memory::room(),
        }
    }
}

fn defaults() -> Params {
    Params {
        capacity: BF_INITIAL_CAPACITY.load(Ordering::Relaxed) as u64,
        error: BF_ERROR_RATE.get(),
        expansion: Some(BF_EXPANSION.load(Ordering::Relaxed) as u32),
    }
}

fn chain_in(key: &Key) -> Result<Option<&mut Chain>, RedisError> {
    key.value_of_any::<Chain>(&[&BLOOM_TYPE, &REDISBLOOM_TYPE])
        .map_err(err)
}

/// `BF.RESERVE key error_rate capacity [EXPANSION expansion] [NONSCALING]`
pub fn reserve(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() < 4 {
        return Err(RedisError::WrongArity);
    }
    // `COMMAND INFO` says -4 (an arity cannot say "at most"): more words than
    // the longest form takes are a syntax error, not an arity one.
    if args.len() > 7 {
        return Err(err(error::SYNTAX));
    }
    let error = parse_float(&args[2]).ok_or(err(error::BF_BAD_ERROR_RATE))?;
    if !(error > 0.0 && error < 1.0) {
        return Err(err(error::BF_ERROR_RATE_RANGE));
    }
    let capacity = integer(&args[3]).ok_or(err(error::BF_BAD_CAPACITY))?;
    if capacity <= 0 {
        return Err(err(error::BF_CAPACITY_RANGE));
    }
    let mut nonscaling = false;
    let mut expansion_arg = None;
    let mut rest = args[4..].iter();
    while let Some(arg) = rest.next() {
        if is_keyword(arg, "NONSCALING") {
            nonscaling = true;
        } else if is_keyword(arg, "EXPANSION") {
            expansion_arg = Some(rest.next().ok_or(err(error::BF_NO_EXPANSION))?);
        } else {
            return Err(RedisError::String(error::unknown_argument(arg)));
        }
    }
    let expansion = match (expansion_arg, nonscaling) {
        (Some(_), true) => return Err(err(error::BF_NONSCALING_EXPANSION)),
        (None, true) => None,
        (None, false) => Some(BF_EXPANSION.load(Ordering::Relaxed) as u32),
        (Some(value), false) => Some(expansion(
            value,
            error::BF_BAD_EXPANSION,
            error::BF_EXPANSION_RANGE,
        )?),
    };
    let key = Key::write(ctx, &args[1]);
    if chain_in(&key)?.is_some() {
        return Err(err(error::BF_EXISTS));
    }
    let params = Params {
        capacity: capacity as u64,
        error,
        expansion,
    };
    let limit = max_bytes(ctx);
    let chain = Chain::new(params, limit).map_err(|r| RedisError::String(refusal(r, limit)))?;
    store(&key, &BLOOM_TYPE, chain);
    ctx.replicate_verbatim();
    notify(ctx, c"bf.reserve", &args[1]);
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// An expansion value: `bad` if not an integer, `range` below 1; above the maximum, our own error.
fn expansion(value: &[u8], bad: &'static str, range: &'static str) -> Result<u32, RedisError> {
    match integer(value).ok_or(err(bad))? {
        n if n < 1 => Err(err(range)),
        n if n > i64::from(MAX_EXPANSION) => Err(err(error::BF_EXPANSION_TOO_LARGE)),
        n => Ok(n as u32),
    }
}

/// Adds `items` to the filter in `key`, creating it with `create` if missing,
/// and hands each item's result to `each` (stopping after the first error).
/// A whole-command error comes back before any item is handled.
fn add_items(
    ctx: &Context,
    name: &Arg,
    items: &[Arg],
    create: Option<Params>,
    each: &mut dyn FnMut(Result<bool, String>),
) -> Result<(), RedisError> {
    let key = Key::write(ctx, name);
    // The limit is only needed to create or grow a filter: ask for it then.
    let mut limit = None;
    let mut limit = move || *limit.get_or_insert_with(|| max_bytes(ctx));
    let created = match (chain_in(&key)?, create) {
        (Some(_), _) => None,
        (None, None) => return Err(err(error::BF_NOT_FOUND)),
        (None, Some(params)) => {
            let limit = limit();
            let chain =
                Chain::new(params, limit).map_err(|r| RedisError::String(refusal(r, limit)))?;
            store(&key, &BLOOM_TYPE, chain);
            Some(params)
        }
    };
    let chain = chain_in(&key)?.ok_or(err(error::INTERNAL))?;
    let before = (chain.bytes() as i64, chain.filters.len() as i64);
    let mut added = false;
    for item in items {
        let room = if chain.is_full() {
            limit()
        } else {
            Limit::from(u64::MAX)
        };
        match chain.add(item, room) {
            Ok(new) => {
                added |= new;
                each(Ok(new));
            }
            Err(r) => {
                each(Err(refusal(r, room)));
                break;
            }
        }
    }
    stats::BLOOM_BYTES.add(chain.bytes() as i64 - before.0);
    stats::BLOOM_SUBFILTERS.add(chain.filters.len() as i64 - before.1);
    match created {
        // The replica must build the same filter whatever its own defaults are.
        Some(params) => replicate_insert(ctx, name, params, items),
        None if added => ctx.replicate_verbatim(),
        None => {}
    }
    if added || created.is_some() {
        notify(ctx, c"bf.add", name);
    }
    Ok(())
}

fn replicate_insert(ctx: &Context, name: &Arg, params: Params, items: &[Arg]) {
    if !effects_needed(ctx) {
        return;
    }
    let capacity = params.capacity.to_string();
    let error = format!("{:?}", params.error);
    let expansion = params.expansion.map(|x| x.to_string());
    let mut words: Vec<&[u8]> = vec![
        name,
        b"CAPACITY",
        capacity.as_bytes(),
        b"ERROR",
        error.as_bytes(),
    ];
    match &expansion {
        Some(x) => words.extend_from_slice(&[b"EXPANSION", x.as_bytes()]),
        None => words.push(b"NONSCALING"),
    }
    words.push(b"ITEMS");
    words.extend(items.iter().map(|i| &i[..]));
    ctx.replicate("BF.INSERT", &words[..]);
}

/// Adds items and replies with the array of their results. (Collected first:
/// a reply array of known length is cheaper for Redis than a postponed one.)
fn add_and_reply(ctx: &Context, name: &Arg, items: &[Arg], create: Option<Params>) -> RedisResult {
    let mut results = Vec::with_capacity(items.len());
    add_items(ctx, name, items, create, &mut |r| results.push(r))?;
    raw::reply_with_array(ctx.ctx, results.len() as c_long);
    for r in &results {
        reply_one(ctx, r);
    }
    Ok(RedisValue::NoReply)
}

fn reply_one(ctx: &Context, r: &Result<bool, String>) {
    match r {
        Ok(b) => {
            raw::reply_with_bool(ctx.ctx, i32::from(*b));
        }
        Err(text) => {
            ctx.reply_error_string(text);
        }
    }
}

/// `BF.ADD key item`
pub fn add(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let mut result = Err(error::INTERNAL.to_string());
    add_items(ctx, &args[1], &args[2..], Some(defaults()), &mut |r| {
        result = r
    })?;
    result.map(RedisValue::Bool).map_err(RedisError::String)
}

/// `BF.MADD key item [item ...]`
pub fn madd(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() < 3 {
        return Err(RedisError::WrongArity);
    }
    add_and_reply(ctx, &args[1], &args[2..], Some(defaults()))
}

/// `BF.INSERT key [CAPACITY c] [ERROR e] [EXPANSION x] [NOCREATE] [NONSCALING] ITEMS item ...`
pub fn insert(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() < 4 {
        return Err(RedisError::WrongArity);
    }
    let mut params = defaults();
    let (mut nocreate, mut nonscaling) = (false, false);
    let mut i = 2;
    let items_at = loop {
        let Some(arg) = args.get(i) else {
            return Err(RedisError::WrongArity);
        };
        let value = args.get(i + 1);
        if is_keyword(arg, "ITEMS") {
            break i + 1;
        } else if is_keyword(arg, "NOCREATE") {
            nocreate = true;
            i += 1;
            continue;
        } else if is_keyword(arg, "NONSCALING") {
            nonscaling = true;
            i += 1;
            continue;
        }
        let Some(value) = value else {
            return Err(RedisError::WrongArity);
        };
        if is_keyword(arg, "CAPACITY") {
            let c = integer(value).ok_or(err(error::BF_INSERT_BAD_CAPACITY))?;
            params.capacity = u64::try_from(c)
                .ok()
                .filter(|c| *c >= 1)
                .ok_or(err(error::BF_INSERT_BAD_ARGUMENT))?;
        } else if is_keyword(arg, "ERROR") {
            let e = parse_float(value).ok_or(err(error::BF_INSERT_BAD_ERROR_RATE))?;
            if !(e > 0.0 && e < 1.0) {
                return Err(err(error::BF_INSERT_BAD_ARGUMENT));
            }
            params.error = e;
        } else if is_keyword(arg, "EXPANSION") {
            let x = expansion(
                value,
                error::BF_INSERT_BAD_EXPANSION,
                error::BF_INSERT_BAD_ARGUMENT,
            )?;
            params.expansion = Some(x);
        } else {
            return Err(err(error::BF_INSERT_UNKNOWN));
        }
        i += 2;
    };
    if items_at >= args.len() {
        return Err(RedisError::WrongArity);
    }
    if nonscaling {
        params.expansion = None;
    }
    let create = (!nocreate).then_some(params);
    add_and_reply(ctx, &args[1], &args[items_at..], create)
}

/// `BF.EXISTS key item`
pub fn exists(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let key = Key::read(ctx, &args[1]);
    let found = chain_in(&key)?.is_some_and(|c| c.contains(&args[2]));
    Ok(RedisValue::Bool(found))
}

/// `BF.MEXISTS key item [item ...]`
pub fn mexists(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() < 3 {
        return Err(RedisError::WrongArity);
    }
    let key = Key::read(ctx, &args[1]);
    let chain = chain_in(&key)?;
    raw::reply_with_array(ctx.ctx, (args.len() - 2) as c_long);
    for item in &args[2..] {
        let found = chain.as_deref().is_some_and(|c| c.contains(item));
        raw::reply_with_bool(ctx.ctx, i32::from(found));
    }
    Ok(RedisValue::NoReply)
}

/// `BF.CARD key`
pub fn card(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    let key = Key::read(ctx, &args[1]);
    Ok(RedisValue::Integer(
        chain_in(&key)?.map_or(0, |c| c.items() as i64),
    ))
}

/// `BF.INFO key [CAPACITY | SIZE | FILTERS | ITEMS | EXPANSION]`
pub fn info(ctx: &Context, args: &[Arg]) -> RedisResult {
    if !(2..=3).contains(&args.len()) {
        return Err(RedisError::WrongArity);
    }
    let key = Key::read(ctx, &args[1]);
    let chain = chain_in(&key)?.ok_or(err(error::BF_NOT_FOUND))?;
    let fields: [(&str, &str, Option<i64>); 5] = [
        ("CAPACITY", "Capacity", Some(chain.capacity() as i64)),
        ("SIZE", "Size", Some(chain.bytes() as i64)),
        (
            "FILTERS",
            "Number of filters",
            Some(chain.filters.len() as i64),
        ),
        (
            "ITEMS",
            "Number of items inserted",
            Some(chain.items() as i64),
        ),
        (
            "EXPANSION",
            "Expansion rate",
            chain.expansion.map(i64::from),
        ),
    ];
    let selected: Vec<_> = match args.get(2) {
        None => fields.iter().collect(),
        Some(wanted) => {
            let one = fields
                .iter()
                .find(|(keyword, _, _)| is_keyword(wanted, keyword));
            vec![one.ok_or(err(error::BF_INFO_FIELD))?]
        }
    };
    // RedisBloom answers one field as a one-element array under RESP2.
    let bare = selected.len() == 1 && !ctx.get_flags().contains(ContextFlags::FLAGS_RESP3);
    if bare {
        raw::reply_with_array(ctx.ctx, 1);
    } else {
        raw::reply_with_map(ctx.ctx, selected.len() as c_long);
    }
    for (_, label, value) in selected {
        if !bare {
            let label = std::ffi::CString::new(*label).expect("static label");
            raw::reply_with_simple_string(ctx.ctx, label.as_ptr());
        }
        match value {
            Some(n) => raw::reply_with_long_long(ctx.ctx, *n),
            None => raw::reply_with_null(ctx.ctx),
        };
    }
    Ok(RedisValue::NoReply)
}

/// `BF.DEBUG key`: `size:<items>`, then one line per sub-filter (RedisBloom's format).
pub fn debug(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 2 {
        return Err(RedisError::WrongArity);
    }
    let key = Key::read(ctx, &args[1]);
    let chain = chain_in(&key)?.ok_or(err(error::BF_NOT_FOUND))?;
    Ok(RedisValue::Array(
        debug::lines(chain)
            .into_iter()
            .map(RedisValue::BulkString)
            .collect(),
    ))
}

/// `BF.SCANDUMP key iterator`
pub fn scandump(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let key = Key::read(ctx, &args[1]);
    let chain = chain_in(&key)?.ok_or(err(error::BF_NOT_FOUND))?;
    let iter = integer(&args[2]).ok_or(err(error::BF_SCANDUMP_ITERATOR))?;
    let (next, data) = match iter {
        0 => (1, header_of(chain)),
        i if i > 0 => match codec::chunk_at(chain, (i - 1) as u64) {
            Some(chunk) => (i + chunk.len() as i64, chunk),
            None => (0, Vec::new()),
        },
        _ => (0, Vec::new()),
    };
    raw::reply_with_array(ctx.ctx, 2);
    raw::reply_with_long_long(ctx.ctx, next);
    raw::reply_with_string_buffer(ctx.ctx, data.as_ptr().cast::<c_char>(), data.len());
    Ok(RedisValue::NoReply)
}

/// The `SCANDUMP` header: imported filters keep RedisBloom's format.
fn header_of(chain: &Chain) -> Vec<u8> {
    match chain.scheme {
        Scheme::Warden => codec::encode_header(chain),
        Scheme::RedisBloom { .. } => redisbloom::encode_header(chain),
    }
}

/// A chain from the first `LOADCHUNK`: warden's header, or RedisBloom's.
fn chain_from_header(data: &[u8], max_bytes: u64) -> Result<Chain, BadData> {
    match codec::decode_header(data, max_bytes) {
        Ok(header) => Ok(header.empty_chain()),
        Err(ours) => redisbloom::decode_header(data, max_bytes).map_err(|theirs| {
            if ours == BadData::TooLarge || theirs == BadData::TooLarge {
                BadData::TooLarge
            } else {
                BadData::Malformed
            }
        }),
    }
}

/// The empty chain a first `LOADCHUNK` describes, refused before anything
/// is allocated past `warden.bf-max-memory` or what `maxmemory` leaves.
fn header_within(data: &[u8], limit: Limit) -> Result<Chain, RedisError> {
    match chain_from_header(data, limit.filter.min(limit.room)) {
        Ok(chain) => Ok(chain),
        Err(BadData::Malformed) => Err(err(error::BF_BAD_DATA)),
        Err(BadData::TooLarge) if limit.room < limit.filter => {
            Err(RedisError::String(error::no_room_for_chunk(limit.room)))
        }
        Err(BadData::TooLarge) => Err(err(error::BF_TOO_LARGE)),
    }
}

/// `BF.LOADCHUNK key iterator data`
pub fn loadchunk(ctx: &Context, args: &[Arg]) -> RedisResult {
    if args.len() != 4 {
        return Err(RedisError::WrongArity);
    }
    let iter = integer(&args[2]).ok_or(err(error::BF_LOADCHUNK_ITERATOR))?;
    let data = &args[3][..];
    let key = Key::write(ctx, &args[1]);
    let bad = |b: BadData| match b {
        BadData::Malformed => err(error::BF_BAD_DATA),
        BadData::TooLarge => err(error::BF_TOO_LARGE),
    };
    match chain_in(&key)? {
        None if iter == 1 => {
            let limit = max_bytes(ctx);
            let chain = header_within(data, limit)?;
            store(&key, type_of(&chain), chain);
        }
        None => return Err(err(error::BF_NOT_FOUND)),
        Some(chain) => {
            let offset = (iter - 1)
                .checked_sub(data.len() as i64)
                .filter(|o| *o >= 0)
                .ok_or(err(error::BF_BAD_DATA))?;
            codec::load_chunk(chain, offset as u64, data).map_err(bad)?;
        }
    }
    ctx.replicate_verbatim();
    notify(ctx, c"bf.loadchunk", &args[1]);
    Ok(RedisValue::SimpleStringStatic("OK"))
}
