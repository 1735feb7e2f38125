//! Durable agent state in the state dir (a hostPath, so it survives agent restarts and node reboots):
//!
//! - `last-good.json`: the last config that applied and passed health checks, its revision and config
//!   hash, a generation that grows with every save, and a sha256 checksum over all of that. A file that
//!   does not parse, whose checksum does not match, or whose generation is wrong (0, which no save
//!   writes, or older than one this agent process already read or wrote: an older copy put back) is
//!   [`BackupError::Corrupt`]: never applied, and the agent refuses every apply until an admin moves it
//!   aside (then the node has no last good config, as a new node).
//! - `applying.json`: written before every apply and removed after its outcome is settled. Finding it at
//!   start means the agent died mid-apply: restore the last good config first.
//! - `interrupted.json`: which apply was interrupted, and how often (one interruption is retried).
//! - `rejected.json`: the last revision and retry judged `Invalid`, with reason and message.
//! - `held.json`: the rendering the node runs while this agent's own rendering of the same last good
//!   config has not passed the health gate (an agent upgrade, `reconcile::Agent::upgrade_gate`):
//!   the kernel objects and FRR text found before the gated apply. Restores and drift repair go back
//!   to it, never to a rendering the node did not run. Written before that apply, removed once a
//!   rendering of this agent passed the gate.
//! - `rendered.json`: the digest of the rendering that last passed the gate, with its revision and
//!   configHash: tells an agent at start whether a difference is drift or its own new rendering.
//!
//! Every write is atomic (omicron's ledger pattern): write a temp file, fsync it, rename it over the
//! target, fsync the directory. A crash leaves either the old or the new file, never a torn one.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use netwave_api::NodeConfig;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub const LAST_GOOD_FILE: &str = "last-good.json";
pub const APPLYING_FILE: &str = "applying.json";
/// Which revision's apply was interrupted, and how often: an interruption is retried once, not judged.
pub const INTERRUPTED_FILE: &str = "interrupted.json";
/// The last revision (and retry) this node judged `Invalid`: a restart before that verdict reached the
/// API server reports it again instead of applying the bad config a second time.
pub const REJECTED_FILE: &str = "rejected.json";

/// The node's running rendering while an agent upgrade's differs from it (see the module doc).
pub const HELD_FILE: &str = "held.json";
/// Which rendering of the last good config the node runs: its [`rendering_digest`], written by every
/// apply that passed the gate. A kernel that differs from the same rendering has drifted (repaired
/// as drift); one that differs from another rendering is an agent upgrade's to gate.
pub const RENDERED_FILE: &str = "rendered.json";

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("creating state dir {path}: {source}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is corrupt ({why}); it will not be applied")]
    Corrupt { path: PathBuf, why: String },
}

/// The last config this node ran healthily.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastGood {
    pub revision: String,
    pub config_hash: String,
    pub config: NodeConfig,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LastGoodFile {
    generation: u64,
    #[serde(flatten)]
    last_good: LastGood,
    /// Hex sha256 of the canonical JSON of `{generation, revision, configHash, config}`.
    checksum: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Checked<'a> {
    generation: u64,
    last_good: &'a LastGood,
}

fn checksum(generation: u64, last_good: &LastGood) -> String {
    let bytes = serde_json::to_vec(&Checked {
        generation,
        last_good,
    })
    .expect("state always serializes");
    hex::encode(Sha256::digest(bytes))
}

/// What was being applied when the marker was written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Applying {
    pub revision: String,
    pub retry: u32,
    pub config_hash: String,
    /// Earlier applies of this revision and retry that were interrupted (agent killed, node rebooted).
    #[serde(default)]
    pub interruptions: u32,
    /// Links this apply or its restore may create or recreate (no one else held them when the marker
    /// was written). The kernel cannot create a link and set its ownership alias in one request, so an
    /// agent killed between the two leaves an unmarked link it made; recovery adopts exactly these
    /// names, never any other unmarked link.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub creating: Vec<String>,
    /// The apply was this agent's rendering of the last good config under the gate (an upgrade,
    /// [`Held`]), not an assignment: an interruption is no verdict on the revision.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub upgrade: bool,
}

