//! Upgrading (`docs/upgrading.md`), tested across the previous release and
//! this one: replication both ways (old master -> new replica, new master
//! -> old replica), RDB files and AOF both ways, with a key of each type.
//!
//! The previous release's module comes from `WARDEN_PREV_MODULE`, or from
//! `target/prev-release/target/release/libwarden.so`, which `make
//! upgrade-test` builds; without it every test here says so and passes.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use redis::{Connection, Value};

/// The previous release's module, if built.
fn prev_module() -> Option<PathBuf> {
    // A path given on purpose must be there: a missing build is a failure,
    // not a skip. Only the default place may be absent (never built).
    if let Some(given) = std::env::var_os("WARDEN_PREV_MODULE").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(given);
        assert!(
            path.exists(),
            "WARDEN_PREV_MODULE={} does not exist",
            path.display()
        );
        return Some(path);
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/prev-release/target/release/libwarden.so");
    if path.exists() {
        Some(path)
    } else {
        eprintln!(
            "SKIPPED: the previous release's module is not built at {} \
             (`make upgrade-test` builds it, or set WARDEN_PREV_MODULE)",
            path.display()
        );
        None
    }
}

/// A port of 7700-7799 that nothing listens on, each handed out once.
fn port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    for _ in 0..100 {
        let p = 7700 + NEXT.fetch_add(1, Ordering::Relaxed) % 100;
        if std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
    panic!("no free port in 7700-7799");
}

/// A server with one release's module, listening on a TCP port too.
struct Node {
    server: Plain,
    port: u16,
}

impl Node {
    fn start(module_path: &Path, extra: &[&str]) -> Self {
        let port = port();
        let p = port.to_string();
        let mut args = vec!["--port", &p, "--repl-diskless-sync-delay", "0"];
        args.extend_from_slice(extra);
        let mut server = Plain::start_with(&args, &[module(module_path.to_path_buf(), &[])]);
        assert!(server.runs(), "{}", server.log());
        Self { server, port }
    }

    /// A server on a copy of `dir`'s data files (RDB, AOF directory); `None`
    /// when it refuses them (it exited).
    fn start_on(module_path: &Path, dir: &Path, aof: bool) -> (Plain, tempfile::TempDir) {
        let copy = copy_data(dir);
        let d = copy.path().display().to_string();
        let appendonly = if aof { "yes" } else { "no" };
        let server = Plain::start_with(
            &["--dir", &d, "--appendonly", appendonly],
            &[module(module_path.to_path_buf(), &[])],
        );
        (server, copy)
    }

    fn conn(&mut self) -> Connection {
        self.server.conn()
    }

    fn log(&self) -> String {
        self.server.log()
    }

    fn replicate_from(&mut self, master: &Node) {
        let mut c = self.conn();
        run(
            &mut c,
            &["REPLICAOF", "127.0.0.1", &master.port.to_string()],
        )
        .unwrap();
    }

    fn link_up(&mut self) -> bool {
        let mut c = self.conn();
        let info: String = redis::cmd("INFO").arg("replication").query(&mut c).unwrap();
        info.contains("master_link_status:up")
    }
}

fn copy_data(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let name = entry.file_name();
        if name == "dump.rdb" {
            std::fs::copy(entry.path(), to.path().join(&name)).unwrap();
        } else if name == "appendonlydir" {
            std::fs::create_dir(to.path().join(&name)).unwrap();
            for file in std::fs::read_dir(entry.path()).unwrap().flatten() {
                std::fs::copy(file.path(), to.path().join(&name).join(file.file_name())).unwrap();
            }
        }
    }
    to
}

/// The keys of every type both releases have, and a cache value.
fn keys_of_both(c: &mut Connection) {
    run(c, &["LOCK.ACQUIRE", "lock", "a", "30000"]).unwrap();
    run(c, &["RWLOCK.READ", "rw", "a", "30000"]).unwrap();
    run(c, &["BF.ADD", "filter", "alice"]).unwrap();
    let Ok(Value::Array(reply)) = run(c, &["CACHE.GET", "cached", "5000"]) else {
        panic!("CACHE.GET");
    };
    let lease = reply_text(&reply[1]);
    run(c, &["CACHE.FILL", "cached", &lease, "v1", "PX", "600000"]).unwrap();
    run(c, &["SET", "plain", "p1"]).unwrap();
}

