//! The legacy x_tables (iptables-legacy), read from the kernel with the socket options
//! `IPT_SO_GET_INFO`/`IPT_SO_GET_ENTRIES` (and their IPv6 twins) on a raw socket, as libiptc
//! reads them for `iptables-legacy-save`: no binary is run.
//!
//! A table comes as one blob of entries (`struct ipt_entry`/`ip6t_entry`, each followed by
//! its matches and its target), cut into chains the way libiptc cuts it:
//! - a built-in chain starts at the entry its hook enters (`hook_entry[h]`), a user chain at
//!   an `ERROR` entry holding its name (that entry is not a rule);
//! - each chain's last entry is its foot, not a rule: a built-in chain's policy (at
//!   `underflow[h]`), a user chain's unconditional RETURN;
//! - the table's last entry is an `ERROR` entry named `ERROR`: the end.
//!
//! The layouts below are the uapi headers' (`linux/netfilter_ipv4/ip_tables.h`,
//! `linux/netfilter_ipv6/ip6_tables.h`, `linux/netfilter/x_tables.h`), checked against the
//! kernel's own (`offsets_are_the_kernels` records what gcc gave for them). Integers are in
//! host order, addresses and masks in network order.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{socket, AddressFamily, SockFlag, SockProtocol, SockType};

use super::model::{mask_prefix, network, Backend, Chain, Family, Hook, Rule, Table, Verdict};

/// The tables read: the ones kube-proxy, Docker and firewalls write to.
const TABLES: [&str; 2] = ["filter", "nat"];

/// `IPT_SO_GET_INFO` = `IP6T_SO_GET_INFO` (`IPT_BASE_CTL` + 0).
const SO_GET_INFO: libc::c_int = 64;
/// `IPT_SO_GET_ENTRIES` = `IP6T_SO_GET_ENTRIES`.
const SO_GET_ENTRIES: libc::c_int = 65;
/// `XT_TABLE_MAXNAMELEN`: a table's name field in both requests.
const TABLE_NAME_LEN: usize = 32;
/// `sizeof(struct ipt_getinfo)`: name[32], valid_hooks @32, hook_entry[5] @36,
/// underflow[5] @56, num_entries @76, size @80.
const INFO_LEN: usize = 84;
/// `sizeof(struct ipt_get_entries)`: name[32], size @32, then the entries (aligned to 8) @40.
const GET_ENTRIES_HEADER: usize = 40;
/// `NF_INET_NUMHOOKS`.
const HOOKS: usize = 5;
/// The built-in chains, by hook number (`NF_INET_PRE_ROUTING`…).
const HOOK_NAMES: [&str; HOOKS] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];
/// How often a table that changed between the two requests is asked for again.
const ATTEMPTS: usize = 4;

/// `sizeof(struct xt_entry_target)`: target_size u16 @0, name[29] @2, revision u8 @31; its
/// data follows.
const TARGET_HEADER: usize = 32;
/// `XT_EXTENSION_MAXNAMELEN`: the target's name field.
const TARGET_NAME_LEN: usize = 29;
/// `XT_STANDARD_TARGET`: the verdicts and jumps.
const STANDARD: &str = "";
/// `XT_ERROR_TARGET`: a user chain's head (its data, char[30], is the chain's name) and the
/// table's end.
const ERROR: &str = "ERROR";
/// A standard verdict v < 0 is `-NF_x - 1`: `NF_DROP` = 0, `NF_ACCEPT` = 1, and `XT_RETURN`
/// is `-NF_REPEAT - 1` (`NF_REPEAT` = 4).
const VERDICT_DROP: i32 = -1;
const VERDICT_ACCEPT: i32 = -2;
const VERDICT_RETURN: i32 = -5;
/// Targets after which the packet goes on to the next rule (`XT_CONTINUE`).
const NON_TERMINAL: [&str; 14] = [
    "MARK",
    "CONNMARK",
    "LOG",
    "NFLOG",
    "CLASSIFY",
    "DSCP",
    "TOS",
    "TTL",
    "HL",
    "TCPMSS",
    "CHECKSUM",
    "SECMARK",
    "CONNSECMARK",
    "TRACE",
];

