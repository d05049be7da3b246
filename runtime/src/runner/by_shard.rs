//! One value per Redis shard, found by a job's shard ([`Fetched::shard`]).
//! With one Redis there is one value, shard 0's.
//!
//! [`Fetched::shard`]: super::fetched::Fetched::shard

/// A value per shard, by index; never empty.
#[derive(Debug, Clone)]
pub(crate) struct ByShard<T>(Vec<T>);

impl<T> ByShard<T> {
    /// `first` (the default shard's) and then each other shard's, in
    /// the shard map's order.
    pub(crate) fn new(first: T, others: impl IntoIterator<Item = T>) -> Self {
        let mut values = vec![first];
        values.extend(others);
        Self(values)
    }

    /// The value of `shard`; the default shard's for an index out of range
    /// (a job is only ever tagged with a shard the runner opened).
    pub(crate) fn get(&self, shard: u16) -> &T {
        self.0.get(usize::from(shard)).unwrap_or(&self.0[0])
    }

    /// Every shard's, in order.
    pub(crate) fn all(&self) -> &[T] {
        &self.0
    }
}
