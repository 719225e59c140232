//! The object as a whole: what the verifier walks, what the programs call.

use super::lab;
use ebpf_cni_maps::{PROG_FROM_CHAIN, PROG_FROM_DEV, PROG_FROM_POD};

/// The pod programs stay within a budget of verified instructions: the verifier's walk is
/// most of a node's first ADD (`ecni_from_pod` alone was 219 ms of 387 here), and a log
/// call or a value copied where the verifier cannot prune multiplies it. Before: 122,848
/// for `ecni_from_pod`, 17,532 for `ecni_from_dev` and 23,870 for `ecni_from_chain` on 6.18
/// (six aya-log calls walked on every path, the destination's endpoint copied); then
/// 61,075, 13,719 and 12,527 (6.1: 45,813 and 17,397 for the first two); with the host
/// port translations as global functions (the verifier walked each of `ecni_from_pod`'s
/// three calls again for every state it reached them in), 43,490, 15,335 and 12,015; with
/// no calls to the byte loops of `memset` and `memmove` (each call's loop walked byte by
/// byte, see `no_program_calls_a_memory_builtin`), 32,571, 11,648 and 9,247; with the
/// pods' counters read for their flags (the receiver's held through delivery), 36,185,
/// 12,178 and 10,158; with the sender's egress limit flag too, 36,307, 12,178 and 10,162;
/// with IPv4 fragments masqueraded, 37,804 and 16,227 for the first two (6.1: 35,976 and
/// 18,615); with IPv6's too, 40,380, 15,189 and 10,019 (6.1, as first built: 37,585 and
/// 16,429), and the
/// budget of `ecni_from_pod` 42,000 where it was 40,000. IPv6 fragments are handled by
/// global functions with constant offsets (the fragment header read by masquerade alone,
/// the records' lookup and insert, the wanted check, the reply, the first fragment's
/// rewrite): read by every parse, the header took 40,601; an offset of two values took
/// 39,593 here but 28,351 for `ecni_from_dev` on 6.1, and 5.10 refused it once the
/// compiler spilled it ("math between pkt pointer and register with unbounded min
/// value"). The cluster network's tunnel check, inlined into `ecni_from_dev`, took it to
/// 33,518 on 6.1; as a global function, 23,166 (6.12: 20,361; 6.18: 21,492); with the
/// per-member counters and the IPv6 underlay's key, 23,464 (6.12: 20,659; 6.18: 21,868).
/// Kernels before 5.16 do not count (asserted as such, so the test notices one that
/// starts).
#[test]
fn the_pod_programs_verify_within_their_budget_of_instructions() {
    let mut lab = lab();
    lab.progs.load_tc(PROG_FROM_CHAIN).unwrap();
    let kernel = ebpf_cni_tests::bpf::kernel_version();
    for (name, budget) in [
        (PROG_FROM_POD, 47_000),
        (PROG_FROM_DEV, 24_000),
        (PROG_FROM_CHAIN, 20_000),
    ] {
        let counted = lab.progs.verified_instructions(name).unwrap();
        eprintln!("{name}: {counted:?} verified instructions on {kernel:?} (budget {budget})");
        match counted {
            Some(n) => assert!(
                n <= budget,
                "{name} took {n} verified instructions, over its budget of {budget}"
            ),
            None => assert!(
                kernel < (5, 16),
                "kernel {kernel:?} counts verified instructions, yet none for {name}"
            ),
        }
    }
}

/// The byte loops that stand in for the memory builtins in BPF: a call to one copies or
/// sets a byte per iteration of a called loop, which the CPU runs and the verifier walks
/// iteration by iteration.
const MEMORY_BUILTINS: [&str; 5] = ["memcpy", "memmove", "memset", "memcmp", "bcmp"];

/// No program calls a memory builtin. The linker's default (`--bpf-expand-memcpy-in-order`)
/// lowered every `memset` and `memmove` LLVM emits into such a call: before, the object made
/// 75, among them the 64-byte zeroing of `bpf_fib_lookup` on every routed packet and each
/// 16-byte address copied into a flow key. The build now passes the linker
/// `--disable-expand-memcpy-in-order`, and they are plain loads and stores.
#[test]
fn no_program_calls_a_memory_builtin() {
    use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget};
    let path = ebpf_cni_tests::progtest::programs_obj();
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = object::File::parse(&*data)
        .unwrap_or_else(|e| panic!("{}: not an object file: {e}", path.display()));
    let mut calls = Vec::new();
    let mut relocations = 0;
    for section in file.sections() {
        for (offset, reloc) in section.relocations() {
            relocations += 1;
            let RelocationTarget::Symbol(i) = reloc.target() else {
                continue;
            };
            let name = file
                .symbol_by_index(i)
                .and_then(|s| s.name().map(str::to_owned))
                .unwrap_or_default();
            if MEMORY_BUILTINS.contains(&name.as_str()) {
                let at = section.name().unwrap_or("?");
                calls.push(format!("{at}+{offset:#x} calls {name}"));
            }
        }
    }
    // The programs' map references are relocations too: none read means none were parsed.
    assert!(relocations > 0, "{}: no relocation read", path.display());
    assert!(
        calls.is_empty(),
        "{} calls of memory builtins in {}: {}",
        calls.len(),
        path.display(),
        calls.join("; ")
    );
}

/// The programs of the eBPF object at `path`: its global functions of default visibility
/// outside `.text` (which holds the subprograms they call), sorted.
fn programs_of(path: &std::path::Path) -> Vec<String> {
    use object::{Object, ObjectSection, ObjectSymbol, SymbolKind, SymbolScope, SymbolSection};
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = object::File::parse(&*data)
        .unwrap_or_else(|e| panic!("{}: not an object file: {e}", path.display()));
    let mut programs: Vec<String> = file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.is_global())
        .filter(|s| s.scope() == SymbolScope::Dynamic)
        .filter(|s| match s.section() {
            SymbolSection::Section(i) => file
                .section_by_index(i)
                .is_ok_and(|sec| sec.name() != Ok(".text")),
            _ => false,
        })
        .filter_map(|s| s.name().ok().map(str::to_owned))
        .collect();
    programs.sort();
    programs
}

fn sorted(names: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    v.sort();
    v
}

/// The object the plugin embeds holds exactly the programs it loads; the benchmark's
/// prototypes (the XDP host-port path, the routing floors) are in the benchmark's object
/// only, beside the same programs.
#[test]
fn the_plugins_object_holds_only_what_it_loads_and_the_prototypes_are_the_benchmarks() {
    use ebpf_cni_maps::{PLUGIN_PROGRAMS, PROTOTYPE_PROGRAMS};
    let plugin = programs_of(&ebpf_cni_tests::progtest::programs_obj());
    assert_eq!(plugin, sorted(&PLUGIN_PROGRAMS), "the plugin's object");
    let bench = programs_of(&ebpf_cni_tests::progtest::prototypes_obj());
    let both: Vec<&str> = PLUGIN_PROGRAMS
        .iter()
        .chain(&PROTOTYPE_PROGRAMS)
        .copied()
        .collect();
    assert_eq!(bench, sorted(&both), "the benchmark's object");
}
