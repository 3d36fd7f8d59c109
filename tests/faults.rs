//! The fault matrix: for `LOCK`, `RWLOCK` and `SEM`, every way a lock is
//! freed or a lease ends × the state the server is in × what the waiting
//! client does.
//!
//! The product is generated in code; combinations that cannot happen are
//! skipped with the reason in `skip_reason`. After every case: the server is
//! alive and its log clean, every request got exactly one reply (each waiter
//! pipelines `ECHO <marker>` behind its blocked request, so a missing or extra
//! reply shows as a misplaced marker), no two clients believed they held the
//! lock at once (a ledger of holds in server time, from `TIME`, `PEXPIRETIME`
//! and `*.INFO`), nothing was granted past its waiter's deadline or while
//! writes were paused, and nobody is left waiting. At the end of each state
//! `used_memory` (less the replication backlog) is back near where it started.
//!
//! One test per server state; each runs its cases on its own servers, reused
//! across cases (every case ends with `FLUSHALL`, and a server that died is
//! replaced).

mod common;

use std::fmt;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::wire::{cmd, Cmd, Reply, Wire};
use common::{is_valkey, replicate, Server};

// ---------------------------------------------------------------------------
// The matrix

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Lock,
    RwLock,
    /// A semaphore of limit 2: the holder takes 1 permit, the waiter under
    /// test asks for 2 (so it waits although a permit is free) and the
    /// second waiter for 1 (it fits, yet must not overtake the waiter ahead).
    Semaphore,
}

/// Every way a lock is freed or its lease ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Free {
    Release,
    LeaseEnd,
    Del,
    Unlink,
    EvictAllkeysLru,
    EvictVolatileTtl,
    FlushDb,
    FlushAll,
    SwapDb,
    Rename,
    Move,
    OverwriteBySet,
    RestoreReplace,
    /// `DEBUG RELOAD` while the lease runs out.
    Restart,
}

/// The state of the server while the lock is freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Normal,
    PauseWrite,
    PauseAll,
    /// `FAILOVER TIMEOUT` in progress: the replica is stopped, so it times out.
    Failover,
    /// Requests sent to replicas (one read-only, one `replica-read-only no`).
    Replica,
    /// The master becomes a replica while the waiter waits.
    Demoted,
    /// A `DEBUG RELOAD` while the waiter waits, before the lock is freed.
    DebugReload,
    /// The freeing command runs inside `MULTI`/`EXEC`.
    Multi,
    /// The freeing command runs inside `EVAL`.
    Eval,
}

/// What the waiting client does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Client {
    /// Waits (long `WAIT`), then `ECHO`.
    Waiter,
    /// `ACQUIRE ... 1000 WAIT 50`, `INCR`, `ECHO` in one pipeline.
    Pipelined,
    /// `CLIENT KILL` of the waiter pipelined with the freeing command.
    KilledAtGrant,
    /// `CLIENT UNBLOCK` of the waiter pipelined with the freeing command.
    UnblockedAtGrant,
    /// The waiter's `WAIT` deadline falls at the moment the lock is freed.
    DeadlineAtFree,
}

const KINDS: [Kind; 3] = [Kind::Lock, Kind::RwLock, Kind::Semaphore];
const FREES: [Free; 14] = [
    Free::Release,
    Free::LeaseEnd,
    Free::Del,
    Free::Unlink,
    Free::EvictAllkeysLru,
    Free::EvictVolatileTtl,
    Free::FlushDb,
    Free::FlushAll,
    Free::SwapDb,
    Free::Rename,
    Free::Move,
    Free::OverwriteBySet,
    Free::RestoreReplace,
    Free::Restart,
];
const STATES: [State; 9] = [
    State::Normal,
    State::PauseWrite,
    State::PauseAll,
    State::Failover,
    State::Replica,
    State::Demoted,
    State::DebugReload,
    State::Multi,
    State::Eval,
];
const CLIENTS: [Client; 5] = [
    Client::Waiter,
    Client::Pipelined,
    Client::KilledAtGrant,
    Client::UnblockedAtGrant,
    Client::DeadlineAtFree,
];

/// How a request asks for a kind: `<command> key owner ttl <terms>`.
#[derive(Clone, Copy, Debug)]
struct Ask {
    command: &'static str,
    terms: &'static [&'static str],
}

impl Ask {
    /// The request, then `rest` (a `WAIT`).
    fn words(self, key: &str, owner: &str, ttl: i64, rest: &[&str]) -> Vec<String> {
        [self.command, key, owner, &ttl.to_string()]
            .into_iter()
            .chain(self.terms.iter().copied())
            .chain(rest.iter().copied())
            .map(String::from)
            .collect()
    }

    /// The permits it asks for (a lock's holder holds "one permit of one").
    fn permits(self) -> u64 {
        self.terms
            .iter()
            .position(|t| *t == "PERMITS")
            .and_then(|i| self.terms.get(i + 1)?.parse().ok())
            .unwrap_or(1)
    }

    fn cmd(self, key: &str, owner: &str, ttl: i64, rest: &[&str]) -> Cmd {
        self.words(key, owner, ttl, rest)
            .into_iter()
            .map(String::into_bytes)
            .collect()
    }
}

fn strs(words: &[String]) -> Vec<&str> {
    words.iter().map(String::as_str).collect()
}

impl Kind {
    /// How the holder asks (and a restored lock's owner).
    fn holder(self) -> Ask {
        match self {
            Kind::Lock => Ask {
                command: "LOCK.ACQUIRE",
                terms: &[],
            },
            Kind::RwLock => Ask {
                command: "RWLOCK.WRITE",
                terms: &[],
            },
            Kind::Semaphore => Ask {
                command: "SEM.ACQUIRE",
                terms: &["LIMIT", "2"],
            },
        }
    }

    /// How the waiter under test asks (and a request that must not be
    /// granted while the holder holds: inside MULTI/EVAL, on a replica).
    fn waiter(self) -> Ask {
        match self {
            Kind::Semaphore => Ask {
                command: "SEM.ACQUIRE",
                terms: &["LIMIT", "2", "PERMITS", "2"],
            },
            kind => kind.holder(),
        }
    }

    /// How the second waiter asks (readers for RWLOCK, one permit for SEM,
    /// for variety).
    fn second(self) -> Ask {
        match self {
            Kind::RwLock => Ask {
                command: "RWLOCK.READ",
                terms: &[],
            },
            Kind::Semaphore => Ask {
                command: "SEM.ACQUIRE",
                terms: &["LIMIT", "2", "PERMITS", "1"],
            },
            kind => kind.holder(),
        }
    }

    /// Permits held at once at most (a lock: one holder).
    fn limit(self) -> u64 {
        match self {
            Kind::Semaphore => 2,
            _ => 1,
        }
    }

    fn release(self) -> &'static str {
        match self {
            Kind::Lock => "LOCK.RELEASE",
            Kind::RwLock => "RWLOCK.UNLOCK",
            Kind::Semaphore => "SEM.RELEASE",
        }
    }

    /// What `release` answers an owner that holds nothing.
    fn not_held(self) -> i64 {
        match self {
            Kind::Semaphore => 0,
            _ => -1,
        }
    }

    fn extend(self) -> &'static str {
        match self {
            Kind::Lock => "LOCK.EXTEND",
            Kind::RwLock => "RWLOCK.EXTEND",
            Kind::Semaphore => "SEM.EXTEND",
        }
    }

    fn info(self) -> &'static str {
        match self {
            Kind::Lock => "LOCK.INFO",
            Kind::RwLock => "RWLOCK.INFO",
            Kind::Semaphore => "SEM.INFO",
        }
    }
}

impl Free {
    /// Freed by a timer (lease end), not by a command: nothing can be
    /// pipelined with the grant.
    fn is_timed(self) -> bool {
        matches!(
            self,
            Free::LeaseEnd | Free::EvictAllkeysLru | Free::EvictVolatileTtl | Free::Restart
        )
    }

    fn evicts(self) -> Option<&'static str> {
        match self {
            Free::EvictAllkeysLru => Some("allkeys-lru"),
            Free::EvictVolatileTtl => Some("volatile-ttl"),
            _ => None,
        }
    }
}

macro_rules! names {
    ($ty:ty { $($variant:ident => $name:literal),* $(,)? }) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(match self { $(Self::$variant => $name),* })
            }
        }
    };
}

