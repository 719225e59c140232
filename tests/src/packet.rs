//! Frames for the program tests ([`crate::progtest`]): Ethernet carrying IPv4 or IPv6 (with
//! IPv4 fragments and IPv6 extension headers when asked) and TCP, UDP, ICMP / ICMPv6 echo
//! or errors, or ARP, built with correct checksums; and the same frames read back, with
//! every checksum verified, after a program rewrote them.
//!
//! Written by hand rather than with a packet crate: the tests need frames no well-formed
//! builder makes (cut short anywhere, quoted packets inside ICMP errors, fragments), and
//! the checksum check must be independent of anything the programs or the kernel compute.

use std::net::IpAddr;

pub const ETH_HLEN: usize = 14;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_ARP: u16 = 0x0806;

pub const IPPROTO_HOPOPTS: u8 = 0;
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_FRAGMENT: u8 = 44;
pub const IPPROTO_ICMPV6: u8 = 58;
pub const IPPROTO_DSTOPTS: u8 = 60;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_ACK: u8 = 0x10;

/// IPv4 "don't fragment" and "more fragments" bits of the flags and offset field.
pub const IP_DF: u16 = 0x4000;
pub const IP_MF: u16 = 0x2000;

/// ICMP destination unreachable, and its "port unreachable" code; ICMPv6's.
pub const ICMP_DEST_UNREACH: u8 = 3;
pub const ICMP_PORT_UNREACH: u8 = 3;
pub const ICMPV6_DEST_UNREACH: u8 = 1;
pub const ICMPV6_PORT_UNREACH: u8 = 4;

/// The transport part of a packet.
#[derive(Clone, Debug)]
pub enum L4 {
    Tcp {
        sport: u16,
        dport: u16,
        flags: u8,
        /// TCP options, a multiple of 4 bytes long.
        options: Vec<u8>,
    },
    Udp {
        sport: u16,
        dport: u16,
    },
    /// ICMP (IPv4) or ICMPv6 (IPv6) echo, by the packet's family.
    Echo {
        request: bool,
        id: u16,
        seq: u16,
    },
    /// An ICMP or ICMPv6 error quoting `quote` (an IP packet, from its IP header on).
    Error {
        kind: u8,
        code: u8,
        quote: Vec<u8>,
    },
}

impl L4 {
    pub fn tcp(sport: u16, dport: u16, flags: u8) -> Self {
        L4::Tcp {
            sport,
            dport,
            flags,
            options: Vec::new(),
        }
    }

    pub fn udp(sport: u16, dport: u16) -> Self {
        L4::Udp { sport, dport }
    }

    pub fn echo_request(id: u16) -> Self {
        L4::Echo {
            request: true,
            id,
            seq: 1,
        }
    }

    pub fn echo_reply(id: u16) -> Self {
        L4::Echo {
            request: false,
            id,
            seq: 1,
        }
    }
}

/// An IP packet in an Ethernet frame, built by [`Pkt::frame`].
#[derive(Clone, Debug)]
pub struct Pkt {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src: IpAddr,
    pub dst: IpAddr,
    pub ttl: u8,
    /// IPv4 TOS / IPv6 traffic class (its low two bits are ECN).
    pub tos: u8,
    /// IPv4 flags and fragment offset (host order); `IP_DF` by default.
    pub frag: u16,
    /// IPv4 identification; 0x1234 by default.
    pub ident: u16,
    /// An IPv6 fragment header's offset (in bytes, a multiple of 8) and M (its lowest
    /// bit); 1 by default (a first fragment).
    pub frag6: u16,
    /// IPv6 extension headers before the transport header, by type
    /// (`IPPROTO_HOPOPTS`, `IPPROTO_DSTOPTS`, `IPPROTO_FRAGMENT`), each 8 bytes.
    pub ext: Vec<u8>,
    pub l4: L4,
    pub payload: Vec<u8>,
}

impl Pkt {
    /// A packet from `src` to `dst` (one family), TTL 64, no payload, zero MACs.
    pub fn new(src: IpAddr, dst: IpAddr, l4: L4) -> Self {
        assert_eq!(src.is_ipv4(), dst.is_ipv4(), "{src} and {dst}: one family");
        Self {
            src_mac: [0; 6],
            dst_mac: [0; 6],
            src,
            dst,
            ttl: 64,
            tos: 0,
            frag: IP_DF,
            ident: 0x1234,
            frag6: 1,
            ext: Vec::new(),
            l4,
            payload: Vec::new(),
        }
    }

