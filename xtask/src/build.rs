//! `cargo xtask build`: the eBPF object (nightly, bpf-linker), then the plugin embedding it.
//!
//! The two builds share the workspace's target directory but never their flags: the eBPF
//! build's RUSTFLAGS are set on its command only, so the host build keeps its fingerprints
//! and does not rebuild everything.

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{bail, Context as _, Result};

use crate::cmd;

/// The kernel-side crate and its binary (the object file).
const EBPF_PACKAGE: &str = "ebpf-cni-ebpf";
const EBPF_BIN: &str = "ebpf-cni-programs";
const BPF_TARGET: &str = "bpfel-unknown-none";
/// BTF lets the kernel and bpftool show the programs' types and source lines.
/// `--disable-expand-memcpy-in-order`: without it bpf-linker passes LLVM
/// `--bpf-expand-memcpy-in-order`, which keeps only `memcpy` inline and turns every `memset`
/// and `memmove` into a call to a byte loop (75 calls, on every packet's path; the program
/// test `no_program_calls_a_memory_builtin` holds the object to none).
const BPF_RUSTFLAGS: &str =
    "-C debuginfo=2 -C link-arg=--btf -C link-arg=--disable-expand-memcpy-in-order";
/// The eBPF functions the linker keeps global (it makes every other one static): the
/// verifier checks a global function once, not at each call (see ebpf/src/masquerade.rs).
const BPF_GLOBAL_FUNCTIONS: &[&str] = &[
    "ecni_masq_frag_find",
    "ecni_masq_frag_record",
    "ecni_masq_out_frag6",
    "ecni_masq_reply_frag6",
    "ecni_masq_snat",
    "ecni_masq_take",
    "ecni_masq_wanted_frag6",
    "ecni_nat_forward",
    "ecni_nat_frag_in",
    "ecni_nat_frag_out",
    "ecni_nat_icmp_in",
    "ecni_nat_icmp_out",
    "ecni_nat_reverse",
    "ecni_source_check",
    "ecni_svc_from_dev",
    "ecni_svc_from_pod",
    "ecni_svc_to_pod",
    "ecni_tun_from_dev",
];

const PLUGIN_PACKAGE: &str = "ebpf-cni";
const PLUGIN_BIN: &str = "ebpf-cni";
/// The benchmark's object, staged beside the plugin.
const PROTOTYPES_BIN: &str = "ebpf-cni-prototypes";
/// Read by plugin/build.rs.
const OBJ_ENV: &str = "EBPF_CNI_BPF_OBJ";

#[derive(Clone, Copy, Debug, Default)]
pub struct BuildOptions {
    /// Build the plugin with the dev profile instead of release (the eBPF object is always
    /// built in release: debug BPF code does not pass the verifier).
    pub debug_plugin: bool,
    /// Build the plugin with its test hooks (`--features test-hooks`, see
    /// plugin/src/test_hooks.rs): the build the integration suites run. Release artefacts
    /// never have them.
    pub test_hooks: bool,
    /// Link a release build with the release profile's own settings (thin local LTO,
    /// parallel codegen) instead of the artefacts' fat LTO and one codegen unit
    /// ([`RELEASE_LINK`]): a faster build of the same code, for a build only tests run in a
    /// target directory of its own (the previous release's). In the workspace's, the
    /// suites' build keeps the artefacts' link: it compiles the build scripts and proc
    /// macros `dist` then reuses (with another link, `dist` took 86 s more).
    pub test_link: bool,
}

/// The build the integration suites, the demo and the kernel matrix run: release, with the
/// test hooks.
pub const UNDER_TEST: BuildOptions = BuildOptions {
    debug_plugin: false,
    test_hooks: true,
    test_link: false,
};

/// The workspace root (where the root Cargo.toml is).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// The workspace's target directory as cargo resolves it (honouring `CARGO_TARGET_DIR` and
/// config), never a guessed `target/`.
pub fn target_dir() -> Result<PathBuf> {
    let json = cmd::output(cmd::cargo().current_dir(workspace_root()).args([
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
    ]))?;
    let meta: serde_json::Value =
        serde_json::from_str(&json).context("cannot parse `cargo metadata` output")?;
    match meta.get("target_directory").and_then(|v| v.as_str()) {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => bail!("`cargo metadata` output has no target_directory"),
    }
}

