//! BF.* against a real redis-server: RedisBloom 2.8's replies and errors, and stricter limits.

mod common;

use common::*;
use redis::{Connection, Value};

fn info_int(c: &mut Connection, key: &str, field: &str) -> i64 {
    match run(c, &["BF.INFO", key, field]).unwrap() {
        Value::Array(v) => redis::from_redis_value(&v[0]).unwrap(),
        other => panic!("{other:?}"),
    }
}

fn bits(v: &Value) -> Vec<i64> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|i| match i {
                Value::Int(n) => *n,
                Value::Boolean(b) => i64::from(*b),
                other => panic!("{other:?}"),
            })
            .collect(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn reserve_add_exists_and_card() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(
        run(&mut c, &["BF.RESERVE", "bf", "0.01", "1000"]).unwrap(),
        Value::Okay
    );
    assert_eq!(int(&mut c, &["BF.ADD", "bf", "apple"]), 1);
    assert_eq!(int(&mut c, &["BF.ADD", "bf", "apple"]), 0);
    assert_eq!(int(&mut c, &["BF.EXISTS", "bf", "apple"]), 1);
    assert_eq!(int(&mut c, &["BF.EXISTS", "bf", "pear"]), 0);
    assert_eq!(int(&mut c, &["BF.EXISTS", "missing", "pear"]), 0);
    assert_eq!(int(&mut c, &["BF.CARD", "bf"]), 1);
    assert_eq!(int(&mut c, &["BF.CARD", "missing"]), 0);
    let t: String = redis::cmd("TYPE").arg("bf").query(&mut c).unwrap();
    assert_eq!(t, "warden-bf");
}

#[test]
fn madd_and_mexists_answer_arrays() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(
        bits(&run(&mut c, &["BF.MADD", "bf", "a", "b", "a"]).unwrap()),
        [1, 1, 0]
    );
    assert_eq!(
        bits(&run(&mut c, &["BF.MEXISTS", "bf", "a", "x", "b"]).unwrap()),
        [1, 0, 1]
    );
    assert_eq!(
        bits(&run(&mut c, &["BF.MEXISTS", "nothing", "a", "b"]).unwrap()),
        [0, 0]
    );
    assert_eq!(int(&mut c, &["BF.CARD", "bf"]), 2);
}

