//! ADD: IPAM, the veth pair, addresses and routes on both sides, forwarding, and the eBPF
//! programs on the host veth. Every step that succeeds registers its undo; if a later step
//! fails, the undo steps run in reverse so a failed ADD leaves nothing behind.

use crate::{
    attachment::{PodAddr, PodConf},
    bpf::{self, AttachmentKey, NodeId},
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

/// An ADD refused before or after IPAM, for reasons of its own (the steps' errors are
/// their modules').
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    #[error("ebpf-cni has an ipam section and got a prevResult: with ipam it creates the pod's interface and must come first in the list; after another interface plugin (chained mode), leave ipam out")]
    IpamWithPrevResult,
    #[error("interface {ifname:?} already exists in {}", .netns.display())]
    InterfaceExists {
        ifname: String,
        netns: std::path::PathBuf,
    },
    #[error("host interface {host} for container {container_id} ifname {ifname} already exists: DEL the attachment first")]
    HostInterfaceExists {
        host: String,
        container_id: String,
        ifname: String,
    },
    #[error("IPAM returned no address for the pod")]
    NoAddress,
    /// `why` is serde's account of the value, part of the message (not a chained cause).
    #[error("dns {dns} is invalid: {why}")]
    InvalidDns {
        dns: serde_json::Value,
        why: serde_json::Error,
    },
}

impl AddError {
    pub fn cni_code(&self) -> u32 {
        match self {
            Self::InterfaceExists { .. } | Self::HostInterfaceExists { .. } => {
                code::INTERFACE_EXISTS
            }
            Self::IpamWithPrevResult | Self::NoAddress | Self::InvalidDns { .. } => {
                code::INVALID_CONFIG
            }
        }
    }
}

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
    // Everything that can be validated is, before anything changes.
    let ipam = Ipam::from_conf(conf)?.expect("a config with ipam is not chained");
    if conf.prev_result.is_some() {
        return Err(AddError::IpamWithPrevResult.into());
    }
    ipam.validate(env)?;
    bpf::kernel::require_for(conf.tc_attach_mode == TcAttachMode::Tcx)?;
    let pod_conf = PodConf::parse(conf, env)?;
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
        return Err(AddError::InterfaceExists {
            ifname: env.ifname.clone(),
            netns: netns_path.to_owned(),
        }
        .into());
    }
    let key = crate::attachment::key(conf, env);
    let host_name = veth::host_veth_name(&key);
    if host_nl.link_by_name(&host_name).await?.is_some() {
        return Err(AddError::HostInterfaceExists {
            host: host_name,
            container_id: env.container_id.clone(),
            ifname: env.ifname.clone(),
        }
        .into());
    }

    // Before this ADD's own allocation: the first ADD after a boot frees the addresses of
    // the pods the reboot took.
    crate::reboot::reclaim_leases(conf, &ipam, &host_nl, &node).await?;

    let cx = Request {
        env,
        conf,
        stdin,
        ipam: &ipam,
        host_nl: &host_nl,
        node: &node,
        key: &key,
        mac,
        pod_conf: &pod_conf,
        pod_ns: &pod_ns,
        pod_nl: &pod_nl,
        host_name: &host_name,
    };
    let mut undo = Vec::new();
    match setup(cx, &mut undo).await {
        Ok(v) => {
            crate::firewall::warn_once(&node);
            Ok(v)
        }
        Err(e) => {
            rollback(undo, cx).await;
            Err(e)
        }
    }
}

/// The request as ADD validated it before changing anything, and the handles on both
/// sides every step of ADD, and its undo, works with.
#[derive(Clone, Copy)]
struct Request<'a> {
    env: &'a CniEnv,
    conf: &'a NetConf,
    stdin: &'a [u8],
    ipam: &'a Ipam,
    host_nl: &'a Netlink,
    node: &'a NodeId,
    key: &'a AttachmentKey<'a>,
    /// The pod interface's MAC, if the request names one.
    mac: Option<[u8; 6]>,
    pod_conf: &'a PodConf,
    pod_ns: &'a Netns,
    pod_nl: &'a Netlink,
    host_name: &'a str,
}

