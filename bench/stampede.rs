//! Cache stampede: 48 readers on one hot key whose value expires every
//! 500 ms, a miss costing a 50 ms database load. Five ways to get-or-load,
//! each for the same wall time on the same server, each on a fresh key:
//! plain cache-aside, a `SET NX` mutex with 50 ms polling, the
//! `LOCK.ACQUIRE … WAIT` rebuild of docs/patterns.md #1, `CACHE.GET … WAIT`,
//! and `CACHE.GET … WAIT … REFRESH` (a hot key reloaded before it expires).
//!
//! A read is the whole get-or-load loop until the reader has a value. Each
//! reader has its own connection (a blocked `WAIT` occupies it) and serves a
//! request every `THINK`, so that a miss is about 2% of its reads and the p99
//! sees the misses.

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::rc::Rc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::{cmd, Row, Server};

const READERS: usize = 48;
/// What a miss costs: one database load.
const LOAD: Duration = Duration::from_millis(50);
/// The TTL of every fill (`PX`), the expiry window of the loads-per-expiry figure.
const TTL_MS: u64 = 500;
/// Lease, lock and `WAIT` times of the strategies that have them.
const LEASE_MS: &str = "2000";
/// The refresh window: a third of the TTL.
const REFRESH_MS: &str = "166";
/// Time between one reader's reads: the rest of its request.
const THINK: Duration = Duration::from_millis(10);
/// How long a losing `SET NX` reader sleeps before it reads again.
const POLL: Duration = Duration::from_millis(50);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Strategy {
    CacheAside,
    SetNxPolling,
    LockWait,
    CacheWait,
    CacheRefresh,
}

impl Strategy {
    const ALL: [Strategy; 5] = [
        Strategy::CacheAside,
        Strategy::SetNxPolling,
        Strategy::LockWait,
        Strategy::CacheWait,
        Strategy::CacheRefresh,
    ];

    fn label(self) -> &'static str {
        match self {
            Strategy::CacheAside => "plain cache-aside (GET, SET PX)",
            Strategy::SetNxPolling => "SET NX mutex + 50 ms polling",
            Strategy::LockWait => "LOCK.ACQUIRE WAIT (patterns #1)",
            Strategy::CacheWait => "CACHE.GET WAIT",
            Strategy::CacheRefresh => "CACHE.GET WAIT REFRESH 166",
        }
    }

    /// The commands its readers send. Everything else in commandstats is the
    /// module's own work: the `SET` inside `CACHE.FILL` and the
    /// `CLIENT UNBLOCK` that answers a waiter.
    fn sends(self) -> &'static [&'static str] {
        match self {
            Strategy::CacheAside => &["get", "set"],
            Strategy::SetNxPolling => &["get", "set", "del"],
            Strategy::LockWait => &["get", "set", "lock.acquire", "lock.release"],
            Strategy::CacheWait | Strategy::CacheRefresh => &["cache.get", "cache.fill"],
        }
    }
}

/// One strategy's figures.
struct Figures {
    loads_per_expiry: f64,
    reads_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    commands_per_read: f64,
    internal_per_read: f64,
}

/// The database behind the cache: every load takes `LOAD` and is counted.
#[derive(Default)]
struct Database {
    loads: Cell<u64>,
}

impl Database {
    async fn load(&self) -> String {
        self.loads.set(self.loads.get() + 1);
        tokio::time::sleep(LOAD).await;
        format!("value {}", self.loads.get())
    }
}

/// One reader: its connection, a second one for background refills (its
/// first may be blocked in a `WAIT` meanwhile; the lease stays valid while
/// the first is open), and the hot key.
struct Reader {
    con: MultiplexedConnection,
    refills: MultiplexedConnection,
    owner: String,
    key: String,
    db: Rc<Database>,
    /// Background refills still running.
    pending: Vec<tokio::task::JoinHandle<()>>,
}

impl Reader {
    async fn query<T: redis::FromRedisValue>(&mut self, words: &[&str]) -> T {
        cmd(words).query_async(&mut self.con).await.unwrap()
    }

    /// One get-or-load, until this reader has a value.
    async fn read(&mut self, strategy: Strategy) -> String {
        match strategy {
            Strategy::CacheAside => self.cache_aside().await,
            Strategy::SetNxPolling => self.set_nx_polling().await,
            Strategy::LockWait => self.lock_wait().await,
            Strategy::CacheWait => self.cache_get(&[]).await,
            Strategy::CacheRefresh => self.cache_get(&["REFRESH", REFRESH_MS]).await,
        }
    }

    async fn get(&mut self) -> Option<String> {
        let key = self.key.clone();
        self.query(&["GET", &key]).await
    }

    /// Loads and stores with `SET … PX`.
    async fn load_and_set(&mut self) -> String {
        let v = self.db.load().await;
        let key = self.key.clone();
        self.query::<()>(&["SET", &key, &v, "PX", &TTL_MS.to_string()])
            .await;
        v
    }

