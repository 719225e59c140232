//! nf_tables over netlink (`NETLINK_NETFILTER`, subsystem `NFNL_SUBSYS_NFTABLES`): the
//! tables, chains, rules and set elements `nft list` would print, as the kernel sends them
//! (uapi `linux/netfilter/nf_tables.h`, `linux/netfilter/nfnetlink.h`). The readers send
//! only dump requests; the one table ebpf-cni writes (`masq_ports`) goes in one batch
//! through [`Socket::batch`].

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::model::{mask_prefix, network, Backend, Chain, Family, Hook, Rule, Set, Table, Verdict};

/// What to read besides the tables: every chain with its rules, or only the chains of
/// these names (each table asked for each, which costs a few small dumps instead of the
/// whole ruleset); and the named sets of the named tables.
pub struct Want<'a> {
    pub chains: Option<&'a [&'a str]>,
    pub sets: &'a [(&'a str, &'a [&'a str])],
}

// Message types: the subsystem in the high byte (`NFNL_SUBSYS_NFTABLES`), the message in
// the low one (`enum nf_tables_msg_types`).
pub(super) const SUBSYS: u16 = 10 << 8;
const GETTABLE: u16 = SUBSYS | 1;
const GETCHAIN: u16 = SUBSYS | 4;
pub(super) const GETRULE: u16 = SUBSYS | 7;
const GETSETELEM: u16 = SUBSYS | 13;

/// `NLM_F_DUMP_INTR`: the ruleset changed during the dump.
const DUMP_INTR: u16 = 0x10;
/// How often an interrupted dump is tried again.
const DUMP_TRIES: usize = 5;

/// The nf_tables tables of the calling thread's network namespace: ip, ip6 and inet ones
/// (the others hold nothing `services` or `firewall` reads), with `want`'s chains and sets.
pub fn read(want: &Want) -> io::Result<Vec<Table>> {
    if !in_kernel() {
        return Ok(Vec::new());
    }
    let sock = Socket::open()?;
    let mut tables = Vec::new();
    // `NFPROTO_UNSPEC`: the tables of every family.
    for msg in sock.dump(GETTABLE, 0, &[])? {
        let family = Family::from_nfproto(msg.family);
        if matches!(family, Family::Other(_)) {
            continue;
        }
        let Some(name) = msg.attrs().find_map(|(t, v)| (t == 1).then(|| text(v))) else {
            continue;
        };
        tables.push(Table {
            backend: Backend::Nftables,
            family,
            name,
            chains: Vec::new(),
            sets: Vec::new(),
        });
    }
    for table in &mut tables {
        table.chains = match want.chains {
            None => all_chains(&sock, table)?,
            Some(names) => named_chains(&sock, table, names)?,
        };
        for (_, sets) in want.sets.iter().filter(|(t, _)| *t == table.name) {
            for set in *sets {
                if let Some(keys) = set_keys(&sock, table, set)? {
                    table.sets.push(Set {
                        name: (*set).to_owned(),
                        keys,
                    });
                }
            }
        }
    }
    Ok(tables)
}

/// Whether nf_tables is in the kernel already. Asking a kernel whose nf_tables is a module
/// not loaded would load it (nfnetlink requests the subsystem's module), a side effect
/// STATUS must not have; and without the module no table exists to be read. A kernel with
/// modules lists them in `/proc/modules`; a loaded or built-in nf_tables has
/// `/sys/module/nf_tables` or a line in `modules.builtin` (where either is missing, it is
/// asked: that kernel has no modules, or says nothing either way).
pub(super) fn in_kernel() -> bool {
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let builtin = std::fs::read_to_string(format!("/lib/modules/{release}/modules.builtin"));
    loaded_or_builtin(
        std::path::Path::new("/proc/modules").exists(),
        std::path::Path::new("/sys/module/nf_tables").exists(),
        builtin.ok().as_deref(),
    )
}

/// [`in_kernel`]'s decision, from what it found.
fn loaded_or_builtin(has_modules: bool, in_sysfs: bool, builtin: Option<&str>) -> bool {
    !has_modules
        || in_sysfs
        || builtin.is_none_or(|list| list.lines().any(|l| l.ends_with("/nf_tables.ko")))
}