/// Later changes to those keys (what the replication stream carries): a
/// lock released and another taken, a second reader on the read-write lock,
/// a write lock, a filter item, a cache refill.
fn change_both(c: &mut Connection) {
    assert_eq!(int(c, &["LOCK.RELEASE", "lock", "a"]), 1);
    run(c, &["LOCK.ACQUIRE", "lock", "b", "30000"]).unwrap();
    run(c, &["RWLOCK.READ", "rw", "b", "30000"]).unwrap();
    run(c, &["RWLOCK.WRITE", "rw2", "w", "30000"]).unwrap();
    run(c, &["BF.ADD", "filter", "bob"]).unwrap();
    run(c, &["CACHE.INVALIDATE", "cached"]).unwrap();
    let Ok(Value::Array(reply)) = run(c, &["CACHE.GET", "cached", "5000"]) else {
        panic!("CACHE.GET");
    };
    let lease = reply_text(&reply[1]);
    run(c, &["CACHE.FILL", "cached", &lease, "v2", "PX", "600000"]).unwrap();
}

const KEYS: [&str; 6] = ["lock", "rw", "rw2", "filter", "cached", "plain"];

/// What a key holds, as both releases answer it (ttls left out: they move).
fn state(c: &mut Connection, key: &str) -> String {
    let ty = reply_text(&run(c, &["TYPE", key]).unwrap());
    let info = |c: &mut Connection, cmd: &str| -> String {
        let fields = maybe_map(c, &[cmd, key]).unwrap_or_default();
        let kept: Vec<String> = fields
            .into_iter()
            .filter(|(k, _)| !k.contains("ttl"))
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect();
        kept.join(" ")
    };
    let detail = match ty.as_str() {
        "warden-lk" => info(c, "LOCK.INFO"),
        "warden-rw" => info(c, "RWLOCK.INFO"),
        "warden-sm" => info(c, "SEM.INFO"),
        "warden-bf" => ["alice", "bob", "carol"]
            .iter()
            .map(|item| int(c, &["BF.EXISTS", key, item]).to_string())
            .collect::<Vec<_>>()
            .join(","),
        "string" => reply_text(&run(c, &["GET", key]).unwrap()),
        _ => String::new(),
    };
    format!("{key}: {ty} {detail}")
}

fn states(c: &mut Connection, keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| state(c, k)).collect()
}

fn semaphore(c: &mut Connection, owner: &str) {
    run(c, &["SEM.ACQUIRE", "slots", owner, "30000", "LIMIT", "3"]).unwrap();
}

/// The old release's master feeds a new replica: the full sync (the old
/// RDB) and every effect the old master sends are applied.
#[test]
fn old_master_feeds_a_new_replica() {
    let Some(prev) = prev_module() else { return };
    let mut master = Node::start(&prev, &[]);
    let mut replica = Node::start(&module_path(), &[]);
    let mut m = master.conn();
    keys_of_both(&mut m);
    replica.replicate_from(&master);
    wait_for("replica link", Duration::from_secs(20), || {
        replica.link_up()
    });
    change_both(&mut m);
    sync_replicas(&mut m, 1);
    let mut r = replica.conn();
    assert_eq!(states(&mut r, &KEYS), states(&mut m, &KEYS));
    assert!(
        !replica.log().contains("sending an error to its"),
        "{}",
        replica.log()
    );
}

/// A new master feeding an old replica: the full sync loads while no
/// semaphore exists, but the effects only the new release sends
/// (`WARDEN.RWHOLD`, `WARDEN.SEMSET`) are unknown commands there: the old
/// replica logs them and keeps its stale read-write lock and no semaphore
/// — it diverges without refusing the link. A full sync with a semaphore
/// stops the old replica.
#[test]
fn new_master_diverges_an_old_replica() {
    let Some(prev) = prev_module() else { return };
    let mut master = Node::start(&module_path(), &[]);
    let mut replica = Node::start(&prev, &[]);
    let mut m = master.conn();
    keys_of_both(&mut m);
    replica.replicate_from(&master);
    wait_for("replica link", Duration::from_secs(20), || {
        replica.link_up()
    });
    let mut r = replica.conn();
    assert_eq!(
        states(&mut r, &KEYS),
        states(&mut m, &KEYS),
        "after the sync"
    );

    change_both(&mut m);
    semaphore(&mut m, "a");
    sync_replicas(&mut m, 1);
    assert!(replica.link_up(), "the link stays up");
    // What both releases replicate alike arrives...
    for key in ["lock", "rw2", "filter", "cached", "plain"] {
        assert_eq!(state(&mut r, key), state(&mut m, key));
    }
    // ... but the second reader (`WARDEN.RWHOLD`) and the semaphore
    // (`WARDEN.SEMSET`) do not.
    eprintln!(
        "master {}\nold replica {}",
        state(&mut m, "rw"),
        state(&mut r, "rw")
    );
    assert_ne!(state(&mut r, "rw"), state(&mut m, "rw"));
    assert_eq!(int(&mut r, &["EXISTS", "slots"]), 0);
    let log = replica.log();
    for cmd in ["WARDEN.RWHOLD", "WARDEN.SEMSET"] {
        assert!(
            log.lines()
                .any(|l| l.contains("This replica is sending an error to its") && l.contains(cmd)),
            "{cmd}:\n{log}"
        );
    }

    // A full sync that carries a semaphore: the old replica cannot load it.
    let mut late = Node::start(&prev, &[]);
    late.replicate_from(&master);
    wait_for(
        "the old replica to refuse the RDB",
        Duration::from_secs(20),
        || late.log().contains("no matching module type 'warden-sm'"),
    );
    assert!(late.server.exited(), "{}", late.log());
}

