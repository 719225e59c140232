//! Delegation to another IPAM plugin (spec section 4): executed from `CNI_PATH` with our
//! environment and our whole stdin, its stderr passed through, its result or error parsed.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use crate::cni::{code, types::SuccessResult, CniError};

/// Finds `plugin` in the `CNI_PATH` directories.
pub fn find(plugin: &str, cni_path: &[PathBuf]) -> Result<PathBuf, CniError> {
    cni_path
        .iter()
        .map(|d| d.join(plugin))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            CniError::new(
                code::INVALID_CONFIG,
                format!(
                    "ipam.type {plugin:?}: no such plugin in CNI_PATH ({})",
                    cni_path
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(":")
                ),
            )
        })
}

/// Runs the delegate with `CNI_COMMAND=command`; returns its stdout on success. A failure
/// is code 104 naming the delegate, its command and its own code and message.
pub fn exec(binary: &Path, command: &str, stdin: &[u8]) -> Result<Vec<u8>, CniError> {
    run(binary, command, stdin).map_err(|f| f.error)
}

/// Like [`exec`], but a failure keeps the code the delegate reported (STATUS passes the
/// delegate's 50 or 51 on as its own).
pub fn exec_keeping_code(binary: &Path, command: &str, stdin: &[u8]) -> Result<Vec<u8>, CniError> {
    run(binary, command, stdin).map_err(|f| match f.code {
        Some(c) => CniError { code: c, ..f.error },
        None => f.error,
    })
}

/// Whether the delegate lists `version` among its supported versions (a VERSION call).
pub fn supports(binary: &Path, version: &str) -> Result<bool, CniError> {
    let asked = serde_json::json!({ "cniVersion": version }).to_string();
    let out = exec(binary, "VERSION", asked.as_bytes())?;
    let v: serde_json::Value = serde_json::from_slice(&out).map_err(|e| {
        CniError::new(
            code::DELEGATE,
            format!(
                "ipam plugin {} answered VERSION with something that is not JSON",
                binary.display()
            ),
        )
        .with_details(e.to_string())
    })?;
    Ok(v.get("supportedVersions")
        .and_then(serde_json::Value::as_array)
        .is_some_and(|list| list.iter().any(|s| s.as_str() == Some(version))))
}

struct Failure {
    error: CniError,
    /// The code in the delegate's error result, when it printed one.
    code: Option<u32>,
}

fn run(binary: &Path, command: &str, stdin: &[u8]) -> Result<Vec<u8>, Failure> {
    let plain = |error| Failure { error, code: None };
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
        .map_err(|e| {
            plain(
                CniError::new(
                    code::DELEGATE,
                    format!("failed to run ipam plugin {}", binary.display()),
                )
                .with_details(e.to_string()),
            )
        })?;
    // A delegate that exits without reading stdin closes the pipe: not our error.
    let _ = child.stdin.take().expect("stdin is piped").write_all(stdin);
    let out = child.wait_with_output().map_err(|e| {
        plain(
            CniError::new(
                code::DELEGATE,
                format!("failed to wait for ipam plugin {name}"),
            )
            .with_details(e.to_string()),
        )
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
    Err(Failure {
        error: CniError::new(
            code::DELEGATE,
            format!(
                "ipam plugin {name} {command} failed ({}): {msg}",
                inner_code.map_or_else(
                    || format!("exit status {}", out.status),
                    |c| format!("code {c}")
                )
            ),
        )
        .with_details(details),
        code: inner_code.and_then(|c| u32::try_from(c).ok()),
    })
}

/// ADD through the delegate: its (abbreviated) result.
pub fn add(binary: &Path, stdin: &[u8]) -> Result<SuccessResult, CniError> {
    let out = exec(binary, "ADD", stdin)?;
    let v: serde_json::Value = serde_json::from_slice(&out).map_err(|e| {
        CniError::new(
            code::DELEGATE,
            "ipam plugin returned a result that is not JSON",
        )
        .with_details(e.to_string())
    })?;
    SuccessResult::from_json(&v, "the ipam plugin's result").map_err(|e| CniError {
        code: code::DELEGATE,
        ..e
    })
}
