//! Where the contention is: wait and hold histograms, unfilled cache leases,
//! `WARDEN.CONTENDED`, and one version everywhere.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::wire::{cmd, Wire};
use common::*;
use redis::{Connection, Value};

const HISTOGRAMS: [&str; 5] = [
    "lock_wait_ms",
    "rwlock_wait_ms",
    "cache_wait_ms",
    "lock_hold_ms",
    "rwlock_hold_ms",
];

/// `INFO warden`'s histograms: name → (bucket name → cumulative count).
fn histograms(c: &mut Connection) -> HashMap<String, HashMap<String, u64>> {
    let text: String = redis::cmd("INFO").arg("warden").query(c).unwrap();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("warden_")?.split_once(':'))
        .filter(|(name, _)| HISTOGRAMS.contains(name))
        .map(|(name, dict)| {
            let fields = dict
                .split(',')
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    (k.to_string(), v.parse().unwrap())
                })
                .collect();
            (name.to_string(), fields)
        })
        .collect()
}

fn count(c: &mut Connection, histogram: &str) -> u64 {
    histograms(c)[histogram]["count"]
}

/// The counts of every histogram.
fn counts(c: &mut Connection) -> HashMap<String, u64> {
    histograms(c)
        .into_iter()
        .map(|(name, h)| (name, h["count"]))
        .collect()
}

fn info_field(c: &mut Connection, field: &str) -> String {
    let text: String = redis::cmd("INFO").arg("warden").query(c).unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("warden_{field}:")))
        .unwrap_or_else(|| panic!("no {field} in {text}"))
        .to_string()
}

/// Asserts that exactly `expected` histograms moved since `before`, by one each.
fn assert_moved(c: &mut Connection, before: &HashMap<String, u64>, expected: &[&str], case: &str) {
    let after = counts(c);
    for name in HISTOGRAMS {
        let moved = after[name] - before[name];
        let want = u64::from(expected.contains(&name));
        assert_eq!(moved, want, "{case}: {name} moved by {moved}");
    }
}

/// The fill lease `CACHE.GET key lease_ms` grants on a miss.
fn lease_on_miss(c: &mut Connection, key: &str, lease_ms: &str) -> i64 {
    match run(c, &["CACHE.GET", key, lease_ms]).unwrap() {
        Value::Array(v) => match v[1] {
            Value::Int(t) => t,
            ref other => panic!("no lease for {key}: {other:?}"),
        },
        other => panic!("{key}: {other:?}"),
    }
}

#[test]
fn histograms_are_cumulative_power_of_two_buckets() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let h = histograms(&mut c);
    assert_eq!(h.len(), 5, "{h:?}");
    for (name, fields) in &h {
        let mut les: Vec<u64> = fields
            .keys()
            .filter_map(|k| k.strip_prefix("le_")?.parse().ok())
            .collect();
        les.sort_unstable();
        let powers: Vec<u64> = (0..=20).map(|i| 1 << i).collect();
        assert_eq!(les, powers, "{name}");
        assert!(fields.contains_key("le_inf") && fields.contains_key("sum"));
    }
    // A lease that lapses was held exactly its ttl: 50 ms is in le_64, not le_32.
    int(&mut c, &["LOCK.ACQUIRE", "k", "a", "50"]);
    wait_for("the lease to end", Duration::from_secs(10), || {
        count(&mut c, "lock_hold_ms") == 1
    });
    let hold = &histograms(&mut c)["lock_hold_ms"];
    assert_eq!((hold["le_32"], hold["le_64"], hold["le_inf"]), (0, 1, 1));
    assert_eq!(hold["sum"], 50);
}

