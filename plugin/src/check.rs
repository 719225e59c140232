//! CHECK: proves, against `prevResult`, that the attachment ADD made is still there and
//! right: both veth ends, the pod's addresses and routes, the host routes, the IPAM
//! reservation and the eBPF attachment. The first discrepancy is reported by name.

use std::net::{IpAddr, Ipv4Addr};

use ipnetwork::IpNetwork;

use crate::{
    attachment::{CheckError, PodAddr, PodConf},
    bpf::{self, AttachMode, AttachmentKey, Hook, NodeId, PodSpec, Veth},
    cni::{
        config::NetConf,
        env::CniEnv,
        types::{Interface, IpConfig, Route, SuccessResult},
        CniError,
    },
    ipam::backend::Ipam,
    netlink::{format_mac, Link, Netlink, RouteEntry},
    netns::Netns,
    veth,
};

/// The checks, in order: the container interface in `prevResult`, the host veth, the
/// pod's interface, addresses and routes, the host's gateways and routes, the IPAM
/// reservation, then the eBPF dataplane. The first that fails is the finding.
pub async fn check(env: &CniEnv, conf: &NetConf, stdin: &[u8]) -> Result<(), CniError> {
    let prev = prev_result(conf)?;
    let netns_path = env
        .netns
        .as_deref()
        .expect("env validation requires CNI_NETNS for CHECK");
    let sandbox = netns_path.display().to_string();
    let cont_idx = container_in_prev_result(&prev, &env.ifname, &sandbox)?;

    let host_nl = Netlink::connect()?;
    let key = crate::attachment::key(conf, env);
    let host_name = veth::host_veth_name(&key);
    let host = host_veth_up(&host_nl, &host_name).await?;

    let pod_ns = Netns::open(netns_path)?;
    let pod_nl = Netlink::connect_in(&pod_ns)?;
    let pod = PodSide {
        nl: &pod_nl,
        ifname: &env.ifname,
        sandbox: &sandbox,
    };
    let cont = pod
        .interface_as_recorded(&prev.interfaces[cont_idx])
        .await?;
    let ips = ips_of_interface(&prev, cont_idx);
    pod.addresses_present(&cont, &ips).await?;
    let pod_routes = RouteTables::read(&pod_nl).await?;
    pod.gateway_routes_present(&pod_routes, &cont, &ips)?;
    pod.routes_present(&pod_routes, &prev.routes, &ips).await?;

    // The gateways before the host routes: without the IPv4 one the kernel drops the routes
    // that use it as their source, and the message should name the cause.
    let on_veth = host_nl.addresses(host.index).await?;
    ipv6_gateways_on_host_veth(&ips, &on_veth, &host_name)?;
    ipv4_gateways_held(&host_nl, &key, &ips, &on_veth).await?;
    host_routes_present(&host_nl, &host, &host_name, &ips).await?;

    ipam_reservation_held(conf, env, stdin, &ips)?;

    bpf::ensure_bpffs()?;
    let node = NodeId::current()?;
    let spec = wanted_pod_spec(conf, env, &ips, &on_veth, &pod_ns)?;
    let veth = crate::attachment::veth(&host, &cont)?;
    source_check_as_in_result(conf, &spec, &veth)?;
    dataplane_present(&host_nl, &host, conf, &node, &key, &spec, &veth).await
}

/// `prevResult`, which CHECK requires, decoded.
fn prev_result(conf: &NetConf) -> Result<SuccessResult, CniError> {
    let prev = conf.prev_result.as_ref().ok_or(CheckError::NoPrevResult)?;
    Ok(SuccessResult::from_json(prev, "prevResult")?)
}

/// `prevResult` lists the container interface `ifname` in `sandbox`: its index there.
fn container_in_prev_result(
    prev: &SuccessResult,
    ifname: &str,
    sandbox: &str,
) -> Result<usize, CheckError> {
    prev.interfaces
        .iter()
        .position(|i| i.name == ifname && i.sandbox == sandbox)
        .ok_or_else(|| CheckError::NotInPrevResult {
            ifname: ifname.to_owned(),
            sandbox: sandbox.to_owned(),
        })
}

/// The host veth exists and is up.
async fn host_veth_up(host_nl: &Netlink, host_name: &str) -> Result<Link, CniError> {
    let host =
        host_nl
            .link_by_name(host_name)
            .await?
            .ok_or_else(|| CheckError::HostVethMissing {
                host: host_name.to_owned(),
            })?;
    if !host.up {
        return Err(CheckError::HostVethDown {
            host: host_name.to_owned(),
        }
        .into());
    }
    Ok(host)
}

/// The addresses `prevResult` gives the container interface (those naming no interface
/// included).
fn ips_of_interface(prev: &SuccessResult, cont_idx: usize) -> Vec<&IpConfig> {
    prev.ips
        .iter()
        .filter(|ip| ip.interface.is_none_or(|i| i == cont_idx))
        .collect()
}

