//! Semaphores: 50 clients looping on one semaphore of limit 5 — acquire, a
//! tiny critical section, release — for a fixed time, three ways on the same
//! server:
//!
//! - warden: `SEM.ACQUIRE sem owner ttl LIMIT 5 WAIT 0` / `SEM.RELEASE`;
//! - a Redisson-style semaphore (the algorithm of Redisson's
//!   `RPermitExpirableSemaphore`, in `bench/lua/`): a counter of free permits
//!   and a sorted set of the permits handed out with their lease ends, one
//!   Lua script to acquire and one to release, and a pub/sub channel on which
//!   freed permits are announced. A client that is refused subscribes to the
//!   channel and tries again on a message, or when the earliest lease the
//!   script told it of ends; it unsubscribes once it holds a permit. Twice:
//!   the 50 clients as threads of one JVM (one subscription; a message wakes
//!   as many waiting threads as it announces free permits, Redisson's latch)
//!   and as 50 processes (each its own subscription: every message wakes
//!   every waiter);
//! - the sorted-set semaphore of npm `redis-semaphore`: one sorted set of
//!   holders scored by the time they acquired or last renewed, a Lua script
//!   that drops the holders whose lease ended and adds the caller while fewer
//!   than the limit hold; release is `ZREM`; a refused client tries again
//!   after its retry interval, 10 ms by default; a holder renews its lease
//!   every 0.8 × the lease (all holders of one semaphore share its lease).
//!
//! The critical section is one `INCR inside`, which counts the holders in
//! it: the largest count seen is the bound as observed. `DECR inside` goes
//! in one pipeline with the release, ahead of it.
//!
//! Then a crash: the 5 permits are held, 4 by live holders and 1 by another
//! process with a 500 ms lease (the live holders' leases are longer, or for
//! the sorted set, whose holders share one lease, renewed), which is killed with SIGKILL while one client
//! waits for a permit; the figure is when the waiter gets that permit, after
//! the dead holder's lease end. None of the three notices the kill itself:
//! a hold outlives its connection in each, and only its lease ends it.

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redis::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::{cmd, fmt, server_counters, Row, Server, CLIENTS};

pub const REDISSON_ACQUIRE: &str = include_str!("lua/redisson_semaphore_acquire.lua");
pub const REDISSON_RELEASE: &str = include_str!("lua/redisson_semaphore_release.lua");
pub const SORTED_SET_ACQUIRE: &str = include_str!("lua/sorted_set_semaphore_acquire.lua");
pub const SORTED_SET_REFRESH: &str = include_str!("lua/sorted_set_semaphore_refresh.lua");

/// The semaphore's limit.
const LIMIT: i64 = 5;
/// The lease of every hold in the contention runs: none ends on its own.
const LEASE_MS: u64 = 10_000;
/// The lease of the holder that is killed.
const CRASH_LEASE_MS: u64 = 500;
/// The lease of the 4 holders that stay during the crash.
const LONG_LEASE_MS: u64 = 60_000;
/// npm redis-semaphore's default retry interval.
const POLL: Duration = Duration::from_millis(10);
/// Redisson's score for a permit without a lease.
const NO_LEASE: &str = "922337203685477";

const WARDEN_KEY: &str = "sem";
const COUNTER: &str = "rsem";
const PERMITS: &str = "{rsem}:timeout";
const CHANNEL: &str = "redisson_sc:{rsem}";
const SORTED_SET: &str = "ssem";
const INSIDE: &str = "inside";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Warden,
    /// Redisson-style, the clients as threads of one JVM.
    Redisson,
    /// Redisson-style, the clients as processes of their own.
    RedissonEach,
    SortedSet,
}

impl Kind {
    const ALL: [Kind; 4] = [
        Kind::Warden,
        Kind::Redisson,
        Kind::RedissonEach,
        Kind::SortedSet,
    ];