#[test]
fn every_way_a_wait_ends_is_one_observation_of_its_kind() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "lock granted",
            &["LOCK.ACQUIRE", "l1", "b", "60000", "WAIT", "0"],
            "lock",
        ),
        (
            "lock timeout",
            &["LOCK.ACQUIRE", "l2", "b", "60000", "WAIT", "300"],
            "lock",
        ),
        (
            "lock disconnect",
            &["LOCK.ACQUIRE", "l3", "b", "60000", "WAIT", "0"],
            "lock",
        ),
        (
            "write granted",
            &["RWLOCK.WRITE", "r1", "b", "60000", "WAIT", "0"],
            "rwlock",
        ),
        (
            "read timeout",
            &["RWLOCK.READ", "r2", "b", "60000", "WAIT", "300"],
            "rwlock",
        ),
        (
            "cache filled",
            &["CACHE.GET", "c1", "60000", "WAIT", "0"],
            "cache",
        ),
        (
            "cache timeout",
            &["CACHE.GET", "c2", "60000", "WAIT", "300"],
            "cache",
        ),
    ];
    for (case, words, kind) in cases {
        let key = words[1];
        let info = match *kind {
            "lock" => "LOCK.INFO",
            "rwlock" => "RWLOCK.INFO",
            _ => "CACHE.INFO",
        };
        // Someone holds the key first.
        let lease = match *kind {
            "lock" => int(&mut c, &["LOCK.ACQUIRE", key, "a", "60000"]),
            "rwlock" => int(&mut c, &["RWLOCK.WRITE", key, "a", "60000"]),
            _ => lease_on_miss(&mut c, key, "60000"),
        };
        let before = counts(&mut c);
        let mut w = Wire::open(&s.socket()).unwrap();
        w.send(&[cmd(words)]).unwrap();
        wait_queued(&mut c, info, key, 1);
        let wait_hist = format!("{kind}_wait_ms");
        if case.contains("granted") || case.contains("filled") {
            match *kind {
                "lock" => assert_eq!(int(&mut c, &["LOCK.RELEASE", key, "a"]), 1),
                "rwlock" => assert_eq!(int(&mut c, &["RWLOCK.UNLOCK", key, "a"]), 1),
                _ => {
                    let t = lease.to_string();
                    assert_eq!(int(&mut c, &["CACHE.FILL", key, &t, "v"]), 1);
                }
            }
            assert!(!w.read().unwrap().is_error(), "{case}");
            // The releaser's hold ended too (a cache fill has no hold).
            let mut moved = vec![wait_hist.as_str()];
            let hold_hist = format!("{kind}_hold_ms");
            if *kind != "cache" {
                moved.push(&hold_hist);
            }
            assert_moved(&mut c, &before, &moved, case);
        } else if case.contains("timeout") {
            assert_eq!(w.read().unwrap().int(), None, "{case}: nil");
            assert_moved(&mut c, &before, &[&wait_hist], case);
            // It waited its 300 ms at least: nothing new at or below 128 ms.
            let h = &histograms(&mut c)[&wait_hist];
            assert!(h["le_128"] < h["count"], "{case}: {h:?}");
        } else {
            drop(w);
            wait_queued(&mut c, info, key, 0);
            assert_moved(&mut c, &before, &[&wait_hist], case);
        }
    }
}

