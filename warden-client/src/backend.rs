//! Where commands go: a plain server (`redis::Client`), a plain server
//! whose immediate commands share the application's `ConnectionManager`, or a
//! Redis Cluster (`ClusterClient`).
//!
//! Two kinds of connection:
//!
//! - the **shared** one, for every command that answers at once;
//! - **dedicated** ones ([`Link`]), one per request that may block
//!   server-side. Dropping a link closes its socket at once (redis-rs aborts
//!   a multiplexed connection's driver when its last handle goes), which
//!   takes a cancelled waiter out of the server's queue where `CLIENT
//!   UNBLOCK` cannot, and ends a cache lease whose loader was dropped. A
//!   handle kept past a cancelled request keeps the socket: its late reply
//!   is read and skipped by the driver, so a `PING` answered after it proves
//!   the link clean.
//!
//! No command that may have reached the server is ever sent twice: a broken
//! connection is an error to the caller. Only a pooled link that fails a
//! `PING` before anything else is sent on it is replaced.

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue};

use crate::error::{Error, Result};

/// Far enough to mean "no limit" for redis-rs' own response timeout: the
/// crate bounds every request itself.
const NO_LIMIT: Duration = Duration::from_secs(365 * 24 * 3600);

pub(crate) enum Backend {
    Client {
        client: redis::Client,
        shared: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    },
    Manager {
        manager: ConnectionManager,
        client: redis::Client,
    },
    Cluster {
        client: ClusterClient,
        shared: tokio::sync::Mutex<Option<ClusterConnection>>,
    },
}

impl Backend {
    pub(crate) fn client(client: redis::Client) -> Self {
        Backend::Client {
            client,
            shared: tokio::sync::Mutex::new(None),
        }
    }

    pub(crate) fn manager(manager: ConnectionManager, client: redis::Client) -> Self {
        Backend::Manager { manager, client }
    }

    pub(crate) fn cluster(client: ClusterClient) -> Self {
        Backend::Cluster {
            client,
            shared: tokio::sync::Mutex::new(None),
        }
    }

    /// The plain server's client (`None` for a Cluster client).
    pub(crate) fn plain_client(&self) -> Option<&redis::Client> {
        match self {
            Backend::Client { client, .. } | Backend::Manager { client, .. } => Some(client),
            Backend::Cluster { .. } => None,
        }
    }

    /// The same servers, with no connection open yet.
    pub(crate) fn fresh(&self) -> Self {
        match self {
            Backend::Client { client, .. } => Backend::client(client.clone()),
            Backend::Manager { manager, client } => {
                Backend::manager(manager.clone(), client.clone())
            }
            Backend::Cluster { client, .. } => Backend::cluster(client.clone()),
        }
    }

    /// `cmd` on the shared connection (connecting first if needed). A
    /// connection that breaks is forgotten, so the next command reconnects;
    /// the command itself is not sent again.
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        connect_timeout: Duration,
    ) -> Result<T> {
        match self {
            Backend::Client { client, shared } => {
                let mut conn = {
                    let mut slot = shared.lock().await;
                    match slot.as_ref() {
                        Some(conn) => conn.clone(),
                        None => {
                            let conn = open_plain(client, connect_timeout).await?;
                            *slot = Some(conn.clone());
                            conn
                        }
                    }
                };
                let reply = cmd
                    .query_async::<T>(&mut conn)
                    .await
                    .map_err(Error::from_redis);
                if reply.as_ref().is_err_and(Error::breaks_connection) {
                    *shared.lock().await = None;
                }
                reply
            }
            Backend::Manager { manager, .. } => {
                // The manager reconnects by itself and never re-sends.
                let mut conn = manager.clone();
                cmd.query_async::<T>(&mut conn)
                    .await
                    .map_err(Error::from_redis)
            }
            Backend::Cluster { client, shared } => {
                let mut conn = {
                    let mut slot = shared.lock().await;
                    match slot.as_ref() {
                        Some(conn) => conn.clone(),
                        None => {
                            let conn = tokio::time::timeout(
                                connect_timeout,
                                client.get_async_connection(),
                            )
                            .await
                            .map_err(|_| Error::Timeout)?
                            .map_err(Error::from_redis)?;
                            *slot = Some(conn.clone());
                            conn
                        }
                    }
                };
                cmd.query_async::<T>(&mut conn)
                    .await
                    .map_err(Error::from_redis)
            }
        }
    }

    /// A new dedicated connection.
    pub(crate) async fn open_link(&self, connect_timeout: Duration) -> Result<Link> {
        match self {
            Backend::Client { client, .. } | Backend::Manager { client, .. } => {
                let conn = open_plain(client, connect_timeout).await?;
                // Its id lets a cancelled request's clean-up close it from the
                // shared connection, ahead of what it sends there next. A
                // server that refuses `CLIENT ID` (ACLs) just leaves it unknown.
                let id = tokio::time::timeout(
                    connect_timeout,
                    redis::cmd("CLIENT")
                        .arg("ID")
                        .query_async::<i64>(&mut conn.clone()),
                )
                .await
                .ok()
                .and_then(|id| id.ok());
                Ok(Link::Plain(conn, id))
            }
            Backend::Cluster { client, .. } => {
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(connect_timeout)
                    .set_response_timeout(NO_LIMIT);
                let conn = tokio::time::timeout(
                    connect_timeout,
                    client.get_async_connection_with_config(config),
                )
                .await
                .map_err(|_| Error::Timeout)?
                .map_err(Error::from_redis)?;
                Ok(Link::Cluster(conn))
            }
        }
    }
}

async fn open_plain(
    client: &redis::Client,
    connect_timeout: Duration,
) -> Result<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        .set_response_timeout(None);
    tokio::time::timeout(
        connect_timeout,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    .map_err(|_| Error::Timeout)?
    .map_err(Error::from_redis)
}

/// A dedicated connection: its socket closes when it is dropped. A plain
/// link knows its server-side client id (when the server told it).
pub(crate) enum Link {
    Plain(MultiplexedConnection, Option<i64>),
    Cluster(ClusterConnection),
}

impl Link {
    /// Sends `cmd` and waits for its reply, at most `limit` (None: forever).
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        limit: Option<Duration>,
    ) -> Result<T> {
        let reply = async {
            match self {
                Link::Plain(conn, _) => cmd.query_async::<T>(&mut conn.clone()).await,
                Link::Cluster(conn) => cmd.query_async::<T>(&mut conn.clone()).await,
            }
            .map_err(Error::from_redis)
        };
        match limit {
            Some(limit) => tokio::time::timeout(limit, reply)
                .await
                .map_err(|_| Error::Timeout)?,
            None => reply.await,
        }
    }

    /// The server's id for this connection (`CLIENT ID`), where known: on a
    /// plain server whose shared connection reaches the same server.
    pub(crate) fn client_id(&self) -> Option<i64> {
        match self {
            Link::Plain(_, id) => *id,
            Link::Cluster(_) => None,
        }
    }

    /// Whether the link still answers: checked before a pooled link carries
    /// a command, so that a dead one is replaced before anything was sent.
    pub(crate) async fn alive(&self, limit: Duration) -> bool {
        self.query::<String>(&redis::cmd("PING"), Some(limit))
            .await
            .is_ok()
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
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    pub(crate) fn give(&self, link: Link) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < self.capacity {
            idle.push(link);
        }
    }
}

/// Milliseconds for a command argument (at least `floor`).
pub(crate) fn millis(d: Duration, floor: u64) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(floor)
}
