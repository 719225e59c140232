//! Chained mode: ebpf-cni placed after another interface plugin (the reference `bridge` or
//! `ptp`) in a conflist, in place of `portmap` and `bandwidth`. That plugin made the veth
//! pair, addressed the pod and forwards its traffic; ebpf-cni takes the pod's interface and
//! addresses from `prevResult`, finds the host end of the veth, and attaches its programs
//! there for host ports and rate limits only (`ecni_from_chain`, `ecni_to_pod`; the pod's
//! endpoint entries carry `EP_FLAG_CHAINED`, so nothing but translated host-port packets
//! is delivered by the programs). The result passes through unchanged.
//!
//! The mode follows from the config: a config without `ipam` is chained (ebpf-cni cannot
//! address a pod without one), so DEL, CHECK and GC know it without `prevResult`. ADD of
//! such a config needs a `prevResult`; a config with both is refused.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde_json::Value;

use crate::{
    attachment::{PodAddr, PodConf},
    bpf::{self, AttachMode, Hook, NodeId, PodSpec, Veth},
    cni::{code, config::NetConf, env::CniEnv, types::SuccessResult, CniError},
    netlink::{Link, Netlink},
    netns::Netns,
};

/// Chained mode refused, or the pod not as the previous plugin should have left it.
#[derive(Debug, thiserror::Error)]
pub enum ChainedError {
    #[error("ipam is missing and there is no prevResult: ebpf-cni needs an ipam section to address the pod, or must follow an interface plugin (chained mode)")]
    NoPrevResult,
    #[error("ipMasq is not supported in chained mode (no ipam): the interface plugin before ebpf-cni masquerades there; set ipMasq on it, or leave ebpf-cni unchained")]
    Masq,
    /// ADD: the config or the previous plugin is wrong (code 7).
    #[error("{0}")]
    Add(PodProblem),
    /// CHECK: the attachment is not as it should be (code 105).
    #[error("{0}")]
    Check(PodProblem),
}

impl ChainedError {
    pub fn cni_code(&self) -> u32 {
        match self {
            Self::Check(_) => code::CHECK_FAILED,
            Self::NoPrevResult | Self::Masq | Self::Add(_) => code::INVALID_CONFIG,
        }
    }
}

/// How the pod's interface the previous plugin made cannot be used; `sandbox` is the
/// container's netns path.
#[derive(Debug, thiserror::Error)]
pub enum PodProblem {
    #[error("chained mode: prevResult lists no interface {ifname:?} in sandbox {sandbox}; ebpf-cni without ipam must follow the plugin that creates the pod's interface")]
    NotInPrevResult { ifname: String, sandbox: String },
    #[error("chained mode: prevResult gives interface {ifname:?} no address")]
    NoAddress { ifname: String },
    #[error("chained mode: interface {ifname:?} is missing from {sandbox}")]
    InterfaceMissing { ifname: String, sandbox: String },
    #[error("chained mode: interface {ifname:?} in {sandbox} is {}, not a veth: there is no host side to attach to", .kind.as_deref().unwrap_or("of unknown kind"))]
    NotAVeth {
        ifname: String,
        sandbox: String,
        kind: Option<String>,
    },
    #[error("chained mode: the host end of {ifname:?} (ifindex {peer}) is not in this namespace")]
    HostEndMissing { ifname: String, peer: u32 },
}

/// The pod as the plugin before ebpf-cni left it.
struct ChainedPod {
    ns: Netns,
    host: Link,
    container: Link,
    /// Each address of the pod's interface with its gateway.
    addrs: Vec<(IpNetwork, Option<IpAddr>)>,
}

impl ChainedPod {
    /// What the pod's dataplane holds in chained mode, and its veth, for ADD and CHECK
    /// alike.
    fn spec(&self, pod_conf: &PodConf) -> Result<(PodSpec, Veth), CniError> {
        let addrs: Vec<PodAddr> = self
            .addrs
            .iter()
            .map(|&(address, gateway)| PodAddr {
                address,
                gateway,
                // The previous plugin answers ARP for its gateway.
                gateway4: None,
            })
            .collect();
        let spec = pod_conf.pod_spec(&addrs, &self.ns, true)?;
        Ok((spec, crate::attachment::veth(&self.host, &self.container)?))
    }

    fn gateways(&self) -> Vec<IpAddr> {
        self.addrs.iter().filter_map(|(_, gw)| *gw).collect()
    }
}