#[test]
fn every_way_a_hold_ends_is_one_observation() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    type Step = fn(&mut Connection);
    let cases: &[(&str, Step, &str, u64)] = &[
        (
            "release",
            |c| {
                int(c, &["LOCK.ACQUIRE", "a", "o", "60000"]);
                int(c, &["LOCK.RELEASE", "a", "o"]);
            },
            "lock_hold_ms",
            1,
        ),
        (
            "re-entrant release keeps the hold until the last",
            |c| {
                int(c, &["LOCK.ACQUIRE", "b", "o", "60000"]);
                int(c, &["LOCK.ACQUIRE", "b", "o", "60000"]);
                int(c, &["LOCK.RELEASE", "b", "o"]);
            },
            "lock_hold_ms",
            0,
        ),
        (
            "DEL",
            |c| {
                int(c, &["LOCK.ACQUIRE", "d", "o", "60000"]);
                int(c, &["DEL", "d"]);
            },
            "lock_hold_ms",
            1,
        ),
        (
            "FLUSHALL of two locks, and b still held once",
            |c| {
                int(c, &["LOCK.ACQUIRE", "f1", "o", "60000"]);
                int(c, &["LOCK.ACQUIRE", "f2", "o", "60000"]);
                run(c, &["FLUSHALL"]).unwrap();
            },
            "lock_hold_ms",
            3,
        ),
        (
            "readers unlock",
            |c| {
                int(c, &["RWLOCK.READ", "rw", "r1", "60000"]);
                int(c, &["RWLOCK.READ", "rw", "r2", "60000"]);
                int(c, &["RWLOCK.UNLOCK", "rw", "r1"]);
                int(c, &["RWLOCK.UNLOCK", "rw", "r2"]);
            },
            "rwlock_hold_ms",
            2,
        ),
        (
            "a reader's lease ends beside a live one",
            |c| {
                int(c, &["RWLOCK.READ", "rw2", "short", "20"]);
                int(c, &["RWLOCK.READ", "rw2", "long", "60000"]);
                std::thread::sleep(Duration::from_millis(40));
                // The next command on the key prunes the lapsed hold.
                int(c, &["RWLOCK.EXTEND", "rw2", "long", "60000"]);
            },
            "rwlock_hold_ms",
            1,
        ),
        (
            "writer deleted",
            |c| {
                int(c, &["RWLOCK.WRITE", "rw3", "w", "60000"]);
                int(c, &["UNLINK", "rw3"]);
            },
            "rwlock_hold_ms",
            1,
        ),
    ];
    for (case, step, histogram, n) in cases {
        let before = count(&mut c, histogram);
        step(&mut c);
        // Valkey flushes in the background: values are freed a little later.
        wait_for(case, Duration::from_secs(10), || {
            count(&mut c, histogram) - before >= *n
        });
        let moved = count(&mut c, histogram) - before;
        assert_eq!(moved, *n, "{case}");
    }

    // A hand-off in place ends the releaser's hold and starts the waiter's.
    int(&mut c, &["LOCK.ACQUIRE", "h", "a", "60000"]);
    let (_, waiter) = spawn_command(&s, &["LOCK.ACQUIRE", "h", "b", "60000", "WAIT", "0"]);
    wait_queued(&mut c, "LOCK.INFO", "h", 1);
    let before = count(&mut c, "lock_hold_ms");
    int(&mut c, &["LOCK.RELEASE", "h", "a"]);
    granted(waiter);
    assert_eq!(count(&mut c, "lock_hold_ms"), before + 1, "a's hold");
    int(&mut c, &["LOCK.RELEASE", "h", "b"]);
    assert_eq!(count(&mut c, "lock_hold_ms"), before + 2, "b's hold");

    // A reload ends no hold twice: a loaded lock's grant time is unknown.
    int(&mut c, &["LOCK.ACQUIRE", "r", "o", "60000"]);
    let before = count(&mut c, "lock_hold_ms");
    run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    int(&mut c, &["LOCK.RELEASE", "r", "o"]);
    assert!(count(&mut c, "lock_hold_ms") <= before + 1);
}

#[test]
fn a_replica_records_no_holds_of_its_own() {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[]);
    replicate(&master, &replica);
    let mut m = master.conn();
    for i in 0..5 {
        let key = format!("k{i}");
        int(&mut m, &["LOCK.ACQUIRE", &key, "o", "60000"]);
        int(&mut m, &["RWLOCK.READ", &format!("rw{i}"), "o", "60000"]);
        int(&mut m, &["LOCK.RELEASE", &key, "o"]);
        int(&mut m, &["RWLOCK.UNLOCK", &format!("rw{i}"), "o"]);
    }
    sync_replicas(&mut m, 1);
    let mut r = replica.conn();
    assert_eq!(count(&mut m, "lock_hold_ms"), 5);
    assert_eq!(count(&mut m, "rwlock_hold_ms"), 5);
    assert_eq!(count(&mut r, "lock_hold_ms"), 0);
    assert_eq!(count(&mut r, "rwlock_hold_ms"), 0);
}