/// Every chain of `table` (hook and policy included) with its rules.
fn all_chains(sock: &Socket, table: &Table) -> io::Result<Vec<Chain>> {
    let req = [attr_str(1, &table.name)];
    let mut chains: Vec<Chain> = Vec::new();
    for msg in sock.dump(GETCHAIN, nfproto(table.family), &req)? {
        let mut chain = Chain {
            name: String::new(),
            hook: None,
            policy_drop: false,
            rules: Vec::new(),
        };
        let mut of_table = false;
        for (t, v) in msg.attrs() {
            match t {
                1 => of_table = text(v) == table.name,
                3 => chain.name = text(v),
                4 => {
                    chain.hook = attrs(v)
                        .find_map(|(t, v)| (t == 1).then(|| be32(v)).flatten())
                        .map(Hook::from_num)
                }
                5 => chain.policy_drop = be32(v) == Some(0),
                _ => {}
            }
        }
        // The kernel does not filter a chain dump by table: this does.
        if of_table {
            chains.push(chain);
        }
    }
    let mut rules: BTreeMap<String, Vec<Rule>> = BTreeMap::new();
    for msg in sock.dump(GETRULE, nfproto(table.family), &req)? {
        if let Some((chain, rule)) = parse_rule(&msg, table) {
            rules.entry(chain).or_default().push(rule);
        }
    }
    for chain in &mut chains {
        chain.rules = rules.remove(&chain.name).unwrap_or_default();
    }
    Ok(chains)
}

/// The chains of `names` that `table` has, with their rules (no hook or policy: only the
/// rules of these are read).
fn named_chains(sock: &Socket, table: &Table, names: &[&str]) -> io::Result<Vec<Chain>> {
    let mut chains = Vec::new();
    for name in names {
        let req = [attr_str(1, &table.name), attr_str(2, name)];
        let msgs = match sock.dump(GETRULE, nfproto(table.family), &req) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            other => other?,
        };
        let rules: Vec<Rule> = msgs
            .iter()
            .filter_map(|m| parse_rule(m, table))
            .filter(|(chain, _)| chain == name)
            .map(|(_, r)| r)
            .collect();
        if !rules.is_empty() {
            chains.push(Chain {
                name: (*name).to_owned(),
                hook: None,
                policy_drop: false,
                rules,
            });
        }
    }
    Ok(chains)
}

/// The keys of set `name` of `table`; `None` when it has no such set.
fn set_keys(sock: &Socket, table: &Table, name: &str) -> io::Result<Option<Vec<Vec<u8>>>> {
    let req = [attr_str(1, &table.name), attr_str(2, name)];
    let msgs = match sock.dump(GETSETELEM, nfproto(table.family), &req) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        other => other?,
    };
    let mut keys = Vec::new();
    for msg in &msgs {
        // NFTA_SET_ELEM_LIST_ELEMENTS, a list of NFTA_LIST_ELEM.
        for (_, elems) in msg.attrs().filter(|(t, _)| *t == 3) {
            for (_, elem) in attrs(elems) {
                let mut key = None;
                let mut interval_end = false;
                for (t, v) in attrs(elem) {
                    match t {
                        // NFTA_SET_ELEM_KEY: NFTA_DATA_VALUE inside.
                        1 => key = data_value(v).map(<[u8]>::to_vec),
                        // NFTA_SET_ELEM_FLAGS: NFT_SET_ELEM_INTERVAL_END.
                        3 => interval_end = be32(v).is_some_and(|f| f & 1 != 0),
                        _ => {}
                    }
                }
                if let (Some(k), false) = (key, interval_end) {
                    keys.push(k);
                }
            }
        }
    }
    Ok(Some(keys))
}

/// What a register holds, as far as a rule's destination match and mark need.
#[derive(Clone, Debug, PartialEq)]
enum Reg {
    /// Bytes of the network header: its offset and length.
    Network { offset: u32, len: u32 },
    /// Those bytes masked (a prefix match).
    MaskedNetwork { offset: u32, mask: Vec<u8> },
    /// The packet's mark.
    Mark,
    /// The layer-3 protocol (`meta nfproto`).
    Nfproto,
    /// The mark with bits or-ed in (`mark | V`: the xor of a bitwise).
    MarkOr(u32),
    /// A constant.
    Value(Vec<u8>),
}

