//! A walk over the parsed YAML that collects every problem with its path instead of stopping
//! at the first, as serde's `deny_unknown_fields` would.

use serde::de::DeserializeOwned;
use serde_yaml::{Mapping, Value};

/// Every problem found so far, each as `path: message`, and the warnings: things that work
/// but should be fixed (a secret file every user can read).
#[derive(Default)]
pub struct Problems {
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
}

impl Problems {
    pub fn push(&mut self, path: &str, message: impl std::fmt::Display) {
        self.errors.push(format!("{path}: {message}"));
    }

    /// `push`, unless a problem at `path` (or inside it: `path[i]`, `path.key`) is already
    /// listed: a value that was given but invalid is one problem, not also "missing" or
    /// "empty". One problem, one line.
    pub fn push_unless_reported(&mut self, path: &str, message: impl std::fmt::Display) {
        if !self.reported(path) {
            self.push(path, message);
        }
    }

    /// Whether a problem at `path` or inside it is listed.
    pub fn reported(&self, path: &str) -> bool {
        self.errors.iter().any(|e| {
            e.strip_prefix(path).is_some_and(|rest| {
                rest.starts_with(": ") || rest.starts_with('[') || rest.starts_with('.')
            })
        })
    }

    pub fn warn(&mut self, path: &str, message: impl std::fmt::Display) {
        self.warnings.push(format!("{path}: {message}"));
    }
}

/// The fields of one YAML mapping, taken one by one; what is left at the end is unknown.
pub struct Section {
    path: String,
    fields: Mapping,
}

impl Section {
    /// `value` must be a mapping (or absent/null, which reads as empty).
    pub fn new(path: &str, value: Value, problems: &mut Problems) -> Self {
        let fields = match value {
            Value::Mapping(m) => m,
            Value::Null => Mapping::new(),
            other => {
                problems.push(display(path), format!("expected a mapping, found {}", kind(&other)));
                Mapping::new()
            }
        };
        Self { path: path.to_string(), fields }
    }

    pub fn path(&self, key: &str) -> String {
        if self.path.is_empty() { key.to_string() } else { format!("{}.{key}", self.path) }
    }

    pub fn has(&self, key: &str) -> bool {
        self.fields.get(key).is_some_and(|v| !v.is_null())
    }

    /// Removes `key` and returns its raw value (absent and `null` both read as `None`).
    pub fn raw(&mut self, key: &str) -> Option<Value> {
        self.fields.remove(key).filter(|v| !v.is_null())
    }

    /// Removes `key` and deserializes it, recording a problem when it has the wrong shape.
    pub fn take<T: DeserializeOwned>(&mut self, key: &str, problems: &mut Problems) -> Option<T> {
        let value = self.raw(key)?;
        match serde_yaml::from_value(value) {
            Ok(v) => Some(v),
            Err(e) => {
                problems.push(&self.path(key), clean(&e.to_string()));
                None
            }
        }
    }

    /// Like `take`, then converts with `parse`; a failed conversion is a problem at `key`.
    pub fn take_with<S: DeserializeOwned, T>(
        &mut self,
        key: &str,
        problems: &mut Problems,
        parse: impl Fn(S) -> Result<T, String>,
    ) -> Option<T> {
        let raw = self.take::<S>(key, problems)?;
        parse(raw).map_err(|e| problems.push(&self.path(key), e)).ok()
    }

    /// A list whose items are each converted with `parse`; problems name the item's index.
    pub fn take_list<S: DeserializeOwned, T>(
        &mut self,
        key: &str,
        problems: &mut Problems,
        parse: impl Fn(S) -> Result<T, String>,
    ) -> Option<Vec<T>> {
        let items = self.take::<Vec<S>>(key, problems)?;
        let path = self.path(key);
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            match parse(item) {
                Ok(v) => out.push(v),
                Err(e) => problems.push(&format!("{path}[{i}]"), e),
            }
        }
        Some(out)
    }

    /// Records every key that nobody took as unknown.
    pub fn finish(self, problems: &mut Problems) {
        for key in self.fields.keys() {
            let name = match key {
                Value::String(s) => s.clone(),
                other => format!("{other:?}"),
            };
            problems.push(&self.path(&name), "unknown field");
        }
    }
}

fn display(path: &str) -> &str {
    if path.is_empty() { "(top level)" } else { path }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// serde_yaml's messages for a sub-value carry no useful position; keep the reason only.
fn clean(message: &str) -> String {
    message.split(" at line ").next().unwrap_or(message).to_string()
}
