//! A simulated API store: the objects the configurator and the agents read and write, reduced to what
//! the rollout looks at. A leader applies [`Write`]s to it one at a time; agents write NNC status; tests
//! build scenarios with its helpers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use thiserror::Error;

use crate::rollout::hold::Footprints;
use crate::rollout::{
    AgentPhase, AgentReport, AssignedSpec, NodeConfigState, NodeState, PolicyDefaults,
    RenderedHashes, RevisionState, RolloutInput, Write, revisions_to_render,
};
use crate::sym::Sym;
use crate::types::{Sequence, Timestamp};

/// A write the API server would reject (the leader's view was stale).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    #[error("NetworkConfigRevision {0} not found")]
    RevisionNotFound(String),
    #[error("NodeNetworkConfig {0} not found")]
    ConfigNotFound(String),
    #[error("NodeNetworkConfig {0} already exists")]
    ConfigExists(String),
}

/// Every object of a simulated cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Store {
    pub defaults: PolicyDefaults,
    pub revisions: BTreeMap<String, RevisionState>,
    pub nodes: BTreeMap<String, NodeState>,
    pub configs: BTreeMap<String, NodeConfigState>,
    /// Configs in the store that the leader cannot decode: left out of its input, named in
    /// `RolloutInput::unreadable_configs`.
    pub unreadable_configs: BTreeSet<String>,
    /// What the agents of nodes without a config declare (`RolloutInput::unassigned_agents`).
    pub unassigned_agents: BTreeMap<Sym, netwave_api::features::FeatureSet>,
    /// What "render" gives per revision and node (the simulation's stand-in for `core::render`).
    pub rendered: RenderedHashes,
    /// What each revision puts on the nodes (the stand-in for `Footprint::of`); a revision without one
    /// is not measured for the destructive-change hold.
    pub footprints: Footprints,
    /// What moving the nodes to a revision's rendering takes off them (the stand-in for the
    /// configurator's measure, [`crate::rollout::loss`]); given to the step as it is.
    pub move_losses: BTreeMap<String, Arc<crate::rollout::loss::MoveLoss>>,
    /// Revisions that were complete at some point (a reactivation resets the status, not the proof).
    pub proven: BTreeSet<String>,
}

impl Store {
    /// A store with `names` Ready nodes and no revision.
    pub fn with_nodes<S: AsRef<str>>(names: &[S]) -> Store {
        let mut s = Store::default();
        for n in names {
            s.add_node(n.as_ref(), BTreeMap::new());
        }
        s
    }

    pub fn add_node(&mut self, name: &str, labels: BTreeMap<String, String>) -> &mut NodeState {
        self.nodes.insert(
            name.to_string(),
            NodeState {
                name: name.into(),
                labels,
                ready: true,
                unschedulable: false,
            },
        );
        self.nodes.get_mut(name).expect("just inserted")
    }

    /// Adds a revision whose config for every node (current and future, see [`Store::hash_of`]) hashes
    /// to `"<name>"`.
    pub fn add_revision(&mut self, name: &str, sequence: u64) -> &mut RevisionState {
        self.revisions.insert(
            name.to_string(),
            RevisionState {
                name: name.into(),
                generation: Some(1),
                sequence: Sequence(sequence),
                hash: format!("sha-{name}"),
                ..RevisionState::default()
            },
        );
        self.revisions.get_mut(name).expect("just inserted")
    }

    /// A joining node given a proven revision: nothing of ours ran there yet (no last good revision,
    /// not judged Invalid), and its spec names a revision that is or was complete (the last good one
    /// when it was assigned). It took no budget slot, also once its agent reports `Provisioning` on
    /// the way to its first config, so the budget invariant does not count it.
    pub fn joining(&self, config: &crate::rollout::NodeConfigState) -> bool {
        config.status.last_good_revision.is_none()
            && config.status.phase != Some(crate::rollout::AgentPhase::Invalid)
            && (self.proven.contains(config.spec.revision.as_str())
                || self
                    .revisions
                    .get(config.spec.revision.as_str())
                    .is_some_and(|r| {
                        r.status.completed_at.is_some()
                            || r.status.phase.as_deref()
                                == Some(crate::rollout::Phase::Complete.as_str())
                    }))
    }

    pub fn revision(&mut self, name: &str) -> &mut RevisionState {
        self.revisions.get_mut(name).expect("no such revision")
    }

    pub fn node(&mut self, name: &str) -> &mut NodeState {
        self.nodes.get_mut(name).expect("no such node")
    }

    pub fn config(&self, name: &str) -> Option<&NodeConfigState> {
        self.configs.get(name)
    }

