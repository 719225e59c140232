//! Program tests: the TC programs of the eBPF object run on crafted frames through
//! `BPF_PROG_TEST_RUN` (Cilium's `bpf/tests` is the model), and what they return, the bytes
//! they leave and what they write into their maps are checked.
//!
//! Each [`Lab`] runs the object built by `cargo xtask build` (`EBPF_CNI_PROGRAMS_OBJ`),
//! loaded with aya into maps of its own (small, unpinned: nothing of a node is touched),
//! and builds a network namespace in which the helpers that ask the kernel (`bpf_fib_lookup`,
//! the redirects' device checks) find what the test says: two pod host veths, an uplink
//! with addresses, routes to two external networks and their gateway's neighbour entries,
//! forwarding on. A program runs with the calling thread in that namespace and the
//! context's `ifindex` set to the device it is attached to in production.
//!
//! `BPF_PROG_TEST_RUN` returns the program's verdict without acting on it: a redirect is
//! `TC_ACT_REDIRECT` (the target is not observable), `TCX_NEXT` is the verdict -1.
//!
//! The verifier is most of a lab's cost (`ecni_from_pod` takes about half a second on the
//! host and minutes in the kernel matrix's emulated 5.10 guest), so a test process verifies
//! the object once: its labs take the loaded object in turn ([`LabPrograms`]), each finding
//! every map as empty as a fresh load leaves it, and each in a network namespace of its own.

use std::io;
use std::net::IpAddr;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd as _, AsRawFd as _};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use anyhow::{bail, Context as _, Result};
use aya::maps::lpm_trie::Key;
use aya::maps::{Array, HashMap, LpmTrie, Map, PerCpuArray, PerCpuHashMap, PerCpuValues};
use aya::programs::{ProgramError, SchedClassifier, TestRun, TestRunOptions, Xdp};
use aya::{Ebpf, EbpfLoader, Pod as Plain};
use ebpf_cni_maps::{
    masq_src_key, DirCounters, EndpointInfo, EndpointKey, MasqFlow, MasqKey, MasqStats, NatKey,
    NatOrig, NodeConfig, PodCounters, PortHits, PortKey, PortTarget, RateLimit, SourceKey,
    SourceRule,
};

use crate::netns::Netns;

/// The eBPF object under test, from `EBPF_CNI_PROGRAMS_OBJ`: panics naming the command
/// that builds it when unset (a program test without the object would check nothing).
pub fn programs_obj() -> PathBuf {
    crate::bin_from_env(
        crate::PROGRAMS_OBJ_ENV,
        "the eBPF object the plugin embeds",
        "`cargo xtask build` builds it (the line \"eBPF object: <path>\" names it, by default \
         target/bpfel-unknown-none/release/ebpf-cni-programs); `cargo xtask test` and \
         `cargo xtask vmtest` build it and set the variable",
    )
}

/// The benchmark's eBPF object, from `EBPF_CNI_PROTOTYPES_OBJ`: the plugin's programs and
/// the prototypes the plugin's own object leaves out (`ebpf_cni_maps::PROTOTYPE_PROGRAMS`).
pub fn prototypes_obj() -> PathBuf {
    crate::bin_from_env(
        crate::PROTOTYPES_OBJ_ENV,
        "the benchmark's eBPF object, with the prototypes",
        "`cargo xtask test` and `cargo xtask vmtest` build it and set the variable (it is \
         staged beside the plugin under test as ebpf-cni-prototypes)",
    )
}

/// Entries of each keyed map: a test holds a few; the production sizes would only cost
/// memory and, under emulation, time.
const MAP_ENTRIES: u32 = 256;

/// What a TC program returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// -1 (`TCX_NEXT`, `TC_ACT_UNSPEC`): no verdict, the stack gets the packet as it is.
    Next,
    /// `TC_ACT_OK`.
    Ok,
    /// `TC_ACT_SHOT`: dropped.
    Shot,
    /// `TC_ACT_REDIRECT`: `bpf_redirect`, `bpf_redirect_peer` or `bpf_redirect_neigh`.
    Redirect,
    Other(i32),
}

impl Verdict {
    fn of(retval: u32) -> Self {
        match retval as i32 {
            -1 => Verdict::Next,
            0 => Verdict::Ok,
            2 => Verdict::Shot,
            7 => Verdict::Redirect,
            v => Verdict::Other(v),
        }
    }
}

/// `struct __sk_buff` as of Linux 6.x (uapi): the context a test run takes and gives back.
/// Older kernels know a prefix of it and require the rest to be zero, which it is unless a
/// test sets a field they lack.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SkBuff {
    pub len: u32,
    pub pkt_type: u32,
    pub mark: u32,
    pub queue_mapping: u32,
    pub protocol: u32,
    pub vlan_present: u32,
    pub vlan_tci: u32,
    pub vlan_proto: u32,
    pub priority: u32,
    pub ingress_ifindex: u32,
    pub ifindex: u32,
    pub tc_index: u32,
    pub cb: [u32; 5],
    pub hash: u32,
    pub tc_classid: u32,
    pub data: u32,
    pub data_end: u32,
    pub napi_id: u32,
    pub family: u32,
    pub remote_ip4: u32,
    pub local_ip4: u32,
    pub remote_ip6: [u32; 4],
    pub local_ip6: [u32; 4],
    pub remote_port: u32,
    pub local_port: u32,
    pub data_meta: u32,
    pub flow_keys: u64,
    pub tstamp: u64,
    pub wire_len: u32,
    pub gso_segs: u32,
    pub sk: u64,
    pub gso_size: u32,
    pub tstamp_type: u8,
    pub _pad: [u8; 3],
    pub hwtstamp: u64,
}

