//! Direct routes to the peers' pod subnets: a kernel route `<subnet> via <peer's node
//! address>` where a route without a gateway covers that address (the peer is on one of the
//! node's links), which the programs' FIB path then forwards pods' packets by. The routes
//! carry their own protocol number ([`ROUTE_PROTOCOL`]), so each pass compares the kernel's
//! routes of that protocol with the members and changes only the difference: a member
//! added, gone, re-added or given a new address, and an agent restarted, are one code path.
//! A peer whose address only a gateway reaches is reported and gets no route.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnetwork::IpNetwork;

use super::network::MemberRecord;
use crate::netlink::{Netlink, NetlinkError, RouteEntry};

/// `rtm_protocol` of the routes to peers (`ip route show proto 236`): no other writer
/// (iproute2's `rt_protos` stops at 192 for the well-known ones, bird 12, zebra 11) uses it.
pub const ROUTE_PROTOCOL: u8 = 236;

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
    /// Only a gateway reaches the peer (or it has no address of the subnet's family).
    Unreachable {
        dst: IpNetwork,
        node: String,
        why: String,
    },
}

/// What each peer subnet gets, given the node's own name and its main table's routes
/// (those of [`ROUTE_PROTOCOL`] left out: a route to a peer never makes another direct).
pub fn plan(members: &Members, own: &str, routes: &[RouteEntry]) -> Vec<Plan> {
    members
        .iter()
        .filter(|(_, r)| r.node != own)
        .map(|(dst, r)| {
            let via: Option<IpAddr> = if dst.is_ipv4() {
                r.public_ip.map(IpAddr::V4)
            } else {
                r.public_ipv6.map(IpAddr::V6)
            };
            let Some(via) = via else {
                return Plan::Unreachable {
                    dst: *dst,
                    node: r.node.clone(),
                    why: format!(
                        "node {} has no {} address",
                        r.node,
                        if dst.is_ipv4() { "IPv4" } else { "IPv6" }
                    ),
                };
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
                Some(RouteEntry { gw: Some(gw), .. }) => Plan::Unreachable {
                    dst: *dst,
                    node: r.node.clone(),
                    why: format!("its address {via} is reached through the gateway {gw}"),
                },
                _ => Plan::Unreachable {
                    dst: *dst,
                    node: r.node.clone(),
                    why: format!("no route covers its address {via}"),
                },
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
    pub removed: Vec<IpNetwork>,
    pub unreachable: Vec<(IpNetwork, String, String)>,
}

/// Brings the kernel's peer routes in line with `members`: each missing or different one
/// written, each one of no member (or of an unreachable one) deleted.
pub async fn reconcile(
    nl: &Netlink,
    members: &Members,
    own: &str,
) -> Result<Outcome, NetlinkError> {
    let mut routes = nl.routes(false).await?;
    routes.extend(nl.routes(true).await?);
    let mut out = Outcome::default();
    let plans = plan(members, own, &routes);
    for p in &plans {
        match p {
            Plan::Direct { dst, via, oif } => {
                let have = routes.iter().any(|r| {
                    r.protocol == ROUTE_PROTOCOL
                        && r.dst == *dst
                        && r.gw == Some(*via)
                        && r.oif == Some(*oif)
                });
                if !have {
                    nl.replace_owned_route(*dst, *via, *oif, ROUTE_PROTOCOL)
                        .await?;
                    out.added.push(*dst);
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
            Plan::Direct { dst, .. } => Some(*dst),
            Plan::Unreachable { .. } => None,
        })
        .collect();
    for r in routes.iter().filter(|r| r.protocol == ROUTE_PROTOCOL) {
        if !wanted.contains(&r.dst) && nl.delete_owned_route(r.dst, ROUTE_PROTOCOL).await? {
            out.removed.push(r.dst);
        }
    }
    Ok(out)
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
        let plans = plan(&members, "self", &routes);
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
    }
}
