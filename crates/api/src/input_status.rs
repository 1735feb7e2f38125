//! The status the configurator writes on every input object (VRFRouteConfiguration,
//! Layer2NetworkConfiguration, RoutingTable), so `kubectl get vrf,l2,rt` and `kubectl describe` tell an
//! admin whether an object made it into the rollout, on how many nodes, with which table:
//!
//! ```text
//!   configurator: fleet validation of the current inputs + nodes ──► status (status subresource,
//!                 field manager netwave-configurator, written only when it changes)
//!     conditions[Accepted]  True  / Valid            no problem with this object
//!                           False / Invalid          this object's own or cross-object errors, with paths
//!                           False / RevisionInvalid  this object is fine; the revision fails elsewhere,
//!                                                    or the inputs cannot become one (too large)
//!     selectedNodes         nodes its nodeSelector matches now
//!     tableId               VRFs only: the kernel table, explicit or allocated
//!     revision              the revision cut from the inputs this status judges
//! ```
//!
//! Permissive like every status schema here (strings, no enums): a rollback of netwave never makes a
//! stored status invalid.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::vocab::accepted_reasons;
/// The condition type on every input object.
pub use crate::vocab::input_conditions::ACCEPTED;

/// What the configurator found about one input object. Written by the configurator only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct InputStatus {
    /// `Accepted`: the per-object and cross-object validation result against the current nodes, with
    /// field paths.
    pub conditions: Vec<Condition>,
    /// Nodes this object's `nodeSelector` matches now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selected_nodes: Option<u32>,
    /// VRFs: the kernel routing table, `spec.tableId` or the one allocated from the VRF name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table_id: Option<u32>,
    /// MirrorTargets only: the MirrorSelectors that send to it (das-schiff's `activeSelectors`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_selectors: Option<u32>,
    /// MirrorTargets only: the nodes its tunnel is on (das-schiff's `activeNodes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_nodes: Option<u32>,
    /// The NetworkConfigRevision cut from the inputs this status judges (none when they cannot become
    /// one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// `metadata.generation` of the spec this status judges.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl InputStatus {
    /// The `Accepted` condition, when there is one.
    pub fn accepted(&self) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == ACCEPTED)
    }
}
