//! Big filters: what a filter of 100 million or a billion items costs the
//! server's event loop — reserving, freeing (`UNLINK`, `DEL`), and the worst
//! single `BF.SCANDUMP` / `BF.LOADCHUNK` call of a full dump and restore —
//! and the resident memory right after `BF.RESERVE`. warden and RedisBloom
//! each on a fresh server of their own.
//!
//! Times are the servers' own execution times from `SLOWLOG` (microsecond
//! resolution; network and reply writing excluded), floored at 1 us so that
//! ratios stay finite.

use std::path::Path;
use std::time::{Duration, Instant};

use redis::{Connection, Value};

use crate::{median, Row, Server};

const ERROR_RATE: &str = "0.01";
/// Items added before the dump, so that its pages are really in memory.
const ADDED: usize = 1_000_000;
/// Rounds of reserve / UNLINK / DEL per repetition (the first one's
/// resident memory is reported).
const ROUNDS: usize = 5;
/// warden's own limit (`warden.bf-max-memory`) for this section: 4 GiB.
const WARDEN_ARGS: &[&str] = &["bf-max-memory", "4294967296"];

/// One server's figures for one filter size.
struct Figures {
    reserve_ms: f64,
    rss_mib: f64,
    unlink_ms: f64,
    del_fresh_ms: f64,
    scandump_ms: f64,
    loadchunk_ms: f64,
    del_filled_ms: f64,
    unlink_filled_ms: f64,
    chunks: usize,
}

/// The rows of this section: `reps` repetitions of each size in `sizes`.
pub fn rows(reps: usize, sizes: &[u64], warden_so: &Path, bloom_so: &Path) -> Vec<Row> {
    let mut rows = Vec::new();
    for &items in sizes {
        let label = match items {
            n if n % 1_000_000_000 == 0 => format!("{}G", n / 1_000_000_000),
            n => format!("{}M", n / 1_000_000),
        };
        let names = [
            format!("BF.RESERVE {label} items at {ERROR_RATE}"),
            format!("RSS after BF.RESERVE {label} items"),
            format!("UNLINK of a fresh {label}-item filter"),
            format!("DEL of a fresh {label}-item filter"),
            format!("worst BF.SCANDUMP call, {label}-item filter"),
            format!("worst BF.LOADCHUNK call, {label}-item filter"),
            format!("DEL of a loaded {label}-item filter (every page resident)"),
            format!("UNLINK of a loaded {label}-item filter (every page resident)"),
        ];
        let units = ["ms", "MiB", "ms", "ms", "ms", "ms", "ms", "ms"];
        let mut section: Vec<Row> = names
            .iter()
            .zip(units)
            .map(|(name, unit)| {
                Row::new(
                    "big filters",
                    format!("{name}: warden vs RedisBloom"),
                    unit,
                    Some(("<=", 2.0)),
                )
            })
            .collect();
        for _ in 0..reps {
            let warden = Server::start_with(warden_so, WARDEN_ARGS);
            let w = measure(&warden, items);
            drop(warden);
            let bloom = Server::start_with(bloom_so, &[]);
            let b = measure(&bloom, items);
            drop(bloom);
            eprintln!(
                "big filters {label}: SCANDUMP chunks warden {}, RedisBloom {}",
                w.chunks, b.chunks
            );
            for (row, (x, y)) in section
                .iter_mut()
                .zip(w.values().into_iter().zip(b.values()))
            {
                row.warden.push(x);
                row.other.push(y);
            }
        }
        rows.extend(section);
    }
    rows
}

impl Figures {
    fn values(&self) -> [f64; 8] {
        [
            self.reserve_ms,
            self.rss_mib,
            self.unlink_ms,
            self.del_fresh_ms,
            self.scandump_ms,
            self.loadchunk_ms,
            self.del_filled_ms,
            self.unlink_filled_ms,
        ]
    }
}