/// Where a family's `struct ipt_entry`/`ip6t_entry` keeps what is read of it.
struct Layout {
    family: Family,
    /// The socket and its option level.
    domain: AddressFamily,
    level: libc::c_int,
    /// `sizeof` the entry: where its matches start.
    entry_len: usize,
    /// `ip.src`, `ip.dst`, `ip.smsk` and `ip.dmsk`, `addr_len` bytes each.
    src: usize,
    dst: usize,
    smsk: usize,
    dmsk: usize,
    addr_len: usize,
    /// `ip.flags`, `ip.invflags`.
    flags: usize,
    invflags: usize,
    /// `target_offset` and `next_offset` (u16 each): the target's and the next entry's
    /// offsets from this entry.
    target_offset: usize,
    next_offset: usize,
    /// `IPT_F_GOTO`/`IP6T_F_GOTO` in flags: the jump is a goto.
    goto: u8,
    /// `IPT_INV_SRCIP`/`IP6T_INV_SRCIP` in invflags: `! -s`.
    inv_src: u8,
    /// `IPT_INV_DSTIP`/`IP6T_INV_DSTIP` in invflags: `! -d`.
    inv_dst: u8,
}

/// `struct ipt_entry`: `struct ipt_ip` {src @0, dst @4, smsk @8, dmsk @12, iniface[16] @16,
/// outiface[16] @32, iniface_mask[16] @48, outiface_mask[16] @64, proto u16 @80, flags u8
/// @82, invflags u8 @83} (84 bytes), nfcache u32 @84, target_offset u16 @88, next_offset u16
/// @90, comefrom u32 @92, counters (2 × u64) @96: 112 bytes.
const IPV4: Layout = Layout {
    family: Family::Ipv4,
    domain: AddressFamily::Inet,
    level: libc::SOL_IP,
    entry_len: 112,
    src: 0,
    dst: 4,
    smsk: 8,
    dmsk: 12,
    addr_len: 4,
    flags: 82,
    invflags: 83,
    target_offset: 88,
    next_offset: 90,
    goto: 0x02,
    inv_src: 0x08,
    inv_dst: 0x10,
};

/// `struct ip6t_entry`: `struct ip6t_ip6` {src @0, dst @16, smsk @32, dmsk @48, iniface[16]
/// @64, outiface[16] @80, iniface_mask[16] @96, outiface_mask[16] @112, proto u16 @128, tos
/// u8 @130, flags u8 @131, invflags u8 @132, 3 bytes padding} (136 bytes), nfcache u32 @136,
/// target_offset u16 @140, next_offset u16 @142, comefrom u32 @144, 4 bytes padding,
/// counters @152: 168 bytes.
const IPV6: Layout = Layout {
    family: Family::Ipv6,
    domain: AddressFamily::Inet6,
    level: libc::SOL_IPV6,
    entry_len: 168,
    src: 0,
    dst: 16,
    smsk: 32,
    dmsk: 48,
    addr_len: 16,
    flags: 131,
    invflags: 132,
    target_offset: 140,
    next_offset: 142,
    goto: 0x04,
    inv_src: 0x08,
    inv_dst: 0x10,
};

/// Why a table was not read.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the table kept changing while read")]
    Changed,
    #[error("malformed entries at byte {at}: {what}")]
    Malformed { at: usize, what: &'static str },
}

fn malformed(at: usize, what: &'static str) -> Error {
    Error::Malformed { at, what }
}

/// The legacy tables `filter` and `nat` of both families in the calling thread's network
/// namespace, where the kernel lists them: one not listed is never asked for (asking would
/// load its module). A table that cannot be read is left out, the reason logged at debug.
pub fn read() -> Vec<Table> {
    let mut tables = Vec::new();
    for (layout, names) in [(&IPV4, "ip_tables_names"), (&IPV6, "ip6_tables_names")] {
        let Ok(listed) = std::fs::read_to_string(format!("/proc/thread-self/net/{names}")) else {
            continue;
        };
        for name in TABLES
            .into_iter()
            .filter(|t| listed.lines().any(|l| l.trim() == *t))
        {
            match read_table(layout, name) {
                Ok(table) => tables.push(table),
                Err(e) => log::debug!("x_tables {} {name}: {e}", layout.family.as_str()),
            }
        }
    }
    tables
}

