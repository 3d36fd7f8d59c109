//! Owner ids: a v4 UUID per client plus the task (or thread) asking, so that
//! nobody picks one by hand and the same task re-enters its own locks.

pub(crate) fn current(id: &uuid::Uuid) -> String {
    match tokio::task::try_id() {
        Some(task) => format!("{id}:task-{task}"),
        None => format!("{id}:thread-{:?}", std::thread::current().id()),
    }
}
