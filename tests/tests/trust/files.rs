//! Trust tests: files.
