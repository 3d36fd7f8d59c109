//! A raw RESP2 connection: every reply is seen, none is merged or dropped
//! (tests that count replies pipeline behind blocked requests).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Int(i64),
    Nil,
    Bulk(Vec<u8>),
    Status(String),
    Error(String),
    Array(Vec<Reply>),
}

impl Reply {
    pub fn int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            _ => None,
        }
    }

    pub fn text(&self) -> Option<String> {
        match self {
            Reply::Bulk(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Reply::Status(s) => Some(s.clone()),
            Reply::Int(n) => Some(n.to_string()),
            _ => None,
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }
}

pub type Cmd = Vec<Vec<u8>>;

pub fn cmd(words: &[&str]) -> Cmd {
    words.iter().map(|w| w.as_bytes().to_vec()).collect()
}

/// Longer than any `WAIT` or pause of a case: a reply that takes this long is missing.
pub const READ_LIMIT: Duration = Duration::from_secs(15);

/// One socket: replies are read through the buffer, requests written to the
/// same stream (a test may hold thousands of these).
pub struct Wire {
    reader: BufReader<UnixStream>,
}

impl Wire {
    pub fn open(socket: &Path) -> Result<Self, String> {
        let s = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
        s.set_read_timeout(Some(READ_LIMIT)).unwrap();
        Ok(Self {
            reader: BufReader::new(s),
        })
    }

    pub fn send(&mut self, cmds: &[Cmd]) -> Result<(), String> {
        let mut buf = Vec::new();
        for c in cmds {
            buf.extend_from_slice(format!("*{}\r\n", c.len()).as_bytes());
            for arg in c {
                buf.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
                buf.extend_from_slice(arg);
                buf.extend_from_slice(b"\r\n");
            }
        }
        self.reader
            .get_ref()
            .write_all(&buf)
            .map_err(|e| format!("send: {e}"))
    }

    pub fn read_raw(&mut self) -> io::Result<Reply> {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line)?;
        if line.is_empty() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let body = String::from_utf8_lossy(&line[1..])
            .trim_end_matches("\r\n")
            .to_string();
        let len = || {
            body.parse::<i64>()
                .map_err(|_| io::Error::other("bad length"))
        };
        Ok(match line[0] {
            b'+' => Reply::Status(body),
            b'-' => Reply::Error(body),
            b':' => Reply::Int(len()?),
            b'$' if len()? < 0 => Reply::Nil,
            b'$' => {
                let mut data = vec![0; len()? as usize + 2];
                self.reader.read_exact(&mut data)?;
                data.truncate(data.len() - 2);
                Reply::Bulk(data)
            }
            b'*' | b'>' if len()? < 0 => Reply::Nil,
            // RESP3: null; a push (an invalidation) reads as an array, a map as
            // the flat array of its keys and values.
            b'_' => Reply::Nil,
            b'*' | b'>' | b'%' => {
                let n = len()? * if line[0] == b'%' { 2 } else { 1 };
                let mut items = Vec::new();
                for _ in 0..n {
                    items.push(self.read_raw()?);
                }
                Reply::Array(items)
            }
            other => return Err(io::Error::other(format!("bad reply type {other}"))),
        })
    }

    /// Whether a reply has arrived (without waiting).
    pub fn has_data(&mut self) -> Result<bool, String> {
        if !self.reader.buffer().is_empty() {
            return Ok(true);
        }
        self.reader.get_ref().set_nonblocking(true).unwrap();
        let got = match self.reader.fill_buf() {
            Ok(buf) => Ok(!buf.is_empty()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e.to_string()),
        };
        self.reader.get_ref().set_nonblocking(false).unwrap();
        got
    }

    /// The next reply; a missing one (timeout) or a closed connection is an error.
    pub fn read(&mut self) -> Result<Reply, String> {
        self.read_raw().map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => "connection closed".to_string(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                format!("no reply within {READ_LIMIT:?}")
            }
            _ => e.to_string(),
        })
    }

    /// The next reply, or `None` when the connection was closed.
    pub fn read_or_closed(&mut self) -> Result<Option<Reply>, String> {
        match self.read_raw() {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(None),
            Err(e) => Err(format!("reading: {e}")),
        }
    }

    pub fn call(&mut self, words: &[&str]) -> Result<Reply, String> {
        self.send(&[cmd(words)])?;
        self.read()
    }

    /// A command that must succeed (not an error reply).
    pub fn ok(&mut self, words: &[&str]) -> Result<Reply, String> {
        match self.call(words)? {
            Reply::Error(e) => Err(format!("{words:?}: {e}")),
            r => Ok(r),
        }
    }

    pub fn int(&mut self, words: &[&str]) -> Result<i64, String> {
        let r = self.call(words)?;
        r.int()
            .ok_or_else(|| format!("{words:?}: expected an integer, got {r:?}"))
    }
}
