//! A leader and its agents in memory (`testing::inmem`): reconciles applied as the watches deliver
//! them, agents answering as real ones do (`netwave_agent::sim`). Shared by the in-memory tests.
#![allow(dead_code)]

use std::sync::Arc;

use netwave_agent::sim::{Answer, status_for};
use netwave_api::NodeNetworkConfigStatus;
use netwave_configurator::decide::{Outcome, Settings, compute};
use netwave_configurator::memory::Memory;
use netwave_configurator::snapshot::Snapshot;
use netwave_configurator::testing::inmem::{self, apply};
use netwave_core::Timestamp;
use netwave_core::revision::InputSettle;

pub struct Leader {
    pub settings: Settings,
    pub cache: Memory,
    pub settle: InputSettle,
    pub now: Timestamp,
}

impl Leader {
    pub fn new() -> Leader {
        Leader {
            settings: inmem::settings(),
            cache: Memory::default(),
            settle: InputSettle::default(),
            now: Timestamp(1_800_000_000_000),
        }
    }

    /// One reconcile, its intents applied to `s` as the watches deliver them; 2 s pass.
    pub fn reconcile(&mut self, s: &mut Snapshot) -> Outcome {
        let out = compute(
            s,
            &self.settings,
            &mut self.cache,
            &mut self.settle,
            self.now,
        );
        apply(s, out.intents.clone(), self.now);
        self.now = Timestamp(self.now.0 + 2_000);
        out
    }
}

/// Every agent whose spec is not answered yet answers what `answer` says for its node.
pub fn answer(s: &mut Snapshot, answer: impl Fn(&str) -> Answer) {
    for c in s.node_configs.iter_mut() {
        if c.spec.is_placeholder() {
            continue;
        }
        // Answered already: the status reports on this very spec.
        let st = c.status.clone().unwrap_or_default();
        if st.observed_revision.as_deref() == Some(c.spec.revision.as_str())
            && st.observed_retry == Some(c.spec.retry)
            && st.observed_config_hash.as_deref() == Some(c.spec.config_hash.as_str())
        {
            continue;
        }
        let node = c.metadata.name.clone().unwrap_or_default();
        let Some(v) = status_for(c, &answer(&node)) else {
            continue;
        };
        let status: NodeNetworkConfigStatus =
            serde_json::from_value(v["status"].clone()).expect("the simulated status parses");
        Arc::make_mut(c).status = Some(status);
    }
}

/// Every agent answers `Provisioned`.
pub fn provisioned(_: &str) -> Answer {
    Answer::Provisioned
}

/// `status.phase` of the revision `name`.
pub fn phase_of(s: &Snapshot, name: &str) -> Option<String> {
    let r = s
        .revisions
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(name))?;
    r.status.as_ref()?.phase.clone()
}
