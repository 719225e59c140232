//! The release artifacts (issue 23, `cargo xtask dist`), installed as an operator installs
//! them: `cargo xtask test` builds them and names them in `EBPF_CNI_DIST_*` (see
//! `ebpf_cni_tests::release`); a test whose artifact is not named fails, it never skips.
//!
//! - The tarballs: the `.sha256` checks with `sha256sum -c`; the members are exactly the
//!   documented ones, owned by root, with one time; LICENSE, INSTALL.md and the examples
//!   are the repository's; the binary is static and of the right machine.
//! - The amd64 tarball's binary, extracted alone into an empty directory as INSTALL.md
//!   says, runs a pod's ADD, CHECK and DEL on a test node (its eBPF programs load and
//!   attach), and starts in a Debian 11 system (glibc 2.31, older than this machine's: a
//!   glibc-linked build fails there) for `version` and CNI `VERSION`.
//! - The amd64 .deb installs with `dpkg -i` into a clean Debian 12 system, runs from both
//!   its paths, lists exactly the expected files, writes nothing else (no conflist, no
//!   maintainer script) and `dpkg --purge` leaves the system's file list as it was (but
//!   for an empty /opt that no package owned: see the test).
//! - The arm64 tarball and .deb hold an aarch64 static binary that answers `version` and
//!   CNI `VERSION` under qemu-aarch64, and the .deb the same files as amd64's.
//! - The image, loaded into a podman of the test's own, runs `install` with temporary
//!   directories mounted as the host's CNI directories (see the image test).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use ebpf_cni_tests::config::{self, Stack};
use ebpf_cni_tests::release::{self as rel, artifact, deploy_dir, ElfFacts, ScratchRootfs};
use ebpf_cni_tests::state::{assert_attachment, assert_gone};
use ebpf_cni_tests::{
    require_root, unique_container_id, Attachment, NetConfList, Node, PluginUnderTest,
    ResultExpectation,
};
use serde_json::{json, Value};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What the tarballs hold, sorted as `tar` lists them.
const TARBALL_MEMBERS: [&str; 6] = [
    "INSTALL.md",
    "LICENSE",
    "ebpf-cni",
    "examples/",
    "examples/chained-bridge.conflist",
    "examples/standalone.conflist",
];

/// What `dpkg -L ebpf-cni` lists.
const DEB_FILES: [&str; 18] = [
    "/.",
    "/opt",
    "/opt/cni",
    "/opt/cni/bin",
    "/opt/cni/bin/ebpf-cni",
    "/usr",
    "/usr/lib",
    "/usr/lib/cni",
    "/usr/lib/cni/ebpf-cni",
    "/usr/share",
    "/usr/share/doc",
    "/usr/share/doc/ebpf-cni",
    "/usr/share/doc/ebpf-cni/INSTALL.md",
    "/usr/share/doc/ebpf-cni/README.md",
    "/usr/share/doc/ebpf-cni/copyright",
    "/usr/share/doc/ebpf-cni/examples",
    "/usr/share/doc/ebpf-cni/examples/chained-bridge.conflist",
    "/usr/share/doc/ebpf-cni/examples/standalone.conflist",
];

const AMD64_MACHINE: &str = "Advanced Micro Devices X86-64";
const ARM64_MACHINE: &str = "AArch64";

