use super::*;

/// Loads `r0 = TCX_NEXT; exit`, attaches it to `dev` in `ns` with a TCX link, pins the
/// link at `pin` (parent directories created) and returns the link's id. The attachment
/// lives as long as the pin.
pub fn attach_pinned_tcx(ns: &Netns, dev: &str, direction: Direction, pin: &Path) -> Result<u32> {
    ensure_bpffs()?;
    if let Some(parent) = pin.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("mkdir {}", parent.display()))?;
    }
    ns.run_in(|| -> Result<u32> {
        let idx = ifindex(dev)?;
        let prog = load_tc_next()?;
        let mut attr = Buf::new();
        attr.put_u32(0, prog.as_raw_fd() as u32);
        attr.put_u32(4, idx);
        attr.put_u32(
            8,
            match direction {
                Direction::Ingress => BPF_TCX_INGRESS,
                Direction::Egress => BPF_TCX_EGRESS,
            },
        );
        let link = fd_from(sys_bpf(BPF_LINK_CREATE, &mut attr, 32).context("BPF_LINK_CREATE tcx")?);
        let c = CString::new(pin.as_os_str().as_encoded_bytes())?;
        let mut attr = Buf::new();
        attr.put_u64(0, c.as_ptr() as u64);
        attr.put_u32(8, link.as_raw_fd() as u32);
        sys_bpf(BPF_OBJ_PIN, &mut attr, 16)
            .with_context(|| format!("pinning {}", pin.display()))?;
        let info = obj_info(&link)?;
        Ok(info.u32_at(4))
    })?
}

/// Loads the same program and pins the program itself at `pin` (for attaching it with
/// `tc filter ... bpf object-pinned`); returns its id.
pub fn pin_tc_prog(pin: &Path) -> Result<u32> {
    ensure_bpffs()?;
    if let Some(parent) = pin.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("mkdir {}", parent.display()))?;
    }
    let prog = load_tc_next()?;
    let c = CString::new(pin.as_os_str().as_encoded_bytes())?;
    let mut attr = Buf::new();
    attr.put_u64(0, c.as_ptr() as u64);
    attr.put_u32(8, prog.as_raw_fd() as u32);
    sys_bpf(BPF_OBJ_PIN, &mut attr, 16).with_context(|| format!("pinning {}", pin.display()))?;
    Ok(obj_info(&prog)?.u32_at(4))
}

fn load_tc_next() -> Result<OwnedFd> {
    // r0 = -1 (TCX_NEXT); exit
    let insns: [u64; 2] = [
        u64::from_ne_bytes([0xb7, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff]),
        u64::from_ne_bytes([0x95, 0, 0, 0, 0, 0, 0, 0]),
    ];
    let license = c"GPL";
    let mut attr = Buf::new();
    attr.put_u32(0, BPF_PROG_TYPE_SCHED_CLS);
    attr.put_u32(4, insns.len() as u32);
    attr.put_u64(8, insns.as_ptr() as u64);
    attr.put_u64(16, license.as_ptr() as u64);
    attr.0[48..48 + 12].copy_from_slice(b"ecni_selftst");
    Ok(fd_from(
        sys_bpf(BPF_PROG_LOAD, &mut attr, 72).context("BPF_PROG_LOAD")?,
    ))
}