/// The eBPF build's RUSTFLAGS: `base`, keeping `globals` global.
fn bpf_rustflags(base: &str, globals: &[impl AsRef<str>]) -> String {
    if globals.is_empty() {
        return base.to_string();
    }
    let names: Vec<&str> = globals.iter().map(AsRef::as_ref).collect();
    format!("{base} -C link-arg=--export={}", names.join(","))
}

/// The eBPF build's base RUSTFLAGS that the xtask of the workspace at `root` names (its
/// `BPF_RUSTFLAGS`): another revision's object is built as that revision built it. The
/// flags change what the object is, not only how fast it is built: the previous release's
/// `ecni_from_dev`, linked with the current `--disable-expand-memcpy-in-order`, needs 544
/// bytes of stack, which every verifier refuses.
pub fn bpf_rustflags_of(root: &Path) -> Result<String> {
    let path = root.join("xtask").join("src").join("build.rs");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let Some((_, rest)) = text.split_once("const BPF_RUSTFLAGS: &str =") else {
        bail!("{}: no `const BPF_RUSTFLAGS: &str =`", path.display());
    };
    match rest.split('"').nth(1) {
        Some(flags) if rest.trim_start().starts_with('"') => Ok(flags.to_string()),
        _ => bail!(
            "{}: `BPF_RUSTFLAGS` is not a string literal",
            path.display()
        ),
    }
}

/// The `#[no_mangle]` functions of the eBPF crate whose sources are in `src` (its
/// `ebpf/src`): the ones its build must keep global.
pub fn no_mangle_functions(src: &Path) -> Result<Vec<String>> {
    let mut found = Vec::new();
    let entries = std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))?;
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line.trim() != "#[no_mangle]" {
                continue;
            }
            let Some(decl) = lines.by_ref().find(|l| l.contains("fn ")) else {
                bail!("{}: #[no_mangle] before no function", path.display());
            };
            let name = decl
                .split("fn ")
                .nth(1)
                .and_then(|rest| rest.split('(').next())
                .unwrap_or_default();
            found.push(name.to_string());
        }
    }
    found.sort();
    Ok(found)
}

/// Which workspace a build reads and where it writes: this one ([`Tree::current`]), or the
/// sources of another revision with a target directory of their own (`previous`).
#[derive(Clone, Debug)]
pub struct Tree {
    /// The workspace root (its root Cargo.toml).
    pub root: PathBuf,
    /// The cargo target directory the build writes to.
    pub target_dir: PathBuf,
    /// The eBPF functions the linker must keep global.
    pub bpf_globals: Vec<String>,
    /// The eBPF build's base RUSTFLAGS (see [`bpf_rustflags_of`]).
    pub bpf_flags: String,
}

impl Tree {
    /// This workspace, its target directory as cargo resolves it.
    pub fn current() -> Result<Self> {
        Ok(Self {
            root: workspace_root(),
            target_dir: target_dir()?,
            bpf_globals: BPF_GLOBAL_FUNCTIONS.iter().map(|s| s.to_string()).collect(),
            bpf_flags: BPF_RUSTFLAGS.to_string(),
        })
    }
}

/// Nightly cargo's `subcommand` (`build`, `clippy`) on the eBPF crate of `tree`, for the
/// BPF target with the eBPF build's flags.
fn ebpf_cargo(tree: &Tree, subcommand: &str) -> std::process::Command {
    let mut c = cmd::nightly("cargo");
    c.current_dir(&tree.root)
        .args([subcommand, "--package", EBPF_PACKAGE, "--release"])
        .args(["--target", BPF_TARGET, "-Z", "build-std=core"])
        .env("CARGO_TARGET_DIR", &tree.target_dir)
        .env(
            "RUSTFLAGS",
            bpf_rustflags(&tree.bpf_flags, &tree.bpf_globals),
        )
        // Either of these would override or add to RUSTFLAGS above.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove(OBJ_ENV);
    c
}

/// The eBPF crate's feature that adds the benchmark's prototypes (see
/// `ebpf_cni_maps::PROTOTYPE_PROGRAMS`).
const PROTOTYPES_FEATURE: &str = "prototypes";

