//! The node as every command sees it: its devices and addresses (what the device program
//! attaches to, what wildcard host ports answer on), how programs attach there, and the
//! test hook that fails an ADD after all its steps.

use crate::{
    bpf::{
        tunnel::{TunnelView, ROUTE_PROTOCOL, TUNNEL_DEVICE},
        AttachMode, AttachModes, Device, NodeView,
    },
    cni::{
        code,
        config::{NetConf, TcAttachMode},
        CniError,
    },
    netlink::Netlink,
    veth,
};

/// The node as it is now ([`bpf::NodeView`]): the devices that get the device program
/// (the `devices` of the config, or else every device holding a global address that is not
/// a pod's host veth or loopback), every global address of the node (what wildcard host
/// ports answer on), masquerade's candidate source addresses, and the devices' attach
/// mode. ADD, STATUS and the agent read it, and converge the node to it
/// (`bpf::converge`), so a device or address that appears later is covered without a new
/// pod.
///
/// One address dump finds them; links are then looked up one by one, only those holding an
/// address other than a pod gateway (`gateways`) and other than `lo` (which holds the IPv4
/// gateways): host veths hold nothing else, so this does not parse one link message per
/// pod on a busy node.
pub async fn node_view(
    host_nl: &Netlink,
    conf: &NetConf,
    gateways: &[std::net::IpAddr],
) -> Result<NodeView, CniError> {
    // The calling thread is in the node's namespace, as `host_nl` is.
    let mut global = crate::netlink::addrs::global_addresses()
        .map_err(crate::netlink::NetlinkError::Addresses)?;
    // kube-proxy's IPVS mode holds every Service address on its dummy device: Service
    // addresses, not the node's (no host port answers there, no device program goes
    // there), which converge to the Services map instead.
    let mut ipvs = Vec::new();
    if let Some(l) = host_nl.link_by_name(crate::services::IPVS_DEVICE).await? {
        global.retain(|(i, ip)| {
            if *i == l.index {
                ipvs.push(*ip);
            }
            *i != l.index
        });
    }
    let mut addrs: Vec<std::net::IpAddr> = global.iter().map(|(_, ip)| *ip).collect();
    addrs.sort();
    addrs.dedup();
    let mode = attach_modes(conf, false).devices;
    let mut devices = Vec::new();
    if let Some(names) = &conf.devices {
        for name in names {
            match host_nl.link_by_name(name).await? {
                Some(l) => devices.push(Device {
                    name: l.name,
                    ifindex: l.index,
                }),
                None => log::warn!("devices: {name:?} does not exist in the node namespace (yet)"),
            }
        }
        let tunnel = tunnel_view(host_nl, &mut devices).await?;
        return Ok(NodeView {
            devices,
            addrs,
            by_link: global,
            mode,
            services: None,
            ipvs,
            tunnel,
        });
    }
    let mut candidates: Vec<u32> = global
        .iter()
        .filter(|(i, ip)| *i != crate::gateway::LOOPBACK_IFINDEX && !gateways.contains(ip))
        .map(|(i, _)| *i)
        .collect();
    candidates.sort_unstable();
    candidates.dedup();
    for index in candidates {
        if let Some(l) = host_nl.link_by_index(index).await? {
            if l.name != "lo" && !veth::is_host_veth(&l) {
                devices.push(Device {
                    name: l.name,
                    ifindex: l.index,
                });
            }
        }
    }
    let tunnel = tunnel_view(host_nl, &mut devices).await?;
    Ok(NodeView {
        devices,
        addrs,
        by_link: global,
        mode,
        services: None,
        ipvs,
        tunnel,
    })
}

/// The cluster network's tunnel device, if the agent made one, with its peers: the routes
/// of the cluster's protocol through it, each via its peer's node address. It joins
/// `devices` (what arrives through it is checked, then delivered like from any device).
async fn tunnel_view(
    host_nl: &Netlink,
    devices: &mut Vec<Device>,
) -> Result<Option<TunnelView>, CniError> {
    let Some(l) = host_nl.link_by_name(TUNNEL_DEVICE).await? else {
        return Ok(None);
    };
    let Some(vxlan) = l.vxlan.filter(|v| v.external) else {
        log::warn!("{TUNNEL_DEVICE} is not an external VXLAN device: not the cluster network's");
        return Ok(None);
    };
    if !devices.iter().any(|d| d.ifindex == l.index) {
        devices.push(Device {
            name: l.name.clone(),
            ifindex: l.index,
        });
    }
    let mut peers = Vec::new();
    for v6 in [false, true] {
        for r in host_nl.routes(v6).await? {
            let node = r.gw.and_then(crate::bpf::tunnel::node_of);
            if let (ROUTE_PROTOCOL, Some(oif), Some(node)) = (r.protocol, r.oif, node) {
                if oif == l.index {
                    peers.push((r.dst, node));
                }
            }
        }
    }
    Ok(Some(TunnelView {
        ifindex: l.index,
        name: l.name,
        udp_csum: vxlan.udp_csum,
        peers,
    }))
}

