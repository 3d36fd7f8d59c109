//! `CACHE.PEEK`, the read a near cache is built on: its reply for each state
//! of a key, and `CLIENT TRACKING` on it — every change of what it answers
//! sends the tracking client an invalidation, and reads that change nothing
//! send none. On every server CI runs (Redis 7.0, 8.2, Valkey 9.1).

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::wire::{Reply, Wire};
use common::*;
use redis::Connection;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn peek(w: &mut Wire, key: &str) -> Reply {
    w.call(&["CACHE.PEEK", key]).unwrap()
}

fn lease(c: &mut Connection, key: &str) -> i64 {
    let v: Vec<redis::Value> = redis::cmd("CACHE.GET").arg(key).arg(5000).query(c).unwrap();
    match v[1] {
        redis::Value::Int(t) => t,
        ref other => panic!("no lease for {key}: {other:?}"),
    }
}

/// `[value, expires_at, stale]`.
fn triple(r: &Reply) -> (Vec<u8>, i64, i64) {
    match r {
        Reply::Array(items) if items.len() == 3 => match (&items[0], &items[1], &items[2]) {
            (Reply::Bulk(v), Reply::Int(at), Reply::Int(stale)) => (v.clone(), *at, *stale),
            _ => panic!("CACHE.PEEK answered {r:?}"),
        },
        _ => panic!("CACHE.PEEK answered {r:?}"),
    }
}

#[test]
fn peek_answers_the_value_its_absolute_expiry_and_its_stale_mark() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let mut w = Wire::open(&s.socket()).unwrap();
    assert_eq!(peek(&mut w, "none"), Reply::Nil);
    run(&mut c, &["SET", "plain", "v"]).unwrap();
    assert_eq!(triple(&peek(&mut w, "plain")), (b"v".to_vec(), -1, 0));
    run(&mut c, &["SET", "empty", ""]).unwrap();
    assert_eq!(triple(&peek(&mut w, "empty")), (Vec::new(), -1, 0));
    run(&mut c, &["SET", "at", "v", "PXAT", "4102444800000"]).unwrap();
    assert_eq!(
        triple(&peek(&mut w, "at")),
        (b"v".to_vec(), 4102444800000, 0)
    );
    let before = now_ms();
    int(&mut c, &["CACHE.INVALIDATE", "plain", "STALE", "60000"]);
    let (v, at, stale) = triple(&peek(&mut w, "plain"));
    assert_eq!((v, stale), (b"v".to_vec(), 1));
    assert!(
        (before + 60000..=now_ms() + 60000).contains(&at),
        "stale until {at}"
    );
    // A stale mark that does not shorten the expiry keeps it.
    int(&mut c, &["CACHE.INVALIDATE", "at", "STALE", "60000"]);
    let (_, at2, stale2) = triple(&peek(&mut w, "at"));
    assert!(at2 <= now_ms() + 60000 && stale2 == 1, "{at2} {stale2}");
    // A fill under a lease: fresh again.
    let t = lease(&mut c, "filled");
    int(&mut c, &["CACHE.FILL", "filled", &t.to_string(), "x"]);
    assert_eq!(triple(&peek(&mut w, "filled")), (b"x".to_vec(), -1, 0));
    // A lease, waiters, hits: nothing of it shows, nothing is counted.
    let hits = warden_stat(&mut c, "cache_hits");
    lease(&mut c, "leased");
    assert_eq!(peek(&mut w, "leased"), Reply::Nil);
    assert_eq!(warden_stat(&mut c, "cache_hits"), hits);
    run(&mut c, &["HSET", "hash", "f", "v"]).unwrap();
    for (words, want) in [
        (
            &["CACHE.PEEK", "hash"][..],
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
        (
            &["CACHE.PEEK"][..],
            "ERR wrong number of arguments for 'cache.peek' command",
        ),
        (
            &["CACHE.PEEK", "a", "b"][..],
            "ERR wrong number of arguments for 'cache.peek' command",
        ),
    ] {
        match w.call(words).unwrap() {
            Reply::Error(e) => assert_eq!(e, want, "{words:?}"),
            r => panic!("{words:?} answered {r:?}"),
        }
    }
    // Inside a transaction and a script, as anywhere.
    let r = w.call(&[
        "EVAL",
        "return redis.call('CACHE.PEEK', KEYS[1])",
        "1",
        "filled",
    ]);
    assert_eq!(triple(&r.unwrap()), (b"x".to_vec(), -1, 0));
}