    fn label(self) -> &'static str {
        match self {
            Kind::Warden => "warden `SEM.ACQUIRE … WAIT`",
            Kind::Redisson => "Redisson-style Lua + pub/sub, one JVM",
            Kind::RedissonEach => "Redisson-style Lua + pub/sub, 50 processes",
            Kind::SortedSet => "redis-semaphore sorted set, 10 ms polling",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Kind::Warden => "SEM.ACQUIRE WAIT",
            Kind::Redisson => "Redisson-style Lua (one JVM)",
            Kind::RedissonEach => "Redisson-style Lua (50 processes)",
            Kind::SortedSet => "redis-semaphore sorted set",
        }
    }

    fn redisson(self) -> bool {
        matches!(self, Kind::Redisson | Kind::RedissonEach)
    }

    /// The commands its clients send to acquire and release (the critical
    /// section's `INCR`/`DECR` left out).
    fn sends(self) -> &'static [&'static str] {
        match self {
            Kind::Warden => &["sem.acquire", "sem.release"],
            Kind::Redisson | Kind::RedissonEach => &["evalsha", "subscribe", "unsubscribe"],
            Kind::SortedSet => &["evalsha", "zrem"],
        }
    }
}

/// The SHA1s of the loaded scripts.
#[derive(Clone)]
struct Shas {
    redisson_acquire: String,
    redisson_release: String,
    sorted_set_acquire: String,
    sorted_set_refresh: String,
}

/// Milliseconds since the epoch, the clock the Lua semaphores' clients use.
fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1e3
}

fn now_whole_ms() -> u64 {
    now_ms() as u64
}

/// What a pub/sub connection hears.
enum Heard {
    Subscribed,
    Unsubscribed,
    /// A message: the free permits it announces.
    Message(i64),
}

/// A pub/sub connection of its own, as Redisson keeps one beside its
/// command connections; a task reads what the server pushes.
struct Subscriber {
    write: OwnedWriteHalf,
    heard: mpsc::UnboundedReceiver<Heard>,
}

impl Subscriber {
    async fn connect(port: u16) -> Self {
        let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (read, write) = stream.into_split();
        let (tx, heard) = mpsc::unbounded_channel();
        tokio::task::spawn_local(async move {
            let mut read = BufReader::new(read);
            while let Some(frame) = read_push(&mut read).await {
                let kind = match frame.first().map(String::as_str) {
                    Some("subscribe") => Heard::Subscribed,
                    Some("unsubscribe") => Heard::Unsubscribed,
                    Some("message") => {
                        Heard::Message(frame.get(2).and_then(|v| v.parse().ok()).unwrap_or(1))
                    }
                    _ => continue,
                };
                if tx.send(kind).is_err() {
                    break;
                }
            }
        });
        Self { write, heard }
    }

    async fn send(&mut self, words: &[&str]) {
        let mut out = format!("*{}\r\n", words.len());
        for w in words {
            let _ = write!(out, "${}\r\n{w}\r\n", w.len());
        }
        self.write.write_all(out.as_bytes()).await.unwrap();
    }

    /// Subscribes; nothing can be pending, the last unsubscribe drained it.
    async fn subscribe(&mut self) {
        self.send(&["SUBSCRIBE", CHANNEL]).await;
        while !matches!(self.heard.recv().await.unwrap(), Heard::Subscribed) {}
    }

    /// Unsubscribes; messages heard meanwhile are dropped with the
    /// subscription, as Redisson drops the entry that counted them.
    async fn unsubscribe(&mut self) {
        self.send(&["UNSUBSCRIBE", CHANNEL]).await;
        while !matches!(self.heard.recv().await.unwrap(), Heard::Unsubscribed) {}
    }

    /// The next message, at once if one came while the client was busy.
    async fn message(&mut self) {
        while !matches!(self.heard.recv().await.unwrap(), Heard::Message(_)) {}
    }
}

/// One JVM's subscription, shared by its threads (Redisson's
/// `RedissonLockEntry`): subscribed while any thread waits, and a latch to
/// which each message adds as many permits as it announces free, at most one
/// per waiting thread.
struct Shared {
    waiting: Cell<usize>,
    latch: tokio::sync::Semaphore,
    _sub: OwnedWriteHalf,
}

impl Shared {
    /// Subscribes once for the whole run: with 45 of 50 threads waiting at
    /// any time, Redisson's entry never falls to zero users to unsubscribe.
    async fn start(port: u16) -> Rc<Self> {
        let mut sub = Subscriber::connect(port).await;
        sub.subscribe().await;
        let Subscriber { write, mut heard } = sub;
        let shared = Rc::new(Self {
            waiting: Cell::new(0),
            latch: tokio::sync::Semaphore::new(0),
            _sub: write,
        });
        let weak = Rc::downgrade(&shared);
        tokio::task::spawn_local(async move {
            while let Some(event) = heard.recv().await {
                let Some(shared) = weak.upgrade() else { break };
                if let Heard::Message(free) = event {
                    let wake = (free.max(0) as usize).min(shared.waiting.get());
                    shared.latch.add_permits(wake);
                }
            }
        });
        shared
    }

