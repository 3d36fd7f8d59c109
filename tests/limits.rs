//! Bad data and hard limits: a lock lease is never "never" (not after
//! `PERSIST`, not from an older AOF), a filter never takes the server past
//! `maxmemory`, an RDB goes back to a server without warden, and a load order
//! that cannot work says so in the log.

mod common;

use std::time::{Duration, Instant};

use common::*;
use redis::{Connection, Value};

fn server_ms(c: &mut Connection) -> i64 {
    let t: Vec<String> = redis::cmd("TIME").query(c).unwrap();
    t[0].parse::<i64>().unwrap() * 1000 + t[1].parse::<i64>().unwrap() / 1000
}

/// Fills memory until `key` is evicted.
fn evict(c: &mut Connection, key: &str) {
    let filler = "x".repeat(1000);
    let mut i = 0;
    while int(c, &["EXISTS", key]) == 1 {
        let _ = run(c, &["SET", &format!("fill{i}"), &filler]);
        i += 1;
        assert!(i < 100_000, "{key} was never evicted");
    }
}

/// An AOF (without RDB preamble) as earlier versions rewrote a lock: its
/// effect with deadline 0, then the key's `PEXPIREAT`.
fn write_old_aof(dir: &std::path::Path, fence: i64, expire_at: i64) {
    let aof = dir.join("appendonlydir");
    std::fs::create_dir_all(&aof).unwrap();
    let words = |w: &[&str]| -> String {
        let mut out = format!("*{}\r\n", w.len());
        for x in w {
            out += &format!("${}\r\n{x}\r\n", x.len());
        }
        out
    };
    let (fence, at) = (fence.to_string(), expire_at.to_string());
    let body = words(&["SELECT", "0"])
        + &words(&["WARDEN.LOCKSET", "lock", "old", "1", &fence, "0"])
        + &words(&["PEXPIREAT", "lock", &at]);
    std::fs::write(aof.join("appendonly.aof.1.base.aof"), body).unwrap();
    std::fs::write(
        aof.join("appendonly.aof.manifest"),
        "file appendonly.aof.1.base.aof seq 1 type b\n",
    )
    .unwrap();
}

