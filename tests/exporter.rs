//! warden's metrics in Prometheus: Debian's `prometheus-redis-exporter` with
//! `scripts/warden-metrics.lua` against a real server, and `docs/metrics.md`
//! against the fields `INFO warden` prints.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::wire::{Reply, Wire};
use common::*;
use redis::Connection;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/warden-metrics.lua");
const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md");

/// Fields that move by themselves while nothing else happens: the module's
/// allocation total grows with every `INFO` (the exporter's included).
const MOVING: &[&str] = &["warden_module_allocated_total"];

/// Fields the traffic below may leave at zero, and why (every other one must
/// move, so that the values compared are not all zeros).
const MAY_BE_ZERO: &[&str] = &[
    // A limiter's key lives until its bucket refills: the traffic's are
    // gone by the scrape (tests/rate.rs counts them).
    "warden_rate_limiters",
    // The grace window of the start is over before the traffic begins.
    "warden_grace_remaining_ms",
    // The reaper's longest batch may take less than a microsecond.
    "warden_cache_max_batch_us",
    // Grants wait for replicas only with warden.sync-replicas, on a master
    // with replicas (tests/sync_replicas.rs): none here.
    "warden_sync_waiting",
    "warden_sync_acked",
    "warden_sync_timeouts",
    "warden_sync_getacks",
    // Only a transaction the server refused while leases exist moves it
    // (tests/refused.rs): none here.
    "warden_cache_filter_nothing_ran",
];

// ---- the exporter ----

/// The exporter binary: `WARDEN_REDIS_EXPORTER`, else Debian's (which `make
/// deps` installs).
fn exporter_binary() -> String {
    std::env::var("WARDEN_REDIS_EXPORTER").unwrap_or_else(|_| "prometheus-redis-exporter".into())
}

/// A running exporter for one server, with the script.
struct Exporter {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Exporter {
    fn start(redis_port: u16) -> Self {
        Self::start_with(redis_port, &[])
    }

    /// With more command-line arguments.
    fn start_with(redis_port: u16, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("exporter.log")).unwrap();
        let child = Command::new(exporter_binary())
            .args([
                "--redis.addr",
                &format!("redis://127.0.0.1:{redis_port}"),
                "--script",
                SCRIPT,
                "--web.listen-address",
                &format!("127.0.0.1:{port}"),
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} ({e}): `make deps` installs it \
                     (apt-get install prometheus-redis-exporter)",
                    exporter_binary()
                )
            });
        let mut exporter = Self { child, port, dir };
        wait_for("the exporter to listen", Duration::from_secs(20), || {
            if let Ok(Some(status)) = exporter.child.try_wait() {
                panic!("the exporter exited ({status}):\n{}", exporter.log());
            }
            http_get(port, "/").is_ok()
        });
        exporter
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("exporter.log")).unwrap_or_default()
    }

    /// One scrape of `/metrics` (the exporter reads the server on each).
    fn scrape(&self) -> Vec<Sample> {
        let body = http_get(self.port, "/metrics").unwrap_or_else(|e| panic!("scrape: {e}"));
        parse_exposition(&body)
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- exporter log ----\n{}", self.log());
        }
    }
}

/// The body of `GET path` (HTTP/1.0: the server closes when done); an error
/// unless the status is 200.
fn http_get(port: u16, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| e.to_string())?;
    let mut response = String::new();
    s.read_to_string(&mut response).map_err(|e| e.to_string())?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP header in {response:?}"))?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200 ") {
        return Err(format!("{status}\n{body}"));
    }
    Ok(body.to_string())
}

/// One series of the Prometheus text format.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

impl Sample {
    fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The samples of a text-format page: `name{label="value",...} value`, label
/// values with the format's escapes (`\\`, `\"`, `\n`).
fn parse_exposition(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| parse_sample(l).unwrap_or_else(|| panic!("unreadable line: {l:?}")))
        .collect()
}

fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    let mut labels = Vec::new();
    let mut chars = line[name_end..].chars().peekable();
    if chars.peek() == Some(&'{') {
        chars.next();
        loop {
            match chars.next()? {
                '}' => break,
                ',' => continue,
                first => {
                    let mut label = first.to_string();
                    for c in chars.by_ref() {
                        if c == '=' {
                            break;
                        }
                        label.push(c);
                    }
                    if chars.next()? != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next()? {
                            '"' => break,
                            '\\' => match chars.next()? {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            other => value.push(other),
                        }
                    }
                    labels.push((label, value));
                }
            }
        }
    }
    let rest: String = chars.collect();
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// What the script returned: `redis_script_values{key="<name>"}` as name → value.
fn script_values(samples: &[Sample]) -> BTreeMap<String, f64> {
    samples
        .iter()
        .filter(|s| s.name == "redis_script_values")
        .map(|s| (s.label("key").expect("a key label").to_string(), s.value))
        .collect()
}

