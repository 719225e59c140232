//! Delegation to another IPAM plugin (spec section 4): executed from `CNI_PATH` with our
//! environment and our whole stdin, its stderr passed through, its result or error parsed.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
};

use crate::cni::{
    code,
    types::{ResultError, SuccessResult},
};

/// A delegate that cannot be found, run, or understood, or that failed.
#[derive(Debug, thiserror::Error)]
pub enum DelegateError {
    #[error("ipam.type {plugin:?}: no such plugin in CNI_PATH ({})", joined(.cni_path))]
    NotFound {
        plugin: String,
        cni_path: Vec<PathBuf>,
    },
    #[error("failed to run ipam plugin {}", .binary.display())]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to wait for ipam plugin {name}")]
    Wait {
        name: String,
        #[source]
        source: std::io::Error,
    },
    /// The delegate exited with an error: its own message is part of ours, its details (or
    /// its whole stdout, when it printed no error result) are the cause.
    #[error("ipam plugin {name} {command} failed ({}): {msg}", outcome(.code, .status))]
    Failed {
        name: String,
        command: &'static str,
        status: ExitStatus,
        /// The code in the delegate's error result, when it printed one.
        code: Option<u64>,
        msg: String,
        #[source]
        details: Said,
    },
    #[error("ipam plugin {} answered VERSION with something that is not JSON", .binary.display())]
    VersionNotJson {
        binary: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("ipam plugin returned a result that is not JSON")]
    ResultNotJson(#[source] serde_json::Error),
    #[error(transparent)]
    BadResult(ResultError),
}

/// What a failed delegate said beyond its message (shown as the error's details).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Said(pub String);

fn joined(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

fn outcome(code: &Option<u64>, status: &ExitStatus) -> String {
    code.map_or_else(|| format!("exit status {status}"), |c| format!("code {c}"))
}

impl DelegateError {
    pub fn cni_code(&self) -> u32 {
        match self {
            Self::NotFound { .. } => code::INVALID_CONFIG,
            _ => code::DELEGATE,
        }
    }

    /// The code the delegate reported in its error result, if it printed one (STATUS
    /// passes the delegate's 50 or 51 on as its own).
    pub fn reported_code(&self) -> Option<u32> {
        match self {
            Self::Failed { code, .. } => code.and_then(|c| u32::try_from(c).ok()),
            _ => None,
        }
    }
}

/// Finds `plugin` in the `CNI_PATH` directories.
pub fn find(plugin: &str, cni_path: &[PathBuf]) -> Result<PathBuf, DelegateError> {
    cni_path
        .iter()
        .map(|d| d.join(plugin))
        .find(|p| p.is_file())
        .ok_or_else(|| DelegateError::NotFound {
            plugin: plugin.to_owned(),
            cni_path: cni_path.to_vec(),
        })
}

/// Whether the delegate lists `version` among its supported versions (a VERSION call).
pub fn supports(binary: &Path, version: &str) -> Result<bool, DelegateError> {
    let asked = serde_json::json!({ "cniVersion": version }).to_string();
    let out = exec(binary, "VERSION", asked.as_bytes())?;
    let v: serde_json::Value =
        serde_json::from_slice(&out).map_err(|source| DelegateError::VersionNotJson {
            binary: binary.to_owned(),
            source,
        })?;
    Ok(v.get("supportedVersions")
        .and_then(serde_json::Value::as_array)
        .is_some_and(|list| list.iter().any(|s| s.as_str() == Some(version))))
}

/// Runs the delegate with `CNI_COMMAND=command`; returns its stdout on success. A failure
/// is code 104 naming the delegate, its command and its own code and message.
pub fn exec(binary: &Path, command: &'static str, stdin: &[u8]) -> Result<Vec<u8>, DelegateError> {
    let name = binary
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut child = Command::new(binary)
        .env("CNI_COMMAND", command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|source| DelegateError::Spawn {
            binary: binary.to_owned(),
            source,
        })?;
    // A delegate that exits without reading stdin closes the pipe: not our error.
    let _ = child.stdin.take().expect("stdin is piped").write_all(stdin);
    let out = child
        .wait_with_output()
        .map_err(|source| DelegateError::Wait {
            name: name.clone(),
            source,
        })?;
    if out.status.success() {
        return Ok(out.stdout);
    }
    let inner: Option<serde_json::Value> = serde_json::from_slice(&out.stdout).ok();
    let msg = inner
        .as_ref()
        .and_then(|v| v.get("msg"))
        .and_then(|m| m.as_str())
        .unwrap_or("no error message");
    let details = inner
        .as_ref()
        .and_then(|v| v.get("details"))
        .and_then(|m| m.as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| String::from_utf8_lossy(&out.stdout).trim().to_owned());
    let inner_code = inner
        .as_ref()
        .and_then(|v| v.get("code"))
        .and_then(|c| c.as_u64());
    Err(DelegateError::Failed {
        name,
        command,
        status: out.status,
        code: inner_code,
        msg: msg.to_owned(),
        details: Said(details),
    })
}

/// ADD through the delegate: its (abbreviated) result.
pub fn add(binary: &Path, stdin: &[u8]) -> Result<SuccessResult, DelegateError> {
    let out = exec(binary, "ADD", stdin)?;
    let v: serde_json::Value =
        serde_json::from_slice(&out).map_err(DelegateError::ResultNotJson)?;
    SuccessResult::from_json(&v, "the ipam plugin's result").map_err(DelegateError::BadResult)
}
