//! Trust tests: logs.
