//! Trust tests: cache.
