//! What can go wrong, as one enum.

use std::fmt;

/// The boxed error a cache loader may return.
pub type LoaderError = Box<dyn std::error::Error + Send + Sync>;

/// Errors from warden-client. A busy lock is not an error: `acquire` answers
/// `Ok(None)`.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The server answered with an error reply: `READONLY` from a replica,
    /// `WRONGTYPE`, a refused upgrade, ...
    Server {
        /// The error code, the reply's first word (`ERR`, `WRONGTYPE`, ...).
        code: String,
        /// The rest of the reply.
        message: String,
    },
    /// The connection could not be opened, or broke. A command that was
    /// already sent may or may not have run on the server; it is never sent
    /// again, except a release of a hold whose owner was made for it (and
    /// never named by another acquire), which is sent again in the
    /// background until answered (a second release ends that hold or finds
    /// nothing). (A lock granted on a broken connection ends with
    /// its lease; a waiter on it leaves the server's queue.)
    Connection(Box<dyn std::error::Error + Send + Sync>),
    /// A bad URL or client setting, or a reply of an unexpected shape.
    Client(Box<dyn std::error::Error + Send + Sync>),
    /// No answer within the client-side time limit. The request may still
    /// run on the server; its connection is closed.
    Timeout,
    /// `CACHE.GET … WAIT` ended without a value or a lease.
    WaitTimedOut,
    /// The cache loader failed; its lease was abandoned (handed on).
    Loader(LoaderError),
    /// A semaphore acquire stated another limit than the semaphore's
    /// (`ERR semaphore limit is 10, not 20`): nothing was acquired.
    /// [`Semaphore::set_limit`](crate::Semaphore::set_limit) changes it.
    LimitMismatch {
        /// The semaphore's limit on the server.
        limit: u32,
        /// The limit the acquire stated.
        requested: u32,
    },
}

/// Whether an error reply's text is the server refusing one of warden's
/// commands as unknown (`unknown command 'LOCK.ACQUIRE', with args ...`).
fn names_warden_command(message: &str) -> bool {
    message
        .strip_prefix("unknown command '")
        .map(str::to_ascii_uppercase)
        .is_some_and(|name| {
            ["LOCK.", "RWLOCK.", "SEM.", "RATE.", "CACHE.", "BF."]
                .iter()
                .any(|prefix| name.starts_with(prefix))
        })
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Server { code, message } => write!(f, "{code} {message}"),
            Error::Connection(e) => write!(f, "connection failed: {e}"),
            Error::Client(e) => write!(f, "client error: {e}"),
            Error::Timeout => f.write_str("no answer from the server in time"),
            Error::WaitTimedOut => f.write_str("waited for a cache fill in vain"),
            Error::Loader(e) => write!(f, "cache loader failed: {e}"),
            Error::LimitMismatch { limit, requested } => {
                write!(f, "ERR semaphore limit is {limit}, not {requested}")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Connection(e) | Error::Client(e) | Error::Loader(e) => Some(e.as_ref()),
            _ => None,
        }
    }
}

impl Error {
    /// Sorts a redis-rs error into this enum (redis-rs types stay out of the API).
    pub(crate) fn from_redis(e: redis::RedisError) -> Self {
        if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_unrecoverable_error()
        {
            return Error::Connection(Box::new(e));
        }
        if e.is_timeout() {
            return Error::Timeout;
        }
        match (e.code(), e.kind()) {
            (Some(code), redis::ErrorKind::Server(_) | redis::ErrorKind::Extension) => {
                let mut message = e.detail().unwrap_or_default().to_string();
                if code == "ERR" && names_warden_command(&message) {
                    // A server without the module: say what to check, as the
                    // Python and Node clients do.
                    message.push_str(" (is the warden module loaded? MODULE LIST shows it)");
                }
                Error::Server {
                    code: code.to_string(),
                    message,
                }
            }
            _ => Error::Client(Box::new(e)),
        }
    }

    /// [`Error::LimitMismatch`] for the server's refusal of another limit;
    /// any other error unchanged.
    pub(crate) fn limit_mismatch(self) -> Self {
        let Error::Server { code, message } = &self else {
            return self;
        };
        let parsed = message
            .strip_prefix("semaphore limit is ")
            .and_then(|rest| rest.split_once(", not "))
            .and_then(|(limit, requested)| Some((limit.parse().ok()?, requested.parse().ok()?)));
        match parsed {
            Some((limit, requested)) if code == "ERR" => Error::LimitMismatch { limit, requested },
            _ => self,
        }
    }

    /// Whether the connection this came from is unusable and must be replaced.
    pub(crate) fn breaks_connection(&self) -> bool {
        matches!(self, Error::Connection(_))
    }
}

#[cfg(test)]
mod tests {
    use super::names_warden_command;

    #[test]
    fn unknown_warden_commands_are_told_apart() {
        for (message, warden) in [
            (
                "unknown command 'LOCK.ACQUIRE', with args beginning with: 'k' ",
                true,
            ),
            (
                "unknown command 'rwlock.read', with args beginning with: ",
                true,
            ),
            (
                "unknown command 'SEM.ACQUIRE', with args beginning with: ",
                true,
            ),
            (
                "unknown command 'CACHE.GET', with args beginning with: ",
                true,
            ),
            (
                "unknown command 'GETX', with args beginning with: 'LOCK.' ",
                false,
            ),
            ("unknown subcommand 'LOCK.X'. Try CLIENT HELP.", false),
            ("lock is held", false),
        ] {
            assert_eq!(names_warden_command(message), warden, "{message}");
        }
    }
}
