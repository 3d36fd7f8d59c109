//! Owner ids. Every acquire gets a fresh one, so two acquires never share a
//! hold by accident — not even from one tokio task, where `join!`,
//! `select!` and `buffer_unordered` run many futures at once.

/// A new owner id: a v4 UUID.
pub(crate) fn fresh() -> String {
    uuid::Uuid::new_v4().to_string()
}