/// The error the test hook `EBPF_CNI_FAILPOINT` makes ADD fail with (code 199).
#[cfg(feature = "test-hooks")]
#[derive(Debug, thiserror::Error)]
#[error("failpoint {}=before-result", crate::test_hooks::FAILPOINT_ENV)]
pub struct Failpoint;

/// A release build has no failpoint: this error cannot be made.
#[cfg(not(feature = "test-hooks"))]
#[derive(Debug, thiserror::Error)]
#[error("no failpoint in a release build")]
pub enum Failpoint {}

impl Failpoint {
    pub fn cni_code(&self) -> u32 {
        code::INTERNAL
    }
}

/// The test hook `EBPF_CNI_FAILPOINT`: an error once every step of ADD has succeeded.
pub fn failpoint() -> Result<(), Failpoint> {
    #[cfg(feature = "test-hooks")]
    if crate::test_hooks::fail_before_result() {
        return Err(Failpoint);
    }
    Ok(())
}

/// How the programs attach. `tcAttachMode` `tcx` or `netlink` forces one mode everywhere.
/// `auto` (the default) puts netlink filters on the host veths ebpf-cni creates and TCX
/// links everywhere else where the kernel has TCX: on the node's devices, which other tc
/// users share and which outlive every pod, and on a chained pod's veth, which belongs to
/// the previous plugin. A TCX attach waits out two RCU grace periods while it holds the
/// machine-wide RTNL lock (`kernel/bpf/tcx.c`: `tcx_entry_sync()`, then
/// `bpf_mprog_commit()`), about 25 ms for a pod's two hooks here, during which every
/// netlink request of the machine waits too; a `bpf` filter on a fresh `clsact` needs no
/// such wait. The veth is ebpf-cni's alone from creation to deletion, and its filters go
/// with it, so the links' ownership buys nothing there (docs/dataplane.md, "Attach modes").
pub fn attach_modes(conf: &NetConf, chained: bool) -> AttachModes {
    let one = |mode| AttachModes {
        pod: mode,
        devices: mode,
    };
    match conf.tc_attach_mode {
        TcAttachMode::Auto => AttachModes {
            pod: if chained {
                AttachMode::auto()
            } else {
                AttachMode::Netlink
            },
            devices: AttachMode::auto(),
        },
        TcAttachMode::Tcx => one(AttachMode::Tcx),
        TcAttachMode::Netlink => one(AttachMode::Netlink),
    }
}

/// After a successful ADD: the reference plugins' keys the network's config carries that
/// ebpf-cni accepts (see `cni/stock_keys.rs`), one warning line, once per network and set
/// of keys on this node (recorded under the node's pins, so it comes again only after the
/// node's last pod went).
pub fn warn_stock_keys_once(network: &str, accepted: &[crate::cni::stock_keys::Found]) {
    if accepted.is_empty() {
        return;
    }
    let Ok(node) = crate::bpf::NodeId::current() else {
        return;
    };
    let fields: Vec<String> = accepted
        .iter()
        .map(|f| format!("{} {}", f.field, f.value))
        .collect();
    let hash = crate::bpf::fnv1a(
        fields
            .iter()
            .flat_map(|f| f.bytes().chain([0]))
            .chain(network.bytes()),
    );
    let record = crate::bpf::PinRoot::from_env()
        .node_dir(&node)
        .join(ebpf_cni_maps::pin::STOCK_KEYS_WARNED_DIR)
        .join(format!("{hash:016x}"));
    if record.exists() {
        return;
    }
    let lines: Vec<String> = accepted
        .iter()
        .map(|f| match f.row.fate {
            crate::cni::stock_keys::Fate::Accepted(why) => {
                format!("{} {}: {why}", f.field, f.value)
            }
            _ => format!("{} {}", f.field, f.value),
        })
        .collect();
    log::warn!(
        "network {network}: keys of the reference plugins accepted as describing what ebpf-cni does: {}",
        lines.join("; ")
    );
    if let Err(e) = std::fs::create_dir_all(&record) {
        log::debug!("{}: {e}", record.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modes(mode: Option<&str>, chained: bool) -> AttachModes {
        let mut raw = serde_json::json!({"cniVersion": "1.0.0", "name": "n", "type": "ebpf-cni"});
        if let Some(m) = mode {
            raw["tcAttachMode"] = serde_json::Value::from(m);
        }
        attach_modes(&NetConf::parse(raw).unwrap(), chained)
    }

    #[test]
    fn auto_puts_filters_on_own_veths_and_links_elsewhere() {
        let kernel = AttachMode::auto();
        assert_eq!(
            modes(None, false),
            AttachModes {
                pod: AttachMode::Netlink,
                devices: kernel
            }
        );
        assert_eq!(modes(Some("auto"), false), modes(None, false));
        assert_eq!(
            modes(None, true),
            AttachModes {
                pod: kernel,
                devices: kernel
            }
        );
        for chained in [false, true] {
            for (m, want) in [("tcx", AttachMode::Tcx), ("netlink", AttachMode::Netlink)] {
                assert_eq!(
                    modes(Some(m), chained),
                    AttachModes {
                        pod: want,
                        devices: want
                    }
                );
            }
        }
    }
}
