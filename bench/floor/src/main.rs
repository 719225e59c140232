//! The kernel floor of ebpf-cni's ADD and DEL: the kernel work one ADD of the
//! benchmark's pods needs, done as directly as a program can, and nothing else. The
//! benchmark runs it as it runs a plugin (forked into the node's namespace, reaped with
//! `wait4`), alternating with ebpf-cni's own ADDs, and reports ADD as a multiple of it.
//!
//! `ebpf-cni-floor add` reads `key=value` lines on stdin (see [`Input`]) and, on a node where
//! ebpf-cni already loaded and pinned its programs and maps:
//!
//! - creates the veth pair with its peer straight in the pod's namespace (one
//!   `RTM_NEWLINK`, echoed, which gives the host side's index and MAC and the peer's
//!   index; the pod side's MAC is chosen here; one queue each way on both ends), and turns
//!   IPv6 off on the host side as ebpf-cni does for IPv4 pods;
//! - in the pod (a netlink socket opened there: two `setns`): the address, the link up,
//!   the default route via the gateway, on-link;
//! - the pinned map writes the pod's dataplane reads: its endpoint entry, its rate limits,
//!   its host port, its source check (its address and the catch-all);
//! - the `clsact` qdisc and the two `bpf` filters of the pinned pod programs
//!   (direct-action, as ebpf-cni's netlink mode attaches them), on the host side still down;
//! - on the node: the host side up, the host route to the pod with the gateway as its
//!   source (the gateway itself is the node's, on `lo`, held once per node: not per pod).
//!
//! One request per netlink message, each waiting for its acknowledgement, as ebpf-cni sends
//! them (no batching it does not do). What it leaves out on purpose: the IPAM lease (a file
//! write), anything ebpf-cni records for itself (pins, records), reads of what it already
//! knows, and the checks a plugin makes before changing anything.
//!
//! `ebpf-cni-floor del` undoes it: the map entries, and the host veth (one `RTM_DELLINK`;
//! the kernel takes the peer, the filters and the routes with it).
//!
//! It prints `kernel_us=<µs from its start to the last answer>` on stdout (and the host
//! veth's index after an ADD, which DEL takes back).

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Instant;

use ebpf_cni_maps as m;

fn main() {
    let started = Instant::now();
    let mut args = std::env::args().skip(1);
    let op = args.next().unwrap_or_default();
    let outcome = Input::read().and_then(|input| match op.as_str() {
        "add" => add(&input),
        "del" => del(&input).map(|()| 0),
        _ => Err(io::Error::other(
            "usage: ebpf-cni-floor add|del < key=value lines",
        )),
    });
    match outcome {
        Ok(host_ifindex) => {
            let us = started.elapsed().as_secs_f64() * 1e6;
            println!("kernel_us={us:.0}");
            println!("host_ifindex={host_ifindex}");
        }
        Err(e) => {
            let _ = writeln!(io::stderr(), "ebpf-cni-floor {op}: {e}");
            std::process::exit(1);
        }
    }
}

/// What the benchmark tells the floor about the pod, one `key=value` per line.
struct Input(HashMap<String, String>);

impl Input {
    fn read() -> io::Result<Self> {
        let mut text = String::new();
        io::stdin().read_to_string(&mut text)?;
        Ok(Self(
            text.lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .collect(),
        ))
    }

    fn get(&self, key: &str) -> io::Result<&str> {
        self.0
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| io::Error::other(format!("missing {key}=")))
    }

    fn parse<T: std::str::FromStr>(&self, key: &str) -> io::Result<T> {
        self.get(key)?
            .parse()
            .map_err(|_| io::Error::other(format!("invalid {key}=")))
    }
}

/// The pod as [`Input`] gives it.
struct Pod {
    /// The pod's network namespace (a path).
    netns: String,
    /// The host side's name.
    host: String,
    ifname: String,
    mtu: u32,
    ip: Ipv4Addr,
    prefix: u8,
    gateway: Ipv4Addr,
    host_port: u16,
    pod_port: u16,
    rate_bps: u64,
    burst_bits: u64,
    /// The node's pinned maps and pod programs (directories).
    maps: String,
    programs: String,
    attachment_id: u64,
}

