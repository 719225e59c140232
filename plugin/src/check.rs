//! CHECK: proves, against `prevResult`, that the attachment ADD made is still there and
//! right: both veth ends, the pod's addresses and routes, the host routes, the IPAM
//! reservation and the eBPF attachment. The first discrepancy is reported by name.

use std::net::IpAddr;

use ipnetwork::IpNetwork;

use crate::{
    attachment::{CheckError, PodAddr, PodConf},
    bpf::{self, AttachMode, Hook, NodeId},
    cni::{config::NetConf, env::CniEnv, types::SuccessResult, CniError},
    ipam::backend::Ipam,
    netlink::{format_mac, Netlink, RouteEntry},
    netns::Netns,
    veth,
};

pub async fn check(env: &CniEnv, conf: &NetConf, stdin: &[u8]) -> Result<(), CniError> {
    let prev = conf.prev_result.as_ref().ok_or(CheckError::NoPrevResult)?;
    let prev = SuccessResult::from_json(prev, "prevResult")?;
    let netns_path = env
        .netns
        .as_deref()
        .expect("env validation requires CNI_NETNS for CHECK");
    let sandbox = netns_path.display().to_string();

    let cont_idx = prev
        .interfaces
        .iter()
        .position(|i| i.name == env.ifname && i.sandbox == sandbox)
        .ok_or_else(|| CheckError::NotInPrevResult {
            ifname: env.ifname.clone(),
            sandbox: sandbox.clone(),
        })?;
    let expected_cont = &prev.interfaces[cont_idx];

    let host_nl = Netlink::connect()?;
    let key = crate::attachment::key(conf, env);
    let host_name = veth::host_veth_name(&key);
    let host =
        host_nl
            .link_by_name(&host_name)
            .await?
            .ok_or_else(|| CheckError::HostVethMissing {
                host: host_name.clone(),
            })?;
    if !host.up {
        return Err(CheckError::HostVethDown { host: host_name }.into());
    }

    let pod_ns = Netns::open(netns_path)?;
    let pod_nl = Netlink::connect_in(&pod_ns)?;
    let cont =
        pod_nl
            .link_by_name(&env.ifname)
            .await?
            .ok_or_else(|| CheckError::InterfaceMissing {
                ifname: env.ifname.clone(),
                sandbox: sandbox.clone(),
            })?;
    if let (Some(mac), false) = (cont.mac, expected_cont.mac.is_empty()) {
        if !format_mac(&mac).eq_ignore_ascii_case(&expected_cont.mac) {
            return Err(CheckError::WrongMac {
                ifname: env.ifname.clone(),
                mac: format_mac(&mac),
                expected: expected_cont.mac.clone(),
            }
            .into());
        }
    }
    if !cont.up {
        return Err(CheckError::InterfaceDown {
            ifname: env.ifname.clone(),
            sandbox,
        }
        .into());
    }

    let have = pod_nl.addresses(cont.index).await?;
    let ips: Vec<_> = prev
        .ips
        .iter()
        .filter(|ip| ip.interface.is_none_or(|i| i == cont_idx))
        .collect();
    for ip in &ips {
        if !have
            .iter()
            .any(|a| a.ip() == ip.address.ip() && a.prefix() == ip.address.prefix())
        {
            return Err(CheckError::AddressMissing {
                address: ip.address,
                ifname: env.ifname.clone(),
                sandbox,
            }
            .into());
        }
    }

    let (pod_v4, pod_v6) = (pod_nl.routes(false).await?, pod_nl.routes(true).await?);
    let pod_routes = |v4: bool| if v4 { &pod_v4 } else { &pod_v6 };
    for ip in &ips {
        if let Some(gw) = ip.gateway {
            let on_link = host_route(gw);
            if !pod_routes(gw.is_ipv4())
                .iter()
                .any(|r| r.dst == on_link && r.oif == Some(cont.index))
            {
                return Err(CheckError::GatewayRouteMissing {
                    gw,
                    ifname: env.ifname.clone(),
                    sandbox,
                }
                .into());
            }
        }
    }
    for r in &prev.routes {
        let gw = r.gw.or_else(|| {
            ips.iter()
                .find(|i| i.address.is_ipv4() == r.dst.is_ipv4())
                .and_then(|i| i.gateway)
        });
        // A route of another table (CNI 1.1's `table`) is looked for there.
        let other_table = match r.options.table {
            Some(t) => Some(pod_nl.routes_in(r.dst.is_ipv6(), t).await?),
            None => None,
        };
        let found = other_table
            .as_ref()
            .unwrap_or_else(|| pod_routes(r.dst.is_ipv4()))
            .iter()
            .any(|e: &RouteEntry| same_net(e.dst, r.dst) && (gw.is_none() || e.gw == gw));
        if !found {
            return Err(CheckError::RouteMissing {
                dst: r.dst,
                gw,
                sandbox,
            }
            .into());
        }
    }

    // The gateways before the host routes: without the IPv4 one the kernel drops the routes
    // that use it as their source, and the message should name the cause. The IPv6 gateway
    // is on the host veth (without it the kernel keeps the route, and the pod loses its
    // way out: its neighbour discovery for the gateway goes unanswered). A pod attached by an
    // earlier release holds its IPv4 gateway on the host veth instead (and its endpoint
    // entries name no gateway): that layout is still correct.
    let on_veth = host_nl.addresses(host.index).await?;
    let on_host_veth = |gw: IpAddr| on_veth.contains(&host_route(gw));
    if let Some(gw) = ips
        .iter()
        .filter_map(|i| i.gateway.filter(IpAddr::is_ipv6))
        .find(|gw| !on_host_veth(*gw))
    {
        return Err(CheckError::HostGatewayMissing {
            gw,
            host: host_name,
        }
        .into());
    }
    let gateway4 = |i: &&crate::cni::types::IpConfig| {
        crate::gateway::of_address(i.address.ip(), i.gateway)
            .filter(|g| !on_host_veth(IpAddr::V4(*g)))
    };
    crate::gateway::check(
        &host_nl,
        &NodeId::current()?,
        key.id(),
        &crate::gateway::ipv4(ips.iter().map(|i| gateway4(i).map(IpAddr::V4))),
    )
    .await?;
    let (node_v4, node_v6) = (host_nl.routes(false).await?, host_nl.routes(true).await?);
    for ip in &ips {
        let dst = host_route(ip.address.ip());
        let table = if ip.address.is_ipv4() {
            &node_v4
        } else {
            &node_v6
        };
        if !table
            .iter()
            .any(|r| r.dst == dst && r.oif == Some(host.index))
        {
            return Err(CheckError::HostRouteMissing {
                dst,
                host: host_name,
            }
            .into());
        }
    }

    if let Some(ipam) = Ipam::from_conf(conf)? {
        let addrs: Vec<IpAddr> = ips.iter().map(|i| i.address.ip()).collect();
        ipam.check(conf, env, stdin, &addrs)?;
    }

    bpf::ensure_bpffs()?;
    let node = NodeId::current()?;
    let addrs: Vec<PodAddr> = ips
        .iter()
        .map(|i| PodAddr {
            address: i.address,
            gateway: i.gateway,
            gateway4: gateway4(i),
        })
        .collect();
    let spec = PodConf::parse(conf, env)?.pod_spec(&addrs, &pod_ns, false)?;
    let veth = crate::attachment::veth(&host, &cont)?;
    if let Some(prev) = &conf.prev_result {
        crate::source_check::check_result(prev, &spec.source_check(&veth))?;
    }
    let mode = crate::node::attach_modes(conf, false).pod;
    bpf::check_pod(&node, &key, &spec, &veth, mode).map_err(crate::attachment::dataplane_failed)?;
    if mode == AttachMode::Netlink {
        crate::attachment::netlink_filters(&host_nl, &host, Hook::pod(false)).await?;
    }
    Ok(())
}

fn host_route(ip: IpAddr) -> IpNetwork {
    IpNetwork::new(ip, if ip.is_ipv4() { 32 } else { 128 }).expect("full-length prefix is valid")
}

fn same_net(a: IpNetwork, b: IpNetwork) -> bool {
    a.prefix() == b.prefix() && a.network() == b.network()
}
