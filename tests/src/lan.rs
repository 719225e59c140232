//! A LAN of test nodes without etcd: the bridge of [`crate::etcd`]'s LAN (`10.250.0.0/24`,
//! the bridge `10.250.0.254` in a namespace of its own), for the cluster tests whose
//! members come from elsewhere (the stand-in Kubernetes API server, which listens on the
//! bridge's address). Dropping it removes the namespace, with it the veths of the nodes
//! attached.

use std::net::Ipv4Addr;

use anyhow::{ensure, Result};

use crate::netns::Netns;

#[derive(Debug)]
pub struct Lan {
    ns: Netns,
}

impl Lan {
    pub fn new() -> Result<Self> {
        crate::require_root();
        Ok(Self {
            ns: crate::etcd::make_lan()?,
        })
    }

    /// The LAN's namespace (the bridge, [`crate::etcd::LAN_BRIDGE_IP`]).
    pub fn netns(&self) -> &Netns {
        &self.ns
    }

    /// Attaches `ns` as host `host` (1..=253): a veth named `ifname` in `ns`, addressed
    /// `10.250.0.<host>/24` and up; returns the address once `ns` reaches the bridge.
    pub fn attach(&self, ns: &Netns, ifname: &str, host: u8) -> Result<Ipv4Addr> {
        ensure!(
            (1..=253).contains(&host),
            "LAN host number {host} out of 1..=253"
        );
        crate::etcd::attach_host(&self.ns, ns, ifname, host)
    }

    /// Attaches `ns` behind the LAN namespace, which routes to it (`10.251.<host>.2`, as
    /// [`crate::etcd::EtcdCluster::attach_routed`] does): the nodes on the LAN reach it
    /// only through the bridge's address once they have the route
    /// ([`crate::etcd::EtcdCluster::route_to_routed`]). Returns the address once `ns`
    /// reaches the bridge.
    pub fn attach_routed(&self, ns: &Netns, ifname: &str, host: u8) -> Result<Ipv4Addr> {
        let ip = crate::etcd::plug_routed(&self.ns, ns, ifname, host)?;
        let bridge = crate::etcd::LAN_BRIDGE_IP.to_string();
        crate::etcd::reaches(
            ns,
            &bridge,
            &format!("the LAN bridge {bridge} through its router"),
        )?;
        Ok(ip)
    }
}
