//! The members from Kubernetes: each Node object's `spec.podCIDRs` (allocated by the
//! controller manager) and its address per family (its InternalIP, or the annotation
//! [`NODE_IP_ANNOTATION`]). The Nodes are listed and watched by kube-runtime's watcher
//! (resource versions, bookmarks, a re-list after 410 Gone), authenticated by the
//! service-account token, which kube's client reads again as it rotates (at most a minute
//! late), the server verified against the service account's CA.
//!
//! Only what the routes need wakes the reconciler: each Node is reduced to its [`View`]
//! (subnets and addresses) as it arrives, and a pass runs when the members that follow
//! from the views differ from the last pass's, or every [`super::ROUTE_RESYNC`]. A re-list
//! replaces the views once it is complete, so nothing is flushed while the API server is
//! away or the list is under way.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use futures::StreamExt;
use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::ResourceExt;

use super::network::MemberRecord;
use super::routes::Members;
use crate::install::settings::SettingsError;

/// The annotation that gives a node's address on the network between the nodes, one per
/// family, comma-separated, in place of its InternalIP (a node with several interfaces).
pub const NODE_IP_ANNOTATION: &str = "ebpf-cni.io/node-ip";

/// The condition kubelet sets on a node until its network plugin clears it.
const NETWORK_UNAVAILABLE: &str = "NetworkUnavailable";

#[derive(Debug, thiserror::Error)]
pub enum KubernetesError {
    #[error("the Kubernetes API settings")]
    Settings(#[from] SettingsError),
    #[error(transparent)]
    Client(#[from] crate::kube_client::ClientError),
    #[error("reading node {node}")]
    Get { node: String, source: kube::Error },
}

impl KubernetesError {
    /// Whether asking again may succeed (the API server unreachable or refusing for now);
    /// settings and files are not.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Get { .. })
    }
}

/// What the routes need of one Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum View {
    /// Its pod subnets and its record (name and addresses).
    Member {
        subnets: Vec<IpNetwork>,
        record: MemberRecord,
    },
    /// Not a member now, and why (said once per change).
    Skipped(String),
}

/// A Node reduced to what the routes need.
pub fn view(node: &Node) -> View {
    let name = node.name_any();
    let spec = node.spec.as_ref();
    let mut cidrs: Vec<&String> = spec
        .and_then(|s| s.pod_cidrs.as_ref())
        .map(|c| c.iter().collect())
        .unwrap_or_default();
    if cidrs.is_empty() {
        cidrs.extend(spec.and_then(|s| s.pod_cidr.as_ref()));
    }
    if cidrs.is_empty() {
        return View::Skipped("no spec.podCIDRs yet".to_owned());
    }
    let mut subnets = Vec::with_capacity(cidrs.len());
    for c in cidrs {
        match c.parse::<IpNetwork>() {
            Ok(n) if n.network() == n.ip() => subnets.push(n),
            _ => return View::Skipped(format!("its pod CIDR {c:?} is not a network")),
        }
    }
    subnets.sort_by_key(|n| (n.is_ipv6(), *n));
    let mut record = MemberRecord {
        node: name,
        public_ip: None,
        public_ipv6: None,
    };
    let annotated = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODE_IP_ANNOTATION));
    if let Some(text) = annotated {
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.parse::<IpAddr>() {
                Ok(IpAddr::V4(a)) if record.public_ip.is_none() => record.public_ip = Some(a),
                Ok(IpAddr::V6(a)) if record.public_ipv6.is_none() => {
                    record.public_ipv6 = Some(a);
                }
                _ => {
                    return View::Skipped(format!(
                        "its annotation {NODE_IP_ANNOTATION} {text:?} is not one address per family"
                    ))
                }
            }
        }
    }
    let internal = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse::<IpAddr>().ok());
    if annotated.is_none() {
        for a in internal {
            match a {
                IpAddr::V4(a) if record.public_ip.is_none() => record.public_ip = Some(a),
                IpAddr::V6(a) if record.public_ipv6.is_none() => record.public_ipv6 = Some(a),
                _ => {}
            }
        }
    }
    if record.public_ip.is_none() && record.public_ipv6.is_none() {
        return View::Skipped(format!(
            "no InternalIP in status.addresses and no annotation {NODE_IP_ANNOTATION}"
        ));
    }
    View::Member { subnets, record }
}