    fn enter(&self) {
        self.waiting.set(self.waiting.get() + 1);
    }

    /// The last waiter leaving drops the entry, and what its latch held.
    fn leave(&self) {
        self.waiting.set(self.waiting.get() - 1);
        if self.waiting.get() == 0 {
            while let Ok(p) = self.latch.try_acquire() {
                p.forget();
            }
        }
    }
}

/// One RESP2 array of bulk strings and integers, as the server pushes to a
/// subscriber; `None` when the connection closed.
async fn read_push(read: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> Option<Vec<String>> {
    let mut line = String::new();
    if read.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let n: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
    let mut words = Vec::with_capacity(n);
    for _ in 0..n {
        line.clear();
        read.read_line(&mut line).await.ok()?;
        let head = line.trim_end().to_string();
        if let Some(len) = head.strip_prefix('$') {
            let mut data = vec![0; len.parse::<usize>().ok()? + 2];
            read.read_exact(&mut data).await.ok()?;
            data.truncate(data.len() - 2);
            words.push(String::from_utf8_lossy(&data).into_owned());
        } else {
            words.push(head);
        }
    }
    Some(words)
}

/// One client of a semaphore: its connection, and for the Redisson-style one
/// its pub/sub connection.
struct Client {
    kind: Kind,
    con: MultiplexedConnection,
    sub: Option<Subscriber>,
    shared: Option<Rc<Shared>>,
    shas: Rc<Shas>,
    name: String,
    seq: u64,
}

impl Client {
    async fn new(
        server: &Server,
        kind: Kind,
        shas: &Rc<Shas>,
        shared: &Option<Rc<Shared>>,
        name: String,
    ) -> Self {
        let sub = if kind == Kind::RedissonEach {
            Some(Subscriber::connect(server.port).await)
        } else {
            None
        };
        Self {
            kind,
            con: server.conn().await,
            sub,
            shared: shared.clone(),
            shas: shas.clone(),
            name,
            seq: 0,
        }
    }

    /// A fresh owner, permit id or holder id: one per acquire, as each of the
    /// three asks.
    fn fresh_id(&mut self) -> String {
        self.seq += 1;
        format!("{}:{:016x}", self.name, self.seq)
    }

    async fn query<T: redis::FromRedisValue>(&mut self, words: &[&str]) -> T {
        cmd(words).query_async(&mut self.con).await.unwrap()
    }

    /// One try of the Redisson-style acquire script: `Ok(())` granted, else
    /// `Err(ms until the earliest lease ends)` if some lease ends.
    async fn redisson_try(&mut self, id: &str, lease_ms: u64) -> Result<(), Option<f64>> {
        let now = now_whole_ms();
        let sha = self.shas.redisson_acquire.clone();
        let reply: Option<String> = self
            .query(&[
                "EVALSHA",
                &sha,
                "3",
                COUNTER,
                PERMITS,
                CHANNEL,
                "1",
                &(now + lease_ms).to_string(),
                &now.to_string(),
                NO_LEASE,
                id,
            ])
            .await;
        match reply.as_deref() {
            Some("OK") => Ok(()),
            Some(next) => Err(next
                .strip_prefix(':')
                .and_then(|s| s.parse::<f64>().ok())
                .map(|end| end - now_ms())),
            None => Err(None),
        }
    }

    /// Acquires one permit with `lease_ms`, waiting as long as it takes the
    /// way each implementation waits; returns what releases it.
    async fn acquire(&mut self, lease_ms: u64) -> String {
        let lease = lease_ms.to_string();
        match self.kind {
            Kind::Warden => {
                let owner = self.fresh_id();
                let lim = LIMIT.to_string();
                let _: i64 = self
                    .query(&[
                        "SEM.ACQUIRE",
                        WARDEN_KEY,
                        &owner,
                        &lease,
                        "LIMIT",
                        &lim,
                        "WAIT",
                        "0",
                    ])
                    .await;
                owner
            }
            Kind::Redisson | Kind::RedissonEach => {
                // Redisson makes new permit ids for every try.
                let id = self.fresh_id();
                if self.redisson_try(&id, lease_ms).await.is_ok() {
                    return id;
                }
                match (&mut self.sub, &self.shared) {
                    (Some(sub), _) => sub.subscribe().await,
                    (None, Some(shared)) => shared.enter(),
                    _ => unreachable!("a Redisson-style client subscribes"),
                }
                let id = loop {
                    let id = self.fresh_id();
                    let next = match self.redisson_try(&id, lease_ms).await {
                        Ok(()) => break id,
                        Err(next) => next,
                    };
                    // Wait for a message, or until the earliest lease ends.
                    let limit = next.map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1e3));
                    match (&mut self.sub, &self.shared) {
                        (Some(sub), _) => match limit {
                            Some(d) => drop(tokio::time::timeout(d, sub.message()).await),
                            None => sub.message().await,
                        },
                        (None, Some(shared)) => {
                            let woken = match limit {
                                Some(d) => {
                                    tokio::time::timeout(d, shared.latch.acquire()).await.ok()
                                }
                                None => Some(shared.latch.acquire().await),
                            };
                            if let Some(permit) = woken {
                                permit.unwrap().forget();
                            }
                        }
                        _ => unreachable!(),
                    }
                };
                match (&mut self.sub, &self.shared) {
                    (Some(sub), _) => sub.unsubscribe().await,
                    (None, Some(shared)) => shared.leave(),
                    _ => unreachable!(),
                }
                id
            }
            Kind::SortedSet => {
                let id = self.fresh_id();
                let sha = self.shas.sorted_set_acquire.clone();
                let lim = LIMIT.to_string();
                loop {
                    let now = now_whole_ms().to_string();
                    let got: i64 = self
                        .query(&["EVALSHA", &sha, "1", SORTED_SET, &lim, &id, &lease, &now])
                        .await;
                    if got == 1 {
                        return id;
                    }
                    tokio::time::sleep(POLL).await;
                }
            }
        }
    }

    /// Releases `id`, after `DECR inside` in the same pipeline when `leaving`
    /// the critical section.
    async fn release(&mut self, id: &str, leaving: bool) {
        let now = now_whole_ms().to_string();
        let sha = self.shas.redisson_release.clone();
        let words: Vec<&str> = match self.kind {
            Kind::Warden => vec!["SEM.RELEASE", WARDEN_KEY, id],
            Kind::Redisson | Kind::RedissonEach => {
                vec![
                    "EVALSHA", &sha, "3", COUNTER, CHANNEL, PERMITS, id, "1", &now,
                ]
            }
            Kind::SortedSet => vec!["ZREM", SORTED_SET, id],
        };
        let mut pipe = redis::pipe();
        if leaving {
            pipe.add_command(cmd(&["DECR", INSIDE]));
        }
        pipe.add_command(cmd(&words));
        let _: Vec<i64> = pipe.query_async(&mut self.con).await.unwrap();
    }

    /// Renews a sorted-set hold (redis-semaphore's refresh).
    async fn refresh(&mut self, id: &str, lease_ms: u64) {
        let sha = self.shas.sorted_set_refresh.clone();
        let (lease, now) = (lease_ms.to_string(), now_whole_ms().to_string());
        let renewed: i64 = self
            .query(&["EVALSHA", &sha, "1", SORTED_SET, id, &lease, &now])
            .await;
        assert_eq!(renewed, 1, "a live sorted-set holder lost its hold");
    }
}

