//! INFO warden: counters that stay right on every path.

mod common;

use std::time::Duration;

use common::*;
use redis::Connection;

fn info(c: &mut Connection) -> std::collections::HashMap<String, i64> {
    let text: String = redis::cmd("INFO").arg("warden").query(c).unwrap();
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(k, v)| {
            Some((
                k.trim_start_matches("warden_").to_string(),
                v.trim().parse().ok()?,
            ))
        })
        .collect()
}

#[test]
fn info_warden_counts_keys_waiters_and_events_on_every_path() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let i = info(&mut c);
    assert_eq!(
        (
            i["lock_keys"],
            i["rwlock_keys"],
            i["bloom_filters"],
            i["waiting_clients"]
        ),
        (0, 0, 0, 0)
    );

    int(&mut c, &["LOCK.ACQUIRE", "a", "x", "60000"]);
    int(&mut c, &["LOCK.ACQUIRE", "b", "x", "30"]);
    run(&mut c, &["RWLOCK.READ", "rw", "x", "60000"]).unwrap();
    run(&mut c, &["BF.RESERVE", "bf", "0.01", "100"]).unwrap();
    let (_, w) = spawn_command(&s, &["LOCK.ACQUIRE", "a", "y", "60000", "WAIT", "0"]);
    wait_queued(&mut c, "LOCK.INFO", "a", 1);
    let i = info(&mut c);
    assert_eq!(
        (
            i["lock_keys"],
            i["rwlock_keys"],
            i["bloom_filters"],
            i["bloom_subfilters"],
            i["waiting_clients"]
        ),
        (2, 1, 1, 1, 1)
    );
    assert!(i["bloom_bytes"] > 0);
    assert_eq!(i["grants"], 3);

    // release hands off; a lease ends; a refusal; a timeout
    int(&mut c, &["LOCK.RELEASE", "a", "x"]);
    granted(w);
    wait_for("lease end", Duration::from_secs(5), || {
        int(&mut c, &["EXISTS", "b"]) == 0
    });
    assert_eq!(int(&mut c, &["LOCK.RELEASE", "a", "nobody"]), -1);
    let (_, t) = spawn_command(&s, &["LOCK.ACQUIRE", "a", "z", "60000", "WAIT", "50"]);
    assert_eq!(t.join().unwrap().unwrap(), redis::Value::Nil);
    let i = info(&mut c);
    assert_eq!(
        (
            i["lock_keys"],
            i["handoffs"],
            i["grants"],
            i["waiting_clients"]
        ),
        (1, 1, 4, 0)
    );
    assert_eq!(
        (
            i["lease_expiries"],
            i["refused_releases"],
            i["wait_timeouts"]
        ),
        (1, 1, 1)
    );

    // scaling a filter grows its bytes and sub-filters; a killed waiter leaves
    let before = info(&mut c)["bloom_bytes"];
    for n in 0..400 {
        run(&mut c, &["BF.ADD", "bf", &n.to_string()]).unwrap();
    }
    let i = info(&mut c);
    assert!(i["bloom_bytes"] > before);
    assert_eq!(i["bloom_subfilters"], 3);
    let size: Vec<i64> = redis::cmd("BF.INFO")
        .arg("bf")
        .arg("SIZE")
        .query(&mut c)
        .unwrap();
    assert_eq!(i["bloom_bytes"], size[0]);
    let (id, k) = spawn_command(&s, &["LOCK.ACQUIRE", "a", "k", "60000", "WAIT", "0"]);
    wait_queued(&mut c, "LOCK.INFO", "a", 1);
    int(&mut c, &["CLIENT", "KILL", "ID", &id.to_string()]);
    assert!(k.join().unwrap().is_err());
    wait_for("waiter gone", Duration::from_secs(5), || {
        info(&mut c)["waiting_clients"] == 0
    });

    // DEL, FLUSHALL, DEBUG RELOAD, COPY keep the levels right
    run(&mut c, &["COPY", "bf", "bf2"]).unwrap();
    assert_eq!(info(&mut c)["bloom_filters"], 2);
    run(&mut c, &["DEBUG", "RELOAD"]).unwrap();
    let i = info(&mut c);
    assert_eq!(
        (
            i["lock_keys"],
            i["rwlock_keys"],
            i["bloom_filters"],
            i["bloom_subfilters"]
        ),
        (1, 1, 2, 6)
    );
    run(&mut c, &["DEL", "rw"]).unwrap();
    assert_eq!(info(&mut c)["rwlock_keys"], 0);
    run(&mut c, &["FLUSHALL"]).unwrap();
    // Valkey flushes lazily by default (lazyfree-lazy-user-flush yes): large
    // values are freed on a background thread, a moment after the reply.
    wait_for("levels back to zero", Duration::from_secs(5), || {
        let i = info(&mut c);
        (
            i["lock_keys"],
            i["rwlock_keys"],
            i["bloom_filters"],
            i["bloom_bytes"],
            i["bloom_subfilters"],
        ) == (0, 0, 0, 0, 0)
    });
    let all: String = redis::cmd("INFO").arg("everything").query(&mut c).unwrap();
    assert!(all.contains("warden_lock_keys:0"));
}

