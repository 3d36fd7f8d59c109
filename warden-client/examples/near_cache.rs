//! The near-cache bench's Rust driver (bench/near_cache.py runs it; `make
//! bench SECTION=near-cache`): warden-client's near cache,
//! `Cache::near(NearConfig::default())`, one reader (the main thread, in
//! `block_on`) on a multi-thread runtime of 2 workers, where the tracking
//! connection's tasks run (the reader also yields every YIELD_EVERY reads,
//! as the Node one). Built only with `--features near-bench` (the feature adds
//! nothing else), so a checkout without the near cache still builds its
//! examples.
//!
//! Parameters (`--name value`): --port P --prefix K --keys 4 --seconds 5
//! --hits 200000 --client warden; `--version` prints {"warden-client": v}.
//! Protocol as bench/near_cache_python.py: warm-up, the hit latency (HITS
//! reads of K:hit, each timed alone, the timer included), READY; on GO the
//! race (read starts on CLOCK_MONOTONIC, as the other drivers'), then
//! `RESULT {json}` with the reads run-length coded and the near cache's
//! stats. The keys are plain strings the writer `SET`s; a miss reads them
//! through `CACHE.GET` (the loader, never expected to run, errs).

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::time::Duration;

use warden_client::{NearConfig, Warden};

const BUCKET_NS: i64 = 2_000;
const YIELD_EVERY: u64 = 100;
const LEASE: Duration = Duration::from_secs(5);

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
}

/// CLOCK_MONOTONIC in ns: the clock the writer and every driver share.
fn now() -> i64 {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec (x86_64/aarch64 Linux layout) into `ts`.
    unsafe { clock_gettime(1, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

fn pct(s: &[i64], p: f64) -> i64 {
    s[((s.len() as f64 * p / 100.0) as usize).min(s.len() - 1)]
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.iter().any(|a| a == "--version") {
        println!("{{\"warden-client\": \"{}\"}}", env!("CARGO_PKG_VERSION"));
        return;
    }
    let args: HashMap<&str, &str> = argv
        .chunks(2)
        .map(|c| (c[0].trim_start_matches("--"), c[1].as_str()))
        .collect();
    let get = |k: &str, d: &'static str| -> String { args.get(k).copied().unwrap_or(d).into() };
    assert_eq!(get("client", "warden"), "warden", "--client: warden only");
    let port = get("port", "6379");
    let prefix = get("prefix", "near");
    let n_keys: usize = get("keys", "4").parse().expect("--keys");
    let seconds: f64 = get("seconds", "5").parse().expect("--seconds");
    let hits: usize = get("hits", "200000").parse().expect("--hits");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let warden = Warden::open(&format!("redis://127.0.0.1:{port}")).expect("url");
        let near = warden.cache().near(NearConfig::default()).expect("a plain server");
        let read = |key: String| {
            let near = &near;
            async move {
                near.get_or_load(&key, LEASE, || async {
                    Err::<String, _>(std::io::Error::other("the loader ran: the key is missing"))
                })
                .await
                .expect("read")
            }
        };
        let keys: Vec<String> = (0..n_keys).map(|i| format!("{prefix}:{i}")).collect();
        let hit = format!("{prefix}:hit");
        for _ in 0..1000 {
            read(hit.clone()).await;
            for k in &keys {
                read(k.clone()).await;
            }
        }
        let mut lat = Vec::with_capacity(hits);
        for i in 0..hits {
            let t0 = now();
            read(hit.clone()).await;
            lat.push(now() - t0);
            if (i as u64).is_multiple_of(YIELD_EVERY) {
                tokio::task::yield_now().await;
            }
        }
        lat.sort_unstable();
        println!("READY");
        std::io::stdout().flush().unwrap();
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).unwrap();
        if line.trim() != "GO" {
            return;
        }
        let stats0 = near.stats();
        let mut entries: Vec<[i64; 5]> = Vec::new();
        let mut cur: Vec<Option<usize>> = vec![None; n_keys];
        let mut reads: u64 = 0;
        let t_start = now();
        let end = t_start + (seconds * 1e9) as i64;
        let mut i = 0;
        loop {
            let t = now();
            if t >= end {
                break;
            }
            let v: i64 = read(keys[i].clone()).await.parse().expect("an integer");
            match cur[i] {
                Some(j) if entries[j][1] == v && t - entries[j][2] <= BUCKET_NS => {
                    entries[j][3] = t;
                    entries[j][4] += 1;
                }
                _ => {
                    entries.push([i as i64, v, t, t, 1]);
                    cur[i] = Some(entries.len() - 1);
                }
            }
            reads += 1;
            i = (i + 1) % n_keys;
            if reads.is_multiple_of(YIELD_EVERY) {
                tokio::task::yield_now().await;
            }
        }
        let t_end = now();
        let s = near.stats();
        let list: Vec<String> = entries
            .iter()
            .map(|e| format!("[{},{},{},{},{}]", e[0], e[1], e[2], e[3], e[4]))
            .collect();
        println!(
            "RESULT {{\"reads\": {reads}, \"seconds\": {}, \"hit_ns_p50\": {}, \"hit_ns_p99\": {}, \
             \"hits\": {hits}, \"timer\": \"clock_gettime(CLOCK_MONOTONIC) around each awaited read\", \
             \"info_hits\": {}, \"info_misses\": {}, \"info_invalidations\": {}, \"info_flushes\": {}, \
             \"entries\": [{}]}}",
            (t_end - t_start) as f64 / 1e9,
            pct(&lat, 50.0),
            pct(&lat, 99.0),
            s.hits - stats0.hits,
            s.misses - stats0.misses,
            s.invalidations - stats0.invalidations,
            s.flushes - stats0.flushes,
            list.join(",")
        );
        std::io::stdout().flush().unwrap();
        near.close();
    });
}