/// The state each run starts from: an empty keyspace, and Redisson's
/// `trySetPermits(5)` for its semaphore.
fn reset(server: &Server, kind: Kind) {
    server.flush();
    if kind.redisson() {
        cmd(&["SET", COUNTER, &LIMIT.to_string()])
            .query::<()>(&mut server.sync())
            .unwrap();
    }
}

/// One implementation's figures.
#[derive(Clone, Default)]
struct Figures {
    acquisitions_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    fairness: f64,
    most_inside: f64,
    commands_per_acquisition: f64,
    cpu_us_per_acquisition: f64,
    /// Per crash round: when the waiter got the dead holder's permit, in ms
    /// after that holder's lease end.
    crash_ms: Vec<f64>,
}

/// Calls per command since the last `CONFIG RESETSTAT`.
fn command_calls(server: &Server) -> HashMap<String, u64> {
    let info: String = cmd(&["INFO", "commandstats"])
        .query(&mut server.sync())
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_string(), calls.parse().ok()?))
        })
        .collect()
}

/// `CLIENTS` clients looping on the semaphore for `run_for`.
async fn contention(server: &Server, kind: Kind, shas: &Rc<Shas>, run_for: Duration) -> Figures {
    reset(server, kind);
    let shared = if kind == Kind::Redisson {
        Some(Shared::start(server.port).await)
    } else {
        None
    };
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        clients.push(Client::new(server, kind, shas, &shared, format!("client-{i}")).await);
    }
    cmd(&["CONFIG", "RESETSTAT"])
        .query::<()>(&mut server.sync())
        .unwrap();
    let (_, cpu0) = server_counters(server);
    let most_inside = Rc::new(Cell::new(0i64));
    let start = Instant::now();
    let deadline = start + run_for;
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut client| {
            let most_inside = most_inside.clone();
            tokio::task::spawn_local(async move {
                let mut waits = Vec::new();
                while Instant::now() < deadline {
                    let asked = Instant::now();
                    // A client still waiting at the deadline counts with the time it waited so far.
                    let censored = deadline.saturating_duration_since(asked);
                    let id = client.acquire(LEASE_MS).await;
                    let held_at = Instant::now();
                    let inside: i64 = client.query(&["INCR", INSIDE]).await;
                    most_inside.set(most_inside.get().max(inside));
                    client.release(&id, true).await;
                    if held_at < deadline {
                        waits.push((true, held_at - asked));
                    } else if !censored.is_zero() {
                        waits.push((false, censored));
                    }
                }
                waits
            })
        })
        .collect();
    tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)).await;
    let (_, cpu1) = server_counters(server);
    let calls = command_calls(server);
    let mut all = Vec::new();
    let mut per_client = Vec::new();
    for t in tasks {
        let waits = t.await.unwrap();
        let (done, waited): (Vec<_>, Vec<_>) = waits.into_iter().partition(|(granted, _)| *granted);
        per_client.push(done.len());
        all.extend(done.into_iter().chain(waited).map(|(_, d)| d));
    }
    all.sort();
    let acquisitions = per_client.iter().sum::<usize>().max(1) as f64;
    let pct = |q: f64| {
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    let min = *per_client.iter().min().unwrap_or(&0) as f64;
    let max = *per_client.iter().max().unwrap_or(&0) as f64;
    let sent: u64 = kind.sends().iter().filter_map(|c| calls.get(*c)).sum();
    Figures {
        acquisitions_per_s: acquisitions / run_for.as_secs_f64(),
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        fairness: if min > 0.0 { max / min } else { f64::INFINITY },
        most_inside: most_inside.get() as f64,
        commands_per_acquisition: sent as f64 / acquisitions,
        cpu_us_per_acquisition: (cpu1 - cpu0) * 1e6 / acquisitions,
        crash_ms: Vec::new(),
    }
}