    pub fn macs(mut self, src: [u8; 6], dst: [u8; 6]) -> Self {
        self.src_mac = src;
        self.dst_mac = dst;
        self
    }

    pub fn ttl(mut self, ttl: u8) -> Self {
        self.ttl = ttl;
        self
    }

    pub fn tos(mut self, tos: u8) -> Self {
        self.tos = tos;
        self
    }

    pub fn frag(mut self, frag: u16) -> Self {
        self.frag = frag;
        self
    }

    pub fn ident(mut self, ident: u16) -> Self {
        self.ident = ident;
        self
    }

    pub fn frag6(mut self, frag6: u16) -> Self {
        self.frag6 = frag6;
        self
    }

    pub fn ext(mut self, kind: u8) -> Self {
        self.ext.push(kind);
        self
    }

    /// `n` bytes of payload after the transport header.
    pub fn payload(mut self, n: usize) -> Self {
        self.payload = (0..n).map(|i| (i % 251) as u8).collect();
        self
    }

    fn l4_proto(&self) -> u8 {
        match (&self.l4, self.src.is_ipv4()) {
            (L4::Tcp { .. }, _) => IPPROTO_TCP,
            (L4::Udp { .. }, _) => IPPROTO_UDP,
            (L4::Echo { .. } | L4::Error { .. }, true) => IPPROTO_ICMP,
            (L4::Echo { .. } | L4::Error { .. }, false) => IPPROTO_ICMPV6,
        }
    }

    /// The transport header and payload, checksummed.
    fn transport(&self) -> Vec<u8> {
        let v4 = self.src.is_ipv4();
        let (mut t, sum_at) = match &self.l4 {
            L4::Tcp {
                sport,
                dport,
                flags,
                options,
            } => {
                assert!(options.len() % 4 == 0, "TCP options come in 32-bit words");
                let mut t = Vec::new();
                t.extend(sport.to_be_bytes());
                t.extend(dport.to_be_bytes());
                t.extend(1000u32.to_be_bytes()); // sequence
                t.extend(if flags & TCP_ACK != 0 { 2000u32 } else { 0 }.to_be_bytes());
                t.push((((20 + options.len()) / 4) as u8) << 4);
                t.push(*flags);
                t.extend(64_240u16.to_be_bytes()); // window
                t.extend([0, 0, 0, 0]); // checksum, urgent pointer
                t.extend(options);
                (t, 16)
            }
            L4::Udp { sport, dport } => {
                let mut t = Vec::new();
                t.extend(sport.to_be_bytes());
                t.extend(dport.to_be_bytes());
                t.extend(((8 + self.payload.len()) as u16).to_be_bytes());
                t.extend([0, 0]);
                (t, 6)
            }
            L4::Echo { request, id, seq } => {
                let kind = match (v4, request) {
                    (true, true) => 8,
                    (true, false) => 0,
                    (false, true) => 128,
                    (false, false) => 129,
                };
                let mut t = vec![kind, 0, 0, 0];
                t.extend(id.to_be_bytes());
                t.extend(seq.to_be_bytes());
                (t, 2)
            }
            L4::Error { kind, code, quote } => {
                let mut t = vec![*kind, *code, 0, 0, 0, 0, 0, 0];
                t.extend(quote);
                (t, 2)
            }
        };
        t.extend(&self.payload);
        let proto = self.l4_proto();
        // ICMP for IPv4 is the only one without the pseudo header.
        let sum = if proto == IPPROTO_ICMP {
            checksum(&t)
        } else {
            let mut p = pseudo_header(self.src, self.dst, proto, t.len());
            p.extend(&t);
            let s = checksum(&p);
            // UDP sends a computed 0 as 0xffff (0 means "no checksum").
            if proto == IPPROTO_UDP && s == 0 {
                0xffff
            } else {
                s
            }
        };
        t[sum_at..sum_at + 2].copy_from_slice(&sum.to_be_bytes());
        t
    }

