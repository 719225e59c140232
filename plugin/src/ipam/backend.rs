//! Which IPAM serves a network: the built-in host-local, or a delegated plugin executed
//! from `CNI_PATH`. Either way the answer becomes part of a CNI result.

use std::{net::IpAddr, path::PathBuf};

use crate::cni::{
    code,
    config::NetConf,
    env::CniEnv,
    types::{Dns, IpConfig, Route, SuccessResult},
};

use super::{
    delegate::{self, DelegateError},
    HostLocalConfig, IpamError, IpamRequest, SetUsage,
};

/// What the IPAM of a network could not do, with the code each command gives it.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    HostLocal(#[from] IpamError),
    #[error(transparent)]
    Delegate(#[from] DelegateError),
    /// STATUS: the delegate cannot be found or asked, so ADD could not run it.
    #[error(transparent)]
    DelegateUnavailable(DelegateError),
    /// STATUS: the delegate's own answer; its code is passed on (spec 1.1).
    #[error(transparent)]
    DelegateStatus(DelegateError),
    /// CHECK through the delegate.
    #[error(transparent)]
    DelegateCheck(DelegateError),
    /// Boxed: with the path beside it, the IpamError would make every `Result` here large.
    #[error("cannot read the IPAM leases in {}", .dir.display())]
    Leases {
        dir: PathBuf,
        #[source]
        source: Box<IpamError>,
    },
    /// STATUS: range sets without a free address (an ADD needs one from each).
    #[error("{}", exhausted(.sets, .dir))]
    Exhausted { sets: Vec<SetUsage>, dir: PathBuf },
    #[error("IPAM reservation check failed")]
    Reservation(#[source] IpamError),
    #[error("IPAM: address {ip} is not reserved for container {container_id} ifname {ifname} in {}", .dir.display())]
    NotReserved {
        ip: IpAddr,
        container_id: String,
        ifname: String,
        dir: PathBuf,
    },
}

fn exhausted(sets: &[SetUsage], dir: &std::path::Path) -> String {
    sets.iter()
        .map(|u| {
            format!(
                "IPAM range set {} ({}) is exhausted: {} of {} addresses leased in {}",
                u.set,
                u.ranges,
                u.leased,
                u.capacity,
                dir.display()
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl BackendError {
    pub fn cni_code(&self) -> u32 {
        match self {
            Self::HostLocal(e) => e.cni_code(),
            Self::Delegate(e) => e.cni_code(),
            Self::DelegateUnavailable(_) | Self::Leases { .. } | Self::Exhausted { .. } => {
                code::PLUGIN_NOT_AVAILABLE
            }
            Self::DelegateStatus(e) => e.reported_code().unwrap_or_else(|| e.cni_code()),
            Self::DelegateCheck(_) | Self::Reservation(_) | Self::NotReserved { .. } => {
                code::CHECK_FAILED
            }
        }
    }
}

pub enum Ipam {
    HostLocal(HostLocalConfig),
    Delegated { plugin: String },
}

impl Ipam {
    /// `None` when the config has no `ipam` section.
    pub fn from_conf(conf: &NetConf) -> Result<Option<Self>, BackendError> {
        let (Some(ipam), Some(kind)) = (&conf.ipam, &conf.ipam_type) else {
            return Ok(None);
        };
        if kind == "host-local" {
            let c = HostLocalConfig::parse(ipam, conf.runtime.capability("ipRanges"))?;
            Ok(Some(Ipam::HostLocal(c)))
        } else {
            Ok(Some(Ipam::Delegated {
                plugin: kind.clone(),
            }))
        }
    }

    fn delegate_binary(&self, env: &CniEnv) -> Result<Option<PathBuf>, BackendError> {
        self.delegate_binary_in(&env.path)
    }

    fn delegate_binary_in(&self, cni_path: &[PathBuf]) -> Result<Option<PathBuf>, BackendError> {
        match self {
            Ipam::HostLocal(_) => Ok(None),
            Ipam::Delegated { plugin } => Ok(Some(delegate::find(plugin, cni_path)?)),
        }
    }

    /// The delegate, if it speaks the config's version and that version has GC and STATUS
    /// (spec 1.1); `None` for host-local, and for a delegate that cannot be asked (an older
    /// plugin would fail the command, and cannot serve this config's ADD either).
    fn delegate_for_1_1(
        &self,
        conf: &NetConf,
        cni_path: &[PathBuf],
    ) -> Result<Option<PathBuf>, BackendError> {
        let Some(bin) = self.delegate_binary_in(cni_path)? else {
            return Ok(None);
        };
        let version = conf.cni_version.as_str();
        if conf.cni_version.has_gc_and_status() && delegate::supports(&bin, version)? {
            Ok(Some(bin))
        } else {
            log::warn!(
                "ipam plugin {} does not support cniVersion {version}: not passing GC or STATUS to it",
                bin.display()
            );
            Ok(None)
        }
    }

    /// Checked before ADD changes anything: a delegate that does not exist is a config error.
    pub fn validate(&self, env: &CniEnv) -> Result<(), BackendError> {
        self.delegate_binary(env).map(|_| ())
    }

    pub fn add(
        &self,
        conf: &NetConf,
        env: &CniEnv,
        stdin: &[u8],
    ) -> Result<SuccessResult, BackendError> {
        match self {
            Ipam::HostLocal(c) => {
                let mut requested: Vec<IpAddr> = Vec::new();
                for ip in env
                    .args
                    .ips
                    .iter()
                    .chain(&conf.args_ips)
                    .chain(&conf.runtime.ips)
                {
                    if !requested.contains(ip) {
                        requested.push(*ip);
                    }
                }
                let r = super::allocate(
                    c,
                    &IpamRequest {
                        fresh: true,
                        network: &conf.name,
                        container_id: &env.container_id,
                        ifname: &env.ifname,
                        requested: &requested,
                    },
                )?;
                Ok(SuccessResult {
                    interfaces: Vec::new(),
                    ips: r
                        .ips
                        .into_iter()
                        .map(|i| IpConfig {
                            address: i.address,
                            gateway: i.gateway,
                            interface: None,
                        })
                        .collect(),
                    routes: r
                        .routes
                        .into_iter()
                        .map(|x| Route {
                            dst: x.dst,
                            gw: x.gw,
                            options: x.options,
                        })
                        .collect(),
                    dns: r
                        .dns
                        .map(|d| Dns {
                            nameservers: d.nameservers,
                            domain: d.domain,
                            search: d.search,
                            options: d.options,
                        })
                        .unwrap_or_default(),
                })
            }
            Ipam::Delegated { .. } => {
                let bin = self.delegate_binary(env)?.expect("delegated has a binary");
                Ok(delegate::add(&bin, stdin)?)
            }
        }
    }

    pub fn del(&self, conf: &NetConf, env: &CniEnv, stdin: &[u8]) -> Result<(), BackendError> {
        match self {
            Ipam::HostLocal(c) => Ok(super::release(
                c,
                &conf.name,
                &env.container_id,
                &env.ifname,
            )?),
            Ipam::Delegated { .. } => {
                let bin = self.delegate_binary(env)?.expect("delegated has a binary");
                delegate::exec(&bin, "DEL", stdin)?;
                Ok(())
            }
        }
    }

    /// Releases the host-local leases of one attachment, as DEL does; succeeds when there is
    /// none. A delegated IPAM is not called here: DEL passes DEL on to it ([`Self::del`])
    /// and GC passes GC ([`Self::gc`]).
    pub fn release_host_local(
        &self,
        conf: &NetConf,
        container_id: &str,
        ifname: &str,
    ) -> Result<(), BackendError> {
        match self {
            Ipam::HostLocal(c) => Ok(super::release(c, &conf.name, container_id, ifname)?),
            Ipam::Delegated { .. } => Ok(()),
        }
    }

    /// The attachments holding host-local leases in this network (GC's inventory); empty for
    /// a delegated IPAM, whose store we cannot read.
    pub fn holders(&self, conf: &NetConf) -> Result<Vec<(String, String)>, BackendError> {
        match self {
            Ipam::HostLocal(c) => Ok(super::holders(c, &conf.name)?),
            Ipam::Delegated { .. } => Ok(Vec::new()),
        }
    }

    /// GC of the address store, after the stale attachments were removed one by one:
    /// host-local releases whatever lease is still not listed in `valid` (old-format
    /// leases, which name no interface); a delegate gets GC with our stdin (spec 1.1: GC
    /// must be passed on to delegated plugins).
    pub fn gc(
        &self,
        conf: &NetConf,
        cni_path: &[PathBuf],
        valid: &[(String, String)],
        stdin: &[u8],
    ) -> Result<(), BackendError> {
        match self {
            Ipam::HostLocal(c) => {
                let released = super::gc(c, &conf.name, valid)?;
                if !released.is_empty() {
                    log::info!("GC released leases {released:?} in {}", conf.name);
                }
                Ok(())
            }
            Ipam::Delegated { .. } => match self.delegate_for_1_1(conf, cni_path)? {
                Some(bin) => {
                    delegate::exec(&bin, "GC", stdin)?;
                    Ok(())
                }
                None => Ok(()),
            },
        }
    }

    /// Whether an ADD can get addresses: every host-local range set has a free address (one
    /// is needed from each); a delegate gets STATUS and its error is ours (spec 1.1).
    pub fn status(
        &self,
        conf: &NetConf,
        cni_path: &[PathBuf],
        stdin: &[u8],
    ) -> Result<(), BackendError> {
        match self {
            Ipam::HostLocal(c) => {
                let dir = c.data_dir.join(&conf.name);
                let full: Vec<SetUsage> = match super::usage(c, &conf.name) {
                    Ok(usage) => usage.into_iter().filter(|u| u.free() == 0).collect(),
                    Err(e) => {
                        return Err(BackendError::Leases {
                            dir,
                            source: Box::new(e),
                        })
                    }
                };
                if full.is_empty() {
                    Ok(())
                } else {
                    Err(BackendError::Exhausted { sets: full, dir })
                }
            }
            Ipam::Delegated { .. } => {
                // Not finding or not being able to ask the delegate means ADD cannot run it.
                let bin = self.delegate_for_1_1(conf, cni_path).map_err(|e| match e {
                    BackendError::Delegate(e) => BackendError::DelegateUnavailable(e),
                    other => other,
                })?;
                match bin {
                    Some(bin) => match delegate::exec(&bin, "STATUS", stdin) {
                        Ok(_) => Ok(()),
                        Err(e) => Err(BackendError::DelegateStatus(e)),
                    },
                    None => Ok(()),
                }
            }
        }
    }

    /// Verifies the reservation still holds `ips`.
    pub fn check(
        &self,
        conf: &NetConf,
        env: &CniEnv,
        stdin: &[u8],
        ips: &[IpAddr],
    ) -> Result<(), BackendError> {
        match self {
            Ipam::HostLocal(c) => {
                let held = super::reserved(c, &conf.name, &env.container_id, &env.ifname)
                    .map_err(BackendError::Reservation)?;
                if let Some(ip) = ips.iter().find(|ip| !held.contains(ip)) {
                    return Err(BackendError::NotReserved {
                        ip: *ip,
                        container_id: env.container_id.clone(),
                        ifname: env.ifname.clone(),
                        dir: c.data_dir.join(&conf.name),
                    });
                }
                Ok(())
            }
            Ipam::Delegated { .. } => {
                let bin = self.delegate_binary(env)?.expect("delegated has a binary");
                delegate::exec(&bin, "CHECK", stdin).map_err(BackendError::DelegateCheck)?;
                Ok(())
            }
        }
    }
}