#[test]
fn resp3_replies_are_booleans_and_maps() {
    let s = Server::start(&[]);
    let mut c = s.conn3();
    assert_eq!(
        run(&mut c, &["BF.ADD", "bf", "a"]).unwrap(),
        Value::Boolean(true)
    );
    assert_eq!(
        run(&mut c, &["BF.ADD", "bf", "a"]).unwrap(),
        Value::Boolean(false)
    );
    assert_eq!(
        run(&mut c, &["BF.EXISTS", "bf", "a"]).unwrap(),
        Value::Boolean(true)
    );
    assert_eq!(
        run(&mut c, &["BF.MADD", "bf", "a", "b"]).unwrap(),
        Value::Array(vec![Value::Boolean(false), Value::Boolean(true)])
    );
    assert_eq!(
        run(&mut c, &["BF.MEXISTS", "bf", "b", "z"]).unwrap(),
        Value::Array(vec![Value::Boolean(true), Value::Boolean(false)])
    );
    assert_eq!(
        run(&mut c, &["BF.INSERT", "bf", "ITEMS", "c"]).unwrap(),
        Value::Array(vec![Value::Boolean(true)])
    );
    match run(&mut c, &["BF.INFO", "bf"]).unwrap() {
        Value::Map(pairs) => {
            let names: Vec<String> = pairs
                .iter()
                .map(|(k, _)| redis::from_redis_value(k).unwrap())
                .collect();
            assert_eq!(
                names,
                [
                    "Capacity",
                    "Size",
                    "Number of filters",
                    "Number of items inserted",
                    "Expansion rate"
                ]
            );
        }
        other => panic!("{other:?}"),
    }
    match run(&mut c, &["BF.INFO", "bf", "items"]).unwrap() {
        Value::Map(pairs) => {
            assert_eq!(pairs.len(), 1);
            assert_eq!(
                redis::from_redis_value::<String>(&pairs[0].0).unwrap(),
                "Number of items inserted"
            );
            assert_eq!(pairs[0].1, Value::Int(3));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn info_reports_every_field_under_resp2() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(
        &mut c,
        &["BF.RESERVE", "bf", "0.01", "100", "EXPANSION", "3"],
    )
    .unwrap();
    run(&mut c, &["BF.ADD", "bf", "x"]).unwrap();
    let f = map(&mut c, &["BF.INFO", "bf"]);
    let names: Vec<&str> = f.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "Capacity",
            "Size",
            "Number of filters",
            "Number of items inserted",
            "Expansion rate"
        ]
    );
    assert_eq!(field_int(&f, "Capacity"), 100);
    assert!(field_int(&f, "Size") > 0);
    assert_eq!(field_int(&f, "Number of filters"), 1);
    assert_eq!(field_int(&f, "Number of items inserted"), 1);
    assert_eq!(field_int(&f, "Expansion rate"), 3);
    assert_eq!(
        run(&mut c, &["BF.INFO", "bf", "CAPACITY"]).unwrap(),
        Value::Array(vec![Value::Int(100)])
    );
    assert_eq!(info_int(&mut c, "bf", "expansion"), 3);
    assert_eq!(info_int(&mut c, "bf", "filters"), 1);
    assert_eq!(info_int(&mut c, "bf", "size"), field_int(&f, "Size"));
    run(&mut c, &["BF.RESERVE", "ns", "0.01", "100", "NONSCALING"]).unwrap();
    assert_eq!(
        run(&mut c, &["BF.INFO", "ns", "EXPANSION"]).unwrap(),
        Value::Array(vec![Value::Nil])
    );
    let f = map(&mut c, &["BF.INFO", "ns"]);
    assert_eq!(f[4].1, Value::Nil);
}

#[test]
fn implicit_creation_uses_the_defaults() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["BF.ADD", "bf", "x"]).unwrap();
    assert_eq!(info_int(&mut c, "bf", "CAPACITY"), 100);
    assert_eq!(info_int(&mut c, "bf", "EXPANSION"), 2);
    run(&mut c, &["BF.INSERT", "ins", "ITEMS", "x"]).unwrap();
    assert_eq!(info_int(&mut c, "ins", "CAPACITY"), 100);
}

#[test]
fn scaling_adds_sub_filters_of_growing_capacity() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(
        &mut c,
        &["BF.RESERVE", "bf", "0.01", "100", "EXPANSION", "2"],
    )
    .unwrap();
    let mut cmd = redis::cmd("BF.MADD");
    cmd.arg("bf");
    for i in 0..1500 {
        cmd.arg(format!("item-{i}"));
    }
    let added: Vec<i64> = cmd.query(&mut c).unwrap();
    let new = added.iter().filter(|&&b| b == 1).count() as i64;
    assert_eq!(info_int(&mut c, "bf", "FILTERS"), 4);
    assert_eq!(info_int(&mut c, "bf", "CAPACITY"), 100 + 200 + 400 + 800);
    assert_eq!(info_int(&mut c, "bf", "ITEMS"), new);
    assert_eq!(int(&mut c, &["BF.CARD", "bf"]), new);
}

#[test]
fn a_full_non_scaling_filter_answers_the_full_error_and_stops() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["BF.RESERVE", "bf", "0.01", "5", "NONSCALING"]).unwrap();
    let mut added = 0;
    let mut i = 0;
    while added < 5 {
        added += int(&mut c, &["BF.ADD", "bf", &format!("i{i}")]);
        i += 1;
    }
    assert_eq!(
        err(&mut c, &["BF.ADD", "bf", "more"]),
        "ERR non scaling filter is full"
    );
    // redis-cli shows the raw reply: an array that ends with the error.
    let out = std::process::Command::new("redis-cli")
        .args([
            "-s",
            s.socket().to_str().unwrap(),
            "BF.MADD",
            "bf",
            "i0",
            "new1",
            "new2",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.trim_end(),
        "0\nERR non scaling filter is full",
        "processing stops at the error"
    );
    assert_eq!(int(&mut c, &["BF.CARD", "bf"]), 5);
}

