//! Kernel side of ebpf-cni: TC classifiers on the host end of each pod's veth pair.
//!
//! For now they only count packets and bytes per direction into a per-CPU array and always
//! hand the packet on unchanged. They are attached through TCX, where -1 (`TCX_NEXT`, the
//! same value as `TC_ACT_UNSPEC` for a classic clsact filter) means "no verdict: run the
//! next program, then continue into the stack"; returning it explicitly keeps this program
//! from ever deciding a packet's fate by accident.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::tcx_action_base::TCX_NEXT,
    macros::{classifier, map},
    maps::PerCpuArray,
    programs::TcContext,
};
use ebpf_cni_maps::{str_eq, TrafficCounters, DIR_COUNT, DIR_FROM_POD, DIR_TO_POD};

/// Counters per direction (index `DIR_*`); the map name is this identifier.
#[map]
static ECNI_COUNTERS: PerCpuArray<TrafficCounters> = PerCpuArray::with_max_entries(DIR_COUNT, 0);

// The identifiers above and below become the object names user space looks up; keep them
// equal to the shared constants.
const _: () = assert!(str_eq(
    ebpf_cni_maps::COUNTERS_MAP,
    stringify!(ECNI_COUNTERS)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::PROG_FROM_POD,
    stringify!(ecni_from_pod)
));
const _: () = assert!(str_eq(ebpf_cni_maps::PROG_TO_POD, stringify!(ecni_to_pod)));

/// Counting is best effort: whatever happens, the packet goes on.
const CONTINUE: i32 = TCX_NEXT;

/// Host veth ingress: the packet was sent by the pod.
#[classifier]
pub fn ecni_from_pod(ctx: TcContext) -> i32 {
    match try_count(&ctx, DIR_FROM_POD) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

/// Host veth egress: the packet is about to enter the pod.
#[classifier]
pub fn ecni_to_pod(ctx: TcContext) -> i32 {
    match try_count(&ctx, DIR_TO_POD) {
        Ok(verdict) | Err(verdict) => verdict,
    }
}

#[inline(always)]
fn try_count(ctx: &TcContext, direction: u32) -> Result<i32, i32> {
    // The kernel bounds-checks the index (NULL past `max_entries`); a miss must still let
    // the packet through.
    let counters = ECNI_COUNTERS.get_ptr_mut(direction).ok_or(CONTINUE)?;
    // SAFETY: the pointer is the current CPU's slot, valid for the whole program run. TC
    // programs run with bottom halves disabled, so no other run on this CPU interleaves with
    // this read-modify-write. Wrapping adds: no overflow check may put a panic path here.
    unsafe {
        (*counters).packets = (*counters).packets.wrapping_add(1);
        (*counters).bytes = (*counters).bytes.wrapping_add(u64::from(ctx.len()));
    }
    Ok(CONTINUE)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// GPL-compatible, so GPL-only helpers stay available to later programs.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
