//! Every error text warden sends, in one place. Each starts with an error code.

pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
pub const INTERNAL: &str = "ERR internal error";
pub const SYNTAX: &str = "ERR syntax error";
pub const INVALID_TTL: &str = "ERR invalid ttl";
pub const INVALID_TIMEOUT: &str = "ERR invalid timeout";
pub const INVALID_OWNER: &str = "ERR invalid owner";
pub const HOLDS_OVERFLOW: &str = "ERR hold count overflow";
pub const INVALID_EFFECT: &str = "ERR invalid replicated effect";

/// `ERR unknown argument '<arg>'`, with the argument made safe for an error line.
pub fn unknown_argument(arg: &[u8]) -> String {
    format!("ERR unknown argument '{}'", printable(arg))
}

/// At most 64 printable ASCII characters of `bytes`, so an error line stays one line.
pub fn printable(bytes: &[u8]) -> String {
    let mut out: String = bytes
        .iter()
        .take(64)
        .map(|&b| {
            if (0x20..0x7f).contains(&b) {
                b as char
            } else {
                '?'
            }
        })
        .collect();
    if bytes.len() > 64 {
        out.push_str("...");
    }
    out
}