const _: () = assert!(std::mem::offset_of!(SkBuff, ifindex) == 40);
const _: () = assert!(std::mem::offset_of!(SkBuff, tstamp) == 152);
const _: () = assert!(std::mem::offset_of!(SkBuff, gso_size) == 176);
const _: () = assert!(std::mem::size_of::<SkBuff>() == 192);

impl SkBuff {
    /// A context for a packet on device `ifindex`.
    pub fn on(ifindex: u32) -> Self {
        Self {
            ifindex,
            ..Self::default()
        }
    }

    fn as_bytes(&self) -> &[u8] {
        // SAFETY: a repr(C) struct of integers without implicit padding (size asserted).
        unsafe {
            std::slice::from_raw_parts((self as *const Self).cast(), std::mem::size_of::<Self>())
        }
    }
}

/// A run the kernel refused (`BPF_PROG_TEST_RUN` failed before or instead of running the
/// program).
#[derive(Debug)]
pub struct Refused {
    /// The system call's error number, when it was one.
    pub errno: Option<i32>,
    pub what: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)
    }
}

/// One program run's outcome.
#[derive(Clone, Debug)]
pub struct Run {
    pub verdict: Verdict,
    /// The frame as the program left it.
    pub frame: Vec<u8>,
    /// The context as the kernel wrote it back (`tstamp`, `mark`, ...).
    pub ctx: SkBuff,
    /// The run's duration as the kernel measured it (ns), for the cost measurements.
    pub ns: u64,
}

/// The eBPF object loaded into maps of its own, its TC programs verified.
pub struct Programs {
    ebpf: Ebpf,
}

/// The object a test process verified, with the path it came from.
struct Shared {
    obj: PathBuf,
    progs: Programs,
}

/// The one loaded object of the process (see the module doc); a [`Lab`] holds it for its
/// life, so labs run one at a time.
static SHARED: Mutex<Option<Shared>> = Mutex::new(None);

/// A lab's hold on the process's loaded object: [`Programs`] with every map as a fresh
/// load leaves it.
pub struct LabPrograms(MutexGuard<'static, Option<Shared>>);

impl LabPrograms {
    /// The object at `obj` with the TC programs `names` verified: loaded on first use, and
    /// emptied for every later lab. A lab that panicked leaves the lock poisoned, which
    /// says nothing about the object: the next lab empties it as usual.
    fn take(obj: &Path, names: &[&str]) -> Result<Self> {
        let mut held = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        match held.as_mut() {
            Some(s) if s.obj == obj => s.progs.empty_maps()?,
            _ => {
                *held = Some(Shared {
                    obj: obj.to_path_buf(),
                    progs: Programs::load_from(obj, names)?,
                })
            }
        }
        Ok(Self(held))
    }
}

impl std::ops::Deref for LabPrograms {
    type Target = Programs;
    fn deref(&self) -> &Programs {
        &self.0.as_ref().expect("taken with an object").progs
    }
}

impl std::ops::DerefMut for LabPrograms {
    fn deref_mut(&mut self) -> &mut Programs {
        &mut self.0.as_mut().expect("taken with an object").progs
    }
}

/// `union bpf_attr` for the map element commands (linux/bpf.h).
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    /// The value, or the next key for `BPF_MAP_GET_NEXT_KEY`.
    value: u64,
    flags: u64,
}

const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;