/// A rule message of `table`: its chain, and the rule reduced to the model (`None` for
/// another table's).
fn parse_rule(msg: &Msg, table: &Table) -> Option<(String, Rule)> {
    let mut of_table = false;
    let mut chain = String::new();
    let mut rule = Rule::default();
    for (t, v) in msg.attrs() {
        match t {
            1 => of_table = text(v) == table.name,
            2 => chain = text(v),
            4 => rule = parse_expressions(v, table.family),
            _ => {}
        }
    }
    of_table.then_some((chain, rule))
}

/// A rule's expressions (`NFTA_RULE_EXPRESSIONS`) as the model's rule: its positive
/// destination match, its verdict and the mark it sets.
fn parse_expressions(list: &[u8], family: Family) -> Rule {
    let mut rule = Rule::default();
    let mut regs: BTreeMap<u32, Reg> = BTreeMap::new();
    // The layer-3 protocol an inet rule has matched (`meta nfproto`), which says where the
    // destination address lies.
    let mut l3 = family;
    for (_, expr) in attrs(list) {
        let mut name = String::new();
        let mut data: &[u8] = &[];
        for (t, v) in attrs(expr) {
            match t {
                1 => name = text(v),
                2 => data = v,
                _ => {}
            }
        }
        let a = |n: u16| attrs(data).find_map(|(t, v)| (t == n).then_some(v));
        let a32 = |n: u16| a(n).and_then(be32);
        match name.as_str() {
            "payload" => {
                // NFTA_PAYLOAD_DREG, BASE (1: the network header), OFFSET, LEN.
                let Some(dreg) = a32(1) else { continue };
                match (a32(2), a32(3), a32(4)) {
                    (Some(1), Some(offset), Some(len)) => {
                        regs.insert(dreg, Reg::Network { offset, len })
                    }
                    _ => regs.remove(&dreg),
                };
            }
            "meta" => match (a32(1), a32(2), a32(3)) {
                // NFTA_META_DREG, KEY: NFT_META_MARK (3), NFT_META_NFPROTO (15).
                (Some(dreg), Some(3), _) => {
                    regs.insert(dreg, Reg::Mark);
                }
                (Some(dreg), Some(15), _) => {
                    regs.insert(dreg, Reg::Nfproto);
                }
                (Some(dreg), _, _) => {
                    regs.remove(&dreg);
                }
                // NFTA_META_SREG: `meta mark set <reg>`.
                (None, Some(3), Some(sreg)) => {
                    rule.sets_mark = match regs.get(&sreg) {
                        Some(Reg::MarkOr(v)) => Some(*v),
                        Some(Reg::Value(v)) => host32(v),
                        _ => rule.sets_mark,
                    };
                }
                _ => {}
            },
            "bitwise" => {
                // NFTA_BITWISE_SREG, DREG, MASK, XOR (each NFTA_DATA_VALUE inside).
                let (Some(sreg), Some(dreg)) = (a32(1), a32(2)) else {
                    continue;
                };
                let mask = a(4).and_then(data_value);
                let xor = a(5).and_then(data_value);
                let out = match (regs.get(&sreg), mask, xor) {
                    (Some(Reg::Network { offset, .. }), Some(m), _) => Some(Reg::MaskedNetwork {
                        offset: *offset,
                        mask: m.to_vec(),
                    }),
                    (Some(Reg::Mark), _, Some(x)) => host32(x).map(Reg::MarkOr),
                    _ => None,
                };
                match out {
                    Some(r) => regs.insert(dreg, r),
                    None => regs.remove(&dreg),
                };
            }
            "cmp" => {
                // NFTA_CMP_SREG, OP (NFT_CMP_EQ: 0), DATA.
                let (Some(sreg), Some(op), Some(value)) =
                    (a32(1), a32(2), a(3).and_then(data_value))
                else {
                    continue;
                };
                if op != 0 {
                    continue;
                }
                match regs.get(&sreg) {
                    Some(Reg::Nfproto) => {
                        l3 = Family::from_nfproto(value.first().copied().unwrap_or(0));
                    }
                    Some(Reg::Network { offset, .. }) => {
                        addr_match(&mut rule, l3, *offset, value, None);
                    }
                    Some(Reg::MaskedNetwork { offset, mask }) => {
                        addr_match(&mut rule, l3, *offset, value, Some(mask));
                    }
                    _ => {}
                }
            }
            "immediate" => {
                // NFTA_IMMEDIATE_DREG (0: the verdict register), DATA.
                let (Some(dreg), Some(d)) = (a32(1), a(2)) else {
                    continue;
                };
                if dreg == 0 {
                    rule.verdict = verdict(d);
                } else {
                    match data_value(d) {
                        Some(v) => regs.insert(dreg, Reg::Value(v.to_vec())),
                        None => regs.remove(&dreg),
                    };
                }
            }
            // NFTA_TARGET_NAME, INFO: iptables-nft's x_tables targets.
            "target" => match a(1).map(text).as_deref() {
                Some("REJECT") => rule.verdict = Verdict::Reject,
                // struct xt_mark_tginfo2 { u32 mark, mask; }, host order.
                Some("MARK") => rule.sets_mark = a(3).and_then(host32),
                _ => rule.verdict = Verdict::Other,
            },
            "reject" => rule.verdict = Verdict::Reject,
            // A verdict map (`vmap`), a queue: a verdict this model does not name.
            "lookup" if a32(3) == Some(0) => rule.verdict = Verdict::Other,
            "queue" => rule.verdict = Verdict::Other,
            _ => {}
        }
    }
    rule
}