/// What `CLIENT TRACKING` is sent after each change (or non-change) of a
/// key a tracking client peeked.
struct Row {
    name: &'static str,
    /// Run on the writer's connection after the reader's `CACHE.PEEK`.
    action: fn(&mut Connection, &str),
    invalidates: bool,
}

fn cmd(c: &mut Connection, words: &[&str]) {
    run(c, words).unwrap_or_else(|e| panic!("{words:?}: {e}"));
}

const ROWS: &[Row] = &[
    Row {
        name: "SET",
        action: |c, k| cmd(c, &["SET", k, "w"]),
        invalidates: true,
    },
    Row {
        name: "DEL",
        action: |c, k| cmd(c, &["DEL", k]),
        invalidates: true,
    },
    Row {
        name: "PEXPIRE",
        action: |c, k| cmd(c, &["PEXPIRE", k, "600000"]),
        invalidates: true,
    },
    Row {
        name: "expiry",
        action: |c, k| {
            cmd(c, &["PEXPIRE", k, "20"]);
            // The reader's tracking of the key ended with that write; it
            // reads again in `peek_then`'s second round.
        },
        invalidates: true,
    },
    Row {
        name: "CACHE.INVALIDATE",
        action: |c, k| cmd(c, &["CACHE.INVALIDATE", k]),
        invalidates: true,
    },
    Row {
        name: "CACHE.INVALIDATE STALE shortening the ttl",
        action: |c, k| cmd(c, &["CACHE.INVALIDATE", k, "STALE", "1000"]),
        invalidates: true,
    },
    Row {
        // The value keeps its expiry: no PEXPIREAT runs, only the mark changes.
        name: "CACHE.INVALIDATE STALE keeping the ttl",
        action: |c, k| cmd(c, &["CACHE.INVALIDATE", k, "STALE", "3600000"]),
        invalidates: true,
    },
    Row {
        name: "CACHE.FILL of a refresh lease",
        action: |c, k| {
            let v: Vec<redis::Value> = redis::cmd("CACHE.GET")
                .arg(k)
                .arg(5000)
                .arg("REFRESH")
                .arg(700_000)
                .query(c)
                .unwrap();
            let redis::Value::Int(t) = v[1] else {
                panic!("no refresh lease: {v:?}")
            };
            assert_eq!(int(c, &["CACHE.FILL", k, &t.to_string(), "new"]), 1);
        },
        invalidates: true,
    },
    Row {
        name: "FLUSHALL",
        action: |c, _| cmd(c, &["FLUSHALL"]),
        invalidates: true,
    },
    Row {
        name: "CACHE.GET hit",
        action: |c, k| cmd(c, &["CACHE.GET", k, "5000"]),
        invalidates: false,
    },
    Row {
        name: "CACHE.INFO",
        action: |c, k| cmd(c, &["CACHE.INFO", k]),
        invalidates: false,
    },
    Row {
        name: "CACHE.PEEK",
        action: |c, k| cmd(c, &["CACHE.PEEK", k]),
        invalidates: false,
    },
    Row {
        name: "GET",
        action: |c, k| cmd(c, &["GET", k]),
        invalidates: false,
    },
    Row {
        name: "a refresh lease",
        action: |c, k| cmd(c, &["CACHE.GET", k, "5000", "REFRESH", "700000"]),
        invalidates: false,
    },
    Row {
        name: "a lease on another key",
        action: |c, _| cmd(c, &["CACHE.GET", "elsewhere", "5000"]),
        invalidates: false,
    },
];