impl Pod {
    fn from(i: &Input) -> io::Result<Self> {
        Ok(Self {
            netns: i.get("netns")?.to_owned(),
            host: i.get("host")?.to_owned(),
            ifname: i.get("ifname")?.to_owned(),
            mtu: i.parse("mtu")?,
            ip: i.parse("ip")?,
            prefix: i.parse("prefix")?,
            gateway: i.parse("gateway")?,
            host_port: i.parse("host_port")?,
            pod_port: i.parse("pod_port")?,
            rate_bps: i.parse("rate_bps")?,
            burst_bits: i.parse("burst_bits")?,
            maps: i.get("maps")?.to_owned(),
            programs: i.get("programs")?.to_owned(),
            attachment_id: i.parse("attachment_id")?,
        })
    }
}

fn add(input: &Input) -> io::Result<u32> {
    let pod = Pod::from(input)?;
    let pod_ns = File::open(&pod.netns)?;
    let host_nl = Netlink::open()?;
    let pod_nl = Netlink::open_in(&pod_ns)?;
    let pod_mac = random_mac()?;

    // The pair, the peer created in the pod's namespace.
    let mut msg = Msg::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL | NLM_F_ECHO);
    msg.ifinfo(0, 0, 0);
    msg.attr_str(IFLA_IFNAME, &pod.host);
    msg.attr_u32(IFLA_MTU, pod.mtu);
    // One queue each way, asked for at creation as ebpf-cni asks (no cut to one queue,
    // which waits for an RCU grace period).
    msg.attr_u32(IFLA_NUM_TX_QUEUES, 1);
    msg.attr_u32(IFLA_NUM_RX_QUEUES, 1);
    msg.nest(IFLA_LINKINFO);
    msg.attr_str(IFLA_INFO_KIND, "veth");
    msg.nest(IFLA_INFO_DATA);
    msg.nest(VETH_INFO_PEER);
    msg.ifinfo(0, 0, 0);
    msg.attr_str(IFLA_IFNAME, &pod.ifname);
    msg.attr_u32(IFLA_MTU, pod.mtu);
    msg.attr_u32(IFLA_NUM_TX_QUEUES, 1);
    msg.attr_u32(IFLA_NUM_RX_QUEUES, 1);
    msg.attr(IFLA_ADDRESS, &pod_mac);
    msg.attr_u32(IFLA_NET_NS_FD, pod_ns.as_raw_fd() as u32);
    msg.end();
    msg.end();
    msg.end();
    let echoed = host_nl.request(msg, "create the veth pair")?;
    let host = match echoed.iter().find_map(|b| LinkInfo::parse(b)) {
        Some(l) => l,
        // A kernel that does not echo a new link (before 6.1) is asked.
        None => host_nl.link(&pod.host)?,
    };
    let pod_ifindex = host
        .peer
        .ok_or_else(|| io::Error::other("the veth has no peer index"))?;
    std::fs::write(
        format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", pod.host),
        "1",
    )?;

    // The pod's side.
    let mut msg = Msg::new(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL);
    msg.ifaddr(libc::AF_INET as u8, pod.prefix, pod_ifindex);
    msg.attr(IFA_LOCAL, &pod.ip.octets());
    msg.attr(IFA_ADDRESS, &pod.ip.octets());
    msg.attr_u32(IFA_FLAGS, IFA_F_NODAD | IFA_F_NOPREFIXROUTE);
    pod_nl.request(msg, "add the pod's address")?;
    pod_nl.request(link_up(pod_ifindex), "set the pod's side up")?;
    let mut msg = Msg::new(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL);
    msg.rtmsg(0, RT_SCOPE_UNIVERSE, RTNH_F_ONLINK);
    msg.attr(RTA_GATEWAY, &pod.gateway.octets());
    msg.attr_u32(RTA_OIF, pod_ifindex);
    pod_nl.request(msg, "add the pod's default route")?;

    // The dataplane's entries.
    let endpoints = obj_get(&format!("{}/{}", pod.maps, m::ENDPOINTS_MAP))?;
    let info = m::EndpointInfo {
        attachment_id: pod.attachment_id,
        host_ifindex: host.index,
        flags: m::EP_FLAGS_NONE,
        host_mac: host.mac,
        pod_mac,
        gateway4: pod.gateway.octets(),
    };
    map_update(&endpoints, &m::EndpointKey::v4(pod.ip.octets()), &info)?;
    let rates = obj_get(&format!("{}/{}", pod.maps, m::RATE_LIMITS_MAP))?;
    let bucket = |mode| m::Bucket {
        rate_bytes: pod.rate_bps / 8,
        burst_bytes: (pod.burst_bits / 8) as u32,
        mode,
        tokens: 0,
        last_ns: 0,
    };
    let limit = m::RateLimit {
        ingress: bucket(m::LIMIT_POLICE_NO_FQ),
        egress: bucket(m::LIMIT_POLICE),
    };
    map_update(&rates, &host.index, &limit)?;
    let ports = obj_get(&format!("{}/{}", pod.maps, m::PORTMAP_MAP))?;
    let target = m::PortTarget {
        attachment_id: pod.attachment_id,
        pod_addr: m::EndpointKey::v4(pod.ip.octets()).addr,
        gateway: m::EndpointKey::v4(pod.gateway.octets()).addr,
        host_ifindex: host.index,
        pod_port: pod.pod_port,
        flags: 0,
        _pad: 0,
    };
    map_update(&ports, &port_key(pod.host_port), &target)?;
    let sources = obj_get(&format!("{}/{}", pod.maps, m::SOURCES_MAP))?;
    let rule = |verdict| m::SourceRule {
        attachment_id: pod.attachment_id,
        mac: pod_mac,
        verdict,
    };
    map_update(
        &sources,
        &source_key(host.index, Some(pod.ip)),
        &rule(m::SOURCE_PASS),
    )?;
    map_update(
        &sources,
        &source_key(host.index, None),
        &rule(m::SOURCE_REFUSE),
    )?;

    // The programs.
    let mut msg = Msg::new(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL);
    msg.tcmsg(host.index, CLSACT_HANDLE, TC_H_CLSACT, 0);
    msg.attr_str(TCA_KIND, "clsact");
    host_nl.request(msg, "add the clsact qdisc")?;
    for (program, parent) in [
        (m::PROG_FROM_POD, CLSACT_INGRESS),
        (m::PROG_TO_POD, CLSACT_EGRESS),
    ] {
        let prog = obj_get(&format!("{}/{program}", pod.programs))?;
        let mut msg = Msg::new(RTM_NEWTFILTER, NLM_F_CREATE | NLM_F_EXCL);
        // Priority 0: the kernel picks one; every protocol.
        msg.tcmsg(host.index, 0, parent, u32::from(ETH_P_ALL.to_be()));
        msg.attr_str(TCA_KIND, "bpf");
        msg.nest(TCA_OPTIONS);
        msg.attr_u32(TCA_BPF_FD, prog.as_raw_fd() as u32);
        msg.attr_str(TCA_BPF_NAME, program);
        msg.attr_u32(TCA_BPF_FLAGS, TCA_BPF_FLAG_ACT_DIRECT);
        msg.end();
        host_nl.request(msg, "attach a pod program")?;
    }

    // The node's side, up once the programs are on it (as ebpf-cni: the qdisc then goes
    // on a down device, which the kernel does not deactivate first).
    host_nl.request(link_up(host.index), "set the host side up")?;
    let mut msg = Msg::new(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL);
    msg.rtmsg(32, RT_SCOPE_LINK, 0);
    msg.attr(RTA_DST, &pod.ip.octets());
    msg.attr(RTA_PREFSRC, &pod.gateway.octets());
    msg.attr_u32(RTA_OIF, host.index);
    host_nl.request(msg, "add the host route")?;
    Ok(host.index)
}

