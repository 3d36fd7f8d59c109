//! The consistency race: readers get-or-load a few keys from a slow database
//! (a load reads the database, then takes a random 0–20 ms before it writes
//! the cache) while writers update the database and then invalidate the
//! cache. At the end, with everyone stopped and every fill done, a key is
//! stale when its cached value differs from the database's.
//!
//! With `CACHE.*` a fill is refused once the key was invalidated after its
//! lease was granted, so no key can end stale. With plain delete-after-write
//! (`GET`/`SET`/`DEL`), a reader that loaded before a write and sets after
//! its `DEL` writes the old value back, and it stays until the next write.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::rc::Rc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::{cmd, Row, Server};

const KEYS: usize = 8;
const READERS: usize = 16;
const WRITERS: usize = 4;
const ROUNDS: usize = 5;
/// The slowest load, after the database was read.
const SLOW_MS: u64 = 20;
/// Writers pause up to this long between writes.
const WRITE_EVERY_MS: u64 = 20;
const LEASE_MS: &str = "2000";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    /// `CACHE.GET … WAIT` / `CACHE.FILL`; writers `CACHE.INVALIDATE`.
    Leases,
    /// The same readers; writers a plain `DEL` (the cache-aside invalidation
    /// most code already has), of a key that is often missing.
    LeasesDel,
    /// `GET`, on a miss load and `SET`; writers `DEL`.
    DeleteAfterWrite,
}

/// A small xorshift generator: the race only needs jitter, not quality.
struct Jitter(u64);

impl Jitter {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The database: one version per key, the value cached is `v<version>`.
type Database = Rc<RefCell<Vec<u64>>>;

fn key(k: usize) -> String {
    format!("race:{k}")
}

fn value(version: u64) -> String {
    format!("v{version}")
}

/// One get-or-load of `key(k)`; whether a fill was refused.
async fn read(
    con: &mut MultiplexedConnection,
    db: &Database,
    k: usize,
    variant: Variant,
    jitter: &mut Jitter,
) -> bool {
    let key = key(k);
    match variant {
        Variant::Leases | Variant::LeasesDel => loop {
            let (cached, lease): (Option<String>, Option<u64>) =
                cmd(&["CACHE.GET", &key, LEASE_MS, "WAIT", LEASE_MS])
                    .query_async(con)
                    .await
                    .unwrap();
            match (cached, lease) {
                (None, Some(token)) => {
                    let loaded = value(db.borrow()[k]);
                    tokio::time::sleep(Duration::from_millis(jitter.below(SLOW_MS + 1))).await;
                    let stored: i64 = cmd(&["CACHE.FILL", &key, &token.to_string(), &loaded])
                        .query_async(con)
                        .await
                        .unwrap();
                    return stored == 0;
                }
                (Some(_), _) => return false,
                (None, None) => {}
            }
        },
        Variant::DeleteAfterWrite => {
            let cached: Option<String> = cmd(&["GET", &key]).query_async(con).await.unwrap();
            if cached.is_none() {
                let loaded = value(db.borrow()[k]);
                tokio::time::sleep(Duration::from_millis(jitter.below(SLOW_MS + 1))).await;
                let _: () = cmd(&["SET", &key, &loaded]).query_async(con).await.unwrap();
            }
            false
        }
    }
}

/// A round's outcome.
struct Round {
    stale: usize,
    refused_fills: usize,
    writes: usize,
}

async fn round(server: &Server, variant: Variant, run_for: Duration, seed: u64) -> Round {
    server.flush();
    let db: Database = Rc::new(RefCell::new(vec![0; KEYS]));
    let deadline = Instant::now() + run_for;
    let mut readers = Vec::new();
    for i in 0..READERS {
        let (mut con, db) = (server.conn().await, db.clone());
        let mut jitter = Jitter(seed * 1000 + i as u64 + 1);
        readers.push(tokio::task::spawn_local(async move {
            let mut refused = 0;
            while Instant::now() < deadline {
                let k = jitter.below(KEYS as u64) as usize;
                refused += usize::from(read(&mut con, &db, k, variant, &mut jitter).await);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            refused
        }));
    }
    let mut writers = Vec::new();
    for i in 0..WRITERS {
        let (mut con, db) = (server.conn().await, db.clone());
        let mut jitter = Jitter(seed * 1000 + 500 + i as u64);
        writers.push(tokio::task::spawn_local(async move {
            let mut writes = 0;
            while Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(jitter.below(WRITE_EVERY_MS + 1))).await;
                let k = jitter.below(KEYS as u64) as usize;
                db.borrow_mut()[k] += 1;
                let invalidate = match variant {
                    Variant::Leases => "CACHE.INVALIDATE",
                    Variant::LeasesDel | Variant::DeleteAfterWrite => "DEL",
                };
                let _: i64 = cmd(&[invalidate, &key(k)])
                    .query_async(&mut con)
                    .await
                    .unwrap();
                writes += 1;
            }
            writes
        }));
    }
    let mut writes = 0;
    for w in writers {
        writes += w.await.unwrap();
    }
    let mut refused_fills = 0;
    for r in readers {
        refused_fills += r.await.unwrap();
    }
    let mut check = server.sync();
    let db = db.borrow();
    let stale = (0..KEYS)
        .filter(|&k| {
            let cached: Option<String> = cmd(&["GET", &key(k)]).query(&mut check).unwrap();
            cached.is_some_and(|v| v != value(db[k]))
        })
        .count();
    Round {
        stale,
        refused_fills,
        writes,
    }
}

