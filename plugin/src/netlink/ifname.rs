//! Interface names by index, in the calling thread's namespace.
//!
//! Not nix's `if_indextoname`: it takes the C function's NULL (no such interface) for a
//! success and returns an empty name (its sentinel for that pointer is -1). A DEL whose
//! pod's veth was already gone then detached filters from the device "", and the kernel,
//! asked for a device of that name, ran modprobe for `netdev-` twice per DEL (2 s each
//! under emulation); an ADD took a host port or address held by a pod whose veth was gone
//! for one still in use.

/// The name of interface `index`, or None when the namespace has none of that index.
pub fn name_of(index: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` holds IF_NAMESIZE bytes, as if_indextoname(3) requires; it writes
    // a NUL-terminated name there or returns NULL.
    let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: on success `buf` holds a NUL-terminated string (IF_NAMESIZE includes it).
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned()).filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_index_has_no_name_and_loopback_has_its_own() {
        // Index 1 is loopback in every namespace.
        assert_eq!(name_of(1).as_deref(), Some("lo"));
        assert_eq!(name_of(u32::MAX - 7), None);
        assert_eq!(name_of(0), None);
    }
}
