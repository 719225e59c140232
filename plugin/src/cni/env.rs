//! The `CNI_*` environment (spec section 2, "Parameters"), validated before anything runs.

use std::path::PathBuf;

use super::{
    args::{ArgsError, CniArgs},
    code,
};

/// A `CNI_*` environment that cannot be used; each names the variable and value at fault.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("CNI_COMMAND {0:?} is not one of ADD, DEL, CHECK, VERSION, GC, STATUS")]
    UnknownCommand(String),
    #[error("required environment variable {0} is missing or empty")]
    Missing(&'static str),
    #[error("CNI_NETNS {0:?} must be an absolute path")]
    RelativeNetns(String),
    #[error("CNI_CONTAINERID {0:?} is invalid: it must start with a letter or digit followed by letters, digits, '_', '.' or '-'")]
    InvalidContainerId(String),
    #[error("CNI_IFNAME {name:?} is invalid: {why}")]
    InvalidIfname { name: String, why: &'static str },
    #[error(transparent)]
    Args(#[from] ArgsError),
}

impl EnvError {
    pub fn cni_code(&self) -> u32 {
        match self {
            Self::Args(e) => e.cni_code(),
            _ => code::INVALID_ENV,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Gc,
    Status,
}

impl Command {
    pub fn parse(s: &str) -> Result<Self, EnvError> {
        Ok(match s {
            "ADD" => Self::Add,
            "DEL" => Self::Del,
            "CHECK" => Self::Check,
            "VERSION" => Self::Version,
            "GC" => Self::Gc,
            "STATUS" => Self::Status,
            other => return Err(EnvError::UnknownCommand(other.to_owned())),
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Check => "CHECK",
            Self::Version => "VERSION",
            Self::Gc => "GC",
            Self::Status => "STATUS",
        }
    }
}

/// The per-attachment parameters of ADD, DEL and CHECK.
#[derive(Debug, Clone)]
pub struct CniEnv {
    pub container_id: String,
    /// `None` when `CNI_NETNS` is empty or unset (allowed for DEL only).
    pub netns: Option<PathBuf>,
    pub ifname: String,
    pub args: CniArgs,
    pub path: Vec<PathBuf>,
}

/// The parameters of GC and STATUS, which act on a whole network: spec 1.1 requires only
/// `CNI_COMMAND` and `CNI_PATH` for them. `CNI_CONTAINERID`, `CNI_IFNAME` and `CNI_NETNS`
/// are not read (a runtime may leave them set from elsewhere; they mean nothing here).
#[derive(Debug, Clone)]
pub struct NetworkEnv {
    pub path: Vec<PathBuf>,
}

/// [`NetworkEnv`] through `get`. `CNI_PATH` may be empty: only a delegated IPAM needs it,
/// and its absence is reported when the delegate is looked up.
pub fn network_from_lookup(get: impl Fn(&str) -> Option<String>) -> NetworkEnv {
    NetworkEnv {
        path: cni_path(&get),
    }
}

fn cni_path(get: &impl Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    get("CNI_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// Reads the environment through `get`, so tests need not touch the process environment.
pub fn from_lookup(
    command: Command,
    get: impl Fn(&str) -> Option<String>,
) -> Result<CniEnv, EnvError> {
    let missing = EnvError::Missing;
    let non_empty = |var: &str| get(var).filter(|v| !v.is_empty());

    let container_id = non_empty("CNI_CONTAINERID").ok_or_else(|| missing("CNI_CONTAINERID"))?;
    validate_container_id(&container_id)?;

    let ifname = non_empty("CNI_IFNAME").ok_or_else(|| missing("CNI_IFNAME"))?;
    validate_ifname(&ifname)?;

    let netns = non_empty("CNI_NETNS").map(PathBuf::from);
    if netns.is_none() && matches!(command, Command::Add | Command::Check) {
        return Err(missing("CNI_NETNS"));
    }
    if let Some(ns) = &netns {
        if !ns.is_absolute() {
            return Err(EnvError::RelativeNetns(ns.display().to_string()));
        }
    }

    let args = CniArgs::parse(&get("CNI_ARGS").unwrap_or_default())?;
    let path = cni_path(&get);
    Ok(CniEnv {
        container_id,
        netns,
        ifname,
        args,
        path,
    })
}

/// Spec: "Must start with an alphanumeric character, optionally followed by any combination
/// of one or more alphanumeric characters, underscore, dot or hyphen."
pub fn is_valid_id(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

pub fn validate_container_id(id: &str) -> Result<(), EnvError> {
    if is_valid_id(id) {
        Ok(())
    } else {
        Err(EnvError::InvalidContainerId(id.to_owned()))
    }
}

/// Linux interface names: 1..=15 bytes, not "." or "..", no '/', ':' or whitespace.
pub fn validate_ifname(name: &str) -> Result<(), EnvError> {
    let why = if name.len() > 15 {
        Some("longer than 15 characters")
    } else if name == "." || name == ".." {
        Some("not a valid interface name")
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
    {
        Some("contains '/', ':' or whitespace")
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => Err(EnvError::InvalidIfname {
            name: name.to_owned(),
            why,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// As the runtime sees it: through the edge's conversion.
    fn env(pairs: &[(&str, &str)], cmd: Command) -> Result<CniEnv, crate::cni::CniError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Ok(from_lookup(cmd, |k| m.get(k).cloned())?)
    }

    const OK: &[(&str, &str)] = &[
        ("CNI_CONTAINERID", "abc123"),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
    ];

    #[test]
    fn valid_env() {
        let e = env(OK, Command::Add).unwrap();
        assert_eq!(e.ifname, "eth0");
        assert_eq!(e.path.len(), 2);
    }

    #[test]
    fn missing_variables_are_named() {
        for var in ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS"] {
            let pairs: Vec<_> = OK.iter().copied().filter(|(k, _)| *k != var).collect();
            let e = env(&pairs, Command::Add).unwrap_err();
            assert_eq!(e.code, code::INVALID_ENV);
            assert!(e.msg.contains(var), "{}", e.msg);
        }
    }

    #[test]
    fn del_allows_empty_netns() {
        let pairs: Vec<_> = OK
            .iter()
            .copied()
            .map(|(k, v)| if k == "CNI_NETNS" { (k, "") } else { (k, v) })
            .collect();
        assert!(env(&pairs, Command::Del).unwrap().netns.is_none());
        assert!(env(&pairs, Command::Check).is_err());
    }

    #[test]
    fn gc_and_status_need_no_attachment_variables() {
        let e = network_from_lookup(|k| {
            (k == "CNI_PATH").then(|| "/opt/cni/bin::/usr/lib/cni".to_owned())
        });
        assert_eq!(
            e.path,
            [PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
        );
        // Set but meaningless for a whole network: ignored, even when invalid.
        let m: HashMap<&str, &str> = [
            ("CNI_CONTAINERID", "-bad"),
            ("CNI_IFNAME", "a/b"),
            ("CNI_NETNS", "rel"),
        ]
        .into();
        let e = network_from_lookup(|k| m.get(k).map(|v| v.to_string()));
        assert!(e.path.is_empty());
    }

    #[test]
    fn bad_ids_and_ifnames() {
        for id in ["-abc", "a/b", "../x", "a b", "_x"] {
            assert_eq!(
                validate_container_id(id).unwrap_err().cni_code(),
                code::INVALID_ENV,
                "{id}"
            );
        }
        for id in [
            "a",
            "0ab_c.d-e",
            "f3e1b2c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f80",
        ] {
            validate_container_id(id).unwrap();
        }
        for name in ["0123456789abcdef", "a/b", ".", "..", "a b", "eth:0"] {
            let e = validate_ifname(name).unwrap_err();
            assert!(e.to_string().contains("CNI_IFNAME"), "{e}");
        }
        validate_ifname("eth0").unwrap();
        validate_ifname("0123456789abcde").unwrap();
    }
}
