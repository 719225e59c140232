fn main() {
    std::process::exit(ebpf_cni::run());
}