#[test]
fn insert_options_and_nocreate() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    assert_eq!(
        err(&mut c, &["BF.INSERT", "bf", "NOCREATE", "ITEMS", "a"]),
        "ERR not found"
    );
    assert_eq!(int(&mut c, &["EXISTS", "bf"]), 0);
    let r = run(
        &mut c,
        &[
            "BF.INSERT",
            "bf",
            "capacity",
            "500",
            "error",
            "0.001",
            "expansion",
            "4",
            "ITEMS",
            "a",
            "b",
        ],
    )
    .unwrap();
    assert_eq!(bits(&r), [1, 1]);
    assert_eq!(info_int(&mut c, "bf", "CAPACITY"), 500);
    assert_eq!(info_int(&mut c, "bf", "EXPANSION"), 4);
    assert_eq!(
        bits(&run(&mut c, &["BF.INSERT", "bf", "NOCREATE", "ITEMS", "a", "c"]).unwrap()),
        [0, 1]
    );
    run(&mut c, &["BF.INSERT", "ns", "NONSCALING", "ITEMS", "a"]).unwrap();
    assert_eq!(
        run(&mut c, &["BF.INFO", "ns", "EXPANSION"]).unwrap(),
        Value::Array(vec![Value::Nil])
    );
}

#[test]
fn every_error_text_matches_redisbloom() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["BF.RESERVE", "bf", "0.01", "100"]).unwrap();
    run(&mut c, &["SET", "str", "x"]).unwrap();
    let wrongtype = "WRONGTYPE Operation against a key holding the wrong kind of value";
    let cases: &[(&[&str], &str)] = &[
        (&["BF.RESERVE", "bf", "0.01", "100"], "ERR item exists"),
        (&["BF.RESERVE", "str", "0.01", "100"], wrongtype),
        (&["BF.RESERVE", "n", "abc", "100"], "ERR bad error rate"),
        (
            &["BF.RESERVE", "n", "0", "100"],
            "ERR (0 < error rate range < 1) ",
        ),
        (
            &["BF.RESERVE", "n", "1", "100"],
            "ERR (0 < error rate range < 1) ",
        ),
        (
            &["BF.RESERVE", "n", "-0.5", "100"],
            "ERR (0 < error rate range < 1) ",
        ),
        (
            &["BF.RESERVE", "n", "0.01", "0"],
            "ERR (capacity should be larger than 0)",
        ),
        (
            &["BF.RESERVE", "n", "0.01", "-4"],
            "ERR (capacity should be larger than 0)",
        ),
        (&["BF.RESERVE", "n", "0.01", "1.5"], "ERR bad capacity"),
        (
            &["BF.RESERVE", "n", "0.01", "100", "EXPANSION"],
            "ERR no expansion",
        ),
        (
            &["BF.RESERVE", "n", "0.01", "100", "EXPANSION", "x"],
            "ERR bad expansion",
        ),
        (
            &["BF.RESERVE", "n", "0.01", "100", "EXPANSION", "0"],
            "ERR expansion should be greater or equal to 1",
        ),
        (
            &["BF.RESERVE", "n", "0.01", "100", "EXPANSION", "32769"],
            "ERR expansion should be at most 32768",
        ),
        (
            &[
                "BF.RESERVE",
                "n",
                "0.01",
                "100",
                "EXPANSION",
                "2",
                "NONSCALING",
            ],
            "Nonscaling filters cannot expand",
        ),
        (
            &["BF.RESERVE", "n", "0.01", "100", "BOGUS"],
            "ERR unknown argument 'BOGUS'",
        ),
        (
            &["BF.RESERVE", "n", "0.01", "100", "NONSCALINGX"],
            "ERR unknown argument 'NONSCALINGX'",
        ),
        (&["BF.INFO", "missing"], "ERR not found"),
        (&["BF.INFO", "bf", "bogus"], "Invalid information value"),
        (&["BF.INFO", "str"], wrongtype),
        (&["BF.SCANDUMP", "missing", "0"], "ERR not found"),
        (
            &["BF.SCANDUMP", "bf", "x"],
            "Second argument must be numeric",
        ),
        (
            &["BF.LOADCHUNK", "bf", "x", "data"],
            "ERR Second argument must be numeric",
        ),
        (&["BF.LOADCHUNK", "missing", "5", "data"], "ERR not found"),
        (
            &["BF.LOADCHUNK", "new", "1", "garbage"],
            "ERR received bad data",
        ),
        (
            &["BF.INSERT", "n", "ERROR", "x", "ITEMS", "a"],
            "Bad error rate",
        ),
        (
            &["BF.INSERT", "n", "CAPACITY", "x", "ITEMS", "a"],
            "Bad capacity",
        ),
        (
            &["BF.INSERT", "n", "EXPANSION", "x", "ITEMS", "a"],
            "Bad expansion",
        ),
        (
            &["BF.INSERT", "n", "ERROR", "2", "ITEMS", "a"],
            "Bad argument received",
        ),
        (
            &["BF.INSERT", "n", "CAPACITY", "0", "ITEMS", "a"],
            "Bad argument received",
        ),
        (
            &["BF.INSERT", "n", "EXPANSION", "0", "ITEMS", "a"],
            "Bad argument received",
        ),
        (
            &["BF.INSERT", "n", "FOO", "ITEMS", "a"],
            "Unknown argument received",
        ),
        (
            &["BF.INSERT", "n", "CAPACITYX", "5", "ITEMS", "a"],
            "Unknown argument received",
        ),
        (&["BF.ADD", "str", "a"], wrongtype),
        (&["BF.MADD", "str", "a"], wrongtype),
        (&["BF.EXISTS", "str", "a"], wrongtype),
        (&["BF.MEXISTS", "str", "a"], wrongtype),
        (&["BF.CARD", "str"], wrongtype),
        (&["BF.INSERT", "str", "ITEMS", "a"], wrongtype),
    ];
    for (words, expected) in cases {
        assert_eq!(&err(&mut c, words), expected, "{words:?}");
    }
    assert_eq!(int(&mut c, &["EXISTS", "n", "new", "missing"]), 0);
    for words in [
        &["BF.RESERVE", "k", "0.1"][..],
        &["BF.ADD", "k"],
        &["BF.ADD", "k", "a", "b"],
        &["BF.MADD", "k"],
        &["BF.EXISTS", "k"],
        &["BF.MEXISTS", "k"],
        &["BF.INSERT", "k", "ITEMS"],
        &["BF.INSERT", "k", "NOCREATE"],
        &["BF.INSERT", "k", "CAPACITY", "10", "ERROR"],
        &["BF.INFO"],
        &["BF.INFO", "k", "a", "b"],
        &["BF.CARD"],
        &["BF.SCANDUMP", "k"],
        &["BF.LOADCHUNK", "k", "1"],
    ] {
        assert!(
            err(&mut c, words).starts_with("ERR wrong number of arguments"),
            "{words:?}"
        );
    }
}

