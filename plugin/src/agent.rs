//! `ebpf-cni agent`: the node follows its devices and addresses as they change, without
//! waiting for a pod or a STATUS. Optional (the plugin works without it; STATUS converges
//! too): the DaemonSet's second container, which can also serve the metrics.
//!
//! It joins the rtnetlink groups of links and addresses, converges the node once, then
//! again after each burst of announcements (gathered for [`SETTLE`], so a pod's ADD or a
//! bond coming up costs one convergence, not ten) and every `resync` without any, for
//! what no announcement tells (a device program detached by someone else). Convergence is
//! `crate::converge`, under the node lock like every ADD and DEL, and writes nothing when
//! the node is in line. kube-proxy's rules announce nothing on rtnetlink (and the legacy
//! iptables backend nothing at all), so the agent also converges every `services_poll`:
//! a Service address kube-proxy writes is followed within that.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::{
    bpf::ConvergedBy,
    cni::config::{ConfigError, NetConf},
    netlink::events::Events,
};

/// How long announcements are gathered before the node is converged.
pub const SETTLE: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("reading the network configuration {path}")]
    ReadConf {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the network configuration {path} is not JSON")]
    ConfJson {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("the network configuration {path} has no plugin of type \"ebpf-cni\"")]
    NoPlugin { path: PathBuf },
    #[error("the network configuration {path}")]
    Conf { path: PathBuf, source: ConfigError },
    #[error("joining the rtnetlink groups of links and addresses")]
    Subscribe(#[source] std::io::Error),
    #[error("reading the rtnetlink announcements")]
    Events(#[source] std::io::Error),
}

/// Converges the node for the conflist at `conf`, logging what failed: after the cluster
/// network's peer routes changed, the programs' tunnel maps follow them at once, not at
/// the next pass.
pub fn converge_for(conf: &Path) {
    let res = network_conf(Some(conf))
        .map_err(|e| crate::cni::error::chain(&e))
        .and_then(|c| {
            crate::block_on(crate::converge::converge(
                &c,
                crate::bpf::ConvergedBy::Agent,
            ))
            .map_err(|e| e.to_string())
        });
    if let Err(e) = res {
        log::error!("converging the node after the peer routes changed: {e}");
    }
}

/// The network the agent converges for: the `ebpf-cni` plugin of the conflist (or the
/// single-plugin config) at `path`, with the list's `name` and `cniVersion`; without a
/// file, the defaults (every device holding a global address, attach mode `auto`).
pub fn network_conf(path: Option<&Path>) -> Result<NetConf, AgentError> {
    let Some(path) = path else {
        let raw =
            serde_json::json!({"cniVersion": "1.0.0", "name": "ebpf-cni", "type": "ebpf-cni"});
        return NetConf::parse(raw).map_err(|source| AgentError::Conf {
            path: PathBuf::new(),
            source,
        });
    };
    let text = std::fs::read(path).map_err(|source| AgentError::ReadConf {
        path: path.to_owned(),
        source,
    })?;
    let raw: Value = serde_json::from_slice(&text).map_err(|source| AgentError::ConfJson {
        path: path.to_owned(),
        source,
    })?;
    let conf = plugin_of(raw).ok_or_else(|| AgentError::NoPlugin {
        path: path.to_owned(),
    })?;
    NetConf::parse(conf).map_err(|source| AgentError::Conf {
        path: path.to_owned(),
        source,
    })
}

/// A conflist's `ebpf-cni` plugin with the list's `name` and `cniVersion` (as a runtime
/// hands them to the plugin), or a single config of that type.
fn plugin_of(raw: Value) -> Option<Value> {
    let is_ours = |p: &Value| p.get("type").and_then(Value::as_str) == Some("ebpf-cni");
    let Some(plugins) = raw.get("plugins").and_then(Value::as_array) else {
        return is_ours(&raw).then_some(raw);
    };
    let mut conf = plugins.iter().find(|p| is_ours(p))?.clone();
    for key in ["name", "cniVersion"] {
        if let (Some(v), Some(obj)) = (raw.get(key), conf.as_object_mut()) {
            obj.insert(key.to_owned(), v.clone());
        }
    }
    Some(conf)
}

/// Runs until killed (or `once`: one convergence, then returns), in the calling thread's
/// network namespace.
pub fn run(
    conf: &NetConf,
    resync: Duration,
    services_poll: Duration,
    once: bool,
) -> Result<(), AgentError> {
    // Joined before the first look: a change during it is announced, not missed.
    let events = Events::subscribe().map_err(AgentError::Subscribe)?;
    let converge = || {
        if let Err(e) = crate::block_on(crate::converge::converge(conf, ConvergedBy::Agent)) {
            // Tried again at the next announcement or resync.
            log::error!("converging the node: {e}");
        }
    };
    converge();
    if once {
        return Ok(());
    }
    loop {
        if events
            .wait(resync.min(services_poll))
            .map_err(AgentError::Events)?
        {
            std::thread::sleep(SETTLE);
            let n = events.drain().map_err(AgentError::Events)?;
            log::debug!("{n} batch(es) of link or address announcements");
        }
        converge();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_conflists_plugin_gets_the_lists_name_and_version() {
        let list = json!({"cniVersion": "1.1.0", "name": "k8s", "plugins": [
            {"type": "portmap"},
            {"type": "ebpf-cni", "devices": ["eth1"]}
        ]});
        assert_eq!(
            plugin_of(list),
            Some(
                json!({"type": "ebpf-cni", "devices": ["eth1"], "name": "k8s", "cniVersion": "1.1.0"})
            )
        );
        assert_eq!(plugin_of(json!({"plugins": [{"type": "bridge"}]})), None);
        let single = json!({"cniVersion": "1.0.0", "name": "n", "type": "ebpf-cni"});
        assert_eq!(plugin_of(single.clone()), Some(single));
    }
}
