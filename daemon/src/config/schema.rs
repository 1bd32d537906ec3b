//! The configuration's JSON schema, generated from the types that read the
//! file: the one definition of its tables, keys and value rules, with the
//! preset names and the variables the jail reserves. The Nix side
//! (nix/lib/schema.nix) checks configurations against the committed copy,
//! nix/lib/config-schema.json, which a test keeps equal to this; editors can
//! use it to check config.toml as it is written (`nix-sandbox-mcp schema`).

use schemars::generate::SchemaSettings;
use serde_json::{Value, json};

use super::{
    ENV_NAME_PATTERN, ENV_NAME_RULE, PRESET_ALIASES, PRESET_NAMES, RESERVED_VARS, RawConfig,
};

/// The schema, as JSON (draft 2020-12, every subschema inlined).
pub fn json_schema() -> Value {
    let generator = SchemaSettings::draft2020_12()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    let mut schema = generator.into_root_schema_for::<RawConfig>().to_value();
    schema["title"] = json!("nix-sandbox-mcp configuration");
    schema["x-nix-sandbox-mcp"] = json!({
        "presetAliases": PRESET_ALIASES.iter().map(|(a, p)| (a.to_string(), json!(p))).collect::<serde_json::Map<_, _>>(),
        "presets": PRESET_NAMES,
        "reservedVariables": RESERVED_VARS,
        "environmentName": {"pattern": ENV_NAME_PATTERN, "expected": ENV_NAME_RULE},
        "commandName": {
            "pattern": super::commands::NAME_PATTERN,
            "expected": super::commands::NAME_RULE,
        },
    });
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed copy the Nix side reads. `NSM_UPDATE_SCHEMA=1 cargo
    /// test` rewrites it after a change to the configuration's types.
    #[test]
    fn the_committed_schema_is_the_generated_one() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../nix/lib/config-schema.json");
        let generated = serde_json::to_string_pretty(&json_schema()).unwrap() + "\n";
        if std::env::var_os("NSM_UPDATE_SCHEMA").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "{} is out of date: run `NSM_UPDATE_SCHEMA=1 cargo test` and commit it",
            path.display()
        );
    }

    #[test]
    fn the_schema_knows_every_table_and_rule() {
        let s = json_schema();
        let props = &s["properties"];
        for table in ["server", "defaults", "project", "environments"] {
            assert!(props.get(table).is_some(), "{table}");
        }
        assert_eq!(s["additionalProperties"], false);
        let timeout = &props["defaults"]["properties"]["timeout_ms"];
        assert!(timeout.to_string().contains("86400000"), "{timeout}");
        assert!(s.to_string().contains("\"LOGNAME\""));
    }
}
