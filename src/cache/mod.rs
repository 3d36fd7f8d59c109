//! Cache leases: one load per miss, waiters answered with the value, stale
//! fills refused. The rules (`state`) and the Redis side (`commands`).

pub mod commands;
pub mod filter;
pub mod state;
pub mod table;
pub mod unseen;