/// `COMMAND INFO` gives `BF.RESERVE` arity -4: at least four words (an
/// arity cannot say "at most"). More words than its longest form (seven)
/// are then a syntax error, not an arity error, and create nothing.
#[test]
fn bf_reserve_past_its_longest_form_is_a_syntax_error_as_command_info_says() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let info = run(&mut c, &["COMMAND", "INFO", "bf.reserve"]).unwrap();
    let Value::Array(commands) = info else {
        panic!("{info:?}")
    };
    let Value::Array(fields) = &commands[0] else {
        panic!("{commands:?}")
    };
    assert_eq!(fields[1], Value::Int(-4), "COMMAND INFO arity");
    let arity = "ERR wrong number of arguments for 'bf.reserve' command";
    let syntax = "ERR syntax error";
    let cases: [(&[&str], &str); 4] = [
        (&["BF.RESERVE", "k", "0.1"], arity),
        (&["BF.RESERVE", "k", "0.1", "1", "a", "b", "c", "d"], syntax),
        (
            &[
                "BF.RESERVE",
                "k",
                "0.1",
                "1",
                "NONSCALING",
                "NONSCALING",
                "NONSCALING",
                "NONSCALING",
            ],
            syntax,
        ),
        (
            &[
                "BF.RESERVE",
                "k",
                "0.1",
                "1",
                "EXPANSION",
                "2",
                "NONSCALING",
                "x",
                "y",
            ],
            syntax,
        ),
    ];
    for (words, expected) in cases {
        assert_eq!(err(&mut c, words), expected, "{words:?}");
    }
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
    let longest = [
        "BF.RESERVE",
        "k",
        "0.1",
        "1",
        "NONSCALING",
        "NONSCALING",
        "NONSCALING",
    ];
    run(&mut c, &longest).unwrap();
}

