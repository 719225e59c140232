//! Puts the kernel-side object where `bpf/mod.rs` embeds it from: `$OUT_DIR/ebpf-cni-programs`.
//!
//! `cargo xtask build` compiles the eBPF crate with nightly and bpf-linker and passes the
//! object's absolute path in `EBPF_CNI_BPF_OBJ`. Without that variable an empty stub is
//! written instead, so `cargo check`, clippy and unit tests need neither; such a binary
//! reports `BpfError::NotBuilt` when asked to attach.
//!
//! It also hashes the object (64-bit FNV-1a, as `bpf::keys::fnv1a`) into `EBPF_CNI_REVISION`, the
//! name programs are pinned under: hashing the object at run time cost every ADD 1.3 ms
//! per call.

use std::{env, fs, path::PathBuf};

const OBJ_ENV: &str = "EBPF_CNI_BPF_OBJ";
const EMBEDDED_NAME: &str = "ebpf-cni-programs";

fn main() {
    println!("cargo::rerun-if-env-changed={OBJ_ENV}");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dest = out_dir.join(EMBEDDED_NAME);

    match env::var_os(OBJ_ENV).filter(|v| !v.is_empty()) {
        Some(obj) => {
            let obj = PathBuf::from(obj);
            // Build scripts run in the package directory, so a relative path would silently
            // mean something other than what the caller had in mind.
            assert!(
                obj.is_absolute(),
                "{OBJ_ENV} must be an absolute path, got {}",
                obj.display()
            );
            println!("cargo::rerun-if-changed={}", obj.display());
            if let Err(e) = fs::copy(&obj, &dest) {
                panic!(
                    "cannot copy {OBJ_ENV}={} to {}: {e}",
                    obj.display(),
                    dest.display()
                );
            }
        }
        None => {
            println!("cargo::rerun-if-changed=build.rs");
            // Rewriting an unchanged stub would bump its mtime and recompile the crate.
            if fs::read(&dest).map(|b| !b.is_empty()).unwrap_or(true) {
                fs::write(&dest, [])
                    .unwrap_or_else(|e| panic!("cannot write {}: {e}", dest.display()));
            }
        }
    }
    let object = fs::read(&dest).unwrap_or_else(|e| panic!("cannot read {}: {e}", dest.display()));
    let hash = object.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    println!("cargo::rustc-env=EBPF_CNI_REVISION={hash:016x}");
}