fn del(input: &Input) -> io::Result<()> {
    let host: String = input.get("host")?.to_owned();
    let host_ifindex: u32 = input.parse("host_ifindex")?;
    let ip: Ipv4Addr = input.parse("ip")?;
    let host_port: u16 = input.parse("host_port")?;
    let maps = input.get("maps")?;
    let host_nl = Netlink::open()?;
    map_delete(
        &obj_get(&format!("{maps}/{}", m::ENDPOINTS_MAP))?,
        &m::EndpointKey::v4(ip.octets()),
    )?;
    map_delete(
        &obj_get(&format!("{maps}/{}", m::RATE_LIMITS_MAP))?,
        &host_ifindex,
    )?;
    map_delete(
        &obj_get(&format!("{maps}/{}", m::PORTMAP_MAP))?,
        &port_key(host_port),
    )?;
    let sources = obj_get(&format!("{maps}/{}", m::SOURCES_MAP))?;
    map_delete(&sources, &source_key(host_ifindex, Some(ip)))?;
    map_delete(&sources, &source_key(host_ifindex, None))?;
    let mut msg = Msg::new(RTM_DELLINK, 0);
    msg.ifinfo(0, 0, 0);
    msg.attr_str(IFLA_IFNAME, &host);
    host_nl.request(msg, "delete the veth pair")?;
    Ok(())
}

