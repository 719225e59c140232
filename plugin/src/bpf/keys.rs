//! Keys: what names an attachment (and hashes it into the ids that tag its entries and
//! name its veth), and the endpoint map's address keys.

use std::net::IpAddr;

use ebpf_cni_maps::EndpointKey;

use super::BpfError;

/// Names one attachment: one interface of one container on one network. The values come
/// from the CNI request and must already be validated; [`AttachmentKey::validate`] is checked
/// again before any path is built from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttachmentKey<'a> {
    pub network: &'a str,
    pub container_id: &'a str,
    pub ifname: &'a str,
}

impl AttachmentKey<'_> {
    /// A 64-bit FNV-1a hash of the three values (each followed by a NUL, so ("ab","c") and
    /// ("a","bc") differ). It tags the attachment's endpoint-map entries and names its host
    /// veth, so DEL finds both without saved state.
    pub fn id(&self) -> u64 {
        fnv1a(
            [self.network, self.container_id, self.ifname]
                .into_iter()
                .flat_map(|p| p.bytes().chain([0])),
        )
    }

    /// Each value becomes one path component: non-empty, not `.` or `..`, no `/` or NUL.
    pub fn validate(&self) -> Result<(), BpfError> {
        for (field, value) in [
            ("network", self.network),
            ("container id", self.container_id),
            ("ifname", self.ifname),
        ] {
            if value.is_empty() || value == "." || value == ".." || value.contains(['/', '\0']) {
                return Err(BpfError::InvalidKey {
                    field,
                    value: value.to_owned(),
                });
            }
        }
        Ok(())
    }
}

/// 64-bit FNV-1a: stable across builds and platforms, which pin names and veth names need.
pub(crate) fn fnv1a(bytes: impl Iterator<Item = u8>) -> u64 {
    bytes.fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The endpoint map's key of an address (IPv4 mapped into IPv6).
pub fn endpoint_key(ip: IpAddr) -> EndpointKey {
    match ip {
        IpAddr::V4(v4) => EndpointKey::v4(v4.octets()),
        IpAddr::V6(v6) => EndpointKey::v6(v6.octets()),
    }
}

/// The address of an endpoint map key.
pub fn key_ip(key: &EndpointKey) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(key.addr);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}