fn redis_up(samples: &[Sample]) -> f64 {
    samples
        .iter()
        .find(|s| s.name == "redis_up")
        .expect("redis_up in the scrape")
        .value
}

// ---- INFO warden, and what the script must make of it ----

/// The fields of `INFO warden`, in order, as name and value text.
fn info_fields(c: &mut Connection) -> Vec<(String, String)> {
    let text: String = redis::cmd("INFO").arg("warden").query(c).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

/// The shape of an INFO value.
enum Shape {
    Number(f64),
    /// `k=v,k=v` with numeric values (a histogram when the keys are `le_*`).
    Dict(Vec<(String, f64)>),
    Text,
}

fn shape(value: &str) -> Shape {
    if let Ok(n) = value.parse::<f64>() {
        return Shape::Number(n);
    }
    let pairs: Option<Vec<(String, f64)>> = value
        .split(',')
        .map(|item| {
            let (k, v) = item.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect();
    match pairs {
        Some(p) if !value.is_empty() => Shape::Dict(p),
        _ => Shape::Text,
    }
}

/// The series (script names) one INFO field stands for, with their values:
/// `name`; a dict's `name_bucket{le="X"}` (`le_X`, `le_inf` as `+Inf`) and
/// `name_<key>`; a text's `name_info{<name without warden_>="text"}` = 1.
fn series_of(name: &str, value: &str) -> Vec<(String, f64)> {
    match shape(value) {
        Shape::Number(n) => vec![(name.to_string(), n)],
        Shape::Dict(pairs) => pairs
            .into_iter()
            .map(|(k, v)| match k.strip_prefix("le_") {
                Some("inf") => (format!("{name}_bucket{{le=\"+Inf\"}}"), v),
                Some(le) => (format!("{name}_bucket{{le=\"{le}\"}}"), v),
                None => (format!("{name}_{k}"), v),
            })
            .collect(),
        Shape::Text => {
            let short = name.trim_start_matches("warden_");
            vec![(
                format!("{name}_info{{{short}=\"{}\"}}", label(value.as_bytes())),
                1.0,
            )]
        }
    }
}

/// A key as the script writes it in a label: UTF-8 stays, with control
/// characters as `\xNN`; a key that is not UTF-8 has every byte outside
/// printable ASCII as `\xNN`.
fn label(bytes: &[u8]) -> String {
    let utf8 = std::str::from_utf8(bytes).is_ok();
    let mut out = Vec::new();
    for &b in bytes {
        if b < 0x20 || b == 0x7f || (b >= 0x80 && !utf8) {
            out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).unwrap()
}

fn is_zero(value: &str) -> bool {
    match shape(value) {
        Shape::Number(n) => n == 0.0,
        Shape::Dict(pairs) => pairs.iter().all(|(_, v)| *v == 0.0),
        Shape::Text => false,
    }
}

// ---- traffic ----

fn reply_int(r: Reply, what: &str) -> i64 {
    r.int()
        .unwrap_or_else(|| panic!("{what}: expected an integer, got {r:?}"))
}

/// The lease token of `CACHE.GET ...` (`[value, lease]`), if it gave one.
fn cache_get(w: &mut Wire, words: &[&str]) -> Option<String> {
    match w.ok(words).unwrap() {
        Reply::Array(pair) if pair.len() == 2 => pair[1].text(),
        other => panic!("{words:?}: expected [value, lease], got {other:?}"),
    }
}

/// A client blocked on `words` in database `db` (its reply is read later, or never).
fn blocked_in(s: &Server, db: u32, words: &[&[u8]]) -> Wire {
    let mut w = Wire::open(&s.socket()).unwrap();
    w.ok(&["SELECT", &db.to_string()]).unwrap();
    w.send(&[words.iter().map(|b| b.to_vec()).collect()])
        .unwrap();
    w
}

fn blocked(s: &Server, words: &[&str]) -> Wire {
    let words: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
    blocked_in(s, 0, &words)
}

/// Makes every counter move and leaves every level above zero: the returned
/// connections hold locks and leases and wait.
fn traffic(s: &Server, c: &mut Connection) -> Vec<Wire> {
    let mut w = Wire::open(&s.socket()).unwrap();
    // Before maxmemory is set (an acquire is refused `OOM` above it).
    rate_traffic(s, &mut w);
    evict_a_lock(s, c, &mut w);
    lock_traffic(s, c, &mut w);
    rwlock_traffic(s, c, &mut w);
    semaphore_traffic(s, c, &mut w);
    bloom_traffic(&mut w);
    cache_traffic(s, c, &mut w);
    keep_waiting(s, c, w)
}

/// A held lock evicted under `maxmemory`: its key stays taken until the
/// evicted lease would have ended.
fn evict_a_lock(s: &Server, c: &mut Connection, w: &mut Wire) {
    w.ok(&["LOCK.ACQUIRE", "evicted", "h", "600000"]).unwrap();
    w.ok(&["CONFIG", "SET", "maxmemory-policy", "volatile-ttl"])
        .unwrap();
    let limit = info_int(c, "memory", "used_memory") + (256 << 10);
    w.ok(&["CONFIG", "SET", "maxmemory", &limit.to_string()])
        .unwrap();
    // The filler (no TTL, another database) cannot be evicted: the lock is.
    let filler = "x".repeat(8 << 10);
    let mut db1 = Wire::open(&s.socket()).unwrap();
    db1.ok(&["SELECT", "1"]).unwrap();
    for i in 0..10_000 {
        db1.call(&["SET", &format!("filler:{i}"), &filler]).unwrap();
        if w.int(&["EXISTS", "evicted"]).unwrap() == 0 {
            break;
        }
    }
    w.ok(&["CONFIG", "SET", "maxmemory", "0"]).unwrap();
    w.ok(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .unwrap();
    assert_eq!(
        warden_stat(c, "evicted_locks"),
        1,
        "the lock was not evicted"
    );
    db1.ok(&["FLUSHDB"]).unwrap();
}

/// A hand-off, a wait that times out, a refused release, a lapsed lease.
fn lock_traffic(s: &Server, c: &mut Connection, w: &mut Wire) {
    reply_int(
        w.ok(&["LOCK.ACQUIRE", "l", "a", "600000"]).unwrap(),
        "acquire",
    );
    let mut next = blocked(s, &["LOCK.ACQUIRE", "l", "b", "600000", "WAIT", "0"]);
    wait_queued(c, "LOCK.INFO", "l", 1);
    assert_eq!(w.int(&["LOCK.RELEASE", "l", "a"]).unwrap(), 1);
    reply_int(next.read().unwrap(), "hand-off");
    assert_eq!(w.int(&["LOCK.RELEASE", "l", "b"]).unwrap(), 1);
    assert_eq!(w.int(&["LOCK.RELEASE", "l", "nobody"]).unwrap(), -1);
    reply_int(
        w.ok(&["LOCK.ACQUIRE", "t", "a", "600000"]).unwrap(),
        "acquire",
    );
    let timed_out = w.call(&["LOCK.ACQUIRE", "t", "b", "600000", "WAIT", "1"]);
    assert_eq!(timed_out.unwrap(), Reply::Nil);
    let shed = w.call(&[
        "LOCK.ACQUIRE",
        "t",
        "b",
        "600000",
        "WAIT",
        "0",
        "QUEUE",
        "0",
    ]);
    assert_eq!(shed.unwrap(), Reply::Nil);
    reply_int(
        w.ok(&["LOCK.ACQUIRE", "lapses", "a", "1"]).unwrap(),
        "acquire",
    );
    // Touching the key expires it at once (lazy expiry), whenever the
    // server's own expiry cycle would get to it.
    wait_for("a lease to lapse", Duration::from_secs(10), || {
        run(c, &["EXISTS", "lapses"]).unwrap();
        warden_stat(c, "lease_expiries") > 0
    });
}

/// A reader handed the lock by a writer.
fn rwlock_traffic(s: &Server, c: &mut Connection, w: &mut Wire) {
    reply_int(
        w.ok(&["RWLOCK.WRITE", "rw", "w", "600000"]).unwrap(),
        "write",
    );
    let mut reader = blocked(s, &["RWLOCK.READ", "rw", "r", "600000", "WAIT", "0"]);
    wait_queued(c, "RWLOCK.INFO", "rw", 1);
    assert_eq!(w.int(&["RWLOCK.UNLOCK", "rw", "w"]).unwrap(), 1);
    reply_int(reader.read().unwrap(), "hand-off");
    assert_eq!(w.int(&["RWLOCK.UNLOCK", "rw", "r"]).unwrap(), 1);
}

/// A waiter granted the permit a holder released; it keeps it (a semaphore
/// key stays).
fn semaphore_traffic(s: &Server, c: &mut Connection, w: &mut Wire) {
    let acquire = |owner| {
        [
            "SEM.ACQUIRE",
            "sem",
            owner,
            "600000",
            "LIMIT",
            "1",
            "WAIT",
            "0",
        ]
    };
    reply_int(w.ok(&acquire("a")).unwrap(), "acquire");
    let mut next = blocked(s, &acquire("b"));
    wait_queued(c, "SEM.INFO", "sem", 1);
    assert_eq!(w.int(&["SEM.RELEASE", "sem", "a"]).unwrap(), 1);
    reply_int(next.read().unwrap(), "hand-off");
}

/// A limiter that admits and limits, and a waiter it admits on time. The
/// server started with a grace window: every limiter starts empty from it
/// for a burst's worth of time (short ones here), so each first waits for
/// its first token.
fn rate_traffic(s: &Server, w: &mut Wire) {
    let admitted = |w: &mut Wire, words: &[&str]| match w.ok(words).unwrap() {
        Reply::Array(items) => matches!(items.first(), Some(Reply::Int(0))),
        other => panic!("{words:?}: {other:?}"),
    };
    let first = ["RATE.ACQUIRE", "rate", "1", "50", "BURST", "1"];
    wait_for("a first token", Duration::from_secs(10), || {
        admitted(w, &first)
    });
    assert!(!admitted(w, &first), "a second token at once");
    let waited = ["RATE.ACQUIRE", "wait", "1", "200", "BURST", "1"];
    wait_for("a first token", Duration::from_secs(10), || {
        admitted(w, &waited)
    });
    let mut waiter = blocked(
        s,
        &[
            "RATE.ACQUIRE",
            "wait",
            "1",
            "200",
            "BURST",
            "1",
            "WAIT",
            "0",
        ],
    );
    waiter.read().unwrap();
}

/// Two filters, one of them scaled out.
fn bloom_traffic(w: &mut Wire) {
    w.ok(&["BF.RESERVE", "bf", "0.01", "10"]).unwrap();
    for i in 0..40 {
        w.ok(&["BF.ADD", "bf", &i.to_string()]).unwrap();
    }
    w.ok(&["BF.ADD", "bf2", "x"]).unwrap();
}

/// Every cache path: a miss, its fill answering a waiter, a hit, a refused
/// fill, a revoked lease, a wait that times out, an abandoned lease, a
/// refresh ahead of expiry, a stale value served, a lease that lapses.
fn cache_traffic(s: &Server, c: &mut Connection, w: &mut Wire) {
    let lease = cache_get(w, &["CACHE.GET", "c", "60000"]).expect("a lease");
    let mut reader = blocked(s, &["CACHE.GET", "c", "60000", "WAIT", "0"]);
    wait_for("a cache waiter", Duration::from_secs(10), || {
        warden_stat(c, "waiting_clients") == 1
    });
    let fill = ["CACHE.FILL", "c", &lease, "v", "PX", "600000"];
    assert_eq!(w.int(&fill).unwrap(), 1);
    reader.read().unwrap();
    assert_eq!(cache_get(w, &["CACHE.GET", "c", "60000"]), None, "a hit");
    assert_eq!(w.int(&["CACHE.FILL", "c", &lease, "v"]).unwrap(), 0);
    cache_get(w, &["CACHE.GET", "revoked", "60000"]).expect("a lease");
    w.ok(&["CACHE.INVALIDATE", "revoked"]).unwrap();
    let lease = cache_get(w, &["CACHE.GET", "slow", "60000"]).expect("a lease");
    let waited = cache_get(w, &["CACHE.GET", "slow", "60000", "WAIT", "1"]);
    assert_eq!(waited, None, "the wait should time out");
    assert_eq!(w.int(&["CACHE.ABANDON", "slow", &lease]).unwrap(), 1);

    w.ok(&["SET", "warm", "v", "PX", "600000"]).unwrap();
    let lease =
        cache_get(w, &["CACHE.GET", "warm", "60000", "REFRESH", "1000000"]).expect("a refresh");
    assert_eq!(w.int(&["CACHE.FILL", "warm", &lease, "v2"]).unwrap(), 1);
    w.ok(&["SET", "old", "v"]).unwrap();
    w.ok(&["CACHE.INVALIDATE", "old", "STALE", "600000"])
        .unwrap();
    let lease = cache_get(w, &["CACHE.GET", "old", "60000"]).expect("a lease for the stale value");
    assert_eq!(w.int(&["CACHE.FILL", "old", &lease, "v2"]).unwrap(), 1);

    // The lease table ends a lapsed lease in a batch.
    cache_get(w, &["CACHE.GET", "lapses", "1"]).expect("a lease");
    wait_for("a cache lease to lapse", Duration::from_secs(10), || {
        warden_stat(c, "cache_max_batch") > 0
    });
}

/// Held locks with clients waiting on them, and a cache lease (held by `w`)
/// with a waiter: the connections to keep open.
fn keep_waiting(s: &Server, c: &mut Connection, mut w: Wire) -> Vec<Wire> {
    let mut waiting = Vec::new();
    w.ok(&["LOCK.ACQUIRE", "hot", "a", "600000"]).unwrap();
    for _ in 0..3 {
        waiting.push(blocked(
            s,
            &["LOCK.ACQUIRE", "hot", "b", "600000", "WAIT", "0"],
        ));
    }
    w.ok(&["RWLOCK.WRITE", "shared", "a", "600000"]).unwrap();
    waiting.push(blocked(
        s,
        &["RWLOCK.READ", "shared", "r", "600000", "WAIT", "0"],
    ));
    cache_get(&mut w, &["CACHE.GET", "loading", "600000"]).expect("a lease");
    waiting.push(blocked(s, &["CACHE.GET", "loading", "600000", "WAIT", "0"]));
    wait_for("5 clients waiting", Duration::from_secs(10), || {
        warden_stat(c, "waiting_clients") == 5
    });
    waiting.push(w);
    waiting
}

/// Waits until two readings of `INFO warden` in a row agree (but for the
/// fields that always move): lazily freed values (Valkey frees on a
/// background thread) have been counted out.
fn settle(c: &mut Connection) -> Vec<(String, String)> {
    let steady = |fields: &[(String, String)]| -> Vec<(String, String)> {
        fields
            .iter()
            .filter(|(k, _)| !MOVING.contains(&k.as_str()))
            .cloned()
            .collect()
    };
    let mut last = info_fields(c);
    wait_for("INFO warden to settle", Duration::from_secs(10), || {
        std::thread::sleep(Duration::from_millis(50));
        let now = info_fields(c);
        let same = steady(&now) == steady(&last);
        last = now;
        same
    });
    last
}

// ---- the tests ----

#[test]
fn every_info_warden_field_is_exported_with_its_value() {
    // A grace window at the start: grace_windows counts it.
    let s = Server::start_tcp(&["--warden.grace", "50"]);
    let mut c = s.conn();
    wait_for("the grace window to end", Duration::from_secs(10), || {
        warden_stat(&mut c, "grace_remaining_ms") == 0
    });
    let _waiting = traffic(&s, &mut c);
    let exporter = Exporter::start(s.port.unwrap());

    // A quiet moment: nothing but the exporter runs between the readings.
    let before = settle(&mut c);
    let samples = exporter.scrape();
    let after = info_fields(&mut c);

    assert_eq!(
        redis_up(&samples),
        1.0,
        "the script failed: redis_up is not 1; the exporter said:\n{}",
        exporter.log()
    );
    let before: BTreeMap<String, String> = before.into_iter().collect();
    let exported = script_values(&samples);
    let mut expected = BTreeMap::new();
    for (name, value) in &after {
        let moving = MOVING.contains(&name.as_str());
        assert!(
            moving || before.get(name) == Some(value),
            "{name} moved during the scrape ({:?} -> {value}): not a quiet moment",
            before.get(name)
        );
        let earlier = series_of(name, &before[name]);
        for (i, (series, value)) in series_of(name, value).into_iter().enumerate() {
            let got = *exported
                .get(&series)
                .unwrap_or_else(|| panic!("{series} ({name}) is not in the scrape"));
            if moving {
                let low = earlier[i].1;
                assert!(
                    (low..=value).contains(&got),
                    "{series}: {got} outside [{low}, {value}]"
                );
            } else {
                assert_eq!(got, value, "{series}: exported {got}, INFO says {value}");
            }
            expected.insert(series, value);
        }
        assert!(
            !is_zero(value) || MAY_BE_ZERO.contains(&name.as_str()),
            "{name} is zero: the traffic should move it (or list it in MAY_BE_ZERO)"
        );
    }
    for series in exported.keys() {
        assert!(
            expected.contains_key(series) || series.starts_with("warden_contended_"),
            "{series} is exported but INFO warden has no such field"
        );
    }
    for name in MAY_BE_ZERO {
        assert!(
            after.iter().any(|(k, _)| k == name),
            "MAY_BE_ZERO names {name}, which INFO warden does not print"
        );
    }
}

/// `WARDEN.CONTENDED COUNT 20` (RESP2) as entries of field → reply.
fn contended(s: &Server) -> Vec<Vec<(String, Reply)>> {
    let mut w = Wire::open(&s.socket()).unwrap();
    let Reply::Array(entries) = w.ok(&["WARDEN.CONTENDED", "COUNT", "20"]).unwrap() else {
        panic!("WARDEN.CONTENDED: expected an array");
    };
    entries
        .into_iter()
        .map(|e| match e {
            Reply::Array(flat) => flat
                .chunks(2)
                .map(|kv| (kv[0].text().unwrap(), kv[1].clone()))
                .collect(),
            other => panic!("WARDEN.CONTENDED entry: {other:?}"),
        })
        .collect()
}

#[test]
fn contended_keys_are_exported_with_waiters_and_wait() {
    let s = Server::start_tcp(&[]);
    let mut c = s.conn();
    let mut w = Wire::open(&s.socket()).unwrap();
    // Three waiters on one key, one on a read-write lock, two on a key that
    // is not UTF-8 (in db 3), one on a cache fill.
    w.ok(&["LOCK.ACQUIRE", "orders:42", "a", "600000"]).unwrap();
    let mut waiting = Vec::new();
    for _ in 0..3 {
        waiting.push(blocked(
            &s,
            &["LOCK.ACQUIRE", "orders:42", "b", "600000", "WAIT", "0"],
        ));
    }
    w.ok(&["RWLOCK.WRITE", "report", "a", "600000"]).unwrap();
    waiting.push(blocked(
        &s,
        &["RWLOCK.READ", "report", "r", "600000", "WAIT", "0"],
    ));
    let odd: &[u8] = b"k\xff\"}\n";
    let mut holder = blocked_in(&s, 3, &[b"LOCK.ACQUIRE", odd, b"a", b"600000"]);
    reply_int(holder.read().unwrap(), "acquire");
    for _ in 0..2 {
        waiting.push(blocked_in(
            &s,
            3,
            &[b"LOCK.ACQUIRE", odd, b"b", b"600000", b"WAIT", b"0"],
        ));
    }
    cache_get(&mut w, &["CACHE.GET", "page:/", "600000"]).expect("a lease");
    waiting.push(blocked(&s, &["CACHE.GET", "page:/", "600000", "WAIT", "0"]));
    wait_for("7 clients waiting", Duration::from_secs(60), || {
        warden_stat(&mut c, "waiting_clients") == 7
    });
    let exporter = Exporter::start(s.port.unwrap());

    let before = contended(&s);
    let samples = exporter.scrape();
    let after = contended(&s);
    assert_eq!(
        redis_up(&samples),
        1.0,
        "the script failed: redis_up is not 1; the exporter said:\n{}",
        exporter.log()
    );
    let exported = script_values(&samples);

    let mut keys = Vec::new();
    for (entry, earlier) in after.iter().zip(&before) {
        let field = |e: &[(String, Reply)], name: &str| -> Reply {
            e.iter()
                .find(|(k, _)| k == name)
                .unwrap_or_else(|| panic!("no {name} in {e:?}"))
                .1
                .clone()
        };
        let Reply::Bulk(key) = field(entry, "key") else {
            panic!("key: {entry:?}");
        };
        assert_eq!(
            field(earlier, "key"),
            Reply::Bulk(key.clone()),
            "the order changed: before {before:?}, after {after:?}"
        );
        let db = field(entry, "db").int().unwrap();
        let kind = field(entry, "kind").text().unwrap();
        keys.push((db, key.clone(), kind.clone()));
        let labels = format!("{{db=\"{db}\",kind=\"{kind}\",key=\"{}\"}}", label(&key));
        for (name, value) in entry
            .iter()
            .filter(|(k, _)| !["key", "db", "kind"].contains(&k.as_str()))
        {
            let series = format!("warden_contended_{name}{labels}");
            let got = *exported
                .get(&series)
                .unwrap_or_else(|| panic!("{series} is not in the scrape: {exported:?}"));
            let (low, high) = (field(earlier, name).int().unwrap(), value.int().unwrap());
            // Waiters stay; waited times only grow.
            assert!(
                (low as f64..=high as f64).contains(&got),
                "{series}: {got} outside [{low}, {high}]; before {before:?}, after {after:?}"
            );
        }
    }
    let order: Vec<i64> = after
        .iter()
        .map(|e| {
            e.iter()
                .find(|(k, _)| k == "waiters")
                .unwrap()
                .1
                .int()
                .unwrap()
        })
        .collect();
    assert!(
        order.windows(2).all(|p| p[0] >= p[1]),
        "most waiters first: {order:?}"
    );
    keys.sort();
    let mut want = vec![
        (0, b"orders:42".to_vec(), "lock".to_string()),
        (0, b"page:/".to_vec(), "cache".to_string()),
        (0, b"report".to_vec(), "rwlock".to_string()),
        (3, odd.to_vec(), "lock".to_string()),
    ];
    want.sort();
    assert_eq!(keys, want, "every contended key, once, with its kind");
    let waiters = |db: i64, kind: &str, key: &[u8]| {
        exported[&format!(
            "warden_contended_waiters{{db=\"{db}\",kind=\"{kind}\",key=\"{}\"}}",
            label(key)
        )]
    };
    assert_eq!(waiters(0, "lock", b"orders:42"), 3.0);
    assert_eq!(waiters(3, "lock", odd), 2.0);
    assert_eq!(waiters(0, "rwlock", b"report"), 1.0);
    assert_eq!(waiters(0, "cache", b"page:/"), 1.0);
    assert_eq!(
        label(odd),
        "k\\xff\"}\\x0a",
        "a key that is not UTF-8 is written with \\x escapes"
    );
}

#[test]
fn without_warden_contended_the_script_exports_the_rest() {
    let s = Server::start_tcp(&[]);
    let mut c = s.conn();
    // A user that may run everything but WARDEN.CONTENDED.
    let acl = "ACL SETUSER metrics on >secret ~* &* +@all -warden.contended";
    run(&mut c, &acl.split(' ').collect::<Vec<_>>()).unwrap();
    let mut w = Wire::open(&s.socket()).unwrap();
    w.ok(&["AUTH", "metrics", "secret"]).unwrap();
    assert!(w.call(&["WARDEN.CONTENDED"]).unwrap().is_error());
    w.ok(&["LOCK.ACQUIRE", "orders:42", "a", "600000"]).unwrap();
    let _waiter = blocked(
        &s,
        &["LOCK.ACQUIRE", "orders:42", "b", "600000", "WAIT", "0"],
    );
    wait_queued(&mut c, "LOCK.INFO", "orders:42", 1);
    let exporter = Exporter::start_with(
        s.port.unwrap(),
        &["--redis.user", "metrics", "--redis.password", "secret"],
    );

    let samples = exporter.scrape();
    assert_eq!(
        redis_up(&samples),
        1.0,
        "the script failed: redis_up is not 1; the exporter said:\n{}",
        exporter.log()
    );
    let exported = script_values(&samples);
    assert_eq!(exported.get("warden_waiting_clients"), Some(&1.0));
    assert_eq!(exported.get("warden_lock_keys"), Some(&1.0));
    assert!(
        exported.keys().all(|k| !k.starts_with("warden_contended_")),
        "{exported:?}"
    );
}

#[test]
fn info_shows_warden_fields_only_when_asked() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let has = |c: &mut Connection, args: &[&str]| {
        let mut cmd = redis::cmd("INFO");
        for a in args {
            cmd.arg(*a);
        }
        let text: String = cmd.query(c).unwrap();
        text.contains("\nwarden_lock_keys:")
    };
    assert!(!has(&mut c, &[]), "INFO");
    assert!(!has(&mut c, &["all"]), "INFO ALL");
    assert!(!has(&mut c, &["default"]), "INFO DEFAULT");
    assert!(has(&mut c, &["warden"]), "INFO warden");
    assert!(has(&mut c, &["modules"]), "INFO modules");
    assert!(has(&mut c, &["everything"]), "INFO everything");
    assert!(has(&mut c, &["server", "warden"]), "INFO server warden");
}

/// The field tables of docs/metrics.md (its section "## Fields"): rows
/// `` | `warden_name` | type | ... ``.
fn documented_fields() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(DOC).expect("docs/metrics.md");
    doc.lines()
        .skip_while(|l| *l != "## Fields")
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| l.strip_prefix("| `warden_"))
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let name = format!("warden_{}", cells[0].trim_end_matches('`'));
            (name, cells[1].to_string())
        })
        .collect()
}