/// ADD's steps after validation, in order, each registering its undo in `undo` as it
/// succeeds (or, for the gateways, as it tries): the IPAM allocation, the pod's
/// description, the gateways, the veth pair and its container side, the eBPF programs on
/// the host side while it is down, then the host side up, forwarding, and the result.
async fn setup(cx: Request<'_>, undo: &mut Vec<Undo>) -> Result<serde_json::Value, CniError> {
    let Request {
        env,
        conf,
        stdin,
        ipam,
        host_nl,
        pod_conf,
        pod_ns,
        pod_nl,
        ..
    } = cx;
    let t = std::time::Instant::now();
    let step =
        |what: &str| log::debug!("ADD step {what}: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let mut result: SuccessResult = ipam.add(conf, env, stdin)?;
    step("ipam");
    undo.push(Undo::Ipam);
    complete_allocation(conf, &mut result)?;
    let (addrs, pod_addrs) = pod_addresses(&result);
    // The pod's dataplane, before anything changes (its host ports against its addresses).
    // Whether another attachment of the node holds one of these addresses is asked once,
    // under the node lock (`bpf::add_pod`): a refusal there rolls back what came before, as
    // any failure does, and the common ADD opens the endpoint map once.
    let spec = pod_conf.pod_spec(&pod_addrs, pod_ns, false)?;

    let held = acquire_gateways(cx, &addrs, undo).await?;
    step("gateways");
    crate::test_hooks::hold_before_veth();
    let pair = create_veth(cx, &addrs, undo).await?;
    step("veth created");
    veth::configure_container(pod_nl, pair.container.index, &addrs, &result.routes).await?;
    step("container side");

    // The programs go on the host side while it is still down: the pod's first packet
    // meets them, and the kernel adds the clsact qdisc to a down device without
    // deactivating it (an expedited RCU grace period, RTNL held, when it is up).
    veth::add_host_gateways(host_nl, pair.host.index, &addrs).await?;
    let veth_ends = crate::attachment::veth(&pair.host, &pair.container)?;
    let view = node_view_with_gateways(cx, &addrs, &held).await?;
    step("devices listed");
    crate::host_ports::warn_taken_listeners(&spec.ports, &view.addrs);
    attach_programs(cx, &spec, &veth_ends, &view, undo)?;
    step("eBPF attached");

    veth::bring_up_host(host_nl, pair.host.index, &addrs).await?;
    step("host side");
    veth::await_container_side(pod_nl, pair.container.index).await?;
    step("pod side running");
    enable_forwarding(&addrs)?;
    crate::node::failpoint()?;

    name_interfaces(cx, &mut result, &pair);
    apply_config_dns(conf, &mut result)?;
    let mut out = result.to_json(conf.cni_version.as_str(), conf.cni_version.format());
    crate::source_check::add_to_result(&mut out, &spec.source_check(&veth_ends));
    Ok(out)
}

/// IPAM gave the pod an address, and with `isDefaultGateway` its default routes.
fn complete_allocation(conf: &NetConf, result: &mut SuccessResult) -> Result<(), AddError> {
    if result.ips.is_empty() {
        return Err(AddError::NoAddress);
    }
    if conf.is_default_gateway {
        add_default_routes(result);
    }
    Ok(())
}

/// The pod's addresses as the veth's configuration and as the pod's description take them.
fn pod_addresses(result: &SuccessResult) -> (Vec<PodAddress>, Vec<PodAddr>) {
    let addrs = result
        .ips
        .iter()
        .map(|ip| PodAddress {
            address: ip.address,
            gateway: ip.gateway,
        })
        .collect();
    let pod_addrs = result
        .ips
        .iter()
        .map(|ip| PodAddr {
            address: ip.address,
            gateway: ip.gateway,
            gateway4: crate::gateway::of_address(ip.address.ip(), ip.gateway),
        })
        .collect();
    (addrs, pod_addrs)
}

/// The pod's gateways recorded as used by this attachment (see `gateway::acquire`): the
/// IPv4 ones other attachments hold already are returned. Before the host routes, which
/// take the gateway as their source address. The undo step is registered whether or not
/// it succeeds, with what it created either way.
async fn acquire_gateways(
    cx: Request<'_>,
    addrs: &[PodAddress],
    undo: &mut Vec<Undo>,
) -> Result<Vec<std::net::Ipv4Addr>, CniError> {
    let mut created = Default::default();
    let acquired = crate::gateway::acquire(
        cx.host_nl,
        cx.node,
        cx.key.id(),
        &crate::gateway::ipv4(addrs.iter().map(|a| a.gateway)),
        &crate::gateway::ipv6(addrs.iter().map(|a| a.gateway)),
        &mut created,
    )
    .await;
    undo.push(Undo::Gateways(created));
    acquired
}

/// The veth pair, its container side created in the pod's namespace; its undo deletes the
/// host side (and the peer with it).
async fn create_veth(
    cx: Request<'_>,
    addrs: &[PodAddress],
    undo: &mut Vec<Undo>,
) -> Result<veth::VethPair, CniError> {
    let pair = veth::create(
        cx.host_nl,
        cx.pod_nl,
        cx.pod_ns,
        cx.host_name,
        &cx.env.ifname,
        cx.conf.mtu,
        cx.mac,
        addrs.iter().any(|a| a.address.is_ipv6()),
    )
    .await?;
    undo.push(Undo::HostLink {
        index: pair.host.index,
    });
    Ok(pair)
}

/// The node's devices and addresses the programs are attached against, with the IPv4
/// gateways other attachments hold (`held`) back on `lo` if they went missing.
async fn node_view_with_gateways(
    cx: Request<'_>,
    addrs: &[PodAddress],
    held: &[std::net::Ipv4Addr],
) -> Result<crate::bpf::NodeView, CniError> {
    let gateways: Vec<std::net::IpAddr> = addrs.iter().filter_map(|a| a.gateway).collect();
    let mut view = crate::node::node_view(cx.host_nl, cx.conf, &gateways).await?;
    crate::gateway::ensure_held(cx.host_nl, held, &mut view).await?;
    Ok(view)
}

/// The pod's dataplane installed and its programs attached to the host veth (see
/// `bpf::add_pod`). Its undo is registered before the attempt: a failed one may leave the
/// node's programs and maps, which `del_pod` removes with the node's last attachment.
fn attach_programs(
    cx: Request<'_>,
    spec: &crate::bpf::PodSpec,
    veth_ends: &crate::bpf::Veth,
    view: &crate::bpf::NodeView,
    undo: &mut Vec<Undo>,
) -> Result<(), CniError> {
    undo.push(Undo::Programs);
    bpf::add_pod(
        cx.node,
        cx.key,
        spec,
        veth_ends,
        view,
        crate::node::attach_modes(cx.conf, false).pod,
    )?;
    Ok(())
}

/// Forwarding on for each family the pod has an address in.
fn enable_forwarding(addrs: &[PodAddress]) -> Result<(), CniError> {
    if addrs.iter().any(|a| a.address.is_ipv4()) {
        write_sysctl("net.ipv4.ip_forward", "1")?;
    }
    if addrs.iter().any(|a| a.address.is_ipv6()) {
        write_sysctl("net.ipv6.conf.all.forwarding", "1")?;
    }
    Ok(())
}

/// The result names both ends of the pair, and gives every address to the pod's.
fn name_interfaces(cx: Request<'_>, result: &mut SuccessResult, pair: &veth::VethPair) {
    result.interfaces = vec![
        Interface {
            name: pair.host.name.clone(),
            mac: pair.host.mac.map(|m| format_mac(&m)).unwrap_or_default(),
            sandbox: String::new(),
        },
        Interface {
            name: cx.env.ifname.clone(),
            mac: pair
                .container
                .mac
                .map(|m| format_mac(&m))
                .unwrap_or_default(),
            sandbox: cx.pod_ns.path().display().to_string(),
        },
    ];
    for ip in &mut result.ips {
        ip.interface = Some(1);
    }
}

/// The config's dns wins when it says anything, as in the reference ptp; otherwise what
/// IPAM found (host-local's resolvConf) stays.
fn apply_config_dns(conf: &NetConf, result: &mut SuccessResult) -> Result<(), AddError> {
    if let Some(dns) = &conf.dns {
        match serde_json::from_value::<crate::cni::types::Dns>(dns.clone()) {
            Ok(d) if !d.is_empty() => result.dns = d,
            Ok(_) => {}
            Err(why) => {
                return Err(AddError::InvalidDns {
                    dns: dns.clone(),
                    why,
                })
            }
        }
    }
    Ok(())
}

async fn rollback(undo: Vec<Undo>, cx: Request<'_>) {
    let Request {
        env,
        conf,
        stdin,
        ipam,
        host_nl,
        node,
        key,
        ..
    } = cx;
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
            Undo::Ipam => ipam.del(conf, env, stdin).map_err(Into::into),
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

/// `isDefaultGateway`: a default route for each family the pod has a gateway in, unless
/// IPAM's routes have one (its gateway is then the address's, as for every route without
/// one).
fn add_default_routes(result: &mut SuccessResult) {
    use ipnetwork::IpNetwork;
    for v4 in [true, false] {
        let has_gateway = result
            .ips
            .iter()
            .any(|ip| ip.address.is_ipv4() == v4 && ip.gateway.is_some());
        let has_default = result
            .routes
            .iter()
            .any(|r| r.dst.is_ipv4() == v4 && r.dst.prefix() == 0);
        if has_gateway && !has_default {
            let dst = if v4 {
                IpNetwork::V4("0.0.0.0/0".parse().expect("a valid prefix"))
            } else {
                IpNetwork::V6("::/0".parse().expect("a valid prefix"))
            };
            result.routes.push(crate::cni::types::Route {
                dst,
                gw: None,
                options: Default::default(),
            });
        }
    }
}
