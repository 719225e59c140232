//! XDP against TC on the uplink: external client → hostPort single-stream
//! TCP throughput (iperf3) and TCP_CRR on one ebpf-cni node, with the host-port DNAT done by
//! the TC program `ecni_from_dev` (the product) or by the XDP prototype `ecni_xdp_dev`
//! attached to the node's uplink veth in native (driver) mode in front of it.
//!
//! Three modes on the same node, pod and servers, alternating within every repeat (XDP
//! attached for its turn and detached after), so a noisy moment hits all of them:
//! - TC, the client's offloads on: the product on a veth uplink as it runs, 64 KB GSO
//!   packets with offloaded checksums crossing the veth whole;
//! - TC, the client's checksum offload off and GRO on the uplink: full-checksum 1500-byte
//!   frames, as a NIC's peer sends them and a NIC merges them;
//! - XDP with those frames. What XDP costs the veth is part of its figure, not set aside:
//!   attaching it turns off its peer's segmentation offloads (the client's TCP sends
//!   1500-byte frames), and a frame redirected at XDP crosses into the pod as an XDP frame,
//!   which the pod's veth end takes only with NAPI on: GRO on that interface (on in every
//!   mode). XDP cannot read an skb's checksum state, so the prototype patches the transport
//!   checksum as a full one; with the client's checksum offload on no connection gets
//!   through, which the section probes once and reports, as it does for NAPI off.
//!
//! Only ebpf-cni has the prototype; the reference chain has no column here.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use aya::programs::{xdp::XdpLinkId, Xdp, XdpMode};
use aya::Ebpf;
use ebpf_cni_tests::Netns;

use crate::log::progress;
use crate::metric::{Metric, UplinkMode, XdpFigure};
use crate::model::{Cell, Repeats, Subject, Table};
use crate::params::Params;
use crate::rig::load::{self, EchoServer, Iperf3Server, Proto};
use crate::rig::topo::{self, BenchNode, Binaries, Pod};

const IPERF_PORT: u16 = 5201;
const ECHO_PORT: u16 = 7000;
const IPERF_HOST_PORT: u16 = 28_180;
const ECHO_HOST_PORT: u16 = 28_181;
/// TCP_CRR time per repeat is split into this many slices alternating the modes.
const CRR_SLICES: u32 = 4;
/// The modes, in the order they alternate.
const MODES: [UplinkMode; 3] = UplinkMode::ALL;

pub struct Output {
    pub table: Table,
}

/// `SIOCETHTOOL` and the legacy ethtool commands used (linux/sockios.h, linux/ethtool.h).
const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_STXCSUM: u32 = 0x17;
const ETHTOOL_SGRO: u32 = 0x2c;

#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: *mut EthtoolValue,
    _pad: [u8; 16],
}

/// `ethtool -K dev <feature> on|off` in namespace `ns`, by the legacy ioctl.
fn ethtool_set(ns: &Netns, dev: &str, cmd: u32, on: bool) -> Result<()> {
    ns.run_in(|| -> Result<()> {
        let mut v = EthtoolValue {
            cmd,
            data: u32::from(on),
        };
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            data: &mut v,
            _pad: [0; 16],
        };
        if dev.len() >= libc::IFNAMSIZ {
            bail!("interface name {dev} too long");
        }
        req.name[..dev.len()].copy_from_slice(dev.as_bytes());
        // SAFETY: a plain socket call; the descriptor is closed below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
        if fd < 0 {
            bail!("socket: {}", std::io::Error::last_os_error());
        }
        // SAFETY: `req` and the value it points to outlive the call.
        let rc = unsafe { libc::ioctl(fd, SIOCETHTOOL as _, &mut req) };
        let err = std::io::Error::last_os_error();
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
        if rc != 0 {
            bail!("ethtool command {cmd:#x} on {dev}: {err}");
        }
        Ok(())
    })?
}

