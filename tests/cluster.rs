//! Redis Cluster: routing, resharding with MIGRATE, failover.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use redis::{Commands, ConnectionLike, Value};

/// Every public command, on keys that share the hash tag `{order:42}`.
const COMMANDS: &[&[&str]] = &[
    &["LOCK.ACQUIRE", "{order:42}:lock", "o", "60000"],
    &["LOCK.EXTEND", "{order:42}:lock", "o", "60000"],
    &["LOCK.INFO", "{order:42}:lock"],
    &["LOCK.RELEASE", "{order:42}:lock", "o"],
    &["RWLOCK.READ", "{order:42}:rw", "o", "60000"],
    &["RWLOCK.EXTEND", "{order:42}:rw", "o", "60000"],
    &["RWLOCK.INFO", "{order:42}:rw"],
    &["RWLOCK.UNLOCK", "{order:42}:rw", "o"],
    &["RWLOCK.WRITE", "{order:42}:rw", "o", "60000"],
    &["SEM.ACQUIRE", "{order:42}:sem", "o", "60000", "LIMIT", "3"],
    &["SEM.EXTEND", "{order:42}:sem", "o", "60000"],
    &["SEM.SETLIMIT", "{order:42}:sem", "4"],
    &["SEM.INFO", "{order:42}:sem", "o"],
    &["SEM.RELEASE", "{order:42}:sem", "o"],
    &["BF.RESERVE", "{order:42}:bf", "0.01", "100"],
    &["BF.ADD", "{order:42}:bf", "a"],
    &["BF.MADD", "{order:42}:bf", "b", "c"],
    &["BF.INSERT", "{order:42}:bf", "ITEMS", "d"],
    &["BF.EXISTS", "{order:42}:bf", "a"],
    &["BF.MEXISTS", "{order:42}:bf", "a", "z"],
    &["BF.INFO", "{order:42}:bf"],
    &["BF.CARD", "{order:42}:bf"],
    &["BF.SCANDUMP", "{order:42}:bf", "0"],
];

fn command(words: &[&str]) -> redis::Cmd {
    let mut c = redis::cmd(words[0]);
    for w in &words[1..] {
        c.arg(*w);
    }
    c
}

