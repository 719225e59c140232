//! Types shared between the kernel-side programs (`ebpf/`) and user space (`plugin/`).
#![no_std]