/// Finds the pod's interface in `prev` and in its namespace, and the host end of its veth.
/// Every failure is a [`PodProblem`] for `fail`, which picks the error code (ADD: the
/// config or previous plugin is wrong; CHECK: the attachment is not as it should be).
async fn find_pod(
    env: &CniEnv,
    prev: &SuccessResult,
    host_nl: &Netlink,
    fail: fn(PodProblem) -> ChainedError,
) -> Result<ChainedPod, CniError> {
    let ifname = || env.ifname.clone();
    let netns_path = env
        .netns
        .as_deref()
        .expect("env validation requires CNI_NETNS for ADD and CHECK");
    let sandbox = netns_path.display().to_string();
    // The runtime may spell the sandbox path differently from the previous plugin
    // (/run vs /var/run): an exact match wins, else the only sandboxed one of that name.
    let named: Vec<usize> = (0..prev.interfaces.len())
        .filter(|&i| {
            prev.interfaces[i].name == env.ifname && !prev.interfaces[i].sandbox.is_empty()
        })
        .collect();
    let cont_idx = named
        .iter()
        .copied()
        .find(|&i| prev.interfaces[i].sandbox == sandbox)
        .or_else(|| (named.len() == 1).then(|| named[0]))
        .ok_or_else(|| {
            fail(PodProblem::NotInPrevResult {
                ifname: ifname(),
                sandbox: sandbox.clone(),
            })
        })?;
    let addrs: Vec<(IpNetwork, Option<IpAddr>)> = prev
        .ips
        .iter()
        .filter(|ip| ip.interface.is_none_or(|i| i == cont_idx))
        .map(|ip| (ip.address, ip.gateway))
        .collect();
    if addrs.is_empty() {
        return Err(fail(PodProblem::NoAddress { ifname: ifname() }).into());
    }

    let pod_ns = Netns::open_pod(netns_path)?;
    let pod_nl = Netlink::connect_in(&pod_ns)?;
    let container = pod_nl.link_by_name(&env.ifname).await?.ok_or_else(|| {
        fail(PodProblem::InterfaceMissing {
            ifname: ifname(),
            sandbox: sandbox.clone(),
        })
    })?;
    let peer = match (container.kind.as_deref(), container.peer_index) {
        (Some("veth"), Some(peer)) => peer,
        (kind, _) => {
            return Err(fail(PodProblem::NotAVeth {
                ifname: ifname(),
                sandbox,
                kind: kind.map(str::to_owned),
            })
            .into())
        }
    };
    // Index numbers are per namespace: the link found must be a veth whose peer is the pod's.
    let host = host_nl
        .link_by_index(peer)
        .await?
        .filter(|l| l.kind.as_deref() == Some("veth") && l.peer_index == Some(container.index))
        .ok_or_else(|| {
            fail(PodProblem::HostEndMissing {
                ifname: ifname(),
                peer,
            })
        })?;
    Ok(ChainedPod {
        ns: pod_ns,
        host,
        container,
        addrs,
    })
}

/// ADD in chained mode: attaches the programs to the host veth the previous plugin made,
/// installs the pod's host ports and limits, and passes `prevResult` on as the result.
pub async fn add(env: &CniEnv, conf: &NetConf) -> Result<Value, CniError> {
    let prev_raw = conf
        .prev_result
        .as_ref()
        .ok_or(ChainedError::NoPrevResult)?;
    if conf.masq.is_some() {
        return Err(ChainedError::Masq.into());
    }
    crate::bpf::kernel::require_for(conf.tc_attach_mode == crate::cni::config::TcAttachMode::Tcx)?;
    let pod_conf = PodConf::parse(conf, env)?;
    let prev = SuccessResult::from_json(prev_raw, "prevResult")?;
    let host_nl = Netlink::connect()?;
    let pod = find_pod(env, &prev, &host_nl, ChainedError::Add).await?;

    bpf::ensure_bpffs()?;
    let node = NodeId::current()?;
    let key = crate::attachment::key(conf, env);
    let (spec, veth) = pod.spec(&pod_conf)?;
    bpf::ensure_addresses_free(&node, &key, &spec.ips())?;
    let view = crate::node::node_view(&host_nl, conf, &pod.gateways()).await?;
    crate::host_ports::warn_taken_listeners(&spec.ports, &view.addrs);
    // add_pod leaves nothing of the pod behind when it fails.
    bpf::add_pod(
        &node,
        &key,
        &spec,
        &veth,
        &view,
        crate::node::attach_modes(conf, true).pod,
    )?;
    if let Err(e) = crate::node::failpoint() {
        if let Err(undo) = bpf::del_pod(&node, &key) {
            log::error!("rollback of a failed ADD: {undo}");
        }
        return Err(e.into());
    }

    // The previous plugin's result, unchanged but for the version it is rendered in and
    // the source check in force.
    let mut out = prev_raw.clone();
    if let Some(obj) = out.as_object_mut() {
        obj.insert("cniVersion".into(), Value::from(conf.cni_version.as_str()));
    }
    crate::source_check::add_to_result(&mut out, &spec.source_check(&veth));
    Ok(out)
}

/// CHECK in chained mode: the pod's host veth still carries the chained programs, and the
/// endpoint entries, limits and host ports are those the config asks for. The interface
/// itself is the previous plugin's to check.
pub async fn check(env: &CniEnv, conf: &NetConf) -> Result<(), CniError> {
    let prev_raw = conf
        .prev_result
        .as_ref()
        .ok_or(crate::attachment::CheckError::NoPrevResult)?;
    let prev = SuccessResult::from_json(prev_raw, "prevResult")?;
    let host_nl = Netlink::connect()?;
    let pod = find_pod(env, &prev, &host_nl, ChainedError::Check).await?;
    bpf::ensure_bpffs()?;
    let node = NodeId::current()?;
    let key = crate::attachment::key(conf, env);
    let mode = crate::node::attach_modes(conf, true).pod;
    let (spec, veth) = pod.spec(&PodConf::parse(conf, env)?)?;
    crate::source_check::check_result(prev_raw, &spec.source_check(&veth))?;
    bpf::check_pod(&node, &key, &spec, &veth, mode).map_err(crate::attachment::dataplane_failed)?;
    if mode == AttachMode::Netlink {
        crate::attachment::netlink_filters(&host_nl, &pod.host, Hook::pod(true)).await?;
    }
    Ok(())
}