/// The pod's namespace as CHECK reads it, and the names its findings give.
struct PodSide<'a> {
    nl: &'a Netlink,
    ifname: &'a str,
    sandbox: &'a str,
}

impl PodSide<'_> {
    /// The container interface exists with `prevResult`'s MAC (where both say one) and is
    /// up.
    async fn interface_as_recorded(&self, expected: &Interface) -> Result<Link, CniError> {
        let cont = self.nl.link_by_name(self.ifname).await?.ok_or_else(|| {
            CheckError::InterfaceMissing {
                ifname: self.ifname.to_owned(),
                sandbox: self.sandbox.to_owned(),
            }
        })?;
        if let (Some(mac), false) = (cont.mac, expected.mac.is_empty()) {
            if !format_mac(&mac).eq_ignore_ascii_case(&expected.mac) {
                return Err(CheckError::WrongMac {
                    ifname: self.ifname.to_owned(),
                    mac: format_mac(&mac),
                    expected: expected.mac.clone(),
                }
                .into());
            }
        }
        if !cont.up {
            return Err(CheckError::InterfaceDown {
                ifname: self.ifname.to_owned(),
                sandbox: self.sandbox.to_owned(),
            }
            .into());
        }
        Ok(cont)
    }

    /// Each of `ips` is on the container interface, with its prefix.
    async fn addresses_present(&self, cont: &Link, ips: &[&IpConfig]) -> Result<(), CniError> {
        let have = self.nl.addresses(cont.index).await?;
        for ip in ips {
            if !have
                .iter()
                .any(|a| a.ip() == ip.address.ip() && a.prefix() == ip.address.prefix())
            {
                return Err(CheckError::AddressMissing {
                    address: ip.address,
                    ifname: self.ifname.to_owned(),
                    sandbox: self.sandbox.to_owned(),
                }
                .into());
            }
        }
        Ok(())
    }

    /// Each gateway of `ips` has its on-link route through the container interface.
    fn gateway_routes_present(
        &self,
        routes: &RouteTables,
        cont: &Link,
        ips: &[&IpConfig],
    ) -> Result<(), CheckError> {
        for gw in ips.iter().filter_map(|ip| ip.gateway) {
            let on_link = host_route(gw);
            if !routes
                .of_family(gw.is_ipv4())
                .iter()
                .any(|r| r.dst == on_link && r.oif == Some(cont.index))
            {
                return Err(CheckError::GatewayRouteMissing {
                    gw,
                    ifname: self.ifname.to_owned(),
                    sandbox: self.sandbox.to_owned(),
                });
            }
        }
        Ok(())
    }

    /// Each of `prevResult`'s routes is in the pod's table (its own, for a route with a
    /// `table`), through its gateway or else its family's address's.
    async fn routes_present(
        &self,
        main: &RouteTables,
        routes: &[Route],
        ips: &[&IpConfig],
    ) -> Result<(), CniError> {
        for r in routes {
            let gw = r.gw.or_else(|| {
                ips.iter()
                    .find(|i| i.address.is_ipv4() == r.dst.is_ipv4())
                    .and_then(|i| i.gateway)
            });
            // A route of another table (CNI 1.1's `table`) is looked for there.
            let other_table = match r.options.table {
                Some(t) => Some(self.nl.routes_in(r.dst.is_ipv6(), t).await?),
                None => None,
            };
            let found = other_table
                .as_deref()
                .unwrap_or_else(|| main.of_family(r.dst.is_ipv4()))
                .iter()
                .any(|e: &RouteEntry| same_net(e.dst, r.dst) && (gw.is_none() || e.gw == gw));
            if !found {
                return Err(CheckError::RouteMissing {
                    dst: r.dst,
                    gw,
                    sandbox: self.sandbox.to_owned(),
                }
                .into());
            }
        }
        Ok(())
    }
}

/// A namespace's main routing tables, IPv4 and IPv6, read once.
struct RouteTables {
    v4: Vec<RouteEntry>,
    v6: Vec<RouteEntry>,
}

impl RouteTables {
    /// Reads the IPv4 table, then the IPv6 one.
    async fn read(nl: &Netlink) -> Result<Self, CniError> {
        Ok(Self {
            v4: nl.routes(false).await?,
            v6: nl.routes(true).await?,
        })
    }

    fn of_family(&self, v4: bool) -> &[RouteEntry] {
        if v4 {
            &self.v4
        } else {
            &self.v6
        }
    }
}

