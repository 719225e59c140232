//! ebpf-cni: a CNI interface plugin whose dataplane runs as eBPF programs (TC on the pods'
//! veths and the node's devices; cgroup socket-address and sock_ops programs for the node's
//! own host-port connections and TCP pacing).
//!
//! With `CNI_COMMAND` set the binary speaks the CNI protocol (stdin: config, stdout: result
//! or error JSON); without it, it is an operator CLI.

// Every module is private and the library exports `run` alone, which `main.rs` calls: no
// crate uses the library, so rustc's dead-code lint sees every item nothing reaches.
mod add;
mod agent;
mod attachment;
mod bandwidth;
mod bpf;
mod chained;
mod check;
mod cli;
mod cluster;
mod cni;
mod converge;
mod del;
mod errors;
mod firewall;
mod gateway;
mod gc;
mod host_ports;
mod install;
mod ipam;
mod kube_client;
mod logging;
mod metrics;
mod netfilter;
mod netlink;
mod netns;
mod node;
mod page_cache;
mod reboot;
mod removal;
mod report;
mod serial;
mod services;
mod sockopt;
mod source_check;
mod status;
mod test_hooks;
mod version;
mod veth;

use std::io::{Read, Write};

use cni::{code, config, env::Command, CniError};
use serde_json::Value;

pub fn run() -> i32 {
    let started = std::time::Instant::now();
    logging::init();
    bpf::kernel::lift_memlock_limit();
    match std::env::var("CNI_COMMAND") {
        Ok(cmd) if !cmd.is_empty() => {
            let code = cni_main(&cmd);
            // What the process spent between its `main` and its exit (the step timings of
            // ADD are relative to their own start).
            log::debug!(
                "{cmd} done in {:.1} ms after main",
                started.elapsed().as_secs_f64() * 1e3
            );
            code
        }
        _ => cli::main(),
    }
}

fn cni_main(command: &str) -> i32 {
    let mut stdin = Vec::new();
    let outcome = match std::io::stdin().read_to_end(&mut stdin) {
        Ok(_) => {
            logging::configure_from_config(&stdin);
            bpf::walk::walk_under_lock();
            execute(command, &stdin)
        }
        // The edge itself (no module below it read stdin): built here, as is the other
        // CniError of this file (GC and STATUS on an older config).
        Err(e) => Err(CniError::new(
            code::IO_FAILURE,
            "failed to read the network configuration from stdin",
        )
        .with_details(e.to_string())),
    };
    match outcome {
        Ok(Some(v)) => {
            print_json(&v);
            0
        }
        Ok(None) => 0,
        Err(mut e) => {
            // Spec section 5: the error carries the cniVersion the runtime sent, even one we
            // do not support; 1.0.0 when there is none to read.
            e.cni_version = cni::version::asked(&stdin);
            log::error!("{e}");
            print_json(&serde_json::to_value(&e).expect("errors serialize"));
            1
        }
    }
}

fn print_json(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, v);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// Runs a command's future to completion on the calling thread. Nothing in it waits on a
/// reactor or a timer (the netlink calls answer synchronously), so no async runtime is
/// started: tokio's took an ADD an epoll instance, an eventfd and its scheduler.
pub(crate) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

fn execute(command: &str, stdin: &[u8]) -> Result<Option<Value>, CniError> {
    let command = cni::env::Command::parse(command)?;
    if command == Command::Version {
        return Ok(Some(version::version(stdin)));
    }
    if matches!(command, Command::Gc | Command::Status) {
        return execute_network(command, stdin).map(|()| None);
    }
    let env = cni::env::from_lookup(command, |k| std::env::var(k).ok())?;
    let conf = config::NetConf::parse(config::decode(stdin)?)?;
    let accepted = if command == Command::Del {
        Vec::new()
    } else {
        conf.review_stock_keys()?
    };
    // A second ADD or DEL of this attachment waits for the first (see `serial.rs`).
    let _serial = matches!(command, Command::Add | Command::Del)
        .then(|| serial::AttachmentLock::take(attachment::key(&conf, &env).id()))
        .flatten();
    if let (Command::Check, Some(path)) = (command, &env.netns) {
        // The node's own namespace is no pod's (ADD refuses it as it opens it).
        netns::Netns::open_pod(path)?;
    }
    let out = block_on(async {
        match command {
            Command::Add if attachment::is_chained(&conf) => {
                chained::add(&env, &conf).await.map(Some)
            }
            Command::Add => add::add(&env, &conf, stdin).await.map(Some),
            Command::Del => del::del(&env, &conf, stdin).await.map(|()| None),
            Command::Check if attachment::is_chained(&conf) => {
                chained::check(&env, &conf).await.map(|()| None)
            }
            Command::Check => check::check(&env, &conf, stdin).await.map(|()| None),
            Command::Version | Command::Gc | Command::Status => unreachable!("handled above"),
        }
    });
    if command == Command::Add && out.is_ok() {
        node::warn_stock_keys_once(&conf.name, &accepted);
    }
    out
}

/// GC and STATUS: a whole network, no attachment parameters, and (as the reference `skel`
/// enforces) a config of cniVersion 1.1.0 or later.
fn execute_network(command: Command, stdin: &[u8]) -> Result<(), CniError> {
    let env = cni::env::network_from_lookup(|k| std::env::var(k).ok());
    let conf = config::NetConf::parse(config::decode(stdin)?)?;
    if !conf.cni_version.has_gc_and_status() {
        // The command dispatch's own refusal, at the edge (see cni_main).
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!(
                "incompatible CNI version: {} needs cniVersion {} or later, the config has {:?}",
                command.as_str(),
                cni::version::GC_STATUS_SINCE,
                conf.cni_version.as_str()
            ),
        ));
    }
    block_on(async {
        match command {
            Command::Gc => gc::gc(&env, &conf, stdin).await,
            Command::Status => status::status(&env, &conf, stdin).await,
            _ => unreachable!("only GC and STATUS act on a whole network"),
        }
    })
}