#[test]
fn latency_tracking_off_records_nothing_and_on_again_records() {
    let s = Server::start(&["--warden.latency-tracking", "no"]);
    let mut c = s.conn();
    assert_eq!(info_field(&mut c, "latency_tracking"), "0");
    let exercise = |c: &mut Connection| {
        int(c, &["LOCK.ACQUIRE", "k", "o", "60000"]);
        assert!(is_nil(c, &["LOCK.ACQUIRE", "k", "p", "60000", "WAIT", "1"]));
        int(c, &["LOCK.RELEASE", "k", "o"]);
    };
    exercise(&mut c);
    assert!(counts(&mut c).values().all(|n| *n == 0));
    run(&mut c, &["CONFIG", "SET", "warden.latency-tracking", "yes"]).unwrap();
    assert_eq!(info_field(&mut c, "latency_tracking"), "1");
    exercise(&mut c);
    assert_eq!(count(&mut c, "lock_wait_ms"), 1);
    assert_eq!(count(&mut c, "lock_hold_ms"), 1);
    let e = err(
        &mut c,
        &["CONFIG", "SET", "warden.latency-tracking", "maybe"],
    );
    assert!(e.contains("warden.latency-tracking"), "{e}");
    assert_eq!(info_field(&mut c, "latency_tracking"), "1");
}

#[test]
fn cache_leases_unfilled_counts_every_end_but_a_fill() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let lease = |c: &mut Connection, key: &str, ms: &str| lease_on_miss(c, key, ms).to_string();
    let unfilled =
        |c: &mut Connection| -> i64 { info_field(c, "cache_leases_unfilled").parse().unwrap() };
    type Case = fn(&mut Connection, &str);
    let cases: &[(&str, Case, i64)] = &[
        (
            "filled",
            |c, t| assert_eq!(int(c, &["CACHE.FILL", "k", t, "v"]), 1),
            0,
        ),
        (
            "abandoned",
            |c, t| assert_eq!(int(c, &["CACHE.ABANDON", "k", t]), 1),
            1,
        ),
        (
            "invalidated",
            |c, _| {
                int(c, &["CACHE.INVALIDATE", "k"]);
            },
            1,
        ),
        (
            "deleted though missing",
            |c, _| {
                int(c, &["DEL", "k"]);
            },
            1,
        ),
        (
            "flushed",
            |c, _| {
                run(c, &["FLUSHALL"]).unwrap();
            },
            1,
        ),
    ];
    for (case, end, n) in cases {
        run(&mut c, &["DEL", "k"]).unwrap();
        let t = lease(&mut c, "k", "60000");
        let before = unfilled(&mut c);
        end(&mut c, &t);
        assert_eq!(unfilled(&mut c) - before, *n, "{case}");
    }
    // A lease that lapses, and one whose holder leaves.
    run(&mut c, &["DEL", "k"]).unwrap();
    let before = unfilled(&mut c);
    lease(&mut c, "k", "30");
    wait_for("the lapse", Duration::from_secs(10), || {
        unfilled(&mut c) == before + 1
    });
    let mut holder = s.conn();
    lease(&mut holder, "gone", "60000");
    drop(holder);
    wait_for("the holder's lease", Duration::from_secs(10), || {
        unfilled(&mut c) == before + 2
    });
}

/// `WARDEN.CONTENDED`'s reply as (key, db, waiters, oldest, total, kind).
fn contended(c: &mut Connection, words: &[&str]) -> Vec<(String, i64, i64, i64, i64, String)> {
    let mut all = vec!["WARDEN.CONTENDED"];
    all.extend_from_slice(words);
    let Value::Array(rows) = run(c, &all).unwrap() else {
        panic!("not an array");
    };
    rows.iter()
        .map(|row| {
            let fields: Vec<(String, Value)> = match row {
                Value::Array(flat) => flat
                    .chunks(2)
                    .map(|p| (reply_text(&p[0]), p[1].clone()))
                    .collect(),
                Value::Map(m) => m.iter().map(|(k, v)| (reply_text(k), v.clone())).collect(),
                other => panic!("{other:?}"),
            };
            let names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(
                names,
                [
                    "key",
                    "db",
                    "kind",
                    "waiters",
                    "oldest_wait_ms",
                    "total_wait_ms"
                ]
            );
            (
                field_str(&fields, "key"),
                field_int(&fields, "db"),
                field_int(&fields, "waiters"),
                field_int(&fields, "oldest_wait_ms"),
                field_int(&fields, "total_wait_ms"),
                field_str(&fields, "kind"),
            )
        })
        .collect()
}

