//! A pod's limits in the node maps: the limiter's rates and bursts per host veth, and the
//! TCP pacing of its network namespace, and the subnets its limits exempt or select.

use aya::maps::lpm_trie::Key;
use aya::maps::{Array, HashMap, MapData};
use ebpf_cni_maps::{
    NodeConfig, Pacing, RateLimit, ShapeSubnetKey, CONFIG_MAP, LIMIT_MODE_MASK,
    LIMIT_SUBNETS_UNSHAPED, NODE_FLAG_NO_LIMITS, PACING_MAP, RATE_LIMITS_MAP, SHAPE_SUBNETS_MAP,
};

use crate::bandwidth::SubnetKey;

use super::{is_not_found, open_map_err, open_pinned, Maps};
use crate::bpf::{
    pin::{NodeId, PinRoot},
    BpfError,
};

/// Sets the node's [`NODE_FLAG_NO_LIMITS`] when its rate map `rates` is empty and clears
/// it otherwise, so `ecni_from_pod` skips the sender's limit lookup on a node without
/// limits. Under the node lock: after a load (the map may be fresh or hold limits of an
/// older binary's pods), after a limit is written (before the pod's programs attach) and
/// after one is removed.
fn settle_limits_switch(
    config: &mut Array<MapData, NodeConfig>,
    rates: &HashMap<MapData, u32, RateLimit>,
) -> Result<(), BpfError> {
    let have = config.get(&0, 0).unwrap_or_default();
    let flags = if rates.keys().next().is_none() {
        have.flags | NODE_FLAG_NO_LIMITS
    } else {
        have.flags & !NODE_FLAG_NO_LIMITS
    };
    if flags == have.flags {
        return Ok(());
    }
    config
        .set(0, NodeConfig { flags, ..have }, 0)
        .map_err(|source| BpfError::MapUpdate {
            map: CONFIG_MAP,
            what: "set the node's no-limits switch".to_owned(),
            source: Box::new(source),
        })
}

/// Whether any pod of the node is paced: the pacing map alone opened, and asked for its
/// first key (no walk). A map that cannot be read counts as paced (the caller keeps the
/// pacing program's link).
pub fn any_pacing(root: &PinRoot, node: &NodeId) -> Result<bool, BpfError> {
    let Some(map) = open_pinned(root, node, PACING_MAP)? else {
        return Ok(false);
    };
    let pacing: HashMap<MapData, u64, Pacing> =
        HashMap::try_from(map).map_err(open_map_err(root, node, PACING_MAP))?;
    let first = pacing.keys().next();
    Ok(first.is_some())
}