names!(Kind { Lock => "lock", RwLock => "rwlock", Semaphore => "semaphore" });
names!(Free {
    Release => "release", LeaseEnd => "lease-end", Del => "del", Unlink => "unlink",
    EvictAllkeysLru => "evict-allkeys-lru", EvictVolatileTtl => "evict-volatile-ttl",
    FlushDb => "flushdb", FlushAll => "flushall", SwapDb => "swapdb", Rename => "rename",
    Move => "move", OverwriteBySet => "overwrite-set", RestoreReplace => "restore-replace",
    Restart => "debug-reload-restart",
});
names!(State {
    Normal => "normal", PauseWrite => "pause-write", PauseAll => "pause-all",
    Failover => "failover", Replica => "replica", Demoted => "demoted",
    DebugReload => "debug-reload", Multi => "multi", Eval => "eval",
});
names!(Client {
    Waiter => "waiter", Pipelined => "pipelined", KilledAtGrant => "killed-at-grant",
    UnblockedAtGrant => "unblocked-at-grant", DeadlineAtFree => "deadline-at-free",
});

#[derive(Clone, Copy, Debug)]
struct Case {
    kind: Kind,
    free: Free,
    state: State,
    client: Client,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} × {} × {} × {}",
            self.kind, self.free, self.state, self.client
        )
    }
}

fn matrix() -> Vec<Case> {
    let mut cases = Vec::new();
    for state in STATES {
        for kind in KINDS {
            for free in FREES {
                for client in CLIENTS {
                    cases.push(Case {
                        kind,
                        free,
                        state,
                        client,
                    });
                }
            }
        }
    }
    cases
}

/// Why a combination is not run, or `None` when it is.
fn skip_reason(c: &Case) -> Option<&'static str> {
    use Client::*;
    use State::*;
    let at_grant = matches!(c.client, KilledAtGrant | UnblockedAtGrant);
    if at_grant && c.free.is_timed() {
        return Some("the grant comes from a lease timer: nothing can be pipelined with it");
    }
    match c.state {
        Multi | Eval if c.free.is_timed() => {
            Some("a lease end or an eviction is no command: nothing to run inside MULTI/EVAL")
        }
        Eval if at_grant => Some("CLIENT KILL/UNBLOCK are not allowed in scripts"),
        DebugReload if c.free == Free::Restart => Some("the free-way is itself a DEBUG RELOAD"),
        Replica if at_grant => Some("a replica grants nothing: there is no grant to act at"),
        Replica if c.client == DeadlineAtFree => {
            Some("a replica answers at once: there is no deadline")
        }
        Demoted if c.free != Free::Release => {
            Some("the demotion answers the waiter before the lock can be freed")
        }
        Demoted if at_grant || c.client == DeadlineAtFree => {
            Some("the demotion answers the waiter: there is no grant or deadline to meet")
        }
        _ => None,
    }
}

impl Wire {
    /// The server's clock in milliseconds.
    fn now(&mut self) -> Result<i64, String> {
        let r = self.call(&["TIME"])?;
        server_ms(&r)
    }

    /// A field of `INFO <section>`.
    fn info_field(&mut self, section: &str, name: &str) -> Result<Option<String>, String> {
        let text = self.ok(&["INFO", section])?.text().unwrap_or_default();
        Ok(text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.trim().to_string()))
    }

    /// `used_memory` less the replication backlog, which fills up to its
    /// size as cases write, whatever warden keeps.
    fn used_memory(&mut self) -> Result<i64, String> {
        let mut number = |name: &str| -> Result<Option<i64>, String> {
            Ok(self
                .info_field("memory", name)?
                .and_then(|v| v.parse().ok()))
        };
        let used = number("used_memory")?.ok_or("no used_memory")?;
        Ok(used - number("mem_replication_backlog")?.unwrap_or(0))
    }

    fn warden(&mut self, name: &str) -> Result<Option<i64>, String> {
        Ok(self
            .info_field("warden", &format!("warden_{name}"))?
            .and_then(|v| v.parse().ok()))
    }

    /// `<KIND>.INFO key` as field → reply, or `None` when there is no lock.
    fn lock_info(&mut self, kind: Kind, key: &str) -> Result<Option<Vec<(String, Reply)>>, String> {
        match self.call(&[kind.info(), key])? {
            // Not a lock (any more): overwritten by another type.
            Reply::Nil => Ok(None),
            Reply::Error(e) if e.starts_with("WRONGTYPE") => Ok(None),
            Reply::Array(items) => Ok(Some(
                items
                    .chunks(2)
                    .map(|kv| (kv[0].text().unwrap_or_default(), kv[1].clone()))
                    .collect(),
            )),
            r => Err(format!("{} {key}: {r:?}", kind.info())),
        }
    }
}

/// A lock as one atomic read: its fields and its key's absolute expiry (a
/// semaphore's fields as `owner` sees them).
struct Snapshot {
    fields: Vec<(String, Reply)>,
    expires: i64,
    owner: String,
}

impl Snapshot {
    fn fence(&self) -> Option<i64> {
        field(&self.fields, "fence").and_then(Reply::int)
    }

    /// Whether the lock shows `fence` as its token. `SEM.INFO` tells no
    /// tokens: a semaphore's hold is matched by its owner alone.
    fn shows(&self, kind: Kind, fence: i64) -> bool {
        kind == Kind::Semaphore || self.fence() == Some(fence)
    }

    /// The exclusive holder: a lock's owner, a rwlock's writer, the asked
    /// owner if it holds permits of a semaphore.
    fn holder(&self, kind: Kind) -> String {
        let name = match kind {
            Kind::Lock => "owner",
            Kind::RwLock => "writer",
            Kind::Semaphore => {
                let permits = field(&self.fields, "permits").and_then(Reply::int);
                return match permits {
                    Some(p) if p > 0 => self.owner.clone(),
                    _ => String::new(),
                };
            }
        };
        field(&self.fields, name)
            .and_then(Reply::text)
            .unwrap_or_default()
    }

    /// How many owners hold (a semaphore's `holders`; a lock's: one).
    fn holders(&self) -> i64 {
        field(&self.fields, "holders")
            .and_then(Reply::int)
            .unwrap_or(1)
    }
}

fn snapshot(c: &mut Wire, kind: Kind, key: &str, owner: &str) -> Result<Option<Snapshot>, String> {
    let info = match kind {
        Kind::Semaphore => cmd(&[kind.info(), key, owner]),
        _ => cmd(&[kind.info(), key]),
    };
    c.send(&[
        cmd(&["MULTI"]),
        info,
        cmd(&["PEXPIRETIME", key]),
        cmd(&["EXEC"]),
    ])?;
    for _ in 0..3 {
        c.read()?;
    }
    let Reply::Array(replies) = c.read()? else {
        return Err("EXEC failed".into());
    };
    match (&replies[0], &replies[1]) {
        (Reply::Array(items), Reply::Int(expires)) => Ok(Some(Snapshot {
            fields: items
                .chunks(2)
                .map(|kv| (kv[0].text().unwrap_or_default(), kv[1].clone()))
                .collect(),
            expires: *expires,
            owner: owner.to_string(),
        })),
        _ => Ok(None),
    }
}

fn server_ms(r: &Reply) -> Result<i64, String> {
    match r {
        Reply::Array(parts) if parts.len() == 2 => {
            let secs: i64 = parts[0].text().and_then(|t| t.parse().ok()).unwrap_or(0);
            let micros: i64 = parts[1].text().and_then(|t| t.parse().ok()).unwrap_or(0);
            Ok(secs * 1000 + micros / 1000)
        }
        _ => Err(format!("TIME: {r:?}")),
    }
}

fn field<'a>(fields: &'a [(String, Reply)], name: &str) -> Option<&'a Reply> {
    fields.iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

/// Every owner a case uses.
const OWNERS: [&str; 6] = ["H", "W", "W2", "Z", "P", "R"];

/// Who holds `key` exclusively (the owner of a lock, the writer of a rwlock,
/// the owners holding permits of a semaphore joined by commas) and its fence
/// (a semaphore's permits in use).
fn exclusive_holder(c: &mut Wire, kind: Kind, key: &str) -> Result<Option<(String, i64)>, String> {
    if kind == Kind::Semaphore {
        return semaphore_holders(c, key);
    }
    let Some(f) = c.lock_info(kind, key)? else {
        return Ok(None);
    };
    let name = match kind {
        Kind::RwLock => "writer",
        _ => "owner",
    };
    let holder = field(&f, name).and_then(Reply::text).unwrap_or_default();
    let fence = field(&f, "fence").and_then(Reply::int).unwrap_or(0);
    Ok(Some((holder, fence)))
}

/// `SEM.INFO` names no holders: asks about every owner a case uses, in one
/// pipeline (not in `MULTI`: a server over `maxmemory` refuses to queue any
/// command, and the eviction case asks while it is).
fn semaphore_holders(c: &mut Wire, key: &str) -> Result<Option<(String, i64)>, String> {
    let pipeline: Vec<Cmd> = OWNERS.iter().map(|o| cmd(&["SEM.INFO", key, o])).collect();
    c.send(&pipeline)?;
    let mut replies = Vec::new();
    for _ in OWNERS {
        replies.push(c.read()?);
    }
    let mut holders = Vec::new();
    let mut used = None;
    for (owner, r) in OWNERS.iter().zip(&replies) {
        match r {
            Reply::Array(items) => {
                let f: Vec<(String, Reply)> = items
                    .chunks(2)
                    .map(|kv| (kv[0].text().unwrap_or_default(), kv[1].clone()))
                    .collect();
                used = field(&f, "used").and_then(Reply::int);
                if field(&f, "permits").and_then(Reply::int).unwrap_or(0) > 0 {
                    holders.push(*owner);
                }
            }
            // No semaphore, or overwritten by another type.
            Reply::Nil => {}
            Reply::Error(e) if e.starts_with("WRONGTYPE") => {}
            r => return Err(format!("SEM.INFO {key} {owner}: {r:?}")),
        }
    }
    Ok(used.map(|used| (holders.join(","), used)))
}

