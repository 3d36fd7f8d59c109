//! A near cache: values kept in this process, dropped when the server says
//! their key changed (`CLIENT TRACKING` on `CACHE.PEEK`), docs/cache.md
//! "Near cache".
//!
//! Invariants, each kept where it is written:
//!
//! - a value is kept only if it came from a `CACHE.PEEK` on the tracking
//!   connection of the current epoch, fresh (not stale, not expired), and no
//!   invalidation of its key nor any flush happened between the moment the
//!   request was sent and the moment its reply is kept (the generation);
//! - invalidations are applied by the connection's reader as they arrive, in
//!   the order the server sent them, before any later reply on it is handed
//!   to its caller (redis-rs calls the push sender in stream order);
//! - when the tracking connection ends (any error, a disconnection, a
//!   server restart or failover), everything kept goes and the epoch moves
//!   on: no value read through a dead connection is served again.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lru::LruCache;
use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, FromRedisValue, ProtocolVersion, PushInfo, PushKind, ToRedisArgs, Value,
};

use crate::cache::Cache;
use crate::error::{Error, LoaderError, Result};

/// How many values and bytes of values a [`NearCache`] keeps at most.
#[derive(Clone, Copy, Debug)]
pub struct NearConfig {
    /// At most this many values (default 10,000).
    pub max_entries: usize,
    /// At most this many bytes of values, keys included (default 64 MiB).
    pub max_bytes: usize,
}

impl Default for NearConfig {
    fn default() -> Self {
        NearConfig {
            max_entries: 10_000,
            max_bytes: 64 << 20,
        }
    }
}

/// What a near cache did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NearStats {
    /// Reads answered from this process, with no round trip.
    pub hits: u64,
    /// Reads that went to the server.
    pub misses: u64,
    /// Keys dropped because the server said they changed.
    pub invalidations: u64,
    /// Times everything was dropped (a flush, a lost connection).
    pub flushes: u64,
}

struct Entry {
    value: Vec<u8>,
    /// Unix ms; `None`: no expiry.
    expires_at: Option<i64>,
}

/// A read in flight for a key: its generation moves on when the key is
/// invalidated.
struct Pending {
    readers: u32,
    generation: u64,
}

struct State {
    entries: LruCache<String, Entry>,
    bytes: usize,
    pending: HashMap<String, Pending>,
    /// Moves on with every flush: a read sent in an older epoch keeps
    /// nothing.
    epoch: u64,
    /// The tracking connection, once it answered `CLIENT TRACKING on`.
    conn: Option<MultiplexedConnection>,
    /// Which connection is current: pushes of an older one are ignored.
    conn_id: u64,
    /// After a failed attempt to open one (the server down, `CLIENT
    /// TRACKING` refused or renamed), no new attempt before this: reads go to
    /// the server meanwhile, without a connection storm.
    retry_at: Option<std::time::Instant>,
}

struct Shared {
    config: NearConfig,
    state: Mutex<State>,
    hits: AtomicU64,
    misses: AtomicU64,
    invalidations: AtomicU64,
    flushes: AtomicU64,
    /// One connection attempt at a time.
    connecting: tokio::sync::Mutex<()>,
}

/// A [`Cache`] with a near cache in front: hits are answered from this
/// process with no round trip; misses, stale values and everything while
/// the tracking connection is down go through [`Cache::get_or_load`]. Made
/// by [`Cache::near`]. Clones share one near cache and one tracking
/// connection. A plain server only (not a Cluster client).
#[derive(Clone)]
pub struct NearCache {
    cache: Cache,
    client: redis::Client,
    shared: Arc<Shared>,
}