/// An RDB, and an AOF, the old release wrote load in the new one, every
/// key as it was.
#[test]
fn old_rdb_and_aof_load_in_the_new_release() {
    let Some(prev) = prev_module() else { return };
    for aof in [false, true] {
        // The directory is copied while the old server runs: with the
        // default `everysec`, a server whose last fsync is still running
        // (a busy disk) answers writes before it writes them to the file.
        let extra: &[&str] = if aof {
            &["--appendonly", "yes", "--appendfsync", "always"]
        } else {
            &[]
        };
        let mut old = Node::start(&prev, extra);
        let mut c = old.conn();
        keys_of_both(&mut c);
        change_both(&mut c);
        let before = states(&mut c, &KEYS);
        if !aof {
            redis::cmd("SAVE").query::<()>(&mut c).unwrap();
        }
        let (mut new, _copy) = Node::start_on(&module_path(), old.server.dir.path(), aof);
        assert!(new.runs(), "{}", new.log());
        assert_eq!(states(&mut new.conn(), &KEYS), before, "aof: {aof}");
    }
}

/// An RDB the new release saved loads in the old one while it holds no
/// semaphore; with one, the old release refuses to start on it.
#[test]
fn new_rdb_loads_in_the_old_release_without_semaphores() {
    let Some(prev) = prev_module() else { return };
    let mut new = Node::start(&module_path(), &[]);
    let mut c = new.conn();
    keys_of_both(&mut c);
    change_both(&mut c);
    let before = states(&mut c, &KEYS);
    redis::cmd("SAVE").query::<()>(&mut c).unwrap();
    let (mut old, _copy) = Node::start_on(&prev, new.server.dir.path(), false);
    assert!(old.runs(), "{}", old.log());
    assert_eq!(states(&mut old.conn(), &KEYS), before);

    // `DUMP` payloads (and so `MIGRATE`) too: every type but the semaphore.
    let mut o = old.conn();
    semaphore(&mut c, "a");
    for key in ["lock", "rw", "filter", "slots"] {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut c).unwrap();
        let copy = format!("{key}:copy");
        let restored = redis::cmd("RESTORE")
            .arg(&copy)
            .arg(0)
            .arg(dump)
            .query::<()>(&mut o);
        match key {
            "slots" => assert_eq!(error_text(&restored.unwrap_err()), "ERR Bad data format"),
            _ => assert_eq!(
                reply_text(&run(&mut o, &["TYPE", &copy]).unwrap()),
                reply_text(&run(&mut c, &["TYPE", key]).unwrap())
            ),
        }
    }

    redis::cmd("SAVE").query::<()>(&mut c).unwrap();
    let (mut refused, _copy) = Node::start_on(&prev, new.server.dir.path(), false);
    assert!(!refused.runs(), "the old release loaded a semaphore");
    assert!(
        refused
            .log()
            .contains("no matching module type 'warden-sm'"),
        "{}",
        refused.log()
    );
}

/// An AOF the new release wrote: the old release refuses the
/// `WARDEN.RWHOLD` its incremental file holds (and stops); once the AOF is
/// rewritten (its base an RDB, its increment empty) it loads.
#[test]
fn new_aof_loads_in_the_old_release_once_rewritten() {
    let Some(prev) = prev_module() else { return };
    // The directory is copied while the server runs: `always`, as above.
    let mut new = Node::start(
        &module_path(),
        &["--appendonly", "yes", "--appendfsync", "always"],
    );
    let mut c = new.conn();
    keys_of_both(&mut c);
    rewrite_aof(&mut c);
    change_both(&mut c);
    let before = states(&mut c, &KEYS);
    let (mut refused, _copy) = Node::start_on(&prev, new.server.dir.path(), true);
    assert!(!refused.runs(), "the old release loaded WARDEN.RWHOLD");
    assert!(refused.log().contains("WARDEN.RWHOLD"), "{}", refused.log());
    rewrite_aof(&mut c);
    let (mut old, _copy) = Node::start_on(&prev, new.server.dir.path(), true);
    assert!(old.runs(), "{}", old.log());
    assert_eq!(states(&mut old.conn(), &KEYS), before);
}