struct Setup {
    // Servers first: they must stop before their namespaces go.
    _iperf: Iperf3Server,
    _echo: EchoServer,
    pod: Pod,
    /// The prototype, loaded into the node's pinned maps; detached unless `link` is set.
    ebpf: Ebpf,
    link: Option<XdpLinkId>,
    /// The external client's checksum offload and the uplink's GRO, as last set.
    csum_gro: Option<(bool, bool)>,
    /// Whether an external client with its checksum offload on reaches the host port with
    /// the prototype attached (the probe's error if not).
    xdp_with_offload: std::result::Result<(), String>,
    /// Whether the host port answers with the prototype attached and GRO (NAPI) off on
    /// the pod's interface.
    xdp_without_napi: std::result::Result<(), String>,
    uplink_ifindex: u32,
    node: BenchNode,
}

impl Setup {
    fn new(bins: &Binaries) -> Result<Self> {
        let node = BenchNode::new(Subject::EbpfCni, bins)?;
        let (pod, _) = node.add_pod(
            "xdp-server",
            topo::caps(
                &[(IPERF_HOST_PORT, IPERF_PORT), (ECHO_HOST_PORT, ECHO_PORT)],
                None,
            ),
        )?;
        let ip = pod.ip4()?;
        // The pod's end takes XDP frames only with NAPI on (both modes alike).
        ethtool_set(&pod.netns, &pod.att.ifname, ETHTOOL_SGRO, true)
            .context("GRO on the pod's interface")?;
        let ext = &node.external;
        let iperf = Iperf3Server::start(&pod.netns, ip, IPERF_PORT)?;
        let echo = EchoServer::start(&pod.netns, ECHO_PORT)?;
        let mut ebpf = crate::rig::object::on_node(bins, &node)?;
        let prog: &mut Xdp = ebpf
            .program_mut(ebpf_cni_maps::PROG_XDP_DEV)
            .context("no XDP prototype in the object")?
            .try_into()?;
        prog.load().context("verifying the XDP prototype")?;
        let uplink_ifindex = node
            .node
            .netns()
            .run_in(|| {
                let name = std::ffi::CString::new(ext.node_dev()).expect("no NUL");
                // SAFETY: a valid C string.
                unsafe { libc::if_nametoindex(name.as_ptr()) }
            })
            .context("the uplink's index")?;
        if uplink_ifindex == 0 {
            bail!("no device {} on the node", ext.node_dev());
        }
        let mut s = Self {
            _iperf: iperf,
            _echo: echo,
            pod,
            ebpf,
            link: None,
            csum_gro: None,
            xdp_with_offload: Ok(()),
            xdp_without_napi: Ok(()),
            uplink_ifindex,
            node,
        };
        for mode in MODES {
            s.set(mode)?;
            load::probe_echo(s.node.ext(), s.echo_target())
                .with_context(|| format!("ext → hostPort echo, {}", mode.label()))?;
        }
        // What XDP does to frames with offloaded checksums: the offload on, XDP attached.
        s.set(UplinkMode::TcOffload)?;
        s.attach(true)?;
        s.xdp_with_offload = load::probe_echo(s.node.ext(), s.echo_target())
            .map_err(|e| format!("{:#}", e.root_cause()));
        s.attach(false)?;
        // And what it needs of the pod's interface: GRO off there, XDP attached.
        s.set(UplinkMode::Xdp)?;
        ethtool_set(&s.pod.netns, &s.pod.att.ifname, ETHTOOL_SGRO, false)?;
        s.xdp_without_napi = load::probe_echo(s.node.ext(), s.echo_target())
            .map_err(|e| format!("{:#}", e.root_cause()));
        ethtool_set(&s.pod.netns, &s.pod.att.ifname, ETHTOOL_SGRO, true)?;
        s.set(UplinkMode::TcOffload)?;
        Ok(s)
    }

    fn echo_target(&self) -> SocketAddr {
        (topo::NODE_UPLINK_IP, ECHO_HOST_PORT).into()
    }

    /// Sets the external client's checksum offload and attaches the prototype to the
    /// uplink in native mode, or detaches it, as `mode` says.
    fn set(&mut self, mode: UplinkMode) -> Result<()> {
        // Frames as a NIC's peer sends them get GRO on the uplink, as on a NIC (XDP turns
        // NAPI on there by itself); the veth's default, backlog without GRO, otherwise.
        let (csum, gro, xdp) = match mode {
            UplinkMode::TcOffload => (true, false, false),
            UplinkMode::Tc => (false, true, false),
            UplinkMode::Xdp => (false, true, true),
        };
        if self.csum_gro != Some((csum, gro)) {
            let ext = &self.node.external;
            ethtool_set(ext.netns(), ext.host_dev(), ETHTOOL_STXCSUM, csum)
                .context("the external client's checksum offload")?;
            ethtool_set(self.node.node.netns(), ext.node_dev(), ETHTOOL_SGRO, gro)
                .context("GRO on the uplink")?;
            self.csum_gro = Some((csum, gro));
        }
        self.attach(xdp)
    }

