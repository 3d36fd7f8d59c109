//! The overload bench's driver for this client (bench/overload.py runs it;
//! `make bench SECTION=overload`). One run of one scenario against a server
//! with the module; prints one JSON object on stdout.
//!
//! Parameters (`--name value`; times in ms):
//!   --port P                 the server, 127.0.0.1:P
//!   --client C               warden-wait (the deadline as `.wait(d)`) or
//!                            warden-timeout (`tokio::time::timeout(d, ..)`
//!                            around an acquire that waits until granted)
//!   --scenario S             overload or burst
//!   --kind K                 sem (a semaphore of --limit) or lock (limit 1)
//!   --key KEY
//!   overload: --limit --hold-ms --interval-ms --requests --deadline-ms
//!     one request every interval; each holds hold-ms once granted (a
//!     thread's sleep: tokio's timer rounds up to whole ms). Prints
//!     {"granted","late","max_inside","errors","error_sample",
//!      "lat_ms":[acquire latency of each grant]}; late = granted after
//!     deadline-ms from the call (held like any grant: the caller cannot tell);
//!     "span_ms": from the first call to the last (a loaded machine stretches it);
//!     "held_ms": each hold, from the grant reaching the caller to the release's reply.
//!   burst: --limit --requests --rounds
//!     per round a fresh client (one command sent first: the application's
//!     connection is open), `requests` acquires at once with permits free.
//!     Prints {"first_ms":[per round],"all_ms":[per round],"errors","error_sample"}.
//!   --version prints {"warden-client": version}.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use warden_client::Warden;

struct Params(HashMap<String, String>);

impl Params {
    fn str(&self, name: &str) -> &str {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("--{name} is missing"))
    }
    fn num(&self, name: &str) -> u64 {
        self.str(name)
            .parse()
            .unwrap_or_else(|_| panic!("--{name}: not a number"))
    }
}

/// One acquire as the client variant gives the deadline; `Ok(None)`: not granted.
async fn acquire(
    warden: &Warden,
    p: &Params,
    deadline: Duration,
) -> Result<Option<Release>, String> {
    let key = p.str("key").to_string();
    let ttl = Duration::from_secs(10);
    let by_timeout = p.str("client") == "warden-timeout";
    // Zero waits until granted: the timeout around it is the deadline.
    let wait = if by_timeout { Duration::ZERO } else { deadline };
    let fut = async {
        if p.str("kind") == "lock" {
            let g = warden.lock(key).ttl(ttl).wait(wait).acquire().await;
            g.map(|g| g.map(Release::Lock))
        } else {
            let sem = warden
                .semaphore(key, p.num("limit") as u32)
                .ttl(ttl)
                .wait(wait);
            let g = sem.acquire().await;
            g.map(|g| g.map(Release::Sem))
        }
    };
    let out = if by_timeout {
        match tokio::time::timeout(deadline, fut).await {
            Ok(r) => r,
            Err(_) => Ok(None),
        }
    } else {
        fut.await
    };
    out.map_err(|e| e.to_string())
}

enum Release {
    Lock(warden_client::LockGuard),
    Sem(warden_client::SemaphoreGuard),
}

impl Release {
    async fn release(self) -> Result<(), String> {
        let r = match self {
            Release::Lock(g) => g.release().await.map(|_| ()),
            Release::Sem(g) => g.release().await.map(|_| ()),
        };
        r.map_err(|e| e.to_string())
    }
}

fn json_list(v: &[f64]) -> String {
    let items: Vec<String> = v.iter().map(|x| format!("{x:.3}")).collect();
    format!("[{}]", items.join(","))
}

fn json_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