    /// The IP packet (no Ethernet header).
    pub fn ip(&self) -> Vec<u8> {
        let t = self.transport();
        let proto = self.l4_proto();
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let mut h = vec![0x45, self.tos];
                h.extend(((20 + t.len()) as u16).to_be_bytes());
                h.extend(self.ident.to_be_bytes());
                h.extend(self.frag.to_be_bytes());
                h.extend([self.ttl, proto, 0, 0]);
                h.extend(s.octets());
                h.extend(d.octets());
                let sum = checksum(&h);
                h[10..12].copy_from_slice(&sum.to_be_bytes());
                h.extend(t);
                h
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let mut ext = Vec::new();
                for (i, kind) in self.ext.iter().enumerate() {
                    let next = self.ext.get(i + 1).copied().unwrap_or(proto);
                    match *kind {
                        // Fragment: offset and M, an identification.
                        IPPROTO_FRAGMENT => {
                            ext.extend([next, 0]);
                            ext.extend(self.frag6.to_be_bytes());
                            ext.extend([0, 0, 0x56, 0x78]);
                        }
                        // Options: one PadN filling the 8 bytes.
                        _ => ext.extend([next, 0, 1, 4, 0, 0, 0, 0]),
                    }
                }
                let first = self.ext.first().copied().unwrap_or(proto);
                let mut h = vec![0x60 | (self.tos >> 4), (self.tos & 0x0f) << 4, 0, 0];
                h.extend(((ext.len() + t.len()) as u16).to_be_bytes());
                h.extend([first, self.ttl]);
                h.extend(s.octets());
                h.extend(d.octets());
                h.extend(ext);
                h.extend(t);
                h
            }
            _ => unreachable!("one family, checked in Pkt::new"),
        }
    }

    /// The Ethernet frame.
    pub fn frame(&self) -> Vec<u8> {
        let ethertype = if self.src.is_ipv4() {
            ETH_P_IP
        } else {
            ETH_P_IPV6
        };
        eth(self.dst_mac, self.src_mac, ethertype, &self.ip())
    }
}

pub fn eth(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(ETH_HLEN + payload.len());
    f.extend(dst);
    f.extend(src);
    f.extend(ethertype.to_be_bytes());
    f.extend(payload);
    f
}

/// An ARP message for IPv4 over Ethernet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arp {
    /// 1 request, 2 reply.
    pub oper: u16,
    pub sha: [u8; 6],
    pub spa: [u8; 4],
    pub tha: [u8; 6],
    pub tpa: [u8; 4],
}

pub const ARP_REQUEST: u16 = 1;
pub const ARP_REPLY: u16 = 2;

impl Arp {
    /// "Who has `tpa`? Tell `spa`", broadcast.
    pub fn request(sha: [u8; 6], spa: [u8; 4], tpa: [u8; 4]) -> Self {
        Self {
            oper: ARP_REQUEST,
            sha,
            spa,
            tha: [0; 6],
            tpa,
        }
    }

    pub fn frame(&self, dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
        let mut a = vec![0, 1, 0x08, 0x00, 6, 4];
        a.extend(self.oper.to_be_bytes());
        a.extend(self.sha);
        a.extend(self.spa);
        a.extend(self.tha);
        a.extend(self.tpa);
        eth(dst, src, ETH_P_ARP, &a)
    }

    pub fn parse(frame: &[u8]) -> Self {
        assert!(
            frame.len() >= ETH_HLEN + 28 && be16(frame, 12) == ETH_P_ARP,
            "not an ARP frame: {frame:02x?}"
        );
        let a = &frame[ETH_HLEN..];
        Self {
            oper: be16(a, 6),
            sha: a[8..14].try_into().unwrap(),
            spa: a[14..18].try_into().unwrap(),
            tha: a[18..24].try_into().unwrap(),
            tpa: a[24..28].try_into().unwrap(),
        }
    }
}

pub fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The 16-bit one's complement of the one's complement sum of `data` (RFC 1071).
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum(data))
}

fn sum(data: &[u8]) -> u32 {
    let mut s: u32 = 0;
    for c in data.chunks(2) {
        let w = u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]);
        s += u32::from(w);
    }
    s
}