    /// Attaches the prototype to the uplink in native mode, or detaches it.
    fn attach(&mut self, xdp: bool) -> Result<()> {
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(ebpf_cni_maps::PROG_XDP_DEV)
            .context("no XDP prototype")?
            .try_into()?;
        match (xdp, self.link.take()) {
            (true, None) => {
                let ifindex = self.uplink_ifindex;
                let id = self
                    .node
                    .node
                    .netns()
                    .run_in(|| prog.attach_to_if_index(ifindex, XdpMode::Driver))?
                    .context("attaching the XDP prototype in native mode")?;
                self.link = Some(id);
            }
            (false, Some(id)) => prog.detach(id).context("detaching the XDP prototype")?,
            (_, link) => self.link = link,
        }
        Ok(())
    }

    /// The prototype's run count so far (0 when the statistics are off).
    fn xdp_runs(&self) -> u64 {
        self.ebpf
            .program(ebpf_cni_maps::PROG_XDP_DEV)
            .and_then(|p| {
                let p: &Xdp = p.try_into().ok()?;
                p.info().ok()
            })
            .map_or(0, |i| i.run_count())
    }
}

pub fn run(p: &Params, bins: &Binaries) -> Output {
    let mut fig: BTreeMap<(XdpFigure, UplinkMode), Repeats> = BTreeMap::new();
    let mut setup = match Setup::new(bins) {
        Ok(s) => Some(s),
        Err(e) => {
            progress(&format!("xdp: setting up failed: {e:#}"));
            for f in XdpFigure::ALL {
                for mode in MODES {
                    fig.entry((f, mode))
                        .or_default()
                        .set_instead(Subject::EbpfCni, Cell::failed(&e));
                }
            }
            None
        }
    };
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "?".to_owned(), |k| k.trim().to_owned());
    if let Some(s) = &mut setup {
        let crr_time = Duration::from_secs_f64(p.rr_secs);
        let iperf_target = SocketAddr::from((topo::NODE_UPLINK_IP, IPERF_HOST_PORT));
        let stats = crate::sections::source_check::BpfStats::on();
        for rep in 0..p.repeats {
            progress(&format!(
                "xdp: repeat {}/{}: iperf3 {} s, CRR {} s, TC (offloads on and off) and XDP",
                rep + 1,
                p.repeats,
                p.iperf_secs,
                p.rr_secs
            ));
            let mut got: BTreeMap<(XdpFigure, UplinkMode), f64> = BTreeMap::new();
            for mode in MODES {
                let xdp = mode == UplinkMode::Xdp;
                let r = s.set(mode).and_then(|()| {
                    let before = s.xdp_runs();
                    let res = load::iperf3(
                        s.node.ext(),
                        iperf_target,
                        p.iperf_secs,
                        p.iperf_omit,
                        false,
                        Proto::Tcp,
                    )?;
                    // The figure is XDP's only if the prototype did the work.
                    if xdp && stats.is_ok() && s.xdp_runs() == before {
                        bail!("the XDP prototype did not run");
                    }
                    Ok(res.receiver_bps / 1e9)
                });
                let e = fig.entry((XdpFigure::Throughput, mode)).or_default();
                match r {
                    Ok(v) => {
                        e.push(Subject::EbpfCni, v);
                        got.insert((XdpFigure::Throughput, mode), v);
                    }
                    Err(err) => e.set_instead(Subject::EbpfCni, Cell::failed(&err)),
                }
            }
            let mut conns: BTreeMap<UplinkMode, (usize, f64)> = BTreeMap::new();
            for _ in 0..CRR_SLICES {
                for mode in MODES {
                    let target = s.echo_target();
                    let r = s.set(mode).and_then(|()| {
                        load::tcp_crr(s.node.ext(), target, crr_time / CRR_SLICES, usize::MAX)
                    });
                    match r {
                        Ok(c) => {
                            let e = conns.entry(mode).or_default();
                            e.0 += c.connect_us.len();
                            e.1 += c.secs;
                        }
                        Err(err) => fig
                            .entry((XdpFigure::Crr, mode))
                            .or_default()
                            .set_instead(Subject::EbpfCni, Cell::failed(&err)),
                    }
                }
            }
            for (mode, (n, secs)) in conns {
                fig.entry((XdpFigure::Crr, mode))
                    .or_default()
                    .push(Subject::EbpfCni, n as f64 / secs);
                got.insert((XdpFigure::Crr, mode), n as f64 / secs);
            }
            // This repeat's ratios: XDP over each TC mode.
            for (of, over) in [
                (XdpFigure::Throughput, XdpFigure::ThroughputXdpOver),
                (XdpFigure::Crr, XdpFigure::CrrXdpOver),
            ] {
                for tc in [UplinkMode::TcOffload, UplinkMode::Tc] {
                    if let (Some(x), Some(t)) =
                        (got.get(&(of, UplinkMode::Xdp)), got.get(&(of, tc)))
                    {
                        fig.entry((over, tc))
                            .or_default()
                            .push(Subject::EbpfCni, x / t);
                    }
                }
            }
        }
        drop(stats);
        let _ = s.set(UplinkMode::TcOffload);
    }
    let offload_probe = setup.as_ref().map(|s| s.xdp_with_offload.clone());
    let napi_probe = setup.as_ref().map(|s| s.xdp_without_napi.clone());
    let answer = |p: Option<std::result::Result<(), String>>| match p {
        Some(Ok(())) => "the host port answers".to_owned(),
        Some(Err(e)) => format!("no connection ({e})"),
        None => "not measured".to_owned(),
    };
    drop(setup);

    let mut table = Table::new(
        "XDP: external → hostPort with the DNAT at XDP or at TC",
        format!("median [min–max] over {} repeat(s)", p.repeats),
    );
    for f in XdpFigure::ALL {
        let ratio = matches!(f, XdpFigure::ThroughputXdpOver | XdpFigure::CrrXdpOver);
        for mode in MODES {
            if ratio && mode == UplinkMode::Xdp {
                continue;
            }
            table.rows.push(
                fig.entry((f, mode))
                    .or_default()
                    .row(Metric::Xdp { figure: f, mode }),
            );
        }
    }
    table.notes = vec![
        format!(
            "One ebpf-cni node (kernel {kernel}), one pod with two host ports, its interface \
             with GRO on (NAPI: it takes XDP frames) in every mode. TC, offloads on: the \
             product on a veth uplink as it is, the client's TCP sends 64 KB GSO packets with \
             offloaded checksums; `ecni_from_dev` translates and delivers with \
             `bpf_redirect_peer`. TC, checksum offload off: the client sends full-checksum \
             1500-byte frames (MTU {}), as a NIC's peer does, and the uplink has GRO on, as a \
             NIC has. XDP: the same frames; the prototype `ecni_xdp_dev` (ebpf/src/xdp.rs) is \
             attached to the uplink veth in native mode for its turn, translates and \
             redirects to the pod's host veth (an XDP frame into the pod, merged by the pod \
             interface's GRO). iperf3 -t {} -O {}, one TCP stream; TCP_CRR {} s per repeat in \
             {CRR_SLICES} slices alternating the modes.",
            topo::MTU,
            p.iperf_secs,
            p.iperf_omit,
            p.rr_secs
        ),
        format!(
            "XDP with the client's checksum offload on (what a local sender on a veth \
             does): {}. XDP cannot tell an offloaded checksum (the pseudo header's sum) from \
             a full one, and an XDP frame carries no checksum state into the pod. XDP with \
             GRO off on the pod's interface (no NAPI there to take XDP frames; a veth's \
             default): {}.",
            answer(offload_probe),
            answer(napi_probe)
        ),
        "The prototype's run count is checked to grow during each XDP throughput figure \
         (kernel BPF statistics on for the section). The reference chain has no XDP program, \
         so it has no column here."
            .to_owned(),
    ];
    Output { table }
}