async fn overload(p: Arc<Params>, url: String) -> String {
    let warden = Warden::open(&url).expect("url");
    let deadline = Duration::from_millis(p.num("deadline-ms"));
    let hold = Duration::from_millis(p.num("hold-ms"));
    let interval = Duration::from_millis(p.num("interval-ms"));
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let out = Arc::new(Mutex::new((Vec::<f64>::new(), 0u64, 0u64, String::new())));
    let held = Arc::new(Mutex::new(Vec::<f64>::new()));
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..p.num("requests") {
        tokio::time::sleep_until(start + interval * i as u32).await;
        let (warden, p, inside, max_inside, out, held) = (
            warden.clone(),
            p.clone(),
            inside.clone(),
            max_inside.clone(),
            out.clone(),
            held.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let called = Instant::now();
            match acquire(&warden, &p, deadline).await {
                Ok(Some(grant)) => {
                    let waited = called.elapsed();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    max_inside.fetch_max(now, Ordering::SeqCst);
                    {
                        let mut o = out.lock().unwrap();
                        o.0.push(waited.as_secs_f64() * 1000.0);
                        o.1 += u64::from(waited > deadline);
                    }
                    let granted = Instant::now();
                    // A thread's sleep: tokio's timer counts whole ms and
                    // rounds up (4 ms held about 5), and every client here
                    // holds for the same time.
                    tokio::task::spawn_blocking(move || std::thread::sleep(hold))
                        .await
                        .unwrap();
                    inside.fetch_sub(1, Ordering::SeqCst);
                    if let Err(e) = grant.release().await {
                        let mut o = out.lock().unwrap();
                        o.2 += 1;
                        o.3 = e;
                    }
                    let ms = granted.elapsed().as_secs_f64() * 1000.0;
                    held.lock().unwrap().push(ms);
                }
                Ok(None) => {}
                Err(e) => {
                    let mut o = out.lock().unwrap();
                    o.2 += 1;
                    o.3 = e;
                }
            }
        }));
    }
    let span = start.elapsed().as_secs_f64() * 1000.0;
    for t in tasks {
        t.await.expect("task");
    }
    let o = out.lock().unwrap();
    format!(
        "{{\"span_ms\":{span:.3},\"granted\":{},\"late\":{},\"max_inside\":{},\"errors\":{},\"error_sample\":{},\"lat_ms\":{},\"held_ms\":{}}}",
        o.0.len(),
        o.1,
        max_inside.load(Ordering::SeqCst),
        o.2,
        json_str(&o.3),
        json_list(&o.0),
        json_list(&held.lock().unwrap())
    )
}

async fn burst(p: Arc<Params>, url: String) -> String {
    let (mut firsts, mut alls, mut errors, mut sample) = (Vec::new(), Vec::new(), 0, String::new());
    for _ in 0..p.num("rounds") {
        let warden = Warden::open(&url).expect("url");
        // The application's connection is open before the burst.
        let warm = warden.semaphore("burst:warm", 1).try_acquire().await;
        drop(warm);
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..p.num("requests") {
            let (warden, p) = (warden.clone(), p.clone());
            tasks.push(tokio::spawn(async move {
                let r = acquire(&warden, &p, Duration::from_secs(5)).await;
                (start.elapsed().as_secs_f64() * 1000.0, r)
            }));
        }
        let mut times = Vec::new();
        let mut grants = Vec::new();
        for t in tasks {
            match t.await.expect("task") {
                (ms, Ok(Some(g))) => {
                    times.push(ms);
                    grants.push(g);
                }
                (_, Ok(None)) => {
                    errors += 1;
                    sample = "not granted".into();
                }
                (_, Err(e)) => {
                    errors += 1;
                    sample = e;
                }
            }
        }
        for g in grants {
            let _ = g.release().await;
        }
        times.sort_by(f64::total_cmp);
        if let (Some(first), Some(all)) = (times.first(), times.last()) {
            firsts.push(*first);
            alls.push(*all);
        }
    }
    format!(
        "{{\"first_ms\":{},\"all_ms\":{},\"errors\":{},\"error_sample\":{}}}",
        json_list(&firsts),
        json_list(&alls),
        errors,
        json_str(&sample)
    )
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut map = HashMap::new();
    while let Some(name) = args.next() {
        if name == "--version" {
            println!("{{\"warden-client\":\"{}\"}}", env!("CARGO_PKG_VERSION"));
            return;
        }
        let name = name.trim_start_matches("--").to_string();
        map.insert(name, args.next().expect("a value after each --name"));
    }
    let p = Arc::new(Params(map));
    let url = format!("redis://127.0.0.1:{}/", p.str("port"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let line = rt.block_on(async {
        match p.str("scenario") {
            "overload" => overload(p.clone(), url).await,
            "burst" => burst(p.clone(), url).await,
            other => panic!("unknown scenario {other}"),
        }
    });
    println!("{line}");
}
