//! Trust tests: http.
