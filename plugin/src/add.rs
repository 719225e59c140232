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

async fn setup(cx: Request<'_>, undo: &mut Vec<Undo>) -> Result<serde_json::Value, CniError> {
    let Request {
        env,
        conf,
        stdin,
        ipam,
        host_nl,
        node,
        key,
        mac,
        pod_conf,
        pod_ns,
        pod_nl,
        host_name,
    } = cx;
    let t = std::time::Instant::now();
    let step =
        |what: &str| log::debug!("ADD step {what}: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let mut result: SuccessResult = ipam.add(conf, env, stdin)?;
    step("ipam");
    undo.push(Undo::Ipam);
    if result.ips.is_empty() {
        return Err(AddError::NoAddress.into());
    }
    if conf.is_default_gateway {
        add_default_routes(&mut result);
    }
    let addrs: Vec<PodAddress> = result
        .ips
        .iter()
        .map(|ip| PodAddress {
            address: ip.address,
            gateway: ip.gateway,
        })
        .collect();
    let pod_addrs: Vec<PodAddr> = result
        .ips
        .iter()
        .map(|ip| PodAddr {
            address: ip.address,
            gateway: ip.gateway,
            gateway4: crate::gateway::of_address(ip.address.ip(), ip.gateway),
        })
        .collect();
    // The pod's dataplane, before anything changes (its host ports against its addresses).
    // Whether another attachment of the node holds one of these addresses is asked once,
    // under the node lock (`bpf::add_pod`): a refusal there rolls back what came before, as
    // any failure does, and the common ADD opens the endpoint map once.
    let spec = pod_conf.pod_spec(&pod_addrs, pod_ns, false)?;

    // Before the host routes, which take the gateway as their source address. The undo
    // step is registered whether or not it succeeds, with what it created either way.
    let mut created = Default::default();
    let acquired = crate::gateway::acquire(
        host_nl,
        node,
        key.id(),
        &crate::gateway::ipv4(addrs.iter().map(|a| a.gateway)),
        &crate::gateway::ipv6(addrs.iter().map(|a| a.gateway)),
        &mut created,
    )
    .await;
    undo.push(Undo::Gateways(created));
    let held = acquired?;
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

    // The programs go on the host side while it is still down: the pod's first packet
    // meets them, and the kernel adds the clsact qdisc to a down device without
    // deactivating it (an expedited RCU grace period, RTNL held, when it is up).
    veth::add_host_gateways(host_nl, pair.host.index, &addrs).await?;
    let veth_ends = crate::attachment::veth(&pair.host, &pair.container)?;
    let gateways: Vec<std::net::IpAddr> = addrs.iter().filter_map(|a| a.gateway).collect();
    let mut view = crate::node::node_view(host_nl, conf, &gateways).await?;
    crate::gateway::ensure_held(host_nl, &held, &mut view).await?;
    step("devices listed");
    crate::portmap::warn_taken_listeners(&spec.ports, &view.addrs);
    undo.push(Undo::Programs);
    bpf::add_pod(
        node,
        key,
        &spec,
        &veth_ends,
        &view,
        crate::node::attach_modes(conf, false).pod,
    )?;
    step("eBPF attached");

    veth::bring_up_host(host_nl, pair.host.index, &addrs).await?;
    step("host side");
    veth::await_container_side(pod_nl, pair.container.index).await?;
    step("pod side running");
    if addrs.iter().any(|a| a.address.is_ipv4()) {
        write_sysctl("net.ipv4.ip_forward", "1")?;
    }
    if addrs.iter().any(|a| a.address.is_ipv6()) {
        write_sysctl("net.ipv6.conf.all.forwarding", "1")?;
    }
    crate::node::failpoint()?;

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
            Err(why) => {
                return Err(AddError::InvalidDns {
                    dns: dns.clone(),
                    why,
                }
                .into())
            }
        }
    }
    let mut out = result.to_json(conf.cni_version.as_str(), conf.cni_version.format());
    crate::source_check::add_to_result(&mut out, &spec.source_check(&veth_ends));
    Ok(out)
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
