//! Trust tests: poison.
