//! The bandwidth and netkit sections in a guest booting one of the kernel matrix's kernels.
//!
//! ebpf-cni paces traffic towards a limited pod only where the kernel has `sch_fq`; this
//! machine's kernel has none (there it polices, and a TCP stream towards the pod gets a
//! fraction of the limit). So where the host lacks it, the section runs in a guest booting
//! Debian's kernel (6.12 by default), both subjects in the same guest: the guest runs this
//! same binary as `ebpf-cni-bench --guest-output FILE`, which runs the section alone and
//! writes its output there as JSON for the host's report. The netkit section runs there too
//! where the host's kernel is built without netkit (Debian's 6.12 has it).
//!
//! Under QEMU's TCG a guest's veth carries about 1.1 Gbit/s here: rates above
//! [`GUEST_MAX_RATE`] would measure the emulator, not the limiter, and are left out (the
//! report says so).

use std::fs;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};

use crate::log::progress;
use crate::params::{Params, Section};
use crate::rig::topo::Binaries;
use crate::sections::{bandwidth, netkit};
use xtask::{build, vmtest};

/// The highest rate measured in a guest: well under what its veth carries, so the
/// sender can offer more than the limit.
pub const GUEST_MAX_RATE: u64 = 300_000_000;

/// How long the guest may take (a full section, every subject, under TCG).
const GUEST_TIMEOUT: Duration = Duration::from_secs(45 * 60);

/// Whether this machine's kernel can pace (has `sch_fq`).
pub fn host_has_fq() -> bool {
    ebpf_cni_tests::bpf::kernel_has_sch_fq()
}

/// The rates of `params` a guest measures, and the note for those it does not.
fn guest_rates(params: &Params) -> (Vec<u64>, Option<String>) {
    let (kept, left): (Vec<u64>, Vec<u64>) =
        params.bw_rates.iter().partition(|r| **r <= GUEST_MAX_RATE);
    let note = (!left.is_empty()).then(|| {
        format!(
            "Not measured in the guest: {} (under QEMU's TCG the guest's veth carries about \
             1.1 Gbit/s, less than 1.5× the rate, so the figure would be the emulator's).",
            left.iter()
                .map(|r| format!("{} Mbit/s", r / 1_000_000))
                .collect::<Vec<_>>()
                .join(", ")
        )
    });
    (kept, note)
}

/// On the host: runs the bandwidth section in a guest booting kernel `series`, with the
/// plugin at `plugin`; its output, with notes saying where it was measured.
pub fn bandwidth(series: &str, params: &Params, plugin: &Path) -> Result<bandwidth::Output> {
    let (text, booted) = in_guest(Section::Bandwidth, series, params, plugin)?;
    let mut out: bandwidth::Output =
        serde_json::from_str(&text).context("parsing the guest's results")?;
    let mut notes = vec![format!(
        "Measured in a guest booting {booted}, \
         both subjects in the same guest: this machine's kernel has no sch_fq, without which \
         ebpf-cni polices traffic towards a pod instead of pacing it."
    )];
    notes.extend(guest_rates(params).1);
    out.table.notes.splice(0..0, notes);
    Ok(out)
}

/// On the host: runs the netkit section in a guest booting kernel `series` (this machine's
/// kernel has no netkit); its output, with a note saying where it was measured.
pub fn netkit(series: &str, params: &Params, plugin: &Path) -> Result<netkit::Output> {
    let (text, booted) = in_guest(Section::Netkit, series, params, plugin)?;
    let mut out: netkit::Output =
        serde_json::from_str(&text).context("parsing the guest's results")?;
    let note = format!(
        "Measured in a guest booting {booted}: this machine's kernel is built without \
         netkit. Under TCG every instruction is emulated, so the absolute figures are the \
         emulator's; the ratios compare paths run by the same emulated CPUs in alternating \
         turns."
    );
    for t in [&mut out.table, &mut out.ext] {
        t.notes.insert(0, note.clone());
    }
    Ok(out)
}

