//! Moving from RedisBloom: its RDB files, `DUMP` payloads and `SCANDUMP`
//! chunks load into warden, and every filter answers exactly as RedisBloom
//! did — false positives included — before and after more items are added.
//! Runs the real RedisBloom (`REDISBLOOM_MODULE`, fetched by `make test`).

mod common;

use common::*;
use redis::{Connection, Value};

/// A server where RedisBloom serves `BF.*` (warden is loaded beside it,
/// standing aside, and must not claim RedisBloom's type).
fn redisbloom_server() -> Server {
    let rb = redisbloom().display().to_string();
    Server::start(&["bf-commands", "no", "--loadmodule", &rb])
}

/// A filter built in RedisBloom: its key and the items added.
struct Built {
    key: &'static str,
    items: usize,
}

const SMALL: [(&str, &[&str], usize); 3] = [
    ("scaling", &["0.01", "100"], 1000),
    ("nonscaling", &["0.001", "1000", "NONSCALING"], 400),
    ("expansion1", &["0.05", "50", "EXPANSION", "1"], 400),
];

fn item(i: usize) -> String {
    format!("item-{i}")
}

fn absent(i: usize) -> String {
    format!("absent-{i}")
}

/// Sends `words` commands in one pipeline per thousand, returning every reply.
fn pipelined(c: &mut Connection, commands: Vec<Vec<String>>) -> Vec<Value> {
    let mut out = Vec::with_capacity(commands.len());
    for batch in commands.chunks(1000) {
        let mut pipe = redis::pipe();
        for words in batch {
            let mut cmd = redis::cmd(&words[0]);
            for w in &words[1..] {
                cmd.arg(w);
            }
            pipe.add_command(cmd);
        }
        out.extend(pipe.query::<Vec<Value>>(c).unwrap());
    }
    out
}

fn add_items(c: &mut Connection, key: &str, range: std::ops::Range<usize>) -> Vec<Value> {
    let items: Vec<String> = range.map(item).collect();
    let commands = items
        .chunks(100)
        .map(|chunk| {
            let mut w = vec!["BF.MADD".to_string(), key.to_string()];
            w.extend(chunk.iter().cloned());
            w
        })
        .collect();
    pipelined(c, commands)
}

/// Builds the small filters (and, with `big`, a 1M-capacity filter holding
/// 100k items) in RedisBloom.
fn build(c: &mut Connection, big: bool) -> Vec<Built> {
    let mut built = Vec::new();
    for (key, args, items) in SMALL {
        let mut words = vec!["BF.RESERVE", key];
        words.extend_from_slice(args);
        run(c, &words).unwrap();
        add_items(c, key, 0..items);
        built.push(Built { key, items });
    }
    if big {
        run(c, &["BF.RESERVE", "big", "0.001", "1000000"]).unwrap();
        add_items(c, "big", 0..100_000);
        built.push(Built {
            key: "big",
            items: 100_000,
        });
    }
    built
}

/// A filter's answers: every added item, then 20,000 absent ones.
fn answers(c: &mut Connection, f: &Built) -> Vec<Value> {
    let probes: Vec<String> = (0..f.items)
        .map(item)
        .chain((0..20_000).map(absent))
        .collect();
    let commands = probes
        .chunks(500)
        .map(|chunk| {
            let mut w = vec!["BF.MEXISTS".to_string(), f.key.to_string()];
            w.extend(chunk.iter().cloned());
            w
        })
        .collect();
    pipelined(c, commands)
}

/// `BF.INFO` without `Size` (memory is counted differently).
fn info(c: &mut Connection, key: &str) -> Vec<(String, Value)> {
    let mut fields = map(c, &["BF.INFO", key]);
    fields.retain(|(name, _)| name != "Size");
    fields
}

/// What RedisBloom answers for each filter, to compare warden's with.
struct Expected {
    answers: Vec<Vec<Value>>,
    infos: Vec<Vec<(String, Value)>>,
}

fn expected(c: &mut Connection, built: &[Built]) -> Expected {
    Expected {
        answers: built.iter().map(|f| answers(c, f)).collect(),
        infos: built.iter().map(|f| info(c, f.key)).collect(),
    }
}

fn assert_same(c: &mut Connection, built: &[Built], want: &Expected) {
    for (i, f) in built.iter().enumerate() {
        let got = answers(c, f);
        assert!(got == want.answers[i], "{}: answers differ", f.key);
        assert_eq!(info(c, f.key), want.infos[i], "{}", f.key);
    }
}