// ---------------------------------------------------------------------------
// Who believed they held the lock, and when (server milliseconds).

struct Hold {
    who: &'static str,
    permits: u64,
    from: i64,
    until: i64,
}

#[derive(Default)]
struct Ledger(Vec<Hold>);

impl Ledger {
    fn hold(&mut self, who: &'static str, permits: u64, from: i64, until: i64) {
        self.0.push(Hold {
            who,
            permits,
            from,
            until,
        });
    }

    fn end(&mut self, who: &'static str, at: i64) {
        for h in self.0.iter_mut().filter(|h| h.who == who) {
            h.until = h.until.min(at);
        }
    }

    /// Never more than `limit` permits held at once (a lock: never two
    /// holders), 1 ms of clock rounding allowed: the most held at once is
    /// held at some hold's start.
    fn check(&self, limit: u64) -> Result<(), String> {
        for b in &self.0 {
            let at: Vec<&Hold> = self
                .0
                .iter()
                .filter(|h| h.from <= b.from && b.from < h.until - 1)
                .collect();
            if at.iter().map(|h| h.permits).sum::<u64>() > limit {
                let who: Vec<String> = at
                    .iter()
                    .map(|h| format!("{} ×{} [{}, {})", h.who, h.permits, h.from, h.until))
                    .collect();
                return Err(format!(
                    "more than {limit} permits held at {}: {}",
                    b.from,
                    who.join(", ")
                ));
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Servers for a state

struct Env {
    main: Server,
    /// Failover: the replica; Replica: a read-only and a writable replica.
    replicas: Vec<Server>,
    /// Demoted: the master the main server is made a replica of.
    other: Option<Server>,
    baseline: i64,
}

impl Env {
    fn new(state: State) -> Self {
        let mut env = match state {
            State::Failover => {
                let main = Server::start_tcp(&[]);
                let replica = Server::start_tcp(&[]);
                replicate(&main, &replica);
                Env {
                    main,
                    replicas: vec![replica],
                    other: None,
                    baseline: 0,
                }
            }
            State::Replica => {
                let main = Server::start_tcp(&[]);
                let ro = Server::start_tcp(&[]);
                let rw = Server::start_tcp(&["--replica-read-only", "no"]);
                replicate(&main, &ro);
                replicate(&main, &rw);
                Env {
                    main,
                    replicas: vec![ro, rw],
                    other: None,
                    baseline: 0,
                }
            }
            State::Demoted => Env {
                main: Server::start_tcp(&[]),
                replicas: vec![],
                other: Some(Server::start_tcp(&[])),
                baseline: 0,
            },
            _ => Env {
                main: Server::start(&[]),
                replicas: vec![],
                other: None,
                baseline: 0,
            },
        };
        env.baseline = env.settle_memory().expect("baseline");
        env
    }

    fn ctl(&self) -> Result<Wire, String> {
        Wire::open(&self.main.socket())
    }

    /// Warms the allocator the way a case does, then reads `used_memory`
    /// (less the replication backlog).
    fn settle_memory(&mut self) -> Result<i64, String> {
        let mut c = self.ctl()?;
        for i in 0..8 {
            let k = format!("warm{i}");
            c.ok(&["LOCK.ACQUIRE", &k, "w", "60000"])?;
            c.ok(&["RWLOCK.WRITE", &format!("{k}rw"), "w", "60000"])?;
            c.ok(&["SEM.ACQUIRE", &format!("{k}sm"), "w", "60000", "LIMIT", "2"])?;
        }
        c.ok(&["FLUSHALL"])?;
        let used = c.used_memory()?;
        Ok(used)
    }

    /// Lets a failover time out, then resumes the replicas a case stopped.
    fn resume(&mut self) -> Result<(), String> {
        let Ok(mut c) = self.ctl() else {
            // The master is gone: health() says why.
            self.replicas.iter().for_each(resume);
            return Ok(());
        };
        // A failover still waiting must time out before its replica resumes,
        // or it would complete.
        let waited = wait_until("no failover in progress", || {
            Ok(c.info_field("replication", "master_failover_state")?
                .is_none_or(|s| s == "no-failover"))
        });
        for r in &self.replicas {
            resume(r);
        }
        waited
    }

    /// Alive, answering, and no crash or assertion in any log.
    fn health(&mut self) -> Result<(), String> {
        let servers = std::iter::once(&mut self.main)
            .chain(self.replicas.iter_mut())
            .chain(self.other.iter_mut());
        for s in servers {
            let pong = Wire::open(&s.socket()).and_then(|mut c| c.call(&["PING"]));
            if pong != Ok(Reply::Status("PONG".into())) {
                // A crashing server may still be writing its report.
                let _ = wait_until("the server to exit", || Ok(s.exited()));
            }
            let log = s.log();
            let crash = [
                "==> ",
                "ASSERTION",
                "panicked",
                "BUG REPORT",
                "internal error",
            ]
            .iter()
            .find_map(|bad| log.lines().find(|l| l.contains(bad)));
            match (crash, s.exited()) {
                (Some(line), _) => return Err(format!("server log: {}", line.trim())),
                (None, true) => return Err("the server exited".into()),
                (None, false) => pong.map(|_| ())?,
            }
        }
        Ok(())
    }

    /// Puts every server back to a clean master/replica layout after a case.
    fn reset(&mut self) -> Result<(), String> {
        let mut c = self.ctl()?;
        c.ok(&["CLIENT", "UNPAUSE"])?;
        if self.other.is_some() {
            c.ok(&["REPLICAOF", "NO", "ONE"])?;
        }
        // Waiters of a failed case may still be blocked: end them.
        c.ok(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])?;
        c.ok(&["CONFIG", "SET", "maxmemory", "0"])?;
        c.ok(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])?;
        c.ok(&["FLUSHALL"])?;
        if let Some(other) = &self.other {
            Wire::open(&other.socket())?.ok(&["FLUSHALL"])?;
        }
        if !self.replicas.is_empty() {
            let n = self.replicas.len().to_string();
            wait_until("replicas caught up", || {
                Ok(c.int(&["WAIT", &n, "1000"])? == self.replicas.len() as i64)
            })?;
        }
        wait_until("nobody waiting", || {
            Ok(c.warden("waiting_clients")? == Some(0))
        })?;
        Ok(())
    }
}

/// `kill -STOP`: the server stops answering anyone, its master included.
fn stop(s: &Server) {
    signal(s, "-STOP");
}

fn resume(s: &Server) {
    signal(s, "-CONT");
}

fn signal(s: &Server, sig: &str) {
    if let Some(pid) = s.pid() {
        let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
    }
}

/// Polls `cond` for up to 10 s.
fn wait_until(what: &str, mut cond: impl FnMut() -> Result<bool, String>) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if cond()? {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}"));
        }
        thread::sleep(Duration::from_millis(3));
    }
}

// ---------------------------------------------------------------------------
// One case

/// A lease that no case waits out.
const LONG: i64 = 30_000;
/// A lease a case waits out.
const SHORT: i64 = 300;
/// A `WAIT` long enough that only a stranded waiter reaches it.
const WAIT_LONG: i64 = 8_000;
/// The `WAIT` of a waiter whose deadline meets the free.
const AT_DEADLINE: i64 = 150;
/// How long a pause or failover lasts past the moment the lock is freed.
const PAUSE_AFTER: i64 = 150;
/// A grant this long after the waiter's deadline is a grant past it.
const DEADLINE_SLACK: i64 = 25;

const MAX_SAFE_TOKEN: i64 = (1 << 53) - 1;

/// A blocked request with `ECHO <marker>` pipelined behind it.
struct Waiter {
    wire: Wire,
    id: i64,
    owner: &'static str,
    permits: u64,
    ttl: i64,
    wait: i64,
    /// Server time just before the request ran.
    sent: i64,
    sent_at: Instant,
    marker: String,
    counter: Option<String>,
    /// A reply already read (to see whether it had come by some moment).
    early: Option<Reply>,
}