/// [`ebpf_cargo`] for the benchmark's object: with the prototypes, in a target directory of
/// its own so the plugin's object and it are both kept.
fn ebpf_cargo_prototypes(tree: &Tree, subcommand: &str) -> std::process::Command {
    let mut c = ebpf_cargo(tree, subcommand);
    c.args(["--features", PROTOTYPES_FEATURE])
        .env("CARGO_TARGET_DIR", tree.target_dir.join(PROTOTYPES_FEATURE));
    c
}

/// clippy on the eBPF crate as it is built (nightly, the BPF target, the build's flags),
/// with the workspace's lints and `-D warnings`, without and with the prototypes. The host
/// clippy never sees that crate: it is no default member and builds for no host target.
pub fn clippy_ebpf() -> Result<()> {
    let tree = Tree::current()?;
    for mut clippy in [
        ebpf_cargo(&tree, "clippy"),
        ebpf_cargo_prototypes(&tree, "clippy"),
    ] {
        clippy.args(["--", "-D", "warnings"]);
        cmd::run(&mut clippy)?;
    }
    Ok(())
}

/// Builds the eBPF object the plugin embeds and returns its absolute path.
pub fn build_ebpf(tree: &Tree) -> Result<PathBuf> {
    build_object(ebpf_cargo(tree, "build"), &tree.target_dir)
}

/// Builds the benchmark's eBPF object: the plugin's programs and the prototypes the
/// benchmark and the program tests load (never shipped). Returns its absolute path.
pub fn build_prototypes(tree: &Tree) -> Result<PathBuf> {
    build_object(
        ebpf_cargo_prototypes(tree, "build"),
        &tree.target_dir.join(PROTOTYPES_FEATURE),
    )
}

