//! Bloom filters at production scale: memory that is reserved but not yet
//! written costs nothing, big filters are freed in the background, dumps come
//! in bounded chunks, `BF.DEBUG` answers like RedisBloom, and warden stands
//! aside when another module serves `BF.*`.

mod common;

use std::time::Duration;

use common::*;
use redis::{Connection, Value};

/// The server's resident memory now, in bytes (from /proc, not INFO's sample).
fn rss(c: &mut Connection) -> i64 {
    let pid = info_int(c, "everything", "process_id");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: i64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb * 1024
}

fn debug_lines(c: &mut Connection, key: &str) -> Vec<String> {
    redis::cmd("BF.DEBUG").arg(key).query(c).unwrap()
}

fn size_of(c: &mut Connection, key: &str) -> i64 {
    match run(c, &["BF.INFO", key, "SIZE"]).unwrap() {
        Value::Array(v) => redis::from_redis_value(&v[0]).unwrap(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn reserving_a_big_filter_keeps_resident_memory_far_below_its_size() {
    let s = Server::start(&["bf-max-memory", "1073741824"]);
    let mut c = s.conn();
    let before = rss(&mut c);
    run(&mut c, &["BF.RESERVE", "big", "0.01", "500000000"]).unwrap();
    let size = size_of(&mut c, "big");
    assert!(size > 600 << 20, "{size}");
    let grown = rss(&mut c) - before;
    assert!(
        grown < size / 20,
        "RSS grew by {grown} for a {size}-byte filter"
    );
    // Reading and adding touch only the pages they probe.
    assert_eq!(int(&mut c, &["BF.ADD", "big", "x"]), 1);
    assert_eq!(int(&mut c, &["BF.EXISTS", "big", "x"]), 1);
    assert!(rss(&mut c) - before < size / 20);
}

#[test]
fn unlink_frees_a_big_filter_in_the_background_and_a_small_one_at_once() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["BF.RESERVE", "small", "0.01", "1000"]).unwrap();
    run(&mut c, &["BF.RESERVE", "big", "0.01", "10000000"]).unwrap();
    let freed = info_int(&mut c, "everything", "lazyfreed_objects");
    assert_eq!(int(&mut c, &["UNLINK", "small"]), 1);
    assert_eq!(info_int(&mut c, "everything", "lazyfreed_objects"), freed);
    assert_eq!(int(&mut c, &["UNLINK", "big"]), 1);
    wait_for("the background free", Duration::from_secs(10), || {
        info_int(&mut c, "everything", "lazyfreed_objects") == freed + 1
    });
    wait_for("the filter count", Duration::from_secs(10), || {
        info_int(&mut c, "everything", "warden_bloom_filters") == 0
    });
    assert_eq!(info_int(&mut c, "everything", "warden_bloom_bytes"), 0);
}

#[test]
fn del_frees_in_the_background_when_lazyfree_user_del_is_on() {
    let s = Server::start(&["--lazyfree-lazy-user-del", "yes"]);
    let mut c = s.conn();
    run(&mut c, &["BF.RESERVE", "big", "0.01", "10000000"]).unwrap();
    let freed = info_int(&mut c, "everything", "lazyfreed_objects");
    assert_eq!(int(&mut c, &["DEL", "big"]), 1);
    wait_for("the background free", Duration::from_secs(10), || {
        info_int(&mut c, "everything", "lazyfreed_objects") == freed + 1
    });
}

fn loadchunk(c: &mut Connection, key: &str, iter: i64, data: &[u8]) {
    let ok: String = redis::cmd("BF.LOADCHUNK")
        .arg(key)
        .arg(iter)
        .arg(data)
        .query(c)
        .unwrap();
    assert_eq!(ok, "OK");
}

#[test]
fn scandump_chunks_are_at_most_4_mib_and_round_trip() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["BF.RESERVE", "bf", "0.001", "10000000"]).unwrap();
    for i in 0..100 {
        int(&mut c, &["BF.ADD", "bf", &format!("item-{i}")]);
    }
    let chunks = scandump(&mut c, "bf");
    assert!(chunks.len() > 4);
    assert!(chunks.iter().all(|(_, d)| d.len() <= 4 << 20));
    for (iter, data) in &chunks {
        loadchunk(&mut c, "copy", *iter, data);
    }
    assert_eq!(debug_lines(&mut c, "copy"), debug_lines(&mut c, "bf"));
    for i in 0..100 {
        assert_eq!(int(&mut c, &["BF.EXISTS", "copy", &format!("item-{i}")]), 1);
    }
}