fn fold(mut s: u32) -> u16 {
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

fn pseudo_header(src: IpAddr, dst: IpAddr, proto: u8, len: usize) -> Vec<u8> {
    let mut p = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            p.extend(s.octets());
            p.extend(d.octets());
            p.extend([0, proto]);
            p.extend((len as u16).to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            p.extend(s.octets());
            p.extend(d.octets());
            p.extend((len as u32).to_be_bytes());
            p.extend([0, 0, 0, proto]);
        }
        _ => unreachable!("one family"),
    }
    p
}

/// An IPv4 frame (no options) cut into fragments of at most `chunk` bytes of payload each
/// (a multiple of 8), as a sender's stack cuts a datagram larger than its MTU: the same
/// Ethernet header, identification and addresses, the offsets and MF set, each header's
/// length and checksum made anew.
pub fn fragment(frame: &[u8], chunk: usize) -> Vec<Vec<u8>> {
    assert_eq!(chunk % 8, 0, "fragments carry multiples of 8 bytes");
    let ip = &frame[ETH_HLEN..];
    assert_eq!(ip[0], 0x45, "IPv4 without options");
    let total = usize::from(be16(ip, 2));
    let data = &ip[20..total];
    let parts: Vec<&[u8]> = data.chunks(chunk).collect();
    parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            let mut h = ip[..20].to_vec();
            h[2..4].copy_from_slice(&((20 + part.len()) as u16).to_be_bytes());
            let mf = if i + 1 < parts.len() { IP_MF } else { 0 };
            h[6..8].copy_from_slice(&(mf | (i * chunk / 8) as u16).to_be_bytes());
            h[10..12].copy_from_slice(&[0, 0]);
            let sum = checksum(&h);
            h[10..12].copy_from_slice(&sum.to_be_bytes());
            h.extend_from_slice(part);
            let mut f = frame[..ETH_HLEN].to_vec();
            f.extend(h);
            f
        })
        .collect()
}

/// The fragments `frames` (in order; IPv4's every one's header checksum verified, IPv6's
/// fragment header right after the fixed one) put back into one frame: the first's Ethernet and IP headers, not a fragment any more, and the
/// fragments' payloads at their offsets. Panics when they do not fit together (addresses,
/// identification, protocol or offsets differ).
pub fn reassemble(frames: &[Vec<u8>]) -> Vec<u8> {
    if frames[0][ETH_HLEN] >> 4 == 6 {
        return reassemble6(frames);
    }
    let first = &frames[0][ETH_HLEN..];
    let mut data = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        let ip = &f[ETH_HLEN..];
        assert_eq!(ip[0], 0x45, "fragment {i}: IPv4 without options");
        assert_eq!(
            fold(sum(&ip[..20])),
            0xffff,
            "fragment {i}: header checksum"
        );
        assert_eq!(
            (&ip[4..6], ip[9], &ip[12..20]),
            (&first[4..6], first[9], &first[12..20]),
            "fragment {i}: identification, protocol and addresses of the first"
        );
        let off = usize::from(be16(ip, 6) & 0x1fff) * 8;
        assert_eq!(off, data.len(), "fragment {i}: offset");
        let more = be16(ip, 6) & IP_MF != 0;
        assert_eq!(
            more,
            i + 1 < frames.len(),
            "fragment {i}: more fragments flag"
        );
        data.extend_from_slice(&ip[20..usize::from(be16(ip, 2))]);
    }
    let mut h = first[..20].to_vec();
    h[2..4].copy_from_slice(&((20 + data.len()) as u16).to_be_bytes());
    h[6..8].copy_from_slice(&[0, 0]);
    h[10..12].copy_from_slice(&[0, 0]);
    let s = checksum(&h);
    h[10..12].copy_from_slice(&s.to_be_bytes());
    h.extend(data);
    let mut f = frames[0][..ETH_HLEN].to_vec();
    f.extend(h);
    f
}

