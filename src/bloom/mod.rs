//! Bloom filters: bits and hashing (`filter`), scaling (`chain`), the byte
//! format of `SCANDUMP`/RDB (`codec`), and the Redis side (`commands`).

pub mod chain;
pub mod codec;
pub mod commands;
pub mod filter;