#[test]
fn every_command_routes_like_a_builtin_and_survives_resharding() {
    let cluster = Cluster::start(3, 0);
    let client = cluster.client();
    let mut con = client.get_connection().unwrap();
    // the cluster client finds the key for every command
    for words in COMMANDS {
        let reply: Value = command(words)
            .query(&mut con)
            .unwrap_or_else(|e| panic!("{words:?}: {e}"));
        assert!(
            !matches!(reply, Value::ServerError(_)),
            "{words:?}: {reply:?}"
        );
    }
    // another master answers MOVED; COMMAND GETKEYS names the key
    let elsewhere = cluster.other_master("{order:42}:lock");
    let mut direct = elsewhere.conn();
    for words in COMMANDS {
        let e = command(words).query::<Value>(&mut direct).unwrap_err();
        assert_eq!(e.code(), Some("MOVED"), "{words:?}");
        let keys: Vec<String> = redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg(*words)
            .query(&mut direct)
            .unwrap();
        assert_eq!(keys, [words[1]], "{words:?}");
    }
    // redis-cli -c follows the redirection
    let out = Command::new("redis-cli")
        .args([
            "-c",
            "-p",
            &elsewhere.port.unwrap().to_string(),
            "LOCK.ACQUIRE",
            "{order:42}:cli",
            "me",
            "1000",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.trim().parse::<i64>().is_ok_and(|f| f > 0), "{text}");

    // Reshard the slot holding a lock, a read-write lock and a filter.
    let keys = ["{mv}:lock", "{mv}:rw", "{mv}:sem", "{mv}:bf"];
    // Far above the other masters' counters (about a year of clock ahead).
    let planted = plant_fence(&mut cluster.master_of("{mv}:lock").conn(), 1 << 38);
    let high_fence = planted;
    let _: () = con.pexpire("{mv}:lock", 60_000).unwrap();
    con.req_command(&command(&["RWLOCK.READ", "{mv}:rw", "r1", "60000"]))
        .unwrap();
    con.req_command(&command(&["RWLOCK.READ", "{mv}:rw", "r2", "30000"]))
        .unwrap();
    for (owner, permits) in [("s1", "2"), ("s2", "1")] {
        con.req_command(&command(&[
            "SEM.ACQUIRE",
            "{mv}:sem",
            owner,
            "60000",
            "LIMIT",
            "5",
            "PERMITS",
            permits,
        ]))
        .unwrap();
    }
    con.req_command(&command(&["BF.RESERVE", "{mv}:bf", "0.01", "100"]))
        .unwrap();
    for i in 0..300 {
        con.req_command(&command(&["BF.ADD", "{mv}:bf", &i.to_string()]))
            .unwrap();
    }
    let before: Vec<Value> = keys.iter().map(|k| describe(&mut con, k)).collect();
    let source = cluster.master_of("{mv}:lock");
    let target = cluster.other_master("{mv}:lock");
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg("{mv}:lock")
        .query(&mut source.conn())
        .unwrap();
    let (source_id, target_id) = (node_id(source), node_id(target));
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("IMPORTING")
        .arg(&source_id)
        .query(&mut target.conn())
        .unwrap();
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("MIGRATING")
        .arg(&target_id)
        .query(&mut source.conn())
        .unwrap();
    let _: () = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(target.port.unwrap())
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(&keys[..])
        .query(&mut source.conn())
        .unwrap();
    for node in &cluster.nodes {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("NODE")
            .arg(&target_id)
            .query(&mut node.conn())
            .unwrap();
    }
    assert_eq!(cluster.master_of("{mv}:lock").port, target.port);
    let mut con = client.get_connection().unwrap();
    let after: Vec<Value> = keys.iter().map(|k| describe(&mut con, k)).collect();
    assert_eq!(after, before);
    let ttl: i64 = con.pttl("{mv}:lock").unwrap();
    assert!(ttl > 50_000, "the lease travels: {ttl}");
    // the target's counter was raised past the fence it received
    let fence: i64 = command(&["LOCK.ACQUIRE", "{mv}:new", "bob", "1000"])
        .query(&mut con)
        .unwrap();
    assert!(fence as u64 > high_fence, "{fence}");
}

/// Everything the commands tell about a key, minus the ticking ttl.
fn describe(con: &mut redis::cluster::ClusterConnection, key: &str) -> Value {
    let words: Vec<&str> = if key.ends_with("lock") {
        vec!["LOCK.INFO", key]
    } else if key.ends_with("rw") {
        vec!["RWLOCK.INFO", key]
    } else if key.ends_with("sem") {
        vec!["SEM.INFO", key, "s1"]
    } else {
        vec!["BF.INFO", key]
    };
    match command(&words).query(con).unwrap() {
        Value::Array(items) => Value::Array(
            items
                .chunks(2)
                .filter(|kv| kv[0] != Value::BulkString(b"ttl".to_vec()))
                .flat_map(|kv| kv.to_vec())
                .collect(),
        ),
        other => other,
    }
}

#[test]
fn failover_keeps_acknowledged_locks_and_fences_keep_rising() {
    let cluster = Cluster::start(3, 1);
    let client = cluster.client();
    let mut con = client.get_connection().unwrap();
    let fence: i64 = command(&["LOCK.ACQUIRE", "{f}:lock", "alice", "60000"])
        .query(&mut con)
        .unwrap();
    con.req_command(&command(&["RWLOCK.READ", "{f}:rw", "r", "60000"]))
        .unwrap();
    for i in 0..50 {
        con.req_command(&command(&["BF.ADD", "{f}:bf", &i.to_string()]))
            .unwrap();
    }
    let master = cluster.master_of("{f}:lock");
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query(&mut master.conn())
        .unwrap();
    assert_eq!(acked, 1, "a replica acknowledged the grant");
    let master_id = node_id(master);
    let replica = cluster
        .nodes
        .iter()
        .find(|n| {
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut n.conn())
                .unwrap();
            let myid = node_id(n);
            nodes
                .lines()
                .any(|l| l.starts_with(&myid) && l.contains(&master_id) && l.contains("slave"))
        })
        .expect("the master's replica");
    // The master must know this node as its replica before it answers a manual failover.
    let replica_id = node_id(replica);
    wait_for(
        "the master sees its replica",
        Duration::from_secs(30),
        || {
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut master.conn())
                .unwrap();
            nodes.lines().any(|l| {
                l.starts_with(&replica_id) && l.contains("slave") && l.contains(&master_id)
            })
        },
    );
    // A manual failover gives up after 5 s on a busy machine: ask again, and in
    // the end without the master's handshake (still an election).
    let promoted = (0..4).any(|attempt| {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("FAILOVER");
        if attempt == 3 {
            cmd.arg("FORCE");
        }
        let _: () = cmd.query(&mut replica.conn()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(8);
        while std::time::Instant::now() < deadline {
            if is_master(replica) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    });
    assert!(promoted, "the replica was not promoted:\n{}", replica.log());
    cluster.wait_ok();
    let mut con = cluster.client().get_connection().unwrap();
    let info: Vec<Value> = command(&["LOCK.INFO", "{f}:lock"]).query(&mut con).unwrap();
    assert_eq!(info[1], Value::BulkString(b"alice".to_vec()));
    assert_eq!(info[7], Value::Int(fence));
    let next: i64 = command(&["LOCK.ACQUIRE", "{f}:other", "bob", "1000"])
        .query(&mut con)
        .unwrap();
    assert!(next > fence);
    let rw: Vec<Value> = command(&["RWLOCK.INFO", "{f}:rw"]).query(&mut con).unwrap();
    assert_eq!(rw[5], Value::Int(1), "one reader: {rw:?}");
    let card: i64 = command(&["BF.CARD", "{f}:bf"]).query(&mut con).unwrap();
    assert!(card > 45);
    let mut probe = redis::cmd("BF.MEXISTS");
    probe.arg("{f}:bf");
    for i in 0..50 {
        probe.arg(i.to_string());
    }
    let found: Vec<i64> = probe.query(&mut con).unwrap();
    assert!(found.iter().all(|&f| f == 1));
}

/// Makes `{mv}:lock` a lock of alice (2 holds) whose token is `lead` above
/// the one it was granted, through a re-signed DUMP payload (clients cannot
/// send effect commands); returns the planted token.
fn plant_fence(c: &mut redis::Connection, lead: u64) -> u64 {
    let old: u64 = redis::cmd("LOCK.ACQUIRE")
        .arg("{mv}:lock")
        .arg("alice")
        .arg(60_000)
        .query(c)
        .unwrap();
    let _: u64 = redis::cmd("LOCK.ACQUIRE")
        .arg("{mv}:lock")
        .arg("alice")
        .arg(60_000)
        .query(c)
        .unwrap();
    let dump: Vec<u8> = redis::cmd("DUMP").arg("{mv}:lock").query(c).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("{mv}:lock")
        .arg(60_000)
        .arg(dump_with_fence(&dump, old, old + lead))
        .arg("REPLACE")
        .query(c)
        .unwrap();
    lock_state(c, "{mv}:lock").unwrap().2 as u64
}

/// Whether the server has atomic slot migration (`CLUSTER MIGRATESLOTS`,
/// Valkey 9+); says so when it does not.
fn has_atomic_migration(c: &mut redis::Connection) -> bool {
    let info: Vec<Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("CLUSTER|MIGRATESLOTS")
        .query(c)
        .unwrap();
    let found = info.first().is_some_and(|v| !matches!(v, Value::Nil));
    if !found {
        println!(
            "skipped: this server has no CLUSTER MIGRATESLOTS (atomic slot migration is Valkey 9+)"
        );
    }
    found
}

/// The state of the export of `source`'s latest slot migration.
fn migration_state(source: &Server) -> String {
    let jobs: Vec<Value> = redis::cmd("CLUSTER")
        .arg("GETSLOTMIGRATIONS")
        .query(&mut source.conn())
        .unwrap();
    let fields = match jobs.first() {
        Some(Value::Array(f)) => f.clone(),
        Some(Value::Map(m)) => m.iter().flat_map(|(k, v)| [k.clone(), v.clone()]).collect(),
        other => panic!("no migration: {other:?}"),
    };
    let at = fields
        .iter()
        .position(|f| reply_text(f) == "state")
        .expect("a state field");
    reply_text(&fields[at + 1])
}

/// `CLUSTER MIGRATESLOTS` of one slot with every kind in it: holders, tokens,
/// limits and filter bits arrive whole; a hand-off made while the slot
/// streams arrives too; waiters still queued when the slot leaves are
/// answered `MOVED` to the new owner (never granted on the old one); a
/// cache lease from the old owner fills nothing anywhere.
#[test]
fn atomic_slot_migration_keeps_every_kind_and_redirects_waiters() {
    let cluster = Cluster::start(3, 0);
    let key = |kind: &str| format!("{{asm}}:{kind}");
    let source = cluster.master_of(&key("lock"));
    let target = cluster.other_master(&key("lock"));
    let mut src = source.conn();
    if !has_atomic_migration(&mut src) {
        return;
    }
    let mut tgt = target.conn();
    let slot = int(&mut src, &["CLUSTER", "KEYSLOT", &key("lock")]);
    let endpoint = format!("127.0.0.1:{}", target.port.unwrap());

    let held = int(&mut src, &["LOCK.ACQUIRE", &key("lock"), "A", "60000"]);
    int(&mut src, &["LOCK.ACQUIRE", &key("handoff"), "A2", "60000"]);
    let reader = int(&mut src, &["RWLOCK.READ", &key("rw"), "r1", "60000"]);
    for owner in ["s1", "s2"] {
        int(
            &mut src,
            &["SEM.ACQUIRE", &key("sem"), owner, "60000", "LIMIT", "2"],
        );
    }
    run(&mut src, &["BF.RESERVE", &key("bf"), "0.01", "1000"]).unwrap();
    for i in 0..300 {
        int(&mut src, &["BF.ADD", &key("bf"), &format!("item-{i}")]);
    }
    let mut holder = source.conn();
    let lease: Vec<Value> = redis::cmd("CACHE.GET")
        .arg(key("cache"))
        .arg(30_000)
        .query(&mut holder)
        .unwrap();
    let Value::Int(lease) = lease[1] else {
        panic!("no lease: {lease:?}")
    };

    let wait = ["60000", "WAIT", "30000"];
    let waiting = |words: &[&str]| spawn_command(source, &[words, &wait[..]].concat()).1;
    let handoff = waiting(&["LOCK.ACQUIRE", &key("handoff"), "B2"]);
    let waiters = [
        (
            "LOCK.INFO",
            key("lock"),
            waiting(&["LOCK.ACQUIRE", &key("lock"), "B"]),
        ),
        (
            "RWLOCK.INFO",
            key("rw"),
            waiting(&["RWLOCK.WRITE", &key("rw"), "W"]),
        ),
        (
            "SEM.INFO",
            key("sem"),
            spawn_command(
                source,
                &[
                    "SEM.ACQUIRE",
                    &key("sem"),
                    "s3",
                    "60000",
                    "LIMIT",
                    "2",
                    "WAIT",
                    "30000",
                ],
            )
            .1,
        ),
        (
            "CACHE.INFO",
            key("cache"),
            spawn_command(
                source,
                &["CACHE.GET", &key("cache"), "30000", "WAIT", "30000"],
            )
            .1,
        ),
    ];
    for (info, k, _) in &waiters {
        wait_queued(&mut src, info, k, 1);
    }
    wait_queued(&mut src, "LOCK.INFO", &key("handoff"), 1);
    let filter_before = scandump(&mut src, &key("bf"));

    // Held in the streaming phase: what happens now must reach the target.
    run(&mut src, &["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "1"]).unwrap();
    let s = slot.to_string();
    run(
        &mut src,
        &[
            "CLUSTER",
            "MIGRATESLOTS",
            "SLOTSRANGE",
            &s,
            &s,
            "NODE",
            &node_id(target),
        ],
    )
    .unwrap_or_else(|e| panic!("MIGRATESLOTS refused: {}", error_text(&e)));
    wait_for("the slot streaming", Duration::from_secs(20), || {
        ["waiting-to-pause", "replicating"].contains(&migration_state(source).as_str())
    });
    assert_eq!(int(&mut src, &["LOCK.RELEASE", &key("handoff"), "A2"]), 1);
    let handed = granted(handoff);
    run(&mut src, &["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "0"]).unwrap();
    wait_for("the migration", Duration::from_secs(20), || {
        migration_state(source) == "success"
    });

    // Waiters queued when the slot left: MOVED to the target, at once.
    for (info, k, pending) in waiters {
        let e = pending.join().unwrap().expect_err(info);
        assert_eq!(e.code(), Some("MOVED"), "{info} {k}: {}", error_text(&e));
        assert_eq!(error_text(&e), format!("MOVED {slot} {endpoint}"), "{info}");
    }
    // Nothing was granted on the old owner: it keeps no key of the slot.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(int(&mut src, &["CLUSTER", "COUNTKEYSINSLOT", &s]), 0);
    assert_eq!(warden_stat(&mut src, "waiting_clients"), 0);

    // The target holds each key as the source left it.
    assert_eq!(
        lock_state(&mut tgt, &key("lock")),
        Some(("A".to_string(), 1, held))
    );
    assert_eq!(
        lock_state(&mut tgt, &key("handoff")),
        Some(("B2".to_string(), 1, handed))
    );
    let rw = map(&mut tgt, &["RWLOCK.INFO", &key("rw")]);
    assert_eq!(field_str(&rw, "mode"), "read");
    assert_eq!(field_int(&rw, "fence"), reader);
    let sem = map(&mut tgt, &["SEM.INFO", &key("sem")]);
    assert_eq!((field_int(&sem, "limit"), field_int(&sem, "used")), (2, 2));
    assert!(is_nil(
        &mut tgt,
        &["SEM.ACQUIRE", &key("sem"), "s4", "60000", "LIMIT", "2"]
    ));
    assert_eq!(scandump(&mut tgt, &key("bf")), filter_before);
    assert_eq!(int(&mut tgt, &["BF.CARD", &key("bf")]), 300);

    // Tokens go on rising for the key on its new node.
    assert_eq!(int(&mut tgt, &["LOCK.RELEASE", &key("lock"), "A"]), 1);
    let next = int(&mut tgt, &["LOCK.ACQUIRE", &key("lock"), "C", "60000"]);
    assert!(
        next > held && next > handed,
        "{next} after {held}, {handed}"
    );

    // The old lease fills nothing: refused by the new owner, MOVED by the old.
    let lease = lease.to_string();
    let fill = ["CACHE.FILL", &key("cache"), lease.as_str(), "stale"];
    assert_eq!(int(&mut tgt, &fill), 0);
    assert_eq!(run(&mut holder, &fill).unwrap_err().code(), Some("MOVED"));
    assert!(is_nil(&mut tgt, &["GET", &key("cache")]));
}