/// The acquire of the holder that is killed, as `redis-cli` words.
fn victim_words(kind: Kind, shas: &Shas) -> Vec<String> {
    let now = now_whole_ms();
    let (lease, limit) = (CRASH_LEASE_MS.to_string(), LIMIT.to_string());
    let end = (now + CRASH_LEASE_MS).to_string();
    let now = now.to_string();
    let words: Vec<&str> = match kind {
        Kind::Warden => vec!["SEM.ACQUIRE", WARDEN_KEY, "victim", &lease, "LIMIT", &limit],
        Kind::Redisson | Kind::RedissonEach => vec![
            "EVALSHA",
            &shas.redisson_acquire,
            "3",
            COUNTER,
            PERMITS,
            CHANNEL,
            "1",
            &end,
            &now,
            NO_LEASE,
            "victim",
        ],
        Kind::SortedSet => vec![
            "EVALSHA",
            &shas.sorted_set_acquire,
            "1",
            SORTED_SET,
            &limit,
            "victim",
            &lease,
            &now,
        ],
    };
    words.into_iter().map(String::from).collect()
}

/// The victim's lease end (ms since the epoch) once its hold is visible.
fn victim_lease_end(server: &Server, kind: Kind) -> Option<f64> {
    let mut con = server.sync();
    match kind {
        Kind::Warden => {
            let info: Value = cmd(&["SEM.INFO", WARDEN_KEY, "victim"])
                .query(&mut con)
                .ok()?;
            let read_at = now_ms();
            let Value::Array(a) = info else { return None };
            let fields: Vec<(String, i64)> = a
                .chunks(2)
                .filter_map(|kv| {
                    Some((
                        redis::from_redis_value(&kv[0]).ok()?,
                        redis::from_redis_value(&kv[1]).ok()?,
                    ))
                })
                .collect();
            let get = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
            (get("permits")? > 0).then(|| read_at + get("ttl").unwrap() as f64)
        }
        Kind::Redisson | Kind::RedissonEach => {
            cmd(&["ZSCORE", PERMITS, "victim"]).query(&mut con).ok()?
        }
        Kind::SortedSet => {
            let at: Option<f64> = cmd(&["ZSCORE", SORTED_SET, "victim"])
                .query(&mut con)
                .ok()?;
            at.map(|at| at + CRASH_LEASE_MS as f64)
        }
    }
}