/// Earlier versions dumped chunks of up to 16 MiB: such dumps still load.
#[test]
fn dumps_with_larger_chunks_still_load() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(
        &mut c,
        &["BF.RESERVE", "bf", "0.01", "20000000", "NONSCALING"],
    )
    .unwrap();
    int(&mut c, &["BF.ADD", "bf", "a"]);
    let chunks = scandump(&mut c, "bf");
    let (header, bits) = chunks.split_first().unwrap();
    loadchunk(&mut c, "old", header.0, &header.1);
    // One sub-filter: the bits may be sent in chunks of any size.
    for group in bits.chunks(4) {
        let data: Vec<u8> = group.iter().flat_map(|(_, d)| d.clone()).collect();
        assert!(data.len() > 4 << 20 || group.len() < 4);
        loadchunk(&mut c, "old", group.last().unwrap().0, &data);
    }
    assert_eq!(debug_lines(&mut c, "old"), debug_lines(&mut c, "bf"));
    assert_eq!(int(&mut c, &["BF.EXISTS", "old", "a"]), 1);
}

#[test]
fn a_barely_used_big_filter_saves_small_and_reloads_whole() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["BF.RESERVE", "bf", "0.01", "50000000"]).unwrap();
    for i in 0..50 {
        int(&mut c, &["BF.ADD", "bf", &format!("item-{i}")]);
    }
    let dump: Vec<u8> = redis::cmd("DUMP").arg("bf").query(&mut c).unwrap();
    assert!(dump.len() < 8 << 20, "{} bytes", dump.len());
    let before = debug_lines(&mut c, "bf");
    run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    assert_eq!(debug_lines(&mut c, "bf"), before);
    redis::cmd("RESTORE")
        .arg("copy")
        .arg(0)
        .arg(&dump)
        .query::<()>(&mut c)
        .unwrap();
    assert_eq!(debug_lines(&mut c, "copy"), before);
    for i in 0..50 {
        assert_eq!(int(&mut c, &["BF.EXISTS", "copy", &format!("item-{i}")]), 1);
    }
}

#[test]
fn debug_describes_each_sub_filter() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(
        &mut c,
        &[
            "BF.INSERT",
            "bf",
            "ERROR",
            "0.001",
            "CAPACITY",
            "50000",
            "EXPANSION",
            "2",
            "ITEMS",
            "foo",
        ],
    )
    .unwrap();
    assert_eq!(
        debug_lines(&mut c, "bf"),
        [
            "size:1",
            "bytes:98880 bits:791040 hashes:11 hashwidth:64 capacity:50000 size:1 ratio:0.0005"
        ]
    );
    assert_eq!(err(&mut c, &["BF.DEBUG", "missing"]), "ERR not found");
    run(&mut c, &["SET", "s", "x"]).unwrap();
    assert_eq!(
        err(&mut c, &["BF.DEBUG", "s"]),
        "WRONGTYPE Operation against a key holding the wrong kind of value"
    );
    assert!(err(&mut c, &["BF.DEBUG"]).contains("wrong number of arguments"));
    assert!(err(&mut c, &["BF.DEBUG", "bf", "x"]).contains("wrong number of arguments"));
}

/// The reserves compared with RedisBloom: error, capacity, options.
const RESERVES: &[&[&str]] = &[
    &["0.01", "100"],
    &["0.001", "50000", "EXPANSION", "2"],
    &["0.0001", "1000", "NONSCALING"],
    &["0.3", "7", "EXPANSION", "3"],
    &["0.05", "123457", "EXPANSION", "4"],
    &["0.000001", "1000000"],
    &["0.5", "1", "NONSCALING"],
    &["0.02", "10000000"],
];

