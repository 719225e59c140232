//! Direct routes to the peers' pod subnets: a kernel route `<subnet> via <peer's node
//! address>` where a route without a gateway covers that address (the peer is on one of the
//! node's links), which the programs' FIB path then forwards pods' packets by. The routes
//! carry their own protocol number ([`ROUTE_PROTOCOL`]), so each pass compares the kernel's
//! routes of that protocol with the members and changes only the difference: a member
//! added, gone, re-added or given a new address, and an agent restarted, are one code path.
//! A peer whose address only a gateway reaches goes through the tunnel (`super::tunnel`)
//! in modes `auto` and `overlay`: `<subnet> via <peer's node address> dev ecni-vxlan
//! onlink`, whose gateway the programs' maps take as the tunnel's remote; in mode `direct`
//! it is reported and gets no route.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnetwork::IpNetwork;

use super::network::{MemberRecord, Mode};
use crate::bpf::tunnel::{v6_gateway, ROUTE_PROTOCOL};
use crate::netlink::{Netlink, NetlinkError, RouteEntry};

/// The cluster's members as the source lists them: each subnet with its holder.
pub type Members = BTreeMap<IpNetwork, MemberRecord>;

/// The route one peer subnet should have, or why it has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    Direct {
        dst: IpNetwork,
        via: IpAddr,
        oif: u32,
    },
    /// Through the tunnel device `oif`, the peer's node address as the gateway.
    Tunnel {
        dst: IpNetwork,
        via: IpAddr,
        oif: u32,
    },
    /// Only a gateway reaches the peer (or it has no address of the subnet's family).
    Unreachable {
        dst: IpNetwork,
        node: String,
        why: String,
    },
}

/// Where the node's peers may be reached besides directly: the mode and the tunnel
/// device's index (none in mode `direct`, or while it cannot be made).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
    pub mode: Mode,
    pub tunnel: Option<u32>,
}

/// What each peer subnet gets, given the node's own name and its main table's routes
/// (those of [`ROUTE_PROTOCOL`] left out: a route to a peer never makes another direct).
pub fn plan(members: &Members, own: &str, routes: &[RouteEntry], reach: Reach) -> Vec<Plan> {
    let own_record = members.values().find(|r| r.node == own);
    let own_v4 = own_record.is_some_and(|r| r.public_ip.is_some());
    let own_v6 = own_record.is_some_and(|r| r.public_ipv6.is_some());
    members
        .iter()
        .filter(|(_, r)| r.node != own)
        .map(|(dst, r)| {
            // The tunnel's underlay: IPv4 unless only IPv6 is common to both nodes. Over
            // IPv4, an IPv6 subnet's route names the peer's node address in `v6_gateway`'s
            // form; over IPv6, an IPv4 subnet's route goes via the IPv6 address (RFC 5549).
            let underlay = match (r.public_ip, r.public_ipv6) {
                (Some(v4), _) if own_v4 || !own_v6 => Some(IpAddr::V4(v4)),
                (_, Some(v6)) if own_v6 => Some(IpAddr::V6(v6)),
                (Some(v4), _) => Some(IpAddr::V4(v4)),
                (None, v6) => v6.map(IpAddr::V6),
            };
            let tunnel = |why: String| match (reach.mode, reach.tunnel, underlay) {
                (Mode::Auto | Mode::Overlay, Some(oif), Some(node)) => Plan::Tunnel {
                    dst: *dst,
                    via: match node {
                        IpAddr::V4(v4) if !dst.is_ipv4() => IpAddr::V6(v6_gateway(v4)),
                        node => node,
                    },
                    oif,
                },
                (Mode::Direct, ..) => Plan::Unreachable {
                    dst: *dst,
                    node: r.node.clone(),
                    why,
                },
                (_, None, _) => Plan::Unreachable {
                    dst: *dst,
                    node: r.node.clone(),
                    why: format!("{why}, and the tunnel device is not up"),
                },
                (_, _, None) => Plan::Unreachable {
                    dst: *dst,
                    node: r.node.clone(),
                    why: format!("{why}, and the node has no address for the tunnel"),
                },
            };
            if reach.mode == Mode::Overlay {
                return tunnel("mode overlay".to_owned());
            }
            let via: Option<IpAddr> = if dst.is_ipv4() {
                r.public_ip.map(IpAddr::V4)
            } else {
                r.public_ipv6.map(IpAddr::V6)
            };
            let Some(via) = via else {
                return tunnel(format!(
                    "node {} has no {} address",
                    r.node,
                    if dst.is_ipv4() { "IPv4" } else { "IPv6" }
                ));
            };
            match covering(routes, via) {
                Some(RouteEntry {
                    gw: None,
                    oif: Some(oif),
                    ..
                }) => Plan::Direct {
                    dst: *dst,
                    via,
                    oif: *oif,
                },
                Some(RouteEntry { gw: Some(gw), .. }) => tunnel(format!(
                    "its address {via} is reached through the gateway {gw}"
                )),
                _ => tunnel(format!("no route covers its address {via}")),
            }
        })
        .collect()
}