/// The row of this section (stale keys over every round) and its table of
/// rounds, in markdown.
pub async fn rows(server: &Server, run_for: Duration) -> (Vec<Row>, String) {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Consistency race: {READERS} readers and {WRITERS} writers on {KEYS} keys, loads taking 0–{SLOW_MS} ms after reading the database, writes every 0–{WRITE_EVERY_MS} ms per writer, {ROUNDS} rounds of {:.0} s per variant; stale keys of {KEYS} at the end of each round.\n",
        run_for.as_secs_f64()
    );
    let _ = writeln!(
        md,
        "| variant | stale keys per round | writes per round | fills refused per round |"
    );
    let _ = writeln!(md, "|---|---|---|---|");
    let mut totals = Vec::new();
    for (variant, label) in [
        (
            Variant::Leases,
            "CACHE.GET WAIT / CACHE.FILL, writers CACHE.INVALIDATE",
        ),
        (
            Variant::LeasesDel,
            "CACHE.GET WAIT / CACHE.FILL, writers DEL",
        ),
        (Variant::DeleteAfterWrite, "GET / SET, writers DEL"),
    ] {
        eprintln!("consistency race: {label}");
        let mut rounds = Vec::new();
        for r in 0..ROUNDS {
            rounds.push(round(server, variant, run_for, r as u64 + 1).await);
        }
        let list = |f: fn(&Round) -> usize| {
            rounds
                .iter()
                .map(|r| f(r).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            md,
            "| {label} | {} | {} | {} |",
            list(|r| r.stale),
            list(|r| r.writes),
            match variant {
                Variant::Leases | Variant::LeasesDel => list(|r| r.refused_fills),
                Variant::DeleteAfterWrite => "no leases".to_string(),
            }
        );
        totals.push(rounds.iter().map(|r| r.stale).sum::<usize>() as f64);
    }
    let mut row = Row::new(
        "consistency race",
        format!("stale keys after {ROUNDS} rounds: CACHE.* (writers CACHE.INVALIDATE or DEL) vs GET/SET/DEL (target on CACHE.*: 0)"),
        "keys",
        Some(("<=", 0.0)),
    )
    .absolute();
    row.warden.push(totals[0] + totals[1]);
    row.other.push(totals[2]);
    (vec![row], md)
}