#[test]
fn contended_lists_keys_by_waiters_then_longest_wait() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert!(contended(&mut c, &[]).is_empty());
    let mut wires = Vec::new();
    let mut block = |db: &str, words: &[&str], info: &str, n: i64| {
        let mut w = Wire::open(&s.socket()).unwrap();
        w.send(&[cmd(&["SELECT", db]), cmd(words)]).unwrap();
        assert!(!w.read().unwrap().is_error());
        let mut q = s.conn();
        run(&mut q, &["SELECT", db]).unwrap();
        wait_queued(&mut q, info, words[1], n);
        wires.push(w);
    };
    int(&mut c, &["LOCK.ACQUIRE", "old", "a", "60000"]);
    block(
        "0",
        &["LOCK.ACQUIRE", "old", "w", "60000", "WAIT", "0"],
        "LOCK.INFO",
        1,
    );
    std::thread::sleep(Duration::from_millis(20));
    int(&mut c, &["LOCK.ACQUIRE", "busy", "a", "60000"]);
    for (i, n) in [("1", 1), ("2", 2), ("3", 3)] {
        block(
            "0",
            &["LOCK.ACQUIRE", "busy", i, "60000", "WAIT", "0"],
            "LOCK.INFO",
            n,
        );
    }
    let mut c1 = s.conn();
    run(&mut c1, &["SELECT", "1"]).unwrap();
    int(&mut c1, &["RWLOCK.WRITE", "rw", "a", "60000"]);
    block(
        "1",
        &["RWLOCK.READ", "rw", "r1", "60000", "WAIT", "0"],
        "RWLOCK.INFO",
        1,
    );
    block(
        "1",
        &["RWLOCK.READ", "rw", "r2", "60000", "WAIT", "0"],
        "RWLOCK.INFO",
        2,
    );
    run(&mut c, &["CACHE.GET", "fresh", "60000"]).unwrap();
    block(
        "0",
        &["CACHE.GET", "fresh", "60000", "WAIT", "0"],
        "CACHE.INFO",
        1,
    );

    let rows = contended(&mut c, &[]);
    let order: Vec<(&str, i64, i64, &str)> = rows
        .iter()
        .map(|r| (r.0.as_str(), r.1, r.2, r.5.as_str()))
        .collect();
    // Ties on waiters: the longest wait first ("old" waited before "fresh").
    assert_eq!(
        order,
        [
            ("busy", 0, 3, "lock"),
            ("rw", 1, 2, "rwlock"),
            ("old", 0, 1, "lock"),
            ("fresh", 0, 1, "cache")
        ]
    );
    for (key, _, n, oldest, total, _) in &rows {
        assert!(
            *oldest >= 0 && *total >= *oldest && *total <= n * oldest,
            "{key}: {rows:?}"
        );
    }
    assert!(rows[2].3 >= 20, "old waited at least 20 ms: {rows:?}");
    assert_eq!(contended(&mut c, &["COUNT", "2"]).len(), 2);
    assert_eq!(contended(&mut c, &["count", "1000"]).len(), 4);

    // RESP3: maps with the same fields.
    let mut c3 = s.conn3();
    assert_eq!(contended(&mut c3, &[]).len(), 4);
    // From a script (an exporter's Lua script reads it so).
    let from_lua = run(
        &mut c,
        &[
            "EVAL",
            "return #redis.call('WARDEN.CONTENDED', 'COUNT', 3)",
            "0",
        ],
    );
    assert_eq!(from_lua.unwrap(), Value::Int(3));

    // A waiter leaving from the middle of a queue.
    let second = wires.remove(2);
    drop(second);
    wait_queued(&mut c, "LOCK.INFO", "busy", 2);
    assert_eq!(contended(&mut c, &["COUNT", "1"])[0].2, 2);
    drop(wires);
    wait_for("every waiter gone", Duration::from_secs(10), || {
        contended(&mut c, &[]).is_empty()
    });
}

