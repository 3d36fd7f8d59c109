//! What can go wrong, as one enum.

use std::fmt;

/// The boxed error a cache loader may return.
pub type LoaderError = Box<dyn std::error::Error + Send + Sync>;

/// Errors from warden-client. A busy lock is not an error: `acquire` answers
/// `Ok(None)`.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The server or the connection failed (`READONLY` from a replica,
    /// `WRONGTYPE`, a refused upgrade, a dropped connection, ...).
    Redis(redis::RedisError),
    /// No answer within the client-side time limit.
    Timeout,
    /// `CACHE.GET … WAIT` ended without a value or a lease.
    WaitTimedOut,
    /// The cache loader failed; its lease was abandoned (handed on).
    Loader(LoaderError),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Redis(e) => write!(f, "redis: {e}"),
            Error::Timeout => f.write_str("no answer from the server in time"),
            Error::WaitTimedOut => f.write_str("waited for a cache fill in vain"),
            Error::Loader(e) => write!(f, "cache loader failed: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            Error::Loader(e) => Some(e.as_ref()),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(e)
    }
}

impl Error {
    /// Whether the connection this came from is unusable and must be replaced.
    pub(crate) fn breaks_connection(&self) -> bool {
        match self {
            Error::Redis(e) => {
                e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error()
            }
            _ => false,
        }
    }
}