/// What `IPT_SO_GET_INFO` tells of a table.
#[derive(Debug, Clone, Default)]
struct Info {
    /// A bit per hook the table has a built-in chain on.
    valid_hooks: u32,
    /// Each hook's first entry and its policy's entry (offsets into the entries).
    hook_entry: [u32; HOOKS],
    underflow: [u32; HOOKS],
    /// The entries' length in bytes.
    size: u32,
}

impl Info {
    fn parse(b: &[u8; INFO_LEN]) -> Self {
        let u32_at = |at: usize| u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        Self {
            valid_hooks: u32_at(32),
            hook_entry: std::array::from_fn(|h| u32_at(36 + 4 * h)),
            underflow: std::array::from_fn(|h| u32_at(56 + 4 * h)),
            size: u32_at(80),
        }
    }

    /// The hooks the table has a built-in chain on.
    fn hooks(&self) -> impl Iterator<Item = usize> + '_ {
        (0..HOOKS).filter(|h| self.valid_hooks & (1 << h) != 0)
    }
}

/// One table read from the kernel: its info, then its entries, again while the table
/// changes between the two.
fn read_table(layout: &Layout, name: &str) -> Result<Table, Error> {
    let sock = socket(
        layout.domain,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::Raw,
    )
    .map_err(std::io::Error::from)?;
    for _ in 0..ATTEMPTS {
        let mut info = [0; INFO_LEN];
        put_name(&mut info, name);
        getsockopt(&sock, layout.level, SO_GET_INFO, &mut info)?;
        let info = Info::parse(&info);

        // The kernel wants exactly the header and the size it has: another size (the table
        // replaced meanwhile) is EAGAIN.
        let mut buf = vec![0; GET_ENTRIES_HEADER + info.size as usize];
        put_name(&mut buf, name);
        buf[32..36].copy_from_slice(&info.size.to_ne_bytes());
        match getsockopt(&sock, layout.level, SO_GET_ENTRIES, &mut buf) {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => continue,
            Err(e) => return Err(e.into()),
            Ok(len) if len != buf.len() => continue,
            Ok(_) => return parse(layout, name, &info, &buf[GET_ENTRIES_HEADER..]),
        }
    }
    Err(Error::Changed)
}

/// `name` into a request's name field (NUL-terminated: longer names are cut).
fn put_name(buf: &mut [u8], name: &str) {
    let n = name.len().min(TABLE_NAME_LEN - 1);
    buf[..n].copy_from_slice(&name.as_bytes()[..n]);
}

/// `getsockopt(sock, level, opt)` into all of `buf`; the length the kernel gave back.
fn getsockopt(
    sock: &OwnedFd,
    level: libc::c_int,
    opt: libc::c_int,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    let mut len = libc::socklen_t::try_from(buf.len())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::E2BIG))?;
    // SAFETY: `buf` is valid for writes of `len` bytes for the whole call, and `len` is a
    // live socklen_t the kernel writes back; the socket stays open while `sock` is borrowed.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            level,
            opt,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(len as usize)
}

/// One entry of the blob, as far as it is read.
struct Entry<'a> {
    /// Its offset from the first entry: what jumps name.
    offset: usize,
    /// Its length (`next_offset`).
    len: usize,
    src: &'a [u8],
    dst: &'a [u8],
    smsk: &'a [u8],
    dmsk: &'a [u8],
    flags: u8,
    invflags: u8,
    target: &'a str,
    revision: u8,
    /// The target's data (`target_size` - 32 bytes).
    data: &'a [u8],
}

impl Entry<'_> {
    /// A standard target's verdict (its data: an i32).
    fn verdict(&self) -> Result<i32, Error> {
        i32_at(self.data, 0).ok_or(malformed(self.offset, "short standard target"))
    }
}

