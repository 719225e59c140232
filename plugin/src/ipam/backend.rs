//! Which IPAM serves a network: the built-in host-local, or a delegated plugin executed
//! from `CNI_PATH`. Either way the answer becomes part of a CNI result.

use std::{net::IpAddr, path::PathBuf};

use crate::cni::{
    code,
    config::NetConf,
    env::CniEnv,
    types::{Dns, IpConfig, Route, SuccessResult},
    CniError,
};

use super::{delegate, HostLocalConfig, IpamError, IpamRequest};

pub enum Ipam {
    HostLocal(HostLocalConfig),
    Delegated { plugin: String },
}

impl From<IpamError> for CniError {
    fn from(e: IpamError) -> Self {
        CniError::from_error(e.cni_code(), &e)
    }
}

impl Ipam {
    /// `None` when the config has no `ipam` section.
    pub fn from_conf(conf: &NetConf) -> Result<Option<Self>, CniError> {
        let (Some(ipam), Some(kind)) = (&conf.ipam, &conf.ipam_type) else {
            return Ok(None);
        };
        if kind == "host-local" {
            let c = HostLocalConfig::parse(ipam, conf.runtime.ip_ranges.as_ref())?;
            Ok(Some(Ipam::HostLocal(c)))
        } else {
            Ok(Some(Ipam::Delegated {
                plugin: kind.clone(),
            }))
        }
    }

    fn delegate_binary(&self, env: &CniEnv) -> Result<Option<PathBuf>, CniError> {
        self.delegate_binary_in(&env.path)
    }

    fn delegate_binary_in(&self, cni_path: &[PathBuf]) -> Result<Option<PathBuf>, CniError> {
        match self {
            Ipam::HostLocal(_) => Ok(None),
            Ipam::Delegated { plugin } => delegate::find(plugin, cni_path).map(Some),
        }
    }

    /// The delegate, if it speaks the config's version and that version has GC and STATUS
    /// (spec 1.1); `None` for host-local, and for a delegate that cannot be asked (an older
    /// plugin would fail the command, and cannot serve this config's ADD either).
    fn delegate_for_1_1(
        &self,
        conf: &NetConf,
        cni_path: &[PathBuf],
    ) -> Result<Option<PathBuf>, CniError> {
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
    pub fn validate(&self, env: &CniEnv) -> Result<(), CniError> {
        self.delegate_binary(env).map(|_| ())
    }

    pub fn add(
        &self,
        conf: &NetConf,
        env: &CniEnv,
        stdin: &[u8],
    ) -> Result<SuccessResult, CniError> {
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
                delegate::add(&bin, stdin)
            }
        }
    }

    pub fn del(&self, conf: &NetConf, env: &CniEnv, stdin: &[u8]) -> Result<(), CniError> {
        match self {
            Ipam::HostLocal(c) => Ok(super::release(
                c,
                &conf.name,
                &env.container_id,
                &env.ifname,
            )?),
            Ipam::Delegated { .. } => {
                let bin = self.delegate_binary(env)?.expect("delegated has a binary");
                delegate::exec(&bin, "DEL", stdin).map(|_| ())
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
    ) -> Result<(), CniError> {
        match self {
            Ipam::HostLocal(c) => Ok(super::release(c, &conf.name, container_id, ifname)?),
            Ipam::Delegated { .. } => Ok(()),
        }
    }

    /// The attachments holding host-local leases in this network (GC's inventory); empty for
    /// a delegated IPAM, whose store we cannot read.
    pub fn holders(&self, conf: &NetConf) -> Result<Vec<(String, String)>, CniError> {
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
    ) -> Result<(), CniError> {
        match self {
            Ipam::HostLocal(c) => {
                let released = super::gc(c, &conf.name, valid)?;
                if !released.is_empty() {
                    log::info!("GC released leases {released:?} in {}", conf.name);
                }
                Ok(())
            }
            Ipam::Delegated { .. } => match self.delegate_for_1_1(conf, cni_path)? {
                Some(bin) => delegate::exec(&bin, "GC", stdin).map(|_| ()),
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
    ) -> Result<(), CniError> {
        match self {
            Ipam::HostLocal(c) => {
                let dir = c.data_dir.join(&conf.name);
                let full: Vec<String> = super::usage(c, &conf.name)
                    .map_err(|e| {
                        CniError::new(
                            code::PLUGIN_NOT_AVAILABLE,
                            format!("cannot read the IPAM leases in {}: {e}", dir.display()),
                        )
                    })?
                    .into_iter()
                    .filter(|u| u.free() == 0)
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
                    .collect();
                if full.is_empty() {
                    Ok(())
                } else {
                    Err(CniError::new(code::PLUGIN_NOT_AVAILABLE, full.join("; ")))
                }
            }
            Ipam::Delegated { .. } => {
                // Not finding or not being able to ask the delegate means ADD cannot run it.
                let bin = self
                    .delegate_for_1_1(conf, cni_path)
                    .map_err(|e| CniError {
                        code: code::PLUGIN_NOT_AVAILABLE,
                        ..e
                    })?;
                match bin {
                    Some(bin) => delegate::exec_keeping_code(&bin, "STATUS", stdin).map(|_| ()),
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
    ) -> Result<(), CniError> {
        match self {
            Ipam::HostLocal(c) => {
                let held = super::reserved(c, &conf.name, &env.container_id, &env.ifname).map_err(
                    |e| {
                        CniError::new(
                            code::CHECK_FAILED,
                            format!("IPAM reservation check failed: {e}"),
                        )
                    },
                )?;
                for ip in ips {
                    if !held.contains(ip) {
                        return Err(CniError::new(
                            code::CHECK_FAILED,
                            format!(
                                "IPAM: address {ip} is not reserved for container {} ifname {} in {}",
                                env.container_id,
                                env.ifname,
                                c.data_dir.join(&conf.name).display()
                            ),
                        ));
                    }
                }
                Ok(())
            }
            Ipam::Delegated { .. } => {
                let bin = self.delegate_binary(env)?.expect("delegated has a binary");
                delegate::exec(&bin, "CHECK", stdin)
                    .map(|_| ())
                    .map_err(|e| CniError {
                        code: code::CHECK_FAILED,
                        ..e
                    })
            }
        }
    }
}