impl Waiter {
    fn start(
        server: &Server,
        ask: Ask,
        key: &str,
        owner: &'static str,
        ttl: i64,
        wait: i64,
        counter: Option<String>,
    ) -> Result<Self, String> {
        let mut wire = Wire::open(&server.socket())?;
        let id = wire.int(&["CLIENT", "ID"])?;
        let marker = format!("after-{owner}-{key}");
        let mut cmds = vec![
            cmd(&["TIME"]),
            ask.cmd(key, owner, ttl, &["WAIT", &wait.to_string()]),
        ];
        if let Some(counter) = &counter {
            cmds.push(cmd(&["INCR", counter]));
        }
        cmds.push(cmd(&["ECHO", &marker]));
        let sent_at = Instant::now();
        wire.send(&cmds)?;
        let sent = server_ms(&wire.read()?)?;
        Ok(Self {
            wire,
            id,
            owner,
            permits: ask.permits(),
            ttl,
            wait,
            sent,
            sent_at,
            marker,
            counter,
            early: None,
        })
    }

    /// The reply to the blocked request, then exactly the pipelined ones.
    /// Whether the blocked request has been answered by now (reads the answer).
    fn answered(&mut self) -> Result<bool, String> {
        if self.early.is_none() && self.wire.has_data()? {
            self.early = Some(self.wire.read()?);
        }
        Ok(self.early.is_some())
    }

    fn replies(&mut self) -> Result<Reply, String> {
        let first = match self.early.take() {
            Some(r) => r,
            None => self.wire.read()?,
        };
        if first == Reply::Bulk(self.marker.clone().into_bytes()) {
            return Err(format!("{}: no reply to its request", self.owner));
        }
        if !matches!(first, Reply::Int(_) | Reply::Nil | Reply::Error(_)) {
            return Err(format!("{}: unexpected reply {first:?}", self.owner));
        }
        self.rest()?;
        Ok(first)
    }

    fn rest(&mut self) -> Result<(), String> {
        if self.counter.is_some() {
            let r = self.wire.read()?;
            // 1, or refused (READONLY on a replica, OOM while memory is full).
            if !(r == Reply::Int(1) || r.is_error()) {
                return Err(format!("{}: the INCR behind it got {r:?}", self.owner));
            }
        }
        let r = self.wire.read()?;
        if r != Reply::Bulk(self.marker.clone().into_bytes()) {
            return Err(format!(
                "{}: an extra or misplaced reply where the marker belongs: {r:?}",
                self.owner
            ));
        }
        Ok(())
    }

    /// For a killed waiter: at most one reply, then the connection ends.
    /// (Redis 8 runs `FLUSHALL`/`FLUSHDB` in the background with their
    /// caller blocked: a kill pipelined behind one runs after the flush has
    /// freed the key, so the waiter may be granted and answer its marker
    /// before the kill lands. That is still one reply per request.)
    fn replies_until_closed(&mut self) -> Result<Option<Reply>, String> {
        let first = self.wire.read_or_closed()?;
        if first.is_some() {
            let marker = Reply::Bulk(self.marker.clone().into_bytes());
            let mut second = self.wire.read_or_closed()?;
            if second == Some(marker) {
                second = self.wire.read_or_closed()?;
            }
            if let Some(second) = second {
                return Err(format!(
                    "{}: killed, yet a second reply came: {second:?}",
                    self.owner
                ));
            }
        }
        Ok(first)
    }
}

struct Run<'a> {
    case: Case,
    n: usize,
    env: &'a mut Env,
    key: String,
    c: Wire,
    ledger: Ledger,
    /// Writes were paused over this span of server time (a pause or failover):
    /// no grant may fall inside it.
    paused: Option<(i64, i64)>,
    /// Where the case is, for the failure message.
    stage: &'static str,
}

fn run_case(env: &mut Env, case: Case, n: usize) -> Result<(), String> {
    let key = format!("fm{n}");
    let c = env.ctl()?;
    let mut run = Run {
        case,
        n,
        env,
        key,
        c,
        ledger: Ledger::default(),
        paused: None,
        stage: "setup",
    };
    let outcome = run.go();
    outcome.map_err(|e| format!("[{}] {e}", run.stage))
}

