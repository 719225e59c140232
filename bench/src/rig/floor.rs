//! The routing floor at TC, `ecni_floor_pod`: what the pod-path and netkit sections
//! attach in front of `ecni_from_pod` on two pods' host veths.

use anyhow::{bail, Context as _, Result};
use aya::programs::tc::{NlOptions, SchedClassifierLinkId, TcAttachOptions, TcAttachType};
use aya::programs::SchedClassifier;
use aya::Ebpf;

use crate::rig::topo::{BenchNode, Binaries, Pod};

/// The routing floor `ecni_floor_pod`, loaded from the plugin's object into the node's
/// pinned maps (it looks the node's endpoints up), attached to two pods' host veths while
/// a section measures it.
pub struct Floor {
    ebpf: Ebpf,
    /// The pods' host veths.
    hosts: [String; 2],
    links: Vec<SchedClassifierLinkId>,
}

/// Ahead of the plugin's filter (the kernel numbers a first filter 49152).
const FLOOR_PRIORITY: u16 = 1;

impl Floor {
    pub fn load(bins: &Binaries, node: &BenchNode, a: &Pod, b: &Pod) -> Result<Self> {
        let mut ebpf = crate::rig::object::on_node(bins, node)?;
        let prog: &mut SchedClassifier = ebpf
            .program_mut(ebpf_cni_maps::PROG_FLOOR_POD)
            .context("no routing floor in the object")?
            .try_into()?;
        prog.load().context("verifying the routing floor")?;
        Ok(Self {
            ebpf,
            hosts: [host_veth(a)?, host_veth(b)?],
            links: Vec::new(),
        })
    }

    fn prog(&mut self) -> Result<&mut SchedClassifier> {
        Ok(self
            .ebpf
            .program_mut(ebpf_cni_maps::PROG_FLOOR_POD)
            .context("no routing floor")?
            .try_into()?)
    }

    /// Attaches the floor in front of `ecni_from_pod` on both host veths, or detaches it.
    pub fn attach(&mut self, node: &BenchNode, on: bool) -> Result<()> {
        if on {
            let hosts = self.hosts.clone();
            for host in &hosts {
                let prog = self.prog()?;
                let id = node
                    .node
                    .netns()
                    .run_in(|| {
                        prog.attach_with_options(
                            host,
                            TcAttachType::Ingress,
                            TcAttachOptions::Netlink(NlOptions {
                                priority: FLOOR_PRIORITY,
                                ..NlOptions::default()
                            }),
                        )
                    })?
                    .with_context(|| format!("attaching the routing floor to {host}"))?;
                self.links.push(id);
            }
        } else {
            for id in std::mem::take(&mut self.links) {
                let prog = self.prog()?;
                node.node
                    .netns()
                    .run_in(|| prog.detach(id))?
                    .context("detaching the routing floor")?;
            }
        }
        Ok(())
    }

    /// The floor's run time (ns) and count so far (0 when the statistics are off).
    pub fn stats(&mut self) -> Result<(u64, u64)> {
        let info = self.prog()?.info()?;
        Ok((info.run_time().as_nanos() as u64, info.run_count()))
    }
}

/// Pod `p`'s host veth, as its ADD result names it (the first interface).
pub fn host_veth(p: &Pod) -> Result<String> {
    let name = p
        .cached
        .as_ref()
        .and_then(|r| r.get("interfaces")?.get(0)?.get("name")?.as_str())
        .map(str::to_owned);
    match name {
        Some(n) if !n.is_empty() => Ok(n),
        _ => bail!("the pod's ADD result names no host interface"),
    }
}
