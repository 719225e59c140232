//! ebpf-cni: a CNI interface plugin whose dataplane runs as TC/XDP eBPF programs.
pub mod cni;

pub fn run() -> i32 {
    0
}
