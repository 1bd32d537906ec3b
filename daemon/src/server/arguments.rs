//! A tool call's arguments, read with typed accessors whose errors say how
//! to call the tool.

use rmcp::model::JsonObject;
use serde_json::Value;

use super::result::{ErrorCode, ToolError};

/// A tool's arguments, with typed accessors whose errors say how to call it.
pub(super) struct Arguments<'a> {
    map: &'a JsonObject,
    shape: &'static str,
}

impl<'a> Arguments<'a> {
    pub(super) fn new(
        args: Option<&'a JsonObject>,
        tool: &str,
        known: &[&str],
        shape: &'static str,
    ) -> Result<Arguments<'a>, ToolError> {
        static EMPTY: std::sync::LazyLock<JsonObject> = std::sync::LazyLock::new(JsonObject::new);
        let map = args.unwrap_or(&EMPTY);
        let me = Arguments { map, shape };
        if let Some(k) = map.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(me.invalid(&format!(
                "unknown argument `{k}`; {tool} takes {}",
                known
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(me)
    }

    pub(super) fn invalid(&self, message: &str) -> ToolError {
        ToolError::new(ErrorCode::InvalidInput, message, self.shape)
    }

    pub(super) fn get(&self, name: &str) -> Option<&Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    pub(super) fn wrong(&self, name: &str, expected: &str, v: &Value) -> ToolError {
        self.invalid(&format!(
            "`{name}` must be {expected}, not {}",
            json_type(v)
        ))
    }

    pub(super) fn string(&self, name: &str) -> Result<Option<String>, ToolError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.wrong(name, "a string", v)),
        }
    }

    pub(super) fn bool(&self, name: &str) -> Result<Option<bool>, ToolError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(name, "true or false", v)),
        }
    }

    pub(super) fn number(&self, name: &str) -> Result<Option<f64>, ToolError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(v) => Err(self.wrong(name, "a number", v)),
        }
    }

    pub(super) fn offset(&self, name: &str) -> Result<Option<u64>, ToolError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
            Some(v) => Err(self.wrong(name, "a byte offset (an integer of 0 or more)", v)),
        }
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