/// `b[at..at + 4]` as a host-order i32.
fn i32_at(b: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_ne_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// `b[at..at + 2]` as a host-order u16, widened.
fn u16_at(b: &[u8], at: usize) -> Option<usize> {
    Some(u16::from_ne_bytes(b.get(at..at.checked_add(2)?)?.try_into().ok()?).into())
}

/// A NUL-terminated name field.
fn c_str(b: &[u8]) -> &str {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    std::str::from_utf8(&b[..end]).unwrap_or("?")
}

/// Step 1: the blob cut into its entries, every offset checked against it.
fn entries<'a>(layout: &Layout, blob: &'a [u8]) -> Result<Vec<Entry<'a>>, Error> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < blob.len() {
        let e = blob
            .get(at..at + layout.entry_len)
            .ok_or(malformed(at, "entry past the end"))?;
        let target_offset = u16_at(e, layout.target_offset).unwrap_or(0);
        let len = u16_at(e, layout.next_offset).unwrap_or(0);
        if target_offset < layout.entry_len || target_offset + TARGET_HEADER > len {
            return Err(malformed(at, "target offset out of its entry"));
        }
        let whole = blob
            .get(at..at + len)
            .ok_or(malformed(at, "entry past the end"))?;
        let t = &whole[target_offset..];
        let target_size = u16_at(t, 0).unwrap_or(0);
        if target_size < TARGET_HEADER || target_size > t.len() {
            return Err(malformed(at, "target size out of its entry"));
        }
        let addr = |off: usize| &e[off..off + layout.addr_len];
        out.push(Entry {
            offset: at,
            len,
            src: addr(layout.src),
            dst: addr(layout.dst),
            smsk: addr(layout.smsk),
            dmsk: addr(layout.dmsk),
            flags: e[layout.flags],
            invflags: e[layout.invflags],
            target: c_str(&t[2..2 + TARGET_NAME_LEN]),
            revision: t[TARGET_HEADER - 1],
            data: &t[TARGET_HEADER..target_size],
        });
        at += len;
    }
    Ok(out)
}

/// A chain while the entries are cut: its name, hook and entries (its foot last).
struct Cut<'e, 'a> {
    name: String,
    hook: Option<usize>,
    /// Where a jump to it lands.
    start: usize,
    entries: Vec<&'e Entry<'a>>,
}

/// Steps 2 to 4: the entries of the table `name`'s blob made into chains of rules.
fn parse(layout: &Layout, name: &str, info: &Info, blob: &[u8]) -> Result<Table, Error> {
    let entries = entries(layout, blob)?;
    // Step 2: the end, an ERROR entry, closes the last chain.
    let (end, entries) = entries.split_last().ok_or(malformed(0, "no entries"))?;
    if end.target != ERROR {
        return Err(malformed(end.offset, "the table does not end with ERROR"));
    }

    // Step 3: the chains, each from its head to the entry before the next one's.
    let mut cuts: Vec<Cut> = Vec::new();
    for e in entries {
        if e.target == ERROR {
            cuts.push(Cut {
                name: c_str(e.data).to_string(),
                hook: None,
                start: e.offset + e.len,
                entries: Vec::new(),
            });
            continue;
        }
        if let Some(h) = info
            .hooks()
            .find(|&h| info.hook_entry[h] as usize == e.offset)
        {
            cuts.push(Cut {
                name: HOOK_NAMES[h].to_string(),
                hook: Some(h),
                start: e.offset,
                entries: Vec::new(),
            });
        }
        cuts.last_mut()
            .ok_or(malformed(e.offset, "an entry before any chain"))?
            .entries
            .push(e);
    }
    if info
        .hooks()
        .any(|h| !cuts.iter().any(|c| c.hook == Some(h)))
    {
        return Err(malformed(0, "a hook's entry is not an entry's start"));
    }
    let chain_at: HashMap<usize, &str> = cuts.iter().map(|c| (c.start, c.name.as_str())).collect();

    // Step 4: each chain's rules and, for a built-in chain, its policy (its foot).
    let mut chains = Vec::new();
    for cut in &cuts {
        let (foot, rules) = cut
            .entries
            .split_last()
            .ok_or(malformed(cut.start, "a chain without its policy or RETURN"))?;
        if let Some(h) = cut.hook {
            if foot.offset != info.underflow[h] as usize || foot.target != STANDARD {
                return Err(malformed(
                    foot.offset,
                    "a built-in chain's policy is not its underflow",
                ));
            }
        }
        chains.push(Chain {
            name: cut.name.clone(),
            hook: cut.hook.map(|h| Hook::from_num(h as u32)),
            policy_drop: cut.hook.is_some() && foot.verdict()? == VERDICT_DROP,
            rules: rules
                .iter()
                .map(|e| rule(layout, e, &chain_at))
                .collect::<Result<_, _>>()?,
        });
    }
    Ok(Table {
        backend: Backend::Legacy,
        family: layout.family,
        name: name.to_string(),
        chains,
        sets: vec![],
    })
}