    /// The rendered hash of `revision` for `node`: an explicit entry in `rendered`, else the revision
    /// name (every node gets the same config).
    pub fn hash_of(&self, revision: &str, node: &str) -> Sym {
        self.rendered
            .get(revision, node)
            .cloned()
            .unwrap_or_else(|| format!("cfg-{revision}").into())
    }

    /// The node runs `revision` and its agent reported it: spec, `Provisioned`, lastGood, hash.
    pub fn set_running(&mut self, node: &str, revision: &str, assigned_at: Timestamp) {
        let hash = self.hash_of(revision, node);
        let rev = &self.revisions[revision];
        self.configs.insert(
            node.to_string(),
            NodeConfigState {
                name: node.into(),
                spec: AssignedSpec {
                    revision: revision.into(),
                    sequence: rev.sequence,
                    config_hash: hash.clone(),
                    retry: rev.retry,
                    assigned_at: Some(assigned_at),
                },
                status: AgentReport {
                    phase: Some(AgentPhase::Provisioned),
                    observed_revision: Some(revision.into()),
                    observed_retry: Some(rev.retry),
                    observed_config_hash: Some(hash.clone()),
                    config_hash: Some(hash),
                    last_good_revision: Some(revision.into()),
                    reason: None,
                    message: None,
                    started_at: None,
                    features: netwave_api::features::FeatureSet::all(),
                },
                record: Default::default(),
            },
        );
    }

    /// The node's spec says `revision` (assigned at `at`) but its agent has not reported on it yet.
    pub fn set_assigned(&mut self, node: &str, revision: &str, at: Timestamp) {
        let hash = self.hash_of(revision, node);
        let rev = &self.revisions[revision];
        let (sequence, retry) = (rev.sequence, rev.retry);
        let cfg = self
            .configs
            .entry(node.to_string())
            .or_insert_with(|| NodeConfigState {
                name: node.into(),
                ..NodeConfigState::default()
            });
        cfg.spec = AssignedSpec {
            revision: revision.into(),
            sequence,
            config_hash: hash,
            retry,
            assigned_at: Some(at),
        };
    }

    /// The agent of `node` reports on its current spec: `Provisioned` (now runs the spec's config) or
    /// `Invalid` (restored `lastGood`, runs its config). Returns false if the node has no config.
    pub fn agent_reports(&mut self, node: &str, phase: AgentPhase, reason: Option<&str>) -> bool {
        let Some(cfg) = self.configs.get(node) else {
            return false;
        };
        let spec = cfg.spec.clone();
        let last_good = cfg.status.last_good_revision.clone();
        let running = match phase {
            AgentPhase::Provisioned => Some(spec.config_hash.clone()),
            AgentPhase::Invalid => last_good.as_deref().map(|lg| self.hash_of(lg, node)),
            _ => cfg.status.config_hash.clone(),
        };
        let cfg = self.configs.get_mut(node).expect("checked");
        cfg.status.last_good_revision = if phase == AgentPhase::Provisioned {
            Some(spec.revision.clone())
        } else {
            last_good
        };
        cfg.status.started_at = None;
        cfg.status.phase = Some(phase);
        cfg.status.observed_revision = Some(spec.revision);
        cfg.status.observed_retry = Some(spec.retry);
        // As the agent does: a verdict names the config it answers.
        cfg.status.observed_config_hash = Some(spec.config_hash.clone());
        cfg.status.config_hash = running;
        cfg.status.reason = reason.map(str::to_string);
        true
    }

    /// The agent of `node` starts applying its current spec at `at` (its clock): `Provisioning` for
    /// the spec's revision, retry and config, with `lastTransitionTime` `at`. Returns false if the
    /// node has no config.
    pub fn agent_starts(&mut self, node: &str, at: Timestamp) -> bool {
        let Some(cfg) = self.configs.get_mut(node) else {
            return false;
        };
        cfg.status.phase = Some(AgentPhase::Provisioning);
        cfg.status.observed_revision = Some(cfg.spec.revision.clone());
        cfg.status.observed_retry = Some(cfg.spec.retry);
        cfg.status.observed_config_hash = Some(cfg.spec.config_hash.clone());
        cfg.status.reason = None;
        cfg.status.started_at = Some(at);
        true
    }