impl Run<'_> {
    fn go(&mut self) -> Result<(), String> {
        let Case {
            kind,
            free,
            state,
            client,
        } = self.case;
        let key = self.key.clone();
        let at_deadline = client == Client::DeadlineAtFree;

        // The holder.
        self.stage = "holder";
        let h_ttl = match free {
            Free::LeaseEnd | Free::Restart if at_deadline => AT_DEADLINE,
            Free::LeaseEnd | Free::Restart => SHORT,
            Free::EvictAllkeysLru | Free::EvictVolatileTtl if at_deadline => 400,
            Free::EvictAllkeysLru | Free::EvictVolatileTtl => 600,
            _ => LONG,
        };
        let t0 = self.c.now()?;
        let h_fence = self
            .c
            .int(&strs(&kind.holder().words(&key, "H", h_ttl, &[])))?;
        let h_deadline = self.c.int(&["PEXPIRETIME", &key])?;
        self.ledger
            .hold("H", kind.holder().permits(), t0, h_deadline);
        if h_fence > MAX_SAFE_TOKEN {
            return Err(format!("token {h_fence} above 2^53-1"));
        }

        if state == State::Replica {
            self.replica_requests_answer_readonly()?;
        }

        // The waiter under test, and for the at-grant clients a second one behind it.
        self.stage = "queueing";
        let (w_ttl, w_wait) = match client {
            Client::Waiter => (LONG, WAIT_LONG),
            Client::Pipelined => (1000, 50),
            Client::KilledAtGrant => (SHORT, WAIT_LONG),
            Client::UnblockedAtGrant => (LONG, WAIT_LONG),
            Client::DeadlineAtFree if free.is_timed() => (LONG, h_ttl),
            Client::DeadlineAtFree => (LONG, AT_DEADLINE),
        };
        let counter = (client == Client::Pipelined).then(|| format!("{key}:counter"));
        let mut w = Waiter::start(
            &self.env.main,
            kind.waiter(),
            &key,
            "W",
            w_ttl,
            w_wait,
            counter,
        )?;
        if client == Client::Pipelined {
            // WAIT 50 may run out before it is seen queued: either is fine.
            let until = Instant::now() + Duration::from_millis(40);
            while self.waiters()? < 1 && Instant::now() < until {
                thread::sleep(Duration::from_millis(2));
            }
        } else {
            self.wait_queued(1)?;
        }
        let mut w2 = None;
        if matches!(client, Client::KilledAtGrant | Client::UnblockedAtGrant) {
            w2 = Some(Waiter::start(
                &self.env.main,
                kind.second(),
                &key,
                "W2",
                LONG,
                WAIT_LONG,
                None,
            )?);
            self.wait_queued(2)?;
        }

        // Before the free.
        self.stage = "before the free";
        match state {
            State::DebugReload => {
                self.c.ok(&["DEBUG", "RELOAD"])?;
                let queued = if w2.is_some() { 2 } else { 1 };
                // A 300 ms lease may have run out during a slow reload: the
                // queue then moved on by itself, as it should.
                let lease_ran_out = matches!(free, Free::LeaseEnd | Free::Restart)
                    && self.c.int(&["EXISTS", &key])? == 0;
                if client != Client::Pipelined && !lease_ran_out && self.waiters()? != queued {
                    return Err("DEBUG RELOAD lost the queue".into());
                }
            }
            State::Multi => {
                self.c.send(&[
                    cmd(&["MULTI"]),
                    kind.waiter().cmd(&key, "P", 1000, &["WAIT", "0"]),
                    cmd(&["EXEC"]),
                ])?;
                let replies = [self.c.read()?, self.c.read()?, self.c.read()?];
                if replies[2] != Reply::Array(vec![Reply::Nil]) {
                    return Err(format!(
                        "WAIT inside MULTI did not answer nil at once: {replies:?}"
                    ));
                }
            }
            State::Eval => {
                let ask = kind.waiter();
                let terms: String = ask.terms.iter().map(|t| format!(", '{t}'")).collect();
                let script = format!(
                    "return redis.call('{}', KEYS[1], 'P', 1000{terms}, 'WAIT', 0)",
                    ask.command
                );
                let r = self.c.call(&["EVAL", &script, "1", &key])?;
                if r != Reply::Nil {
                    return Err(format!(
                        "WAIT inside EVAL did not answer nil at once: {r:?}"
                    ));
                }
            }
            _ => {}
        }

        // Eviction and the replacement lock come before any pause.
        self.stage = "eviction";
        let mut restore = None;
        if let Some(policy) = free.evicts() {
            self.evict(policy)?;
            // Every reply sent before TIME ran has reached its socket by now.
            let now = self.c.now()?;
            if now < h_deadline && w.answered()? && matches!(w.early, Some(Reply::Int(_))) {
                return Err(format!(
                    "granted at the eviction, {} ms before the evicted holder's lease ended",
                    h_deadline - now
                ));
            }
            // The old holder lost it: refused, and nothing changes.
            let extend = self.c.int(&[kind.extend(), &key, "H", "60000"])?;
            let release = self.c.int(&[kind.release(), &key, "H"])?;
            if (extend, release) != (0, kind.not_held()) {
                return Err(format!(
                    "after eviction the old holder's EXTEND/RELEASE answered {extend}/{release}, not 0/{}",
                    kind.not_held()
                ));
            }
        }
        if free == Free::RestoreReplace {
            let zkey = format!("{key}:z");
            self.c
                .int(&strs(&kind.holder().words(&zkey, "Z", LONG, &[])))?;
            self.c
                .send(&[cmd(&["DUMP", &zkey]), cmd(&["PTTL", &zkey])])?;
            let Reply::Bulk(payload) = self.c.read()? else {
                return Err("DUMP failed".into());
            };
            let pttl = self.c.read()?.int().ok_or("PTTL")?;
            restore = Some((payload, pttl));
        }

        // The state during the free.
        self.stage = "pausing";
        let remaining = (h_deadline - self.c.now()?).max(0);
        let hold_ms = if free.is_timed() { remaining } else { 0 }
            + if at_deadline { w_wait } else { 0 }
            + PAUSE_AFTER;
        match state {
            State::PauseWrite | State::PauseAll => {
                let mode = if state == State::PauseWrite {
                    "WRITE"
                } else {
                    "ALL"
                };
                self.c.send(&[
                    cmd(&["TIME"]),
                    cmd(&["CLIENT", "PAUSE", &hold_ms.to_string(), mode]),
                ])?;
                let t = server_ms(&self.c.read()?)?;
                expect_ok(self.c.read()?, "CLIENT PAUSE")?;
                self.paused = Some((t, t + hold_ms));
            }
            State::Failover => {
                // The stopped replica never acknowledges the write below, so
                // the failover waits for it until its timeout, writes paused.
                stop(&self.env.replicas[0]);
                self.c.ok(&["SET", &format!("{key}:bump"), "1"])?;
                self.c.send(&[
                    cmd(&["TIME"]),
                    cmd(&["FAILOVER", "TIMEOUT", &hold_ms.to_string()]),
                ])?;
                let t = server_ms(&self.c.read()?)?;
                expect_ok(self.c.read()?, "FAILOVER")?;
                self.paused = Some((t, t + hold_ms));
            }
            _ => {}
        }

        // The free.
        self.stage = "freeing";
        if at_deadline && !free.is_timed() {
            let offset = [-2i64, 0, 2][self.n % 3];
            let aim = w.sent_at + Duration::from_millis((w_wait + offset).max(0) as u64);
            thread::sleep(aim.saturating_duration_since(Instant::now()));
        }
        let grant_step = self.free_steps(restore.as_ref());
        let last = grant_step.len().saturating_sub(1);
        for (i, step) in grant_step.into_iter().enumerate() {
            let mut extra = Vec::new();
            if i == last {
                match client {
                    Client::KilledAtGrant => {
                        extra.push(cmd(&["CLIENT", "KILL", "ID", &w.id.to_string()]))
                    }
                    Client::UnblockedAtGrant => {
                        extra.push(cmd(&["CLIENT", "UNBLOCK", &w.id.to_string()]))
                    }
                    _ => {}
                }
            }
            let (t, replies) = self.exec(step.cmds, extra)?;
            (step.check)(&replies)
                .map_err(|e| format!("{}: {e} (replies {replies:?})", step.what))?;
            for who in step.ends {
                self.ledger.end(who, t);
            }
            if step.starts_z {
                let permits = self.case.kind.holder().permits();
                self.ledger.hold("Z", permits, t, i64::MAX);
            }
        }

        // The waiter's answer.
        self.stage = "answers";
        let w_result = match client {
            Client::KilledAtGrant => self.killed_waiter(&mut w, w2.as_mut().unwrap()),
            _ => self.answered_waiter(&mut w, w2.as_mut()),
        };
        w_result?;

        if state == State::Replica {
            self.replicas_agree()?;
        }
        if free.evicts().is_some() {
            match self.c.warden("evicted_locks")? {
                None => return Err("INFO warden has no evicted_locks counter".into()),
                Some(0) => return Err("evicted_locks did not count the eviction".into()),
                Some(_) => {}
            }
        }
        self.ledger.check(self.case.kind.limit())
    }

    fn waiters(&mut self) -> Result<i64, String> {
        let key = self.key.clone();
        Ok(self
            .c
            .lock_info(self.case.kind, &key)?
            .and_then(|f| field(&f, "waiters").and_then(Reply::int))
            .unwrap_or(0))
    }

    fn wait_queued(&mut self, n: i64) -> Result<(), String> {
        wait_until(&format!("{n} queued"), || Ok(self.waiters()? == n))
    }

    /// Fills memory under `policy` until the holder's lock is evicted, then
    /// lifts the limit.
    fn evict(&mut self, policy: &str) -> Result<(), String> {
        let key = self.key.clone();
        let kind = self.case.kind;
        self.c.ok(&["CONFIG", "SET", "maxmemory-policy", policy])?;
        let used: i64 = self
            .c
            .info_field("memory", "used_memory")?
            .and_then(|v| v.parse().ok())
            .ok_or("used_memory")?;
        self.c.ok(&[
            "CONFIG",
            "SET",
            "maxmemory",
            &(used + (256 << 10)).to_string(),
        ])?;
        let filler = "x".repeat(8 << 10);
        let mut evicted = false;
        for i in 0..20_000 {
            // OK, or OOM once only unevictable keys are left.
            self.c.call(&["SET", &format!("{key}:fill:{i}"), &filler])?;
            // Gone, or (granted at once) no longer the holder's.
            if exclusive_holder(&mut self.c, kind, &key)?.is_none_or(|(h, _)| h != "H") {
                evicted = true;
                break;
            }
        }
        self.c.ok(&["CONFIG", "SET", "maxmemory", "0"])?;
        self.c
            .ok(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])?;
        if evicted {
            Ok(())
        } else {
            Err(format!("{policy} never evicted the lock"))
        }
    }

    /// Runs `cmds` (plus `extra` in the same pipeline) as the state says:
    /// plain, inside MULTI/EXEC, or inside EVAL. Returns the server time just
    /// before and the replies of `cmds`.
    fn exec(&mut self, cmds: Vec<Cmd>, extra: Vec<Cmd>) -> Result<(i64, Vec<Reply>), String> {
        let n = cmds.len();
        let mut pipeline = vec![cmd(&["TIME"])];
        match self.case.state {
            State::Multi => {
                pipeline.push(cmd(&["MULTI"]));
                pipeline.extend(cmds);
                pipeline.extend(extra.iter().cloned());
                pipeline.push(cmd(&["EXEC"]));
            }
            State::Eval => {
                let mut script = String::from("return {");
                let mut args: Vec<Vec<u8>> = Vec::new();
                for c in &cmds {
                    let placeholders: Vec<String> = c
                        .iter()
                        .map(|a| {
                            args.push(a.clone());
                            format!("ARGV[{}]", args.len())
                        })
                        .collect();
                    script.push_str(&format!("redis.call({}),", placeholders.join(",")));
                }
                script.push('}');
                let mut e = cmd(&["EVAL", &script, "0"]);
                e.extend(args);
                pipeline.push(e);
                pipeline.extend(extra.iter().cloned());
            }
            _ => {
                pipeline.extend(cmds);
                pipeline.extend(extra.iter().cloned());
            }
        }
        self.c.send(&pipeline)?;
        let t = server_ms(&self.c.read()?)?;
        let replies = match self.case.state {
            State::Multi => {
                expect_ok(self.c.read()?, "MULTI")?;
                for _ in 0..n + extra.len() {
                    let q = self.c.read()?;
                    if q != Reply::Status("QUEUED".into()) {
                        return Err(format!("not queued in MULTI: {q:?}"));
                    }
                }
                match self.c.read()? {
                    Reply::Array(mut all) => {
                        all.truncate(n);
                        all
                    }
                    r => return Err(format!("EXEC: {r:?}")),
                }
            }
            State::Eval => {
                let r = self.c.read()?;
                for _ in 0..extra.len() {
                    self.c.read()?;
                }
                match r {
                    Reply::Array(all) => all,
                    r => return Err(format!("EVAL: {r:?}")),
                }
            }
            _ => {
                let mut all = Vec::new();
                for _ in 0..n {
                    all.push(self.c.read()?);
                }
                for _ in 0..extra.len() {
                    self.c.read()?;
                }
                all
            }
        };
        Ok((t, replies))
    }

    /// The commands that free the lock, step by step; the waiter's grant
    /// follows the last step.
    fn free_steps(&self, restore: Option<&(Vec<u8>, i64)>) -> Vec<Step> {
        let kind = self.case.kind;
        let key = self.key.as_str();
        let one =
            |what: &'static str, cmds: Vec<Cmd>, check: fn(&[Reply]) -> Result<(), String>| Step {
                what,
                cmds,
                check,
                ends: vec!["H"],
                starts_z: false,
            };
        match self.case.free {
            Free::LeaseEnd | Free::EvictAllkeysLru | Free::EvictVolatileTtl => vec![],
            Free::Restart => vec![Step {
                ends: vec![],
                ..one("DEBUG RELOAD", vec![cmd(&["DEBUG", "RELOAD"])], all_ok)
            }],
            Free::Release if self.case.state == State::Demoted => vec![
                Step {
                    ends: vec![],
                    ..one(
                        "REPLICAOF",
                        vec![cmd(&[
                            "REPLICAOF",
                            "127.0.0.1",
                            &self.env.other.as_ref().unwrap().port.unwrap().to_string(),
                        ])],
                        all_ok,
                    )
                },
                Step {
                    ends: vec![],
                    ..one(
                        "release on a demoted master",
                        vec![cmd(&[kind.release(), key, "H"])],
                        readonly,
                    )
                },
            ],
            Free::Release => vec![one(
                "release",
                vec![cmd(&[kind.release(), key, "H"])],
                |r| expect_int(r, 1),
            )],
            Free::Del => vec![one("DEL", vec![cmd(&["DEL", key])], |r| expect_int(r, 1))],
            Free::Unlink => vec![one("UNLINK", vec![cmd(&["UNLINK", key])], |r| {
                expect_int(r, 1)
            })],
            Free::FlushDb => vec![one("FLUSHDB", vec![cmd(&["FLUSHDB"])], all_ok)],
            Free::FlushAll => vec![one("FLUSHALL", vec![cmd(&["FLUSHALL"])], all_ok)],
            Free::SwapDb => vec![one("SWAPDB", vec![cmd(&["SWAPDB", "0", "9"])], all_ok)],
            Free::Rename => vec![one(
                "RENAME",
                vec![cmd(&["RENAME", key, &format!("{key}:renamed")])],
                all_ok,
            )],
            Free::Move => vec![one("MOVE", vec![cmd(&["MOVE", key, "1"])], |r| {
                expect_int(r, 1)
            })],
            Free::OverwriteBySet => vec![one("SET", vec![cmd(&["SET", key, "plain"])], all_ok)],
            Free::RestoreReplace => {
                let (payload, pttl) = restore.unwrap();
                let mut restore_cmd = cmd(&["RESTORE", key, &pttl.to_string()]);
                restore_cmd.push(payload.clone());
                restore_cmd.push(b"REPLACE".to_vec());
                vec![
                    Step {
                        starts_z: true,
                        ..one("RESTORE ... REPLACE", vec![restore_cmd], all_ok)
                    },
                    Step {
                        ends: vec!["Z"],
                        ..one(
                            "release of the restored lock",
                            vec![cmd(&[kind.release(), key, "Z"])],
                            |r| expect_int(r, 1),
                        )
                    },
                ]
            }
        }
    }

    /// The waiter's one reply, checked against the lock's state.
    fn answered_waiter(&mut self, w: &mut Waiter, w2: Option<&mut Waiter>) -> Result<(), String> {
        let Case {
            kind,
            free,
            state,
            client,
        } = self.case;
        let key = self.key.clone();
        let reply = if state == State::Demoted {
            // Answered at the demotion, and then the connection may be closed.
            let first = w.wire.read()?;
            if first.is_error() {
                if let Some(next) = w.wire.read_or_closed()? {
                    if next != Reply::Bulk(w.marker.clone().into_bytes()) {
                        return Err(format!("after {first:?} came {next:?}"));
                    }
                }
            } else {
                w.rest()?;
            }
            first
        } else {
            w.replies()?
        };
        match &reply {
            Reply::Int(fence) => {
                if state == State::Demoted {
                    return Err(format!("granted {fence} on a master being demoted"));
                }
                if free == Free::OverwriteBySet {
                    return Err(format!("granted {fence} on a key overwritten by SET"));
                }
                self.granted(w, *fence)?;
                if client == Client::UnblockedAtGrant {
                    // It holds: its release hands on to the second waiter.
                    let t = self.c.now()?;
                    self.c.int(&[kind.release(), &key, "W"])?;
                    self.ledger.end("W", t);
                }
            }
            Reply::Nil => {
                if let Some((holders, _)) = exclusive_holder(&mut self.c, kind, &key)? {
                    if holders.split(',').any(|h| h == w.owner) {
                        return Err("answered nil, yet it holds the lock".into());
                    }
                }
                let may_time_out = matches!(
                    client,
                    Client::Pipelined | Client::DeadlineAtFree | Client::UnblockedAtGrant
                ) || state == State::Demoted;
                if !may_time_out {
                    return Err(format!(
                        "stranded: nil after WAIT {} although the lock was freed",
                        w.wait
                    ));
                }
            }
            Reply::Error(e) => {
                let expected = (free == Free::OverwriteBySet && e.starts_with("WRONGTYPE"))
                    || (state == State::Demoted
                        && (e.starts_with("UNBLOCKED") || e.starts_with("READONLY")));
                if !expected {
                    return Err(format!("the waiter got an error: {e}"));
                }
            }
            r => return Err(format!("unexpected reply {r:?}")),
        }
        if let Some(w2) = w2 {
            // Granted once the first waiter let go (or never got it).
            self.second_waiter(w2)?;
        }
        self.ledger.check(self.case.kind.limit())
    }

    /// The waiter behind: granted, or told the key is no lock any more.
    fn second_waiter(&mut self, w2: &mut Waiter) -> Result<(), String> {
        let r = w2.replies()?;
        match r {
            Reply::Error(e)
                if self.case.free == Free::OverwriteBySet && e.starts_with("WRONGTYPE") =>
            {
                Ok(())
            }
            Reply::Int(fence) if self.case.free != Free::OverwriteBySet => self.granted(w2, fence),
            r => Err(format!("the second waiter got {r:?}")),
        }
    }

    /// Killed at the grant: it never got the lock (the next waiter gets it) or
    /// holds it until its lease ends — never both.
    fn killed_waiter(&mut self, w: &mut Waiter, w2: &mut Waiter) -> Result<(), String> {
        let kind = self.case.kind;
        let key = self.key.clone();
        let seen = snapshot(&mut self.c, kind, &key, w.owner)?;
        // Only a token that reached the client makes it believe it holds.
        if let Some(Reply::Int(fence)) = w.replies_until_closed()? {
            check_token(fence)?;
            match seen {
                Some(s) if s.shows(kind, fence) && s.holder(kind) == w.owner => {
                    self.ledger
                        .hold(w.owner, w.permits, s.expires - w.ttl, s.expires);
                }
                _ => {
                    return Err(format!(
                        "the killed waiter was sent token {fence} but the lock was already given on"
                    ))
                }
            }
        }
        self.second_waiter(w2)
    }

    /// A grant: the waiter holds with its fence, within its deadline, after any pause.
    fn granted(&mut self, w: &Waiter, fence: i64) -> Result<(), String> {
        let kind = self.case.kind;
        let key = self.key.clone();
        check_token(fence)?;
        let Some(s) = snapshot(&mut self.c, kind, &key, w.owner)? else {
            return Err(format!(
                "{} was granted {fence} but holds nothing: its lock is gone already",
                w.owner
            ));
        };
        if !s.shows(kind, fence) {
            return Err(format!(
                "{} was granted {fence} but the lock says {:?}",
                w.owner, s.fields
            ));
        }
        // The second waiter of a rwlock is a reader: no single holder to name.
        let exclusive = kind != Kind::RwLock || w.owner != "W2";
        if exclusive && s.holder(kind) != w.owner {
            return Err(format!(
                "{} was granted {fence} but {} holds",
                w.owner,
                s.holder(kind)
            ));
        }
        // Nobody else holds (so the key's expiry is this hold's lease end).
        if s.holders() != 1 {
            return Err(format!(
                "{} was granted {fence} beside others: {:?}",
                w.owner, s.fields
            ));
        }
        let grant = s.expires - w.ttl;
        if grant > w.sent + w.wait + DEADLINE_SLACK {
            return Err(format!(
                "{} granted {} ms after its WAIT {} ran out",
                w.owner,
                grant - w.sent - w.wait,
                w.wait
            ));
        }
        if let Some((from, until)) = self.paused {
            if from < grant && grant < until - 1 {
                return Err(format!(
                    "{} granted {} ms before writes were resumed",
                    w.owner,
                    until - grant
                ));
            }
        }
        self.ledger.hold(w.owner, w.permits, grant, grant + w.ttl);
        Ok(())
    }

    /// Lock requests sent to replicas are refused at once, never queued.
    fn replica_requests_answer_readonly(&mut self) -> Result<(), String> {
        let kind = self.case.kind;
        let key = self.key.clone();
        Wire::open(&self.env.main.socket())?.int(&["WAIT", "2", "5000"])?;
        for (i, replica) in self.env.replicas.iter().enumerate() {
            let counter = (self.case.client == Client::Pipelined).then(|| format!("{key}:c{i}"));
            // A short WAIT: a replica that queues (wrongly) answers soon anyway.
            let mut w = Waiter::start(replica, kind.waiter(), &key, "R", 1000, 300, counter)?;
            let first = w.replies().map_err(|e| format!("replica {i}: {e}"))?;
            if !matches!(&first, Reply::Error(e) if e.starts_with("READONLY")) {
                return Err(format!("replica {i} answered {first:?}, not READONLY"));
            }
        }
        Ok(())
    }

    /// After the free, every replica shows the master's lock.
    fn replicas_agree(&mut self) -> Result<(), String> {
        let kind = self.case.kind;
        let key = self.key.clone();
        self.c.int(&["WAIT", "2", "5000"])?;
        let master = exclusive_holder(&mut self.c, kind, &key)?;
        for (i, replica) in self.env.replicas.iter().enumerate() {
            let got = exclusive_holder(&mut Wire::open(&replica.socket())?, kind, &key)?;
            if got != master {
                return Err(format!("replica {i} has {got:?}, the master {master:?}"));
            }
            let waiting = Wire::open(&replica.socket())?.warden("waiting_clients")?;
            if waiting != Some(0) {
                return Err(format!("replica {i} has waiting clients: {waiting:?}"));
            }
        }
        Ok(())
    }
}