/// One entry as a rule: its source and destination (`-s`, `-d`; not `! -s`, `! -d`), its
/// verdict and its mark.
fn rule(layout: &Layout, e: &Entry, chain_at: &HashMap<usize, &str>) -> Result<Rule, Error> {
    let matched = |addr: &[u8], mask: &[u8], inv: u8| {
        if mask.iter().any(|&b| b != 0) && e.invflags & inv == 0 {
            mask_prefix(mask).and_then(|p| network(addr, p))
        } else {
            None
        }
    };
    let saddr = matched(e.src, e.smsk, layout.inv_src);
    let daddr = matched(e.dst, e.dmsk, layout.inv_dst);
    let mut sets_mark = None;
    let verdict = match e.target {
        STANDARD => match e.verdict()? {
            VERDICT_DROP => Verdict::Drop,
            VERDICT_ACCEPT => Verdict::Accept,
            VERDICT_RETURN => Verdict::Return,
            v if v < 0 => Verdict::Other,
            // A jump to the next entry: a rule without a target (`-j` left out).
            v if v as usize == e.offset + e.len => Verdict::Continue,
            v => match chain_at.get(&(v as usize)) {
                Some(c) if e.flags & layout.goto != 0 => Verdict::Goto(c.to_string()),
                Some(c) => Verdict::Jump(c.to_string()),
                // Into the middle of a chain: nothing iptables writes.
                None => Verdict::Other,
            },
        },
        "REJECT" => Verdict::Reject,
        "MARK" => {
            // Revision 2, `struct xt_mark_tginfo2` {mark u32 @0, mask u32 @4}: the bits set
            // (`--or-mark M` is mark = mask = M).
            if e.revision == 2 {
                sets_mark = i32_at(e.data, 0).map(|m| m as u32);
            }
            Verdict::Continue
        }
        t if NON_TERMINAL.contains(&t) => Verdict::Continue,
        _ => Verdict::Other,
    };
    Ok(Rule {
        saddr,
        daddr,
        verdict,
        sets_mark,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lays out a table's entries as the kernel hands them out, for [`parse`].
    struct Builder {
        layout: &'static Layout,
        blob: Vec<u8>,
        info: Info,
    }

    /// A rule for the builder: `-s`, `-d`, `!`, goto, and its target.
    #[derive(Default)]
    struct Spec<'a> {
        src: &'a [u8],
        smsk: &'a [u8],
        dst: &'a [u8],
        dmsk: &'a [u8],
        not_dst: bool,
        goto: bool,
        /// Target name and data.
        target: &'a str,
        revision: u8,
        data: Vec<u8>,
    }

    fn standard(verdict: i32) -> Spec<'static> {
        Spec {
            data: verdict.to_ne_bytes().to_vec(),
            ..Spec::default()
        }
    }

    impl Builder {
        fn new(layout: &'static Layout) -> Self {
            Self {
                layout,
                blob: Vec::new(),
                info: Info::default(),
            }
        }

        /// Where the next entry goes.
        fn here(&self) -> i32 {
            self.blob.len() as i32
        }

        fn entry(&mut self, s: &Spec) -> &mut Self {
            let l = self.layout;
            let mut e = vec![0u8; l.entry_len];
            e[l.src..l.src + s.src.len()].copy_from_slice(s.src);
            e[l.smsk..l.smsk + s.smsk.len()].copy_from_slice(s.smsk);
            e[l.dst..l.dst + s.dst.len()].copy_from_slice(s.dst);
            e[l.dmsk..l.dmsk + s.dmsk.len()].copy_from_slice(s.dmsk);
            e[l.flags] = if s.goto { l.goto } else { 0 };
            e[l.invflags] = if s.not_dst { l.inv_dst } else { 0 };
            // A match between the entry and its target, as `-m comment` would put there.
            e.extend_from_slice(&[0u8; 40]);
            let target_offset = e.len();
            let target_size = (TARGET_HEADER + s.data.len()).next_multiple_of(8);
            let mut t = vec![0u8; target_size];
            t[..2].copy_from_slice(&(target_size as u16).to_ne_bytes());
            t[2..2 + s.target.len()].copy_from_slice(s.target.as_bytes());
            t[TARGET_HEADER - 1] = s.revision;
            t[TARGET_HEADER..TARGET_HEADER + s.data.len()].copy_from_slice(&s.data);
            e.extend_from_slice(&t);
            let next = e.len() as u16;
            e[l.target_offset..l.target_offset + 2]
                .copy_from_slice(&(target_offset as u16).to_ne_bytes());
            e[l.next_offset..l.next_offset + 2].copy_from_slice(&next.to_ne_bytes());
            self.blob.extend_from_slice(&e);
            self
        }

        /// A built-in chain of `hook` starts here.
        fn hook(&mut self, hook: usize) -> &mut Self {
            self.info.valid_hooks |= 1 << hook;
            self.info.hook_entry[hook] = self.blob.len() as u32;
            self
        }

        /// A built-in chain's policy.
        fn policy(&mut self, hook: usize, verdict: i32) -> &mut Self {
            self.info.underflow[hook] = self.blob.len() as u32;
            self.entry(&standard(verdict))
        }

        /// A user chain's head: where its rules start is the builder's `here()` after it.
        fn user_chain(&mut self, name: &str) -> &mut Self {
            let mut data = name.as_bytes().to_vec();
            data.resize(30, 0);
            self.entry(&Spec {
                target: ERROR,
                data,
                ..Spec::default()
            })
        }

        fn end(&mut self) -> Table {
            self.user_chain(ERROR);
            self.info.size = self.blob.len() as u32;
            parse(self.layout, "filter", &self.info, &self.blob).expect("parses")
        }
    }

    fn rule(daddr: Option<&str>, verdict: Verdict) -> Rule {
        Rule {
            daddr: daddr.map(|d| d.parse().unwrap()),
            verdict,
            ..Rule::default()
        }
    }

    #[test]
    fn offsets_are_the_kernels() {
        // gcc on linux/netfilter_ipv{4,6}/ip{,6}_tables.h (kernel 6.18, x86_64):
        // sizeof/offsetof of ipt_getinfo 84, ipt_get_entries 40 (entrytable @40), ipt_entry
        // 112 (target_offset @88, next_offset @90, elems @112), ipt_ip.flags @82,
        // invflags @83; ip6t_entry 168 (target_offset @140, next_offset @142), ip6t_ip6
        // flags @131, invflags @132; xt_entry_target 32, xt_standard_target 40,
        // xt_error_target 64; xt_mark_tginfo2 8; IPT_F_GOTO 2, IP6T_F_GOTO 4,
        // IPT_INV_DSTIP = IP6T_INV_DSTIP = 0x10, XT_RETURN -5.
        assert_eq!((INFO_LEN, GET_ENTRIES_HEADER, TARGET_HEADER), (84, 40, 32));
        assert_eq!(
            (IPV4.entry_len, IPV4.target_offset, IPV4.next_offset),
            (112, 88, 90)
        );
        assert_eq!(
            (IPV4.dst, IPV4.dmsk, IPV4.flags, IPV4.invflags),
            (4, 12, 82, 83)
        );
        assert_eq!(
            (IPV6.entry_len, IPV6.target_offset, IPV6.next_offset),
            (168, 140, 142)
        );
        assert_eq!(
            (IPV6.dst, IPV6.dmsk, IPV6.flags, IPV6.invflags),
            (16, 48, 131, 132)
        );
        assert_eq!(
            (IPV4.goto, IPV6.goto, IPV4.inv_dst, IPV6.inv_dst),
            (2, 4, 0x10, 0x10)
        );
        assert_eq!((VERDICT_DROP, VERDICT_ACCEPT, VERDICT_RETURN), (-1, -2, -5));
    }

    #[test]
    fn filter_table_reads_as_iptables_save_shows_it() {
        let mut b = Builder::new(&IPV4);
        // INPUT: ACCEPT, no rules. FORWARD DROP: -j DOCKER-USER, -g KUBE-FW,
        // -s 10.99.0.0/16 -d 10.96.0.0/12 -j REJECT, ! -d 10.0.0.1/32 -j ACCEPT, -j MARK --or-mark 0x4000,
        // -d 10.0.0.2/32 (no target), -j LOG, -j DNAT.
        b.hook(1).policy(1, VERDICT_ACCEPT).hook(2);
        let forward = b.here();
        // The jumps are patched in below, once the user chains' offsets are known.
        b.entry(&standard(0));
        let goto_at = b.here();
        b.entry(&Spec {
            goto: true,
            ..standard(0)
        });
        b.entry(&Spec {
            src: &[10, 99, 0, 0],
            smsk: &[255, 255, 0, 0],
            dst: &[10, 96, 0, 0],
            dmsk: &[255, 240, 0, 0],
            target: "REJECT",
            data: vec![0; 4],
            ..Spec::default()
        });
        b.entry(&Spec {
            dst: &[10, 0, 0, 1],
            dmsk: &[255; 4],
            not_dst: true,
            ..standard(VERDICT_ACCEPT)
        });
        let mark = [0x4000u32.to_ne_bytes(), 0x4000u32.to_ne_bytes()].concat();
        b.entry(&Spec {
            target: "MARK",
            revision: 2,
            data: mark,
            ..Spec::default()
        });
        let next = b.here() + (IPV4.entry_len + 40 + 40) as i32;
        b.entry(&Spec {
            dst: &[10, 0, 0, 2],
            dmsk: &[255; 4],
            ..standard(next)
        });
        b.entry(&Spec {
            target: "LOG",
            data: vec![0; 8],
            ..Spec::default()
        });
        b.entry(&Spec {
            target: "DNAT",
            data: vec![0; 8],
            ..Spec::default()
        });
        b.policy(2, VERDICT_DROP);
        // DOCKER-USER: -j RETURN. KUBE-FW: -d 10.1.0.0/16 -j DROP.
        b.user_chain("DOCKER-USER");
        let docker_user = b.here();
        b.entry(&standard(VERDICT_RETURN))
            .entry(&standard(VERDICT_RETURN));
        b.user_chain("KUBE-FW");
        let kube_fw = b.here();
        b.entry(&Spec {
            dst: &[10, 1, 0, 0],
            dmsk: &[255, 255, 0, 0],
            ..standard(VERDICT_DROP)
        });
        b.entry(&standard(VERDICT_RETURN));
        // The jumps' verdicts: the first 4 bytes of their targets' data.
        let data_at = |entry: i32| entry as usize + IPV4.entry_len + 40 + TARGET_HEADER;
        b.blob[data_at(forward)..][..4].copy_from_slice(&docker_user.to_ne_bytes());
        b.blob[data_at(goto_at)..][..4].copy_from_slice(&kube_fw.to_ne_bytes());
        let table = b.end();

        assert_eq!(
            (table.backend, table.family, table.sets.len()),
            (Backend::Legacy, Family::Ipv4, 0)
        );
        let names: Vec<_> = table.chains.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["INPUT", "FORWARD", "DOCKER-USER", "KUBE-FW"]);
        let input = table.chain("INPUT").unwrap();
        assert_eq!(
            (input.hook, input.policy_drop, input.rules.len()),
            (Some(Hook::Input), false, 0)
        );
        let fwd = table.chain("FORWARD").unwrap();
        assert_eq!((fwd.hook, fwd.policy_drop), (Some(Hook::Forward), true));
        assert_eq!(
            fwd.rules,
            [
                rule(None, Verdict::Jump("DOCKER-USER".into())),
                rule(None, Verdict::Goto("KUBE-FW".into())),
                Rule {
                    saddr: "10.99.0.0/16".parse().ok(),
                    ..rule(Some("10.96.0.0/12"), Verdict::Reject)
                },
                rule(None, Verdict::Accept),
                Rule {
                    sets_mark: Some(0x4000),
                    ..rule(None, Verdict::Continue)
                },
                rule(Some("10.0.0.2/32"), Verdict::Continue),
                rule(None, Verdict::Continue),
                rule(None, Verdict::Other),
            ]
        );
        let user = table.chain("DOCKER-USER").unwrap();
        assert_eq!((user.hook, user.policy_drop), (None, false));
        assert_eq!(user.rules, [rule(None, Verdict::Return)]);
        assert_eq!(
            table.chain("KUBE-FW").unwrap().rules,
            [rule(Some("10.1.0.0/16"), Verdict::Drop)]
        );
    }

    #[test]
    fn ipv6_destinations_and_goto_flag() {
        let mut b = Builder::new(&IPV6);
        b.hook(3);
        let addr: std::net::Ipv6Addr = "fd00::a".parse().unwrap();
        b.entry(&Spec {
            dst: &addr.octets(),
            dmsk: &[255; 16],
            ..standard(VERDICT_DROP)
        });
        let goto_at = b.here();
        b.entry(&Spec {
            goto: true,
            ..standard(0)
        });
        b.policy(3, VERDICT_ACCEPT);
        b.user_chain("KUBE-SERVICES");
        let services = b.here();
        b.entry(&standard(VERDICT_RETURN));
        let data_at = goto_at as usize + IPV6.entry_len + 40 + TARGET_HEADER;
        b.blob[data_at..][..4].copy_from_slice(&services.to_ne_bytes());
        let table = b.end();

        assert_eq!(table.family, Family::Ipv6);
        let out = table.chain("OUTPUT").unwrap();
        assert_eq!((out.hook, out.policy_drop), (Some(Hook::Output), false));
        assert_eq!(
            out.rules,
            [
                rule(Some("fd00::a/128"), Verdict::Drop),
                rule(None, Verdict::Goto("KUBE-SERVICES".into()))
            ]
        );
        assert!(table.chain("KUBE-SERVICES").unwrap().rules.is_empty());
    }

    #[test]
    fn malformed_blobs_are_errors() {
        let mut b = Builder::new(&IPV4);
        b.hook(2)
            .entry(&standard(VERDICT_ACCEPT))
            .policy(2, VERDICT_DROP);
        b.user_chain(ERROR);
        b.info.size = b.blob.len() as u32;
        assert!(parse(&IPV4, "filter", &b.info, &b.blob).is_ok());
        // Every truncation is an error; any byte set to 0xff parses or is an error, never
        // a panic.
        for len in 0..b.blob.len() {
            assert!(
                parse(&IPV4, "filter", &b.info, &b.blob[..len]).is_err(),
                "cut at {len}"
            );
        }
        for at in 0..b.blob.len() {
            let mut bad = b.blob.clone();
            bad[at] = 0xff;
            let _ = parse(&IPV4, "filter", &b.info, &bad);
        }
        // A hook entering mid-entry, a policy not at its underflow.
        let mut info = b.info.clone();
        info.hook_entry[2] = 4;
        assert!(parse(&IPV4, "filter", &info, &b.blob).is_err());
        let mut info = b.info.clone();
        info.underflow[2] = 0;
        assert!(parse(&IPV4, "filter", &info, &b.blob).is_err());
    }
}