/// The members that follow from the nodes' views.
pub fn members(views: &BTreeMap<String, View>) -> Members {
    let mut members = Members::new();
    for v in views.values() {
        if let View::Member { subnets, record } = v {
            for s in subnets {
                members.insert(*s, record.clone());
            }
        }
    }
    members
}

/// The node's own view, read once (a Node without pod CIDRs is waited for, saying so).
pub async fn own_view(client: &kube::Client, node: &str) -> Result<View, KubernetesError> {
    let api: Api<Node> = Api::all(client.clone());
    let n = api.get(node).await.map_err(|source| KubernetesError::Get {
        node: node.to_owned(),
        source,
    })?;
    Ok(view(&n))
}

/// Clears the node's `NetworkUnavailable` condition (a strategic merge patch of
/// `nodes/status`, by the condition's type), as flannel and Calico do once the node's
/// routes are in place.
pub async fn clear_network_unavailable(
    client: &kube::Client,
    node: &str,
) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let patch = serde_json::json!({
        "status": {
            "conditions": [{
                "type": NETWORK_UNAVAILABLE,
                "status": "False",
                "reason": "EbpfCniIsUp",
                "message": "ebpf-cni routes the node's pod subnets",
                "lastTransitionTime": now,
                "lastHeartbeatTime": now,
            }]
        }
    });
    api.patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map(|_| ())
}

/// How one watch event changes the views: a listing replaces them once it is complete.
fn take(
    event: Event<Node>,
    views: &mut BTreeMap<String, View>,
    listing: &mut Option<BTreeMap<String, View>>,
) {
    match event {
        Event::Init => *listing = Some(BTreeMap::new()),
        Event::InitApply(n) => {
            listing
                .get_or_insert_with(BTreeMap::new)
                .insert(n.name_any(), view(&n));
        }
        Event::InitDone => {
            if let Some(l) = listing.take() {
                *views = l;
            }
        }
        Event::Apply(n) => {
            views.insert(n.name_any(), view(&n));
        }
        Event::Delete(n) => {
            views.remove(&n.name_any());
        }
    }
}

/// Says each node skipped, once per reason.
fn say_skipped(views: &BTreeMap<String, View>, said: &mut BTreeMap<String, String>) {
    said.retain(|name, _| views.contains_key(name));
    for (name, v) in views {
        match v {
            View::Skipped(why) => {
                if said.get(name) != Some(why) {
                    log::info!("node {name} skipped: {why}");
                    said.insert(name.clone(), why.clone());
                }
            }
            View::Member { .. } => {
                said.remove(name);
            }
        }
    }
}