#[test]
fn metrics_doc_lists_exactly_the_info_warden_fields() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let printed: BTreeMap<String, String> = info_fields(&mut c).into_iter().collect();
    let documented = documented_fields();
    let mut seen = std::collections::BTreeSet::new();
    for (name, kind) in &documented {
        assert!(seen.insert(name.clone()), "{name} is documented twice");
        let value = printed.get(name).unwrap_or_else(|| {
            panic!("docs/metrics.md documents {name}, which INFO warden does not print")
        });
        let fits = match (kind.as_str(), shape(value)) {
            ("counter" | "gauge", Shape::Number(_)) => true,
            ("histogram", Shape::Dict(pairs)) => pairs.iter().any(|(k, _)| k.starts_with("le_")),
            ("info", Shape::Text) => true,
            _ => false,
        };
        assert!(
            fits,
            "{name}: documented as {kind:?}, INFO warden prints {value:?}"
        );
    }
    for name in printed.keys() {
        assert!(
            seen.contains(name),
            "INFO warden prints {name}, which docs/metrics.md does not document"
        );
    }
}

// ---- Prometheus with the documented configuration ----

/// The fenced blocks of docs/metrics.md in `lang`, in order.
fn doc_blocks(lang: &str) -> Vec<String> {
    let doc = std::fs::read_to_string(DOC).expect("docs/metrics.md");
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        match current.as_mut() {
            None if line == format!("```{lang}") => current = Some(String::new()),
            None => {}
            Some(_) if line == "```" => blocks.push(current.take().unwrap()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    blocks
}

/// `s` with every byte but letters and digits percent-encoded (a URL query value).
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server scraping one exporter every second, with the scrape
/// job and the alert rules of docs/metrics.md.
struct Prometheus {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(exporter_port: u16) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let yaml = doc_blocks("yaml");
        let job = yaml
            .iter()
            .find(|b| b.starts_with("scrape_configs:"))
            .expect("a scrape_configs block in docs/metrics.md");
        let rules = yaml
            .iter()
            .find(|b| b.starts_with("groups:"))
            .expect("an alert rules block in docs/metrics.md");
        assert!(job.contains("'127.0.0.1:9121'"), "the documented target");
        let job = job.replace("127.0.0.1:9121", &format!("127.0.0.1:{exporter_port}"));
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: ['{}']\n{job}",
            dir.path().join("rules.yml").display()
        );
        std::fs::write(dir.path().join("rules.yml"), rules).unwrap();
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let check = Command::new("promtool")
            .arg("check")
            .arg("config")
            .arg(&config_path)
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run promtool ({e}): `make deps` installs it (apt-get install prometheus)")
            });
        assert!(
            check.status.success(),
            "promtool rejects the documented configuration:\n{}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start prometheus ({e}): `make deps` installs it (apt-get install prometheus)")
            });
        let mut prometheus = Self { child, port, dir };
        wait_for("prometheus to answer", Duration::from_secs(30), || {
            if let Ok(Some(status)) = prometheus.child.try_wait() {
                panic!("prometheus exited ({status}):\n{}", prometheus.log());
            }
            http_get(port, "/-/ready").is_ok()
        });
        prometheus
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The newest sample of every series whose name matches `regex`, as
    /// Prometheus stores them (after relabelling), through `/federate`.
    fn series(&self, regex: &str) -> Vec<Sample> {
        let selector = format!("{{__name__=~\"{regex}\"}}");
        let path = format!("/federate?match[]={}", url_encode(&selector));
        parse_exposition(&http_get(self.port, &path).unwrap_or_else(|e| panic!("federate: {e}")))
    }

    /// The JSON answer of an instant query (an error unless it succeeded).
    fn query(&self, promql: &str) -> String {
        let path = format!("/api/v1/query?query={}", url_encode(promql));
        let body = http_get(self.port, &path).unwrap_or_else(|e| panic!("{promql}: {e}"));
        assert!(body.contains("\"status\":\"success\""), "{promql}: {body}");
        body
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- prometheus log ----\n{}", self.log());
        }
    }
}