/// How long after a failed attempt to open the tracking connection the next
/// one may start.
const RETRY_AFTER: Duration = Duration::from_secs(1);

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl State {
    fn remove(&mut self, key: &str) -> bool {
        match self.entries.pop(key) {
            Some(e) => {
                self.bytes -= key.len() + e.value.len();
                true
            }
            None => false,
        }
    }

    /// An invalidation of `key`: its value goes and reads in flight for it
    /// keep nothing.
    fn invalidate(&mut self, key: &str) -> bool {
        if let Some(p) = self.pending.get_mut(key) {
            p.generation += 1;
        }
        self.remove(key)
    }

    /// Everything kept goes; reads in flight keep nothing (the epoch moved
    /// on). The connection stays (a `FLUSHALL`).
    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
        self.epoch += 1;
    }

    /// The connection is given up: everything goes with it.
    fn flush(&mut self) {
        self.clear();
        self.conn = None;
        self.conn_id += 1;
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding it cannot leave a value half kept: every
        // change is one call on the map. Go on with what is there.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn flush(&self) {
        self.lock().flush();
        self.flushes.fetch_add(1, Ordering::Relaxed);
    }

    /// Called by the tracking connection's reader, in stream order.
    fn on_push(&self, conn_id: u64, info: PushInfo) {
        let mut state = self.lock();
        if state.conn_id != conn_id {
            return; // a connection already given up
        }
        match info.kind {
            PushKind::Invalidate => {
                // [keys] or [nil]: nil is a flush (FLUSHALL, FLUSHDB).
                match info.data.into_iter().next() {
                    Some(Value::Array(keys)) => {
                        for key in keys {
                            let Ok(key) = String::from_redis_value(key) else {
                                continue;
                            };
                            if state.invalidate(&key) {
                                self.invalidations.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    _ => {
                        // FLUSHALL, FLUSHDB: the connection stays.
                        state.clear();
                        drop(state);
                        self.flushes.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            PushKind::Disconnection => {
                state.flush();
                drop(state);
                self.flushes.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

impl Cache {
    /// This cache with a near cache in front of it ([`NearCache`]). The
    /// tracking connection opens on the first read. Errors with
    /// [`Error::Client`] on a Cluster client.
    pub fn near(&self, config: NearConfig) -> Result<NearCache> {
        let Some(client) = self.warden().plain_client() else {
            return Err(Error::Client(
                "a near cache needs a plain server, not a Cluster client".into(),
            ));
        };
        let info = client.get_connection_info().clone();
        let redis = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let client =
            redis::Client::open(info.set_redis_settings(redis)).map_err(Error::from_redis)?;
        let cap = NonZeroUsize::new(config.max_entries.max(1)).expect("at least 1");
        Ok(NearCache {
            cache: self.clone(),
            client,
            shared: Arc::new(Shared {
                config,
                state: Mutex::new(State {
                    entries: LruCache::new(cap),
                    bytes: 0,
                    pending: HashMap::new(),
                    epoch: 0,
                    conn: None,
                    conn_id: 0,
                    retry_at: None,
                }),
                hits: AtomicU64::new(0),
                misses: AtomicU64::new(0),
                invalidations: AtomicU64::new(0),
                flushes: AtomicU64::new(0),
                connecting: tokio::sync::Mutex::new(()),
            }),
        })
    }
}

impl NearCache {
    /// The value of `key`: from this process when it holds a fresh copy, else
    /// as [`Cache::get_or_load`] answers it (one load per miss across every
    /// caller). A value due for the cache's refresh-ahead is not served from
    /// here, so its refresh still happens on the server.
    pub async fn get_or_load<V, F, Fut, E>(
        &self,
        key: &str,
        lease: Duration,
        loader: F,
    ) -> Result<V>
    where
        V: FromRedisValue + ToRedisArgs + Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = std::result::Result<V, E>> + Send + 'static,
        E: Into<LoaderError>,
    {
        if let Some(bytes) = self.hit(key) {
            if let Ok(v) = V::from_redis_value(Value::BulkString(bytes)) {
                self.shared.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(v);
            }
        }
        self.shared.misses.fetch_add(1, Ordering::Relaxed);
        if let Some(bytes) = self.peek(key).await {
            if let Ok(v) = V::from_redis_value(Value::BulkString(bytes)) {
                return Ok(v);
            }
        }
        self.cache.get_or_load(key, lease, loader).await
    }

    /// A fresh copy of `key` held here.
    fn hit(&self, key: &str) -> Option<Vec<u8>> {
        let now = unix_ms();
        let margin = self
            .cache
            .refresh_before()
            .map_or(0, |d| d.as_millis() as i64);
        let mut state = self.shared.lock();
        // One lookup: a fresh value is copied out, an expired one dropped.
        let fresh = match state.entries.get(key) {
            None => return None,
            Some(e) if e.expires_at.is_some_and(|at| at - margin <= now) => None,
            Some(e) => Some(e.value.clone()),
        };
        if fresh.is_none() {
            state.remove(key);
        }
        fresh
    }

    /// `CACHE.PEEK key` on the tracking connection; the value when it is
    /// fresh (kept here too, if nothing invalidated it meanwhile).
    async fn peek(&self, key: &str) -> Option<Vec<u8>> {
        let (mut conn, epoch, conn_id) = self.connection().await?;
        let generation = {
            let mut state = self.shared.lock();
            if state.epoch != epoch {
                return None;
            }
            let p = state.pending.entry(key.to_string()).or_insert(Pending {
                readers: 0,
                generation: 0,
            });
            p.readers += 1;
            p.generation
        };
        let reply = tokio::time::timeout(
            self.cache.warden().config().command_timeout,
            redis::cmd("CACHE.PEEK")
                .arg(key)
                .query_async::<Value>(&mut conn),
        )
        .await;
        let mut state = self.shared.lock();
        let moved = {
            let p = state.pending.get_mut(key).expect("counted above");
            p.readers -= 1;
            let moved = p.generation != generation;
            if p.readers == 0 {
                state.pending.remove(key);
            }
            moved
        };
        let reply = match reply {
            Ok(Ok(v)) => v,
            Ok(Err(e))
                if !e.is_unrecoverable_error()
                    && !e.is_io_error()
                    && !e.is_connection_dropped() =>
            {
                return None; // WRONGTYPE and the like: the server path says it
            }
            _ => {
                // A broken or silent connection: nothing read through it
                // can be trusted any more.
                if state.conn_id == conn_id {
                    state.flush();
                    drop(state);
                    self.shared.flushes.fetch_add(1, Ordering::Relaxed);
                }
                return None;
            }
        };
        let Value::Array(items) = reply else {
            return None; // nil: a miss, the server path loads it
        };
        let mut items = items.into_iter();
        let (Some(Value::BulkString(value)), Some(Value::Int(at)), Some(Value::Int(stale))) =
            (items.next(), items.next(), items.next())
        else {
            return None;
        };
        let expires_at = (at >= 0).then_some(at);
        let margin = self
            .cache
            .refresh_before()
            .map_or(0, |d| d.as_millis() as i64);
        if stale != 0 || expires_at.is_some_and(|at| at - margin <= unix_ms()) {
            return None; // stale or due: the server path serves and refreshes it
        }
        let size = key.len() + value.len();
        if !moved && state.epoch == epoch && size <= self.shared.config.max_bytes {
            state.remove(key);
            state.bytes += size;
            if let Some((k, e)) = state.entries.push(
                key.to_string(),
                Entry {
                    value: value.clone(),
                    expires_at,
                },
            ) {
                if k != key {
                    state.bytes -= k.len() + e.value.len();
                }
            }
            while state.bytes > self.shared.config.max_bytes {
                match state.entries.pop_lru() {
                    Some((k, e)) => state.bytes -= k.len() + e.value.len(),
                    None => break,
                }
            }
        }
        Some(value)
    }

    /// The tracking connection of the current epoch, opened (and `CLIENT
    /// TRACKING on`) if there is none; `None` when the server cannot be
    /// reached now (the read goes to the server path).
    async fn connection(&self) -> Option<(MultiplexedConnection, u64, u64)> {
        {
            let state = self.shared.lock();
            if let Some(conn) = &state.conn {
                return Some((conn.clone(), state.epoch, state.conn_id));
            }
        }
        let _one = self.shared.connecting.lock().await;
        let conn_id = {
            let state = self.shared.lock();
            if let Some(conn) = &state.conn {
                return Some((conn.clone(), state.epoch, state.conn_id));
            }
            if state
                .retry_at
                .is_some_and(|at| std::time::Instant::now() < at)
            {
                return None;
            }
            state.conn_id
        };
        let opened = self.open(conn_id).await;
        let mut state = self.shared.lock();
        let Some(conn) = opened else {
            state.retry_at = Some(std::time::Instant::now() + RETRY_AFTER);
            return None;
        };
        if state.conn_id != conn_id {
            return None; // given up while it was opening
        }
        // Whatever was kept before this connection tracked it goes.
        state.clear();
        state.retry_at = None;
        state.conn = Some(conn.clone());
        Some((conn, state.epoch, conn_id))
    }

    /// A new tracking connection: RESP3, its pushes applied as they come.
    async fn open(&self, conn_id: u64) -> Option<MultiplexedConnection> {
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.cache.warden().config().connect_timeout))
            .set_response_timeout(None)
            .set_push_sender(move |info: PushInfo| {
                if let Some(shared) = weak.upgrade() {
                    shared.on_push(conn_id, info);
                }
                Ok::<(), std::convert::Infallible>(())
            });
        let limit = self.cache.warden().config().connect_timeout;
        let mut conn = tokio::time::timeout(
            limit,
            self.client
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await
        .ok()?
        .ok()?;
        let tracking = tokio::time::timeout(
            limit,
            redis::cmd("CLIENT")
                .arg("TRACKING")
                .arg("on")
                .query_async::<()>(&mut conn),
        )
        .await;
        matches!(tracking, Ok(Ok(()))).then_some(conn)
    }

    /// One round trip on the tracking connection: when it returns, every
    /// invalidation the server sent before it has been applied. After a
    /// write is acknowledged, a read after `sync` never returns the older
    /// value. Without a connection there is nothing kept to sync.
    pub async fn sync(&self) -> Result<()> {
        let Some((mut conn, _, conn_id)) = self.connection().await else {
            return Ok(());
        };
        let reply = tokio::time::timeout(
            self.cache.warden().config().command_timeout,
            redis::cmd("PING").query_async::<Value>(&mut conn),
        )
        .await;
        if !matches!(reply, Ok(Ok(_))) {
            let mut state = self.shared.lock();
            if state.conn_id == conn_id {
                state.flush();
                drop(state);
                self.shared.flushes.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// `CACHE.INVALIDATE key [STALE ms]` on the server, and the key dropped
    /// here at once (this process reads its own write). `true`: a value was
    /// deleted (or marked stale).
    pub async fn invalidate(&self, key: &str, stale: Option<Duration>) -> Result<bool> {
        self.shared.lock().invalidate(key);
        let mut cmd = redis::cmd("CACHE.INVALIDATE");
        cmd.arg(key);
        if let Some(ms) = stale {
            cmd.arg("STALE").arg(crate::backend::millis(ms, 1));
        }
        let n: i64 = self.cache.warden().query(&cmd).await?;
        Ok(n == 1)
    }

    /// Drops everything kept here (the server is not asked).
    pub fn clear(&self) {
        self.shared.flush();
    }

    /// What this near cache did so far.
    pub fn stats(&self) -> NearStats {
        NearStats {
            hits: self.shared.hits.load(Ordering::Relaxed),
            misses: self.shared.misses.load(Ordering::Relaxed),
            invalidations: self.shared.invalidations.load(Ordering::Relaxed),
            flushes: self.shared.flushes.load(Ordering::Relaxed),
        }
    }

    /// Values kept now, and their bytes (keys included).
    pub fn len(&self) -> (usize, usize) {
        let state = self.shared.lock();
        (state.entries.len(), state.bytes)
    }

    /// Whether nothing is kept now.
    pub fn is_empty(&self) -> bool {
        self.len().0 == 0
    }

    /// Closes the tracking connection and drops everything kept (the next
    /// read opens a new one).
    pub fn close(&self) {
        self.shared.flush();
    }
}