#[test]
fn contended_refuses_bad_arguments_with_redis_texts() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let count = "ERR invalid count: expected an integer from 1 to 1000";
    let cases: &[(&[&str], &str)] = &[
        (&["COUNT", "0"], count),
        (&["COUNT", "1001"], count),
        (&["COUNT", "-1"], count),
        (&["COUNT", "ten"], count),
        (&["COUNT"], "ERR syntax error"),
        (&["COUNT", "1", "COUNT", "2"], "ERR syntax error"),
        (&["FOO"], "ERR syntax error"),
    ];
    for (args, want) in cases {
        let mut words = vec!["WARDEN.CONTENDED"];
        words.extend_from_slice(args);
        assert_eq!(err(&mut c, &words), *want, "{args:?}");
    }
}

#[test]
fn contended_takes_memory_bounded_by_its_count_not_by_the_keys() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let allocated =
        |c: &mut Connection| -> i64 { info_field(c, "module_allocated_total").parse().unwrap() };
    let mut wires = Vec::new();
    let mut cost = Vec::new();
    for keys in [50, 400] {
        while wires.len() < keys {
            let key = format!("key:{}", wires.len());
            int(&mut c, &["LOCK.ACQUIRE", &key, "holder", "60000"]);
            let mut w = Wire::open(&s.socket()).unwrap();
            w.send(&[cmd(&["LOCK.ACQUIRE", &key, "w", "60000", "WAIT", "0"])])
                .unwrap();
            wires.push(w);
        }
        wait_for("every waiter queued", Duration::from_secs(20), || {
            info_field(&mut c, "waiting_clients") == keys.to_string()
        });
        let before = allocated(&mut c);
        assert_eq!(contended(&mut c, &["COUNT", "5"]).len(), 5);
        // INFO itself allocates too: measured the same way without the command.
        let between = allocated(&mut c);
        let info_alone = allocated(&mut c) - between;
        cost.push(between - before - info_alone);
    }
    assert!(
        cost[1] <= cost[0] + 512,
        "bytes allocated with 50 and 400 keys: {cost:?}"
    );
    println!("module bytes allocated by WARDEN.CONTENDED COUNT 5, 50 and 400 keys: {cost:?}");
    assert!(cost[1] < 4096, "{cost:?}");
    assert_eq!(contended(&mut c, &["COUNT", "1000"]).len(), 400);
}

#[test]
fn one_version_everywhere_and_a_quiet_load() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(info_field(&mut c, "version"), version);
    let parts: Vec<i64> = version.split('.').map(|p| p.parse().unwrap()).collect();
    let ver = parts[0] * 10000 + parts[1] * 100 + parts[2];
    let Value::Array(modules) = run(&mut c, &["MODULE", "LIST"]).unwrap() else {
        panic!("MODULE LIST");
    };
    // Valkey lists its built-in Lua engine as a module too.
    let fields = modules
        .iter()
        .find_map(|m| match m {
            Value::Array(f) if f.contains(&Value::BulkString(b"warden".to_vec())) => Some(f),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{modules:?}"));
    let at = fields
        .iter()
        .position(|f| *f == Value::BulkString(b"ver".to_vec()))
        .unwrap();
    assert_eq!(fields[at + 1], Value::Int(ver));
    let log = s.log();
    assert!(log.contains(&format!("warden {version} loaded")), "{log}");
    // Redis marks warnings with '#'; none may come from the module at a normal load.
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains(" # ")
                && (l.contains("warden") || l.contains("odule") || l.contains("defrag"))
        })
        .collect();
    assert!(warnings.is_empty(), "{warnings:?}");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for (file, line) in [
        (
            "warden-client/Cargo.toml",
            format!("version = \"{version}\""),
        ),
        ("python/pyproject.toml", format!("version = \"{version}\"")),
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        assert!(
            text.lines().any(|l| l == line),
            "{file} is not at {version}"
        );
    }
}