/// The pod's IPv6 gateways are on the host veth (without one the kernel keeps the route,
/// and the pod loses its way out: its neighbour discovery for the gateway goes unanswered).
fn ipv6_gateways_on_host_veth(
    ips: &[&IpConfig],
    on_veth: &[IpNetwork],
    host_name: &str,
) -> Result<(), CheckError> {
    match ips
        .iter()
        .filter_map(|i| i.gateway.filter(IpAddr::is_ipv6))
        .find(|gw| !on_veth.contains(&host_route(*gw)))
    {
        Some(gw) => Err(CheckError::HostGatewayMissing {
            gw,
            host: host_name.to_owned(),
        }),
        None => Ok(()),
    }
}

/// The node holds the pod's IPv4 gateways on `lo`, recorded as used by this attachment
/// (see `gateway::check`).
async fn ipv4_gateways_held(
    host_nl: &Netlink,
    key: &AttachmentKey<'_>,
    ips: &[&IpConfig],
    on_veth: &[IpNetwork],
) -> Result<(), CniError> {
    crate::gateway::check(
        host_nl,
        &NodeId::current()?,
        key.id(),
        &crate::gateway::ipv4(ips.iter().map(|i| gateway4(i, on_veth).map(IpAddr::V4))),
    )
    .await
}

/// The IPv4 gateway of `ip` that the node holds on `lo`. A pod attached by an earlier
/// release holds it on the host veth instead (and its endpoint entries name no gateway):
/// that layout is still correct, and has none.
fn gateway4(ip: &IpConfig, on_veth: &[IpNetwork]) -> Option<Ipv4Addr> {
    crate::gateway::of_address(ip.address.ip(), ip.gateway)
        .filter(|g| !on_veth.contains(&host_route(IpAddr::V4(*g))))
}

/// Each of `ips` has its host route through the host veth in the node's namespace.
async fn host_routes_present(
    host_nl: &Netlink,
    host: &Link,
    host_name: &str,
    ips: &[&IpConfig],
) -> Result<(), CniError> {
    let node_routes = RouteTables::read(host_nl).await?;
    for ip in ips {
        let dst = host_route(ip.address.ip());
        if !node_routes
            .of_family(ip.address.is_ipv4())
            .iter()
            .any(|r| r.dst == dst && r.oif == Some(host.index))
        {
            return Err(CheckError::HostRouteMissing {
                dst,
                host: host_name.to_owned(),
            }
            .into());
        }
    }
    Ok(())
}

/// The IPAM plugin, if the config has one, still reserves `ips` for this attachment.
fn ipam_reservation_held(
    conf: &NetConf,
    env: &CniEnv,
    stdin: &[u8],
    ips: &[&IpConfig],
) -> Result<(), CniError> {
    if let Some(ipam) = Ipam::from_conf(conf)? {
        let addrs: Vec<IpAddr> = ips.iter().map(|i| i.address.ip()).collect();
        ipam.check(conf, env, stdin, &addrs)?;
    }
    Ok(())
}

/// The pod's dataplane as ADD described it, from `ips` and the request's capability
/// arguments.
fn wanted_pod_spec(
    conf: &NetConf,
    env: &CniEnv,
    ips: &[&IpConfig],
    on_veth: &[IpNetwork],
    pod_ns: &Netns,
) -> Result<PodSpec, CniError> {
    let addrs: Vec<PodAddr> = ips
        .iter()
        .map(|i| PodAddr {
            address: i.address,
            gateway: i.gateway,
            gateway4: gateway4(i, on_veth),
        })
        .collect();
    PodConf::parse(conf, env)?.pod_spec(&addrs, pod_ns, false)
}

/// The source check `prevResult` reports (if it reports one) is the one `spec` installs.
fn source_check_as_in_result(conf: &NetConf, spec: &PodSpec, veth: &Veth) -> Result<(), CniError> {
    if let Some(prev) = &conf.prev_result {
        crate::source_check::check_result(prev, &spec.source_check(veth))?;
    }
    Ok(())
}

/// The kernel holds what `spec` describes (see `bpf::check_pod`), and in netlink mode the
/// host veth has the pod programs' filters.
async fn dataplane_present(
    host_nl: &Netlink,
    host: &Link,
    conf: &NetConf,
    node: &NodeId,
    key: &AttachmentKey<'_>,
    spec: &PodSpec,
    veth: &Veth,
) -> Result<(), CniError> {
    let mode = crate::node::attach_modes(conf, false).pod;
    bpf::check_pod(node, key, spec, veth, mode).map_err(crate::attachment::dataplane_failed)?;
    if mode == AttachMode::Netlink {
        crate::attachment::netlink_filters(host_nl, host, Hook::pod(false)).await?;
    }
    Ok(())
}

fn host_route(ip: IpAddr) -> IpNetwork {
    IpNetwork::new(ip, if ip.is_ipv4() { 32 } else { 128 }).expect("full-length prefix is valid")
}

fn same_net(a: IpNetwork, b: IpNetwork) -> bool {
    a.prefix() == b.prefix() && a.network() == b.network()
}
