//! Pods behind netkit devices (Linux 6.7+) on an ebpf-cni node, each pair running one of the
//! node's programs on the pod's side: what the netkit section measures against the veth
//! pods.
//!
//! Each pod gets a netkit pair in L3 mode, its primary device in the node's namespace and
//! its peer as the pod's `eth0` (a /32 address and a default route through the device; no
//! ARP on netkit in L3 mode, and no MACs to fill). The pods' addresses go into the node's
//! endpoint map with their primary devices as the host side. So `ecni_floor_nk`, attached
//! as a pair's peer-side program, finds a destination pod with the node's own lookup and
//! sends the frame out of that pod's primary device, which hands it to the pod; and
//! `ecni_from_pod` there forwards a packet for outside the node as it does from a host
//! veth (the FIB, `bpf_redirect_neigh`), while the uplink's `ecni_from_dev` delivers the
//! replies into the pod by `bpf_redirect_peer` to its primary device. The node's kernel
//! never routes these packets, and the plugin never sees these pods.
//!
//! iproute2 here (6.1) predates netkit, so the pairs are made with an `RTM_NEWLINK` of the
//! rtnetlink crate's netkit builder, and aya 0.14 cannot attach to netkit, so the program
//! is attached by `BPF_LINK_CREATE` (`BPF_NETKIT_PEER`); the link's file descriptor holds
//! it, and dropping [`NetkitPods`] detaches it before the devices go. (A netkit pair whose
//! peer-side program returns "pass" hands the frame to its primary device, in the node's
//! stack, which routes it as the kernel routes a veth pod's.)

use std::net::Ipv4Addr;
use std::os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd};

use anyhow::{bail, Context as _, Result};
use aya::maps::HashMap as BpfHashMap;
use aya::programs::SchedClassifier;
use aya::Ebpf;
use ebpf_cni_maps::{EndpointInfo, EndpointKey, ENDPOINTS_MAP};
use ebpf_cni_tests::Netns;
use rtnetlink::packet_core::{
    NetlinkMessage, NLMSG_ERROR, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST,
};
use rtnetlink::packet_route::link::NetkitMode;
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::LinkNetkit;

use crate::rig::topo::{BenchNode, Binaries};

/// `BPF_LINK_CREATE` and `BPF_NETKIT_PEER` (linux/bpf.h).
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_NETKIT_PEER: u32 = 55;

/// The attachment id the endpoint entries carry: no attachment of the plugin's has it, so
/// nothing of the plugin's ever claims them.
const NO_ATTACHMENT: u64 = 0x6e6b_666c_6f6f_7200;

/// Whether this machine's kernel makes netkit devices: one made and deleted in a
/// namespace of its own.
pub fn available() -> bool {
    let Ok(ns) = Netns::create("n") else {
        return false;
    };
    ns.run_in(|| new_pair("nkprobe0", "nkprobe1"))
        .is_ok_and(|r| r.is_ok())
}

/// Netkit pods on a node, each pair with its program.
pub struct NetkitPods {
    // Fields drop in order: the links (detaching the programs) before the namespaces.
    _links: Vec<OwnedFd>,
    ebpf: Ebpf,
    /// The pods' namespaces, in the order they were asked for.
    pub pods: Vec<Netns>,
    keys: Vec<EndpointKey>,
}

impl NetkitPods {
    /// A netkit pod on `node` per entry of `pods`: its address, and the program (by name,
    /// from the plugin's object) its pair runs on the pod's side.
    pub fn new(bins: &Binaries, node: &BenchNode, pods: &[(Ipv4Addr, &str)]) -> Result<Self> {
        let node_ns = node.node.netns();
        let mut spaces = Vec::new();
        let mut primaries = Vec::new();
        for (i, (ip, _)) in pods.iter().enumerate() {
            let (pod, ip) = (Netns::create("p")?, *ip);
            let (primary, peer) = (format!("nkbench{i}"), format!("nkbench{i}p"));
            node_ns
                .run_in(|| new_pair(&primary, &peer))?
                .with_context(|| format!("creating the netkit pair {primary}"))?;
            node_ns.ip_ok(&["link", "set", &peer, "netns", pod.name()])?;
            node_ns.ip_ok(&["link", "set", &primary, "up"])?;
            pod.ip_ok(&["link", "set", &peer, "name", "eth0"])?;
            pod.ip_ok(&["addr", "add", &format!("{ip}/32"), "dev", "eth0"])?;
            pod.ip_ok(&["link", "set", "eth0", "up"])?;
            pod.ip_ok(&["route", "add", "default", "dev", "eth0"])?;
            let ifindex = node_ns.run_in(|| ifindex_of(&primary))??;
            primaries.push((ifindex, ip));
            spaces.push(pod);
        }
        let mut ebpf = crate::rig::object::on_node(bins, node)?;
        let mut keys = Vec::new();
        {
            let mut endpoints: BpfHashMap<_, EndpointKey, EndpointInfo> = BpfHashMap::try_from(
                ebpf.map_mut(ENDPOINTS_MAP)
                    .context("no endpoint map in the object")?,
            )?;
            for (ifindex, ip) in &primaries {
                let key = EndpointKey::v4(ip.octets());
                let info = EndpointInfo {
                    attachment_id: NO_ATTACHMENT,
                    host_ifindex: *ifindex,
                    ..EndpointInfo::default()
                };
                endpoints
                    .insert(key, info, 0)
                    .with_context(|| format!("the endpoint entry of {ip}"))?;
                keys.push(key);
            }
        }
        let mut links = Vec::new();
        for ((ifindex, _), (_, name)) in primaries.iter().zip(pods) {
            let prog: &mut SchedClassifier = ebpf
                .program_mut(name)
                .with_context(|| format!("no {name} in the object"))?
                .try_into()?;
            if prog.fd().is_err() {
                prog.load().with_context(|| format!("verifying {name}"))?;
            }
            let prog_fd = prog.fd()?.as_fd().as_raw_fd();
            let link = node_ns
                .run_in(|| attach_peer(prog_fd, *ifindex))?
                .with_context(|| format!("attaching {name} to netkit ifindex {ifindex}"))?;
            links.push(link);
        }
        Ok(Self {
            _links: links,
            ebpf,
            pods: spaces,
            keys,
        })
    }

