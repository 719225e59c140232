//! How numbers are written in the report, the charts and the progress lines.

/// 10000 → "10,000".
pub fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// 0.0123 → "0.012", 12.34 → "12.3", 12345 → "12,345".
pub fn short_num(v: f64) -> String {
    let a = v.abs();
    if v.fract() == 0.0 && a < 1e15 {
        let sign = if v < 0.0 { "-" } else { "" };
        format!("{sign}{}", thousands(a as usize))
    } else if a >= 1000.0 {
        let sign = if v < 0.0 { "-" } else { "" };
        format!("{sign}{}", thousands(a.round() as usize))
    } else if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// A rate in bit/s: 10000000 → "10 Mbit/s", 1000000000 → "1 Gbit/s".
pub fn rate(bps: u64) -> String {
    if bps >= 1_000_000_000 && bps.is_multiple_of(1_000_000_000) {
        format!("{} Gbit/s", bps / 1_000_000_000)
    } else {
        format!("{} Mbit/s", bps / 1_000_000)
    }
}
