//! STATUS (spec 1.1): whether this node can serve ADD for the network right now. Success
//! prints nothing; otherwise code 50 ("plugin not available"), or 51 when the pods already
//! attached may have lost connectivity too, with every reason found in the message.
//!
//! A node found ready is converged too (`converge`: its device links, host-port addresses
//! and masquerade sources follow the node's devices and addresses; nothing written when
//! they did not change).
//!
//! What is checked is what ADD needs and cannot fix by itself, kept cheap because kubelet
//! asks every few seconds: the eBPF side ([`bpf::readiness`]: programs built in, bpffs
//! mounted or mountable, the node's pinned programs and maps, or else a load the kernel
//! accepts), the attach mode the config forces, and the addresses (a free one in every
//! host-local range set, or a delegated IPAM's own STATUS).

use crate::{
    bpf::{self, NodeId, Unready},
    cni::{
        code,
        config::{NetConf, TcAttachMode},
        env::NetworkEnv,
        CniError,
    },
    ipam::backend::Ipam,
};

pub async fn status(env: &NetworkEnv, conf: &NetConf, stdin: &[u8]) -> Result<(), CniError> {
    // A config ADD would refuse is refused here the same way (code 7). Without ipam,
    // ebpf-cni is chained after the plugin that addresses pods: no range of its own to check.
    let ipam = Ipam::from_conf(conf)?;

    let mut problems: Vec<Unready> = Vec::new();
    if let Err(e) = bpf::kernel::require_for(conf.tc_attach_mode == TcAttachMode::Tcx) {
        problems.push(Unready {
            reason: e.to_string(),
            pods_affected: false,
        });
    }
    match NodeId::current() {
        Ok(node) => {
            problems.extend(bpf::readiness(&node));
            // Not a failure: the node serves ADD with these parts degraded (docs/kernels.md,
            // "Kernel requirements"); said on stderr, where runtimes log it.
            for m in bpf::part_modes(&node).into_iter().filter(|m| m.degraded) {
                log::warn!("kernel {}: {}: {}", bpf::kernel::release(), m.part, m.mode);
            }
        }
        Err(e) => problems.push(Unready {
            reason: CniError::from(e).to_string(),
            pods_affected: false,
        }),
    }

    // A ready node follows its devices and addresses (host ports on a new address, the
    // device program on a new device, masquerade's new source); a failure here leaves
    // the node as the last convergence left it, which serves ADD: said, not failed.
    if problems.is_empty() {
        if let Err(e) = crate::converge::converge(conf, bpf::ConvergedBy::Status).await {
            log::warn!("the node did not follow its devices and addresses: {e}");
        }
    }
    let ipam_err = ipam.and_then(|i| i.status(conf, &env.path, stdin).err().map(CniError::from));
    verdict(problems, ipam_err)
}

/// One error out of everything found: the delegate's own error when it is the only
/// problem (its code passed on as the spec asks), else 51 if any reason affects existing
/// pods (or the delegate said 51), else 50.
fn verdict(problems: Vec<Unready>, ipam_err: Option<CniError>) -> Result<(), CniError> {
    if problems.is_empty() {
        return ipam_err.map_or(Ok(()), Err);
    }
    let mut code = if problems.iter().any(|p| p.pods_affected) {
        code::PLUGIN_NOT_AVAILABLE_LIMITED
    } else {
        code::PLUGIN_NOT_AVAILABLE
    };
    let mut reasons: Vec<String> = problems.into_iter().map(|p| p.reason).collect();
    let mut details = String::new();
    if let Some(e) = ipam_err {
        if e.code == code::PLUGIN_NOT_AVAILABLE_LIMITED {
            code = e.code;
        }
        reasons.push(e.msg);
        details = e.details;
    }
    // The reasons come from several modules, the delegate's as an already converted
    // CniError (its code is passed on): the one answer is built here, at the edge.
    let msg = match code {
        code::PLUGIN_NOT_AVAILABLE_LIMITED => {
            "plugin not available, existing pods may have limited connectivity"
        }
        _ => "plugin not available",
    };
    Err(CniError::new(code, format!("{msg}: {}", reasons.join("; "))).with_details(details))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unready(reason: &str, pods_affected: bool) -> Unready {
        Unready {
            reason: reason.to_owned(),
            pods_affected,
        }
    }

    #[test]
    fn healthy_is_ok() {
        assert!(verdict(Vec::new(), None).is_ok());
    }

    #[test]
    fn code_50_lists_every_reason() {
        let e = verdict(
            vec![unready("bpffs missing", false)],
            Some(CniError::new(
                code::PLUGIN_NOT_AVAILABLE,
                "IPAM range set ipam.ranges[0] (10.0.0.2-10.0.0.2) is exhausted",
            )),
        )
        .unwrap_err();
        assert_eq!(e.code, code::PLUGIN_NOT_AVAILABLE);
        assert_eq!(
            e.msg,
            "plugin not available: bpffs missing; IPAM range set ipam.ranges[0] (10.0.0.2-10.0.0.2) is exhausted"
        );
    }

    #[test]
    fn pods_affected_makes_it_51() {
        let e = verdict(
            vec![unready("a", false), unready("maps missing", true)],
            None,
        )
        .unwrap_err();
        assert_eq!(e.code, code::PLUGIN_NOT_AVAILABLE_LIMITED);
        assert!(
            e.msg.contains("limited connectivity: a; maps missing"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn a_delegate_error_alone_keeps_its_code() {
        let delegate = CniError::new(11, "ipam plugin x STATUS failed (code 11): busy");
        assert_eq!(
            verdict(Vec::new(), Some(delegate.clone())).unwrap_err(),
            delegate
        );
        let e = verdict(
            vec![unready("b", false)],
            Some(CniError::new(code::PLUGIN_NOT_AVAILABLE_LIMITED, "d")),
        )
        .unwrap_err();
        assert_eq!(e.code, code::PLUGIN_NOT_AVAILABLE_LIMITED);
    }
}