    /// Program `name`'s run time (ns) and count so far, over every pair that runs it (0
    /// when the statistics are off).
    pub fn stats(&mut self, name: &str) -> Result<(u64, u64)> {
        let prog: &mut SchedClassifier = self
            .ebpf
            .program_mut(name)
            .with_context(|| format!("no {name}"))?
            .try_into()?;
        let info = prog.info()?;
        Ok((info.run_time().as_nanos() as u64, info.run_count()))
    }
}

impl Drop for NetkitPods {
    /// The endpoint entries go: the node's own DELs and GC expect only theirs.
    fn drop(&mut self) {
        if let Some(map) = self.ebpf.map_mut(ENDPOINTS_MAP) {
            if let Ok(mut m) = BpfHashMap::<_, EndpointKey, EndpointInfo>::try_from(map) {
                for k in &self.keys {
                    let _ = m.remove(k);
                }
            }
        }
    }
}

/// `RTM_NEWLINK` of a netkit pair in L3 mode, both ends in the calling thread's namespace.
fn new_pair(primary: &str, peer: &str) -> Result<()> {
    let mut msg = NetlinkMessage::from(RouteNetlinkMessage::NewLink(
        LinkNetkit::new(primary, peer, NetkitMode::L3).build(),
    ));
    msg.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
    msg.header.sequence_number = 1;
    msg.finalize();
    let mut req = vec![0; msg.buffer_len()];
    msg.serialize(&mut req);
    let sock = ebpf_cni_tests::rtevents::route_socket()?;
    // SAFETY: `req` is valid for its length; the kernel is the default destination.
    let sent = unsafe { libc::send(sock.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if sent < 0 {
        bail!("sending RTM_NEWLINK: {}", std::io::Error::last_os_error());
    }
    let mut buf = [0u8; 4096];
    // SAFETY: `buf` is valid for its length.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 20 {
        bail!(
            "no answer to RTM_NEWLINK: {}",
            std::io::Error::last_os_error()
        );
    }
    // nlmsghdr (16 bytes), then for NLMSG_ERROR the (negative) errno.
    let kind = u16::from_ne_bytes([buf[4], buf[5]]);
    let code = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
    match (kind, code) {
        (NLMSG_ERROR, 0) => Ok(()),
        (NLMSG_ERROR, e) => bail!(
            "RTM_NEWLINK of netkit {primary}: {}",
            std::io::Error::from_raw_os_error(-e)
        ),
        (k, _) => bail!("RTM_NEWLINK of netkit {primary}: answer of type {k}"),
    }
}

fn ifindex_of(name: &str) -> Result<u32> {
    let c = std::ffi::CString::new(name)?;
    // SAFETY: `c` is a valid C string.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => bail!("no link {name}: {}", std::io::Error::last_os_error()),
        i => Ok(i),
    }
}

/// `BPF_LINK_CREATE` of program `prog_fd` as the peer-side program of the netkit pair
/// whose primary device is `ifindex` (in the calling thread's namespace).
fn attach_peer(prog_fd: i32, ifindex: u32) -> Result<OwnedFd> {
    // union bpf_attr's link_create: prog_fd, target_ifindex, attach_type, flags, then
    // netkit's relative_fd and expected_revision, all zero; the rest of the union zero.
    let mut attr = [0u32; 32];
    attr[0] = prog_fd as u32;
    attr[1] = ifindex;
    attr[2] = BPF_NETKIT_PEER;
    // SAFETY: bpf(2) reads `attr` for the size given.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_LINK_CREATE,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd < 0 {
        bail!("BPF_LINK_CREATE: {}", std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