fn port_key(host_port: u16) -> m::PortKey {
    m::PortKey {
        addr: m::PortKey::WILDCARD_V4,
        port: host_port,
        proto: m::IPPROTO_TCP,
        _pad: 0,
    }
}

/// An LPM key of the source map: the prefix length, then the [`m::SourceKey`]; the pod's
/// address (/32) or, with `None`, its catch-all.
fn source_key(ifindex: u32, ip: Option<Ipv4Addr>) -> [u8; 28] {
    let (bits, key) = match ip {
        Some(ip) => {
            let mut addr = [0u8; 16];
            addr[..4].copy_from_slice(&ip.octets());
            (
                m::SOURCE_HEAD_BITS + 32,
                m::SourceKey {
                    ifindex,
                    family: m::SOURCE_FAMILY_V4,
                    addr,
                },
            )
        }
        None => (
            m::SOURCE_POD_BITS,
            m::SourceKey {
                ifindex,
                ..Default::default()
            },
        ),
    };
    let mut out = [0u8; 28];
    out[..4].copy_from_slice(&bits.to_ne_bytes());
    out[4..].copy_from_slice(bytes(&key));
    out
}

fn random_mac() -> io::Result<[u8; 6]> {
    let mut mac = [0u8; 6];
    // SAFETY: `mac` is writable for its length.
    if unsafe { libc::getrandom(mac.as_mut_ptr().cast(), mac.len(), 0) } != 6 {
        return Err(io::Error::last_os_error());
    }
    // Unicast, locally administered.
    mac[0] = (mac[0] & 0xfe) | 0x02;
    Ok(mac)
}

fn link_up(index: u32) -> Msg {
    let mut msg = Msg::new(RTM_NEWLINK, 0);
    msg.ifinfo(index, libc::IFF_UP as u32, libc::IFF_UP as u32);
    msg
}

/// The bytes of a `#[repr(C)]` value without padding (the maps crate's types are).
fn bytes<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: `v` is a valid `T` of `size_of::<T>()` bytes, all initialized (no padding in
    // the maps crate's types, which assert their sizes).
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

// ---- bpf(2) ----

const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_OBJ_GET: libc::c_long = 7;

fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a zero-initialized `union bpf_attr` of 128 bytes, filled for `cmd`.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 128usize) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

fn obj_get(path: &str) -> io::Result<OwnedFd> {
    let c = CString::new(path).map_err(io::Error::other)?;
    let mut attr = [0u64; 16];
    attr[0] = c.as_ptr() as u64;
    let fd = bpf(BPF_OBJ_GET, &mut attr).map_err(|e| io::Error::other(format!("{path}: {e}")))?;
    // SAFETY: the kernel returned a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn map_update<K: Copy, V: Copy>(map: &OwnedFd, key: &K, value: &V) -> io::Result<()> {
    let mut attr = [0u64; 16];
    attr[0] = map.as_raw_fd() as u64;
    attr[1] = bytes(key).as_ptr() as u64;
    attr[2] = bytes(value).as_ptr() as u64;
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(|_| ())
}

fn map_delete<K: Copy>(map: &OwnedFd, key: &K) -> io::Result<()> {
    let mut attr = [0u64; 16];
    attr[0] = map.as_raw_fd() as u64;
    attr[1] = bytes(key).as_ptr() as u64;
    match bpf(BPF_MAP_DELETE_ELEM, &mut attr) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        r => r.map(|_| ()),
    }
}