/// An address match: `value` compared with the network header's bytes at `offset` (the
/// source at 12 in IPv4 and 8 in IPv6, the destination at 16 and 24), under `mask` when one
/// was applied; the rule's first of each is kept.
fn addr_match(rule: &mut Rule, l3: Family, offset: u32, value: &[u8], mask: Option<&Vec<u8>>) {
    let (width, slot) = match (l3, offset) {
        (Family::Ipv4, 12) => (4, &mut rule.saddr),
        (Family::Ipv4, 16) => (4, &mut rule.daddr),
        (Family::Ipv6, 8) => (16, &mut rule.saddr),
        (Family::Ipv6, 24) => (16, &mut rule.daddr),
        _ => return,
    };
    if slot.is_none() {
        *slot = prefix_net(width, value, mask);
    }
}

/// `value`, zero-padded to `width` bytes, as a network: of `mask`'s prefix, or of the whole
/// bytes compared.
fn prefix_net(width: usize, value: &[u8], mask: Option<&Vec<u8>>) -> Option<ipnetwork::IpNetwork> {
    if value.len() > width {
        return None;
    }
    let prefix = match mask {
        Some(m) => mask_prefix(m)?,
        // A load of fewer bytes than the address is a prefix of whole bytes.
        None => u8::try_from(value.len() * 8).ok()?,
    };
    let mut addr = value.to_vec();
    addr.resize(width, 0);
    network(&addr, prefix)
}

/// `NFTA_DATA_VERDICT` inside `data`: its code and chain.
fn verdict(data: &[u8]) -> Verdict {
    let Some(v) = attrs(data).find_map(|(t, v)| (t == 2).then_some(v)) else {
        return Verdict::Other;
    };
    let code = attrs(v)
        .find_map(|(t, v)| (t == 1).then(|| be32(v)).flatten())
        .map(|c| c as i32);
    let chain = attrs(v).find_map(|(t, v)| (t == 2).then(|| text(v)));
    match (code, chain) {
        (Some(0), _) => Verdict::Drop,
        (Some(1), _) => Verdict::Accept,
        (Some(-1), _) => Verdict::Continue,
        (Some(-3), Some(c)) => Verdict::Jump(c),
        (Some(-4), Some(c)) => Verdict::Goto(c),
        (Some(-5), _) => Verdict::Return,
        _ => Verdict::Other,
    }
}

/// `NFTA_DATA_VALUE` inside `data`.
fn data_value(data: &[u8]) -> Option<&[u8]> {
    attrs(data).find_map(|(t, v)| (t == 1).then_some(v))
}

fn nfproto(f: Family) -> u8 {
    match f {
        Family::Ipv4 => 2,
        Family::Ipv6 => 10,
        Family::Inet => 1,
        Family::Other(p) => p,
    }
}

fn be32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