/// Runs `cmd` (stdin empty unless set); panics with its output unless it succeeds.
fn ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    assert!(out.status.success(), "{what} failed: {}", describe(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn describe(out: &Output) -> String {
    format!(
        "{}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )
}

/// `cmd` with `stdin` written to it; its output.
fn with_stdin(cmd: &mut Command, stdin: &str) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Checks the archive against its `.sha256` as INSTALL.md tells operators to.
fn verify_sha256(archive: &Path) {
    let dir = archive.parent().unwrap();
    let name = archive.file_name().unwrap().to_string_lossy().into_owned();
    let out = ok(
        Command::new("sha256sum")
            .args(["--check", "--strict"])
            .arg(format!("{name}.sha256"))
            .current_dir(dir),
        "sha256sum --check",
    );
    assert_eq!(out, format!("{name}: OK\n"));
}

/// `tar -C <fresh dir> -xzf <tarball> ebpf-cni`, INSTALL.md's command: the directory holds
/// the binary and nothing else.
fn unpack_binary(tarball: &Path) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("ecni-release-")
        .tempdir()
        .unwrap();
    ok(
        Command::new("tar")
            .arg("-C")
            .arg(dir.path())
            .arg("-xzf")
            .arg(tarball)
            .arg("ebpf-cni"),
        "extracting the binary",
    );
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["ebpf-cni"]);
    dir
}

/// The command running `bin` (through `runner` when it is for another architecture).
fn plugin_command(runner: Option<&str>, bin: &Path) -> Command {
    match runner {
        Some(r) => {
            let mut c = Command::new(r);
            c.arg(bin);
            c
        }
        None => Command::new(bin),
    }
}

/// `version` and the CNI `VERSION` command of the binary `cmd` runs.
fn assert_answers_version(mut cmd: impl FnMut() -> Command, what: &str) {
    let out = ok(cmd().arg("version").stdin(Stdio::null()), what);
    assert!(
        out.starts_with(&format!("ebpf-cni {VERSION}\n"))
            && out.contains("eBPF programs: embedded"),
        "{what}: `version` printed {out:?}"
    );
    let mut c = cmd();
    c.env("CNI_COMMAND", "VERSION");
    let out = with_stdin(&mut c, r#"{"cniVersion":"1.0.0"}"#);
    assert!(out.status.success(), "{what}: VERSION: {}", describe(&out));
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{what}: VERSION printed no JSON ({e}): {}", describe(&out)));
    assert_eq!(v["cniVersion"], "1.0.0", "{what}: {v}");
    let supported = v["supportedVersions"]
        .as_array()
        .expect("supportedVersions");
    assert!(supported.contains(&json!("1.0.0")), "{what}: {v}");
}

/// The tarball's members, their owners and times, and its shipped files against the
/// repository's; the binary extracted alone is static and of `machine`.
fn check_tarball(tarball: &Path, arch: &str, machine: &str) {
    assert_eq!(
        tarball.file_name().unwrap().to_string_lossy(),
        format!("ebpf-cni-{VERSION}-linux-{arch}.tar.gz")
    );
    verify_sha256(tarball);
    let listing = ok(
        Command::new("tar")
            .args(["--list", "--verbose", "--numeric-owner", "--gzip", "--file"])
            .arg(tarball),
        "listing the tarball",
    );
    let mut names = Vec::new();
    let mut times = BTreeSet::new();
    for line in listing.lines() {
        // `-rw-r--r-- 0/0 11358 2026-11-24 15:46 LICENSE`
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 6, "{line}");
        assert_eq!(f[1], "0/0", "not owned by root: {line}");
        times.insert(format!("{} {}", f[3], f[4]));
        names.push(f[5].to_owned());
    }
    assert_eq!(names, TARBALL_MEMBERS, "the tarball's members, in order");
    assert_eq!(times.len(), 1, "one time for every member: {listing}");

    let all = tempfile::tempdir().unwrap();
    ok(
        Command::new("tar")
            .arg("-C")
            .arg(all.path())
            .arg("-xzf")
            .arg(tarball),
        "extracting the tarball",
    );
    let repo = deploy_dir().parent().unwrap().to_path_buf();
    for (shipped, source) in [
        ("LICENSE", repo.join("LICENSE")),
        ("INSTALL.md", deploy_dir().join("INSTALL.md")),
        (
            "examples/standalone.conflist",
            deploy_dir().join("examples/standalone.conflist"),
        ),
        (
            "examples/chained-bridge.conflist",
            deploy_dir().join("examples/chained-bridge.conflist"),
        ),
    ] {
        assert_eq!(
            std::fs::read(all.path().join(shipped)).unwrap(),
            std::fs::read(&source).unwrap(),
            "{shipped} is not {}",
            source.display()
        );
    }
    let elf = ElfFacts::read(&all.path().join("ebpf-cni")).unwrap();
    assert_eq!(elf.machine, machine);
    assert!(elf.is_static(), "the binary is not static: {elf:?}");
}

#[test]
fn tarball_amd64_holds_the_documented_files() {
    let tarball = artifact(rel::TARBALL_ENV, "the amd64 release tarball");
    check_tarball(&tarball, "amd64", AMD64_MACHINE);
}

#[test]
fn tarball_arm64_holds_the_documented_files() {
    let tarball = artifact(rel::TARBALL_ARM64_ENV, "the arm64 release tarball");
    check_tarball(&tarball, "arm64", ARM64_MACHINE);
}

/// The binary as INSTALL.md installs it, alone in a directory, attaches a pod: its embedded
/// eBPF programs load and attach, CHECK finds them, DEL removes everything.
#[test]
fn tarball_binary_runs_a_pod_lifecycle() {
    require_root();
    let tarball = artifact(rel::TARBALL_ENV, "the amd64 release tarball");
    verify_sha256(&tarball);
    let dir = unpack_binary(&tarball);
    let p = PluginUnderTest::at(dir.path().join("ebpf-cni"));
    assert_answers_version(|| Command::new(&p.bin), "the tarball's binary");

    let node = Node::new().unwrap();
    let pod = node.new_pod().unwrap();
    let mut conf = p.conf("1.0.0", &node, Stack::Dual);
    conf["capabilities"] = json!({ "portMappings": true });
    let list = NetConfList::single(&conf);
    let cid = unique_container_id();
    let att = Attachment::new(&cid, pod.path(), "eth0").with_capability(
        "portMappings",
        json!([{ "hostPort": 8080, "containerPort": 80, "protocol": "tcp" }]),
    );
    let result = p
        .runtime
        .add(&node, &list, &att)
        .unwrap_or_else(|e| panic!("ADD with the tarball's binary: {e}"));
    let r =
        ResultExpectation::standard("1.0.0", "eth0", &pod.path().to_string_lossy(), Stack::Dual)
            .ebpf_cni_host_names()
            .assert_valid(&result);
    assert_attachment(&node, &pod, "eth0", &r, Some(config::MTU));
    p.runtime
        .check(&node, &list, &att, &result)
        .unwrap_or_else(|e| panic!("CHECK with the tarball's binary: {e}"));
    p.runtime
        .del(&node, &list, &att, Some(&result))
        .unwrap_or_else(|e| panic!("DEL with the tarball's binary: {e}"));
    assert_gone(
        &node,
        Some(&pod),
        "eth0",
        &r,
        config::NETWORK,
        &cid,
        "DEL with the tarball's binary",
    );
}

/// `chroot root cmd…` with a runtime-like environment (nothing of the test's).
fn chroot(root: &Path, cmd: &[&str]) -> Command {
    let mut c = Command::new("chroot");
    c.arg(root)
        .args(cmd)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    c
}

/// The tarball's binary starts on Debian 11's userland: glibc 2.31, older than what a
/// build linked against this machine's glibc needs (GLIBC_2.32/2.33 symbols).
#[test]
fn tarball_binary_starts_on_debian_11() {
    require_root();
    let tarball = artifact(rel::TARBALL_ENV, "the amd64 release tarball");
    verify_sha256(&tarball);
    let dir = unpack_binary(&tarball);
    let scratch = ScratchRootfs::new("bullseye").unwrap();
    let root = scratch.path().to_path_buf();
    let glibc = ok(
        &mut chroot(&root, &["ldd", "--version"]),
        "ldd --version in the Debian 11 rootfs",
    );
    assert!(
        glibc.lines().next().is_some_and(|l| l.ends_with(" 2.31")),
        "the Debian 11 rootfs has glibc 2.31: {glibc}"
    );
    std::fs::copy(dir.path().join("ebpf-cni"), root.join("ebpf-cni")).unwrap();
    assert_answers_version(
        || chroot(&root, &["/ebpf-cni"]),
        "the tarball's binary on Debian 11",
    );
}

/// Every path under `root` (as `/…`), directories included, except dpkg's own records of
/// what it did, which any dpkg run changes.
fn file_list(root: &Path) -> BTreeSet<String> {
    const DPKG_RECORDS: [&str; 3] = [
        "/var/log/dpkg.log",
        "/var/lib/dpkg/status-old",
        "/var/lib/dpkg/lock",
    ];
    let mut found = BTreeSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let path = e.path();
            let rel = format!("/{}", path.strip_prefix(root).unwrap().display());
            if DPKG_RECORDS.contains(&rel.as_str()) {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                stack.push(path);
            }
            found.insert(rel);
        }
    }
    found
}

