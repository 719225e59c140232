//! ADD: IPAM, the veth pair, addresses and routes on both sides, forwarding, and the eBPF
//! programs on the host veth. Every step that succeeds registers its undo; if a later step
//! fails, the undo steps run in reverse so a failed ADD leaves nothing behind.

use crate::{
    bpf::{self, AttachMode, AttachModes, AttachmentKey, Device, NodeId, PodEndpoint, PodSpec},
    cni::{
        code,
        config::{parse_mac, NetConf, TcAttachMode},
        env::CniEnv,
        types::{Interface, SuccessResult},
        CniError,
    },
    ipam::backend::Ipam,
    netlink::{format_mac, write_sysctl, Netlink},
    netns::Netns,
    veth::{self, PodAddress},
};

/// Test hook: `EBPF_CNI_FAILPOINT=before-result` fails ADD after every step succeeded, so
/// tests can prove the rollback undoes all of them.
const FAILPOINT_ENV: &str = "EBPF_CNI_FAILPOINT";

enum Undo {
    Ipam,
    /// With the record directories the gateways' `acquire` created.
    Gateways(crate::bpf::gateways::CreatedDirs),
    HostLink {
        index: u32,
    },
    Programs,
}

pub async fn add(
    env: &CniEnv,
    conf: &NetConf,
    stdin: &[u8],
) -> Result<serde_json::Value, CniError> {
    if crate::chained::is_chained(conf) {
        return crate::chained::add(env, conf).await;
    }
    // Everything that can be validated is, before anything changes.
    let ipam = Ipam::from_conf(conf)?.expect("a config with ipam is not chained");
    if conf.prev_result.is_some() {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            "ebpf-cni has an ipam section and got a prevResult: with ipam it creates the pod's interface and must come first in the list; after another interface plugin (chained mode), leave ipam out",
        ));
    }
    ipam.validate(env)?;
    bpf::kernel::require_for(conf.tc_attach_mode == TcAttachMode::Tcx)?;
    let limits = crate::bandwidth::limits(conf)?;
    let port_mappings = crate::portmap::mappings(conf)?;
    let mac = match (&conf.runtime.mac, &env.args.mac) {
        (Some(m), _) => Some(parse_mac(m, "runtimeConfig.mac")?),
        (None, Some(m)) => Some(parse_mac(m, "CNI_ARGS MAC")?),
        (None, None) => None,
    };
    let netns_path = env
        .netns
        .as_deref()
        .expect("env validation requires CNI_NETNS for ADD");
    let pod_ns = Netns::open_pod(netns_path)?;
    bpf::ensure_bpffs()?;
    let node = NodeId::current()?;

    let host_nl = Netlink::connect()?;
    let pod_nl = Netlink::connect_in(&pod_ns)?;
    if pod_nl.link_by_name(&env.ifname).await?.is_some() {
        return Err(CniError::new(
            code::INTERFACE_EXISTS,
            format!(
                "interface {:?} already exists in {}",
                env.ifname,
                netns_path.display()
            ),
        ));
    }
    let key = AttachmentKey {
        network: &conf.name,
        container_id: &env.container_id,
        ifname: &env.ifname,
    };
    let host_name = veth::host_veth_name(&key);
    if host_nl.link_by_name(&host_name).await?.is_some() {
        return Err(CniError::new(
            code::INTERFACE_EXISTS,
            format!(
                "host interface {host_name} for container {} ifname {} already exists: DEL the attachment first",
                env.container_id, env.ifname
            ),
        ));
    }

    let mut undo = Vec::new();
    let res = setup(
        env,
        conf,
        stdin,
        &ipam,
        mac,
        &limits,
        &port_mappings,
        &pod_ns,
        &host_nl,
        &pod_nl,
        &host_name,
        &node,
        &key,
        &mut undo,
    )
    .await;
    match res {
        Ok(v) => Ok(v),
        Err(e) => {
            rollback(undo, env, conf, stdin, &ipam, &host_nl, &node, &key).await;
            Err(e)
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn setup(
    env: &CniEnv,
    conf: &NetConf,
    stdin: &[u8],
    ipam: &Ipam,
    mac: Option<[u8; 6]>,
    limits: &crate::bandwidth::Limits,
    port_mappings: &[crate::portmap::PortMapping],
    pod_ns: &Netns,
    host_nl: &Netlink,
    pod_nl: &Netlink,
    host_name: &str,
    node: &NodeId,
    key: &AttachmentKey<'_>,
    undo: &mut Vec<Undo>,
) -> Result<serde_json::Value, CniError> {
    let t = std::time::Instant::now();
    let step =
        |what: &str| log::debug!("ADD step {what}: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let mut result: SuccessResult = ipam.add(conf, env, stdin)?;
    step("ipam");
    undo.push(Undo::Ipam);
    if result.ips.is_empty() {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            "IPAM returned no address for the pod",
        ));
    }
    let addrs: Vec<PodAddress> = result
        .ips
        .iter()
        .map(|ip| PodAddress {
            address: ip.address,
            gateway: ip.gateway,
        })
        .collect();
    bpf::ensure_addresses_free(
        node,
        key,
        &addrs.iter().map(|a| a.address.ip()).collect::<Vec<_>>(),
    )?;
    let ports = crate::portmap::entries(
        port_mappings,
        &addrs
            .iter()
            .map(|a| (a.address.ip(), a.gateway))
            .collect::<Vec<_>>(),
    )?;

    // Before the host routes, which take the gateway as their source address. The undo
    // step is registered whether or not it succeeds, with what it created either way.
    let mut created = Default::default();
    let acquired = crate::gateway::acquire(
        host_nl,
        node,
        key.id(),
        &crate::gateway::ipv4(addrs.iter().map(|a| a.gateway)),
        &mut created,
    )
    .await;
    undo.push(Undo::Gateways(created));
    acquired?;
    step("gateways");

    let pair = veth::create(
        host_nl,
        pod_nl,
        pod_ns,
        host_name,
        &env.ifname,
        conf.mtu,
        mac,
        addrs.iter().any(|a| a.address.is_ipv6()),
    )
    .await?;
    undo.push(Undo::HostLink {
        index: pair.host.index,
    });
    step("veth created");

    veth::configure_container(pod_nl, pair.container.index, &addrs, &result.routes).await?;
    step("container side");
    veth::configure_host(host_nl, pair.host.index, &addrs).await?;
    step("host side");
    if addrs.iter().any(|a| a.address.is_ipv4()) {
        write_sysctl("net.ipv4.ip_forward", "1")?;
    }
    if addrs.iter().any(|a| a.address.is_ipv6()) {
        write_sysctl("net.ipv6.conf.all.forwarding", "1")?;
    }

    let (host_mac, pod_mac) = match (pair.host.mac, pair.container.mac) {
        (Some(h), Some(p)) => (h, p),
        _ => {
            return Err(CniError::new(
                code::KERNEL,
                format!("veth pair {host_name} has no MAC address"),
            ))
        }
    };
    let endpoints: Vec<PodEndpoint> = addrs
        .iter()
        .map(|a| PodEndpoint {
            ip: a.address.ip(),
            host_ifindex: pair.host.index,
            host_mac,
            pod_mac,
            chained: false,
            gateway4: crate::gateway::of_address(a.address.ip(), a.gateway),
        })
        .collect();
    let gateways: Vec<std::net::IpAddr> = addrs.iter().filter_map(|a| a.gateway).collect();
    let (devices, node_addrs) = node_devices(host_nl, conf, &gateways).await?;
    step("devices listed");
    undo.push(Undo::Programs);
    let spec = PodSpec {
        host_ifname: host_name,
        host_ifindex: pair.host.index,
        endpoints: &endpoints,
        limits: limits.to_map_value(),
        ports: &ports,
        node_addrs: &node_addrs,
        chained: false,
        netns_cookie: pacing_cookie(limits, pod_ns)?,
    };
    bpf::add_pod(node, key, &spec, &devices, attach_modes(conf, false))?;
    step("eBPF attached");
    failpoint()?;

    result.interfaces = vec![
        Interface {
            name: pair.host.name.clone(),
            mac: pair.host.mac.map(|m| format_mac(&m)).unwrap_or_default(),
            sandbox: String::new(),
        },
        Interface {
            name: env.ifname.clone(),
            mac: pair
                .container
                .mac
                .map(|m| format_mac(&m))
                .unwrap_or_default(),
            sandbox: pod_ns.path().display().to_string(),
        },
    ];
    for ip in &mut result.ips {
        ip.interface = Some(1);
    }
    if let Some(dns) = &conf.dns {
        // The config's dns wins when it says anything, as in the reference ptp; otherwise
        // what IPAM found (host-local's resolvConf) stays.
        match serde_json::from_value::<crate::cni::types::Dns>(dns.clone()) {
            Ok(d) if !d.is_empty() => result.dns = d,
            Ok(_) => {}
            Err(e) => {
                return Err(CniError::new(
                    code::INVALID_CONFIG,
                    format!("dns {dns} is invalid: {e}"),
                ))
            }
        }
    }
    Ok(result.to_json(conf.cni_version.as_str(), conf.cni_version.format()))
}

#[allow(clippy::too_many_arguments)]
async fn rollback(
    undo: Vec<Undo>,
    env: &CniEnv,
    conf: &NetConf,
    stdin: &[u8],
    ipam: &Ipam,
    host_nl: &Netlink,
    node: &NodeId,
    key: &AttachmentKey<'_>,
) {
    // The gateway records live in the node's pin directory, which `del_pod` removes with
    // the node's last attachment: they are released first, as DEL does.
    let mut gateways = undo.iter().find_map(|u| match u {
        Undo::Gateways(created) => Some(created.clone()),
        _ => None,
    });
    for step in undo.into_iter().rev() {
        let r: Result<(), CniError> = match step {
            Undo::Programs => {
                if let Some(created) = gateways.take() {
                    if let Err(e) =
                        crate::gateway::release_after_failed_add(host_nl, node, key.id(), &created)
                            .await
                    {
                        log::error!("rollback of a failed ADD: {e}");
                    }
                }
                bpf::del_pod(node, key).map(|_| ()).map_err(Into::into)
            }
            Undo::HostLink { index } => host_nl
                .delete_link(index)
                .await
                .map(|_| ())
                .map_err(Into::into),
            Undo::Ipam => ipam.del(conf, env, stdin),
            Undo::Gateways(_) => match gateways.take() {
                Some(created) => {
                    crate::gateway::release_after_failed_add(host_nl, node, key.id(), &created)
                        .await
                }
                None => Ok(()),
            },
        };
        if let Err(e) = r {
            log::error!("rollback of a failed ADD: {e}");
        }
    }
}

/// The node devices that get the device program: the `devices` of the config, or else
/// every device holding a global address that is not a pod's host veth (or loopback).
/// Evaluated at each ADD, so a device that appears later is covered from the next ADD on.
/// Also returns every global address of the node (what wildcard host ports answer on).
///
/// One address dump finds them; links are then looked up one by one, only those holding an
/// address other than a pod gateway (`gateways`) and other than `lo` (which holds the IPv4
/// gateways): host veths hold nothing else, so ADD does not parse one link message per pod
/// on a busy node.
pub(crate) async fn node_devices(
    host_nl: &Netlink,
    conf: &NetConf,
    gateways: &[std::net::IpAddr],
) -> Result<(Vec<Device>, Vec<std::net::IpAddr>), CniError> {
    // The calling thread is in the node's namespace, as `host_nl` is.
    let global = crate::netlink::addrs::global_addresses()
        .map_err(crate::netlink::NetlinkError::Addresses)?;
    let mut node_addrs: Vec<std::net::IpAddr> = global.iter().map(|(_, ip)| *ip).collect();
    node_addrs.sort();
    node_addrs.dedup();
    let mut out = Vec::new();
    if let Some(names) = &conf.devices {
        for name in names {
            match host_nl.link_by_name(name).await? {
                Some(l) => out.push(Device {
                    name: l.name,
                    ifindex: l.index,
                }),
                None => log::warn!("devices: {name:?} does not exist in the node namespace (yet)"),
            }
        }
        return Ok((out, node_addrs));
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
                out.push(Device {
                    name: l.name,
                    ifindex: l.index,
                });
            }
        }
    }
    Ok((out, node_addrs))
}

/// The pod's netns cookie when its egress limit makes its TCP sockets paced (the pacing
/// map's key), else 0: reading it costs a thread, which pods without limits are spared.
pub(crate) fn pacing_cookie(
    limits: &crate::bandwidth::Limits,
    pod_ns: &Netns,
) -> Result<u64, CniError> {
    if bpf::pacing_rate(limits.to_map_value()).is_none() || !bpf::kernel::has_netns_cookie() {
        return Ok(0);
    }
    Ok(bpf::netns_cookie_of(pod_ns)?)
}

/// The test hook [`FAILPOINT_ENV`]: an error once every step of ADD has succeeded.
pub(crate) fn failpoint() -> Result<(), CniError> {
    if std::env::var(FAILPOINT_ENV).as_deref() == Ok("before-result") {
        return Err(CniError::new(
            code::INTERNAL,
            format!("failpoint {FAILPOINT_ENV}=before-result"),
        ));
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
/// with it, so the links' ownership buys nothing there (README, "Attach modes").
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
