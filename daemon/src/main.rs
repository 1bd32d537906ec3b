//! The `nix-sandbox-mcp` binary: parses the command line and hands over to
//! the library's front ends.

fn main() -> std::process::ExitCode {
    nix_sandbox_mcp::cli::main()
}
