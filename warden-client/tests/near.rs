//! The near cache against a real server: hits with no round trip, every
//! change of a key dropping it, stale values and misses through the server,
//! bounds, a lost tracking connection or a restart flushing everything, and
//! the race checker (docs/cache.md "Near cache").

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::*;
use warden_client::{NearCache, NearConfig};

const LEASE: Duration = Duration::from_secs(5);

fn near(s: &Server, config: NearConfig) -> NearCache {
    warden(s).cache().near(config).expect("a plain server")
}

/// The value of `key` through `near`; a miss the server cannot answer fails
/// the test (the loader must not run).
async fn read(near: &NearCache, key: &str) -> String {
    near.get_or_load(key, LEASE, || async {
        Err::<String, _>(std::io::Error::other("the loader ran"))
    })
    .await
    .unwrap_or_else(|e| panic!("{key}: {e}"))
}

/// The tracking connection's server-side id (its flags have `t`).
fn tracking_id(c: &mut redis::Connection) -> Option<String> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(c).unwrap();
    list.lines().find_map(|l| {
        let flags = l.split(' ').find_map(|f| f.strip_prefix("flags="))?;
        flags.contains('t').then(|| {
            l.split(' ')
                .find_map(|f| f.strip_prefix("id="))
                .unwrap()
                .to_string()
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_costs_no_round_trip() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    run(&mut c, &["SET", "k", "v"]).unwrap();
    let near = near(&s, NearConfig::default());
    assert_eq!(read(&near, "k").await, "v");
    let (peeks, gets) = (calls(&mut c, "cache.peek"), calls(&mut c, "cache.get"));
    for _ in 0..100 {
        assert_eq!(read(&near, "k").await, "v");
    }
    assert_eq!(
        calls(&mut c, "cache.peek"),
        peeks,
        "no CACHE.PEEK for a hit"
    );
    assert_eq!(calls(&mut c, "cache.get"), gets, "no CACHE.GET for a hit");
    assert_eq!(near.stats().hits, 100);
}

/// Each change of a key the near cache holds: after `sync`, the next read
/// goes to the server and answers what the key holds now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_of_a_key_drops_it() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let near = near(&s, NearConfig::default());
    type Change = fn(&mut redis::Connection, &str) -> Option<&'static str>;
    let rows: &[(&str, Change)] = &[
        ("SET", |c, k| {
            run(c, &["SET", k, "new"]).unwrap();
            Some("new")
        }),
        ("DEL then SET", |c, k| {
            run(c, &["DEL", k]).unwrap();
            run(c, &["SET", k, "again"]).unwrap();
            Some("again")
        }),
        ("APPEND", |c, k| {
            run(c, &["APPEND", k, "+"]).unwrap();
            Some("old+")
        }),
        ("CACHE.INVALIDATE", |c, k| {
            run(c, &["CACHE.INVALIDATE", k]).unwrap();
            None
        }),
        ("expiry", |c, k| {
            run(c, &["PEXPIRE", k, "1"]).unwrap();
            std::thread::sleep(Duration::from_millis(5));
            None
        }),
        ("FLUSHALL", |c, _| {
            run(c, &["FLUSHALL"]).unwrap();
            None
        }),
    ];
    for (name, change) in rows {
        let key = format!("k:{name}");
        run(&mut c, &["SET", &key, "old"]).unwrap();
        assert_eq!(read(&near, &key).await, "old");
        assert_eq!(read(&near, &key).await, "old", "{name}: kept");
        let hits = near.stats().hits;
        let now = change(&mut c, &key);
        near.sync().await.unwrap();
        let got = near
            .get_or_load(&key, LEASE, || async {
                Ok::<_, std::io::Error>("loaded".to_string())
            })
            .await
            .unwrap();
        assert_eq!(got, now.unwrap_or("loaded"), "{name}");
        assert_eq!(
            near.stats().hits,
            hits,
            "{name}: not served from the near cache"
        );
    }
    assert!(near.stats().invalidations >= 4, "{:?}", near.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_value_is_served_by_the_server_and_not_kept() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    let near = near(&s, NearConfig::default());
    run(&mut c, &["SET", "k", "v1"]).unwrap();
    assert_eq!(read(&near, "k").await, "v1");
    int(&mut c, &["CACHE.INVALIDATE", "k", "STALE", "60000"]);
    near.sync().await.unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    for _ in 0..3 {
        let loads = loads.clone();
        let v = near
            .get_or_load("k", LEASE, move || async move {
                loads.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>("v2".to_string())
            })
            .await
            .unwrap();
        assert!(v == "v1" || v == "v2", "{v}");
    }
    // One refresh load (the stale value's lease went to one caller).
    eventually("the refresh filled", LONG, || {
        run(&mut c, &["GET", "k"]).ok() == Some(redis::Value::BulkString(b"v2".to_vec()))
    })
    .await;
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    near.sync().await.unwrap();
    assert_eq!(read(&near, "k").await, "v2");
    assert_eq!(read(&near, "k").await, "v2");
}

const LONG: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_load_once_and_then_hit() {
    let s = Server::start(&[]);
    let near = near(&s, NearConfig::default());
    let loads = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..20)
        .map(|_| {
            let near = near.clone();
            let loads = loads.clone();
            tokio::spawn(async move {
                near.get_or_load("hot", LEASE, move || async move {
                    loads.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, std::io::Error>("loaded".to_string())
                })
                .await
                .unwrap()
            })
        })
        .collect();
    for r in readers {
        assert_eq!(r.await.unwrap(), "loaded");
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1, "one load per miss");
    // The fill's own invalidation (the readers' peeks tracked the key) may
    // still be on its way: a peek it crosses keeps nothing. After a sync it
    // has been applied, and a peek keeps the value.
    near.sync().await.unwrap();
    assert_eq!(read(&near, "hot").await, "loaded");
    let hits = near.stats().hits;
    assert_eq!(read(&near, "hot").await, "loaded");
    assert_eq!(near.stats().hits, hits + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_and_bytes_are_bounded() {
    let s = Server::start(&[]);
    let mut c = s.conn();
    for i in 0..10 {
        run(&mut c, &["SET", &format!("k{i}"), &"x".repeat(100)]).unwrap();
    }
    let by_count = near(
        &s,
        NearConfig {
            max_entries: 3,
            max_bytes: 1 << 20,
        },
    );
    let by_bytes = near(
        &s,
        NearConfig {
            max_entries: 100,
            max_bytes: 350,
        },
    );
    for i in 0..10 {
        read(&by_count, &format!("k{i}")).await;
        read(&by_bytes, &format!("k{i}")).await;
    }
    assert_eq!(by_count.len().0, 3);
    let (n, bytes) = by_bytes.len();
    assert!(bytes <= 350 && n == 3, "{n} values, {bytes} bytes");
    // The most recent stay.
    let hits = by_count.stats().hits;
    read(&by_count, "k9").await;
    assert_eq!(by_count.stats().hits, hits + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_tracking_connection_or_a_restart_flushes_everything() {
    let mut s = Server::start(&["--appendonly", "yes"]);
    let mut c = s.conn();
    run(&mut c, &["SET", "k", "v"]).unwrap();
    let near = near(&s, NearConfig::default());
    read(&near, "k").await;
    assert_eq!(near.len().0, 1);
    let id = tracking_id(&mut c).expect("a tracking connection");
    int(&mut c, &["CLIENT", "KILL", "ID", &id]);
    eventually("the flush", LONG, || near.is_empty()).await;
    assert!(near.stats().flushes >= 1);
    // A new connection, tracking again.
    read(&near, "k").await;
    read(&near, "k").await;
    assert_eq!(near.len().0, 1);
    let flushes = near.stats().flushes;
    tokio::task::block_in_place(|| s.restart(true));
    eventually("the flush", LONG, || near.is_empty()).await;
    assert!(near.stats().flushes > flushes);
    let mut c = s.conn();
    run(&mut c, &["SET", "k", "after"]).unwrap();
    assert_eq!(read(&near, "k").await, "after");
    near.close();
    assert!(near.is_empty());
}

/// The race checker: writers and near readers on the same keys while the
/// tracking connection is killed and the server restarted. After a write is
/// acknowledged and `sync` returns, a read must not answer an older value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stale_read_after_sync_through_kills_and_restarts() {
    let pairs: u64 = std::env::var("WARDEN_NEAR_RACE_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    const TASKS: u64 = 4;
    let server = Server::start(&["--appendonly", "yes", "--appendfsync", "always"]);
    let url = url(&server);
    let near = near(&server, NearConfig::default());
    let done = Arc::new(AtomicBool::new(false));
    let chaos_events = Arc::new(AtomicU64::new(0));
    let chaos = {
        let done = done.clone();
        let events = chaos_events.clone();
        std::thread::spawn(move || {
            let mut server = server;
            let mut round = 0;
            while !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(300));
                round += 1;
                if round % 3 == 0 {
                    server.restart(true);
                } else if let Some(id) = tracking_id(&mut server.conn()) {
                    let _ = run(&mut server.conn(), &["CLIENT", "KILL", "ID", &id]);
                } else {
                    continue;
                }
                events.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let stale = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..TASKS)
        .map(|t| {
            let near = near.clone();
            let url = url.clone();
            let stale = stale.clone();
            let errors = errors.clone();
            tokio::spawn(async move {
                let client = redis::Client::open(url).unwrap();
                let mut conn = None;
                for i in 0..pairs / TASKS {
                    let key = format!("race:{t}:{}", i % 4);
                    let step = async {
                        if conn.is_none() {
                            conn = Some(client.get_multiplexed_async_connection().await?);
                        }
                        let c = conn.as_mut().unwrap();
                        let n: i64 = redis::cmd("INCR").arg(&key).query_async(c).await?;
                        let truth: i64 = redis::cmd("GET").arg(&key).query_async(c).await?;
                        Ok::<_, redis::RedisError>((n, truth))
                    };
                    let Ok((_, truth)) = step.await else {
                        // The server is restarting: pairs are for when it runs.
                        conn = None;
                        errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    };
                    if near.sync().await.is_err() {
                        errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    for _ in 0..3 {
                        match near
                            .get_or_load(&key, LEASE, || async {
                                Err::<String, _>(std::io::Error::other("missing"))
                            })
                            .await
                        {
                            Ok(v) if v.parse::<i64>().unwrap() < truth => {
                                eprintln!("stale: {key} read {v} after {truth} was acknowledged");
                                stale.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(_) => {}
                            Err(e) => {
                                if errors.fetch_add(1, Ordering::Relaxed) < 5 {
                                    eprintln!("read error: {key}: {e}");
                                }
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    done.store(true, Ordering::SeqCst);
    chaos.join().unwrap();
    let st = near.stats();
    let events = chaos_events.load(Ordering::SeqCst);
    eprintln!(
        "near-cache race (Rust): {pairs} pairs, {} stale, {} errors, {} hits, {} flushes, {events} kills and restarts",
        stale.load(Ordering::SeqCst),
        errors.load(Ordering::SeqCst),
        st.hits,
        st.flushes
    );
    assert_eq!(stale.load(Ordering::SeqCst), 0);
    assert!(st.hits > 0, "the near cache served reads");
    assert!(events > 0, "the chaos ran during the pairs");
    assert!(st.flushes >= 1, "a kill or restart flushed it");
}
