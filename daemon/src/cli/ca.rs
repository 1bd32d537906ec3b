//! `ca show` and `ca rotate`: the proxy's certificate authority.

use std::path::Path;

use super::*;
use crate::network::Authority;

pub(super) fn ca(config: Option<&Path>, command: CaCommand) -> ExitCode {
    let config = match crate::config::load(config) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let hosts = app::interception_hosts(&config);
    let dir = Authority::default_dir();
    let authority = match command {
        CaCommand::Show => match Authority::existing(&dir) {
            Ok(Some(a)) => a,
            Ok(None) => {
                println!(
                    "no certificate authority in {} yet: a server makes one at start when the configuration has credentials or request rules",
                    dir.display()
                );
                return ExitCode::SUCCESS;
            }
            Err(e) => return fail(e),
        },
        CaCommand::Rotate => match Authority::create(&dir, &hosts) {
            Ok(a) => {
                eprintln!(
                    "nix-sandbox-mcp: made a new certificate authority; running servers use it from their next start"
                );
                a
            }
            Err(e) => return fail(e),
        },
    };
    let covered = authority.hosts();
    let missing: Vec<&String> = hosts.iter().filter(|h| !covered.contains(h)).collect();
    println!("directory:   {}", dir.display());
    println!("certificate: {}", authority.certificate().display());
    println!("name:        {}", authority.common_name());
    println!("expires:     {}", authority.expires());
    println!(
        "vouches for: {}",
        if covered.is_empty() {
            "nothing".to_string()
        } else {
            covered.join(", ")
        }
    );
    if !missing.is_empty() {
        let missing: Vec<&str> = missing.iter().map(|h| h.as_str()).collect();
        println!(
            "not yet for: {} (the configuration names them; the next start makes a new authority)",
            missing.join(", ")
        );
    }
    ExitCode::SUCCESS
}
