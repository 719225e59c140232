//! The test hooks: environment variables only a test build reads (`--features test-hooks`,
//! the build `cargo xtask test` runs the integration suites with). A release build has
//! none: each function below then answers "no hook", and no hook's name is in the binary
//! (`cargo xtask dist` checks; `ebpf-cni version` says which build it is).

/// Whether this is a test build.
pub const ENABLED: bool = cfg!(feature = "test-hooks");

/// `EBPF_CNI_FAILPOINT=before-result`: ADD fails after every step succeeded, so a test
/// can prove the rollback undoes all of them.
#[cfg(feature = "test-hooks")]
pub const FAILPOINT_ENV: &str = "EBPF_CNI_FAILPOINT";
/// The kernel release to act on instead of `uname -r`, so a test can show what a node
/// with an older kernel gets without booting one (e.g. `5.4.0`, below the minimum).
#[cfg(feature = "test-hooks")]
const KERNEL_RELEASE_ENV: &str = "EBPF_CNI_TEST_KERNEL_RELEASE";
/// A file to read the boot id from instead of the kernel's, so a test can show what the
/// first ADD after a reboot does without rebooting.
#[cfg(feature = "test-hooks")]
const BOOT_ID_FILE_ENV: &str = "EBPF_CNI_BOOT_ID_FILE";

/// A file ADD takes an exclusive `flock` on just before it creates the pod's veth: a test
/// holding that lock holds ADD at that step (the other steps are held by the locks they
/// take themselves: the IPAM store's, the node's).
#[cfg(feature = "test-hooks")]
const HOLD_BEFORE_VETH_ENV: &str = "EBPF_CNI_HOLD_BEFORE_VETH";

/// The variable `name`, when set and not empty.
#[cfg(feature = "test-hooks")]
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Whether ADD is to fail once every step has succeeded ([`FAILPOINT_ENV`]); a release
/// build has no failpoint at all (see `node::Failpoint`).
#[cfg(feature = "test-hooks")]
pub fn fail_before_result() -> bool {
    var(FAILPOINT_ENV).as_deref() == Some("before-result")
}

/// Waits while a test holds ADD before its veth step ([`HOLD_BEFORE_VETH_ENV`]); a
/// release build goes straight on.
pub fn hold_before_veth() {
    #[cfg(feature = "test-hooks")]
    if let Some(path) = var(HOLD_BEFORE_VETH_ENV) {
        use std::os::fd::AsRawFd;
        if let Ok(file) = std::fs::File::open(&path) {
            // SAFETY: flock on a descriptor this function owns; the lock goes with it.
            unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        }
    }
}

/// The kernel release a test stands in for `uname -r`.
pub fn kernel_release() -> Option<String> {
    #[cfg(feature = "test-hooks")]
    return var(KERNEL_RELEASE_ENV);
    #[cfg(not(feature = "test-hooks"))]
    None
}

/// The file a test has the boot id read from.
pub fn boot_id_file() -> Option<std::path::PathBuf> {
    #[cfg(feature = "test-hooks")]
    return var(BOOT_ID_FILE_ENV).map(Into::into);
    #[cfg(not(feature = "test-hooks"))]
    None
}
