//! The release artifacts (`cargo xtask dist`), installed as an operator installs them:
//! `cargo xtask test` builds them and names them in `EBPF_CNI_DIST_*` (see
//! `ebpf_cni_tests::release`); a test whose artifact is not named fails, it never skips.
//!
//! - The tarballs: the `.sha256` checks with `sha256sum -c`; the members are exactly the
//!   documented ones, owned by root, with one time; LICENSE, INSTALL.md and the examples
//!   are the repository's; the binary is static, not position-independent, and of the
//!   right machine.
//! - The amd64 tarball's binary, extracted alone into an empty directory as INSTALL.md
//!   says, runs a pod's ADD, CHECK and DEL on a test node (its eBPF programs load and
//!   attach), and starts in a Debian 11 system (glibc 2.31, older than this machine's: a
//!   glibc-linked build fails there) for `version` and CNI `VERSION`.
//! - The amd64 .deb installs with `dpkg -i` into a clean Debian 12 system, runs from both
//!   its paths, lists exactly the expected files, writes nothing else (no conflist, no
//!   maintainer script) and `dpkg --purge` leaves the system's file list as it was (but
//!   for an empty /opt that no package owned: see the test).
//! - The amd64 tarball's binary reuses the memory it frees: a pod's ADD on a node whose
//!   programs are loaded makes at most 30 `mmap`/`munmap` calls (`strace`; 72 with musl's
//!   allocator).
//! - The arm64 tarball and .deb hold an aarch64 static binary that answers `version` and
//!   CNI `VERSION` under qemu-aarch64, and the .deb the same files as amd64's.
//! - The image, loaded into a podman of the test's own, runs `install` with temporary
//!   directories mounted as the host's CNI directories (see the image test).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use ebpf_cni_tests::config::{self, Stack};
use ebpf_cni_tests::release::{self as rel, artifact, deploy_dir, ElfFacts, ScratchRootfs};
use ebpf_cni_tests::state::{assert_attachment, assert_gone};
use ebpf_cni_tests::strace::Traced;
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
    assert!(
        !elf.is_position_independent(),
        "the binary is position-independent (it relocates itself at every start): {elf:?}"
    );
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

/// The tarball's binary keeps the memory it frees for its next allocation: an ADD on a node
/// whose programs are loaded maps and unmaps memory a few times only. The static binary is
/// linked with musl, whose allocator unmapped what was freed at once: this ADD made 72
/// `mmap` and `munmap` calls (its 64 KiB netlink receive buffers among them); with the
/// binary's own allocator (dlmalloc, plugin/src/main.rs) 9. Counted with `strace` on the
/// second pod's ADD; the first loads the node's programs.
#[test]
fn tarball_binary_reuses_the_memory_it_frees() {
    require_root();
    let tarball = artifact(rel::TARBALL_ENV, "the amd64 release tarball");
    let dir = unpack_binary(&tarball);
    let bin = dir.path().join("ebpf-cni");
    let traced = Traced::new(&bin, "mmap,munmap").unwrap();

    let node = Node::new().unwrap();
    let mut added = Vec::new();
    for p in [
        PluginUnderTest::at(bin.clone()),
        PluginUnderTest::at(traced.wrapper.clone()),
    ] {
        let pod = node.new_pod().unwrap();
        let mut conf = p.conf("1.0.0", &node, Stack::Dual);
        conf["capabilities"] = json!({ "portMappings": true });
        let list = NetConfList::single(&conf);
        let att = Attachment::new(&unique_container_id(), pod.path(), "eth0").with_capability(
            "portMappings",
            json!([{ "hostPort": 8080 + added.len(), "containerPort": 80, "protocol": "tcp" }]),
        );
        let result = p
            .runtime
            .add(&node, &list, &att)
            .unwrap_or_else(|e| panic!("ADD with {}: {e}", p.bin.display()));
        added.push((list, att, result, pod));
    }
    let trace = traced.log().unwrap();
    let calls = trace
        .lines()
        .filter(|l| !l.contains("resumed>") && (l.contains(" mmap(") || l.contains(" munmap(")))
        .count();
    eprintln!("the second ADD made {calls} mmap/munmap calls");
    let plain = PluginUnderTest::at(bin);
    for (list, att, result, _pod) in &added {
        plain
            .runtime
            .del(&node, list, att, Some(result))
            .unwrap_or_else(|e| panic!("DEL with the tarball's binary: {e}"));
    }
    assert!(
        calls <= 30,
        "one ADD of the tarball's binary made {calls} mmap/munmap calls (at most 30 expected: \
         the allocator gives freed memory back to the kernel):\n{trace}"
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
    assert!(!elf.is_position_independent(), "{elf:?}");
    assert_answers_version(
        || plugin_command(Some("qemu-aarch64"), &deb_bin),
        "the arm64 .deb's binary",
    );
}

/// One file of a directory, as [`dir_state`] reads it.
#[derive(Clone, PartialEq, Eq)]
struct FileState {
    content: Vec<u8>,
    mode: u32,
    /// Inode and mtime (ns), when asked for: a file rewritten with the same bytes differs.
    identity: Option<(u64, i64)>,
}

impl std::fmt::Debug for FileState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes, mode {:o}, {:?}",
            self.content.len(),
            self.mode,
            self.identity
        )
    }
}