    async fn cache_aside(&mut self) -> String {
        match self.get().await {
            Some(v) => v,
            None => self.load_and_set().await,
        }
    }

    async fn set_nx_polling(&mut self) -> String {
        let (lock, owner) = (format!("{}:lock", self.key), self.owner.clone());
        loop {
            if let Some(v) = self.get().await {
                return v;
            }
            let won: Option<String> = self
                .query(&["SET", &lock, &owner, "NX", "PX", LEASE_MS])
                .await;
            if won.is_some() {
                let v = self.load_and_set().await;
                self.query::<i64>(&["DEL", &lock]).await;
                return v;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// docs/patterns.md #1: the first to miss rebuilds under the lock, the
    /// others wait for it in the server's queue and read again.
    async fn lock_wait(&mut self) -> String {
        if let Some(v) = self.get().await {
            return v;
        }
        let (lock, owner) = (format!("{}:lock", self.key), self.owner.clone());
        let fence: Option<i64> = self
            .query(&["LOCK.ACQUIRE", &lock, &owner, LEASE_MS, "WAIT", LEASE_MS])
            .await;
        if fence.is_none() {
            // Degraded, as in the pattern: the rebuilder is stuck.
            return self.db.load().await;
        }
        let v = match self.get().await {
            Some(v) => v,
            None => self.load_and_set().await,
        };
        self.query::<i64>(&["LOCK.RELEASE", &lock, &owner]).await;
        v
    }

    /// `CACHE.GET … WAIT` with `options`; the lease holder loads and fills.
    async fn cache_get(&mut self, options: &[&str]) -> String {
        let key = self.key.clone();
        let mut words = vec!["CACHE.GET", &key, LEASE_MS, "WAIT", LEASE_MS];
        words.extend(options);
        loop {
            let (value, lease): (Option<String>, Option<u64>) = self.query(&words).await;
            match (value, lease) {
                (Some(v), None) => return v,
                // A refresh: serve the value, reload in the background.
                (Some(v), Some(token)) => {
                    let (mut con, key, db) = (self.refills.clone(), key.clone(), self.db.clone());
                    self.pending.push(tokio::task::spawn_local(async move {
                        let fresh = db.load().await;
                        fill(&mut con, &key, token, &fresh).await;
                    }));
                    return v;
                }
                (None, Some(token)) => {
                    let v = self.db.load().await;
                    fill(&mut self.con, &key, token, &v).await;
                    return v;
                }
                // The wait timed out: ask again.
                (None, None) => {}
            }
        }
    }
}

async fn fill(con: &mut MultiplexedConnection, key: &str, token: u64, value: &str) {
    let _: i64 = cmd(&[
        "CACHE.FILL",
        key,
        &token.to_string(),
        value,
        "PX",
        &TTL_MS.to_string(),
    ])
    .query_async(con)
    .await
    .unwrap();
}

/// Calls per command since the last `CONFIG RESETSTAT` (`INFO commandstats`).
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

/// Runs `strategy` for `run_for` with `READERS` readers on a fresh key.
async fn stampede(server: &Server, strategy: Strategy, run_for: Duration) -> Figures {
    server.flush();
    let db = Rc::new(Database::default());
    let key = format!("hot:{strategy:?}");
    let mut readers = Vec::new();
    for i in 0..READERS {
        readers.push(Reader {
            con: server.conn().await,
            refills: server.conn().await,
            owner: format!("reader-{i}"),
            key: key.clone(),
            db: db.clone(),
            pending: Vec::new(),
        });
    }
    cmd(&["CONFIG", "RESETSTAT"])
        .query::<()>(&mut server.sync())
        .unwrap();
    let started = Instant::now();
    let deadline = started + run_for;
    let tasks: Vec<_> = readers
        .into_iter()
        .map(|mut reader| {
            tokio::task::spawn_local(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let asked = Instant::now();
                    reader.read(strategy).await;
                    latencies.push(asked.elapsed());
                    tokio::time::sleep(THINK).await;
                }
                for refill in reader.pending {
                    refill.await.unwrap();
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    let calls = command_calls(server);
    let ours = ["info", "config|resetstat"];
    let sent: u64 = strategy
        .sends()
        .iter()
        .filter_map(|name| calls.get(*name))
        .sum();
    let internal: u64 = calls
        .iter()
        .filter(|(name, _)| {
            !strategy.sends().contains(&name.as_str()) && !ours.contains(&name.as_str())
        })
        .map(|(_, n)| n)
        .sum();
    latencies.sort();
    let reads = latencies.len().max(1) as f64;
    let ms = |q: f64| {
        let at = ((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1));
        latencies.get(at).map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    Figures {
        loads_per_expiry: db.loads.get() as f64 / (elapsed * 1e3 / TTL_MS as f64),
        reads_per_s: reads / elapsed,
        p50_ms: ms(0.50),
        p99_ms: ms(0.99),
        max_ms: ms(1.0),
        commands_per_read: sent as f64 / reads,
        internal_per_read: internal as f64 / reads,
    }
}

/// The rows of this section (compared with plain cache-aside and with the
/// lock-based rebuild) and its table of every strategy, in markdown.
pub async fn rows(server: &Server, run_for: Duration) -> (Vec<Row>, String) {
    let mut figures = Vec::new();
    for strategy in Strategy::ALL {
        eprintln!("stampede: {}", strategy.label());
        figures.push(stampede(server, strategy, run_for).await);
    }
    let [aside, polling, lock, wait, refresh] = figures.as_slice() else {
        unreachable!("one figure per strategy")
    };
    let load_ms = LOAD.as_secs_f64() * 1e3;
    let row = |name: &str, unit, target, w: f64, o: f64| {
        let mut r = Row::new("stampede", name, unit, target);
        r.warden.push(w);
        r.other.push(o);
        r
    };
    // One load every refresh period, none more.
    let refresh_ideal = TTL_MS as f64 / refresh_period_ms() as f64;
    let rows = vec![
        row(
            "loads per expiry: CACHE.GET WAIT vs plain cache-aside (target on CACHE.GET: 1)",
            "loads",
            Some(("<=", 1.0)),
            wait.loads_per_expiry,
            aside.loads_per_expiry,
        )
        .absolute(),
        row(
            &format!(
                "p99 read: CACHE.GET WAIT vs plain cache-aside (target on CACHE.GET: load + 15 ms = {} ms)",
                load_ms + 15.0
            ),
            "ms",
            Some(("<=", load_ms + 15.0)),
            wait.p99_ms,
            aside.p99_ms,
        )
        .absolute(),
        row(
            &format!(
                "loads per expiry: CACHE.GET WAIT REFRESH vs plain cache-aside (target on REFRESH: the refresh-ahead ideal {refresh_ideal:.2} + 0.05)"
            ),
            "loads",
            Some(("<=", refresh_ideal + 0.05)),
            refresh.loads_per_expiry,
            aside.loads_per_expiry,
        )
        .absolute(),
        row(
            "p99 read: CACHE.GET WAIT REFRESH vs plain cache-aside",
            "ms",
            Some(("<=", 0.25)),
            refresh.p99_ms,
            aside.p99_ms,
        ),
        row(
            "loads per expiry: CACHE.GET WAIT vs LOCK.ACQUIRE WAIT rebuild",
            "loads",
            None,
            wait.loads_per_expiry,
            lock.loads_per_expiry,
        ),
        row(
            "p99 read: CACHE.GET WAIT vs LOCK.ACQUIRE WAIT rebuild",
            "ms",
            None,
            wait.p99_ms,
            lock.p99_ms,
        ),
        row(
            "p99 read: CACHE.GET WAIT vs SET NX + 50 ms polling",
            "ms",
            None,
            wait.p99_ms,
            polling.p99_ms,
        ),
        row(
            "commands per read: CACHE.GET WAIT vs LOCK.ACQUIRE WAIT rebuild",
            "commands",
            None,
            wait.commands_per_read,
            lock.commands_per_read,
        ),
        row(
            "commands per read: CACHE.GET WAIT vs SET NX + 50 ms polling",
            "commands",
            None,
            wait.commands_per_read,
            polling.commands_per_read,
        ),
    ];
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Stampede: {READERS} readers on one key, fills PX {TTL_MS}, a miss loads for {} ms, a read every {} ms per reader, {:.0} s per strategy. Commands per read count what the readers send (commandstats deltas); the module's own calls (the SET inside CACHE.FILL, CLIENT UNBLOCK answering a waiter) are the last column.\n",
        LOAD.as_millis(),
        THINK.as_millis(),
        run_for.as_secs_f64()
    );
    let _ = writeln!(md, "| strategy | loads per expiry | reads/s | p50 ms | p99 ms | max ms | commands per read | module calls per read |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    for (strategy, s) in Strategy::ALL.iter().zip(&figures) {
        let _ = writeln!(
            md,
            "| {} | {:.2} | {:.0} | {:.2} | {:.2} | {:.1} | {:.3} | {:.3} |",
            strategy.label(),
            s.loads_per_expiry,
            s.reads_per_s,
            s.p50_ms,
            s.p99_ms,
            s.max_ms,
            s.commands_per_read,
            s.internal_per_read
        );
    }
    // Why REFRESH loads more often than once per expiry window.
    let _ = writeln!(
        md,
        "\nLoads per expiry = loads / (run time / {TTL_MS} ms). With REFRESH {REFRESH_MS} a hot key is reloaded when its TTL falls below {REFRESH_MS} ms and the fill restarts its {TTL_MS} ms: one load every {TTL_MS} - {REFRESH_MS} + {} = {} ms or more, so at least {:.2} loads per window by construction.",
        LOAD.as_millis(),
        refresh_period_ms(),
        TTL_MS as f64 / refresh_period_ms() as f64
    );
    (rows, md)
}

/// The shortest time between two refreshes of a key read continuously.
fn refresh_period_ms() -> u64 {
    TTL_MS - REFRESH_MS.parse::<u64>().unwrap() + LOAD.as_millis() as u64
}