/// One map element command on `fd`; `Err` with the kernel's errno.
fn elem(cmd: libc::c_long, fd: u32, key: *const u8, value: *mut u8) -> io::Result<()> {
    let attr = ElemAttr {
        map_fd: fd,
        _pad: 0,
        key: key as u64,
        value: value as u64,
        flags: 0,
    };
    // SAFETY: bpf(2) with an attribute of the element commands' layout; `key` and `value`
    // point to buffers of the map's key and value sizes (or are null where the command
    // allows it).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            &attr as *const ElemAttr,
            std::mem::size_of::<ElemAttr>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Deletes every element of a hash-like map (hash, LRU, per-CPU hash, LPM trie).
fn delete_all(fd: u32, key_size: usize) -> io::Result<()> {
    let mut key = vec![0u8; key_size];
    loop {
        match elem(BPF_MAP_GET_NEXT_KEY, fd, std::ptr::null(), key.as_mut_ptr()) {
            Ok(()) => elem(BPF_MAP_DELETE_ELEM, fd, key.as_ptr(), std::ptr::null_mut())?,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// Writes zeroes over every element of an array, `value_len` bytes each (all CPUs' slots
/// of a per-CPU array).
fn zero_all(fd: u32, max_entries: u32, value_len: usize) -> io::Result<()> {
    let mut zero = vec![0u8; value_len];
    for i in 0..max_entries {
        elem(
            BPF_MAP_UPDATE_ELEM,
            fd,
            i.to_ne_bytes().as_ptr(),
            zero.as_mut_ptr(),
        )?;
    }
    Ok(())
}

impl Programs {
    /// Empties every map the programs declare as a fresh load leaves them: hash-like maps
    /// with no element, arrays all zero. The object's data sections (`.rodata*`, which the
    /// kernel freezes, and `.data`/`.bss` were there any) and the log ring buffer are left
    /// as they are.
    fn empty_maps(&mut self) -> Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
        for (name, map) in self.ebpf.maps() {
            if name.starts_with('.') {
                continue;
            }
            let (data, per_cpu_array, array) = match map {
                Map::HashMap(d)
                | Map::LruHashMap(d)
                | Map::PerCpuHashMap(d)
                | Map::PerCpuLruHashMap(d)
                | Map::LpmTrie(d) => (d, false, false),
                Map::Array(d) => (d, false, true),
                Map::PerCpuArray(d) => (d, true, true),
                _ => continue,
            };
            let info = data
                .info()
                .with_context(|| format!("reading map {name}'s info"))?;
            let fd = data.fd().as_fd().as_raw_fd() as u32;
            let emptied = if !array {
                delete_all(fd, info.key_size() as usize)
            } else if per_cpu_array {
                let slot = (info.value_size() as usize).div_ceil(8) * 8;
                zero_all(fd, info.max_entries(), slot * cpus)
            } else {
                zero_all(fd, info.max_entries(), info.value_size() as usize)
            };
            emptied.with_context(|| format!("emptying map {name}"))?;
        }
        Ok(())
    }

    /// Loads the object from `EBPF_CNI_PROGRAMS_OBJ` and verifies the TC programs `names`.
    pub fn load(names: &[&str]) -> Result<Self> {
        Self::load_from(&programs_obj(), names)
    }

    /// [`Programs::load`] of the object at `path`.
    pub fn load_from(path: &Path, names: &[&str]) -> Result<Self> {
        let path = path.to_path_buf();
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let mut loader = EbpfLoader::new();
        // As the plugin loads it: no CO-RE relocations to resolve against the kernel's BTF.
        loader.btf(None);
        for map in ebpf_cni_maps::NODE_MAPS.iter().filter(|m| !m.array) {
            loader.map_max_entries(map.name, MAP_ENTRIES);
        }
        let mut ebpf = loader
            .load(&bytes)
            .with_context(|| format!("loading {}", path.display()))?;
        for name in names {
            let prog: &mut SchedClassifier = ebpf
                .program_mut(name)
                .with_context(|| format!("no program {name} in the object"))?
                .try_into()
                .with_context(|| format!("{name} is not a TC program"))?;
            prog.load()
                .with_context(|| format!("the verifier refused {name}"))?;
        }
        Ok(Self { ebpf })
    }

    /// Runs program `name` once on `frame` with context `ctx`, in the calling thread's
    /// network namespace.
    pub fn run(&self, name: &str, ctx: &SkBuff, frame: &[u8]) -> Result<Run, Refused> {
        let prog: &SchedClassifier = self
            .ebpf
            .program(name)
            .and_then(|p| p.try_into().ok())
            .unwrap_or_else(|| panic!("no TC program {name} in the object"));
        let mut out = vec![0u8; frame.len() + 256];
        let mut ctx_out = SkBuff::default();
        // SAFETY: the same plain struct as `as_bytes`; the kernel writes at most its own
        // (smaller or equal) `__sk_buff` into it.
        let ctx_out_bytes = unsafe {
            std::slice::from_raw_parts_mut(
                (&mut ctx_out as *mut SkBuff).cast::<u8>(),
                std::mem::size_of::<SkBuff>(),
            )
        };
        let res = prog
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ctx_in: Some(ctx.as_bytes()),
                ctx_out: Some(ctx_out_bytes),
                ..TestRunOptions::default()
            })
            .map_err(|e| Refused {
                errno: match &e {
                    ProgramError::SyscallError(s) => s.io_error.raw_os_error(),
                    _ => None,
                },
                what: format!("BPF_PROG_TEST_RUN of {name} on {} bytes: {e}", frame.len()),
            })?;
        out.truncate(res.data_size_out as usize);
        Ok(Run {
            verdict: Verdict::of(res.return_value),
            frame: out,
            ctx: ctx_out,
            ns: res.duration.as_nanos() as u64,
        })
    }

    /// Verifies the TC program `name` of the object, which [`Programs::load`] left out,
    /// unless it already is.
    pub fn load_tc(&mut self, name: &str) -> Result<()> {
        self.load_one(name, |p| <&mut SchedClassifier>::try_from(p)?.load())
    }

    /// How many instructions the verifier walked to accept program `name` (loaded): `None`
    /// where the kernel does not count them (before 5.16).
    pub fn verified_instructions(&self, name: &str) -> Result<Option<u32>> {
        let prog = self
            .ebpf
            .program(name)
            .with_context(|| format!("no program {name} in the object"))?;
        let info = prog
            .info()
            .with_context(|| format!("the program info of {name}"))?;
        Ok(info.verified_instruction_count())
    }

    /// Verifies the XDP program `name` of the object (none is loaded by [`Programs::load`]),
    /// unless it already is.
    pub fn load_xdp(&mut self, name: &str) -> Result<()> {
        self.load_one(name, |p| <&mut Xdp>::try_from(p)?.load())
    }

    /// Verifies program `name` with its type's `load`, unless it already is.
    fn load_one(
        &mut self,
        name: &str,
        load: impl FnOnce(&mut aya::programs::Program) -> Result<(), ProgramError>,
    ) -> Result<()> {
        let prog = self
            .ebpf
            .program_mut(name)
            .with_context(|| format!("no program {name} in the object"))?;
        if prog.fd().is_ok() {
            return Ok(());
        }
        load(prog).with_context(|| format!("the verifier refused {name}"))
    }

    /// Runs the XDP program `name` once on `frame`, in the calling thread's network
    /// namespace: its XDP verdict (`XDP_PASS` 2, `XDP_REDIRECT` 4, ...) and the frame it left.
    pub fn run_xdp(&self, name: &str, frame: &[u8]) -> Result<(u32, Vec<u8>)> {
        let prog: &Xdp = self
            .ebpf
            .program(name)
            .and_then(|p| p.try_into().ok())
            .with_context(|| format!("no loaded XDP program {name} in the object"))?;
        let mut out = vec![0u8; frame.len() + 256];
        let res = prog
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ..TestRunOptions::default()
            })
            .with_context(|| format!("BPF_PROG_TEST_RUN of {name} on {} bytes", frame.len()))?;
        out.truncate(res.data_size_out as usize);
        Ok((res.return_value, out))
    }

    /// Runs program `name` `repeat` times on `frame` in one `BPF_PROG_TEST_RUN` and returns
    /// the kernel's mean time per run in ns (the program's own run, without the system
    /// call). The runs share one packet: a program that changes it (a TTL decremented)
    /// sees its own change on the next run, so the frame must leave room for `repeat` of
    /// them.
    pub fn time(
        &self,
        name: &str,
        ctx: &SkBuff,
        frame: &[u8],
        repeat: u32,
    ) -> Result<f64, Refused> {
        let prog: &SchedClassifier = self
            .ebpf
            .program(name)
            .and_then(|p| p.try_into().ok())
            .unwrap_or_else(|| panic!("no TC program {name} in the object"));
        let res = prog
            .test_run(TestRunOptions {
                data_in: Some(frame),
                ctx_in: Some(ctx.as_bytes()),
                repeat,
                ..TestRunOptions::default()
            })
            .map_err(|e| Refused {
                errno: match &e {
                    ProgramError::SyscallError(s) => s.io_error.raw_os_error(),
                    _ => None,
                },
                what: format!("BPF_PROG_TEST_RUN of {name} x{repeat}: {e}"),
            })?;
        Ok(res.duration.as_nanos() as f64)
    }

    fn hash<K: Plain, V: Plain>(&mut self, map: &str) -> HashMap<&mut aya::maps::MapData, K, V> {
        HashMap::try_from(
            self.ebpf
                .map_mut(map)
                .unwrap_or_else(|| panic!("no map {map}")),
        )
        .unwrap_or_else(|e| panic!("map {map}: {e}"))
    }

    fn hash_ro<K: Plain, V: Plain>(&self, map: &str) -> HashMap<&aya::maps::MapData, K, V> {
        HashMap::try_from(self.ebpf.map(map).unwrap_or_else(|| panic!("no map {map}")))
            .unwrap_or_else(|e| panic!("map {map}: {e}"))
    }

    fn insert<K: Plain, V: Plain>(&mut self, map: &str, k: K, v: V) {
        self.hash::<K, V>(map)
            .insert(k, v, 0)
            .unwrap_or_else(|e| panic!("inserting into {map}: {e}"));
    }

    fn lookup<K: Plain, V: Plain>(&self, map: &str, k: &K) -> Option<V> {
        self.hash_ro::<K, V>(map).get(k, 0).ok()
    }

    /// An endpoint map entry for a local pod address.
    pub fn set_endpoint(&mut self, addr: IpAddr, info: EndpointInfo) {
        self.insert(ebpf_cni_maps::ENDPOINTS_MAP, endpoint_key(addr), info);
    }

    /// Zero counters for the pod behind `ifindex` (ADD inserts them; the programs only
    /// count pods that have them).
    pub fn watch_pod(&mut self, ifindex: u32) {
        self.set_counters(ifindex, PodCounters::default());
    }

    /// Zero counters for the pod behind `ifindex` with these flags (`from_pod`'s, e.g.
    /// `COUNTERS_NO_HOST_PORTS`, `COUNTERS_NO_EGRESS_LIMIT`; `to_pod`'s, e.g.
    /// `COUNTERS_NO_INGRESS_LIMIT`), in every CPU's slot, as ADD writes them.
    pub fn watch_pod_flagged(&mut self, ifindex: u32, from_pod: u64, to_pod: u64) {
        let mut c = PodCounters::default();
        c.from_pod.flags = from_pod;
        c.to_pod.flags = to_pod;
        self.set_counters(ifindex, c);
    }

    fn set_counters(&mut self, ifindex: u32, first: PodCounters) {
        let n = aya::util::nr_cpus().expect("number of CPUs");
        let mut m: PerCpuHashMap<_, u32, PodCounters> = PerCpuHashMap::try_from(
            self.ebpf
                .map_mut(ebpf_cni_maps::POD_COUNTERS_MAP)
                .expect("counters map"),
        )
        .expect("counters map type");
        let values = PerCpuValues::try_from(vec![first; n]).expect("values");
        m.insert(ifindex, values, 0).expect("inserting counters");
    }

    /// The counters of the pod behind `ifindex`, summed over the CPUs.
    pub fn counters(&self, ifindex: u32) -> PodCounters {
        let m: PerCpuHashMap<_, u32, PodCounters> = PerCpuHashMap::try_from(
            self.ebpf
                .map(ebpf_cni_maps::POD_COUNTERS_MAP)
                .expect("counters map"),
        )
        .expect("counters map type");
        let per_cpu = m.get(&ifindex, 0).expect("the pod's counters");
        let mut total = PodCounters::default();
        for c in per_cpu.iter() {
            add_dir(&mut total.from_pod, &c.from_pod);
            add_dir(&mut total.to_pod, &c.to_pod);
        }
        total
    }

    /// The node config as the programs read it.
    pub fn node_config(&self) -> NodeConfig {
        let a: Array<_, NodeConfig> = Array::try_from(
            self.ebpf
                .map(ebpf_cni_maps::CONFIG_MAP)
                .expect("config map"),
        )
        .expect("config map type");
        a.get(&0, 0).expect("the node config")
    }

    pub fn set_config(&mut self, cfg: NodeConfig) {
        let mut a: Array<_, NodeConfig> = Array::try_from(
            self.ebpf
                .map_mut(ebpf_cni_maps::CONFIG_MAP)
                .expect("config map"),
        )
        .expect("config map type");
        a.set(0, cfg, 0).expect("setting the node config");
    }

    pub fn set_rate(&mut self, ifindex: u32, limit: RateLimit) {
        self.insert(ebpf_cni_maps::RATE_LIMITS_MAP, ifindex, limit);
    }

    pub fn rate(&self, ifindex: u32) -> RateLimit {
        self.lookup(ebpf_cni_maps::RATE_LIMITS_MAP, &ifindex)
            .expect("the pod's rate limit")
    }

    /// A host port mapping (with its zero hit counters, as ADD installs it).
    pub fn set_port(&mut self, key: PortKey, target: PortTarget) {
        self.insert(ebpf_cni_maps::PORTMAP_MAP, key, target);
        let n = aya::util::nr_cpus().expect("number of CPUs");
        let mut m: PerCpuHashMap<_, PortKey, PortHits> = PerCpuHashMap::try_from(
            self.ebpf
                .map_mut(ebpf_cni_maps::PORTMAP_HITS_MAP)
                .expect("hits map"),
        )
        .expect("hits map type");
        let zero = PerCpuValues::try_from(vec![PortHits::default(); n]).expect("values");
        m.insert(key, zero, 0).expect("inserting hit counters");
    }

    pub fn port_hits(&self, key: &PortKey) -> PortHits {
        let m: PerCpuHashMap<_, PortKey, PortHits> = PerCpuHashMap::try_from(
            self.ebpf
                .map(ebpf_cni_maps::PORTMAP_HITS_MAP)
                .expect("hits map"),
        )
        .expect("hits map type");
        let mut total = PortHits::default();
        for h in m.get(key, 0).expect("the mapping's hits").iter() {
            total.packets += h.packets;
            total.bytes += h.bytes;
            total.socket += h.socket;
        }
        total
    }

    pub fn add_node_addr(&mut self, addr: IpAddr) {
        self.insert(ebpf_cni_maps::NODE_ADDRS_MAP, endpoint_key(addr), 0u32);
    }

    pub fn nat_rev(&self, key: &NatKey) -> Option<NatOrig> {
        self.lookup(ebpf_cni_maps::NAT_REV_MAP, key)
    }

    /// The device's address masquerade takes where the FIB does not tell it (before 6.8).
    pub fn set_masq_src(&mut self, ifindex: u32, addr: IpAddr) {
        self.insert(
            ebpf_cni_maps::MASQ_SRC_MAP,
            masq_src_key(ifindex, addr.is_ipv4()),
            endpoint_key(addr),
        );
    }

    /// A destination network never masqueraded.
    /// A Service address (`prefix` bits of the family's address) and the node's Services
    /// switch on.
    pub fn add_service_net(&mut self, net: IpAddr, prefix: u32) {
        let (addr, bits) = match net {
            IpAddr::V4(_) => (endpoint_key(net).addr, 96 + prefix),
            IpAddr::V6(a) => (a.octets(), prefix),
        };
        let mut t: LpmTrie<_, [u8; 16], u32> = LpmTrie::try_from(
            self.ebpf
                .map_mut(ebpf_cni_maps::SERVICES_NETS_MAP)
                .expect("services map"),
        )
        .expect("services map type");
        t.insert(&Key::new(bits, addr), 1, 0)
            .expect("inserting a Service address");
        let mut cfg = self.node_config();
        cfg.flags |= ebpf_cni_maps::NODE_FLAG_SERVICES;
        self.set_config(cfg);
    }

    /// The Services flow entry of `key`, if the programs recorded it.
    pub fn services_flow(&self, key: &ebpf_cni_maps::ServicesFlowKey) -> Option<u32> {
        self.lookup::<_, ebpf_cni_maps::ServicesFlow>(ebpf_cni_maps::SERVICES_FLOWS_MAP, key)
            .map(|v| v.kind)
    }

    pub fn add_masq_skip(&mut self, net: IpAddr, prefix: u32) {
        let (addr, bits) = match net {
            IpAddr::V4(_) => (endpoint_key(net).addr, 96 + prefix),
            IpAddr::V6(a) => (a.octets(), prefix),
        };
        let mut t: LpmTrie<_, [u8; 16], u32> = LpmTrie::try_from(
            self.ebpf
                .map_mut(ebpf_cni_maps::MASQ_SKIP_MAP)
                .expect("skip map"),
        )
        .expect("skip map type");
        t.insert(&Key::new(bits, addr), 1, 0)
            .expect("inserting a skip prefix");
    }

    pub fn masq_fwd(&self, key: &MasqKey) -> Option<MasqFlow> {
        self.lookup(ebpf_cni_maps::MASQ_FWD_MAP, key)
    }

    pub fn masq_rev(&self, key: &MasqKey) -> Option<MasqFlow> {
        self.lookup(ebpf_cni_maps::MASQ_REV_MAP, key)
    }

    /// Masquerade's statistics, summed over the CPUs.
    pub fn masq_stats(&self) -> MasqStats {
        let a: PerCpuArray<_, MasqStats> = PerCpuArray::try_from(
            self.ebpf
                .map(ebpf_cni_maps::MASQ_STATS_MAP)
                .expect("stats map"),
        )
        .expect("stats map type");
        let mut t = MasqStats::default();
        for s in a.get(&0, 0).expect("the stats").iter() {
            t.out_packets += s.out_packets;
            t.in_packets += s.in_packets;
            t.flows += s.flows;
            t.reclaimed += s.reclaimed;
            t.exhausted += s.exhausted;
            t.table_full += s.table_full;
            t.untranslatable += s.untranslatable;
        }
        t
    }

    /// A source check entry: the `bits`-bit prefix of the key (its 64 head bits counted).
    pub fn set_source(&mut self, bits: u32, key: SourceKey, rule: SourceRule) {
        let mut t: LpmTrie<_, SourceKey, SourceRule> = LpmTrie::try_from(
            self.ebpf
                .map_mut(ebpf_cni_maps::SOURCES_MAP)
                .expect("sources map"),
        )
        .expect("sources map type");
        t.insert(&Key::new(bits, key), rule, 0)
            .expect("inserting a source rule");
    }
}