/// Runs the eBPF `build` into `target_dir`; returns the object's path.
fn build_object(mut build: std::process::Command, target_dir: &Path) -> Result<PathBuf> {
    let started = Instant::now();
    cmd::run(&mut build).context(
        "building the eBPF programs failed; `cargo xtask setup` installs what this build needs",
    )?;
    let obj = target_dir.join(BPF_TARGET).join("release").join(EBPF_BIN);
    let len = std::fs::metadata(&obj)
        .with_context(|| format!("the eBPF build left no object at {}", obj.display()))?
        .len();
    if len == 0 {
        bail!("the eBPF object {} is empty", obj.display());
    }
    eprintln!(
        "eBPF object: {} ({len} bytes, {:.1}s)",
        obj.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(obj)
}

/// Builds the release plugin and copies it to `<target>/<dir>/ebpf-cni`, with the eBPF
/// object it embeds beside it (see [`staged_object`]); returns the plugin's path.
///
/// The binary is copied out of `target/release`: any later plain `cargo build` of the
/// plugin (without the eBPF object) would overwrite it there with a stub build. Each user
/// (tests, benchmark) stages to a directory of its own, so a concurrent run of another
/// never swaps its binary.
///
/// This is the build under test ([`UNDER_TEST`]: with the test hooks).
pub fn stage(dir: &str) -> Result<PathBuf> {
    stage_with(dir, None, &UNDER_TEST)
}

/// [`stage`] of the release plugin (no test hooks) built for `target` (`None`: the host's
/// default target), e.g. the static binary the release ships (see `dist`).
pub fn stage_for(dir: &str, target: Option<CrossTarget>) -> Result<PathBuf> {
    stage_with(dir, target, &BuildOptions::default())
}

fn stage_with(dir: &str, target: Option<CrossTarget>, opts: &BuildOptions) -> Result<PathBuf> {
    let tree = Tree::current()?;
    let obj = build_ebpf(&tree)?;
    let built = build_plugin(&tree, &obj, opts, target)?;
    stage_built(dir, &built)
}

/// Copies `built`, a plugin binary of this tree, to `<target>/<dir>/ebpf-cni`, with the eBPF
/// object it embeds and the benchmark's object beside it (built unless they are); returns
/// the staged plugin's path. `dist`'s static binary staged this way is the benchmark's,
/// without a second build of it.
pub fn stage_built(dir: &str, built: &Path) -> Result<PathBuf> {
    let tree = Tree::current()?;
    let obj = build_ebpf(&tree)?;
    let prototypes = build_prototypes(&tree)?;
    let dir = target_dir()?.join(dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let staged = dir.join(PLUGIN_BIN);
    for (from, to) in [
        (obj.as_path(), staged_object(&staged)),
        (prototypes.as_path(), staged_prototypes(&staged)),
        (built, staged.clone()),
    ] {
        let name = to.file_name().unwrap_or_default().to_string_lossy();
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::copy(from, &tmp)
            .with_context(|| format!("copying {} to {}", from.display(), tmp.display()))?;
        std::fs::rename(&tmp, &to)?;
    }
    Ok(staged)
}

/// The eBPF object [`stage`] put beside the staged plugin `plugin`: what the program tests
/// load (`EBPF_CNI_PROGRAMS_OBJ`).
pub fn staged_object(plugin: &Path) -> PathBuf {
    plugin.with_file_name(EBPF_BIN)
}

/// The benchmark's object (see [`build_prototypes`]) that [`stage`] put beside `plugin`:
/// what the benchmark and the prototypes' program tests load (`EBPF_CNI_PROTOTYPES_OBJ`).
pub fn staged_prototypes(plugin: &Path) -> PathBuf {
    plugin.with_file_name(PROTOTYPES_BIN)
}

/// Builds the eBPF object, then the plugin with the object embedded; returns the plugin
/// binary's path.
pub fn build(opts: &BuildOptions) -> Result<PathBuf> {
    build_tree(&Tree::current()?, opts)
}

/// [`build`] of `tree`.
pub fn build_tree(tree: &Tree, opts: &BuildOptions) -> Result<PathBuf> {
    let obj = build_ebpf(tree)?;
    build_plugin(tree, &obj, opts, None)
}

/// A Rust target the plugin is built for other than the host's, and the C cross compiler
/// it needs when the host's `cc` cannot build for it.
#[derive(Clone, Copy, Debug)]
pub struct CrossTarget {
    pub triple: &'static str,
    /// Links the binary and compiles the C parts of dependencies (cc-rs, e.g. ring's).
    pub cross_cc: Option<&'static str>,
}

impl CrossTarget {
    /// The variables that make `cc` the target's linker (cargo's
    /// `CARGO_TARGET_<TRIPLE>_LINKER`) and C compiler (cc-rs's `CC_<triple>`): set on the
    /// build's command only, so no global configuration is needed.
    pub fn cc_env(&self, cc: &'static str) -> [(String, &'static str); 2] {
        let triple = self.triple.replace(['-', '.'], "_");
        [
            (format!("CARGO_TARGET_{}_LINKER", triple.to_uppercase()), cc),
            (format!("CC_{triple}"), cc),
        ]
    }
}

/// The plugin's release build is optimized as one unit: fat LTO, one codegen unit. A CNI
/// plugin is a process per ADD, so what its start touches counts; on a test node of 60 pods
/// ADD took 1.84 → 1.60 ms (8 alternating rounds, every round lower), peak RSS 3.8 → 3.4 MiB
/// and the first ADD 119–132 → 113–117 ms (docs/design-decisions.md, "One unit"). Set for
/// this build only, not in the workspace's release profile, which the eBPF object's build
/// shares.
const RELEASE_LINK: [(&str, &str); 2] = [
    ("CARGO_PROFILE_RELEASE_LTO", "fat"),
    ("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1"),
];

/// The target whose release build is optimized with a profile of its runs (see
/// [`profile_of`]): the static x86_64 binary, the one the benchmark measures and the
/// training can run here.
pub const PROFILED_TARGET: &str = "x86_64-unknown-linux-musl";

/// Where the profile of the plugin's runs built for `triple` is kept in the sources of the
/// workspace at `root` (`cargo xtask pgo` writes it).
pub fn profile_of(root: &Path, triple: &str) -> PathBuf {
    root.join("plugin")
        .join("pgo")
        .join(format!("{triple}.profdata"))
}

/// What a plugin build does with LLVM's profile-guided optimization.
#[derive(Clone, Debug)]
pub enum Pgo {
    /// A release build for [`PROFILED_TARGET`] is optimized with the profile the tree keeps
    /// ([`profile_of`]), if it keeps one (an older revision's tree has none); any other
    /// build is built as without.
    Use,
    /// Instrumented: each run of the binary adds its counts to a `.profraw` file in this
    /// directory (`cargo xtask pgo`).
    Generate(PathBuf),
}

/// The variable and value that give the plugin's build for `target` its profile flag
/// (cargo's `CARGO_TARGET_<TRIPLE>_RUSTFLAGS`, which cargo adds to the target's
/// `rustflags` of `.cargo/config.toml`: the static relocation model stays), or `None`.
/// The flag goes to every crate of the plugin's build (all of them are one unit after LTO)
/// and to no build script; the eBPF build sets its own RUSTFLAGS.
pub fn profile_env(
    root: &Path,
    opts: &BuildOptions,
    target: Option<CrossTarget>,
    pgo: &Pgo,
) -> Option<(String, String)> {
    let triple = target?.triple;
    let flag = match pgo {
        Pgo::Generate(dir) => format!("-Cprofile-generate={}", dir.display()),
        Pgo::Use if opts.debug_plugin || triple != PROFILED_TARGET => return None,
        Pgo::Use => {
            let profile = profile_of(root, triple);
            if !profile.is_file() {
                return None;
            }
            format!("-Cprofile-use={}", profile.display())
        }
    };
    let var = format!(
        "CARGO_TARGET_{}_RUSTFLAGS",
        triple.replace(['-', '.'], "_").to_uppercase()
    );
    Some((var, flag))
}

/// Builds the plugin embedding the eBPF object `obj` (from [`build_ebpf`]), for the host or
/// for `target`; returns the binary's path. A release build for [`PROFILED_TARGET`] is
/// optimized with the tree's profile ([`Pgo::Use`]).
pub fn build_plugin(
    tree: &Tree,
    obj: &Path,
    opts: &BuildOptions,
    target: Option<CrossTarget>,
) -> Result<PathBuf> {
    build_plugin_with(tree, obj, opts, target, &Pgo::Use)
}

/// [`build_plugin`], with what the build does with profiles.
pub fn build_plugin_with(
    tree: &Tree,
    obj: &Path,
    opts: &BuildOptions,
    target: Option<CrossTarget>,
    pgo: &Pgo,
) -> Result<PathBuf> {
    let obj = obj
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", obj.display()))?;
    let started = Instant::now();
    let mut build = cmd::cargo();
    build
        .current_dir(&tree.root)
        .args(["build", "--package", PLUGIN_PACKAGE, "--bin", PLUGIN_BIN])
        .env("CARGO_TARGET_DIR", &tree.target_dir)
        .env(OBJ_ENV, &obj);
    if !opts.debug_plugin {
        build.arg("--release");
        if !opts.test_link {
            build.envs(RELEASE_LINK);
        }
    }
    if opts.test_hooks {
        build.args(["--features", "test-hooks"]);
    }
    let profiled = profile_env(&tree.root, opts, target, pgo);
    if let Some((var, flag)) = &profiled {
        build.env(var, flag);
    }
    let mut out_dir = tree.target_dir.clone();
    if let Some(t) = target {
        build.args(["--target", t.triple]);
        if let Some(cc) = t.cross_cc {
            build.envs(t.cc_env(cc));
        }
        out_dir.push(t.triple);
    }
    cmd::run(&mut build)?;
    let profile_dir = if opts.debug_plugin {
        "debug"
    } else {
        "release"
    };
    let plugin = out_dir.join(profile_dir).join(PLUGIN_BIN);
    if !plugin.is_file() {
        bail!("the plugin build left no binary at {}", plugin.display());
    }
    eprintln!(
        "plugin built{}{} in {:.1}s",
        target
            .map(|t| format!(" for {}", t.triple))
            .unwrap_or_default(),
        profiled
            .map(|(_, flag)| format!(" ({flag})"))
            .unwrap_or_default(),
        started.elapsed().as_secs_f64()
    );
    Ok(plugin)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `#[no_mangle]` function of the eBPF crate is exported, and only those: one the
    /// list missed would silently turn static (and cost the verifier again at each call).
    #[test]
    fn the_global_functions_are_the_no_mangle_ones() {
        let found = no_mangle_functions(&workspace_root().join("ebpf/src")).unwrap();
        let mut listed: Vec<String> = BPF_GLOBAL_FUNCTIONS.iter().map(|s| s.to_string()).collect();
        listed.sort();
        assert_eq!(found, listed);
        assert!(bpf_rustflags(BPF_RUSTFLAGS, &listed)
            .contains("--export=ecni_masq_frag_find,ecni_masq_frag_record,ecni_masq_out_frag6"));
        assert_eq!(bpf_rustflags(BPF_RUSTFLAGS, &[] as &[&str]), BPF_RUSTFLAGS);
    }

    /// Another revision's flags are read from its xtask as this one's would be: here, this
    /// workspace's own, whatever line breaks rustfmt gives the constant.
    #[test]
    fn a_trees_ebpf_flags_are_read_from_its_xtask() {
        assert_eq!(bpf_rustflags_of(&workspace_root()).unwrap(), BPF_RUSTFLAGS);
        let old = tempfile::tempdir().unwrap();
        let old = old.path();
        let src = old.join("xtask").join("src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(
            src.join("build.rs"),
            "const BPF_RUSTFLAGS: &str = \"-C debuginfo=2 -C link-arg=--btf\";\n",
        )
        .unwrap();
        assert_eq!(
            bpf_rustflags_of(old).unwrap(),
            "-C debuginfo=2 -C link-arg=--btf"
        );
        std::fs::write(src.join("build.rs"), "const BPF_RUSTFLAGS: &str = FLAGS;\n").unwrap();
        assert!(bpf_rustflags_of(old).is_err());
    }

    const MUSL: CrossTarget = CrossTarget {
        triple: PROFILED_TARGET,
        cross_cc: None,
    };

    /// The static x86_64 release build is optimized with the profile the sources keep, and
    /// the file is an indexed LLVM profile; the flag goes with cargo's variable for that
    /// target, which adds to `.cargo/config.toml`'s rustflags (the static relocation model).
    #[test]
    fn the_static_x86_64_release_build_uses_the_kept_profile() {
        let root = workspace_root();
        let (var, flag) =
            profile_env(&root, &BuildOptions::default(), Some(MUSL), &Pgo::Use).unwrap();
        assert_eq!(var, "CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_RUSTFLAGS");
        let profile = profile_of(&root, PROFILED_TARGET);
        assert_eq!(flag, format!("-Cprofile-use={}", profile.display()));
        let head = std::fs::read(&profile).unwrap();
        assert_eq!(
            head.get(..8),
            Some(&b"\xfflprofi\x81"[..]),
            "{} is not an indexed LLVM profile",
            profile.display()
        );
    }

    /// No profile for a debug build, the host's build (the tests'), another architecture,
    /// or a tree that keeps none (an older revision's); the instrumented build gets its flag.
    #[test]
    fn only_the_profiled_release_target_takes_a_profile() {
        let root = workspace_root();
        let release = BuildOptions::default();
        let debug = BuildOptions {
            debug_plugin: true,
            ..BuildOptions::default()
        };
        let arm = CrossTarget {
            triple: "aarch64-unknown-linux-musl",
            cross_cc: Some("aarch64-linux-gnu-gcc"),
        };
        assert_eq!(profile_env(&root, &debug, Some(MUSL), &Pgo::Use), None);
        assert_eq!(profile_env(&root, &release, None, &Pgo::Use), None);
        assert_eq!(profile_env(&root, &release, Some(arm), &Pgo::Use), None);
        let old = tempfile::tempdir().unwrap();
        assert_eq!(
            profile_env(old.path(), &release, Some(MUSL), &Pgo::Use),
            None
        );
        let raw = Pgo::Generate(PathBuf::from("/tmp/raw"));
        assert_eq!(
            profile_env(old.path(), &release, Some(MUSL), &raw),
            Some((
                "CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_RUSTFLAGS".to_owned(),
                "-Cprofile-generate=/tmp/raw".to_owned()
            ))
        );
    }

    #[test]
    fn a_cross_compilers_variables_are_cargos_and_cc_rss() {
        let t = CrossTarget {
            triple: "aarch64-unknown-linux-musl",
            cross_cc: Some("aarch64-linux-gnu-gcc"),
        };
        let env = t.cc_env("aarch64-linux-gnu-gcc");
        assert_eq!(env[0].0, "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER");
        assert_eq!(env[1].0, "CC_aarch64_unknown_linux_musl");
    }
}