/// An IPv6 frame without extension headers cut into fragments of at most `chunk` bytes of
/// payload each (a multiple of 8), as a sender's stack cuts a datagram larger than its
/// path MTU (RFC 8200, 4.5): the fixed header, then a fragment header (the transport
/// protocol, the offset and M, identification `id`), then the part.
pub fn fragment6(frame: &[u8], chunk: usize, id: u32) -> Vec<Vec<u8>> {
    assert_eq!(chunk % 8, 0, "fragments carry multiples of 8 bytes");
    let ip = &frame[ETH_HLEN..];
    assert_eq!(ip[0] >> 4, 6, "IPv6");
    let proto = ip[6];
    assert_ne!(proto, IPPROTO_FRAGMENT, "a whole datagram");
    let data = &ip[40..40 + usize::from(be16(ip, 4))];
    let parts: Vec<&[u8]> = data.chunks(chunk).collect();
    parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            let mut h = ip[..40].to_vec();
            h[4..6].copy_from_slice(&((8 + part.len()) as u16).to_be_bytes());
            h[6] = IPPROTO_FRAGMENT;
            let more = u16::from(i + 1 < parts.len());
            // The offset in 8-byte units sits above three bits: its byte count, as is.
            h.extend([proto, 0]);
            h.extend(((i * chunk) as u16 | more).to_be_bytes());
            h.extend(id.to_be_bytes());
            h.extend_from_slice(part);
            let mut f = frame[..ETH_HLEN].to_vec();
            f.extend(h);
            f
        })
        .collect()
}

/// [`reassemble`] for IPv6 fragments.
fn reassemble6(frames: &[Vec<u8>]) -> Vec<u8> {
    let first = &frames[0][ETH_HLEN..];
    let mut data = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        let ip = &f[ETH_HLEN..];
        assert_eq!(ip[6], IPPROTO_FRAGMENT, "fragment {i}: a fragment header");
        assert_eq!(
            (&ip[8..40], ip[40], &ip[44..48]),
            (&first[8..40], first[40], &first[44..48]),
            "fragment {i}: addresses, protocol and identification of the first"
        );
        let field = be16(ip, 42);
        assert_eq!(
            usize::from(field & 0xfff8),
            data.len(),
            "fragment {i}: offset"
        );
        assert_eq!(
            field & 1 == 1,
            i + 1 < frames.len(),
            "fragment {i}: more fragments flag"
        );
        data.extend_from_slice(&ip[48..40 + usize::from(be16(ip, 4))]);
    }
    let mut h = first[..40].to_vec();
    h[4..6].copy_from_slice(&(data.len() as u16).to_be_bytes());
    h[6] = first[40];
    h.extend(data);
    let mut f = frames[0][..ETH_HLEN].to_vec();
    f.extend(h);
    f
}

/// A frame read back: its Ethernet and IP headers and where the transport starts. Only
/// plain packets (IPv4 without options, IPv6 without extension headers).
#[derive(Clone, Debug)]
pub struct Parsed {
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    pub src: IpAddr,
    pub dst: IpAddr,
    pub ttl: u8,
    pub tos: u8,
    pub proto: u8,
    /// The transport header and payload.
    pub l4: Vec<u8>,
}

impl Parsed {
    /// Source and destination port (TCP, UDP), or ICMP type and code in the first.
    pub fn ports(&self) -> (u16, u16) {
        (be16(&self.l4, 0), be16(&self.l4, 2))
    }

    pub fn icmp_type(&self) -> u8 {
        self.l4[0]
    }

    /// An ICMP echo's identifier.
    pub fn echo_id(&self) -> u16 {
        be16(&self.l4, 4)
    }

    /// The packet an ICMP error quotes, read back like a frame's (no Ethernet header).
    pub fn quote(&self) -> Parsed {
        let ip = &self.l4[8..];
        parse_ip(ip, [0; 6], [0; 6], true)
    }
}

/// Reads a frame's headers; panics, showing the frame, when it is not a plain IP packet.
pub fn parse(frame: &[u8]) -> Parsed {
    assert!(frame.len() >= ETH_HLEN, "frame shorter than Ethernet");
    let dst_mac = frame[0..6].try_into().unwrap();
    let src_mac = frame[6..12].try_into().unwrap();
    let ethertype = be16(frame, 12);
    assert!(
        ethertype == ETH_P_IP || ethertype == ETH_P_IPV6,
        "ethertype {ethertype:#06x} is not IP: {frame:02x?}"
    );
    parse_ip(&frame[ETH_HLEN..], dst_mac, src_mac, false)
}