#[test]
fn oversized_filters_are_refused_before_anything_is_allocated() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let before: i64 = used_memory(&mut c);
    assert_eq!(
        err(&mut c, &["BF.RESERVE", "huge", "0.001", "1000000000000000"]),
        "ERR filter would exceed warden.bf-max-memory"
    );
    assert_eq!(
        err(
            &mut c,
            &[
                "BF.INSERT",
                "huge",
                "CAPACITY",
                "9000000000000",
                "ITEMS",
                "a"
            ]
        ),
        "ERR filter would exceed warden.bf-max-memory"
    );
    assert_eq!(
        err(&mut c, &["BF.RESERVE", "tiny", "1e-30", "10"]),
        "ERR error rate too small: a filter needs at least 2^-64"
    );
    assert_eq!(int(&mut c, &["EXISTS", "huge", "tiny"]), 0);
    let after: i64 = used_memory(&mut c);
    assert!(after - before < 1 << 20, "{before} -> {after}");
    // scale-out past the limit is refused, and the filter stays as it was
    run(&mut c, &["CONFIG", "SET", "warden.bf-max-memory", "4096"]).unwrap();
    run(
        &mut c,
        &["BF.RESERVE", "small", "0.01", "100", "EXPANSION", "4"],
    )
    .unwrap();
    let refused = first_refusal(&mut c, "small", 5000);
    assert_eq!(
        refused.as_deref(),
        Some("ERR filter would exceed warden.bf-max-memory")
    );
    assert!(int(&mut c, &["MEMORY", "USAGE", "small"]) < 8192);
    // long scaling with expansion 1 ends at the error-rate floor, not in a crash
    run(&mut c, &["CONFIG", "SET", "warden.bf-max-memory", "128mb"]).unwrap();
    run(
        &mut c,
        &["BF.RESERVE", "long", "0.5", "1", "EXPANSION", "1"],
    )
    .unwrap();
    let refused = first_refusal(&mut c, "long", 1000);
    assert_eq!(
        refused.as_deref(),
        Some("ERR error rate too small: a filter needs at least 2^-64")
    );
    run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    assert!(info_int(&mut c, "long", "FILTERS") > 10);
}

/// Adds items until an add is refused; the refusal's text, if any came.
fn first_refusal(c: &mut Connection, key: &str, tries: usize) -> Option<String> {
    (0..tries).find_map(|i| {
        run(c, &["BF.ADD", key, &format!("i{i}")])
            .err()
            .map(|e| error_text(&e))
    })
}

/// Adds `n` items in batches.
fn fill(c: &mut Connection, key: &str, prefix: &str, n: usize) {
    for batch in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut cmd = redis::cmd("BF.MADD");
        cmd.arg(key);
        for i in batch {
            cmd.arg(format!("{prefix}{i}"));
        }
        cmd.query::<Value>(c).unwrap();
    }
}

fn false_positives(c: &mut Connection, key: &str, n: usize) -> usize {
    let mut fp = 0;
    for batch in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut cmd = redis::cmd("BF.MEXISTS");
        cmd.arg(key);
        for i in batch {
            cmd.arg(format!("absent-{i}"));
        }
        let found: Vec<i64> = cmd.query(c).unwrap();
        fp += found.iter().filter(|&&b| b == 1).count();
    }
    fp
}

