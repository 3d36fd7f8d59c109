//! The overload scenario in one run, every row (`make bench SECTION=overload`
//! runs examples/overload.rs once per scenario instead), through
//! `Semaphore`: limit 3, each holder 4 ms inside, one request a millisecond
//! for 300 ms, each caller giving up after 50 ms (the capacity bound is ~263
//! grants), by `.wait`, by `tokio::time::timeout` and with `.max_queue(8)`;
//! and a burst of 32 acquires with free permits on a fresh client. One JSON
//! object per row on stdout.
//!
//! It starts its own server: `WARDEN_SERVER` (default `redis-server`) with
//! `WARDEN_MODULE` (the module's `.so`), on a TCP port of 127.0.0.1
//! (`WARDEN_BENCH_PORT`, else a free one). `--url redis://…` uses a running
//! server instead. `--rounds n` repeats each scenario (default 3).
//!
//! ```text
//! WARDEN_MODULE=target/release/libwarden.so cargo run --release --example overload_rows
//! ```

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use warden_client::{Semaphore, Warden};

const LIMIT: u32 = 3;
const HOLD: Duration = Duration::from_millis(4);
const REQUESTS: u32 = 300;
const EVERY: Duration = Duration::from_millis(1);
const DEADLINE: Duration = Duration::from_millis(50);
const BURST: u32 = 32;

/// How a caller gives its deadline.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// `.wait(50 ms)`: the client knows the deadline.
    Wait,
    /// `tokio::time::timeout(50 ms, acquire())` around a wait without end:
    /// the deadline is a cancellation.
    Timeout,
    /// `.wait(50 ms).max_queue(n)`: load shedding at the door.
    Queue(u64),
}

impl Mode {
    fn name(self) -> String {
        match self {
            Mode::Wait => "wait".into(),
            Mode::Timeout => "timeout".into(),
            Mode::Queue(n) => format!("wait+max_queue({n})"),
        }
    }

    fn semaphore(self, warden: &Warden, key: &str) -> Semaphore {
        let sem = warden.semaphore(key, LIMIT).ttl(Duration::from_secs(10));
        match self {
            Mode::Wait => sem.wait(DEADLINE),
            Mode::Timeout => sem,
            Mode::Queue(n) => max_queue(sem.wait(DEADLINE), n),
        }
    }
}

fn max_queue(sem: Semaphore, n: u64) -> Semaphore {
    sem.max_queue(n)
}

/// Holds for `d`: a timer for most of it (tokio's timers fire on whole
/// milliseconds, late), then yields until exactly `d` has passed.
async fn hold_for(d: Duration) {
    let end = Instant::now() + d;
    tokio::time::sleep(d.saturating_sub(Duration::from_millis(1))).await;
    while Instant::now() < end {
        tokio::task::yield_now().await;
    }
}

/// `SEM.RELEASE` calls so far (`INFO commandstats`).
fn release_calls(url: &str) -> u64 {
    let mut c = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("connection");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut c)
        .unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_sem.release:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn overload(url: &str, mode: Mode, round: u32) -> String {
    let warden = Warden::open(url).expect("client");
    let key = format!("overload:{}:{round}", mode.name());
    // Connections warmed as a running service has them.
    drop(warden.semaphore("warm", 1).try_acquire().await);
    let inside = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let releases_before = release_calls(url);
    let held_ms = Arc::new(std::sync::Mutex::new(Vec::new()));
    let start = Instant::now();
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let sem = mode.semaphore(&warden, &key);
            let (inside, most) = (inside.clone(), most.clone());
            let held_ms = held_ms.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(start + EVERY * i).await;
                let called = Instant::now();
                let got = match mode {
                    Mode::Timeout => match tokio::time::timeout(DEADLINE, sem.acquire()).await {
                        Ok(got) => got,
                        Err(_) => Ok(None),
                    },
                    _ => sem.acquire().await,
                };
                let took = called.elapsed();
                match got {
                    Ok(Some(guard)) => {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        let late = took > DEADLINE;
                        let held = Instant::now();
                        if !late {
                            hold_for(HOLD).await;
                        }
                        inside.fetch_sub(1, Ordering::SeqCst);
                        let _ = guard.release().await;
                        held_ms.lock().unwrap().push(ms(held.elapsed()));
                        (Some(took), late, false)
                    }
                    Ok(None) => (None, false, false),
                    Err(e) => {
                        eprintln!("acquire failed: {e}");
                        (None, false, true)
                    }
                }
            })
        })
        .collect();
    let (mut granted, mut late, mut errors) = (0u32, 0u32, 0u32);
    let mut latencies = Vec::new();
    for t in tasks {
        let (took, was_late, failed) = t.await.expect("task");
        if let Some(took) = took {
            granted += 1;
            latencies.push(ms(took));
        }
        late += u32::from(was_late);
        errors += u32::from(failed);
    }
    latencies.sort_by(f64::total_cmp);
    // Releases the driver did not send: the client's own, for grants it gave
    // back (late, or racing a cancellation) and after each cancelled wait.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let client_releases = (release_calls(url) - releases_before).saturating_sub(u64::from(granted));
    let held = held_ms.lock().unwrap().clone();
    let held_mean = held.iter().sum::<f64>() / held.len().max(1) as f64;
    format!(
        "{{\"row\":\"overload\",\"client\":\"warden-client\",\"mode\":\"{}\",\"round\":{round},\
         \"requests\":{REQUESTS},\"capacity_bound\":263,\"granted\":{granted},\"late\":{late},\
         \"max_inside\":{},\"limit\":{LIMIT},\"errors\":{errors},\"p50_ms\":{:.2},\"p99_ms\":{:.2},\"client_releases\":{client_releases},\"hold_mean_ms\":{held_mean:.2}}}",
        mode.name(),
        most.load(Ordering::SeqCst),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
    )
}

