//! A pod's limits in the node maps: the limiter's rates and bursts per host veth, and the
//! TCP pacing of its network namespace.

use ebpf_cni_maps::{Pacing, RateLimit, PACING_MAP, RATE_LIMITS_MAP};

use super::{is_not_found, Maps};
use crate::bpf::BpfError;

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
    /// at `rate_bytes` per second (see `ebpf/src/pace.rs`).
    pub fn set_pacing(
        &mut self,
        cookie: u64,
        attachment_id: u64,
        rate_bytes: u32,
    ) -> Result<(), BpfError> {
        let map = self.pacing.as_mut().ok_or(BpfError::PinMissing {
            what: "pacing map",
            path: PACING_MAP.into(),
        })?;
        let v = Pacing {
            rate_bytes,
            _pad: 0,
            attachment_id,
        };
        map.insert(cookie, v, 0)
            .map_err(|source| BpfError::MapUpdate {
                map: PACING_MAP,
                what: format!("set pacing of netns cookie {cookie}"),
                source: Box::new(source),
            })
    }

    /// Removes the attachment's pacing entries, found by their value: DEL may come without
    /// the pod's namespace. The map holds only limited pods, so the scan is short.
    pub(super) fn remove_pacing(&mut self, attachment_id: u64) -> Result<(), BpfError> {
        let Some(map) = self.pacing.as_mut() else {
            return Ok(());
        };
        let cookies: Vec<u64> = map
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, v)| v.attachment_id == attachment_id)
            .map(|(k, _)| k)
            .collect();
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

    /// CHECK: the pod's namespace has exactly the expected pacing (or none).
    pub fn check_pacing(
        &self,
        cookie: u64,
        attachment_id: u64,
        expected: Option<u32>,
    ) -> Result<(), BpfError> {
        let actual = self
            .pacing
            .as_ref()
            .and_then(|m| m.get(&cookie, 0).ok())
            .filter(|v| v.attachment_id == attachment_id)
            .map(|v| v.rate_bytes);
        if actual != expected {
            let show = |r: Option<u32>| r.map_or("none".to_owned(), |r| format!("{r} B/s"));
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

    pub fn limits(&self, ifindex: u32) -> Option<RateLimit> {
        self.rates.get(&ifindex, 0).ok()
    }

    /// CHECK: the limiter holds exactly the configured rates and bursts (or nothing).
    pub fn check_limits(&self, ifindex: u32, expected: Option<RateLimit>) -> Result<(), BpfError> {
        let actual = self.limits(ifindex);
        let describe = |l: &Option<RateLimit>| match l {
            None => "no limit".to_owned(),
            Some(l) => format!(
                "ingress {} B/s burst {} B, egress {} B/s burst {} B",
                l.ingress.rate_bytes,
                l.ingress.burst_bytes,
                l.egress.rate_bytes,
                l.egress.burst_bytes
            ),
        };
        let same = |a: &RateLimit, b: &RateLimit| {
            (
                a.ingress.rate_bytes,
                a.ingress.burst_bytes,
                a.egress.rate_bytes,
                a.egress.burst_bytes,
            ) == (
                b.ingress.rate_bytes,
                b.ingress.burst_bytes,
                b.egress.rate_bytes,
                b.egress.burst_bytes,
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
}