/// The longest-prefix route of `routes` covering `addr` (peer routes left out).
fn covering(routes: &[RouteEntry], addr: IpAddr) -> Option<&RouteEntry> {
    routes
        .iter()
        .filter(|r| r.protocol != ROUTE_PROTOCOL && r.dst.contains(addr))
        .max_by_key(|r| r.dst.prefix())
}

/// What a pass changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub added: Vec<IpNetwork>,
    /// Of `added`, those through the tunnel.
    pub tunneled: Vec<IpNetwork>,
    pub removed: Vec<IpNetwork>,
    pub unreachable: Vec<(IpNetwork, String, String)>,
}

/// Brings the kernel's peer routes in line with `members`: each missing or different one
/// written, each one of no member (or of an unreachable one) deleted.
pub async fn reconcile(
    nl: &Netlink,
    members: &Members,
    own: &str,
    reach: Reach,
) -> Result<Outcome, NetlinkError> {
    let mut routes = nl.routes(false).await?;
    routes.extend(nl.routes(true).await?);
    let mut out = Outcome::default();
    let mut failed = Vec::new();
    let plans = plan(members, own, &routes, reach);
    for p in &plans {
        match p {
            Plan::Direct { dst, via, oif } | Plan::Tunnel { dst, via, oif } => {
                let have = routes.iter().any(|r| {
                    r.protocol == ROUTE_PROTOCOL
                        && r.dst == *dst
                        && r.gw == Some(*via)
                        && r.oif == Some(*oif)
                });
                if !have {
                    let tunneled = matches!(p, Plan::Tunnel { .. });
                    match nl
                        .replace_owned_route(*dst, *via, *oif, ROUTE_PROTOCOL, tunneled)
                        .await
                    {
                        Ok(()) => {
                            out.added.push(*dst);
                            if tunneled {
                                out.tunneled.push(*dst);
                            }
                        }
                        // The kernel refuses this one route (an IPv6 gateway `onlink` that
                        // a route other than the default covers): reported, the others
                        // written.
                        Err(e) if e.errno() == Some(libc::EINVAL) => {
                            let node = members.get(dst).map(|m| m.node.clone());
                            out.unreachable.push((
                                *dst,
                                node.unwrap_or_default(),
                                refused_why(*via, tunneled),
                            ));
                            failed.push(*dst);
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            Plan::Unreachable { dst, node, why } => {
                out.unreachable.push((*dst, node.clone(), why.clone()));
            }
        }
    }
    let wanted: Vec<IpNetwork> = plans
        .iter()
        .filter_map(|p| match p {
            Plan::Direct { dst, .. } | Plan::Tunnel { dst, .. } => Some(*dst),
            Plan::Unreachable { .. } => None,
        })
        .filter(|dst| !failed.contains(dst))
        .collect();
    for r in routes.iter().filter(|r| r.protocol == ROUTE_PROTOCOL) {
        if !wanted.contains(&r.dst) && nl.delete_owned_route(r.dst, ROUTE_PROTOCOL).await? {
            out.removed.push(r.dst);
        }
    }
    Ok(out)
}

/// Why the kernel refused a peer route via `via`.
fn refused_why(via: IpAddr, tunneled: bool) -> String {
    if tunneled && via.is_ipv6() {
        format!(
            "the kernel refuses a route through the tunnel via {via}: a route other than the \
             default covers that address (IPv6 allows an onlink gateway only where no other \
             route does)"
        )
    } else {
        format!("the kernel refuses a route via {via}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(dst: &str, gw: Option<&str>, oif: u32, protocol: u8) -> RouteEntry {
        RouteEntry {
            dst: dst.parse().unwrap(),
            gw: gw.map(|g| g.parse().unwrap()),
            oif: Some(oif),
            scope_link: gw.is_none(),
            protocol,
        }
    }

    fn member(node: &str, v4: Option<&str>) -> MemberRecord {
        MemberRecord {
            node: node.into(),
            public_ip: v4.map(|a| a.parse().unwrap()),
            public_ipv6: None,
        }
    }

    #[test]
    fn the_tunnel_goes_over_ipv6_only_where_both_nodes_lack_ipv4() {
        let routes = vec![route("::/0", Some("fd00:250::fe"), 2, 3)];
        let v6 = |node: &str, v4: Option<&str>, v6: &str| MemberRecord {
            node: node.into(),
            public_ip: v4.map(|a| a.parse().unwrap()),
            public_ipv6: Some(v6.parse().unwrap()),
        };
        let members: Members = [
            ("10.244.1.0/24", v6("self", None, "fd00:250::1")),
            ("10.244.2.0/24", v6("c", None, "fd00:251:3::2")),
            ("fd00:10:244:2::/64", v6("c", None, "fd00:251:3::2")),
            ("10.244.3.0/24", v6("d", Some("10.9.0.7"), "fd00:251:4::2")),
        ]
        .into_iter()
        .map(|(k, v)| (k.parse().unwrap(), v))
        .collect();
        let auto = Reach {
            mode: Mode::Auto,
            tunnel: Some(9),
        };
        let plans = plan(&members, "self", &routes, auto);
        // Both families of c via its IPv6 address (the IPv4 subnet's route RFC 5549's).
        for dst in ["10.244.2.0/24", "fd00:10:244:2::/64"] {
            assert!(
                plans.contains(&Plan::Tunnel {
                    dst: dst.parse().unwrap(),
                    via: "fd00:251:3::2".parse().unwrap(),
                    oif: 9
                }),
                "{dst}: {plans:?}"
            );
        }
        // A node without IPv4 of its own reaches a dual-stack peer over IPv6 too.
        assert!(plans.contains(&Plan::Tunnel {
            dst: "10.244.3.0/24".parse().unwrap(),
            via: "fd00:251:4::2".parse().unwrap(),
            oif: 9
        }));
    }

    #[test]
    fn peers_on_a_link_get_direct_routes_and_the_rest_are_reported() {
        let routes = vec![
            route("0.0.0.0/0", Some("192.168.1.1"), 2, 3),
            route("192.168.1.0/24", None, 2, 2),
            // A peer route never makes another peer direct.
            route("10.9.0.0/16", None, 3, ROUTE_PROTOCOL),
        ];
        let mut members = Members::new();
        members.insert(
            "10.244.1.0/24".parse().unwrap(),
            member("self", Some("192.168.1.5")),
        );
        members.insert(
            "10.244.2.0/24".parse().unwrap(),
            member("b", Some("192.168.1.6")),
        );
        members.insert(
            "10.244.3.0/24".parse().unwrap(),
            member("c", Some("10.9.0.7")),
        );
        members.insert(
            "fd00:10:244:2::/64".parse().unwrap(),
            member("b", Some("192.168.1.6")),
        );
        let direct = Reach {
            mode: Mode::Direct,
            tunnel: None,
        };
        let plans = plan(&members, "self", &routes, direct);
        assert_eq!(plans.len(), 3, "{plans:?}");
        assert!(plans.contains(&Plan::Direct {
            dst: "10.244.2.0/24".parse().unwrap(),
            via: "192.168.1.6".parse().unwrap(),
            oif: 2
        }));
        let why = |dst: &str| {
            plans.iter().find_map(|p| match p {
                Plan::Unreachable { dst: d, why, .. }
                    if *d == dst.parse::<IpNetwork>().unwrap() =>
                {
                    Some(why.clone())
                }
                _ => None,
            })
        };
        assert!(
            why("10.244.3.0/24")
                .unwrap()
                .contains("gateway 192.168.1.1"),
            "{plans:?}"
        );
        assert!(
            why("fd00:10:244:2::/64")
                .unwrap()
                .contains("no IPv6 address"),
            "{plans:?}"
        );

        // auto: the peer behind the gateway goes through the tunnel, the direct one stays.
        let auto = Reach {
            mode: Mode::Auto,
            tunnel: Some(9),
        };
        let plans = plan(&members, "self", &routes, auto);
        assert!(plans.contains(&Plan::Direct {
            dst: "10.244.2.0/24".parse().unwrap(),
            via: "192.168.1.6".parse().unwrap(),
            oif: 2
        }));
        assert!(plans.contains(&Plan::Tunnel {
            dst: "10.244.3.0/24".parse().unwrap(),
            via: "10.9.0.7".parse().unwrap(),
            oif: 9
        }));
        // An IPv6 subnet of a node without an IPv6 address: through the tunnel, its
        // gateway naming the node's IPv4 address.
        assert!(plans.contains(&Plan::Tunnel {
            dst: "fd00:10:244:2::/64".parse().unwrap(),
            via: "fe80::c0a8:106".parse().unwrap(),
            oif: 9
        }));
        // overlay: every peer through it.
        let overlay = Reach {
            mode: Mode::Overlay,
            tunnel: Some(9),
        };
        let plans = plan(&members, "self", &routes, overlay);
        assert!(
            plans.iter().all(|p| match p {
                Plan::Tunnel { oif, .. } => *oif == 9,
                Plan::Unreachable { .. } | Plan::Direct { .. } => false,
            }),
            "{plans:?}"
        );
        // auto without a tunnel device: reported, saying so.
        let down = Reach {
            mode: Mode::Auto,
            tunnel: None,
        };
        let plans = plan(&members, "self", &routes, down);
        assert!(
            plans.iter().any(|p| matches!(p, Plan::Unreachable { why, .. } if why.contains("tunnel device is not up"))),
            "{plans:?}"
        );
    }
}