/// The rendering an apply that passed the gate left on the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rendered {
    pub revision: String,
    pub config_hash: String,
    /// [`rendering_digest`] of it.
    pub rendering: String,
}

/// What the node ran when an agent that renders the same config differently started: held while that
/// rendering goes through the health gate, and after the gate refused it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Held {
    /// The last good config this rendering is of (its revision and configHash).
    pub revision: String,
    pub config_hash: String,
    /// The managed kernel objects found.
    #[serde(with = "dataplane_json")]
    pub dataplane: netwave_core::dataplane::Dataplane,
    /// FRR's config file found (FRR on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frr: Option<String>,
    /// Set once the gate refused the new rendering: which rendering, under which probes, by which
    /// agent version, and why. An agent with that same rendering and probes does not try again on a
    /// restart (it would cut the node again to learn the same); one that renders otherwise (another
    /// release, other flags) or probes otherwise does, and so does any agent once this file is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<Refusal>,
}

/// Hex sha256 of a rendering: the kernel objects (as [`Held`] stores them) and FRR's text.
pub fn rendering_digest(dp: &netwave_core::dataplane::Dataplane, frr: Option<&str>) -> String {
    #[derive(Serialize)]
    struct Rendering<'a> {
        #[serde(with = "dataplane_json")]
        dataplane: &'a netwave_core::dataplane::Dataplane,
        frr: Option<&'a str>,
    }
    let bytes =
        serde_json::to_vec(&Rendering { dataplane: dp, frr }).expect("state always serializes");
    hex::encode(Sha256::digest(bytes))
}

/// A [`Dataplane`](netwave_core::dataplane::Dataplane) as JSON, whose object keys must be strings:
/// its routes (keyed by table and prefix) as a list of pairs.
mod dataplane_json {
    use std::collections::{BTreeMap, BTreeSet};

    use netwave_core::dataplane::{Dataplane, Link, MirrorFilter, RouteAction, RouteKey, Rule};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Repr {
        links: BTreeMap<String, Link>,
        routes: Vec<(RouteKey, RouteAction)>,
        rules: BTreeSet<Rule>,
        #[serde(default)]
        mirrors: BTreeSet<MirrorFilter>,
    }