// ---- rtnetlink ----

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
const RTM_NEWQDISC: u16 = 36;
const RTM_NEWTFILTER: u16 = 44;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_ECHO: u16 = 0x8;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLA_F_NESTED: u16 = 0x8000;
const IFLA_ADDRESS: u16 = 1;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_LINK: u16 = 5;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_NUM_TX_QUEUES: u16 = 31;
const IFLA_NUM_RX_QUEUES: u16 = 32;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_FLAGS: u16 = 8;
const IFA_F_NODAD: u32 = 0x02;
const IFA_F_NOPREFIXROUTE: u32 = 0x200;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PREFSRC: u16 = 7;
const RTNH_F_ONLINK: u32 = 4;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_BOOT: u8 = 3;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RT_SCOPE_LINK: u8 = 253;
const RTN_UNICAST: u8 = 1;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_BPF_FD: u16 = 6;
const TCA_BPF_NAME: u16 = 7;
const TCA_BPF_FLAGS: u16 = 8;
const TCA_BPF_FLAG_ACT_DIRECT: u32 = 1;
const TC_H_CLSACT: u32 = 0xffff_fff1;
const CLSACT_HANDLE: u32 = 0xffff_0000;
const CLSACT_INGRESS: u32 = 0xffff_fff2;
const CLSACT_EGRESS: u32 = 0xffff_fff3;
const ETH_P_ALL: u16 = 0x0003;

/// One netlink message being built: the header, a fixed part, attributes (nested ones
/// closed by [`Msg::end`]).
struct Msg {
    buf: Vec<u8>,
    open: Vec<usize>,
}

impl Msg {
    fn new(kind: u16, flags: u16) -> Self {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK | flags).to_ne_bytes());
        buf.extend_from_slice(&[0; 8]);
        Self {
            buf,
            open: Vec::new(),
        }
    }

    fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
        self.buf.resize((self.buf.len() + 3) & !3, 0);
    }

    /// `struct ifinfomsg`.
    fn ifinfo(&mut self, index: u32, flags: u32, change: u32) {
        let mut b = [0u8; 16];
        b[4..8].copy_from_slice(&index.to_ne_bytes());
        b[8..12].copy_from_slice(&flags.to_ne_bytes());
        b[12..16].copy_from_slice(&change.to_ne_bytes());
        self.raw(&b);
    }

    /// `struct ifaddrmsg`.
    fn ifaddr(&mut self, family: u8, prefix: u8, index: u32) {
        let mut b = [family, prefix, 0, 0, 0, 0, 0, 0];
        b[4..8].copy_from_slice(&index.to_ne_bytes());
        self.raw(&b);
    }

    /// `struct rtmsg`, IPv4, main table, unicast.
    fn rtmsg(&mut self, dst_len: u8, scope: u8, flags: u32) {
        let mut b = [
            libc::AF_INET as u8,
            dst_len,
            0,
            0,
            RT_TABLE_MAIN,
            RTPROT_BOOT,
            scope,
            RTN_UNICAST,
            0,
            0,
            0,
            0,
        ];
        b[8..12].copy_from_slice(&flags.to_ne_bytes());
        self.raw(&b);
    }

    /// `struct tcmsg`.
    fn tcmsg(&mut self, ifindex: u32, handle: u32, parent: u32, info: u32) {
        let mut b = [0u8; 20];
        b[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        b[8..12].copy_from_slice(&handle.to_ne_bytes());
        b[12..16].copy_from_slice(&parent.to_ne_bytes());
        b[16..20].copy_from_slice(&info.to_ne_bytes());
        self.raw(&b);
    }

    fn attr(&mut self, kind: u16, data: &[u8]) {
        self.buf
            .extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.raw(data);
    }

    fn attr_u32(&mut self, kind: u16, v: u32) {
        self.attr(kind, &v.to_ne_bytes());
    }

    fn attr_str(&mut self, kind: u16, s: &str) {
        let mut b = s.as_bytes().to_vec();
        b.push(0);
        self.attr(kind, &b);
    }

    fn nest(&mut self, kind: u16) {
        self.open.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    }

    fn end(&mut self) {
        let at = self.open.pop().expect("a nest is open");
        let len = (self.buf.len() - at) as u16;
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn finish(mut self, seq: u32) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.buf
    }
}

