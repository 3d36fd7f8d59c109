//! Semaphores: the pure rules in `state`, the Redis side in `commands`, the
//! type's callbacks in `datatype`.

pub mod commands;
pub mod datatype;
pub mod state;
