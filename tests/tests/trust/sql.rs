//! Trust tests: sql.
