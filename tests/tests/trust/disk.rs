//! Trust tests: disk.