    pub fn serialize<S: Serializer>(dp: &Dataplane, s: S) -> Result<S::Ok, S::Error> {
        Repr {
            links: dp.links.clone(),
            routes: dp.routes.clone().into_iter().collect(),
            rules: dp.rules.clone(),
            mirrors: dp.mirrors.clone(),
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Dataplane, D::Error> {
        let r = Repr::deserialize(d)?;
        Ok(Dataplane {
            links: r.links,
            routes: r.routes.into_iter().collect(),
            rules: r.rules,
            mirrors: r.mirrors,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Refusal {
    /// [`rendering_digest`] of the refused rendering.
    pub rendering: String,
    /// Hex sha256 of the health config the gate probed with: other probes (the admin fixed one) are
    /// worth another try.
    #[serde(default)]
    pub probes: String,
    pub agent_version: String,
    pub reason: String,
    pub message: String,
}

/// A verdict of `Invalid` on one revision and retry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rejected {
    pub revision: String,
    pub retry: u32,
    pub reason: String,
    pub message: String,
}

/// The agent's state directory.
#[derive(Clone, Debug)]
pub struct StateDir {
    dir: PathBuf,
    /// The newest backup generation this process read or wrote (shared by clones): a file with an
    /// older one was put back from an older copy.
    generation: Arc<AtomicU64>,
}

impl StateDir {
    pub fn open(dir: impl Into<PathBuf>) -> Result<StateDir, BackupError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| BackupError::CreateDir {
            path: dir.clone(),
            source,
        })?;
        Ok(StateDir {
            dir,
            generation: Arc::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The last good config, `None` when there is none yet.
    pub fn load_last_good(&self) -> Result<Option<LastGood>, BackupError> {
        Ok(self.load_file()?.map(|f| f.last_good))
    }

    fn load_file(&self) -> Result<Option<LastGoodFile>, BackupError> {
        let path = self.dir.join(LAST_GOOD_FILE);
        let Some(bytes) = read_opt(&path)? else {
            return Ok(None);
        };
        let file: LastGoodFile =
            serde_json::from_slice(&bytes).map_err(|e| BackupError::Corrupt {
                path: path.clone(),
                why: format!("not a backup file: {e}"),
            })?;
        let want = checksum(file.generation, &file.last_good);
        if want != file.checksum {
            return Err(BackupError::Corrupt {
                path,
                why: format!("checksum {} does not match content {want}", file.checksum),
            });
        }
        let newest = self.generation.load(Ordering::Acquire);
        if file.generation == 0 || file.generation < newest {
            let why = if file.generation == 0 {
                "generation 0, which no agent writes (the first save is generation 1)".to_string()
            } else {
                format!(
                    "generation {} is older than generation {newest}, which this agent process \
                     already read or wrote: an older copy was put back",
                    file.generation
                )
            };
            return Err(BackupError::Corrupt { path, why });
        }
        self.generation.fetch_max(file.generation, Ordering::AcqRel);
        Ok(Some(file))
    }

    /// Saves `last_good` atomically with the next generation. A corrupt previous file is overwritten.
    pub fn save_last_good(&self, last_good: &LastGood) -> Result<(), BackupError> {
        let generation = match self.load_file() {
            Ok(Some(f)) => f.generation + 1,
            _ => 1,
        };
        let file = LastGoodFile {
            generation,
            checksum: checksum(generation, last_good),
            last_good: last_good.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&file).expect("state always serializes");
        self.write_atomic(LAST_GOOD_FILE, &bytes)?;
        // A fresh start (no file, or a corrupt one replaced) may go back to generation 1.
        self.generation.store(generation, Ordering::Release);
        Ok(())
    }

    /// Writes the applying marker (before any kernel change).
    pub fn mark_applying(&self, applying: &Applying) -> Result<(), BackupError> {
        let bytes = serde_json::to_vec(applying).expect("state always serializes");
        self.write_atomic(APPLYING_FILE, &bytes)
    }

    /// The applying marker, if an apply did not finish. An unreadable marker still means an apply was
    /// interrupted; it comes back with empty fields.
    pub fn applying(&self) -> Result<Option<Applying>, BackupError> {
        let path = self.dir.join(APPLYING_FILE);
        Ok(read_opt(&path)?.map(|b| {
            serde_json::from_slice(&b).unwrap_or(Applying {
                revision: String::new(),
                retry: 0,
                config_hash: String::new(),
                interruptions: 0,
                creating: Vec::new(),
                upgrade: false,
            })
        }))
    }

    /// Records that an apply was interrupted (read back by the next apply of the same revision).
    pub fn save_interrupted(&self, interrupted: &Applying) -> Result<(), BackupError> {
        let bytes = serde_json::to_vec(interrupted).expect("state always serializes");
        self.write_atomic(INTERRUPTED_FILE, &bytes)
    }

    /// The interruption record, if any; an unreadable one reads as none (it only grants a retry).
    pub fn interrupted(&self) -> Result<Option<Applying>, BackupError> {
        let path = self.dir.join(INTERRUPTED_FILE);
        Ok(read_opt(&path)?.and_then(|b| serde_json::from_slice(&b).ok()))
    }

    pub fn save_rejected(&self, rejected: &Rejected) -> Result<(), BackupError> {
        let bytes = serde_json::to_vec(rejected).expect("state always serializes");
        self.write_atomic(REJECTED_FILE, &bytes)
    }

    /// The last verdict, if any; an unreadable one reads as none (the revision is then applied again,
    /// which is what happened before this record existed).
    pub fn rejected(&self) -> Result<Option<Rejected>, BackupError> {
        let path = self.dir.join(REJECTED_FILE);
        Ok(read_opt(&path)?.and_then(|b| serde_json::from_slice(&b).ok()))
    }

    pub fn save_held(&self, held: &Held) -> Result<(), BackupError> {
        let bytes = serde_json::to_vec(held).expect("state always serializes");
        self.write_atomic(HELD_FILE, &bytes)
    }

    /// The held rendering, if any. One that does not parse is an error: it is what a restore goes
    /// back to, and guessing another would apply what the node did not run.
    pub fn held(&self) -> Result<Option<Held>, BackupError> {
        let path = self.dir.join(HELD_FILE);
        let Some(bytes) = read_opt(&path)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| BackupError::Corrupt {
                path,
                why: format!("not a held rendering: {e}"),
            })
    }

    pub fn save_rendered(&self, rendered: &Rendered) -> Result<(), BackupError> {
        let bytes = serde_json::to_vec(rendered).expect("state always serializes");
        self.write_atomic(RENDERED_FILE, &bytes)
    }

    /// The rendering record, if any; an unreadable one reads as none (the start-up gate then gates
    /// any difference, which is what it did before this record existed).
    pub fn rendered(&self) -> Result<Option<Rendered>, BackupError> {
        let path = self.dir.join(RENDERED_FILE);
        Ok(read_opt(&path)?.and_then(|b| serde_json::from_slice(&b).ok()))
    }

    pub fn clear_held(&self) -> Result<(), BackupError> {
        self.remove(HELD_FILE)
    }

    pub fn clear_interrupted(&self) -> Result<(), BackupError> {
        self.remove(INTERRUPTED_FILE)
    }

    pub fn clear_applying(&self) -> Result<(), BackupError> {
        self.remove(APPLYING_FILE)
    }

    fn remove(&self, name: &str) -> Result<(), BackupError> {
        let path = self.dir.join(name);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(BackupError::Write { path, source }),
        }
        self.sync_dir()
    }

    fn sync_dir(&self) -> Result<(), BackupError> {
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| BackupError::Write {
                path: self.dir.clone(),
                source,
            })
    }

    fn write_atomic(&self, name: &str, bytes: &[u8]) -> Result<(), BackupError> {
        let path = self.dir.join(name);
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let err = |source| BackupError::Write {
            path: path.clone(),
            source,
        };
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(err)?;
        f.write_all(bytes).map_err(err)?;
        f.sync_all().map_err(err)?;
        drop(f);
        fs::rename(&tmp, &path).map_err(err)?;
        self.sync_dir()
    }
}

fn read_opt(path: &Path) -> Result<Option<Vec<u8>>, BackupError> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(BackupError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netwave_api::Layer2Config;
    use netwave_api::vocab::NodeReason;

    fn good(rev: &str) -> LastGood {
        LastGood {
            revision: rev.into(),
            config_hash: format!("hash-{rev}"),
            config: NodeConfig {
                layer2s: vec![Layer2Config {
                    anycast_gateways: vec!["10.0.0.1/24".into()],
                    ..Layer2Config::segment(10, 1010).with_mtu(1500)
                }],
                ..NodeConfig::default()
            },
        }
    }

    #[test]
    fn round_trip_and_generation_grows() {
        let t = tempfile::tempdir().unwrap();
        let s = StateDir::open(t.path().join("state")).unwrap();
        assert_eq!(s.load_last_good().unwrap(), None);
        s.save_last_good(&good("r1")).unwrap();
        s.save_last_good(&good("r2")).unwrap();
        assert_eq!(s.load_last_good().unwrap(), Some(good("r2")));
        assert_eq!(s.load_file().unwrap().unwrap().generation, 2);
        // No temp file is left behind.
        let names: Vec<_> = fs::read_dir(s.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, [LAST_GOOD_FILE]);
    }

    #[test]
    fn tampered_content_is_detected_and_not_returned() {
        let t = tempfile::tempdir().unwrap();
        let s = StateDir::open(t.path()).unwrap();
        s.save_last_good(&good("r1")).unwrap();
        let path = t.path().join(LAST_GOOD_FILE);
        let text = fs::read_to_string(&path).unwrap();
        fs::write(&path, text.replace("10.0.0.1/24", "10.0.0.9/24")).unwrap();
        let err = s.load_last_good().unwrap_err();
        assert!(matches!(err, BackupError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("checksum"), "{err}");
    }

    #[test]
    fn truncated_file_is_corrupt() {
        let t = tempfile::tempdir().unwrap();
        let s = StateDir::open(t.path()).unwrap();
        s.save_last_good(&good("r1")).unwrap();
        let path = t.path().join(LAST_GOOD_FILE);
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        let err = s.load_last_good().unwrap_err();
        assert!(err.to_string().contains("not a backup file"), "{err}");
        // A fresh save repairs it.
        s.save_last_good(&good("r2")).unwrap();
        assert_eq!(s.load_last_good().unwrap(), Some(good("r2")));
    }

    #[test]
    fn applying_marker_lifecycle() {
        let t = tempfile::tempdir().unwrap();
        let s = StateDir::open(t.path()).unwrap();
        assert_eq!(s.applying().unwrap(), None);
        let a = Applying {
            revision: "r3".into(),
            retry: 1,
            config_hash: "h".into(),
            interruptions: 0,
            creating: Vec::new(),
            upgrade: false,
        };
        s.mark_applying(&a).unwrap();
        // A new agent process sees it.
        let again = StateDir::open(t.path()).unwrap();
        assert_eq!(again.applying().unwrap(), Some(a));
        again.clear_applying().unwrap();
        assert_eq!(s.applying().unwrap(), None);
        again.clear_applying().unwrap();
    }

    #[test]
    fn a_verdict_survives_a_restart_and_a_torn_one_reads_as_none() {
        let t = tempfile::tempdir().unwrap();
        let s = StateDir::open(t.path()).unwrap();
        assert_eq!(s.rejected().unwrap(), None);
        let r = Rejected {
            revision: "r4".into(),
            retry: 2,
            reason: NodeReason::HealthCheckFailed.as_str().into(),
            message: "HealthCheckFailed: api: connection refused".into(),
        };
        s.save_rejected(&r).unwrap();
        assert_eq!(
            StateDir::open(t.path()).unwrap().rejected().unwrap(),
            Some(r)
        );
        fs::write(t.path().join(REJECTED_FILE), b"{\"revis").unwrap();
        assert_eq!(s.rejected().unwrap(), None);
    }

    /// A backup with a valid checksum but the wrong generation is corrupt too: generation 0 (no agent
    /// writes it) and an older copy put back over a newer one.
    #[test]
    fn a_wrong_generation_is_corrupt() {
        let t = tempfile::tempdir().unwrap();
        let s = StateDir::open(t.path()).unwrap();
        let path = t.path().join(LAST_GOOD_FILE);
        let zero = LastGoodFile {
            generation: 0,
            checksum: checksum(0, &good("r1")),
            last_good: good("r1"),
        };
        fs::write(&path, serde_json::to_vec(&zero).unwrap()).unwrap();
        let err = s.load_last_good().unwrap_err().to_string();
        assert!(err.contains("generation 0"), "{err}");

        fs::remove_file(&path).unwrap();
        s.save_last_good(&good("r1")).unwrap();
        let older = fs::read(&path).unwrap();
        s.save_last_good(&good("r2")).unwrap();
        assert_eq!(s.load_last_good().unwrap(), Some(good("r2")));
        fs::write(&path, older).unwrap();
        let err = s.load_last_good().unwrap_err().to_string();
        assert!(
            err.contains("generation 1 is older than generation 2"),
            "{err}"
        );
        // Moved aside, the node starts over from generation 1.
        fs::rename(&path, t.path().join("last-good.json.corrupt")).unwrap();
        assert_eq!(s.load_last_good().unwrap(), None);
        s.save_last_good(&good("r3")).unwrap();
        assert_eq!(s.load_last_good().unwrap(), Some(good("r3")));
    }
}
