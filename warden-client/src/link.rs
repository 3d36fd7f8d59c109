//! Connections whose driver task we own, so that dropping one closes its
//! socket at once — even with a blocked `WAIT` in flight, which redis-rs'
//! own multiplexed connection would otherwise keep open until answered.
//! Closing is what takes a cancelled waiter out of the server's queue and
//! ends a cache lease whose loader was dropped.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{Cmd, FromRedisValue};
use tokio::task::JoinHandle;

use crate::error::{Error, Result};

pub(crate) struct Link {
    conn: MultiplexedConnection,
    driver: JoinHandle<()>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Link {
    pub(crate) async fn open(client: &redis::Client, connect_timeout: Duration) -> Result<Link> {
        let (conn, driver) = tokio::time::timeout(
            connect_timeout,
            client.create_multiplexed_tokio_connection(),
        )
        .await
        .map_err(|_| Error::Timeout)??;
        Ok(Link {
            conn,
            driver: tokio::spawn(driver),
        })
    }

    /// Sends `cmd` and waits for its reply, at most `limit` (None: forever).
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        limit: Option<Duration>,
    ) -> Result<T> {
        let mut conn = self.conn.clone();
        let reply = cmd.query_async::<T>(&mut conn);
        match limit {
            Some(limit) => tokio::time::timeout(limit, reply)
                .await
                .map_err(|_| Error::Timeout)?
                .map_err(Error::from),
            None => reply.await.map_err(Error::from),
        }
    }
}

/// Idle dedicated connections, kept for the next waiting request. A link goes
/// back only after its last reply came in, so a pooled link never has a
/// blocked command on it.
pub(crate) struct Pool {
    idle: Mutex<Vec<Link>>,
    capacity: usize,
}

impl Pool {
    pub(crate) fn new(capacity: usize) -> Self {
        Pool {
            idle: Mutex::new(Vec::new()),
            capacity,
        }
    }

    pub(crate) fn take(&self) -> Option<Link> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(link) = idle.pop() {
            if !link.driver.is_finished() {
                return Some(link);
            }
        }
        None
    }

    pub(crate) fn give(&self, link: Link) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < self.capacity && !link.driver.is_finished() {
            idle.push(link);
        }
    }
}

/// The shared link: one multiplexed connection for every command that
/// answers at once, replaced when it breaks.
pub(crate) struct Shared {
    link: tokio::sync::Mutex<Option<Arc<Link>>>,
}

impl Shared {
    pub(crate) fn new() -> Self {
        Shared {
            link: tokio::sync::Mutex::new(None),
        }
    }

    pub(crate) async fn get(
        &self,
        client: &redis::Client,
        connect_timeout: Duration,
    ) -> Result<Arc<Link>> {
        let mut slot = self.link.lock().await;
        if let Some(link) = slot.as_ref() {
            if !link.driver.is_finished() {
                return Ok(link.clone());
            }
        }
        let link = Arc::new(Link::open(client, connect_timeout).await?);
        *slot = Some(link.clone());
        Ok(link)
    }

    /// Forgets `broken` (if it is still the shared link): the next command reconnects.
    pub(crate) async fn discard(&self, broken: &Arc<Link>) {
        let mut slot = self.link.lock().await;
        if slot.as_ref().is_some_and(|l| Arc::ptr_eq(l, broken)) {
            *slot = None;
        }
    }
}

/// Milliseconds for a command argument (at least `floor`).
pub(crate) fn millis(d: Duration, floor: u64) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(floor)
}
