//! Running the real binary as a user would, for the command-line tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_nix-sandbox-mcp");

pub fn cli(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env_remove("RUST_LOG")
        .env("PROJECT_DIR", project_dir());
    c
}

pub fn project_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn out(c: &mut Command) -> Output {
    c.output().expect("binary runs")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn config(dir: &Path, toml: &str) -> PathBuf {
    let p = dir.join("config.toml");
    std::fs::write(&p, toml).unwrap();
    p
}