/// The invalidations the subscriber `sub` was sent before its `PING`'s
/// answer; `None` in the list is a flush of everything.
fn invalidations(sub: &mut Wire) -> Vec<Option<String>> {
    sub.send(&[vec![b"PING".to_vec()]]).unwrap();
    let mut got = Vec::new();
    loop {
        match sub.read().unwrap() {
            Reply::Array(m) if m.len() == 3 && m[0].text().as_deref() == Some("message") => {
                match &m[2] {
                    Reply::Array(keys) => got.extend(keys.iter().map(|k| k.text())),
                    Reply::Nil => got.push(None),
                    other => panic!("invalidation {other:?}"),
                }
            }
            Reply::Array(m) if m.first().and_then(Reply::text).as_deref() == Some("pong") => {
                return got
            }
            other => panic!("subscriber got {other:?}"),
        }
    }
}

#[test]
fn tracking_invalidates_a_peeked_key_on_every_change_and_only_then() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let mut sub = Wire::open(&s.socket()).unwrap();
    let sub_id = sub.int(&["CLIENT", "ID"]).unwrap();
    match sub.call(&["SUBSCRIBE", "__redis__:invalidate"]).unwrap() {
        Reply::Array(_) => {}
        r => panic!("SUBSCRIBE answered {r:?}"),
    }
    let mut reader = Wire::open(&s.socket()).unwrap();
    reader
        .ok(&["CLIENT", "TRACKING", "on", "REDIRECT", &sub_id.to_string()])
        .unwrap();
    let mut failures = Vec::new();
    for (i, row) in ROWS.iter().enumerate() {
        let key = format!("k{i}");
        cmd(&mut c, &["SET", &key, "v", "PX", "600000"]);
        triple(&peek(&mut reader, &key));
        (row.action)(&mut c, &key);
        if row.name == "expiry" {
            wait_for("the value expired", Duration::from_secs(10), || {
                int(&mut c, &["EXISTS", &key]) == 0
            });
        }
        let got = invalidations(&mut sub);
        let hit = got
            .iter()
            .any(|k| k.is_none() || k.as_deref() == Some(&key));
        if hit != row.invalidates {
            failures.push(format!("{}: invalidations {got:?}", row.name));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// RESP3 on one connection: the invalidation is pushed on the reader's own
/// connection, ahead of the reply to its next command.
#[test]
fn a_resp3_reader_is_pushed_the_invalidation_before_its_next_reply() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let mut reader = Wire::open(&s.socket()).unwrap();
    assert!(!reader.call(&["HELLO", "3"]).unwrap().is_error());
    reader.ok(&["CLIENT", "TRACKING", "on"]).unwrap();
    cmd(&mut c, &["SET", "k", "v1"]);
    assert_eq!(triple(&peek(&mut reader, "k")), (b"v1".to_vec(), -1, 0));
    cmd(&mut c, &["SET", "k", "v2"]);
    reader
        .send(&[vec![b"CACHE.PEEK".to_vec(), b"k".to_vec()]])
        .unwrap();
    match reader.read().unwrap() {
        Reply::Array(m) if m.first().and_then(Reply::text).as_deref() == Some("invalidate") => {
            assert_eq!(m[1], Reply::Array(vec![Reply::Bulk(b"k".to_vec())]));
        }
        r => panic!("expected the invalidation first, got {r:?}"),
    }
    assert_eq!(triple(&reader.read().unwrap()), (b"v2".to_vec(), -1, 0));
}

/// A replica answers from its copy: the same value and expiry, no stale mark
/// (marks live in the master's memory), and no `READONLY`.
#[test]
fn a_replica_peeks_its_copy_without_the_stale_mark() {
    let m = Server::start_tcp(&[]);
    let r = Server::start_tcp(&[]);
    replicate(&m, &r);
    let mut mc = m.conn();
    cmd(&mut mc, &["SET", "k", "v", "PXAT", "4102444800000"]);
    int(&mut mc, &["CACHE.INVALIDATE", "k", "STALE", "600000"]);
    let mut mw = Wire::open(&m.socket()).unwrap();
    let (_, at, stale) = triple(&peek(&mut mw, "k"));
    assert_eq!(stale, 1);
    let mut rw = Wire::open(&r.socket()).unwrap();
    wait_for(
        "the replica has the stale expiry",
        Duration::from_secs(10),
        || matches!(peek(&mut rw, "k"), Reply::Array(ref a) if a.get(1) == Some(&Reply::Int(at))),
    );
    assert_eq!(triple(&peek(&mut rw, "k")), (b"v".to_vec(), at, 0));
}
