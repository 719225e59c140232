//! The `fq` qdisc of pods whose ingress limit is paced (EDT, see `ebpf/src/bandwidth.rs`).
//!
//! A pod with an ingress limit gets an `fq` as the root qdisc of its host veth, with
//! ebpf-cni's handle ([`EDT_QDISC_HANDLE`]): `ecni_to_pod` stamps each packet towards the pod
//! with its departure time and fq releases it then. Nothing else: no class, no filter, and
//! pods without an ingress limit keep the veth's `noqueue`. Where the kernel has no `sch_fq`,
//! or the veth already has a root qdisc of another kind (chained mode: the first plugin's,
//! or an operator's, left alone), the limit is policed instead, and the bucket's mode says
//! which and why. A veth that already has an `fq` is paced through it, and that qdisc stays
//! when the pod goes: only ebpf-cni's own handle is ever removed.

use ebpf_cni_maps::{
    Bucket, RateLimit, EDT_QDISC_HANDLE, LIMIT_EDT, LIMIT_MODE_MASK, LIMIT_POLICE,
    LIMIT_POLICE_FOREIGN_QDISC, LIMIT_POLICE_NO_FQ,
};

use super::{kernel, BpfError};
use crate::netlink::tc::{self, FqAdded};

/// How an ingress limit is held, for `inspect`.
pub fn mode_label(mode: u32) -> &'static str {
    match mode {
        LIMIT_EDT => "edt+fq",
        LIMIT_POLICE_NO_FQ => "policer (no sch_fq)",
        LIMIT_POLICE_FOREIGN_QDISC => "policer (another root qdisc)",
        LIMIT_POLICE => "policer",
        _ => "unknown",
    }
}

/// ADD: makes the ingress limit in `limits` (if any) paced where it can, adding the fq, and
/// records the mode in the limit. `Ok(true)`: this call created the fq, which the caller
/// removes with [`remove`] if the rest of ADD fails.
pub fn prepare(
    host_ifindex: u32,
    limits: &mut Option<RateLimit>,
    pod: &dyn std::fmt::Display,
) -> Result<bool, BpfError> {
    let Some(l) = limits.as_mut().filter(|l| l.ingress.limits()) else {
        return Ok(false);
    };
    let qdisc_err = |what, source| BpfError::Qdisc {
        what,
        ifindex: host_ifindex,
        source,
    };
    let added = if fq_possible() {
        tc::add_root_fq(host_ifindex, EDT_QDISC_HANDLE)
            .map_err(|e| qdisc_err("add the fq qdisc", e))?
    } else {
        FqAdded::Unsupported
    };
    let (mode, created) = match added {
        FqAdded::Created => (LIMIT_EDT, true),
        FqAdded::Occupied => {
            let (kind, _) =
                tc::root_qdisc(host_ifindex).map_err(|e| qdisc_err("read the root qdisc", e))?;
            if kind == "fq" {
                (LIMIT_EDT, false)
            } else {
                log::warn!(
                    "the host veth of {pod} has root qdisc {kind}: its ingress limit is policed, not paced"
                );
                (LIMIT_POLICE_FOREIGN_QDISC, false)
            }
        }
        FqAdded::Unsupported => {
            log::warn!(
                "kernel {} has no sch_fq: the ingress limit of {pod} is policed, not paced (one TCP stream towards it gets less than the limit)",
                kernel::release()
            );
            (LIMIT_POLICE_NO_FQ, false)
        }
    };
    // Keep the flags above the mode (`unshapedSubnets`/`shapedSubnets`).
    l.ingress.mode = (l.ingress.mode & !LIMIT_MODE_MASK) | mode;
    Ok(created)
}

/// Whether asking for an fq can succeed: `sch_fq` is loaded, or the kernel has a module
/// tree to load it from. Asking a kernel that has neither makes it run `modprobe` (a
/// user-mode helper) on every ADD of a limited pod, for nothing.
fn fq_possible() -> bool {
    std::path::Path::new("/sys/module/sch_fq").exists()
        || std::path::Path::new("/lib/modules")
            .join(kernel::release())
            .exists()
}

/// CHECK: a paced pod's veth has an fq at its root; a pod without an ingress limit has not
/// ebpf-cni's.
pub fn check(host_ifindex: u32, actual: Option<RateLimit>) -> Result<(), BpfError> {
    let (kind, handle) = tc::root_qdisc(host_ifindex).map_err(|source| BpfError::Qdisc {
        what: "read the root qdisc",
        ifindex: host_ifindex,
        source,
    })?;
    let ingress = actual.map(|l| l.ingress).filter(Bucket::limits);
    match ingress {
        Some(b) if b.mode & LIMIT_MODE_MASK == LIMIT_EDT && kind != "fq" => {
            Err(BpfError::PacingQdiscMissing {
                ifindex: host_ifindex,
                found: kind,
            })
        }
        None if kind == "fq" && handle == EDT_QDISC_HANDLE => Err(BpfError::PacingQdiscLeft {
            ifindex: host_ifindex,
        }),
        _ => Ok(()),
    }
}

/// DEL, GC and a failed ADD: removes ebpf-cni's fq from the veth, if it is there.
pub fn remove(host_ifindex: u32) -> Result<bool, BpfError> {
    tc::delete_root_fq(host_ifindex, EDT_QDISC_HANDLE).map_err(|source| BpfError::Qdisc {
        what: "delete the fq qdisc",
        ifindex: host_ifindex,
        source,
    })
}