/// One crash round: 4 live holders, a holder in another process with a
/// 500 ms lease, a client waiting; the holder is killed; returns when the
/// waiter got its permit, in ms after the dead holder's lease end.
async fn crash(server: &Server, kind: Kind, shas: &Rc<Shas>) -> f64 {
    reset(server, kind);
    let shared = if kind == Kind::Redisson {
        Some(Shared::start(server.port).await)
    } else {
        None
    };
    // The sorted set's holders share one lease and renew it every 0.8 × it.
    let lease = if kind == Kind::SortedSet {
        CRASH_LEASE_MS
    } else {
        LONG_LEASE_MS
    };
    let mut stayers = Client::new(server, kind, shas, &shared, "stayer".into()).await;
    let mut held = Vec::new();
    for _ in 0..LIMIT - 1 {
        held.push(stayers.acquire(lease).await);
    }
    let renewing = (kind == Kind::SortedSet).then(|| {
        tokio::task::spawn_local(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(CRASH_LEASE_MS * 8 / 10)).await;
                for id in &held {
                    stayers.refresh(id, CRASH_LEASE_MS).await;
                }
            }
        })
    });
    let words = victim_words(kind, shas);
    let script = format!(
        "redis-cli -p {} {} >/dev/null && exec sleep 60",
        server.port,
        words.join(" ")
    );
    let mut victim = Command::new("sh")
        .args(["-c", &script])
        .stdout(Stdio::null())
        .spawn()
        .expect("sh");
    let asked = Instant::now();
    let lease_end = loop {
        if let Some(end) = victim_lease_end(server, kind) {
            break end;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "the {kind:?} victim never held"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let mut waiter = Client::new(server, kind, shas, &shared, "waiter".into()).await;
    let granted = tokio::task::spawn_local(async move {
        waiter.acquire(lease).await;
        now_ms()
    });
    // The holder dies well before its lease ends; nothing releases its permit.
    tokio::time::sleep(Duration::from_millis(100)).await;
    victim.kill().unwrap();
    victim.wait().unwrap();
    let late = granted.await.unwrap() - lease_end;
    if let Some(task) = renewing {
        task.abort();
    }
    late
}

/// What is compared, row by row: a name, a unit, the target (on warden's own
/// figure, against the one-JVM Redisson-style semaphore) and the figure.
type Metric = (
    &'static str,
    &'static str,
    Option<(&'static str, f64)>,
    fn(&Figures) -> f64,
);

fn worst_crash(f: &Figures) -> f64 {
    f.crash_ms.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
}

/// The rows of this section, `reps` repetitions of each implementation
/// (`run_for` of contention, `crash_rounds` crashes), and the table of the
/// last repetition in markdown.
pub async fn rows(
    server: &Server,
    reps: usize,
    run_for: Duration,
    crash_rounds: usize,
) -> (Vec<Row>, String) {
    let shas = Rc::new(Shas {
        redisson_acquire: server.load(REDISSON_ACQUIRE),
        redisson_release: server.load(REDISSON_RELEASE),
        sorted_set_acquire: server.load(SORTED_SET_ACQUIRE),
        sorted_set_refresh: server.load(SORTED_SET_REFRESH),
    });
    let metrics: [Metric; 7] = [
        ("acquisitions/s", "acq/s", Some((">=", 3.0)), |f| f.acquisitions_per_s),
        ("p50 wait", "ms", None, |f| f.p50_ms),
        ("p99 wait (target on warden: 15 ms)", "ms", Some(("<=", 15.0)), |f| f.p99_ms),
        (
            "fairness max/min acquisitions per client (target on warden: 1.00)",
            "max/min",
            Some(("<=", 1.005)),
            |f| f.fairness,
        ),
        (
            "most holders inside at once (target on warden: the limit)",
            "holders",
            Some(("<=", LIMIT as f64)),
            |f| f.most_inside,
        ),
        ("server CPU per acquisition", "us", None, |f| f.cpu_us_per_acquisition),
        (
            "SIGKILLed holder's permit granted after its lease end, worst crash (target on warden: 10 ms)",
            "ms",
            Some(("<=", 10.0)),
            worst_crash,
        ),
    ];
    let others = [Kind::Redisson, Kind::RedissonEach, Kind::SortedSet];
    let mut rows = Vec::new();
    for (name, unit, target, _) in metrics {
        for other in others {
            let mut row = Row::new(
                "semaphore",
                format!("{name}: {} vs {}", Kind::Warden.short(), other.short()),
                unit,
                target.filter(|_| other == Kind::Redisson),
            );
            // The throughput target is on the ratio; the others on warden's figure.
            if target.is_some() && other == Kind::Redisson && unit != "acq/s" {
                row = row.absolute();
            }
            rows.push(row);
        }
    }
    let mut last = HashMap::new();
    for rep in 0..reps {
        eprintln!("semaphore: repetition {}/{}", rep + 1, reps);
        let mut figures = HashMap::new();
        for kind in Kind::ALL {
            let mut f = contention(server, kind, &shas, run_for).await;
            for _ in 0..crash_rounds {
                f.crash_ms.push(crash(server, kind, &shas).await);
            }
            figures.insert(format!("{kind:?}"), f);
        }
        let w = &figures["Warden"];
        let mut r = 0;
        for (_, _, _, figure) in metrics {
            for other in others {
                rows[r].warden.push(figure(w));
                rows[r].other.push(figure(&figures[&format!("{other:?}")]));
                r += 1;
            }
        }
        last = figures;
    }
    let mut notes = String::new();
    let _ = writeln!(
        notes,
        "Semaphores, last repetition: {CLIENTS} clients on one semaphore of limit {LIMIT}, each looping acquire, `INCR inside` (the critical section; the reply counts the holders in it), `DECR inside` pipelined with the release, for {:.0} s; leases {LEASE_MS} ms. Crash: 4 permits held by live holders, the fifth by a `redis-cli` process with a {CRASH_LEASE_MS} ms lease, SIGKILLed 100 ms after a client started waiting; ms from its lease end until the waiter holds the permit (median and worst of {crash_rounds}). Commands per acquisition count what the clients send to acquire and release (`EVALSHA`, `SUBSCRIBE`/`UNSUBSCRIBE`, `ZREM`, `SEM.*`).\n",
        run_for.as_secs_f64()
    );
    let _ = writeln!(
        notes,
        "| implementation | acquisitions/s | p50 wait ms | p99 wait ms | max/min per client | most inside | commands per acquisition | server CPU µs per acquisition | crash: granted after lease end, median / worst ms |"
    );
    let _ = writeln!(notes, "|---|---|---|---|---|---|---|---|---|");
    for kind in Kind::ALL {
        let f = &last[&format!("{kind:?}")];
        let mut crash = f.crash_ms.clone();
        crash.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let _ = writeln!(
            notes,
            "| {} | {:.0} | {:.2} | {:.2} | {} | {:.0} | {:.2} | {:.1} | {} / {} |",
            kind.label(),
            f.acquisitions_per_s,
            f.p50_ms,
            f.p99_ms,
            if f.fairness.is_finite() {
                format!("{:.3}", f.fairness)
            } else {
                "∞".into()
            },
            f.most_inside,
            f.commands_per_acquisition,
            f.cpu_us_per_acquisition,
            fmt(crash.get(crash.len() / 2).copied().unwrap_or(f64::NAN)),
            fmt(crash.last().copied().unwrap_or(f64::NAN)),
        );
    }
    (rows, notes)
}