/// More items added on both sides get the same replies, and the filters
/// stay identical (scaling included).
fn assert_adds_alike(warden: &mut Connection, rb: &mut Connection, built: &[Built]) {
    for f in built {
        let more = f.items..f.items + 500;
        assert_eq!(
            add_items(warden, f.key, more.clone()),
            add_items(rb, f.key, more),
            "{}",
            f.key
        );
        assert_eq!(info(warden, f.key), info(rb, f.key), "{}", f.key);
        let (w, r) = (answers(warden, f), answers(rb, f));
        assert!(w == r, "{}: answers differ after adding", f.key);
    }
}

/// A warden server (without RedisBloom) started on `rdb`.
fn warden_on(rdb: &std::path::Path) -> Server {
    let mut s = Server::start(&[]);
    s.stop(true);
    std::fs::copy(rdb, s.dir.path().join("dump.rdb")).unwrap();
    s.restart(true);
    s
}

#[test]
fn an_rdb_written_by_redisbloom_loads_and_answers_identically() {
    let rb = redisbloom_server();
    let mut r = rb.conn();
    let built = build(&mut r, true);
    let want = expected(&mut r, &built);
    run(&mut r, &["SAVE"]).unwrap();

    let w = warden_on(&rb.dir.path().join("dump.rdb"));
    let mut c = w.conn();
    assert_same(&mut c, &built, &want);
    let t: String = redis::cmd("TYPE").arg("big").query(&mut c).unwrap();
    assert_eq!(t, "MBbloom--");
    run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    assert_same(&mut c, &built, &want);
    assert_adds_alike(&mut c, &mut r, &built);
    // Saved again by warden (in RedisBloom's encoding), reloaded: unchanged.
    let want = expected(&mut r, &built);
    run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    assert_same(&mut c, &built, &want);
}

#[test]
fn dump_payloads_restore_both_ways_with_identical_answers() {
    let rb = redisbloom_server();
    let mut r = rb.conn();
    let built = build(&mut r, false);
    let want = expected(&mut r, &built);
    let w = Server::start(&[]);
    let mut c = w.conn();
    for f in &built {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(f.key).query(&mut r).unwrap();
        redis::cmd("RESTORE")
            .arg(f.key)
            .arg(0)
            .arg(&dump)
            .query::<()>(&mut c)
            .unwrap();
    }
    assert_same(&mut c, &built, &want);
    assert_adds_alike(&mut c, &mut r, &built);
    // And back: warden's DUMP of an imported filter restores into RedisBloom.
    for f in &built {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(f.key).query(&mut c).unwrap();
        redis::cmd("RESTORE")
            .arg(f.key)
            .arg(0)
            .arg(&dump)
            .arg("REPLACE")
            .query::<()>(&mut r)
            .unwrap();
        assert_eq!(info(&mut r, f.key), info(&mut c, f.key));
        assert!(answers(&mut r, f) == answers(&mut c, f), "{}", f.key);
    }
}

fn loadchunk(c: &mut Connection, key: &str, iter: i64, data: &[u8]) -> redis::RedisResult<()> {
    redis::cmd("BF.LOADCHUNK")
        .arg(key)
        .arg(iter)
        .arg(data)
        .query(c)
}

#[test]
fn scandump_chunks_load_with_identical_answers() {
    let rb = redisbloom_server();
    let mut r = rb.conn();
    let built = build(&mut r, false);
    let want = expected(&mut r, &built);
    let mut w = Server::start(&["--appendonly", "yes"]);
    let mut c = w.conn();
    for f in &built {
        for (iter, data) in scandump(&mut r, f.key) {
            loadchunk(&mut c, f.key, iter, &data).unwrap();
        }
    }
    assert_same(&mut c, &built, &want);
    // The AOF rewrites imported filters as RedisBloom-format chunks.
    rewrite_aof(&mut c);
    drop(c);
    w.restart(true);
    let mut c = w.conn();
    assert_same(&mut c, &built, &want);
    let t: String = redis::cmd("TYPE").arg("scaling").query(&mut c).unwrap();
    assert_eq!(t, "MBbloom--");
    // warden dumps imported filters in RedisBloom's format: they load back.
    for f in &built {
        run(&mut r, &["DEL", f.key]).unwrap();
        for (iter, data) in scandump(&mut c, f.key) {
            loadchunk(&mut r, f.key, iter, &data).unwrap();
        }
    }
    assert_same(&mut r, &built, &want);
    assert_adds_alike(&mut c, &mut r, &built);
}