fn host32(v: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(v.get(..4)?.try_into().ok()?))
}

/// A NUL-terminated string attribute.
pub(super) fn text(v: &[u8]) -> String {
    let end = v.iter().position(|b| *b == 0).unwrap_or(v.len());
    String::from_utf8_lossy(&v[..end]).into_owned()
}

/// The netlink attributes in `buf`: (type without the nested and byte-order flags, value).
/// A truncated one ends the walk.
pub(super) fn attrs(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        let len = usize::from(u16::from_ne_bytes(rest.get(..2)?.try_into().ok()?));
        let kind = u16::from_ne_bytes(rest.get(2..4)?.try_into().ok()?) & 0x3fff;
        let value = rest.get(4..len)?;
        rest = rest.get(len.next_multiple_of(4)..).unwrap_or(&[]);
        Some((kind, value))
    })
}

/// One netlink attribute, as a request carries it: a NUL-terminated string.
pub(super) fn attr_str(kind: u16, s: &str) -> Vec<u8> {
    let len = 4 + s.len() + 1;
    let mut out = Vec::with_capacity(len.next_multiple_of(4));
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(s.as_bytes());
    out.resize(len.next_multiple_of(4), 0);
    out
}

/// A netlink attribute as the kernel lays it out: length, type, value, padding to 4.
pub(super) fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
    let len = 4 + value.len();
    let mut out = (len as u16).to_ne_bytes().to_vec();
    out.extend(kind.to_ne_bytes());
    out.extend(value);
    out.resize(len.next_multiple_of(4), 0);
    out
}

/// A nested attribute (`NLA_F_NESTED` set, as the kernel sets it and wants it).
pub(super) fn nest(kind: u16, inner: &[Vec<u8>]) -> Vec<u8> {
    attr(kind | 0x8000, &inner.concat())
}

/// A 32-bit attribute value, network order.
pub(super) fn be(v: u32) -> Vec<u8> {
    v.to_be_bytes().to_vec()
}

/// One expression of `NFTA_RULE_EXPRESSIONS`: `NFTA_LIST_ELEM` { name, data }.
pub(super) fn expr(name: &str, data: &[Vec<u8>]) -> Vec<u8> {
    let mut n = name.as_bytes().to_vec();
    n.push(0);
    nest(1, &[attr(1, &n), nest(2, data)])
}

/// A data attribute: `NFTA_DATA_VALUE` inside `kind`.
pub(super) fn value(kind: u16, v: &[u8]) -> Vec<u8> {
    nest(kind, &[attr(1, v)])
}

/// One nfnetlink message of a dump: the family of its `nfgenmsg` and its attributes.
pub(super) struct Msg {
    pub(super) family: u8,
    body: Vec<u8>,
}

impl Msg {
    pub(super) fn attrs(&self) -> impl Iterator<Item = (u16, &[u8])> {
        attrs(&self.body)
    }
}

/// A `NETLINK_NETFILTER` socket.
pub(super) struct Socket {
    fd: OwnedFd,
}

impl Socket {
    pub(super) fn open() -> io::Result<Self> {
        // SAFETY: socket(2) with constant arguments; the descriptor is owned at once.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_NETFILTER,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor socket(2) just returned, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd })
    }

    /// A dump of `kind` for `family` with the request's attributes `req`: every message
    /// until `NLMSG_DONE`, tried again when the ruleset changed during it.
    pub(super) fn dump(&self, kind: u16, family: u8, req: &[Vec<u8>]) -> io::Result<Vec<Msg>> {
        for _ in 0..DUMP_TRIES {
            if let Some(msgs) = self.dump_once(kind, family, req)? {
                return Ok(msgs);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::Interrupted,
            "the ruleset kept changing during the dump",
        ))
    }

