//! Socket options read as the kernel's 64-bit values: a namespace's cookie
//! (`SO_NETNS_COOKIE`) and a socket's own (`SO_COOKIE`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `getsockopt(SOL_SOCKET, opt)` of socket `sock`, a `u64` option.
pub fn u64_option(sock: BorrowedFd<'_>, opt: libc::c_int) -> io::Result<u64> {
    let mut value: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt on a live socket into a u64 of the length passed.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&mut value as *mut u64).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}
