//! The `wasmjobs` binary: parses the command line and hands over to [`wasmjobs::cli`].

use std::process::ExitCode;

fn main() -> ExitCode {
    wasmjobs::cli::main()
}
