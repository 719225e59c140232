//! The peer routes, the tunnel device and the programs' tunnel maps brought in line with a
//! source's members, whichever the source.

use std::path::Path;

use ipnetwork::IpNetwork;

use super::{network, routes, tunnel};

/// What the agent does with the node's conflist once the peer routes changed: converge
/// the node for it, so the programs' tunnel maps follow the routes at once.
pub type AfterRoutes = fn(&Path);

/// The peer routes, the tunnel device and the programs' tunnel maps brought in line with
/// a source's members: one code path for a first listing, an event, a re-list and a
/// periodic check, whichever source (etcd, Kubernetes) the members come from.
pub struct Reconciler<'a> {
    nl: crate::netlink::Netlink,
    /// The node's own name: its subnets get no peer route.
    own: &'a str,
    mode: network::Mode,
    /// The tunnel's settings (mode `direct`: none).
    tunnel: Option<&'a tunnel::TunnelSpec>,
    /// The conflist the node's subnets are written into.
    conf: &'a Path,
    /// Called with `conf` after the peer routes changed.
    after_routes: AfterRoutes,
    last: routes::Outcome,
    tunnel_err: Option<String>,
    record_err: Option<String>,
}

impl<'a> Reconciler<'a> {
    pub fn new(
        own: &'a str,
        mode: network::Mode,
        tunnel: Option<&'a tunnel::TunnelSpec>,
        conf: &'a Path,
        after_routes: AfterRoutes,
    ) -> Result<Self, crate::netlink::NetlinkError> {
        Ok(Self {
            nl: crate::netlink::Netlink::connect()?,
            own,
            mode,
            tunnel,
            conf,
            after_routes,
            last: routes::Outcome::default(),
            tunnel_err: None,
            record_err: None,
        })
    }

    /// One pass; whether the routes are in line with `members` (a failure is logged).
    pub fn apply(&mut self, members: &routes::Members) -> bool {
        // The tunnel device made again where it went (deleted by hand, a restart).
        let tunnel =
            self.tunnel.and_then(
                |spec| match crate::block_on(tunnel::ensure(&self.nl, spec)) {
                    Ok(index) => {
                        self.tunnel_err = None;
                        Some(index)
                    }
                    Err(e) => {
                        let line = crate::cni::error::chain(&e);
                        if self.tunnel_err.as_ref() != Some(&line) {
                            log::error!("the tunnel: {line}");
                        }
                        self.tunnel_err = Some(line);
                        None
                    }
                },
            );
        let reach = routes::Reach {
            mode: self.mode,
            tunnel,
        };
        let out = match crate::block_on(routes::reconcile(&self.nl, members, self.own, reach)) {
            Ok(out) => out,
            Err(e) => {
                log::error!("the peer routes: {}", crate::cni::error::chain(&e));
                return false;
            }
        };
        for dst in &out.added {
            if let Some(m) = members.get(dst) {
                let how = if out.tunneled.contains(dst) {
                    "through the tunnel"
                } else {
                    "direct"
                };
                log::info!("route to {dst} of node {} added ({how})", m.node);
            }
        }
        for dst in &out.removed {
            log::info!("route to {dst} removed: no member holds it now");
        }
        if out.unreachable != self.last.unreachable {
            for (dst, node, why) in &out.unreachable {
                log::warn!("no route to {dst} of node {node}: {why}");
            }
        }
        // Each pass, so a record the node's teardown took with it comes back.
        let line = record_unrouted(&out.unreachable).err();
        if line.is_some() && line != self.record_err {
            log::warn!(
                "recording the peers without a route: {}",
                line.as_deref().unwrap_or("")
            );
        }
        self.record_err = line;
        // The programs' tunnel maps follow the routes (`bpf::tunnel`).
        if tunnel.is_some() && (!out.added.is_empty() || !out.removed.is_empty()) {
            (self.after_routes)(self.conf);
        }
        self.last = out;
        tunnel.is_some() || self.tunnel.is_none()
    }
}

/// Records the peer subnets without a route where `inspect` and the metrics read them.
fn record_unrouted(unreachable: &[(IpNetwork, String, String)]) -> Result<(), String> {
    let peers: Vec<crate::bpf::tunnel::UnroutedPeer> = unreachable
        .iter()
        .map(|(subnet, node, why)| crate::bpf::tunnel::UnroutedPeer {
            subnet: *subnet,
            node: node.clone(),
            why: why.clone(),
        })
        .collect();
    let node = crate::bpf::pin::NodeId::current().map_err(|e| crate::cni::error::chain(&e))?;
    crate::bpf::tunnel::record_unrouted(&crate::bpf::pin::PinRoot::from_env(), &node, &peers)
        .map_err(|e| crate::cni::error::chain(&e))
}