/// Filters with RedisBloom's older options — 32-bit MurmurHash2 without
/// `FORCE64`, power-of-two links without `NOROUND` — still load into
/// RedisBloom, and answer and grow the same in warden.
#[test]
fn filters_with_older_options_answer_and_grow_identically() {
    let rb = redisbloom_server();
    let mut r = rb.conn();
    run(&mut r, &["BF.RESERVE", "f", "0.01", "300"]).unwrap();
    let dump: Vec<u8> = redis::cmd("DUMP").arg("f").query(&mut r).unwrap();
    let body = &dump[..dump.len() - 10];
    // items 0, links 1, options NOROUND|FORCE64 (5), growth 2 as RDB unsigneds.
    let fields = [2, 0, 2, 1, 2, 5, 2, 2];
    let at = body.windows(8).position(|w| w == fields).unwrap();
    let w = Server::start(&[]);
    let mut c = w.conn();
    for options in [0u8, 1, 4] {
        let mut patched = body.to_vec();
        patched[at + 5] = options;
        let payload = resign(&dump, patched);
        let key = format!("f{options}");
        for conn in [&mut r, &mut c] {
            redis::cmd("RESTORE")
                .arg(&key)
                .arg(0)
                .arg(&payload)
                .query::<()>(conn)
                .unwrap();
        }
        let key: &'static str = Box::leak(key.into_boxed_str());
        let f = Built { key, items: 3000 };
        assert_eq!(
            add_items(&mut c, key, 0..3000),
            add_items(&mut r, key, 0..3000)
        );
        assert!(answers(&mut c, &f) == answers(&mut r, &f), "{key}");
        assert_eq!(info(&mut c, key), info(&mut r, key));
        let debug = |c: &mut Connection| -> Vec<String> {
            redis::cmd("BF.DEBUG").arg(key).query(c).unwrap()
        };
        assert_eq!(debug(&mut c), debug(&mut r), "{key}");
    }
}

#[test]
fn corrupted_redisbloom_payloads_are_refused() {
    let rb = redisbloom_server();
    let mut r = rb.conn();
    run(&mut r, &["BF.RESERVE", "f", "0.01", "100"]).unwrap();
    add_items(&mut r, "f", 0..300);
    let dump: Vec<u8> = redis::cmd("DUMP").arg("f").query(&mut r).unwrap();
    let chunks = scandump(&mut r, "f");
    let w = Server::start(&["bf-max-memory", "1048576"]);
    let mut c = w.conn();

    // Every truncation and every byte flip of the body, re-signed so that it
    // reaches the module: refused, or a filter that is whole.
    let body = &dump[..dump.len() - 10];
    for cut in 10..body.len() {
        try_restore(&mut c, &resign(&dump, body[..cut].to_vec()));
    }
    assert_eq!(
        int(&mut c, &["EXISTS", "t"]),
        0,
        "a truncated payload loaded"
    );
    for i in 10..body.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut bad = body.to_vec();
            bad[i] ^= flip;
            try_restore(&mut c, &resign(&dump, bad));
            if int(&mut c, &["EXISTS", "t"]) == 1 {
                // Whatever loaded must still be a working filter.
                run(&mut c, &["BF.ADD", "t", "probe"]).unwrap_or(Value::Nil);
                int(&mut c, &["BF.EXISTS", "t", "probe"]);
                run(&mut c, &["DEL", "t"]).unwrap();
            }
        }
    }
    restore_every_truncation(&mut c, &dump);

    // A SCANDUMP header: truncated, extended, or announcing a huge link.
    let header = &chunks[0].1;
    for cut in 0..header.len() {
        assert!(loadchunk(&mut c, "h", 1, &header[..cut]).is_err());
    }
    let mut longer = header.clone();
    longer.push(0);
    assert!(loadchunk(&mut c, "h", 1, &longer).is_err());
    let mut huge = header.clone();
    // The first link's bytes and bits (at 20 and 28): 1 GiB.
    huge[20..28].copy_from_slice(&(1u64 << 30).to_le_bytes());
    huge[28..36].copy_from_slice(&(1u64 << 33).to_le_bytes());
    let e = loadchunk(&mut c, "h", 1, &huge).unwrap_err();
    assert_eq!(
        error_text(&e),
        "ERR filter would exceed warden.bf-max-memory"
    );
    let mut zero_growth = header.clone();
    zero_growth[16..20].copy_from_slice(&0u32.to_le_bytes());
    assert!(loadchunk(&mut c, "h", 1, &zero_growth).is_err());
    assert_eq!(int(&mut c, &["EXISTS", "h"]), 0);
    // The real header loads; a chunk past its link is refused.
    loadchunk(&mut c, "h", 1, header).unwrap();
    let (iter, data) = &chunks[1];
    let e = loadchunk(&mut c, "h", iter + 100_000, data).unwrap_err();
    assert_eq!(error_text(&e), "ERR received bad data");
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
}

