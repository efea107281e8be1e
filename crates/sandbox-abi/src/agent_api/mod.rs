//! The agent's HTTP API types: the JSON bodies of its requests and the
//! `data` of its answers, with the lenient scalar decoding the platform's
//! clients rely on. The agent (`crates/sandbox-agent`) decodes and encodes
//! them; the daemon only describes them (`sandboxd openapi agent`, feature
//! `openapi`), so it needs these types but not the agent's library.
//!
//! Contract: `docs/contracts/agent-api.md`; operator view: `docs/agent.md`.

use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
pub mod openapi;

/// serde helpers for lenient optional fields.
pub mod lenient {
    use serde::{Deserialize, Deserializer};
    use serde_json::Value;

    /// A number of seconds given as integer, float or numeric string;
    /// `null` means absent.
    pub fn seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        Ok(match Option::<Value>::deserialize(d)? {
            Some(Value::Number(n)) => n.as_f64(),
            Some(Value::String(s)) => s.trim().parse::<f64>().ok(),
            _ => None,
        })
    }

    /// A boolean; `null` means absent, strings "true"/"false" accepted.
    pub fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
        Ok(match Option::<Value>::deserialize(d)? {
            Some(Value::Bool(b)) => Some(b),
            Some(Value::String(s)) => match s.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" => Some(true),
                "false" | "0" | "no" => Some(false),
                _ => None,
            },
            Some(Value::Number(n)) => Some(n.as_f64().unwrap_or(0.0) != 0.0),
            _ => None,
        })
    }

    /// A signed integer given as integer or integral float; `null` is absent.
    pub fn int<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        Ok(match Option::<Value>::deserialize(d)? {
            Some(Value::Number(n)) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
            Some(Value::String(s)) => s.trim().parse::<i64>().ok(),
            _ => None,
        })
    }
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecRequest {
    pub command: String,
    #[serde(default)]
    pub exec_dir: Option<String>,
    #[serde(default, deserialize_with = "lenient::seconds")]
    pub timeout: Option<f64>,
    #[serde(default, deserialize_with = "lenient::seconds")]
    pub hard_timeout: Option<f64>,
    #[serde(default, deserialize_with = "lenient::flag")]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub id: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "lenient::flag")]
    pub async_mode: Option<bool>,
    #[serde(default, deserialize_with = "lenient::flag")]
    pub strict: Option<bool>,
}

#[derive(Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecResult {
    pub session_id: String,
    pub command: String,
    /// `completed`, `hard_timeout`, `terminated`, `running` (async), ...
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub status: &'static str,
    pub output: String,
    pub exit_code: Option<i32>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReadRequest {
    pub file: String,
    #[serde(default, deserialize_with = "lenient::int")]
    pub start_line: Option<i64>,
    #[serde(default, deserialize_with = "lenient::int")]
    pub end_line: Option<i64>,
}

#[derive(Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReadResult {
    pub content: String,
    pub file: String,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WriteRequest {
    pub file: String,
    pub content: String,
    #[serde(default)]
    pub encoding: Option<String>,
    #[serde(default, deserialize_with = "lenient::flag")]
    pub append: Option<bool>,
    #[serde(default, deserialize_with = "lenient::flag")]
    pub leading_newline: Option<bool>,
    #[serde(default, deserialize_with = "lenient::flag")]
    pub trailing_newline: Option<bool>,
}

#[derive(Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WriteResult {
    pub file: String,
    pub bytes_written: usize,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ListRequest {
    pub path: String,
    #[serde(default, deserialize_with = "lenient::flag")]
    pub recursive: Option<bool>,
    #[serde(default, deserialize_with = "lenient::flag")]
    pub show_hidden: Option<bool>,
    #[serde(default, deserialize_with = "lenient::flag")]
    pub include_size: Option<bool>,
    #[serde(default, deserialize_with = "lenient::flag")]
    pub include_permissions: Option<bool>,
    #[serde(default)]
    pub sort_by: Option<String>,
    #[serde(default, deserialize_with = "lenient::flag")]
    pub sort_desc: Option<bool>,
    #[serde(default, deserialize_with = "lenient::int")]
    pub max_depth: Option<i64>,
    #[serde(default)]
    pub file_types: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileInfo {
    pub name: String,
    pub path: String,
    pub is_directory: bool,
    pub size: Option<u64>,
    pub modified_time: Option<String>,
    pub permissions: Option<String>,
    pub extension: Option<String>,
    #[serde(skip)]
    /// Modification time in Unix seconds, for sorting (not serialized).
    pub mtime: f64,
}

#[derive(Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ListResult {
    pub path: String,
    pub files: Vec<FileInfo>,
    pub total_count: usize,
    pub directory_count: usize,
    pub file_count: usize,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FindRequest {
    pub path: String,
    pub glob: String,
}

#[derive(Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FindResult {
    pub path: String,
    pub files: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EditorRequest {
    pub command: String,
    pub path: String,
    #[serde(default)]
    pub file_text: Option<String>,
    #[serde(default)]
    pub old_str: Option<String>,
    #[serde(default)]
    pub new_str: Option<String>,
    #[serde(default, deserialize_with = "lenient::int")]
    pub insert_line: Option<i64>,
    #[serde(default)]
    pub view_range: Option<Vec<i64>>,
    #[serde(default)]
    pub replace_mode: Option<String>,
}

#[derive(Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EditorResult {
    pub output: String,
    pub path: String,
    pub prev_exist: bool,
}

#[derive(Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UploadResult {
    pub file_path: String,
    pub file_size: u64,
    pub success: bool,
}