fn measure(server: &Server, items: u64) -> Figures {
    let mut c = server.sync();
    for (name, value) in [
        ("slowlog-log-slower-than", "0"),
        ("slowlog-max-len", "100000"),
    ] {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query::<()>(&mut c)
            .unwrap();
    }
    let capacity = items.to_string();
    let reserve = |c: &mut Connection, key: &str| {
        redis::cmd("BF.RESERVE")
            .arg(key)
            .arg(ERROR_RATE)
            .arg(&capacity)
            .query::<()>(c)
            .unwrap();
    };

    // Microsecond figures are noisy: the median of a few rounds.
    let (mut reserves, mut unlinks, mut dels) = (Vec::new(), Vec::new(), Vec::new());
    let mut rss_mib = 0.0;
    for round in 0..ROUNDS {
        reset(&mut c);
        reserve(&mut c, "big");
        reserves.push(slowest(&mut c, "BF.RESERVE"));
        if round == 0 {
            rss_mib = server.rss() as f64 / (1 << 20) as f64;
        }
        reset(&mut c);
        redis::cmd("UNLINK").arg("big").query::<()>(&mut c).unwrap();
        unlinks.push(slowest(&mut c, "UNLINK"));
        settle(&mut c);

        reserve(&mut c, "big");
        reset(&mut c);
        redis::cmd("DEL").arg("big").query::<()>(&mut c).unwrap();
        dels.push(slowest(&mut c, "DEL"));
        settle(&mut c);
    }
    let (reserve_ms, unlink_ms, del_fresh_ms) =
        (median(&reserves), median(&unlinks), median(&dels));

    reserve(&mut c, "big");
    for batch in 0..ADDED / 1000 {
        let mut add = redis::cmd("BF.MADD");
        add.arg("big");
        for i in 0..1000 {
            add.arg(format!("item:{}", batch * 1000 + i));
        }
        add.query::<Value>(&mut c).unwrap();
    }
    reset(&mut c);
    let mut chunks = Vec::new();
    let mut iter = 0i64;
    loop {
        let (next, data): (i64, Vec<u8>) = redis::cmd("BF.SCANDUMP")
            .arg("big")
            .arg(iter)
            .query(&mut c)
            .unwrap();
        if next == 0 {
            break;
        }
        chunks.push((next, data));
        iter = next;
    }
    let scandump_ms = slowest(&mut c, "BF.SCANDUMP");
    redis::cmd("DEL").arg("big").query::<()>(&mut c).unwrap();
    settle(&mut c);
    reset(&mut c);
    for key in ["copy", "copy2"] {
        for (iter, data) in &chunks {
            redis::cmd("BF.LOADCHUNK")
                .arg(key)
                .arg(*iter)
                .arg(data)
                .query::<()>(&mut c)
                .unwrap();
        }
        let found: i64 = redis::cmd("BF.EXISTS")
            .arg(key)
            .arg("item:7")
            .query(&mut c)
            .unwrap();
        assert_eq!(found, 1, "the restored filter lost an item");
    }
    let loadchunk_ms = slowest(&mut c, "BF.LOADCHUNK");
    reset(&mut c);
    redis::cmd("DEL").arg("copy").query::<()>(&mut c).unwrap();
    let del_filled_ms = slowest(&mut c, "DEL");
    settle(&mut c);
    reset(&mut c);
    redis::cmd("UNLINK")
        .arg("copy2")
        .query::<()>(&mut c)
        .unwrap();
    let unlink_filled_ms = slowest(&mut c, "UNLINK");
    settle(&mut c);
    Figures {
        reserve_ms,
        rss_mib,
        unlink_ms,
        del_fresh_ms,
        scandump_ms,
        loadchunk_ms,
        del_filled_ms,
        unlink_filled_ms,
        chunks: chunks.len(),
    }
}

fn reset(c: &mut Connection) {
    redis::cmd("SLOWLOG").arg("RESET").query::<()>(c).unwrap();
}

/// The longest execution of `command` in the slow log, in ms.
fn slowest(c: &mut Connection, command: &str) -> f64 {
    let entries: Vec<Value> = redis::cmd("SLOWLOG").arg("GET").arg(-1).query(c).unwrap();
    let mut worst = 1u64;
    for entry in entries {
        let Value::Array(fields) = entry else {
            continue;
        };
        let (Some(Value::Int(us)), Some(Value::Array(args))) = (fields.get(2), fields.get(3))
        else {
            continue;
        };
        let name = match args.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).to_string(),
            _ => continue,
        };
        if name.eq_ignore_ascii_case(command) {
            worst = worst.max(*us as u64);
        }
    }
    worst as f64 / 1000.0
}

/// Waits until background frees are done, so they do not overlap what follows.
fn settle(c: &mut Connection) {
    let started = Instant::now();
    loop {
        let info: String = redis::cmd("INFO").arg("memory").query(c).unwrap();
        let pending = info
            .lines()
            .find_map(|l| l.strip_prefix("lazyfree_pending_objects:"))
            .map_or(0, |v| v.trim().parse::<u64>().unwrap_or(0));
        if pending == 0 || started.elapsed() > Duration::from_secs(60) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