impl Maps {
    /// Pacing rate (bytes/s) by attachment, in one walk of the pacing map.
    pub fn pacing_by_attachment(&self) -> std::collections::HashMap<u64, u32> {
        self.pacing
            .as_ref()
            .map(|m| {
                m.iter()
                    .filter_map(Result::ok)
                    .map(|(_, v)| (v.attachment_id, v.rate_bytes))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// TCP pacing for the pod whose network namespace has `cookie`: its sockets are capped
    /// at `rate_bytes` per second (see `ebpf/src/bandwidth_pace.rs`).
    pub fn set_pacing(
        &mut self,
        cookie: u64,
        attachment_id: u64,
        rate_bytes: u32,
        shape_ifindex: u32,
    ) -> Result<(), BpfError> {
        let map = self.pacing.as_mut().ok_or(BpfError::PinMissing {
            what: "pacing map",
            path: PACING_MAP.into(),
        })?;
        let v = Pacing {
            rate_bytes,
            shape_ifindex,
            attachment_id,
        };
        map.insert(cookie, v, 0)
            .map_err(|source| BpfError::MapUpdate {
                map: PACING_MAP,
                what: format!("set pacing of netns cookie {cookie}"),
                source: Box::new(source),
            })
    }

    /// Removes the attachment's pacing entries: the one of `netns_cookie` when the
    /// attachment's placement record names it (0: the pod is not paced), else those a walk
    /// finds by their value (DEL may come without the pod's namespace). Only entries that
    /// carry the attachment's id go.
    pub fn remove_pacing(
        &mut self,
        attachment_id: u64,
        netns_cookie: Option<u64>,
    ) -> Result<(), BpfError> {
        let Some(map) = self.pacing.as_mut() else {
            return Ok(());
        };
        let cookies: Vec<u64> = match netns_cookie {
            // Not paced.
            Some(0) => return Ok(()),
            Some(c) => map
                .get(&c, 0)
                .ok()
                .filter(|v| v.attachment_id == attachment_id)
                .map(|_| c)
                .into_iter()
                .collect(),
            None => map
                .iter()
                .filter_map(Result::ok)
                .filter(|(_, v)| v.attachment_id == attachment_id)
                .map(|(k, _)| k)
                .collect(),
        };
        for c in cookies {
            match map.remove(&c) {
                Err(e) if !is_not_found(&e) => {
                    return Err(BpfError::MapUpdate {
                        map: PACING_MAP,
                        what: format!("remove pacing of netns cookie {c}"),
                        source: Box::new(e),
                    })
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// CHECK: the pod's namespace has exactly the expected pacing (or none): the rate and
    /// the host ifindex of a pod with subnets (0 without).
    pub fn check_pacing(
        &self,
        cookie: u64,
        attachment_id: u64,
        expected: Option<(u32, u32)>,
    ) -> Result<(), BpfError> {
        let actual = self
            .pacing
            .as_ref()
            .and_then(|m| m.get(&cookie, 0).ok())
            .filter(|v| v.attachment_id == attachment_id)
            .map(|v| (v.rate_bytes, v.shape_ifindex));
        if actual != expected {
            let show = |r: Option<(u32, u32)>| match r {
                None => "none".to_owned(),
                Some((r, 0)) => format!("{r} B/s"),
                Some((r, i)) => format!("{r} B/s, subnets of ifindex {i}"),
            };
            return Err(BpfError::PacingStale {
                actual: show(actual),
                expected: show(expected),
            });
        }
        Ok(())
    }

    /// Installs (or, with `None`, removes) the rate limits of the pod behind `ifindex`.
    pub fn set_limits(&mut self, ifindex: u32, limit: Option<RateLimit>) -> Result<(), BpfError> {
        let res = match limit {
            Some(l) => self.rates.insert(ifindex, l, 0),
            None => match self.rates.remove(&ifindex) {
                Err(e) if is_not_found(&e) => Ok(()),
                r => r,
            },
        };
        res.map_err(|source| BpfError::MapUpdate {
            map: RATE_LIMITS_MAP,
            what: format!("set the limits of ifindex {ifindex}"),
            source: Box::new(source),
        })
    }

    /// [`settle_limits_switch`] of this node's rate map, in its config map (nothing on a
    /// node without one).
    pub fn settle_limits_switch(&mut self) -> Result<(), BpfError> {
        match self.config.as_mut() {
            Some(config) => settle_limits_switch(config, &self.rates),
            None => Ok(()),
        }
    }

    pub fn limits(&self, ifindex: u32) -> Option<RateLimit> {
        self.rates.get(&ifindex, 0).ok()
    }

    /// CHECK: the limiter holds exactly the configured rates and bursts (or nothing).
    pub fn check_limits(&self, ifindex: u32, expected: Option<RateLimit>) -> Result<(), BpfError> {
        let actual = self.limits(ifindex);
        let describe = |l: &Option<RateLimit>| match l {
            None => "no limit".to_owned(),
            Some(l) => format!(
                "ingress {} B/s burst {} B, egress {} B/s burst {} B{}",
                l.ingress.rate_bytes,
                l.ingress.burst_bytes,
                l.egress.rate_bytes,
                l.egress.burst_bytes,
                match (l.ingress.mode | l.egress.mode) & !LIMIT_MODE_MASK {
                    0 => "",
                    f if f & LIMIT_SUBNETS_UNSHAPED != 0 => ", unshapedSubnets",
                    _ => ", shapedSubnets",
                }
            ),
        };
        // The mode's flags (which subnets rule applies) are compared; the mode itself is
        // ADD's decision from the node's qdiscs, checked by `bandwidth::check`.
        let flags = |m: u32| m & !LIMIT_MODE_MASK;
        let same = |a: &RateLimit, b: &RateLimit| {
            (
                a.ingress.rate_bytes,
                a.ingress.burst_bytes,
                flags(a.ingress.mode),
                a.egress.rate_bytes,
                a.egress.burst_bytes,
                flags(a.egress.mode),
            ) == (
                b.ingress.rate_bytes,
                b.ingress.burst_bytes,
                flags(b.ingress.mode),
                b.egress.rate_bytes,
                b.egress.burst_bytes,
                flags(b.egress.mode),
            )
        };
        let ok = match (&actual, &expected) {
            (None, None) => true,
            (Some(a), Some(b)) => same(a, b),
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(BpfError::LimitMismatch {
                ifindex,
                actual: describe(&actual),
                expected: describe(&expected),
            })
        }
    }

    /// The `unshapedSubnets`/`shapedSubnets` entries of the pod behind `ifindex`, sorted.
    pub fn shape_subnets(&self, ifindex: u32) -> Vec<SubnetKey> {
        let mut v: Vec<SubnetKey> = self
            .shape
            .as_ref()
            .map(|m| {
                m.keys()
                    .filter_map(Result::ok)
                    .filter(|k| k.data().ifindex == ifindex)
                    .map(|k| (k.prefix_len(), k.data().addr))
                    .collect()
            })
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    /// Makes `subnets` the entries of the pod behind `ifindex`: the others it has go. DEL
    /// and rollback pass none; the trie is small (only limited pods with subnets), so the
    /// scan for the pod's old entries is short.
    pub fn set_shape_subnets(
        &mut self,
        ifindex: u32,
        subnets: &[SubnetKey],
    ) -> Result<(), BpfError> {
        let old = self.shape_subnets(ifindex);
        let Some(map) = self.shape.as_mut() else {
            if subnets.is_empty() {
                return Ok(());
            }
            return Err(BpfError::PinMissing {
                what: "subnet map (programs of an older revision: reload them)",
                path: SHAPE_SUBNETS_MAP.into(),
            });
        };
        let key = |(prefix, addr): SubnetKey| Key::new(prefix, ShapeSubnetKey { ifindex, addr });
        let err = |what: String| {
            move |e: aya::maps::MapError| BpfError::MapUpdate {
                map: SHAPE_SUBNETS_MAP,
                what,
                source: Box::new(e),
            }
        };
        for k in old.iter().filter(|k| !subnets.contains(k)) {
            match map.remove(&key(*k)) {
                Err(e) if !is_not_found(&e) => {
                    return Err(err(format!("remove a subnet of ifindex {ifindex}"))(e))
                }
                _ => {}
            }
        }
        for k in subnets {
            map.insert(&key(*k), 1, 0)
                .map_err(err(format!("add a subnet of ifindex {ifindex}")))?;
        }
        Ok(())
    }

    /// CHECK: the pod's subnet entries are exactly `expected`.
    pub fn check_shape_subnets(
        &self,
        ifindex: u32,
        expected: &[SubnetKey],
    ) -> Result<(), BpfError> {
        let actual = self.shape_subnets(ifindex);
        let mut want = expected.to_vec();
        want.sort_unstable();
        want.dedup();
        if actual == want {
            return Ok(());
        }
        let show = |v: &[SubnetKey]| {
            if v.is_empty() {
                return "none".to_owned();
            }
            v.iter()
                .map(|k| crate::bandwidth::subnet_of_key(*k).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        Err(BpfError::ShapeSubnetsStale {
            ifindex,
            actual: show(&actual),
            expected: show(&want),
        })
    }
}
