//! `make bench`: warden against what users run today, side by side in one
//! run, reported as ratios from the same repetition.
//!
//! Starts its own redis-servers on free ports (one with warden, one with
//! RedisBloom), drives them with redis-benchmark and with a small pipelined
//! client on one event loop, and writes `bench/results/latest.md` and
//! `latest.json` (the chart is drawn from it by `bench/chart.py`).
//! `WARDEN_SERVER` names the server binary (default: redis-server);
//! `--locks` runs the lock rows alone, into `--out <name>`; servers listen on
//! `WARDEN_BENCH_PORT` and the ports after it where given, else on free ones.

mod big_filters;
mod race;
mod scripts;
mod semaphore;
mod stampede;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;

const CLIENTS: usize = 50;

struct Settings {
    reps: usize,
    n_p16: usize,
    n_p1: usize,
    driver_ops: usize,
    contention: Duration,
    bloom_items: usize,
    /// Filter sizes (items) of the big-filter section.
    big_filters: &'static [u64],
    /// Wall time of each cache stampede strategy.
    stampede: Duration,
    /// Wall time of each consistency race round.
    race: Duration,
    /// Wall time of each semaphore contention run.
    semaphore: Duration,
    /// Crashed holders per semaphore implementation and repetition.
    crash_rounds: usize,
}

impl Settings {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                reps: 3,
                n_p16: 100_000,
                n_p1: 20_000,
                driver_ops: 30_000,
                contention: Duration::from_secs(2),
                bloom_items: 100_000,
                big_filters: &[100_000_000],
                stampede: Duration::from_secs(3),
                race: Duration::from_secs(1),
                semaphore: Duration::from_secs(2),
                crash_rounds: 3,
            }
        } else {
            Self {
                reps: 3,
                n_p16: 400_000,
                n_p1: 60_000,
                driver_ops: 150_000,
                contention: Duration::from_secs(5),
                bloom_items: 1_000_000,
                big_filters: &[100_000_000, 1_000_000_000],
                stampede: Duration::from_secs(10),
                race: Duration::from_secs(3),
                semaphore: Duration::from_secs(5),
                crash_rounds: 5,
            }
        }
    }
}

/// A port for the next server: `WARDEN_BENCH_PORT` and the ones after it, in
/// the order servers start, else a free one.
fn next_port() -> u16 {
    static STARTED: AtomicU16 = AtomicU16::new(0);
    match std::env::var("WARDEN_BENCH_PORT") {
        Ok(base) => {
            base.parse::<u16>().expect("WARDEN_BENCH_PORT")
                + STARTED.fetch_add(1, Ordering::Relaxed)
        }
        Err(_) => TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port(),
    }
}

/// The server binary: `WARDEN_SERVER` (Redis 8, Valkey), else Debian's redis-server.
fn server_bin() -> String {
    std::env::var("WARDEN_SERVER").unwrap_or_else(|_| "redis-server".into())
}

/// The server's own compare-and-delete, where it has one: what a
/// `SET key token NX PX` lock is released with instead of a Lua script.
#[derive(Clone, Copy)]
enum CompareAndDelete {
    /// Valkey 9.0+: `DELIFEQ key value`.
    DelIfEq,
    /// Redis 8.4+: `DELEX key IFEQ value`.
    DelexIfEq,
}

/// What a row measuring a compare-and-delete says on a server without one.
const NO_COMPARE_AND_DELETE: &str =
    "not on this server: DELIFEQ is Valkey 9.0+, DELEX IFEQ Redis 8.4+";

impl CompareAndDelete {
    /// Asks the server which of the two it has (`COMMAND INFO` answers nil for an unknown name).
    fn probe(server: &Server) -> Option<Self> {
        let info: Vec<Value> = cmd(&["COMMAND", "INFO", "DELIFEQ", "DELEX"])
            .query(&mut server.sync())
            .unwrap();
        let known = |i: usize| info.get(i).is_some_and(|v| *v != Value::Nil);
        if known(0) {
            Some(Self::DelIfEq)
        } else if known(1) {
            Some(Self::DelexIfEq)
        } else {
            None
        }
    }

    fn name(this: Option<Self>) -> &'static str {
        match this {
            Some(Self::DelIfEq) => "DELIFEQ",
            Some(Self::DelexIfEq) => "DELEX IFEQ",
            None => "DELIFEQ / DELEX IFEQ",
        }
    }

    fn release(self, key: &str, token: &str) -> redis::Cmd {
        match self {
            Self::DelIfEq => cmd(&["DELIFEQ", key, token]),
            Self::DelexIfEq => cmd(&["DELEX", key, "IFEQ", token]),
        }
    }
}

/// A redis-server of the benchmark, on its own port and scratch directory.
struct Server {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(module: &Path) -> Self {
        Self::start_with(module, &[])
    }

