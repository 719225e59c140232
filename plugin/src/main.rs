/// dlmalloc, not the C library's allocator: the release binaries link musl statically, and
/// musl's allocator hands freed memory back to the kernel at once, so one ADD made 43
/// `mmap` and 36 `munmap` calls (its 64 KiB netlink receive buffers among them) and one
/// STATUS 66 of its 225 system calls. dlmalloc keeps what it freed for the next
/// allocation (docs/design-decisions.md, "The allocator").
#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

fn main() {
    std::process::exit(ebpf_cni::run());
}