#[test]
fn false_positive_rate_at_capacity_is_at_most_the_requested_rate() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for (key, rate) in [("p01", "0.01"), ("p001", "0.001")] {
        run(&mut c, &["BF.RESERVE", key, rate, "100000"]).unwrap();
        fill(&mut c, key, "present-", 100_000);
        assert_eq!(info_int(&mut c, key, "FILTERS"), 1);
        let fp = false_positives(&mut c, key, 100_000);
        let measured = fp as f64 / 100_000.0;
        assert!(
            measured <= rate.parse::<f64>().unwrap(),
            "{key}: {measured}"
        );
        // nothing added is ever reported absent
        let mut cmd = redis::cmd("BF.MEXISTS");
        cmd.arg(key);
        for i in (0..100_000).step_by(97) {
            cmd.arg(format!("present-{i}"));
        }
        let found: Vec<i64> = cmd.query(&mut c).unwrap();
        assert!(found.iter().all(|&b| b == 1));
    }
}

#[test]
fn scandump_and_loadchunk_round_trip_into_another_key() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(
        &mut c,
        &["BF.RESERVE", "src", "0.01", "1000", "EXPANSION", "2"],
    )
    .unwrap();
    fill(&mut c, "src", "x", 3000);
    let mut iter = 0i64;
    loop {
        let (next, data): (i64, Vec<u8>) = redis::cmd("BF.SCANDUMP")
            .arg("src")
            .arg(iter)
            .query(&mut c)
            .unwrap();
        if next == 0 {
            assert!(data.is_empty());
            break;
        }
        let ok: String = redis::cmd("BF.LOADCHUNK")
            .arg("dst")
            .arg(next)
            .arg(&data)
            .query(&mut c)
            .unwrap();
        assert_eq!(ok, "OK");
        iter = next;
    }
    assert_eq!(
        map(&mut c, &["BF.INFO", "src"]),
        map(&mut c, &["BF.INFO", "dst"])
    );
    let mut probe = redis::cmd("BF.MEXISTS");
    probe.arg("src");
    let mut probe2 = redis::cmd("BF.MEXISTS");
    probe2.arg("dst");
    for i in 0..5000 {
        probe.arg(format!("x{i}"));
        probe2.arg(format!("x{i}"));
    }
    let a: Vec<i64> = probe.query(&mut c).unwrap();
    let b: Vec<i64> = probe2.query(&mut c).unwrap();
    assert_eq!(a, b);
    let dump_a: Vec<u8> = redis::cmd("DUMP").arg("src").query(&mut c).unwrap();
    let dump_b: Vec<u8> = redis::cmd("DUMP").arg("dst").query(&mut c).unwrap();
    assert_eq!(dump_a, dump_b);
}

#[test]
fn corrupt_and_truncated_chunks_are_refused_and_leave_no_half_built_key() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["BF.RESERVE", "src", "0.01", "1000"]).unwrap();
    fill(&mut c, "src", "x", 500);
    let (_, header): (i64, Vec<u8>) = redis::cmd("BF.SCANDUMP")
        .arg("src")
        .arg(0)
        .query(&mut c)
        .unwrap();
    let (next, chunk): (i64, Vec<u8>) = redis::cmd("BF.SCANDUMP")
        .arg("src")
        .arg(1)
        .query(&mut c)
        .unwrap();
    for cut in 0..header.len() {
        let e = redis::cmd("BF.LOADCHUNK")
            .arg("dst")
            .arg(1)
            .arg(&header[..cut])
            .query::<Value>(&mut c)
            .unwrap_err();
        assert_eq!(error_text(&e), "ERR received bad data");
    }
    for i in 0..header.len() {
        let mut bad = header.clone();
        bad[i] ^= 0xff;
        let _ = redis::cmd("BF.LOADCHUNK")
            .arg("dst")
            .arg(1)
            .arg(&bad)
            .query::<Value>(&mut c);
        let _: i64 = redis::cmd("DEL").arg("dst").query(&mut c).unwrap();
    }
    assert_eq!(int(&mut c, &["EXISTS", "dst"]), 0);
    // a header announcing 1 TB is refused before allocation
    let mut huge = header.clone();
    huge[14..22].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let e = redis::cmd("BF.LOADCHUNK")
        .arg("dst")
        .arg(1)
        .arg(&huge)
        .query::<Value>(&mut c)
        .unwrap_err();
    assert!(error_text(&e).starts_with("ERR"));
    // chunks that do not fit where their iterator puts them
    let _: String = redis::cmd("BF.LOADCHUNK")
        .arg("dst")
        .arg(1)
        .arg(&header)
        .query(&mut c)
        .unwrap();
    for (iter, data) in [
        (next + 1, chunk.clone()),
        (next, [&chunk[..], b"extra"].concat()),
        (i64::MAX, chunk.clone()),
        (0, chunk.clone()),
        (-5, chunk.clone()),
    ] {
        let e = redis::cmd("BF.LOADCHUNK")
            .arg("dst")
            .arg(iter)
            .arg(&data)
            .query::<Value>(&mut c)
            .unwrap_err();
        assert_eq!(error_text(&e), "ERR received bad data", "iter {iter}");
    }
    let _: String = redis::cmd("BF.LOADCHUNK")
        .arg("dst")
        .arg(next)
        .arg(&chunk)
        .query(&mut c)
        .unwrap();
    run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    assert_eq!(int(&mut c, &["BF.EXISTS", "dst", "x7"]), 1);
    assert_eq!(int(&mut c, &["BF.ADD", "dst", "fresh"]), 1);
}

