//! Checks on the names of this crate: what the kernel keeps of an object name, and
//! equality the kernel-side crate can assert at compile time.

/// The kernel keeps 15 bytes of an object name (`BPF_OBJ_NAME_LEN` is 16 with the NUL); a
/// longer name would show up cut in bpftool and in the program info that CHECK compares.
pub(crate) const fn fits_bpf_obj_name(name: &str) -> bool {
    name.len() <= 15
}

/// `a == b` usable in constants, so the kernel-side crate can assert at compile time that the
/// identifiers it declares (which become the object names) match the names of this crate.
pub const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}