/// When warden does not serve `BF.*`, RedisBloom's type stays RedisBloom's:
/// filters it saves load back into it.
#[test]
fn without_bf_commands_warden_leaves_redisbloom_its_type() {
    let rb = redisbloom().display().to_string();
    let mut s = Server::start(&["bf-commands", "no", "--loadmodule", &rb]);
    let mut c = s.conn();
    let built = build(&mut c, false);
    let want = expected(&mut c, &built);
    run(&mut c, &["SAVE"]).unwrap();
    drop(c);
    s.restart(true);
    let mut c = s.conn();
    assert_same(&mut c, &built, &want);
    assert!(s.log().contains("Created new data type 'warden-bf'"));
    assert!(!s.log().contains("Created new data type 'MBbloom--'"));
}

/// Adds `items` one `BF.ADD` at a time, up to and including the first error.
fn add_one_by_one(c: &mut Connection, key: &str, items: std::ops::Range<usize>) -> Vec<String> {
    let mut replies = Vec::new();
    for i in items {
        let reply = match run(c, &["BF.ADD", key, &item(i)]) {
            Ok(v) => format!("{v:?}"),
            Err(e) => error_text(&e),
        };
        let stop = reply.starts_with("ERR");
        replies.push(reply);
        if stop {
            break;
        }
    }
    replies
}

/// An imported filter grows exactly as RedisBloom grows it: past 54 links
/// (where warden's own filters stop at 2^-64), with the `ENTS_IS_BITS`
/// option (link sizes given as a power of two), and it answers RedisBloom's
/// own error where RedisBloom's growth fails.
#[test]
fn imported_filters_scale_as_redisbloom_does() {
    let rb = redisbloom_server();
    let mut r = rb.conn();
    let w = Server::start(&[]);
    let mut c = w.conn();
    // (reserve, options to patch in or None, items added one by one)
    // Option bits: 1 NOROUND, 2 ENTS_IS_BITS, 4 FORCE64. With ENTS_IS_BITS a
    // new link of n "entries" has 2^n bits, and n above 64 (or 0) fails.
    let cases: [(&[&str], Option<u8>, usize); 6] = [
        (&["0.01", "1", "EXPANSION", "1"], None, 90),
        (&["0.01", "3"], Some(2 | 1 | 4), 200),
        (&["0.01", "3"], Some(2 | 4), 200),
        (&["0.01", "2", "EXPANSION", "1"], Some(2 | 1 | 4), 50),
        (&["0.1", "2", "EXPANSION", "3"], Some(2), 200),
        (&["0.1", "2", "EXPANSION", "3"], Some(2 | 1), 200),
    ];
    for (n, (reserve, options, adds)) in cases.into_iter().enumerate() {
        let key = format!("f{n}");
        let mut words = vec!["BF.RESERVE", key.as_str()];
        words.extend_from_slice(reserve);
        run(&mut r, &words).unwrap();
        let dump: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut r).unwrap();
        let payload = match options {
            None => dump,
            Some(options) => {
                let body = &dump[..dump.len() - 10];
                // items 0, links 1, options 5 as RDB unsigneds.
                let at = body
                    .windows(6)
                    .position(|w| w == [2, 0, 2, 1, 2, 5])
                    .unwrap();
                let mut patched = body.to_vec();
                patched[at + 5] = options;
                resign(&dump, patched)
            }
        };
        for conn in [&mut r, &mut c] {
            redis::cmd("RESTORE")
                .arg(&key)
                .arg(0)
                .arg(&payload)
                .arg("REPLACE")
                .query::<()>(conn)
                .unwrap();
        }
        let theirs = add_one_by_one(&mut r, &key, 0..adds);
        let ours = add_one_by_one(&mut c, &key, 0..adds);
        assert_eq!(ours, theirs, "{key} {reserve:?} {options:?}");
        if theirs.last().is_some_and(|l| l.starts_with("ERR")) {
            // RedisBloom's chain is broken past this point: compare no further.
            continue;
        }
        let debug = |c: &mut Connection| -> Vec<String> {
            redis::cmd("BF.DEBUG").arg(&key).query(c).unwrap()
        };
        assert_eq!(debug(&mut c), debug(&mut r), "{key}");
        if options.is_none() {
            assert!(debug(&mut c).len() > 60, "{key} grew past 54 links");
        }
    }
}