fn add_dir(t: &mut DirCounters, c: &DirCounters) {
    t.packets += c.packets;
    t.bytes += c.bytes;
    t.drops += c.drops;
    t.errors += c.errors;
    t.marks += c.marks;
    t.source_drops += c.source_drops;
    t.mac_drops += c.mac_drops;
}

/// An address as the endpoint, node-address and port maps key it (IPv4 mapped into IPv6).
pub fn endpoint_key(addr: IpAddr) -> EndpointKey {
    match addr {
        IpAddr::V4(a) => EndpointKey::v4(a.octets()),
        IpAddr::V6(a) => EndpointKey::v6(a.octets()),
    }
}

/// `CLOCK_MONOTONIC`, the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A pod as the programs see it: its host veth (which the programs run on) and the pod's
/// addresses and MAC.
#[derive(Clone, Debug)]
pub struct LabPod {
    pub host_if: String,
    pub ifindex: u32,
    pub host_mac: [u8; 6],
    pub pod_mac: [u8; 6],
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
    pub gateway4: Ipv4Addr,
    pub attachment_id: u64,
}

impl LabPod {
    pub fn addr(&self, v4: bool) -> IpAddr {
        if v4 {
            IpAddr::V4(self.v4)
        } else {
            IpAddr::V6(self.v6)
        }
    }