    /// What a leader builds from its caches: everything, with rendered hashes for the revisions
    /// [`revisions_to_render`] names.
    pub fn input(&self) -> RolloutInput {
        let mut input = RolloutInput {
            defaults: self.defaults.clone(),
            revisions: self.revisions.values().cloned().collect(),
            nodes: Arc::new(self.nodes.values().cloned().map(Arc::new).collect()),
            configs: Arc::new(
                self.configs
                    .values()
                    .filter(|c| !self.unreadable_configs.contains(c.name.as_str()))
                    .cloned()
                    .map(Arc::new)
                    .collect(),
            ),
            unreadable_configs: self.unreadable_configs.clone(),
            unassigned_agents: self.unassigned_agents.clone(),
            rendered: RenderedHashes::default(),
            footprints: Footprints::default(),
            move_losses: self.move_losses.clone(),
        };
        for rev in revisions_to_render(&input) {
            if let Some(f) = self.footprints.get(&rev) {
                input.footprints.insert(rev.clone(), f.clone());
            }
            if let Some(needs) = self.rendered.needs_of(&rev) {
                input.rendered.set_needs(rev.clone(), needs.clone());
            }
            // Share a complete explicit rendering; otherwise fill in the defaults.
            if let Some(m) = self.rendered.revision(&rev)
                && self.nodes.keys().all(|n| m.contains_key(n.as_str()))
            {
                input.rendered.set_revision(rev, m.clone());
                continue;
            }
            let hashes: BTreeMap<Sym, Sym> = self
                .nodes
                .keys()
                .map(|n| (Sym::from(n), self.hash_of(&rev, n)))
                .collect();
            input.rendered.set_revision(rev, hashes);
        }
        input
    }

    /// [`Store::input`], sharing every node and config that did not change since `before` (the very
    /// same objects, as the configurator's inputs share what it did not convert again): what a
    /// [`StepMemo`](crate::rollout::StepMemo) kept across steps sees.
    pub fn input_sharing(&self, before: &RolloutInput) -> RolloutInput {
        let mut input = self.input();
        share_unchanged(
            &before.nodes,
            Arc::make_mut(&mut input.nodes).as_mut_slice(),
            |n| &n.name,
        );
        share_unchanged(
            &before.configs,
            Arc::make_mut(&mut input.configs).as_mut_slice(),
            |c| &c.name,
        );
        input
    }

    /// Applies one write as the API server would.
    pub fn apply(&mut self, write: Write<'_>) -> Result<(), StoreError> {
        match write {
            Write::Record(r) => {
                let cfg = self
                    .configs
                    .get_mut(&r.node)
                    .ok_or_else(|| StoreError::ConfigNotFound(r.node.clone()))?;
                cfg.record = r.record.clone();
            }
            Write::Hold(h) => {
                let rev = self
                    .revisions
                    .get_mut(&h.revision)
                    .ok_or_else(|| StoreError::RevisionNotFound(h.revision.clone()))?;
                h.apply(rev);
            }
            Write::Status(u) => {
                let rev = self
                    .revisions
                    .get_mut(&u.revision)
                    .ok_or_else(|| StoreError::RevisionNotFound(u.revision.clone()))?;
                rev.status = (*u.status).clone();
                if rev.status.completed_at.is_some()
                    || rev.status.phase.as_deref() == Some(crate::rollout::Phase::Complete.as_str())
                {
                    self.proven.insert(u.revision.clone());
                }
            }
            Write::Assign(a) => {
                let spec = a.spec();
                match (self.configs.get_mut(a.node.as_str()), a.create) {
                    (Some(_), true) => return Err(StoreError::ConfigExists(a.node.to_string())),
                    (None, false) => return Err(StoreError::ConfigNotFound(a.node.to_string())),
                    (Some(cfg), false) => cfg.spec = spec,
                    (None, true) => {
                        self.configs.insert(
                            a.node.to_string(),
                            NodeConfigState {
                                name: a.node.clone(),
                                spec,
                                status: AgentReport::default(),
                                record: Default::default(),
                            },
                        );
                    }
                }
            }
            Write::DeleteConfig(name) => {
                self.configs
                    .remove(name)
                    .ok_or_else(|| StoreError::ConfigNotFound(name.to_string()))?;
            }
            Write::DeleteRevision(name) => {
                self.revisions
                    .remove(name)
                    .ok_or_else(|| StoreError::RevisionNotFound(name.to_string()))?;
            }
        }
        Ok(())
    }

    /// Applies every write of a plan, in order, stopping at the first the store rejects.
    pub fn apply_plan(&mut self, plan: &crate::rollout::Plan) -> Result<(), StoreError> {
        for w in plan.writes() {
            self.apply(w)?;
        }
        Ok(())
    }
}

/// Puts `before`'s object in place of every object of `now` equal to it.
fn share_unchanged<T: PartialEq>(before: &[Arc<T>], now: &mut [Arc<T>], name: impl Fn(&T) -> &Sym) {
    let by_name: BTreeMap<&Sym, &Arc<T>> = before.iter().map(|b| (name(b), b)).collect();
    for n in now.iter_mut() {
        if let Some(b) = by_name.get(name(n)).filter(|b| ****b == **n) {
            *n = Arc::clone(b);
        }
    }
}