fn filter_state(c: &mut Connection, key: &str) -> (Vec<(String, Value)>, Vec<i64>) {
    let mut cmd = redis::cmd("BF.MEXISTS");
    cmd.arg(key);
    for i in 0..2000 {
        cmd.arg(format!("x{i}"));
    }
    (map(c, &["BF.INFO", key]), cmd.query(c).unwrap())
}

#[test]
fn persistence_keeps_bits_and_counts() {
    let mut s = Server::start(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = s.conn();
    run(
        &mut c,
        &["BF.RESERVE", "bf", "0.01", "300", "EXPANSION", "2"],
    )
    .unwrap();
    fill(&mut c, "bf", "x", 1000);
    run(&mut c, &["BF.RESERVE", "ns", "0.001", "50", "NONSCALING"]).unwrap();
    fill(&mut c, "ns", "x", 20);
    let before = filter_state(&mut c, "bf");
    let before_ns = filter_state(&mut c, "ns");
    assert!(int(&mut c, &["MEMORY", "USAGE", "bf"]) > 1000);

    run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    assert_eq!(filter_state(&mut c, "bf"), before);

    let dump: Vec<u8> = redis::cmd("DUMP").arg("bf").query(&mut c).unwrap();
    redis::cmd("RESTORE")
        .arg("restored")
        .arg(0)
        .arg(&dump)
        .query::<()>(&mut c)
        .unwrap();
    assert_eq!(filter_state(&mut c, "restored"), before);
    assert_eq!(int(&mut c, &["COPY", "bf", "copied"]), 1);
    assert_eq!(filter_state(&mut c, "copied"), before);
    run(&mut c, &["BF.ADD", "copied", "only-in-copy"]).unwrap();
    assert_eq!(int(&mut c, &["BF.EXISTS", "bf", "only-in-copy"]), 0);

    // AOF: the log itself, then a rewrite
    s.restart(false);
    let mut c = s.conn();
    assert_eq!(filter_state(&mut c, "bf"), before);
    assert_eq!(filter_state(&mut c, "ns"), before_ns);
    rewrite_aof(&mut c);
    s.restart(false);
    let mut c = s.conn();
    assert_eq!(filter_state(&mut c, "bf"), before);
    assert_eq!(filter_state(&mut c, "ns"), before_ns);
    // RDB
    run(&mut c, &["CONFIG", "SET", "appendonly", "no"]).unwrap();
    run(&mut c, &["SAVE"]).unwrap();
    s.restart(false);
    let mut c = s.conn();
    assert_eq!(filter_state(&mut c, "bf"), before);
}

#[test]
fn corrupt_restore_payloads_never_crash() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["BF.RESERVE", "bf", "0.01", "50"]).unwrap();
    fill(&mut c, "bf", "x", 30);
    let dump: Vec<u8> = redis::cmd("DUMP").arg("bf").query(&mut c).unwrap();
    restore_every_truncation(&mut c, &dump);
}