/// Each way a lock's in-memory lease could read "never": the evicted lock
/// keeps its key until its real lease ends, then the waiter is granted.
#[test]
fn an_evicted_lock_frees_its_key_when_its_lease_ends() {
    const LEASE: i64 = 1500;
    let cases = ["persist", "old aof"];
    for case in cases {
        let evicting = ["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-random"];
        let mut s = Server::start(&evicting);
        let mut c = s.conn();
        let start = server_ms(&mut c);
        match case {
            "persist" => {
                int(&mut c, &["LOCK.ACQUIRE", "lock", "old", &LEASE.to_string()]);
                assert_eq!(int(&mut c, &["PERSIST", "lock"]), 1);
            }
            _ => {
                let mut args = evicting.to_vec();
                args.extend(["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
                s = Server::start(&args);
                s.stop(true);
                write_old_aof(s.dir.path(), start << 10, start + LEASE);
                s.restart(true);
                c = s.conn();
                assert_eq!(lock_state(&mut c, "lock").unwrap().0, "old", "{case}");
            }
        }
        evict(&mut c, "lock");
        run(&mut c, &["CONFIG", "SET", "maxmemory", "0"]).unwrap();
        let (_, pending) = spawn_command(
            &s,
            &["LOCK.ACQUIRE", "lock", "thief", "1000", "WAIT", "10000"],
        );
        let fence = granted(pending);
        assert!(fence > 0, "{case}: the evicted lock never freed its key");
        let log = s.log();
        assert!(!log.contains("-1 ms"), "{case}: {log}");
    }
}

/// A lock whose key lost its expiry keeps the lease it was granted.
#[test]
fn a_persisted_lock_still_ends_with_its_lease() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    int(&mut c, &["LOCK.ACQUIRE", "lock", "old", "300"]);
    assert_eq!(int(&mut c, &["PERSIST", "lock"]), 1);
    let started = Instant::now();
    let (_, pending) = spawn_command(
        &s,
        &["LOCK.ACQUIRE", "lock", "new", "1000", "WAIT", "10000"],
    );
    assert!(granted(pending) > 0);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(int(&mut c, &["PTTL", "lock"]) > 0);
}

/// A filter that does not fit in what `maxmemory` leaves is refused before
/// anything is allocated, whatever the policy: nothing is evicted for it.
#[test]
fn filters_past_maxmemory_are_refused_up_front() {
    for policy in ["noeviction", "allkeys-lru"] {
        let s = Server::start(&["--maxmemory", "100mb", "--maxmemory-policy", policy]);
        let mut c = s.conn();
        run(
            &mut c,
            &["CONFIG", "SET", "warden.bf-max-memory", "1073741824"],
        )
        .unwrap();
        for i in 0..50 {
            int(
                &mut c,
                &["LOCK.ACQUIRE", &format!("lock{i}"), "me", "600000"],
            );
        }
        for i in 0..200 {
            run(&mut c, &["SET", &format!("value{i}"), &"v".repeat(100)]).unwrap();
        }
        let before = used_memory(&mut c);
        let attempts: [&[&str]; 3] = [
            &["BF.RESERVE", "big", "0.01", "100000000"],
            &["BF.INSERT", "big", "CAPACITY", "100000000", "ITEMS", "x"],
            &["BF.RESERVE", "big", "0.0001", "50000000", "NONSCALING"],
        ];
        for words in attempts {
            let e = err(&mut c, words);
            assert!(
                e.starts_with("ERR filter needs "),
                "{policy} {words:?}: {e}"
            );
            assert!(e.contains("maxmemory leaves"), "{e}");
        }
        let after = used_memory(&mut c);
        assert!(
            (after - before).abs() < 1 << 20,
            "{policy}: {before} -> {after}"
        );
        assert_eq!(int(&mut c, &["EXISTS", "big"]), 0);
        for i in 0..50 {
            assert_eq!(int(&mut c, &["EXISTS", &format!("lock{i}")]), 1, "{policy}");
        }
        for i in 0..200 {
            assert_eq!(
                int(&mut c, &["EXISTS", &format!("value{i}")]),
                1,
                "{policy}"
            );
        }
        // A scale-out too: a filter that fits, then grows past the room.
        run(
            &mut c,
            &["BF.RESERVE", "grows", "0.01", "1000000", "EXPANSION", "200"],
        )
        .unwrap();
        let items: Vec<String> = (0..1_050_000).map(|i| i.to_string()).collect();
        let mut refused = None;
        for chunk in items.chunks(10_000) {
            let mut words = vec!["BF.MADD", "grows"];
            words.extend(chunk.iter().map(String::as_str));
            let replies: redis::RedisResult<Vec<Value>> =
                redis::cmd(words[0]).arg(&words[1..]).query(&mut c);
            if let Err(e) = replies {
                refused = Some(error_text(&e));
                break;
            }
        }
        let refused = refused.expect("the scale-out was accepted");
        assert!(refused.contains("maxmemory leaves"), "{refused}");
        assert_eq!(int(&mut c, &["EXISTS", "lock0"]), 1);
    }
}

/// An RDB saved by warden that holds nothing of warden's — an emptied one,
/// or only RedisBloom's filters — loads on a server without warden.
#[test]
fn an_rdb_without_warden_data_loads_without_warden() {
    let rb = vec![redisbloom().display().to_string()];
    let s = Server::start(&[]);
    let mut c = s.conn();
    let rdb = s.dir.path().join("dump.rdb");
    int(&mut c, &["LOCK.ACQUIRE", "lock", "o", "60000"]);
    int(&mut c, &["LOCK.RELEASE", "lock", "o"]);
    run(&mut c, &["BF.ADD", "ours", "x"]).unwrap();
    run(&mut c, &["FLUSHALL"]).unwrap();
    run(&mut c, &["SAVE"]).unwrap();
    for modules in [vec![], vec![rb.clone()]] {
        let mut plain = Plain::start_on(&rdb, &modules);
        assert!(plain.runs(), "emptied, {modules:?}: {}", plain.log());
        assert_eq!(int(&mut plain.conn(), &["DBSIZE"]), 0);
    }

    // Only RedisBloom filters (imported, saved in its own type).
    let mut with_rb = Plain::start(std::slice::from_ref(&rb));
    let mut r = with_rb.conn();
    run(&mut r, &["BF.ADD", "theirs", "x"]).unwrap();
    let dump: Vec<u8> = redis::cmd("DUMP").arg("theirs").query(&mut r).unwrap();
    redis::cmd("RESTORE")
        .arg("theirs")
        .arg(0)
        .arg(&dump)
        .query::<()>(&mut c)
        .unwrap();
    int(&mut c, &["LOCK.ACQUIRE", "lock", "o", "60000"]);
    int(&mut c, &["LOCK.RELEASE", "lock", "o"]);
    run(&mut c, &["SAVE"]).unwrap();
    let mut back = Plain::start_on(&rdb, &[rb]);
    assert!(back.runs(), "{}", back.log());
    assert_eq!(int(&mut back.conn(), &["BF.EXISTS", "theirs", "x"]), 1);
}

/// warden first, RedisBloom second: RedisBloom's load fails and the server
/// exits; warden's log line says why and what to do.
#[test]
fn loading_redisbloom_after_warden_says_what_to_do() {
    let rb = redisbloom();
    let mut s = Plain::start(&[
        vec![module_path().display().to_string()],
        vec![rb.display().to_string()],
    ]);
    assert!(!s.runs(), "RedisBloom loaded after warden");
    let log = s.log();
    assert!(log.contains("Load RedisBloom before warden"), "{log}");
    assert!(log.contains("bf-commands no"), "{log}");
}

/// Where no Bloom module loads after warden, its start and its shutdown
/// say nothing about the load order.
#[test]
fn a_start_without_redisbloom_says_nothing_about_it() {
    let mut s = Server::start(&[]);
    let mut c = s.conn();
    int(&mut c, &["BF.ADD", "bf", "x"]);
    s.stop(true);
    let log = s.log();
    assert!(!log.contains("RedisBloom"), "{log}");
}
