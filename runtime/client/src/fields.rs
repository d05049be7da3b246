//! The small facts every payload shares: job ids, the default queue, the
//! class length bound, and how user input is quoted in errors. A leaf:
//! the job builder, the payload and the ActiveJob reader all use it.

/// Longest job class name accepted, in bytes. Class names key per-class
/// state (metrics, the run summary, log fields); a payload with a longer
/// one is refused when it is parsed, before any of that exists, and goes
/// to the dead set.
pub const MAX_CLASS_LEN: usize = 256;

/// The queue of a job that names none (Sidekiq's), and the queue
/// `wasmjobs run` and `wasmjobs enqueue` use unless told otherwise.
pub const DEFAULT_QUEUE: &str = "default";

/// A fresh job id: 12 random bytes as 24 hex characters, like Sidekiq's.
pub fn new_jid() -> String {
    hex::encode(rand::random::<[u8; 12]>())
}

/// The first 200 characters of `text`, for error messages about user input.
pub fn preview(text: &str) -> String {
    const MAX: usize = 200;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preview_cuts_long_text_on_a_char_boundary() {
        let long = "é".repeat(300);
        let p = preview(&long);
        assert_eq!(p.chars().count(), 201);
        assert_eq!(preview("short"), "short");
    }
}
