//! What one reconcile reads: the stores' objects at one moment, those that do not decode set apart.
//! [`crate::reconcile`] decides from it and [`crate::integrity`] checks it; neither is needed to read it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use netwave_api::{NetworkConfigInputs, NetworkConfigRevision, NodeNetworkConfig, RevisionInputs};
use netwave_core::undecodable::{self, Holds, Kind, Undecodable};
use netwave_runtime::decoded::Decoded;

use crate::watch::Stores;

/// Everything a reconcile reads, taken from the stores at one moment.
#[derive(Clone, Default)]
pub struct Snapshot {
    pub vrfs: Vec<Arc<netwave_api::VRFRouteConfiguration>>,
    pub layer2s: Vec<Arc<netwave_api::Layer2NetworkConfiguration>>,
    pub routing_tables: Vec<Arc<netwave_api::RoutingTable>>,
    pub bgp_peerings: Vec<Arc<netwave_api::BGPPeering>>,
    pub mirror_targets: Vec<Arc<netwave_api::MirrorTarget>>,
    pub mirror_selectors: Vec<Arc<netwave_api::MirrorSelector>>,
    pub nodes: Vec<Arc<Node>>,
    pub node_configs: Vec<Arc<NodeNetworkConfig>>,
    pub revisions: Vec<Arc<NetworkConfigRevision>>,
    /// The revisions' inputs, each under its revision's name.
    pub revision_inputs: Vec<Arc<NetworkConfigInputs>>,
    /// Live objects of the kinds above that do not decode (not in those lists), with their uid.
    pub undecodable: Vec<(Undecodable, Option<String>)>,
}

impl Snapshot {
    pub fn take(stores: &Stores) -> Self {
        let mut bad = Vec::new();
        Snapshot {
            vrfs: decoded(stores.vrfs.state(), Kind::Vrf, &mut bad),
            layer2s: decoded(stores.layer2s.state(), Kind::Layer2, &mut bad),
            routing_tables: decoded(stores.routing_tables.state(), Kind::RoutingTable, &mut bad),
            bgp_peerings: decoded(stores.bgp_peerings.state(), Kind::BgpPeering, &mut bad),
            mirror_targets: decoded(stores.mirror_targets.state(), Kind::MirrorTarget, &mut bad),
            mirror_selectors: decoded(
                stores.mirror_selectors.state(),
                Kind::MirrorSelector,
                &mut bad,
            ),
            nodes: stores.nodes.state(),
            node_configs: decoded(stores.node_configs.state(), Kind::NodeConfig, &mut bad),
            revisions: decoded(stores.revisions.state(), Kind::Revision, &mut bad),
            revision_inputs: decoded(
                stores.revision_inputs.state(),
                Kind::RevisionInputs,
                &mut bad,
            ),
            undecodable: bad,
        }
    }

    /// What the objects that do not decode hold back.
    pub fn holds(&self) -> Holds {
        let bad: Vec<Undecodable> = self.undecodable.iter().map(|(u, _)| u.clone()).collect();
        undecodable::holds(&bad)
    }

    /// The inputs object of the revision `name`, if it is there.
    pub fn inputs_object(&self, name: &str) -> Option<&NetworkConfigInputs> {
        self.revision_inputs
            .iter()
            .find(|i| i.metadata.name.as_deref() == Some(name) && live(i.as_ref()))
            .map(AsRef::as_ref)
    }

    /// The inputs of the revision `name`, if they are there.
    pub fn inputs_of(&self, name: &str) -> Option<&RevisionInputs> {
        self.inputs_object(name).map(|i| &i.spec)
    }
}

/// The objects of one kind that decode; the live ones that do not go to `bad`.
fn decoded<K>(
    objects: Vec<Arc<Decoded<K>>>,
    kind: Kind,
    bad: &mut Vec<(Undecodable, Option<String>)>,
) -> Vec<Arc<K>> {
    let mut out = Vec::with_capacity(objects.len());
    for o in objects {
        match o.as_ref() {
            Decoded::Object(k) => out.push(k.clone()),
            Decoded::Undecodable(u) if u.metadata.deletion_timestamp.is_none() => bad.push((
                Undecodable {
                    kind,
                    name: u.metadata.name.clone().unwrap_or_default(),
                    error: u.error.clone(),
                },
                u.metadata.uid.clone(),
            )),
            Decoded::Undecodable(_) => {}
        }
    }
    out
}

/// Not being deleted, and named.
pub(crate) fn live<K: Resource>(o: &K) -> bool {
    o.meta().deletion_timestamp.is_none() && o.meta().name.is_some()
}