async fn burst(url: &str, round: u32) -> String {
    // A fresh client: its first acquire opens the connection.
    let warden = Warden::open(url).expect("client");
    let sem = warden
        .semaphore(format!("burst:{round}"), BURST)
        .wait(Duration::from_secs(5));
    let start = Instant::now();
    let tasks: Vec<_> = (0..BURST)
        .map(|_| {
            let sem = sem.clone();
            tokio::spawn(async move {
                let guard = sem.acquire().await;
                (start.elapsed(), guard)
            })
        })
        .collect();
    let mut times = Vec::new();
    let mut guards = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (took, guard) = t.await.expect("task");
        match guard {
            Ok(Some(guard)) => {
                times.push(ms(took));
                guards.push(guard);
            }
            _ => errors += 1,
        }
    }
    for g in guards {
        let _ = g.release().await;
    }
    times.sort_by(f64::total_cmp);
    format!(
        "{{\"row\":\"burst\",\"client\":\"warden-client\",\"round\":{round},\"acquires\":{BURST},\
         \"granted\":{},\"errors\":{errors},\"first_ms\":{:.2},\"all_ms\":{:.2}}}",
        times.len(),
        times.first().copied().unwrap_or(f64::NAN),
        times.last().copied().unwrap_or(f64::NAN),
    )
}

/// A server of our own, stopped when dropped.
struct Server(Child, String);

impl Server {
    fn start() -> Server {
        let module = std::env::var("WARDEN_MODULE").expect("WARDEN_MODULE: the module's .so");
        let binary = std::env::var("WARDEN_SERVER").unwrap_or_else(|_| "redis-server".into());
        let port = std::env::var("WARDEN_BENCH_PORT")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| {
                let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
                l.local_addr().expect("port").port()
            });
        let mut child = Command::new(binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--loadmodule", &module])
            .stdout(Stdio::null())
            .spawn()
            .expect("server starts");
        let url = format!("redis://127.0.0.1:{port}/");
        let client = redis::Client::open(url.as_str()).expect("url");
        let up = (0..200).any(|_| {
            let pong = client
                .get_connection()
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            pong.is_ok() || {
                std::thread::sleep(Duration::from_millis(10));
                false
            }
        });
        if !up {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server did not come up on {url}");
        }
        Server(child, url)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let rounds: u32 = arg("--rounds").and_then(|r| r.parse().ok()).unwrap_or(3);
    let (_server, url) = match arg("--url") {
        Some(url) => (None, url),
        None => {
            let s = Server::start();
            let url = s.1.clone();
            (Some(s), url)
        }
    };
    for mode in [Mode::Wait, Mode::Timeout, Mode::Queue(8)] {
        for round in 0..rounds {
            println!("{}", overload(&url, mode, round).await);
        }
    }
    for round in 0..rounds.max(5) {
        println!("{}", burst(&url, round).await);
    }
}