    /// Sends `msgs` (`(kind, flags, family, attributes)`) as one nf_tables transaction
    /// (`NFNL_MSG_BATCH_BEGIN` … `NFNL_MSG_BATCH_END`): the kernel applies all of them or
    /// none. Each is acknowledged; the first error is returned.
    pub(super) fn batch(&self, msgs: &[(u16, u16, u8, Vec<Vec<u8>>)]) -> io::Result<()> {
        // NFNL_MSG_BATCH_BEGIN/END (NLMSG_MIN_TYPE, +1), res_id NFNL_SUBSYS_NFTABLES.
        const BEGIN: u16 = 0x10;
        const END: u16 = 0x11;
        let mut buf = Vec::new();
        let mut push =
            |kind: u16, flags: u16, family: u8, res_id: u16, seq: u32, body: &[Vec<u8>]| {
                let len = 16 + 4 + body.iter().map(Vec::len).sum::<usize>();
                buf.extend_from_slice(&(len as u32).to_ne_bytes());
                buf.extend_from_slice(&kind.to_ne_bytes());
                buf.extend_from_slice(&flags.to_ne_bytes());
                buf.extend_from_slice(&seq.to_ne_bytes());
                buf.extend_from_slice(&0u32.to_ne_bytes());
                buf.extend_from_slice(&[family, 0]);
                buf.extend_from_slice(&res_id.to_be_bytes());
                for a in body {
                    buf.extend_from_slice(a);
                }
            };
        let request = libc::NLM_F_REQUEST as u16;
        push(BEGIN, request, 0, SUBSYS >> 8, 1, &[]);
        for (i, (kind, flags, family, body)) in msgs.iter().enumerate() {
            let flags = request | libc::NLM_F_ACK as u16 | flags;
            push(*kind, flags, *family, 0, 2 + i as u32, body);
        }
        push(END, request, 0, SUBSYS >> 8, 2 + msgs.len() as u32, &[]);
        let timeout = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        // SAFETY: setsockopt(2) with a timeval of the size passed, on an owned socket.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: send(2) of a buffer of the length passed on an owned socket.
        let sent = unsafe { libc::send(self.fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        // One acknowledgement per message; an error may come for the batch's ends too.
        let mut acked = 0;
        let mut first_err = None;
        let mut rbuf = vec![0u8; 1 << 16];
        while acked < msgs.len() {
            // SAFETY: recv(2) into a buffer of the length passed on an owned socket.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), rbuf.as_mut_ptr().cast(), rbuf.len(), 0) };
            if n < 0 {
                return Err(first_err.unwrap_or_else(io::Error::last_os_error));
            }
            let mut rest = &rbuf[..n as usize];
            while rest.len() >= 16 {
                let mlen = u32::from_ne_bytes(rest[..4].try_into().unwrap_or_default()) as usize;
                let mtype = u16::from_ne_bytes([rest[4], rest[5]]);
                let Some(m) = rest.get(..mlen).filter(|_| mlen >= 16) else {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a truncated netlink message",
                    ));
                };
                if i32::from(mtype) == libc::NLMSG_ERROR {
                    let errno = m
                        .get(16..20)
                        .map_or(0, |e| i32::from_ne_bytes(e.try_into().unwrap_or_default()));
                    // The echoed request's sequence: the batch's ends are not counted.
                    let seq = m
                        .get(24..28)
                        .map_or(0, |s| u32::from_ne_bytes(s.try_into().unwrap_or_default()));
                    if errno != 0 && first_err.is_none() {
                        first_err = Some(io::Error::from_raw_os_error(-errno));
                    }
                    if (2..2 + msgs.len() as u32).contains(&seq) {
                        acked += 1;
                    } else if errno != 0 {
                        // The batch itself was refused: no message of it is acknowledged.
                        break;
                    }
                }
                rest = rest.get(mlen.next_multiple_of(4)..).unwrap_or(&[]);
            }
            if first_err.is_some() && acked < msgs.len() {
                // The kernel reports every failing message; the others may not answer.
                break;
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// One dump; `None` when it was interrupted by a change.
    fn dump_once(&self, kind: u16, family: u8, req: &[Vec<u8>]) -> io::Result<Option<Vec<Msg>>> {
        let body_len: usize = req.iter().map(Vec::len).sum();
        let len = 16 + 4 + body_len;
        let mut msg = Vec::with_capacity(len);
        msg.extend_from_slice(&(len as u32).to_ne_bytes());
        msg.extend_from_slice(&kind.to_ne_bytes());
        let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
        msg.extend_from_slice(&flags.to_ne_bytes());
        msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
        msg.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel's
        msg.extend_from_slice(&[family, 0, 0, 0]); // nfgenmsg: family, NFNETLINK_V0, res_id
        for a in req {
            msg.extend_from_slice(a);
        }
        // SAFETY: send(2) of a buffer of the length passed on an owned socket.
        let sent = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut out = Vec::new();
        let mut interrupted = false;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            // SAFETY: recv(2) into a buffer of the length passed on an owned socket.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut rest = &buf[..n as usize];
            while rest.len() >= 16 {
                let mlen = u32::from_ne_bytes(rest[..4].try_into().unwrap_or_default()) as usize;
                let mtype = u16::from_ne_bytes([rest[4], rest[5]]);
                let mflags = u16::from_ne_bytes([rest[6], rest[7]]);
                let Some(m) = rest.get(..mlen).filter(|_| mlen >= 16) else {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a truncated netlink message",
                    ));
                };
                interrupted |= mflags & DUMP_INTR != 0;
                match i32::from(mtype) {
                    libc::NLMSG_DONE => return Ok((!interrupted).then_some(out)),
                    libc::NLMSG_ERROR => {
                        let errno = m
                            .get(16..20)
                            .map_or(0, |e| i32::from_ne_bytes(e.try_into().unwrap_or_default()));
                        if errno != 0 {
                            return Err(io::Error::from_raw_os_error(-errno));
                        }
                    }
                    _ => {
                        if let Some(nfgen) = m.get(16..20) {
                            out.push(Msg {
                                family: nfgen[0],
                                body: m[20..].to_vec(),
                            });
                        }
                    }
                }
                rest = rest.get(mlen.next_multiple_of(4)..).unwrap_or(&[]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(base: u32, offset: u32, len: u32) -> Vec<u8> {
        expr(
            "payload",
            &[
                attr(1, &be(1)),
                attr(2, &be(base)),
                attr(3, &be(offset)),
                attr(4, &be(len)),
            ],
        )
    }

    fn cmp(op: u32, v: &[u8]) -> Vec<u8> {
        expr("cmp", &[attr(1, &be(1)), attr(2, &be(op)), value(3, v)])
    }

    fn jump(code: i32, chain: &str) -> Vec<u8> {
        let mut c = chain.as_bytes().to_vec();
        c.push(0);
        let verdict = nest(2, &[attr(1, &be(code as u32)), attr(2, &c)]);
        expr("immediate", &[attr(1, &be(0)), nest(2, &[verdict])])
    }

    /// `iptables-nft -t nat -A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m comment --comment
    /// … -m tcp --dport 80 -j KUBE-SVC-X`, as `nft --debug=netlink` shows the kernel holds it.
    #[test]
    fn a_service_rule_gives_its_address_not_its_port() {
        let exprs = [
            expr("meta", &[attr(1, &be(1)), attr(2, &be(16))]),
            cmp(0, &[6, 0, 0, 0]),
            payload(1, 16, 4),
            cmp(0, &[172, 30, 0, 41]),
            expr("match", &[attr(1, b"comment\0")]),
            payload(2, 2, 2),
            cmp(0, &[0, 80]),
            expr("counter", &[]),
            jump(-3, "KUBE-SVC-X"),
        ]
        .concat();
        let rule = parse_expressions(&exprs, Family::Ipv4);
        assert_eq!(rule.daddr, "172.30.0.41/32".parse().ok());
        assert_eq!(rule.verdict, Verdict::Jump("KUBE-SVC-X".into()));
    }

    #[test]
    fn prefixes_negations_and_marks_are_read() {
        // `-d 10.96.0.0/12`: a masked load.
        let masked = [
            payload(1, 16, 4),
            expr(
                "bitwise",
                &[
                    attr(1, &be(1)),
                    attr(2, &be(1)),
                    attr(3, &be(4)),
                    value(4, &[255, 240, 0, 0]),
                    value(5, &[0; 4]),
                ],
            ),
            cmp(0, &[10, 96, 0, 0]),
            jump(-4, "KUBE-SVC-X"),
        ]
        .concat();
        let r = parse_expressions(&masked, Family::Ipv4);
        assert_eq!(r.daddr, "10.96.0.0/12".parse().ok());
        assert_eq!(r.verdict, Verdict::Goto("KUBE-SVC-X".into()));
        // `-d 10.0.0.0/8`: a load of one byte.
        let short = [payload(1, 16, 1), cmp(0, &[10])].concat();
        assert_eq!(
            parse_expressions(&short, Family::Ipv4).daddr,
            "10.0.0.0/8".parse().ok()
        );
        // `-s 10.99.0.0/16` (two bytes of the source).
        let source = [payload(1, 12, 2), cmp(0, &[10, 99])].concat();
        let r = parse_expressions(&source, Family::Ipv4);
        assert_eq!((r.saddr, r.daddr), ("10.99.0.0/16".parse().ok(), None));
        // `! -d 10.9.9.9/32 -j RETURN`.
        let negated = [payload(1, 16, 4), cmp(1, &[10, 9, 9, 9]), jump(-5, "")].concat();
        let r = parse_expressions(&negated, Family::Ipv4);
        assert_eq!((r.daddr, r.verdict), (None, Verdict::Return));
        // IPv6 `-d fd00:30::a/128`; offset 16 of an IPv6 header is the source's.
        let v6: [u8; 16] = "fd00:30::a".parse::<std::net::Ipv6Addr>().unwrap().octets();
        let r = parse_expressions(&[payload(1, 24, 16), cmp(0, &v6)].concat(), Family::Ipv6);
        assert_eq!(r.daddr, "fd00:30::a/128".parse().ok());
        let r = parse_expressions(
            &[payload(1, 16, 4), cmp(0, &[1, 2, 3, 4])].concat(),
            Family::Ipv6,
        );
        assert_eq!(r.daddr, None);
        // kube-proxy's `mark set mark or 0x4000`: load, or, store.
        let mark = [
            expr("meta", &[attr(1, &be(1)), attr(2, &be(3))]),
            expr(
                "bitwise",
                &[
                    attr(1, &be(1)),
                    attr(2, &be(1)),
                    attr(3, &be(4)),
                    value(4, &0xffff_bfffu32.to_ne_bytes()),
                    value(5, &0x4000u32.to_ne_bytes()),
                ],
            ),
            expr("meta", &[attr(2, &be(3)), attr(3, &be(1))]),
        ]
        .concat();
        assert_eq!(
            parse_expressions(&mark, Family::Ipv4).sets_mark,
            Some(0x4000)
        );
        // iptables-nft's `-j MARK --or-mark 0x4000`: the x_tables target's info.
        let info = [0x4000u32.to_ne_bytes(), 0x4000u32.to_ne_bytes()].concat();
        let target = expr(
            "target",
            &[attr(1, b"MARK\0"), attr(2, &be(2)), attr(3, &info)],
        );
        let r = parse_expressions(&target, Family::Ipv4);
        assert_eq!((r.sets_mark, r.verdict), (Some(0x4000), Verdict::Continue));
        let reject = expr("target", &[attr(1, b"REJECT\0"), attr(2, &be(0))]);
        assert_eq!(
            parse_expressions(&reject, Family::Ipv4).verdict,
            Verdict::Reject
        );
    }

    #[test]
    fn a_module_not_loaded_is_not_asked_for() {
        let builtin = "kernel/net/netfilter/nf_tables.ko\n";
        // Debian: a module, loaded or not.
        assert!(loaded_or_builtin(true, true, Some("")));
        assert!(!loaded_or_builtin(
            true,
            false,
            Some("kernel/fs/ext4/ext4.ko\n")
        ));
        // Built in.
        assert!(loaded_or_builtin(true, false, Some(builtin)));
        // No modules at all, or no list of the built-in ones: asked.
        assert!(loaded_or_builtin(false, false, None));
        assert!(loaded_or_builtin(true, false, None));
    }

    #[test]
    fn truncated_attributes_end_the_walk() {
        let mut a = attr(1, b"abcd");
        a.extend(attr(2, b"efgh"));
        assert_eq!(attrs(&a).count(), 2);
        assert_eq!(attrs(&a[..10]).count(), 1);
        assert_eq!(attrs(&[8, 0, 1, 0]).count(), 0);
        assert_eq!(attrs(&[2, 0, 1, 0]).count(), 0);
        // Whatever the bytes, parsing never panics.
        for n in 0..a.len() {
            let _ = parse_expressions(&a[..n], Family::Ipv4);
        }
    }
}