type DirState = BTreeMap<String, FileState>;

/// Each file of `dir` (not recursive), with its inode and mtime when `identity`.
fn dir_state(dir: &Path, identity: bool) -> DirState {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            let content = if meta.is_file() {
                std::fs::read(e.path()).unwrap()
            } else {
                Vec::new()
            };
            let identity =
                identity.then(|| (meta.ino(), meta.mtime() * 1_000_000_000 + meta.mtime_nsec()));
            let state = FileState {
                content,
                mode: meta.mode(),
                identity,
            };
            (e.file_name().to_string_lossy().into_owned(), state)
        })
        .collect()
}

/// The image as a DaemonSet runs it: loaded from the oci-archive into a podman of the
/// test's own, then `install` and `uninstall` (the interface of `ebpf-cni install`:
/// `--bin-dir`, `--conf-dir`, `--pod-subnet`) with two temporary directories mounted as
/// the host's /opt/cni/bin and /etc/cni/net.d, which already hold another plugin's binary
/// and conflist. Install puts the binary and a conflist for the subnet in place; a second
/// run changes nothing (not even an inode or mtime); a run while a process executes the
/// binary it replaces succeeds, and that process finishes its call; the other plugin's
/// files are never touched; uninstall returns both directories to their first state.
#[test]
fn image_installs_and_uninstalls_the_plugin() {
    require_root();
    let archive = artifact(rel::IMAGE_ENV, "the amd64 OCI image archive");
    assert_eq!(
        archive.file_name().unwrap().to_string_lossy(),
        format!("ebpf-cni-{VERSION}-linux-amd64.oci.tar")
    );
    let tmp = tempfile::Builder::new()
        .prefix("ecni-image-")
        .tempdir()
        .unwrap();
    let podman = rel::PrivatePodman::new(&tmp.path().join("podman")).unwrap();
    let loaded = podman
        .run(&["load", "--input", &archive.to_string_lossy()])
        .unwrap();
    let image = format!("localhost/ebpf-cni:{VERSION}");
    assert!(loaded.contains(&image), "podman load: {loaded}");

    let inspect: Value = serde_json::from_str(
        &podman
            .run(&["image", "inspect", "--format", "json", &image])
            .unwrap(),
    )
    .unwrap();
    let img = &inspect[0];
    assert_eq!(img["Architecture"], "amd64", "{img}");
    assert_eq!(img["Os"], "linux");
    assert_eq!(img["Config"]["Entrypoint"], json!(["/ebpf-cni"]));
    assert_eq!(
        img["RootFS"]["Layers"].as_array().map(Vec::len),
        Some(1),
        "FROM scratch and one COPY: {img}"
    );
    let labels = &img["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], VERSION);
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    assert!(
        labels["org.opencontainers.image.revision"]
            .as_str()
            .is_some_and(|r| r.len() == 40),
        "{labels}"
    );

    // The host's directories, with another plugin's files in them.
    let (bin_dir, conf_dir) = (tmp.path().join("opt-cni-bin"), tmp.path().join("net.d"));
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::fs::create_dir_all(&conf_dir).unwrap();
    std::fs::write(bin_dir.join("loopback"), b"another plugin's binary").unwrap();
    std::fs::set_permissions(
        bin_dir.join("loopback"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let other = r#"{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge"}]}"#;
    std::fs::write(conf_dir.join("99-other.conflist"), other).unwrap();
    let first = (dir_state(&bin_dir, true), dir_state(&conf_dir, true));

    let mounts = [
        format!("{}:/host/opt/cni/bin", bin_dir.display()),
        format!("{}:/host/etc/cni/net.d", conf_dir.display()),
    ];
    let run = |args: &[&str]| {
        let mut all = vec!["run", "--rm", "--pull=never", "--network=none"];
        for m in &mounts {
            all.extend(["--volume", m.as_str()]);
        }
        all.push(&image);
        all.extend(args);
        podman.run(&all)
    };
    let version = run(&["version"]).unwrap();
    assert!(
        version.starts_with(&format!("ebpf-cni {VERSION}\n")),
        "{version}"
    );

    let install_args = [
        "install",
        "--bin-dir",
        "/host/opt/cni/bin",
        "--conf-dir",
        "/host/etc/cni/net.d",
        "--pod-subnet",
        "10.244.1.0/24",
    ];
    run(&install_args).unwrap_or_else(|e| panic!("the image's install: {e:#}"));
    let installed = bin_dir.join("ebpf-cni");
    assert_answers_version(|| Command::new(&installed), "the installed binary");
    let conflists: Vec<String> = dir_state(&conf_dir, false)
        .into_keys()
        .filter(|n| n != "99-other.conflist")
        .collect();
    assert_eq!(conflists.len(), 1, "one conflist written: {conflists:?}");
    let conflist: Value =
        serde_json::from_slice(&std::fs::read(conf_dir.join(&conflists[0])).unwrap()).unwrap();
    assert_eq!(conflist["plugins"][0]["type"], "ebpf-cni", "{conflist}");
    assert!(
        conflist.to_string().contains("10.244.1.0/24"),
        "the conflist has the pod subnet: {conflist}"
    );
    let other_files = |(bin, conf): &(DirState, DirState)| {
        (
            bin.get("loopback").cloned(),
            conf.get("99-other.conflist").cloned(),
        )
    };
    let after_install = (dir_state(&bin_dir, true), dir_state(&conf_dir, true));
    assert_eq!(other_files(&after_install), other_files(&first));

    // Twice: nothing changes, not even an inode or a time.
    run(&install_args).unwrap_or_else(|e| panic!("the second install: {e:#}"));
    assert_eq!(
        (dir_state(&bin_dir, true), dir_state(&conf_dir, true)),
        after_install,
        "a second install changed the directories"
    );

    // An older binary in place and running (a pod's ADD reading its config): writing into
    // it would fail with ETXTBSY; install must replace it and leave the call to finish.
    let new_bytes = std::fs::read(&installed).unwrap();
    let mut old_bytes = new_bytes.clone();
    old_bytes.extend_from_slice(b"an older build");
    let staged = bin_dir.join(".old-ebpf-cni");
    std::fs::write(&staged, &old_bytes).unwrap();
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&staged, &installed).unwrap();
    let mut running = Command::new(&installed)
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Until stdin closes it waits for its config, executing the old file.
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        running.try_wait().unwrap().is_none(),
        "the old binary exited early"
    );
    let busy = run(&install_args);
    running
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"cniVersion":"1.0.0"}"#)
        .unwrap();
    let out = running.wait_with_output().unwrap();
    busy.unwrap_or_else(|e| panic!("install while the old binary runs: {e:#}"));
    assert!(
        out.status.success(),
        "the old binary's call: {}",
        describe(&out)
    );
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        new_bytes,
        "install replaced the running old binary"
    );

    run(&[
        "uninstall",
        "--bin-dir",
        "/host/opt/cni/bin",
        "--conf-dir",
        "/host/etc/cni/net.d",
    ])
    .unwrap_or_else(|e| panic!("the image's uninstall: {e:#}"));
    assert_eq!(
        (dir_state(&bin_dir, true), dir_state(&conf_dir, true)),
        first,
        "uninstall left the directories other than they were"
    );
}
