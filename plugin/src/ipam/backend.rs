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
        match self {
            Ipam::HostLocal(_) => Ok(None),
            Ipam::Delegated { plugin } => delegate::find(plugin, &env.path).map(Some),
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
