//! The machine the tests run on: the spec versions they check, where the reference plugins
//! and ebpf-cni's pins are, the binaries under test (from the environment), and root.

use std::path::PathBuf;

/// The spec versions whose result format the tests check, oldest first.
pub const CNI_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// Where Debian's containernetworking-plugins put the reference plugins.
pub const REFERENCE_PLUGIN_DIR: &str = "/usr/lib/cni";
/// The reference point-to-point plugin, the behaviour ebpf-cni's basics mirror.
pub const REFERENCE_PTP: &str = "/usr/lib/cni/ptp";
/// The reference host-local IPAM plugin, whose on-disk format ebpf-cni shares.
pub const REFERENCE_HOST_LOCAL: &str = "/usr/lib/cni/host-local";

/// Root of every pin ebpf-cni makes (one directory per node netns below it).
pub const BPF_PIN_BASE: &str = "/sys/fs/bpf/ebpf-cni/v1";
const _: () = assert!(ebpf_cni_maps::str_eq(
    BPF_PIN_BASE,
    // The bpffs mount point, then maps/'s project and layout directories.
    concat!("/sys/fs/bpf/", "ebpf-cni", "/", "v1")
));
const _: () = assert!(ebpf_cni_maps::str_eq(
    ebpf_cni_maps::pin::PROJECT_DIR,
    "ebpf-cni"
));
const _: () = assert!(ebpf_cni_maps::str_eq(
    ebpf_cni_maps::pin::LAYOUT_VERSION_DIR,
    "v1"
));

/// The pin directory ebpf-cni uses for the network namespace with inode `ino`.
pub fn pin_root_for(ino: u64) -> std::path::PathBuf {
    std::path::Path::new(BPF_PIN_BASE).join(format!("{}{ino}", ebpf_cni_maps::pin::NODE_DIR_PREFIX))
}

/// Environment variable carrying the path of the plugin binary under test.
pub const PLUGIN_BIN_ENV: &str = "EBPF_CNI_BIN";

/// Environment variable naming the eBPF object (`ebpf-cni-programs`) the program tests
/// load (`progtest`).
pub const PROGRAMS_OBJ_ENV: &str = "EBPF_CNI_PROGRAMS_OBJ";
/// The benchmark's eBPF object (the plugin's programs and the benchmark's prototypes),
/// which the prototypes' program tests load.
pub const PROTOTYPES_OBJ_ENV: &str = "EBPF_CNI_PROTOTYPES_OBJ";

/// The effective user id. The tests, the demo, the benchmark and the kernel matrix all need
/// root (namespaces, veths, bpffs pins); this is the one place that asks.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Panics unless running as root: these tests create namespaces and veths, and a test that
/// silently skips would pass without checking anything.
pub fn require_root() {
    let euid = euid();
    assert!(
        euid == 0,
        "these tests create network namespaces and must run as root (euid is {euid}); \
         run them through `cargo xtask test` as root"
    );
}

/// The ebpf-cni binary under test, from `EBPF_CNI_BIN`.
pub fn ebpf_cni_bin() -> PathBuf {
    bin_from_env(
        PLUGIN_BIN_ENV,
        "the ebpf-cni binary",
        "Run the tests with `cargo xtask test`, which builds the plugin and sets it",
    )
}

/// Environment variable carrying the path of the previous release's plugin binary, for the
/// upgrade test (`cargo xtask build-previous` builds it; `cargo xtask test` sets it).
pub const PREVIOUS_BIN_ENV: &str = "EBPF_CNI_PREVIOUS_BIN";

/// The previous release's ebpf-cni binary, from `EBPF_CNI_PREVIOUS_BIN`: panics with a hint
/// when unset (an upgrade test without the old build would check nothing).
pub fn previous_ebpf_cni_bin() -> PathBuf {
    bin_from_env(
        PREVIOUS_BIN_ENV,
        "the previous release's ebpf-cni binary",
        "`cargo xtask build-previous` builds it (once) and prints its path; \
         `cargo xtask test` builds it and sets the variable",
    )
}

/// The file `var` names; panics saying it must name `what`, and `hint`, when it does not.
pub(crate) fn bin_from_env(var: &str, what: &str, hint: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(p) if !p.is_empty() => {
            let p = PathBuf::from(p);
            assert!(
                p.is_file(),
                "{var}={} does not name a file: it must name {what}. {hint}",
                p.display()
            );
            p
        }
        _ => panic!("{var} is not set: it must name {what}. {hint}"),
    }
}

/// The conflist `type` naming a plugin binary: its file name.
pub fn plugin_type(bin: &std::path::Path) -> String {
    bin.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| panic!("plugin path {} has no file name", bin.display()))
}