    /// A server with `module` loaded with `module_args`.
    fn start_with(module: &Path, module_args: &[&str]) -> Self {
        let port = next_port();
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new(server_bin())
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args([
                "--dir",
                dir.path().to_str().unwrap(),
                "--logfile",
                "bench.log",
            ])
            .args(["--loadmodule", module.to_str().unwrap()])
            .args(module_args)
            .stdout(Stdio::null())
            .spawn()
            .expect("server binary (WARDEN_SERVER)");
        let server = Self {
            port,
            child,
            _dir: dir,
        };
        let started = Instant::now();
        while redis::Client::open(server.url())
            .and_then(|c| c.get_connection())
            .is_err()
        {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "server on {port} did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// Resident memory of the server process, in bytes.
    fn rss(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .ok()
            .and_then(|status| {
                let line = status
                    .lines()
                    .find(|l| l.starts_with("VmRSS:"))?
                    .to_string();
                let kb = line.split_whitespace().nth(1)?.parse::<u64>().ok()?;
                Some(kb * 1024)
            })
            .unwrap_or(0)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn sync(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    async fn conn(&self) -> MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    fn load(&self, script: &str) -> String {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script)
            .query(&mut self.sync())
            .unwrap()
    }

    fn flush(&self) {
        redis::cmd("FLUSHALL")
            .query::<()>(&mut self.sync())
            .unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Requests per second from redis-benchmark: 50 clients, pipeline `p`,
/// `__rand_int__` replaced by random numbers (fresh keys).
fn redis_benchmark(server: &Server, p: usize, n: usize, words: &[&str]) -> f64 {
    let out = Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &server.port.to_string(),
            "-c",
            &CLIENTS.to_string(),
        ])
        .args([
            "-n",
            &n.to_string(),
            "-P",
            &p.to_string(),
            "-r",
            "1000000000",
            "--csv",
        ])
        .args(words)
        .output()
        .expect("redis-benchmark");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    line.split(',')
        .nth(1)
        .and_then(|f| f.trim_matches('"').parse().ok())
        .unwrap_or_else(|| panic!("redis-benchmark {words:?}: {text}"))
}

/// Runs `ops` operations from `CLIENTS` connections on one event loop, each
/// sending pipelines of `p` operations built by `batch(client, seq)`; ops/s.
async fn driven<F>(server: &Server, p: usize, ops: usize, batch: F) -> f64
where
    F: Fn(usize, usize) -> redis::Pipeline,
{
    let mut conns = Vec::new();
    for _ in 0..CLIENTS {
        conns.push(server.conn().await);
    }
    let per_client = ops / CLIENTS / p;
    let started = Instant::now();
    let work = conns.into_iter().enumerate().map(|(client, mut con)| {
        let pipes: Vec<redis::Pipeline> = (0..per_client).map(|seq| batch(client, seq)).collect();
        async move {
            for pipe in pipes {
                let _: Vec<Value> = pipe.query_async(&mut con).await.unwrap();
            }
        }
    });
    futures_join_all(work).await;
    (per_client * CLIENTS * p) as f64 / started.elapsed().as_secs_f64()
}

async fn futures_join_all<F: std::future::Future<Output = ()> + 'static>(
    futs: impl Iterator<Item = F>,
) {
    let set: Vec<_> = futs.map(|f| tokio::task::spawn_local(f)).collect();
    for h in set {
        h.await.unwrap();
    }
}

fn cmd(words: &[&str]) -> redis::Cmd {
    let mut c = redis::cmd(words[0]);
    for w in &words[1..] {
        c.arg(*w);
    }
    c
}

/// Server-side counters from INFO: the commands clients sent (INFO itself
/// left out, and `CLIENT UNBLOCK`, which no client here sends: it is how the
/// module answers a waiter, through `RedisModule_Call`) and CPU seconds.
fn server_counters(server: &Server) -> (u64, f64) {
    let info: String = redis::cmd("INFO")
        .arg("everything")
        .query(&mut server.sync())
        .unwrap();
    let mut calls = 0;
    let mut cpu = 0.0;
    for line in info.lines() {
        if let Some(rest) = line.strip_prefix("cmdstat_") {
            let (name, stats) = rest.split_once(':').unwrap();
            if name != "info" && name != "client|unblock" {
                let n = stats
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("calls="))
                    .unwrap();
                calls += n.parse::<u64>().unwrap();
            }
        }
        if let Some(v) = line
            .strip_prefix("used_cpu_user:")
            .or_else(|| line.strip_prefix("used_cpu_sys:"))
        {
            cpu += v.trim().parse::<f64>().unwrap();
        }
    }
    (calls, cpu)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Contender {
    Warden,
    Polling,
    Spin,
    BlpopToken,
}

#[derive(Default, Clone)]
struct Contention {
    handoffs_per_s: f64,
    commands_per_handoff: f64,
    cpu_us_per_handoff: f64,
    p50_ms: f64,
    p99_ms: f64,
    fairness: f64,
}

/// 50 clients on one key, each running INCR as its critical section.
async fn contention(
    server: &Server,
    kind: Contender,
    run_for: Duration,
    think: Duration,
    release_sha: &str,
) -> Contention {
    server.flush();
    if kind == Contender::BlpopToken {
        redis::cmd("RPUSH")
            .arg("token")
            .arg("t")
            .query::<()>(&mut server.sync())
            .unwrap();
    }
    let mut conns = Vec::new();
    for _ in 0..CLIENTS {
        conns.push(server.conn().await);
    }
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(&mut server.sync())
        .unwrap();
    let (calls0, cpu0) = server_counters(server);
    let start = Instant::now();
    let deadline = start + run_for;
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, mut con)| {
            let owner = format!("client-{i}");
            let sha = release_sha.to_string();
            tokio::task::spawn_local(async move {
                let mut waits = Vec::new();
                while Instant::now() < deadline {
                    let asked = Instant::now();
                    // A client still waiting at the deadline counts with the time it waited so far.
                    let censored = deadline.saturating_duration_since(asked);
                    match kind {
                        Contender::Warden => {
                            let _: i64 =
                                cmd(&["LOCK.ACQUIRE", "mutex", &owner, "10000", "WAIT", "0"])
                                    .query_async(&mut con)
                                    .await
                                    .unwrap();
                        }
                        Contender::BlpopToken => {
                            let _: Value = cmd(&["BLPOP", "token", "0"])
                                .query_async(&mut con)
                                .await
                                .unwrap();
                        }
                        Contender::Polling | Contender::Spin => loop {
                            let got: Value = cmd(&["SET", "mutex", &owner, "NX", "PX", "10000"])
                                .query_async(&mut con)
                                .await
                                .unwrap();
                            if got != Value::Nil {
                                break;
                            }
                            if kind == Contender::Polling {
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        },
                    }
                    let held_at = Instant::now();
                    let _: i64 = cmd(&["INCR", "counter"])
                        .query_async(&mut con)
                        .await
                        .unwrap();
                    match kind {
                        Contender::Warden => {
                            let _: i64 = cmd(&["LOCK.RELEASE", "mutex", &owner])
                                .query_async(&mut con)
                                .await
                                .unwrap();
                        }
                        Contender::BlpopToken => {
                            let _: i64 = cmd(&["RPUSH", "token", "t"])
                                .query_async(&mut con)
                                .await
                                .unwrap();
                        }
                        Contender::Polling | Contender::Spin => {
                            let _: i64 = cmd(&["EVALSHA", &sha, "1", "mutex", &owner])
                                .query_async(&mut con)
                                .await
                                .unwrap();
                        }
                    }
                    if held_at < deadline {
                        waits.push((true, held_at - asked));
                    } else if !censored.is_zero() {
                        waits.push((false, censored));
                    }
                    // Work outside the lock before asking again, as a real worker does.
                    if !think.is_zero() {
                        tokio::time::sleep(think).await;
                    }
                }
                waits
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut per_client = Vec::new();
    tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)).await;
    let (calls1, cpu1) = server_counters(server);
    for t in tasks {
        let waits = t.await.unwrap();
        let (done, waited): (Vec<_>, Vec<_>) = waits.into_iter().partition(|(granted, _)| *granted);
        per_client.push(done.len());
        all.extend(done.into_iter().chain(waited).map(|(_, d)| d));
    }
    all.sort();
    let handoffs = per_client.iter().sum::<usize>().max(1) as f64;
    let pct = |q: f64| {
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    let min = *per_client.iter().min().unwrap_or(&0) as f64;
    let max = *per_client.iter().max().unwrap_or(&0) as f64;
    Contention {
        handoffs_per_s: handoffs / run_for.as_secs_f64(),
        commands_per_handoff: (calls1 - calls0) as f64 / handoffs,
        cpu_us_per_handoff: (cpu1 - cpu0) * 1e6 / handoffs,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        fairness: if min > 0.0 { max / min } else { f64::INFINITY },
    }
}

/// Memory and measured false-positive rate of one filter holding `n` items.
async fn bloom_quality(server: &Server, n: usize, rate: &str, scaling: bool) -> (f64, f64) {
    server.flush();
    let mut sync = server.sync();
    let mut reserve = cmd(&["BF.RESERVE", "q", rate, &n.to_string()]);
    if !scaling {
        reserve.arg("NONSCALING");
    }
    reserve.query::<()>(&mut sync).unwrap();
    let mut con = server.conn().await;
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut c = redis::cmd("BF.MADD");
        c.arg("q");
        for i in chunk {
            c.arg(format!("member:{i}"));
        }
        let _: Value = c.query_async(&mut con).await.unwrap();
    }
    let memory: i64 = cmd(&["MEMORY", "USAGE", "q"]).query(&mut sync).unwrap();
    let trials = 100_000;
    let mut positives = 0;
    for chunk in (0..trials).collect::<Vec<_>>().chunks(1000) {
        let mut c = redis::cmd("BF.MEXISTS");
        c.arg("q");
        for i in chunk {
            c.arg(format!("absent:{i}"));
        }
        let found: Vec<i64> = c.query_async(&mut con).await.unwrap();
        positives += found.iter().filter(|&&b| b == 1).count();
    }
    (memory as f64, positives as f64 / trials as f64)
}

/// One row: warden's figure against its comparison, per repetition.
struct Row {
    group: &'static str,
    name: String,
    unit: &'static str,
    warden: Vec<f64>,
    other: Vec<f64>,
    /// Target on warden / other: (`>=` or `<=`, value).
    target: Option<(&'static str, f64)>,
    /// The target applies to warden's own figure, not to the ratio.
    absolute: bool,
    /// Why this server cannot measure the row (printed instead of figures).
    absent: Option<&'static str>,
}

impl Row {
    fn new(
        group: &'static str,
        name: impl Into<String>,
        unit: &'static str,
        target: Option<(&'static str, f64)>,
    ) -> Self {
        Self {
            group,
            name: name.into(),
            unit,
            warden: Vec::new(),
            other: Vec::new(),
            target,
            absolute: false,
            absent: None,
        }
    }

    fn absolute(mut self) -> Self {
        self.absolute = true;
        self
    }

    fn absent(mut self, why: &'static str) -> Self {
        self.absent = Some(why);
        self
    }

    fn ratios(&self) -> Vec<f64> {
        self.warden
            .iter()
            .zip(&self.other)
            .map(|(w, o)| if *o == 0.0 { f64::INFINITY } else { w / o })
            .collect()
    }

    fn verdict(&self) -> &'static str {
        match self.target {
            None => "",
            Some((op, t)) => {
                let r = if self.absolute {
                    median(&self.warden)
                } else {
                    median(&self.ratios())
                };
                if (op == ">=" && r >= t) || (op == "<=" && r <= t) {
                    "met"
                } else {
                    "MISSED"
                }
            }
        }
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if s.is_empty() {
        return f64::NAN;
    }
    s[s.len() / 2]
}

fn spread(v: &[f64]) -> (f64, f64) {
    let min = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    (min, max)
}

fn fmt(x: f64) -> String {
    if !x.is_finite() {
        "inf".into()
    } else if x.abs() >= 1000.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else if x.abs() >= 0.01 {
        format!("{x:.3}")
    } else {
        format!("{x:.5}")
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let settings = Settings::new(quick);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let warden_so = std::env::var("WARDEN_MODULE")
        .map(PathBuf::from)
        .unwrap_or(root.join("target/release/libwarden.so"));
    let bloom_so = std::env::var("REDISBLOOM_MODULE")
        .map(PathBuf::from)
        .unwrap_or(root.join("target/bench/redisbloom.so"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = root.join("bench/results");
    let big = |rows: &mut Vec<Row>| {
        rows.extend(big_filters::rows(
            settings.reps,
            settings.big_filters,
            &warden_so,
            &bloom_so,
        ))
    };
    // `--big-filters`: that section alone, into its own file.
    if std::env::args().any(|a| a == "--big-filters") {
        let mut rows = Vec::new();
        big(&mut rows);
        report(&rows, "", quick, &dir, "big-filters");
        return;
    }
    let local = tokio::task::LocalSet::new();
    let cache = || local.block_on(&runtime, cache_sections(&settings, &warden_so));
    // `--cache`: the stampede and consistency race sections alone.
    if std::env::args().any(|a| a == "--cache") {
        let (rows, notes) = cache();
        report(&rows, &notes, quick, &dir, "cache");
        return;
    }
    // `--locks`: the ceiling and lock rows alone, on WARDEN_SERVER, into
    // `--out <name>` (default `locks`).
    if std::env::args().any(|a| a == "--locks") {
        let rows = local.block_on(&runtime, locks_section(&settings, &warden_so));
        let args: Vec<String> = std::env::args().collect();
        let out = args
            .iter()
            .position(|a| a == "--out")
            .and_then(|i| args.get(i + 1))
            .map_or("locks", String::as_str);
        report(&rows, "", quick, &dir, out);
        return;
    }
    let sem = || local.block_on(&runtime, semaphore_section(&settings, &warden_so));
    // `--semaphore`: the semaphore comparison alone.
    if std::env::args().any(|a| a == "--semaphore") {
        let (rows, notes) = sem();
        report(&rows, &notes, quick, &dir, "semaphore");
        return;
    }
    let mut rows = local.block_on(&runtime, run(&settings, &warden_so, &bloom_so));
    let (cache_rows, mut notes) = cache();
    rows.extend(cache_rows);
    let (sem_rows, sem_notes) = sem();
    rows.extend(sem_rows);
    notes.push('\n');
    notes.push_str(&sem_notes);
    big(&mut rows);
    report(&rows, &notes, quick, &dir, "latest");
}

/// The cache stampede and the consistency race, on a server of their own:
/// their rows and their tables (markdown).
async fn cache_sections(s: &Settings, warden_so: &Path) -> (Vec<Row>, String) {
    let warden = Server::start(warden_so);
    let (mut rows, mut notes) = stampede::rows(&warden, s.stampede).await;
    let (race_rows, race_notes) = race::rows(&warden, s.race).await;
    rows.extend(race_rows);
    notes.push('\n');
    notes.push_str(&race_notes);
    (rows, notes)
}

/// The ceiling and lock rows, on a server of their own.
async fn locks_section(s: &Settings, warden_so: &Path) -> Vec<Row> {
    let warden = Server::start(warden_so);
    let lock_scripts = LockScripts::load(&warden);
    let cad = CompareAndDelete::probe(&warden);
    let mut rows = lock_rows(cad);
    for rep in 0..s.reps {
        eprintln!("repetition {}/{}", rep + 1, s.reps);
        lock_repetition(s, &warden, &lock_scripts, cad, &mut rows).await;
    }
    rows
}

/// The semaphore comparison, on a server of its own.
async fn semaphore_section(s: &Settings, warden_so: &Path) -> (Vec<Row>, String) {
    let warden = Server::start(warden_so);
    semaphore::rows(&warden, s.reps, s.semaphore, s.crash_rounds).await
}

/// The Lua scripts the lock rows compare against, loaded once.
struct LockScripts {
    safe_release: String,
    reentrant_acquire: String,
    reentrant_release: String,
}

impl LockScripts {
    fn load(server: &Server) -> Self {
        Self {
            safe_release: server.load(scripts::SAFE_RELEASE),
            reentrant_acquire: server.load(scripts::REENTRANT_ACQUIRE),
            reentrant_release: server.load(scripts::REENTRANT_RELEASE),
        }
    }
}

/// The ceiling and the uncontended lock rows, in the order `lock_repetition`
/// fills them; `cad` is the server's own compare-and-delete, if it has one.
fn lock_rows(cad: Option<CompareAndDelete>) -> Vec<Row> {
    let by = CompareAndDelete::name(cad);
    let absent = |row: Row| match cad {
        Some(_) => row,
        None => row.absent(NO_COMPARE_AND_DELETE),
    };
    vec![
        Row::new("ceiling", "PING (P16) vs PING (P1)", "ops/s", None),
        Row::new(
            "locks",
            "LOCK.ACQUIRE vs SET NX PX, fresh keys (P16)",
            "ops/s",
            Some((">=", 0.9)),
        ),
        Row::new(
            "locks",
            "LOCK.ACQUIRE vs SET NX PX, fresh keys (P1)",
            "ops/s",
            None,
        ),
        Row::new(
            "locks",
            "LOCK.ACQUIRE vs Redisson-style Lua acquire (P16)",
            "ops/s",
            Some((">=", 2.0)),
        ),
        Row::new(
            "locks",
            "LOCK.RELEASE vs safe-release Lua (P16)",
            "ops/s",
            Some((">=", 1.3)),
        ),
        Row::new(
            "locks",
            "LOCK.RELEASE vs Redisson-style Lua release (P16)",
            "ops/s",
            None,
        ),
        Row::new(
            "locks",
            "acquire+release pairs vs SET NX PX + Lua release (P16)",
            "pairs/s",
            Some((">=", 1.2)),
        ),
        absent(Row::new(
            "locks",
            format!("acquire+release pairs vs SET NX PX + {by} (P16)"),
            "pairs/s",
            None,
        )),
        Row::new(
            "locks",
            "server CPU per pair: acquire+release vs SET NX PX + Lua release (P16)",
            "us",
            None,
        ),
        absent(Row::new(
            "locks",
            format!("server CPU per pair: acquire+release vs SET NX PX + {by} (P16)"),
            "us",
            None,
        )),
    ]
}

/// One repetition of `lock_rows`: fresh keys for every row, each on an empty keyspace.
async fn lock_repetition(
    s: &Settings,
    warden: &Server,
    scripts: &LockScripts,
    cad: Option<CompareAndDelete>,
    rows: &mut [Row],
) {
    let mut r = 0;
    // A row the server cannot measure keeps no figures.
    let mut push = |rows: &mut [Row], w: f64, o: f64| {
        if rows[r].absent.is_none() {
            rows[r].warden.push(w);
            rows[r].other.push(o);
        }
        r += 1;
    };
    // Ceiling
    let p16 = redis_benchmark(warden, 16, s.n_p16, &["PING"]);
    let p1 = redis_benchmark(warden, 1, s.n_p1, &["PING"]);
    push(rows, p16, p1);
    // Uncontended locks on fresh keys, each row on an empty keyspace.
    let fresh = |p: usize, n: usize, words: &[&str]| {
        warden.flush();
        redis_benchmark(warden, p, n, words)
    };
    let a16 = fresh(
        16,
        s.n_p16,
        &["LOCK.ACQUIRE", "lock:__rand_int__", "owner-1", "30000"],
    );
    let s16 = fresh(
        16,
        s.n_p16,
        &["SET", "set:__rand_int__", "owner-1", "NX", "PX", "30000"],
    );
    push(rows, a16, s16);
    let a1 = fresh(
        1,
        s.n_p1,
        &["LOCK.ACQUIRE", "lock1:__rand_int__", "owner-1", "30000"],
    );
    let s1 = fresh(
        1,
        s.n_p1,
        &["SET", "set1:__rand_int__", "owner-1", "NX", "PX", "30000"],
    );
    push(rows, a1, s1);
    let lua = fresh(
        16,
        s.n_p16,
        &[
            "EVALSHA",
            &scripts.reentrant_acquire,
            "1",
            "hash:__rand_int__",
            "30000",
            "owner-1",
        ],
    );
    push(rows, a16, lua);
    warden.flush();
    // Releases of held keys: acquire (untimed), then time the releases.
    let ops = s.driver_ops;
    let key = |c: usize, i: usize, prefix: &str| format!("{prefix}:{c}:{i}");
    let fill = |prefix: &'static str, words: fn(&str) -> redis::Cmd| async move {
        driven(warden, 16, ops, |c, seq| {
            let mut p = redis::pipe();
            for i in 0..16 {
                p.add_command(words(&key(c, seq * 16 + i, prefix)));
            }
            p
        })
        .await
    };
    fill("l", |k| cmd(&["LOCK.ACQUIRE", k, "owner-1", "60000"])).await;
    let release = driven(warden, 16, ops, |c, seq| {
        let mut p = redis::pipe();
        for i in 0..16 {
            p.add_command(cmd(&[
                "LOCK.RELEASE",
                &key(c, seq * 16 + i, "l"),
                "owner-1",
            ]));
        }
        p
    })
    .await;
    fill("s", |k| cmd(&["SET", k, "owner-1", "NX", "PX", "60000"])).await;
    let safe = driven(warden, 16, ops, |c, seq| {
        let mut p = redis::pipe();
        for i in 0..16 {
            p.add_command(cmd(&[
                "EVALSHA",
                &scripts.safe_release,
                "1",
                &key(c, seq * 16 + i, "s"),
                "owner-1",
            ]));
        }
        p
    })
    .await;
    push(rows, release, safe);
    fill("h", |k| cmd(&["HINCRBY", k, "owner-1", "1"])).await;
    let redisson = driven(warden, 16, ops, |c, seq| {
        let mut p = redis::pipe();
        for i in 0..16 {
            p.add_command(cmd(&[
                "EVALSHA",
                &scripts.reentrant_release,
                "1",
                &key(c, seq * 16 + i, "h"),
                "30000",
                "owner-1",
            ]));
        }
        p
    })
    .await;
    push(rows, release, redisson);
    warden.flush();
    let (pairs, pairs_cpu) = pair_run(warden, ops, "p", |k| {
        [
            cmd(&["LOCK.ACQUIRE", k, "owner-1", "30000"]),
            cmd(&["LOCK.RELEASE", k, "owner-1"]),
        ]
    })
    .await;
    let (classic, classic_cpu) = pair_run(warden, ops, "c", |k| {
        [
            cmd(&["SET", k, "owner-1", "NX", "PX", "30000"]),
            cmd(&["EVALSHA", &scripts.safe_release, "1", k, "owner-1"]),
        ]
    })
    .await;
    let (native, native_cpu) = match cad {
        Some(cad) => {
            pair_run(warden, ops, "d", |k| {
                [
                    cmd(&["SET", k, "owner-1", "NX", "PX", "30000"]),
                    cad.release(k, "owner-1"),
                ]
            })
            .await
        }
        None => (f64::NAN, f64::NAN),
    };
    push(rows, pairs, classic);
    push(rows, pairs, native);
    push(rows, pairs_cpu, classic_cpu);
    push(rows, pairs_cpu, native_cpu);
}

/// Acquire+release pairs from `driven` pipelines of 8 pairs on fresh keys
/// named after `prefix`: pairs/s and the server's CPU per pair (µs).
async fn pair_run<F>(server: &Server, ops: usize, prefix: &str, pair: F) -> (f64, f64)
where
    F: Fn(&str) -> [redis::Cmd; 2],
{
    let (_, cpu0) = server_counters(server);
    let per_s = driven(server, 16, ops, |c, seq| {
        let mut p = redis::pipe();
        for i in 0..8 {
            for command in pair(&format!("{prefix}:{c}:{}", seq * 8 + i)) {
                p.add_command(command);
            }
        }
        p
    })
    .await;
    let (_, cpu1) = server_counters(server);
    let done = (ops / CLIENTS / 16 * CLIENTS * 8) as f64;
    (per_s / 2.0, (cpu1 - cpu0) * 1e6 / done)
}

async fn run(s: &Settings, warden_so: &Path, bloom_so: &Path) -> Vec<Row> {
    let warden = Server::start(warden_so);
    let bloom = Server::start(bloom_so);
    let lock_scripts = LockScripts::load(&warden);
    let cad = CompareAndDelete::probe(&warden);
    let safe_release = &lock_scripts.safe_release;
    let rw = [
        scripts::RW_READ,
        scripts::RW_READ_UNLOCK,
        scripts::RW_WRITE,
        scripts::RW_WRITE_UNLOCK,
    ]
    .map(|s| warden.load(s));

    let mut rows = lock_rows(cad);
    let lock_count = rows.len();
    rows.extend([
        Row::new(
            "contention",
            "hand-offs/s: WAIT vs 10 ms polling",
            "hand-offs/s",
            Some((">=", 1.2)),
        ),
        Row::new(
            "contention",
            "hand-offs/s: WAIT vs busy spin",
            "hand-offs/s",
            None,
        ),
        Row::new(
            "contention",
            "hand-offs/s: WAIT vs BLPOP token",
            "hand-offs/s",
            Some((">=", 1.1)),
        ),
        Row::new(
            "contention",
            "server commands per hand-off: WAIT vs 10 ms polling",
            "commands",
            None,
        ),
        Row::new(
            "contention",
            "server commands per hand-off: WAIT vs BLPOP token (target on WAIT: 3)",
            "commands",
            Some(("<=", 3.01)),
        )
        .absolute(),
        Row::new(
            "contention",
            "server CPU per hand-off: WAIT vs 10 ms polling",
            "us",
            None,
        ),
        Row::new(
            "contention",
            "server CPU per hand-off: WAIT vs BLPOP token",
            "us",
            None,
        ),
        Row::new("contention", "p50 wait: WAIT vs 10 ms polling", "ms", None),
        Row::new(
            "contention",
            "p99 wait: WAIT vs 10 ms polling",
            "ms",
            Some(("<=", 0.2)),
        ),
        Row::new(
            "contention",
            "p99 wait: WAIT vs BLPOP token",
            "ms",
            Some(("<=", 1.0)),
        ),
        Row::new(
            "contention",
            "fairness max/min acquisitions per client: WAIT vs 10 ms polling (target on WAIT)",
            "max/min",
            Some(("<=", 1.1)),
        )
        .absolute(),
        Row::new(
            "contention, 1 ms work between acquisitions",
            "hand-offs/s: WAIT vs 10 ms polling",
            "hand-offs/s",
            None,
        ),
        Row::new(
            "contention, 1 ms work between acquisitions",
            "hand-offs/s: WAIT vs BLPOP token",
            "hand-offs/s",
            None,
        ),
        Row::new(
            "contention, 1 ms work between acquisitions",
            "p99 wait: WAIT vs 10 ms polling",
            "ms",
            None,
        ),
        Row::new(
            "contention, 1 ms work between acquisitions",
            "p99 wait: WAIT vs BLPOP token",
            "ms",
            None,
        ),
        Row::new(
            "contention, 1 ms work between acquisitions",
            "fairness max/min: WAIT vs 10 ms polling",
            "max/min",
            None,
        ),
        Row::new(
            "rwlock",
            "RWLOCK.READ+UNLOCK vs Redisson-style Lua (P16)",
            "pairs/s",
            Some((">=", 1.5)),
        ),
        Row::new(
            "rwlock",
            "RWLOCK.WRITE+UNLOCK vs Redisson-style Lua (P16)",
            "pairs/s",
            Some((">=", 1.5)),
        ),
        Row::new(
            "bloom",
            "BF.ADD vs RedisBloom (P16)",
            "ops/s",
            Some((">=", 1.1)),
        ),
        Row::new(
            "bloom",
            "BF.ADD vs RedisBloom (P1)",
            "ops/s",
            Some((">=", 1.1)),
        ),
        Row::new(
            "bloom",
            "BF.EXISTS vs RedisBloom (P16)",
            "ops/s",
            Some((">=", 1.1)),
        ),
        Row::new(
            "bloom",
            "BF.EXISTS vs RedisBloom (P1)",
            "ops/s",
            Some((">=", 1.1)),
        ),
        Row::new(
            "bloom",
            "BF.MADD x10 vs RedisBloom (P16)",
            "ops/s",
            Some((">=", 1.3)),
        ),
        Row::new(
            "bloom",
            "BF.MEXISTS x10 vs RedisBloom (P16)",
            "ops/s",
            Some((">=", 1.3)),
        ),
    ]);
    let mut quality_rows: Vec<Row> = Vec::new();
    let mut contention_table: Vec<(Contender, Contention)> = Vec::new();
    let n = s.bloom_items;
    let tens = |name: &str| -> Vec<String> {
        let mut w = vec![name.to_string(), "bf".to_string()];
        w.extend((0..10).map(|_| "item:__rand_int__".to_string()));
        w
    };
    for rep in 0..s.reps {
        eprintln!("repetition {}/{}", rep + 1, s.reps);
        lock_repetition(s, &warden, &lock_scripts, cad, &mut rows[..lock_count]).await;
        let mut r = lock_count;
        let mut push = |rows: &mut Vec<Row>, w: f64, o: f64| {
            rows[r].warden.push(w);
            rows[r].other.push(o);
            r += 1;
        };
        let ops = s.driver_ops;
        // Contention
        let mut results = HashMap::new();
        for kind in [
            Contender::Warden,
            Contender::Polling,
            Contender::Spin,
            Contender::BlpopToken,
        ] {
            let c = contention(&warden, kind, s.contention, Duration::ZERO, safe_release).await;
            if rep == s.reps - 1 {
                contention_table.push((kind, c.clone()));
            }
            results.insert(format!("{kind:?}"), c);
        }
        let (w, poll, spin, token) = (
            &results["Warden"],
            &results["Polling"],
            &results["Spin"],
            &results["BlpopToken"],
        );
        push(&mut rows, w.handoffs_per_s, poll.handoffs_per_s);
        push(&mut rows, w.handoffs_per_s, spin.handoffs_per_s);
        push(&mut rows, w.handoffs_per_s, token.handoffs_per_s);
        push(&mut rows, w.commands_per_handoff, poll.commands_per_handoff);
        push(
            &mut rows,
            w.commands_per_handoff,
            token.commands_per_handoff,
        );
        push(&mut rows, w.cpu_us_per_handoff, poll.cpu_us_per_handoff);
        push(&mut rows, w.cpu_us_per_handoff, token.cpu_us_per_handoff);
        push(&mut rows, w.p50_ms, poll.p50_ms);
        push(&mut rows, w.p99_ms, poll.p99_ms);
        push(&mut rows, w.p99_ms, token.p99_ms);
        push(&mut rows, w.fairness, poll.fairness);
        // The same with 1 ms of work outside the lock: a polling lock then idles between polls.
        let think = Duration::from_millis(1);
        let mut thinking = HashMap::new();
        for kind in [Contender::Warden, Contender::Polling, Contender::BlpopToken] {
            thinking.insert(
                format!("{kind:?}"),
                contention(&warden, kind, s.contention, think, safe_release).await,
            );
        }
        let (w, poll, token) = (
            &thinking["Warden"],
            &thinking["Polling"],
            &thinking["BlpopToken"],
        );
        push(&mut rows, w.handoffs_per_s, poll.handoffs_per_s);
        push(&mut rows, w.handoffs_per_s, token.handoffs_per_s);
        push(&mut rows, w.p99_ms, poll.p99_ms);
        push(&mut rows, w.p99_ms, token.p99_ms);
        push(&mut rows, w.fairness, poll.fairness);
        // Read-write locks: pairs on a key of each client's own
        warden.flush();
        for (mode, lock_sha, unlock_sha) in [("READ", &rw[0], &rw[1]), ("WRITE", &rw[2], &rw[3])] {
            let native = driven(&warden, 16, ops, |c, _| {
                let mut p = redis::pipe();
                let k = format!("rw:{c}");
                for _ in 0..8 {
                    p.add_command(cmd(&[&format!("RWLOCK.{mode}"), &k, "owner-1", "30000"]));
                    p.add_command(cmd(&["RWLOCK.UNLOCK", &k, "owner-1"]));
                }
                p
            })
            .await
                / 2.0;
            let lua = driven(&warden, 16, ops, |c, _| {
                let mut p = redis::pipe();
                let k = format!("{{rwl:{c}}}");
                for _ in 0..8 {
                    if mode == "READ" {
                        p.add_command(cmd(&[
                            "EVALSHA",
                            lock_sha,
                            "1",
                            &k,
                            "30000",
                            "owner-1",
                            "owner-1:write",
                        ]));
                    } else {
                        p.add_command(cmd(&[
                            "EVALSHA",
                            lock_sha,
                            "1",
                            &k,
                            "30000",
                            "owner-1:write",
                        ]));
                    }
                    let holder = if mode == "READ" {
                        "owner-1"
                    } else {
                        "owner-1:write"
                    };
                    p.add_command(cmd(&["EVALSHA", unlock_sha, "1", &k, "30000", holder]));
                }
                p
            })
            .await
                / 2.0;
            push(&mut rows, native, lua);
        }
        // Bloom throughput: a large filter on each side, so no scaling happens.
        for server in [&warden, &bloom] {
            server.flush();
            cmd(&["BF.RESERVE", "bf", "0.01", "20000000"])
                .query::<()>(&mut server.sync())
                .unwrap();
        }
        for (p, n_req) in [(16, s.n_p16), (1, s.n_p1)] {
            let w = redis_benchmark(&warden, p, n_req, &["BF.ADD", "bf", "item:__rand_int__"]);
            let o = redis_benchmark(&bloom, p, n_req, &["BF.ADD", "bf", "item:__rand_int__"]);
            push(&mut rows, w, o);
        }
        for (p, n_req) in [(16, s.n_p16), (1, s.n_p1)] {
            let w = redis_benchmark(&warden, p, n_req, &["BF.EXISTS", "bf", "item:__rand_int__"]);
            let o = redis_benchmark(&bloom, p, n_req, &["BF.EXISTS", "bf", "item:__rand_int__"]);
            push(&mut rows, w, o);
        }
        for name in ["BF.MADD", "BF.MEXISTS"] {
            let words = tens(name);
            let words: Vec<&str> = words.iter().map(String::as_str).collect();
            let w = redis_benchmark(&warden, 16, s.n_p16 / 4, &words);
            let o = redis_benchmark(&bloom, 16, s.n_p16 / 4, &words);
            push(&mut rows, w, o);
        }
    }
    // Bloom memory and accuracy: deterministic, measured once.
    for (rate, scaling) in [
        ("0.01", true),
        ("0.001", true),
        ("0.01", false),
        ("0.001", false),
    ] {
        let kind = if scaling { "scaling" } else { "non-scaling" };
        let (wm, wfp) = bloom_quality(&warden, n, rate, scaling).await;
        let (bm, bfp) = bloom_quality(&bloom, n, rate, scaling).await;
        let mut mem = Row::new(
            "bloom quality",
            format!("MEMORY USAGE, {n} items at {rate}, {kind}: warden vs RedisBloom"),
            "bytes",
            Some(("<=", 1.0)),
        );
        mem.warden.push(wm);
        mem.other.push(bm);
        quality_rows.push(mem);
        let target: f64 = rate.parse().unwrap();
        let mut fp = Row::new(
            "bloom quality",
            format!("false-positive rate at capacity {rate}, {kind}: warden vs requested"),
            "rate",
            Some(("<=", 1.0)),
        );
        fp.warden.push(wfp);
        fp.other.push(target);
        quality_rows.push(fp);
        let mut fpb = Row::new(
            "bloom quality",
            format!("false-positive rate at capacity {rate}, {kind}: RedisBloom vs requested"),
            "rate",
            None,
        );
        fpb.warden.push(bfp);
        fpb.other.push(target);
        quality_rows.push(fpb);
    }
    rows.extend(quality_rows);
    let mut detail = Row::new("contention detail", "", "", None);
    detail.name = contention_table
        .iter()
        .map(|(k, c)| {
            format!(
                "{k:?}: {:.0} hand-offs/s, {:.2} commands and {:.1} us CPU per hand-off, p50 {:.2} ms, p99 {:.2} ms, max/min per client {:.2}",
                c.handoffs_per_s, c.commands_per_handoff, c.cpu_us_per_handoff, c.p50_ms, c.p99_ms, c.fairness
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    rows.push(detail);
    rows
}

/// Writes `<stem>.md` and `<stem>.json` into `dir`; `notes` (markdown)
/// follow the table.
fn report(rows: &[Row], notes: &str, quick: bool, dir: &Path, stem: &str) {
    let machine = format!(
        "{} cores, {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(
                |c| c.lines().find(|l| l.starts_with("model name")).map(|l| l
                    .split(':')
                    .nth(1)
                    .unwrap_or("")
                    .trim()
                    .to_string())
            )
            .unwrap_or_default()
    );
    let redis_version = String::from_utf8_lossy(
        &Command::new(server_bin())
            .arg("--version")
            .output()
            .map(|o| o.stdout)
            .unwrap_or_default(),
    )
    .trim()
    .to_string();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# warden benchmark{}\n",
        if quick { " (QUICK)" } else { "" }
    );
    let _ = writeln!(md, "Machine: {machine}; {redis_version}; 50 clients (contention: back to back, and with 1 ms of work outside the lock between acquisitions). Each row ran {} times; the ratio is warden / comparison within one repetition, median (min–max).\n", rows.first().map_or(0, |r| r.warden.len()));
    let _ = writeln!(
        md,
        "| group | row | warden | comparison | unit | ratio (median, min–max) | target | |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let mut json = String::from("[");
    let mut details = String::new();
    for row in rows {
        if row.group == "contention detail" {
            details = row.name.clone();
            continue;
        }
        if json.len() > 1 {
            json.push(',');
        }
        if let Some(why) = row.absent {
            let _ = writeln!(
                md,
                "| {} | {} | — | — | {} | {why} |  |  |",
                row.group, row.name, row.unit
            );
            let _ = write!(
                json,
                "{{\"group\":\"{}\",\"name\":\"{}\",\"ratio\":0,\"target\":null,\"verdict\":\"\",\"absent\":\"{why}\"}}",
                row.group, row.name
            );
            continue;
        }
        let ratios = row.ratios();
        let (lo, hi) = spread(&ratios);
        let target = row
            .target
            .map_or(String::new(), |(op, t)| format!("{op} {t}"));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} ({}–{}) | {} | {} |",
            row.group,
            row.name,
            fmt(median(&row.warden)),
            fmt(median(&row.other)),
            row.unit,
            fmt(median(&ratios)),
            fmt(lo),
            fmt(hi),
            target,
            row.verdict()
        );
        let _ =
            write!(
            json,
            "{{\"group\":\"{}\",\"name\":\"{}\",\"ratio\":{},\"target\":{},\"verdict\":\"{}\"}}",
            row.group,
            row.name.replace('"', "'"),
            if median(&ratios).is_finite() { median(&ratios) } else { 0.0 },
            match (row.target, row.absolute) {
                (Some((_, t)), false) => t.to_string(),
                _ => "null".to_string(),
            },
            row.verdict()
        );
    }
    json.push(']');
    if !details.is_empty() {
        let _ = writeln!(md, "\nContention, last repetition:\n");
        for line in details.lines() {
            let _ = writeln!(md, "- {line}");
        }
    }
    if !notes.is_empty() {
        let _ = writeln!(md, "\n{notes}");
    }
    print!("{md}");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(format!("{stem}.md")), &md).unwrap();
    std::fs::write(dir.join(format!("{stem}.json")), json).unwrap();
}