/// What the echo of a new link (or a `RTM_GETLINK`) says about it.
struct LinkInfo {
    index: u32,
    mac: [u8; 6],
    /// A veth's peer index (in the peer's namespace).
    peer: Option<u32>,
}

impl LinkInfo {
    /// From the body of a `RTM_NEWLINK` message: `struct ifinfomsg`, then attributes.
    fn parse(body: &[u8]) -> Option<Self> {
        let index = u32::from_ne_bytes(body.get(4..8)?.try_into().ok()?);
        let mut l = LinkInfo {
            index,
            mac: [0; 6],
            peer: None,
        };
        let mut attrs = body.get(16..)?;
        while attrs.len() >= 4 {
            let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
            let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
            if len < 4 || len > attrs.len() {
                break;
            }
            let data = &attrs[4..len];
            match kind {
                IFLA_ADDRESS if data.len() == 6 => l.mac.copy_from_slice(data),
                IFLA_LINK if data.len() == 4 => {
                    l.peer = Some(u32::from_ne_bytes(data.try_into().ok()?))
                }
                _ => {}
            }
            attrs = &attrs[((len + 3) & !3).min(attrs.len())..];
        }
        Some(l)
    }
}

/// A `NETLINK_ROUTE` socket of one namespace.
struct Netlink {
    fd: OwnedFd,
    seq: std::cell::Cell<u32>,
}

impl Netlink {
    fn open() -> io::Result<Self> {
        // SAFETY: plain socket(2); the fd is owned right away.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: a fresh descriptor nobody else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            seq: std::cell::Cell::new(0),
        })
    }

    /// A socket in the namespace `ns`: this thread enters it for the socket's creation.
    fn open_in(ns: &File) -> io::Result<Self> {
        let own = File::open("/proc/thread-self/ns/net")?;
        let enter = |f: &File| {
            // SAFETY: setns(2) on a namespace file we hold open.
            if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        };
        enter(ns)?;
        let sock = Self::open();
        enter(&own)?;
        sock
    }

    /// Sends `msg` and reads until its acknowledgement; returns the bodies of the messages
    /// before it (an echo).
    fn request(&self, msg: Msg, what: &str) -> io::Result<Vec<Vec<u8>>> {
        let seq = self.seq.get() + 1;
        self.seq.set(seq);
        let msg = msg.finish(seq);
        // SAFETY: `msg` is a valid buffer of its length; the peer is the kernel.
        if unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut out = Vec::new();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            // SAFETY: `buf` is writable for its length.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut msgs = &buf[..n as usize];
            while msgs.len() >= 16 {
                let len = u32::from_ne_bytes(msgs[0..4].try_into().expect("4 bytes")) as usize;
                if len < 16 || len > msgs.len() {
                    return Err(io::Error::other("malformed netlink answer"));
                }
                let kind = u16::from_ne_bytes([msgs[4], msgs[5]]);
                let body = &msgs[16..len];
                match kind {
                    NLMSG_ERROR => {
                        let errno = i32::from_ne_bytes(body[0..4].try_into().expect("4 bytes"));
                        return if errno == 0 {
                            Ok(out)
                        } else {
                            Err(io::Error::other(format!(
                                "{what}: {}",
                                io::Error::from_raw_os_error(-errno)
                            )))
                        };
                    }
                    NLMSG_DONE => return Ok(out),
                    _ => out.push(body.to_vec()),
                }
                msgs = &msgs[((len + 3) & !3).min(msgs.len())..];
            }
        }
    }

    /// `RTM_GETLINK` by name.
    fn link(&self, name: &str) -> io::Result<LinkInfo> {
        let mut msg = Msg::new(RTM_GETLINK, 0);
        msg.ifinfo(0, 0, 0);
        msg.attr_str(IFLA_IFNAME, name);
        self.request(msg, "get the host side")?
            .iter()
            .find_map(|b| LinkInfo::parse(b))
            .ok_or_else(|| io::Error::other(format!("no link {name}")))
    }
}
