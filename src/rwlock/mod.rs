//! Read-write locks: the pure rules in `state`, the Redis side in `commands`.

pub mod commands;
pub mod state;