#[test]
fn keyspace_events_announce_every_change() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["CONFIG", "SET", "notify-keyspace-events", "KEA"]).unwrap();
    let mut sub = s.conn();
    let mut pubsub = sub.as_pubsub();
    pubsub.psubscribe("__keyevent@0__:*").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();

    int(&mut c, &["LOCK.ACQUIRE", "l", "a", "60000"]);
    int(&mut c, &["LOCK.EXTEND", "l", "a", "60000"]);
    let (_, w) = spawn_command(&s, &["LOCK.ACQUIRE", "l", "b", "60000", "WAIT", "0"]);
    wait_queued(&mut c, "LOCK.INFO", "l", 1);
    int(&mut c, &["LOCK.RELEASE", "l", "a"]);
    granted(w);
    run(&mut c, &["RWLOCK.WRITE", "rw", "a", "60000"]).unwrap();
    run(&mut c, &["RWLOCK.EXTEND", "rw", "a", "60000"]).unwrap();
    run(&mut c, &["RWLOCK.UNLOCK", "rw", "a"]).unwrap();
    run(&mut c, &["RWLOCK.READ", "rw", "r", "60000"]).unwrap();
    run(&mut c, &["BF.RESERVE", "bf", "0.01", "100"]).unwrap();
    run(&mut c, &["BF.ADD", "bf", "x"]).unwrap();
    run(&mut c, &["DEL", "l"]).unwrap();
    int(&mut c, &["LOCK.ACQUIRE", "short", "a", "20"]);

    let expected = [
        ("lock.acquire", "l"),
        ("lock.extend", "l"),
        ("lock.release", "l"),
        ("lock.handoff", "l"),
        ("rwlock.write", "rw"),
        ("rwlock.extend", "rw"),
        ("rwlock.unlock", "rw"),
        ("rwlock.read", "rw"),
        ("bf.reserve", "bf"),
        ("bf.add", "bf"),
        ("del", "l"),
        ("lock.acquire", "short"),
        ("expired", "short"),
    ];
    let mut seen = Vec::new();
    while seen.len() < expected.len() {
        let msg = pubsub.get_message().expect("an event");
        let event = msg
            .get_channel_name()
            .rsplit(':')
            .next()
            .unwrap()
            .to_string();
        let key: String = msg.get_payload().unwrap();
        seen.push((event, key));
    }
    let seen: Vec<(&str, &str)> = seen.iter().map(|(e, k)| (e.as_str(), k.as_str())).collect();
    assert_eq!(seen, expected);
}

#[test]
fn command_docs_and_info_describe_every_command() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let commands = [
        "lock.acquire",
        "lock.release",
        "lock.extend",
        "lock.info",
        "rwlock.read",
        "rwlock.write",
        "rwlock.unlock",
        "rwlock.extend",
        "rwlock.info",
        "bf.reserve",
        "bf.add",
        "bf.madd",
        "bf.insert",
        "bf.exists",
        "bf.mexists",
        "bf.info",
        "bf.card",
        "bf.scandump",
        "bf.loadchunk",
        "warden.lockset",
        "warden.rwset",
        "warden.rwhold",
    ];
    for name in commands {
        let docs: redis::Value = redis::cmd("COMMAND")
            .arg("DOCS")
            .arg(name)
            .query(&mut c)
            .unwrap();
        let text = format!("{docs:?}");
        for field in [
            "summary",
            "since",
            "complexity",
            "group",
            "module",
            "arguments",
            "key",
        ] {
            assert!(text.contains(field), "{name}: no {field} in {text}");
        }
        let info: redis::Value = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(name)
            .query(&mut c)
            .unwrap();
        let text = format!("{info:?}");
        assert!(
            text.contains("begin_search") && text.contains("index"),
            "{name}: {text}"
        );
    }
    // redis-cli hints come from the argument docs
    let docs: redis::Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("lock.acquire")
        .query(&mut c)
        .unwrap();
    let text = format!("{docs:?}");
    assert!(
        text.contains("WAIT") && text.contains("optional") && text.contains("owner"),
        "{text}"
    );
}