/// The .deb installs into a clean Debian 12 system, runs from /usr/lib/cni and
/// /opt/cni/bin, owns exactly the expected files and adds nothing else, and purging it
/// leaves the system's file list as it was.
#[test]
fn deb_installs_and_purges_on_debian_12() {
    require_root();
    let deb = artifact(rel::DEB_ENV, "the amd64 Debian package");
    assert_eq!(
        deb.file_name().unwrap().to_string_lossy(),
        format!("ebpf-cni_{VERSION}_amd64.deb")
    );
    let scratch = ScratchRootfs::new("bookworm").unwrap();
    let root = scratch.path().to_path_buf();
    let before = file_list(&root);

    // dpkg counts every directory in a package as the package's unless another package
    // ships it. Debian makes /opt in base-files' postinst, so no package owns it and the
    // purge removes it when it is empty (as in this rootfs): the one change allowed, and only
    // for an /opt that no package owned before.
    let opt_unowned = !chroot(&root, &["dpkg", "-S", "/opt"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success();
    let inside = "/tmp/ebpf-cni.deb";
    std::fs::copy(&deb, root.join(inside.trim_start_matches('/'))).unwrap();
    ok(&mut chroot(&root, &["dpkg", "-i", inside]), "dpkg -i");
    std::fs::remove_file(root.join(inside.trim_start_matches('/'))).unwrap();
    let status = ok(
        &mut chroot(
            &root,
            &["dpkg-query", "-W", "-f=${Status} ${Version}", "ebpf-cni"],
        ),
        "dpkg-query",
    );
    assert_eq!(status, format!("install ok installed {VERSION}"));

    for bin in ["/usr/lib/cni/ebpf-cni", "/opt/cni/bin/ebpf-cni"] {
        assert_answers_version(|| chroot(&root, &[bin]), bin);
    }
    assert_eq!(
        std::fs::read_link(root.join("opt/cni/bin/ebpf-cni")).unwrap(),
        Path::new("/usr/lib/cni/ebpf-cni")
    );
    let listed: BTreeSet<String> = ok(&mut chroot(&root, &["dpkg", "-L", "ebpf-cni"]), "dpkg -L")
        .lines()
        .map(str::to_owned)
        .collect();
    let expected: BTreeSet<String> = DEB_FILES.iter().map(|s| s.to_string()).collect();
    assert_eq!(listed, expected, "dpkg -L ebpf-cni");
    // Installed as shipped (dpkg's md5sums).
    assert_eq!(
        ok(
            &mut chroot(&root, &["dpkg", "--verify", "ebpf-cni"]),
            "dpkg --verify"
        ),
        ""
    );

    // Nothing besides the package's own files and dpkg's records of it: no conflist, no
    // maintainer script.
    let installed = file_list(&root);
    let added: BTreeSet<&String> = installed.difference(&before).collect();
    let records: BTreeSet<String> = ["list", "md5sums"]
        .iter()
        .map(|x| format!("/var/lib/dpkg/info/ebpf-cni.{x}"))
        .collect();
    let unexpected: Vec<&&String> = added
        .iter()
        .filter(|p| !expected.contains(**p) && !records.contains(**p))
        .collect();
    assert!(unexpected.is_empty(), "dpkg -i also wrote {unexpected:?}");
    assert!(
        installed.difference(&before).count() > 0 && before.difference(&installed).count() == 0,
        "installing removed files"
    );

    ok(
        &mut chroot(&root, &["dpkg", "--purge", "ebpf-cni"]),
        "dpkg --purge",
    );
    let after = file_list(&root);
    let left: Vec<&String> = after.difference(&before).collect();
    let gone: Vec<&String> = before
        .difference(&after)
        .filter(|p| !(opt_unowned && p.as_str() == "/opt"))
        .collect();
    assert!(
        left.is_empty() && gone.is_empty(),
        "after purging, left behind: {left:?}; removed: {gone:?}"
    );
}

/// The arm64 artifacts: the tarball's binary and the .deb's answer under qemu-aarch64, and
/// the .deb holds the same files as amd64's, for arm64.
#[test]
fn arm64_artifacts_run_under_emulation() {
    let tarball = artifact(rel::TARBALL_ARM64_ENV, "the arm64 release tarball");
    let deb = artifact(rel::DEB_ARM64_ENV, "the arm64 Debian package");
    let deb_amd64 = artifact(rel::DEB_ENV, "the amd64 Debian package");
    verify_sha256(&tarball);
    let dir = unpack_binary(&tarball);
    let bin = dir.path().join("ebpf-cni");
    assert_answers_version(
        || plugin_command(Some("qemu-aarch64"), &bin),
        "the arm64 tarball's binary",
    );

    let field = |deb: &Path, f: &str| {
        ok(
            Command::new("dpkg-deb").arg("--field").arg(deb).arg(f),
            "dpkg-deb --field",
        )
        .trim()
        .to_owned()
    };
    assert_eq!(field(&deb, "Architecture"), "arm64");
    assert_eq!(field(&deb, "Version"), VERSION);
    let contents = |deb: &Path| -> Vec<String> {
        ok(
            Command::new("dpkg-deb").arg("--contents").arg(deb),
            "dpkg-deb --contents",
        )
        .lines()
        // `drwxr-xr-x root/root 0 2026-11-24 15:46 ./usr/` (symlinks add `-> target`)
        .map(|l| l.split_whitespace().skip(5).collect::<Vec<_>>().join(" "))
        .collect()
    };
    assert_eq!(contents(&deb), contents(&deb_amd64));
    let unpacked = tempfile::tempdir().unwrap();
    ok(
        Command::new("dpkg-deb")
            .arg("--extract")
            .arg(&deb)
            .arg(unpacked.path()),
        "dpkg-deb --extract",
    );
    let deb_bin = unpacked.path().join("usr/lib/cni/ebpf-cni");
    let elf = ElfFacts::read(&deb_bin).unwrap();
    assert_eq!(elf.machine, ARM64_MACHINE);
    assert!(elf.is_static(), "{elf:?}");
    assert_answers_version(
        || plugin_command(Some("qemu-aarch64"), &deb_bin),
        "the arm64 .deb's binary",
    );
}