#[test]
fn documented_prometheus_config_names_every_series() {
    let s = Server::start_tcp(&[]);
    let mut c = s.conn();
    let mut w = Wire::open(&s.socket()).unwrap();
    // A hand-off (wait and hold times), and three clients waiting on one key.
    w.ok(&["LOCK.ACQUIRE", "orders:42", "a", "600000"]).unwrap();
    let mut next = blocked(
        &s,
        &["LOCK.ACQUIRE", "orders:42", "b", "600000", "WAIT", "0"],
    );
    wait_queued(&mut c, "LOCK.INFO", "orders:42", 1);
    w.ok(&["LOCK.RELEASE", "orders:42", "a"]).unwrap();
    reply_int(next.read().unwrap(), "hand-off");
    let _waiting: Vec<Wire> = (0..3)
        .map(|_| {
            blocked(
                &s,
                &["LOCK.ACQUIRE", "orders:42", "c", "600000", "WAIT", "0"],
            )
        })
        .collect();
    wait_queued(&mut c, "LOCK.INFO", "orders:42", 3);
    let exporter = Exporter::start(s.port.unwrap());
    let prometheus = Prometheus::start(exporter.port);

    let fields = info_fields(&mut c);
    wait_for(
        "prometheus to scrape warden",
        Duration::from_secs(30),
        || !prometheus.series("warden_lock_keys").is_empty(),
    );
    let stored = prometheus.series("warden_.+");
    let find = |name: &str, labels: &[(&str, &str)]| {
        stored.iter().find(|s| {
            s.name == name
                && labels.iter().all(|(k, v)| s.label(k) == Some(v))
                && s.labels.len() == labels.len() + 2 // and job, instance
        })
    };
    // Every INFO field under its own name, its buckets labelled le.
    for (name, value) in &fields {
        for (series, _) in series_of(name, value) {
            let (metric, labels) = match series.split_once('{') {
                None => (series.clone(), vec![]),
                Some((metric, rest)) => {
                    let (label, value) = rest.trim_end_matches("\"}").split_once("=\"").unwrap();
                    (
                        metric.to_string(),
                        vec![(label.to_string(), value.to_string())],
                    )
                }
            };
            let labels: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            assert!(
                find(&metric, &labels).is_some(),
                "no {metric} {labels:?} in Prometheus: {stored:?}"
            );
        }
    }
    assert!(
        stored
            .iter()
            .all(|s| s.label("key").is_none() || s.name.starts_with("warden_contended_")),
        "only contended keys keep a key label: {stored:?}"
    );

    let waiters = find(
        "warden_contended_waiters",
        &[("db", "0"), ("kind", "lock"), ("key", "orders:42")],
    )
    .unwrap_or_else(|| panic!("no contended key in Prometheus: {stored:?}"));
    assert_eq!(waiters.value, 3.0);
    assert!(find(
        "warden_contended_oldest_wait_ms",
        &[("db", "0"), ("kind", "lock"), ("key", "orders:42")]
    )
    .is_some());
    let answer = prometheus.query("sort_desc(warden_contended_waiters)");
    assert!(answer.contains("\"key\":\"orders:42\""), "{answer}");

    // The buckets make a histogram: the hand-off's wait has a quantile.
    let answer = prometheus.query("histogram_quantile(1, warden_lock_wait_ms_bucket)");
    assert!(
        answer.contains("\"result\":[{") && !answer.contains("NaN"),
        "{answer}"
    );

    // Every documented query is valid PromQL.
    for block in doc_blocks("promql") {
        for query in block.lines().filter(|l| !l.trim().is_empty()) {
            prometheus.query(query);
        }
    }
    // And every documented alert evaluates.
    wait_for(
        "the alert rules to be evaluated",
        Duration::from_secs(30),
        || {
            let rules = http_get(prometheus.port, "/api/v1/rules").unwrap();
            assert!(
                !rules.contains("\"health\":\"err\""),
                "a documented rule fails: {rules}"
            );
            rules.contains("\"health\":\"ok\"") && !rules.contains("\"health\":\"unknown\"")
        },
    );
}