struct Step {
    what: &'static str,
    cmds: Vec<Cmd>,
    check: fn(&[Reply]) -> Result<(), String>,
    /// Holders whose hold this step ends.
    ends: Vec<&'static str>,
    /// The step makes Z (a restored lock) the holder.
    starts_z: bool,
}

fn all_ok(replies: &[Reply]) -> Result<(), String> {
    match replies.iter().find(|r| r.is_error()) {
        Some(e) => Err(format!("{e:?}")),
        None => Ok(()),
    }
}

fn expect_int(replies: &[Reply], n: i64) -> Result<(), String> {
    if replies.iter().all(|r| r.int() == Some(n)) {
        Ok(())
    } else {
        Err(format!("expected {n}"))
    }
}

fn readonly(replies: &[Reply]) -> Result<(), String> {
    if replies
        .iter()
        .all(|r| matches!(r, Reply::Error(e) if e.starts_with("READONLY")))
    {
        Ok(())
    } else {
        Err("expected READONLY".into())
    }
}

fn expect_ok(r: Reply, what: &str) -> Result<(), String> {
    if r == Reply::Status("OK".into()) {
        Ok(())
    } else {
        Err(format!("{what}: {r:?}"))
    }
}

fn check_token(fence: i64) -> Result<(), String> {
    if fence <= 0 || fence > MAX_SAFE_TOKEN {
        Err(format!("token {fence} outside 1..=2^53-1"))
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Running a state's cases

/// Runs every case of `state` on `threads` environments; panics with the list
/// of failures.
fn run_state(state: State, threads: usize) {
    // WARDEN_FAULT_CASE=<part of a case name> runs only the matching cases.
    let only = std::env::var("WARDEN_FAULT_CASE").unwrap_or_default();
    let all: Vec<Case> = matrix()
        .into_iter()
        .filter(|c| c.state == state && c.to_string().contains(&only))
        .collect();
    let (skipped, cases): (Vec<Case>, Vec<Case>) =
        all.iter().partition(|c| skip_reason(c).is_some());
    let started = Instant::now();
    let chunks: Vec<Vec<(usize, Case)>> = (0..threads)
        .map(|t| {
            cases
                .iter()
                .copied()
                .enumerate()
                .filter(|(i, _)| i % threads == t)
                .collect()
        })
        .collect();
    let failures: Vec<String> = chunks
        .into_iter()
        .map(|chunk| thread::spawn(move || run_chunk(state, chunk)))
        .collect::<Vec<_>>()
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    println!(
        "fault matrix, state {state} ({}): {} cases, {} skipped, {} run, {} failed in {:.1}s",
        if is_valkey() { "valkey" } else { "redis" },
        all.len(),
        skipped.len(),
        cases.len(),
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    for f in &failures {
        println!("FAILED {f}");
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed in state {state}:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

fn run_chunk(state: State, chunk: Vec<(usize, Case)>) -> Vec<String> {
    let mut failures = Vec::new();
    let mut env = Env::new(state);
    for (n, case) in chunk {
        if naming_cases() {
            eprintln!("case {n}: {case}");
        }
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_case(&mut env, case, n)))
                .unwrap_or_else(|p| Err(format!("panicked: {p:?}")));
        let resumed = env.resume();
        let health = env.health().and(resumed);
        let reset = health.clone().and_then(|_| env.reset());
        let verdict = match (outcome, health, reset) {
            (Ok(()), Ok(()), Ok(())) => None,
            (Err(e), Ok(()), _) => Some(e),
            (Ok(()), Ok(()), Err(e)) => Some(format!("after the case: {e}")),
            (o, Err(h), _) => Some(format!(
                "{h}{}",
                o.err()
                    .map(|e| format!(" (the case saw: {e})"))
                    .unwrap_or_default()
            )),
        };
        if let Some(why) = verdict {
            failures.push(format!("{case}: {why}"));
            let resumed = env.resume();
            if env.health().and(resumed).is_err() || env.reset().is_err() {
                env = Env::new(state);
            }
        }
    }
    // Memory back to where it started: nothing leaked by waiters, timers or holds.
    let mut c = env.ctl().expect("ctl");
    let bound = env.baseline + (2 << 20);
    let settled = wait_until("used_memory back near its start", || {
        Ok(c.used_memory()? < bound)
    });
    if let Err(e) = settled {
        let mut parts = Vec::new();
        for name in [
            "used_memory",
            "mem_replication_backlog",
            "mem_clients_slaves",
            "mem_clients_normal",
            "used_memory_dataset",
        ] {
            if let Ok(Some(v)) = c.info_field("memory", name) {
                parts.push(format!("{name} {v}"));
            }
        }
        failures.push(format!(
            "state {state}: {e} (baseline {}; {})",
            env.baseline,
            parts.join(", ")
        ));
    }
    failures
}

/// With WARDEN_FAULT_CASE set, each case is named as it starts.
fn naming_cases() -> bool {
    std::env::var("WARDEN_FAULT_CASE").is_ok()
}

#[test]
fn the_matrix_is_the_whole_product_with_reasons_for_every_skip() {
    let all = matrix();
    assert_eq!(
        all.len(),
        KINDS.len() * FREES.len() * STATES.len() * CLIENTS.len()
    );
    let mut reasons: Vec<(&str, usize)> = Vec::new();
    for c in &all {
        if let Some(r) = skip_reason(c) {
            match reasons.iter_mut().find(|(x, _)| *x == r) {
                Some((_, n)) => *n += 1,
                None => reasons.push((r, 1)),
            }
        }
    }
    let skipped: usize = reasons.iter().map(|(_, n)| n).sum();
    println!("fault matrix: {} cases, {skipped} skipped", all.len());
    for (r, n) in &reasons {
        println!("  {n:4} skipped: {r}");
    }
    for state in STATES {
        assert!(
            all.iter()
                .any(|c| c.state == state && skip_reason(c).is_none()),
            "state {state} runs no case"
        );
    }
}

#[test]
fn the_ledger_counts_permits_against_the_limit() {
    let mut ledger = Ledger::default();
    ledger.hold("H", 1, 0, 100);
    ledger.hold("W2", 1, 50, 150);
    assert!(ledger.check(2).is_ok(), "1 + 1 permits under a limit of 2");
    assert!(ledger.check(1).is_err(), "two holders of a lock");
    ledger.hold("W", 2, 120, 200);
    let e = ledger.check(2).unwrap_err();
    assert!(e.contains("W2 ×1") && e.contains("W ×2"), "{e}");
    // A hold that starts as another ends (1 ms of rounding) is no overlap.
    let mut ledger = Ledger::default();
    ledger.hold("H", 1, 0, 100);
    ledger.hold("W", 1, 99, 200);
    assert!(ledger.check(1).is_ok());
}

#[test]
fn faults_in_normal_operation() {
    run_state(State::Normal, 2);
}

#[test]
fn faults_while_writes_are_paused() {
    run_state(State::PauseWrite, 2);
}

#[test]
fn faults_while_all_clients_are_paused() {
    run_state(State::PauseAll, 2);
}

#[test]
fn faults_during_a_failover_that_times_out() {
    run_state(State::Failover, 2);
}

#[test]
fn faults_with_requests_sent_to_replicas() {
    run_state(State::Replica, 1);
}

#[test]
fn faults_when_the_master_is_demoted() {
    run_state(State::Demoted, 1);
}

#[test]
fn faults_after_a_debug_reload() {
    run_state(State::DebugReload, 1);
}

#[test]
fn faults_inside_multi() {
    run_state(State::Multi, 1);
}

#[test]
fn faults_inside_eval() {
    run_state(State::Eval, 1);
}

// ---------------------------------------------------------------------------
// Faults outside the matrix

#[test]
fn effect_commands_from_an_ordinary_client_are_refused() {
    let s = Server::start(&[]);
    let mut c = Wire::open(&s.socket()).unwrap();
    let far = (c.now().unwrap() + 60_000).to_string();
    for words in [
        vec!["WARDEN.LOCKSET", "k", "intruder", "1", "1", &far],
        vec!["WARDEN.RWSET", "k", "1", "W", "intruder", "1", "1", &far],
        vec![
            "WARDEN.SEMSET",
            "k",
            "2",
            "1",
            "0",
            "SET",
            "intruder",
            "1",
            "1",
            &far,
        ],
        vec![
            "WARDEN.RWHOLD",
            "k",
            "1",
            "1",
            "W",
            "intruder",
            "1",
            "1",
            &far,
        ],
    ] {
        let r = c.call(&words).unwrap();
        assert!(r.is_error(), "{words:?} from a client answered {r:?}");
        assert_eq!(
            c.call(&["EXISTS", "k"]).unwrap(),
            Reply::Int(0),
            "{words:?}"
        );
    }
}

/// A blocked request on `key` (WAIT 3 s) with its marker behind it.
fn queue(s: &Server, ask: Ask, key: &str, owner: &'static str) -> Waiter {
    Waiter::start(s, ask, key, owner, 30_000, 3_000, None).unwrap()
}

#[test]
fn lock_and_rwlock_waiters_on_one_name_never_strand() {
    for (first, second) in [(Kind::Lock, Kind::RwLock), (Kind::RwLock, Kind::Lock)] {
        let s = Server::start(&[]);
        let mut c = Wire::open(&s.socket()).unwrap();
        // A waiter of the first kind queues behind its holder...
        c.int(&strs(&first.holder().words("k", "holder", 30_000, &[])))
            .unwrap();
        let mut a = queue(&s, first.waiter(), "k", "A");
        wait_until("A queued", || {
            Ok(c.lock_info(first, "k")?
                .and_then(|f| field(&f, "waiters").and_then(Reply::int))
                == Some(1))
        })
        .unwrap();
        // ...then the name becomes a lock of the other kind, and one of that kind queues.
        c.int(&strs(&second.holder().words("src", "other", 30_000, &[])))
            .unwrap();
        let Reply::Bulk(payload) = c.call(&["DUMP", "src"]).unwrap() else {
            panic!("DUMP")
        };
        let mut restore = cmd(&["RESTORE", "k", "30000"]);
        restore.push(payload);
        restore.push(b"REPLACE".to_vec());
        c.send(&[restore]).unwrap();
        assert_eq!(c.read().unwrap(), Reply::Status("OK".into()));
        let mut b = queue(&s, second.waiter(), "k", "B");
        wait_until("B queued or answered", || {
            Ok(b.answered()?
                || c.lock_info(second, "k")?
                    .and_then(|f| field(&f, "waiters").and_then(Reply::int))
                    .is_some_and(|n| n >= 1))
        })
        .unwrap();
        // The name is freed: whoever is at the head is served, and nobody
        // is left waiting on a free key.
        assert_eq!(c.call(&["DEL", "k"]).unwrap(), Reply::Int(1));
        for w in [&mut a, &mut b] {
            let kind = if w.owner == "A" { first } else { second };
            let r = w
                .replies()
                .unwrap_or_else(|e| panic!("{first} then {second}: {e}"));
            match r {
                Reply::Int(_) => {
                    // It holds: let the other one have its turn.
                    assert_eq!(c.int(&[kind.release(), "k", w.owner]).unwrap(), 1);
                }
                Reply::Error(e) if e.starts_with("WRONGTYPE") => {}
                r => panic!(
                    "{first} then {second}: {} stranded on a free key: {r:?}",
                    w.owner
                ),
            }
        }
        assert_eq!(c.warden("waiting_clients").unwrap(), Some(0));
    }
}

/// A semaphore of limit 3 asked for 2 permits, and for 1.
const SEM_TWO: Ask = Ask {
    command: "SEM.ACQUIRE",
    terms: &["LIMIT", "3", "PERMITS", "2"],
};
const SEM_ONE: Ask = Ask {
    command: "SEM.ACQUIRE",
    terms: &["LIMIT", "3", "PERMITS", "1"],
};

/// When the server granted `owner`'s hold of `ttl` ms on a semaphore.
fn sem_grant_time(c: &mut Wire, key: &str, owner: &str, ttl: i64) -> Result<i64, String> {
    c.send(&[
        cmd(&["MULTI"]),
        cmd(&["TIME"]),
        cmd(&["SEM.INFO", key, owner]),
        cmd(&["EXEC"]),
    ])?;
    for _ in 0..3 {
        c.read()?;
    }
    let r = c.read()?;
    let Reply::Array(parts) = &r else {
        return Err(format!("EXEC: {r:?}"));
    };
    let Reply::Array(items) = &parts[1] else {
        return Err(format!("SEM.INFO {key} {owner}: {r:?}"));
    };
    let fields: Vec<(String, Reply)> = items
        .chunks(2)
        .map(|kv| (kv[0].text().unwrap_or_default(), kv[1].clone()))
        .collect();
    let left = field(&fields, "ttl").and_then(Reply::int).unwrap_or(-2);
    if left < 0 {
        return Err(format!("{owner} holds nothing: {fields:?}"));
    }
    Ok(server_ms(&parts[0])? + left - ttl)
}

/// While writes are paused a lease that ends grants nobody; once the pause
/// lifts the waiters are granted in FIFO order as far as the permits go —
/// the one asking 1 permit never before the one asking 2 ahead of it.
#[test]
fn semaphore_waiters_are_granted_in_order_once_writes_resume() {
    const PAUSE: i64 = 2000;
    let s = Server::start(&[]);
    let mut c = Wire::open(&s.socket()).unwrap();
    c.int(&strs(&SEM_TWO.words("k", "H", 300, &[]))).unwrap();
    let semaphore = |c: &mut Wire| {
        let f = c
            .lock_info(Kind::Semaphore, "k")
            .unwrap()
            .unwrap_or_default();
        let n = |name| field(&f, name).and_then(Reply::int).unwrap_or(0);
        (n("used"), n("waiters"))
    };
    // A asks 2 with 1 free: it waits, and B and C, who would fit, queue behind.
    let mut waiters = Vec::new();
    for (ask, owner) in [(SEM_TWO, "A"), (SEM_ONE, "B"), (SEM_ONE, "C")] {
        waiters.push(Waiter::start(&s, ask, "k", owner, LONG, WAIT_LONG, None).unwrap());
        let n = waiters.len() as i64;
        wait_until("queued", || Ok(semaphore(&mut c).1 == n)).unwrap();
    }
    let deadline = c.int(&["PEXPIRETIME", "k"]).unwrap();
    c.send(&[
        cmd(&["TIME"]),
        cmd(&["CLIENT", "PAUSE", &PAUSE.to_string(), "WRITE"]),
    ])
    .unwrap();
    let paused_at = server_ms(&c.read().unwrap()).unwrap();
    expect_ok(c.read().unwrap(), "CLIENT PAUSE").unwrap();
    let resumed = paused_at + PAUSE;
    // H's lease ends inside the pause: seen while it lasts, nobody is served.
    wait_until("H's lease over", || Ok(c.now()? > deadline + 20)).unwrap();
    let (_, queued) = semaphore(&mut c);
    if c.now().unwrap() < resumed - 50 {
        assert_eq!(queued, 3, "a waiter was served while writes were paused");
    }
    let mut tokens = Vec::new();
    for w in &mut waiters[..2] {
        let Reply::Int(token) = w.replies().unwrap() else {
            panic!("{} not granted", w.owner)
        };
        let at = sem_grant_time(&mut c, "k", w.owner, LONG).unwrap();
        assert!(
            at >= resumed - 1,
            "{} granted {} ms before writes resumed",
            w.owner,
            resumed - at
        );
        tokens.push(token);
    }
    assert_eq!(semaphore(&mut c), (3, 1), "A (2) and B (1) hold, C waits");
    assert!(
        !waiters[2].answered().unwrap(),
        "C granted beyond the limit"
    );
    assert_eq!(c.int(&["SEM.RELEASE", "k", "A"]).unwrap(), 1);
    let Reply::Int(token) = waiters[2].replies().unwrap() else {
        panic!("C not granted after A's release")
    };
    tokens.push(token);
    assert!(
        tokens.windows(2).all(|t| t[0] < t[1]),
        "granted out of order: {tokens:?}"
    );
    assert_eq!(semaphore(&mut c), (2, 0));
}