    /// Its endpoint map value, with `flags` (`EP_FLAG_*`).
    pub fn endpoint(&self, flags: u32) -> EndpointInfo {
        EndpointInfo {
            attachment_id: self.attachment_id,
            host_ifindex: self.ifindex,
            flags,
            host_mac: self.host_mac,
            pod_mac: self.pod_mac,
            gateway4: self.gateway4.octets(),
        }
    }
}

/// The node's uplink and what lies behind it.
#[derive(Clone, Debug)]
pub struct Uplink {
    pub ifindex: u32,
    pub mac: [u8; 6],
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
    /// A host of the routed external networks (203.0.113.0/24, 2001:db8:99::/48).
    pub remote4: Ipv4Addr,
    pub remote6: Ipv6Addr,
    /// A destination no route leads to.
    pub unrouted4: Ipv4Addr,
    pub unrouted6: Ipv6Addr,
}

impl Uplink {
    pub fn addr(&self, v4: bool) -> IpAddr {
        if v4 {
            IpAddr::V4(self.v4)
        } else {
            IpAddr::V6(self.v6)
        }
    }

    pub fn remote(&self, v4: bool) -> IpAddr {
        if v4 {
            IpAddr::V4(self.remote4)
        } else {
            IpAddr::V6(self.remote6)
        }
    }