#[test]
fn configs_set_the_implicit_defaults_and_are_range_checked() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let got: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("warden.bf-*")
        .query(&mut c)
        .unwrap();
    for name in [
        "warden.bf-error-rate",
        "warden.bf-initial-capacity",
        "warden.bf-expansion",
        "warden.bf-max-memory",
    ] {
        assert!(got.iter().any(|g| g == name), "{got:?}");
    }
    run(
        &mut c,
        &["CONFIG", "SET", "warden.bf-initial-capacity", "1000"],
    )
    .unwrap();
    run(&mut c, &["CONFIG", "SET", "warden.bf-expansion", "4"]).unwrap();
    run(&mut c, &["CONFIG", "SET", "warden.bf-error-rate", "0.001"]).unwrap();
    run(&mut c, &["BF.ADD", "bf", "x"]).unwrap();
    assert_eq!(info_int(&mut c, "bf", "CAPACITY"), 1000);
    assert_eq!(info_int(&mut c, "bf", "EXPANSION"), 4);
    let rate: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("warden.bf-error-rate")
        .query(&mut c)
        .unwrap();
    assert_eq!(rate[1], "0.001");
    for (name, value) in [
        ("warden.bf-error-rate", "0"),
        ("warden.bf-error-rate", "1"),
        ("warden.bf-error-rate", "abc"),
        ("warden.bf-initial-capacity", "0"),
        ("warden.bf-expansion", "0"),
        ("warden.bf-expansion", "40000"),
        ("warden.bf-max-memory", "10"),
    ] {
        assert!(
            err(&mut c, &["CONFIG", "SET", name, value]).starts_with("ERR"),
            "{name} {value}"
        );
    }
    let rate: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("warden.bf-error-rate")
        .query(&mut c)
        .unwrap();
    assert_eq!(rate[1], "0.001");
}

#[test]
fn configs_can_be_given_at_load_time() {
    let s = Server::start(&[
        "--warden.bf-initial-capacity",
        "777",
        "--warden.bf-expansion",
        "3",
    ]);
    let mut c = s.conn();
    run(&mut c, &["BF.ADD", "bf", "x"]).unwrap();
    assert_eq!(info_int(&mut c, "bf", "CAPACITY"), 777);
    assert_eq!(info_int(&mut c, "bf", "EXPANSION"), 3);
}

#[test]
fn the_replica_builds_the_same_filter_whatever_its_own_defaults() {
    let master = Server::start_tcp(&[]);
    let replica = Server::start_tcp(&[
        "--warden.bf-initial-capacity",
        "5",
        "--warden.bf-max-memory",
        "1024",
    ]);
    replicate(&master, &replica);
    let mut m = master.conn();
    fill(&mut m, "implicit", "x", 300);
    run(&mut m, &["BF.RESERVE", "big", "0.001", "200000"]).unwrap();
    fill(&mut m, "big", "y", 500);
    run(
        &mut m,
        &["BF.INSERT", "ins", "ERROR", "0.05", "ITEMS", "a", "b"],
    )
    .unwrap();
    sync_replicas(&mut m, 1);
    let mut r = replica.conn();
    for key in ["implicit", "big", "ins"] {
        assert_eq!(
            filter_state(&mut r, key),
            filter_state(&mut m, key),
            "{key}"
        );
    }
}

#[test]
fn configs_can_be_given_as_module_arguments() {
    // Words after the module path are its arguments: loadmodule <path> name value ...
    let s = Server::start(&["bf-initial-capacity", "555", "bf-error-rate", "0.05"]);
    let mut c = s.conn();
    run(&mut c, &["BF.ADD", "bf", "x"]).unwrap();
    assert_eq!(info_int(&mut c, "bf", "CAPACITY"), 555);
    let rate: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("warden.bf-error-rate")
        .query(&mut c)
        .unwrap();
    assert_eq!(rate[1], "0.05");
}