/// A line without its item count (which depends on the hash function once
/// false positives happen).
fn shape(line: &str) -> String {
    line.split(' ')
        .filter(|w| !w.starts_with("size:"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn debug_lines_equal_redisbloom_for_the_same_filters() {
    let warden = Server::start(&[]);
    // warden without BF.*, and RedisBloom loaded after it.
    let rb = redisbloom().display().to_string();
    let bloom = Server::start(&["bf-commands", "no", "--loadmodule", &rb]);
    let (mut w, mut b) = (warden.conn(), bloom.conn());
    let t: String = redis::cmd("TYPE").arg("x").query(&mut b).unwrap();
    assert_eq!(t, "none");
    for (i, reserve) in RESERVES.iter().enumerate() {
        let key = format!("bf{i}");
        let mut words = vec!["BF.RESERVE", &key];
        words.extend_from_slice(reserve);
        run(&mut w, &words).unwrap();
        run(&mut b, &words).unwrap();
        assert_eq!(
            debug_lines(&mut w, &key),
            debug_lines(&mut b, &key),
            "{reserve:?}"
        );
        assert_eq!(int(&mut w, &["BF.ADD", &key, "one"]), 1);
        assert_eq!(int(&mut b, &["BF.ADD", &key, "one"]), 1);
        assert_eq!(
            debug_lines(&mut w, &key),
            debug_lines(&mut b, &key),
            "{reserve:?}"
        );
    }
    // Scaling: the same chain of sub-filters.
    for c in [&mut w, &mut b] {
        for i in 0..300 {
            run(c, &["BF.ADD", "scaled", &format!("item-{i}")]).unwrap();
        }
    }
    let (lw, lb) = (debug_lines(&mut w, "scaled"), debug_lines(&mut b, "scaled"));
    assert_eq!(lw.len(), lb.len());
    for (x, y) in lw.iter().zip(&lb).skip(1) {
        assert_eq!(shape(x), shape(y));
    }
    let t: String = redis::cmd("TYPE").arg("scaled").query(&mut b).unwrap();
    assert_eq!(t, "MBbloom--");
}

#[test]
fn with_redisbloom_loaded_first_warden_serves_locks_and_leaves_bf_to_it() {
    let mut s = Plain::start(&[module(redisbloom(), &[]), module(module_path(), &[])]);
    let mut c = s.conn();
    assert!(int(&mut c, &["LOCK.ACQUIRE", "l", "me", "10000"]) > 0);
    assert_eq!(int(&mut c, &["BF.ADD", "bf", "x"]), 1);
    let t: String = redis::cmd("TYPE").arg("bf").query(&mut c).unwrap();
    assert_eq!(t, "MBbloom--");
    assert!(s
        .log()
        .contains("BF.* commands not registered: another module"));
    // BF.DEBUG is RedisBloom's too, and the docs of BF.* are not warden's.
    assert_eq!(debug_lines(&mut c, "bf").len(), 2);
    let docs = format!(
        "{:?}",
        run(&mut c, &["COMMAND", "DOCS", "bf.reserve"]).unwrap()
    );
    assert!(!docs.contains("Creates an empty Bloom filter"), "{docs}");
}

#[test]
fn bf_commands_no_registers_only_the_lock_commands() {
    let s = Server::start(&["bf-commands", "no", "bf-max-memory", "4096"]);
    let mut c = s.conn();
    assert!(int(&mut c, &["LOCK.ACQUIRE", "l", "me", "10000"]) > 0);
    assert!(err(&mut c, &["BF.ADD", "bf", "x"]).contains("unknown command"));
    // The other module arguments still apply.
    let max: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("warden.bf-max-memory")
        .query(&mut c)
        .unwrap();
    assert_eq!(max[1], "4096");
    assert!(s.log().contains("module argument bf-commands no"));
}

#[test]
fn a_bad_bf_commands_value_refuses_the_load_and_says_why() {
    for args in [&["bf-commands", "maybe"][..], &["bf-commands"]] {
        let mut s = Plain::start(&[module(module_path(), args)]);
        assert!(s.exited(), "the server started with {args:?}");
        let log = s.log();
        assert!(log.contains("bf-commands"), "{log}");
        assert!(log.contains("yes") && log.contains("no"), "{log}");
    }
    let mut s = Plain::start(&[module(module_path(), &["bf-commands", "maybe"])]);
    assert!(s.exited());
    assert!(s.log().contains("'maybe'"));
}

/// An RDB length.
fn rdb_len(out: &mut Vec<u8>, n: usize) {
    match n {
        0..=63 => out.push(n as u8),
        64..=16383 => out.extend_from_slice(&(0x4000 | n as u16).to_be_bytes()),
        _ => {
            out.push(0x80);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }
}

/// A module string value: the string opcode, then the raw string.
fn rdb_module_string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(5);
    rdb_len(out, s.len());
    out.extend_from_slice(s);
}

/// Filters saved in the first encoding (the header, then each sub-filter's
/// bits as one string) still load.
#[test]
fn filters_saved_in_the_first_rdb_encoding_still_load() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for i in 0..500 {
        int(&mut c, &["BF.ADD", "bf", &format!("item-{i}")]);
    }
    let lines = debug_lines(&mut c, "bf");
    assert!(lines.len() > 3, "{lines:?}");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("bf").query(&mut c).unwrap();
    let (body, crc) = dump.split_at(dump.len() - 8);
    assert_eq!(crc64(body).to_le_bytes(), crc, "the CRC of a real payload");
    // Type 7 (module, second form), then the 64-bit module id: its low 10
    // bits are the encoding version.
    assert_eq!(&dump[..2], &[7, 0x81]);
    let id = u64::from_be_bytes(dump[2..10].try_into().unwrap());
    let rdb_version = &body[body.len() - 2..];
    let mut old = vec![7, 0x81];
    old.extend_from_slice(&((id & !0x3ff) | 1).to_be_bytes());
    let chunks = scandump(&mut c, "bf");
    let (header, bits) = chunks.split_first().unwrap();
    rdb_module_string(&mut old, &header.1);
    // Small sub-filters: one chunk each.
    assert_eq!(bits.len(), lines.len() - 1);
    for (_, data) in bits {
        rdb_module_string(&mut old, data);
    }
    old.push(0);
    old.extend_from_slice(rdb_version);
    let crc = crc64(&old);
    old.extend_from_slice(&crc.to_le_bytes());
    redis::cmd("RESTORE")
        .arg("old")
        .arg(0)
        .arg(&old)
        .query::<()>(&mut c)
        .unwrap();
    assert_eq!(debug_lines(&mut c, "old"), lines);
    for i in 0..500 {
        assert_eq!(int(&mut c, &["BF.EXISTS", "old", &format!("item-{i}")]), 1);
    }
}
