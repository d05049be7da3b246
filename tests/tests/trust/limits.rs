//! Trust tests: limits.
