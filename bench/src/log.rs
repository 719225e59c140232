//! Progress lines on stderr (stdout carries the headline table at the end).

use std::sync::OnceLock;
use std::time::Instant;

/// One progress line on stderr, with the time since the bench started.
pub fn progress(msg: &str) {
    static START: OnceLock<Instant> = OnceLock::new();
    let t = START.get_or_init(Instant::now).elapsed().as_secs_f64();
    eprintln!("[bench {t:6.1}s] {msg}");
}