fn parse_ip(ip: &[u8], dst_mac: [u8; 6], src_mac: [u8; 6], quoted: bool) -> Parsed {
    match ip[0] >> 4 {
        4 => {
            assert_eq!(ip[0], 0x45, "IPv4 with options: {ip:02x?}");
            let total = if quoted {
                ip.len()
            } else {
                usize::from(be16(ip, 2))
            };
            assert!(total <= ip.len(), "IPv4 total length past the frame");
            Parsed {
                dst_mac,
                src_mac,
                src: IpAddr::from(<[u8; 4]>::try_from(&ip[12..16]).unwrap()),
                dst: IpAddr::from(<[u8; 4]>::try_from(&ip[16..20]).unwrap()),
                ttl: ip[8],
                tos: ip[1],
                proto: ip[9],
                l4: ip[20..total].to_vec(),
            }
        }
        6 => {
            let total = if quoted {
                ip.len()
            } else {
                40 + usize::from(be16(ip, 4))
            };
            assert!(total <= ip.len(), "IPv6 payload length past the frame");
            Parsed {
                dst_mac,
                src_mac,
                src: IpAddr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap()),
                dst: IpAddr::from(<[u8; 16]>::try_from(&ip[24..40]).unwrap()),
                ttl: ip[7],
                tos: (ip[0] << 4) | (ip[1] >> 4),
                proto: ip[6],
                l4: ip[40..total].to_vec(),
            }
        }
        v => panic!("IP version {v}: {ip:02x?}"),
    }
}

/// Every checksum of a plain IP frame holds: the IPv4 header's, the transport's (TCP, UDP,
/// ICMP, ICMPv6, over the pseudo header where it has one) and, in an ICMP error, the quoted
/// IPv4 header's. The error names the first that does not.
pub fn verify_checksums(frame: &[u8]) -> Result<(), String> {
    let p = parse(frame);
    let ip = &frame[ETH_HLEN..];
    if p.src.is_ipv4() && fold(sum(&ip[..20])) != 0xffff {
        return Err(format!("IPv4 header checksum wrong: {:02x?}", &ip[..20]));
    }
    let ok = match p.proto {
        IPPROTO_ICMP => fold(sum(&p.l4)) == 0xffff,
        IPPROTO_TCP | IPPROTO_UDP | IPPROTO_ICMPV6 => {
            if p.proto == IPPROTO_UDP && p.src.is_ipv4() && be16(&p.l4, 6) == 0 {
                true
            } else {
                let mut all = pseudo_header(p.src, p.dst, p.proto, p.l4.len());
                all.extend(&p.l4);
                fold(sum(&all)) == 0xffff
            }
        }
        _ => true,
    };
    if !ok {
        return Err(format!(
            "transport checksum (protocol {}) wrong: {:02x?}",
            p.proto, p.l4
        ));
    }
    let is_error = match p.proto {
        IPPROTO_ICMP => matches!(p.l4[0], 3 | 11 | 12),
        IPPROTO_ICMPV6 => (1..=4).contains(&p.l4[0]),
        _ => false,
    };
    if is_error && p.src.is_ipv4() && p.l4.len() >= 28 {
        let q = &p.l4[8..28];
        if fold(sum(q)) != 0xffff {
            return Err(format!("quoted IPv4 header checksum wrong: {q:02x?}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_frames_carry_valid_checksums() {
        let (a4, b4): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let (a6, b6): (IpAddr, IpAddr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        for (a, b) in [(a4, b4), (a6, b6)] {
            for l4 in [
                L4::tcp(1, 2, TCP_SYN),
                L4::udp(3, 4),
                L4::echo_request(5),
                L4::Error {
                    kind: 3,
                    code: 3,
                    quote: Pkt::new(b, a, L4::udp(4, 3)).ip(),
                },
            ] {
                let f = Pkt::new(a, b, l4).payload(33).frame();
                verify_checksums(&f).unwrap();
                let mut bad = f.clone();
                let last = bad.len() - 1;
                bad[last] ^= 1;
                assert!(verify_checksums(&bad).is_err());
            }
        }
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3's example: the sum 0xddf2, checksum its complement.
        let d = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(checksum(&d), !0xddf2);
    }
}
