//! Rate limiters: GCRA in exact integer arithmetic. The pure rules in
//! `state`, the Redis side in `commands`, the type's callbacks in `datatype`.

pub mod commands;
pub mod datatype;
pub mod state;
