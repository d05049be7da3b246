//! The `wasmjobs` binary: parses the command line and hands over to [`wasmjobs::cli`].

use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: wasmjobs::Allocator = wasmjobs::Allocator;

fn main() -> ExitCode {
    wasmjobs::cli::main()
}