/// Boots kernel `series` and runs `section` alone in it (this same binary with
/// `--guest-output`); the section's output as JSON, and what was booted ("Debian's kernel
/// 6.12.… under QEMU (Tcg, 2 vCPUs)").
fn in_guest(
    section: Section,
    series: &str,
    params: &Params,
    plugin: &Path,
) -> Result<(String, String)> {
    let name = format!("{section:?}").to_lowercase();
    let root = build::target_dir()?.join("bench-guest");
    let dir = root.join(format!("{series}-{name}"));
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (kernel, accel) = vmtest::guest(series, &root)?;
    let file = dir.join(format!("{name}.json"));
    let exe = std::env::current_exe().context("finding the benchmark's binary")?;
    let q = |p: &Path| format!("'{}'", p.to_string_lossy().replace('\'', r"'\''"));
    // The guest's own kernel starts with default socket buffer limits, too small for the
    // bandwidth section's UDP buffers: it gets the host's.
    let mut script = String::new();
    for key in ["rmem_max", "wmem_max"] {
        if let Ok(v) = fs::read_to_string(format!("/proc/sys/net/core/{key}")) {
            script.push_str(&format!("echo {} > /proc/sys/net/core/{key}\n", v.trim()));
        }
    }
    script += &format!(
        "cd {}\n{} --guest-output {} --guest-section {name} --plugin {} --repeats {}{} > \"$out/bench.log\" 2>&1\n",
        q(&build::workspace_root()),
        q(&exe),
        q(&file),
        q(plugin),
        params.repeats,
        if params.quick { " --quick" } else { "" }
    );
    progress(&format!(
        "{name}: in a guest booting kernel {series} ({accel:?})"
    ));
    // Two vCPUs: the sections measure rates and round trips, which want the guest's
    // client and server on CPUs of their own, and run alone.
    let shape = vmtest::Guest {
        cpus: 2,
        append: vmtest::KVM_GUEST.append,
    };
    let booted = vmtest::boot(kernel, (accel, &shape), &dir, &script, GUEST_TIMEOUT, None);
    let log = fs::read_to_string(dir.join("bench.log")).unwrap_or_default();
    let text = booted
        .and_then(|()| fs::read_to_string(&file).context("reading the guest's results"))
        .with_context(|| {
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("the guest's benchmark log ends:\n{}", tail.join("\n"))
        })?;
    let release = fs::read_to_string(dir.join("uname")).unwrap_or_default();
    Ok((
        text,
        format!(
            "Debian's kernel {} under QEMU ({accel:?}, {} vCPUs)",
            release.trim(),
            shape.cpus
        ),
    ))
}

/// In the guest: `section` alone (the bandwidth or the netkit section), its output written
/// to `file` as JSON.
pub fn serve(section: Section, params: &Params, plugin: &Path, file: &Path) -> Result<()> {
    ebpf_cni_tests::bpf::ensure_bpffs()?;
    let mut params = params.clone();
    params.bw_rates = guest_rates(&params).0;
    let bins = Binaries {
        ebpf_cni: plugin.to_path_buf(),
        floor: None,
    };
    let json = match section {
        Section::Bandwidth => serde_json::to_string(&bandwidth::run(&params, &bins))?,
        Section::Netkit => serde_json::to_string(&netkit::measure(&params, &bins))?,
        s => bail!("section {s:?} does not run in a guest"),
    };
    fs::write(file, json).with_context(|| format!("writing {}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_above_what_a_guest_carries_are_left_out_and_named() {
        let mut p = Params::full();
        p.bw_rates = vec![10_000_000, 100_000_000, 1_000_000_000];
        let (kept, note) = guest_rates(&p);
        assert_eq!(kept, [10_000_000, 100_000_000]);
        assert!(note.unwrap().contains("1000 Mbit/s"));
        p.bw_rates = vec![100_000_000];
        assert_eq!(guest_rates(&p), (vec![100_000_000], None));
    }
}