    pub fn unrouted(&self, v4: bool) -> IpAddr {
        if v4 {
            IpAddr::V4(self.unrouted4)
        } else {
            IpAddr::V6(self.unrouted6)
        }
    }
}

/// A node namespace for program runs, and the programs loaded.
pub struct Lab {
    pub ns: Netns,
    pub progs: LabPrograms,
    pub a: LabPod,
    pub b: LabPod,
    pub up: Uplink,
}

/// The MAC of the uplink's gateway (a permanent neighbour entry).
pub const GATEWAY_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xfe, 0xfe];

impl Lab {
    /// A node namespace with pods `a` and `b` (endpoint entries and counters, no other
    /// state) and an uplink; the TC programs loaded.
    pub fn new() -> Result<Self> {
        Self::with_object(&programs_obj())
    }

    /// [`Lab::new`] with the benchmark's object, whose prototypes (the XDP host-port path,
    /// the routing floors) the plugin's object leaves out.
    pub fn with_prototypes() -> Result<Self> {
        Self::with_object(&prototypes_obj())
    }

    /// [`Lab::new`] with the eBPF object at `obj`.
    pub fn with_object(obj: &Path) -> Result<Self> {
        let progs = LabPrograms::take(
            obj,
            &[
                ebpf_cni_maps::PROG_FROM_POD,
                ebpf_cni_maps::PROG_FROM_DEV,
                ebpf_cni_maps::PROG_TO_POD,
            ],
        )?;
        let ns = Netns::create("n")?;
        // One `ip` process for the whole topology and one for the indexes: under the
        // kernel matrix's emulation every process costs a good part of a second.
        let mut batch: Vec<String> = Vec::new();
        for (host, peer, tag) in [("ha", "pa", 0x0a), ("hb", "pb", 0x0b)] {
            batch.extend([
                format!(
                    "link add {host} address {} type veth peer name {peer} address {}",
                    mac_text(pod_host_mac(tag)),
                    mac_text(pod_mac(tag))
                ),
                format!("link set {host} up"),
                format!("link set {peer} up"),
            ]);
        }
        batch.extend(
            [
                "link add up0 address 02:00:00:00:00:01 type veth peer name up0p",
                "link set up0 up",
                "link set up0p up",
                "addr add 192.0.2.1/24 dev up0",
                "addr add 2001:db8:1::1/64 dev up0 nodad",
                "neigh add 192.0.2.254 lladdr 02:00:00:00:fe:fe dev up0 nud permanent",
                "neigh add 2001:db8:1::fe lladdr 02:00:00:00:fe:fe dev up0 nud permanent",
                "route add 203.0.113.0/24 via 192.0.2.254",
                "route add 2001:db8:99::/48 via 2001:db8:1::fe",
            ]
            .map(str::to_owned),
        );
        ip_batch(&ns, &batch)?;
        let indexes = ifindexes(&ns)?;
        let index = |name: &str| {
            indexes
                .get(name)
                .copied()
                .with_context(|| format!("no device {name} in the lab"))
        };
        let a = pod(index("ha")?, 2, 0x0a, "ha");
        let b = pod(index("hb")?, 3, 0x0b, "hb");
        // The uplink's IPv6 address is the node's (a FIB lookup to it is not forwarded)
        // only once its local route is in: the kernel adds it when the veth's carrier is
        // seen, which the link watcher may report a while after `link set up`.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let out = ns.ip_ok(&["-6", "route", "show", "table", "local", "2001:db8:1::1"])?;
            if !out.is_empty() {
                break;
            }
            if std::time::Instant::now() > deadline {
                bail!("the uplink's IPv6 address has no local route after 5 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        {
            // Written from a thread inside the namespace: /proc/sys/net is the opener's.
            let _inside = ns.enter()?;
            for key in ["ipv4/ip_forward", "ipv6/conf/all/forwarding"] {
                std::fs::write(format!("/proc/sys/net/{key}"), "1")
                    .with_context(|| format!("enabling net.{key} in the lab"))?;
            }
        }
        let up = Uplink {
            ifindex: index("up0")?,
            mac: [0x02, 0, 0, 0, 0, 0x01],
            v4: Ipv4Addr::new(192, 0, 2, 1),
            v6: "2001:db8:1::1".parse().expect("literal"),
            remote4: Ipv4Addr::new(203, 0, 113, 5),
            remote6: "2001:db8:99::5".parse().expect("literal"),
            unrouted4: Ipv4Addr::new(198, 51, 100, 7),
            unrouted6: "2001:db8:77::7".parse().expect("literal"),
        };
        let mut lab = Self {
            ns,
            progs,
            a,
            b,
            up,
        };
        for p in [lab.a.clone(), lab.b.clone()] {
            lab.progs.set_endpoint(IpAddr::V4(p.v4), p.endpoint(0));
            lab.progs.set_endpoint(IpAddr::V6(p.v6), p.endpoint(0));
            lab.progs.watch_pod(p.ifindex);
        }
        Ok(lab)
    }

    /// Runs program `name` on `frame` as if it came in on device `ifindex`.
    pub fn run(&self, name: &str, ifindex: u32, frame: &[u8]) -> Run {
        self.run_ctx(name, &SkBuff::on(ifindex), frame)
    }

    pub fn run_ctx(&self, name: &str, ctx: &SkBuff, frame: &[u8]) -> Run {
        self.try_run(name, ctx, frame)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Lab::run_ctx`], or the kernel's refusal: `BPF_PROG_TEST_RUN` of 6.1, 6.12 and
    /// 6.18 refuses (EINVAL) an IPv4 or IPv6 frame whose IP header is cut short before the
    /// program sees it; 5.10 runs the program on it.
    pub fn try_run(&self, name: &str, ctx: &SkBuff, frame: &[u8]) -> Result<Run, Refused> {
        let _inside = self.ns.enter().expect("entering the lab's namespace");
        self.progs.run(name, ctx, frame)
    }

    /// [`Programs::time`] of program `name` on device `ifindex`, in the lab's namespace.
    pub fn time(
        &self,
        name: &str,
        ifindex: u32,
        frame: &[u8],
        repeat: u32,
    ) -> Result<f64, Refused> {
        let _inside = self.ns.enter().expect("entering the lab's namespace");
        self.progs.time(name, &SkBuff::on(ifindex), frame, repeat)
    }

    /// `ecni_from_pod` on pod `p`'s host veth.
    pub fn from_pod(&self, p: &LabPod, frame: &[u8]) -> Run {
        self.run(ebpf_cni_maps::PROG_FROM_POD, p.ifindex, frame)
    }

    /// `ecni_from_dev` on the uplink.
    pub fn from_dev(&self, frame: &[u8]) -> Run {
        self.run(ebpf_cni_maps::PROG_FROM_DEV, self.up.ifindex, frame)
    }

    /// The XDP prototype `ecni_xdp_dev` (verified on first use) on the uplink: its XDP
    /// verdict and the frame it left.
    pub fn xdp_dev(&mut self, frame: &[u8]) -> (u32, Vec<u8>) {
        let name = ebpf_cni_maps::PROG_XDP_DEV;
        self.progs
            .load_xdp(name)
            .unwrap_or_else(|e| panic!("{e:#}"));
        let _inside = self.ns.enter().expect("entering the lab's namespace");
        self.progs
            .run_xdp(name, frame)
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// The floor of routing pod → pod, `ecni_floor_pod` (verified on first use), on pod
    /// `p`'s host veth.
    pub fn floor_pod(&mut self, p: &LabPod, frame: &[u8]) -> Run {
        self.floor(ebpf_cni_maps::PROG_FLOOR_POD, p, frame)
    }

    /// The same floor for pods behind netkit devices, `ecni_floor_nk` (verified on first
    /// use), run on pod `p`'s host-side device.
    pub fn floor_nk(&mut self, p: &LabPod, frame: &[u8]) -> Run {
        self.floor(ebpf_cni_maps::PROG_FLOOR_NETKIT, p, frame)
    }

    fn floor(&mut self, name: &str, p: &LabPod, frame: &[u8]) -> Run {
        self.progs.load_tc(name).unwrap_or_else(|e| panic!("{e:#}"));
        self.run(name, p.ifindex, frame)
    }

    /// `ecni_to_pod` on pod `p`'s host veth.
    pub fn to_pod(&self, p: &LabPod, frame: &[u8]) -> Run {
        self.run(ebpf_cni_maps::PROG_TO_POD, p.ifindex, frame)
    }

    /// Pod `p` masquerades (`ipMasq`): the node config's flag, the pod's endpoint flag,
    /// the uplink's addresses as masquerade's sources and the port range 61000-61009.
    pub fn masquerade(&mut self, p: &LabPod) {
        let cfg = NodeConfig {
            flags: ebpf_cni_maps::NODE_FLAG_MASQ | self.config().flags,
            masq_port_min: 61_000,
            masq_port_max: 61_009,
            ..self.config()
        };
        self.progs.set_config(cfg);
        for v4 in [true, false] {
            self.progs
                .set_endpoint(p.addr(v4), p.endpoint(ebpf_cni_maps::EP_FLAG_MASQ));
            self.progs.set_masq_src(self.up.ifindex, self.up.addr(v4));
        }
        // The pods' own networks stay untranslated, as ADD sets it up.
        self.progs
            .add_masq_skip("10.88.0.0".parse().expect("literal"), 16);
        self.progs
            .add_masq_skip("fd00:88::".parse().expect("literal"), 64);
    }

    fn config(&self) -> NodeConfig {
        self.progs.node_config()
    }

    /// Host ports are on: the node config's flag and the uplink's addresses as node
    /// addresses.
    pub fn host_ports(&mut self) {
        let cfg = NodeConfig {
            flags: ebpf_cni_maps::NODE_FLAG_PORTMAP | self.config().flags,
            ..self.config()
        };
        self.progs.set_config(cfg);
        for v4 in [true, false] {
            self.progs.add_node_addr(self.up.addr(v4));
        }
    }

    /// A node without rate limits, as the plugin writes it: the node config's
    /// `NODE_FLAG_NO_LIMITS` (the programs then skip the sender's limit lookup).
    pub fn no_limits(&mut self) {
        let cfg = NodeConfig {
            flags: ebpf_cni_maps::NODE_FLAG_NO_LIMITS | self.config().flags,
            ..self.config()
        };
        self.progs.set_config(cfg);
    }

    /// The source check of pod `p`: its own addresses pass, every other source is
    /// refused, frames must carry its MAC.
    pub fn source_check(&mut self, p: &LabPod) {
        self.source_check_as(p, ebpf_cni_maps::SOURCE_PASS);
    }

    /// [`Self::source_check`] with `own` as the verdict of the pod's own addresses
    /// (`SOURCE_PASS`, or `SOURCE_PASS_MASQ` as ADD writes it for a masquerading pod).
    pub fn source_check_as(&mut self, p: &LabPod, own: u16) {
        use ebpf_cni_maps::{
            SOURCE_FAMILY_V4, SOURCE_FAMILY_V6, SOURCE_HEAD_BITS, SOURCE_POD_BITS, SOURCE_REFUSE,
        };
        let rule = |verdict| SourceRule {
            attachment_id: p.attachment_id,
            mac: p.pod_mac,
            verdict,
        };
        let mut v4 = [0u8; 16];
        v4[..4].copy_from_slice(&p.v4.octets());
        self.progs.set_source(
            SOURCE_HEAD_BITS + 32,
            SourceKey {
                ifindex: p.ifindex,
                family: SOURCE_FAMILY_V4,
                addr: v4,
            },
            rule(own),
        );
        self.progs.set_source(
            SOURCE_HEAD_BITS + 128,
            SourceKey {
                ifindex: p.ifindex,
                family: SOURCE_FAMILY_V6,
                addr: p.v6.octets(),
            },
            rule(own),
        );
        self.progs.set_source(
            SOURCE_POD_BITS,
            SourceKey {
                ifindex: p.ifindex,
                family: 0,
                addr: [0; 16],
            },
            rule(SOURCE_REFUSE),
        );
    }
}

/// A pod's host veth `host` with its peer `peer` in the lab's namespace (the peer only has
/// to exist), addresses 10.88.0.`n` and fd00:88::`n`, MACs ending in `tag`.
/// The host side's MAC of the lab's pod `tag`.
fn pod_host_mac(tag: u8) -> [u8; 6] {
    [0x02, 0, 0, 0, tag, 0x01]
}

/// The pod side's MAC of the lab's pod `tag`.
fn pod_mac(tag: u8) -> [u8; 6] {
    [0x02, 0, 0, 0, tag, 0x02]
}

fn mac_text(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The lab's pod `n` (its addresses end in `n`), whose host veth `host` has index `ifindex`.
fn pod(ifindex: u32, n: u8, tag: u8, host: &str) -> LabPod {
    LabPod {
        host_if: host.to_string(),
        ifindex,
        host_mac: pod_host_mac(tag),
        pod_mac: pod_mac(tag),
        v4: Ipv4Addr::new(10, 88, 0, n),
        v6: Ipv6Addr::new(0xfd00, 0x88, 0, 0, 0, 0, 0, u16::from(n)),
        gateway4: Ipv4Addr::new(10, 88, 0, 1),
        attachment_id: 0xa770_0000 + u64::from(n),
    }
}

/// Runs `commands` in one `ip -n <ns> -batch -`, failing with its stderr unless every one
/// succeeds.
fn ip_batch(ns: &Netns, commands: &[String]) -> Result<()> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("ip")
        .args(["-n", ns.name(), "-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running `ip -batch`")?;
    child
        .stdin
        .take()
        .context("ip's stdin")?
        .write_all(commands.join("\n").as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "`ip -n {} -batch` failed: {}",
            ns.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Every device of the namespace by name, with its index.
fn ifindexes(ns: &Netns) -> Result<std::collections::HashMap<String, u32>> {
    let out = ns.ip_ok(&["-o", "link", "show"])?;
    let mut m = std::collections::HashMap::new();
    for line in out.lines() {
        // "7: ha@pa: <...> ..."
        let mut parts = line.splitn(3, ':');
        let (Some(index), Some(name)) = (parts.next(), parts.next()) else {
            continue;
        };
        let name = name.trim();
        let name = name.split('@').next().unwrap_or(name);
        if let Ok(i) = index.trim().parse() {
            m.insert(name.to_owned(), i);
        }
    }
    Ok(m)
}