/// The Nodes followed until the process ends: each change in the members brought into the
/// peer routes by `reconciler`, the routes checked every `resync` without one; the node's
/// `NetworkUnavailable` cleared after the first pass that left the routes in line (tried
/// again at each pass until the API server takes it). `own_changed` is called with the
/// node's own view when it changes.
pub async fn follow(
    client: kube::Client,
    own: &str,
    reconciler: &mut super::reconciler::Reconciler<'_>,
    resync: Duration,
    mut own_changed: impl FnMut(&View),
) {
    let api: Api<Node> = Api::all(client.clone());
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut views = BTreeMap::new();
    let mut listing = None;
    // Until the first listing is complete, the routes stay as they are (an agent restart
    // must not remove its peers' routes while it lists them).
    let mut listed = false;
    let mut said = BTreeMap::new();
    let mut last: Option<Members> = None;
    let mut own_view: Option<View> = None;
    let mut cleared = false;
    let mut last_err = None;
    let mut tick = tokio::time::interval(resync);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let forced = tokio::select! {
            event = events.next() => {
                match event {
                    Some(Ok(e)) => {
                        last_err = None;
                        listed |= matches!(e, Event::InitDone);
                        take(e, &mut views, &mut listing);
                    }
                    Some(Err(e)) => {
                        let line = crate::cni::error::chain(&e);
                        if last_err.as_ref() != Some(&line) {
                            log::warn!("watching the nodes (the routes stay): {line}");
                        }
                        last_err = Some(line);
                        continue;
                    }
                    None => return,
                }
                false
            }
            _ = tick.tick() => true,
        };
        if !listed {
            continue;
        }
        say_skipped(&views, &mut said);
        if let Some(v) = views.get(own) {
            if own_view.as_ref() != Some(v) {
                own_changed(v);
                own_view = Some(v.clone());
            }
        }
        let now = members(&views);
        if !forced && last.as_ref() == Some(&now) {
            continue;
        }
        let in_line = reconciler.apply(&now);
        last = Some(now);
        if in_line && !cleared {
            match clear_network_unavailable(&client, own).await {
                Ok(()) => {
                    log::info!("node {own}: {NETWORK_UNAVAILABLE} cleared");
                    cleared = true;
                }
                Err(e) => log::warn!(
                    "clearing node {own}'s {NETWORK_UNAVAILABLE} condition (tried again at the next pass): {}",
                    crate::cni::error::chain(&e)
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_node_is_its_pod_cidrs_and_its_internal_ip_per_family() {
        let n = node(json!({
            "metadata": {"name": "a"},
            "spec": {"podCIDRs": ["fd00:10:244:1::/64", "10.244.1.0/24"]},
            "status": {"addresses": [
                {"type": "Hostname", "address": "a"},
                {"type": "ExternalIP", "address": "203.0.113.1"},
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "InternalIP", "address": "10.0.0.9"},
                {"type": "InternalIP", "address": "fd00::1"},
            ]},
        }));
        let View::Member { subnets, record } = view(&n) else {
            panic!("{:?}", view(&n));
        };
        assert_eq!(
            subnets,
            vec![
                "10.244.1.0/24".parse().unwrap(),
                "fd00:10:244:1::/64".parse().unwrap()
            ]
        );
        assert_eq!(record.public_ip, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(record.public_ipv6, Some("fd00::1".parse().unwrap()));
    }

    #[test]
    fn the_annotation_replaces_the_internal_ips() {
        let n = node(json!({
            "metadata": {"name": "a", "annotations": {NODE_IP_ANNOTATION: "192.168.9.1"}},
            "spec": {"podCIDR": "10.244.1.0/24"},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                                     {"type": "InternalIP", "address": "fd00::1"}]},
        }));
        let View::Member { subnets, record } = view(&n) else {
            panic!("{:?}", view(&n));
        };
        assert_eq!(subnets, vec!["10.244.1.0/24".parse().unwrap()]);
        assert_eq!(record.public_ip, Some("192.168.9.1".parse().unwrap()));
        assert_eq!(record.public_ipv6, None);
    }

    #[test]
    fn a_node_without_cidrs_or_an_address_is_skipped_saying_why() {
        let cases = [
            (
                json!({"metadata": {"name": "a"}, "spec": {}}),
                "no spec.podCIDRs",
            ),
            (
                json!({"metadata": {"name": "a"}, "spec": {"podCIDRs": ["10.244.1.1/24"]}}),
                "\"10.244.1.1/24\" is not a network",
            ),
            (
                json!({"metadata": {"name": "a"}, "spec": {"podCIDRs": ["10.244.1.0/24"]}}),
                "no InternalIP",
            ),
            (
                json!({"metadata": {"name": "a", "annotations": {NODE_IP_ANNOTATION: "1.2.3.4,5.6.7.8"}},
                       "spec": {"podCIDRs": ["10.244.1.0/24"]}}),
                "not one address per family",
            ),
        ];
        for (n, why) in cases {
            match view(&node(n.clone())) {
                View::Skipped(w) => assert!(w.contains(why), "{w:?} for {n}"),
                v => panic!("{v:?} for {n}"),
            }
        }
    }

    #[test]
    fn a_relisting_replaces_the_views_only_once_complete() {
        let a = node(
            json!({"metadata": {"name": "a"}, "spec": {"podCIDRs": ["10.244.1.0/24"]},
                            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}}),
        );
        let b = node(
            json!({"metadata": {"name": "b"}, "spec": {"podCIDRs": ["10.244.2.0/24"]},
                            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.2"}]}}),
        );
        let (mut views, mut listing) = (BTreeMap::new(), None);
        take(Event::Init, &mut views, &mut listing);
        take(Event::InitApply(a.clone()), &mut views, &mut listing);
        take(Event::InitApply(b.clone()), &mut views, &mut listing);
        assert!(views.is_empty());
        take(Event::InitDone, &mut views, &mut listing);
        assert_eq!(members(&views).len(), 2);
        // A re-list after 410 Gone in which b is gone: b stays until the listing is done.
        take(Event::Init, &mut views, &mut listing);
        take(Event::InitApply(a), &mut views, &mut listing);
        assert_eq!(members(&views).len(), 2);
        take(Event::InitDone, &mut views, &mut listing);
        assert_eq!(members(&views).len(), 1);
        take(Event::Delete(b), &mut views, &mut listing);
        assert_eq!(members(&views).len(), 1);
    }
}
