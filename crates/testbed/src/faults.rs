//! Fault injection and request counters.
//!
//! Rules match requests by verb and resource and either fail them (500/429/503 with a `Status`
//! body) or delay them, for the next N matching requests, a fraction of them, or all. Partitions
//! refuse a client (by user agent substring or bearer token): its connections are closed without
//! an answer and its open watches are cut. `cut_watches` aborts every open watch stream.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Which requests a rule applies to. `None` matches anything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Match {
    /// Kubernetes verb: get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: Option<String>,
    /// Resource plural, with `/status` for the subresource (`nodenetworkconfigs/status`).
    pub resource: Option<String>,
    /// Substring of the User-Agent.
    pub user_agent: Option<String>,
}

impl Match {
    pub fn verb(verb: &str) -> Self {
        Match {
            verb: Some(verb.into()),
            ..Match::default()
        }
    }

    pub fn resource(mut self, resource: &str) -> Self {
        self.resource = Some(resource.into());
        self
    }

    pub fn any() -> Self {
        Match::default()
    }

    fn matches(&self, r: &RequestInfo<'_>) -> bool {
        self.verb.as_deref().is_none_or(|v| v == r.verb)
            && self.resource.as_deref().is_none_or(|x| x == r.resource)
            && self
                .user_agent
                .as_deref()
                .is_none_or(|u| r.user_agent.contains(u))
    }
}

/// What a matching request gets.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Action {
    /// Answer with this HTTP status (500, 429 or 503) and a `Status` body.
    Fail(u16),
    /// Hold the request this long, then serve it.
    Delay(#[serde(with = "millis")] Duration),
}

mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

/// How many matching requests a rule hits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Budget {
    /// The next N matching requests.
    Next(u32),
    /// Each matching request with this probability (seeded, deterministic sequence).
    Fraction(f64),
    /// Every matching request until cleared.
    Always,
}

/// A fault rule (also the JSON body of `POST /testbed/faults`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    #[serde(default, rename = "match")]
    pub matcher: Match,
    pub action: Action,
    pub budget: Budget,
}

/// A client cut off from the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Partition {
    /// Requests whose User-Agent contains this.
    UserAgent(String),
    /// Requests with `Authorization: Bearer <token>`.
    Token(String),
}

/// What the server needs to know about a request to decide on faults.
#[derive(Debug, Clone, Copy)]
pub struct RequestInfo<'a> {
    pub verb: &'a str,
    pub resource: &'a str,
    pub user_agent: &'a str,
    pub token: &'a str,
}

/// The fault decision for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    Pass,
    Fail(u16),
    Delay(Duration),
}

#[derive(Debug, Default)]
struct State {
    rules: Vec<Rule>,
    partitions: Vec<Partition>,
    rng: u64,
}

/// Fault injection handle, shared by the server and its users.
#[derive(Debug)]
pub struct Faults {
    state: Mutex<State>,
    /// Bumped to cut every open watch; watches also re-check partitions when it moves.
    cut: tokio::sync::watch::Sender<u64>,
    cut_all: AtomicU64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            state: Mutex::new(State {
                rng: 0x9E37_79B9_7F4A_7C15,
                ..State::default()
            }),
            cut: tokio::sync::watch::Sender::new(0),
            cut_all: AtomicU64::new(0),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Faults {
    pub fn add(&self, rule: Rule) {
        lock(&self.state).rules.push(rule);
    }

    /// Fails the next `n` requests matching `m` with `code`.
    pub fn fail_next(&self, m: Match, n: u32, code: u16) {
        self.add(Rule {
            matcher: m,
            action: Action::Fail(code),
            budget: Budget::Next(n),
        });
    }

    /// Fails a fraction of the requests matching `m` with `code`.
    pub fn fail_fraction(&self, m: Match, fraction: f64, code: u16) {
        self.add(Rule {
            matcher: m,
            action: Action::Fail(code),
            budget: Budget::Fraction(fraction),
        });
    }

    /// Delays every request matching `m`.
    pub fn delay(&self, m: Match, by: Duration) {
        self.add(Rule {
            matcher: m,
            action: Action::Delay(by),
            budget: Budget::Always,
        });
    }

    /// Removes every rule and partition.
    pub fn clear(&self) {
        let mut s = lock(&self.state);
        s.rules.clear();
        s.partitions.clear();
    }

    pub fn rules(&self) -> Vec<Rule> {
        lock(&self.state).rules.clone()
    }

    /// Aborts every open watch stream (clients see the connection drop mid-stream).
    pub fn cut_watches(&self) {
        self.cut_all.fetch_add(1, Ordering::SeqCst);
        self.cut.send_modify(|v| *v += 1);
    }

    /// Refuses a client: its requests get their connection closed, its watches are cut.
    pub fn partition(&self, p: Partition) {
        lock(&self.state).partitions.push(p);
        self.cut.send_modify(|v| *v += 1);
    }

    /// Lifts every partition.
    pub fn heal(&self) {
        lock(&self.state).partitions.clear();
    }

    pub fn is_refused(&self, user_agent: &str, token: &str) -> bool {
        lock(&self.state).partitions.iter().any(|p| match p {
            Partition::UserAgent(u) => user_agent.contains(u.as_str()),
            Partition::Token(t) => !token.is_empty() && token == t,
        })
    }

    pub(crate) fn cut_epoch(&self) -> u64 {
        self.cut_all.load(Ordering::SeqCst)
    }

    pub(crate) fn subscribe_cuts(&self) -> tokio::sync::watch::Receiver<u64> {
        self.cut.subscribe()
    }

    /// Decides the fate of one request (consumes rule budgets).
    pub fn decide(&self, r: &RequestInfo<'_>) -> Decision {
        let mut s = lock(&self.state);
        let mut decision = Decision::Pass;
        let mut i = 0;
        while i < s.rules.len() {
            if !s.rules[i].matcher.matches(r) {
                i += 1;
                continue;
            }
            let hit = match s.rules[i].budget {
                Budget::Always => true,
                Budget::Next(n) => {
                    if n <= 1 {
                        let rule = s.rules.remove(i);
                        decision = combine(decision, rule.action);
                        continue;
                    }
                    s.rules[i].budget = Budget::Next(n - 1);
                    true
                }
                Budget::Fraction(f) => {
                    // xorshift64: deterministic for a given sequence of requests.
                    let mut x = s.rng;
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    s.rng = x;
                    ((x >> 11) as f64 / (1u64 << 53) as f64) < f
                }
            };
            if hit {
                decision = combine(decision, s.rules[i].action);
            }
            i += 1;
        }
        decision
    }
}

fn combine(d: Decision, a: Action) -> Decision {
    match (d, a) {
        (Decision::Fail(c), _) => Decision::Fail(c),
        (_, Action::Fail(c)) => Decision::Fail(c),
        (Decision::Delay(x), Action::Delay(y)) => Decision::Delay(x + y),
        (_, Action::Delay(y)) => Decision::Delay(y),
    }
}

/// Requests served, per verb and resource, and per client as well.
#[derive(Debug, Default)]
pub struct Counters {
    map: Mutex<BTreeMap<(String, String), u64>>,
    /// client → counts; a client is its bearer token, else its user agent (replicas of one program
    /// share a user agent; a benchmark gives each its own token to tell them apart).
    by_client: Mutex<BTreeMap<String, RequestCounts>>,
    /// client (as in `by_client`) → what the server sent it.
    traffic: Mutex<BTreeMap<String, Traffic>>,
}

/// What the server sent one client: the bodies of its answers to non-watch requests, per verb, and
/// the events of its watches (`ADDED`/`MODIFIED`/`DELETED` lines as sent; bookmarks and errors not
/// counted), per resource. Bytes are body bytes, as kube-apiserver's `apiserver_response_sizes` (which
/// counts the answers to reads only) and `apiserver_watch_events_sizes` count them: HTTP headers and
/// chunk framing are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Traffic {
    pub response_bytes: BTreeMap<String, u64>,
    pub watch_events: BTreeMap<String, u64>,
    pub watch_event_bytes: BTreeMap<String, u64>,
}

impl Counters {
    fn traffic_of<T>(&self, client: &str, f: impl FnOnce(&mut Traffic) -> T) -> T {
        let mut traffic = lock(&self.traffic);
        match traffic.get_mut(client) {
            Some(t) => f(t),
            None => f(traffic.entry(client.to_string()).or_default()),
        }
    }

    /// `bytes` of the body of an answer to a `verb` request sent to `client`.
    pub fn record_response_bytes(&self, client: &str, verb: &str, bytes: usize) {
        self.traffic_of(client, |t| add(&mut t.response_bytes, verb, bytes as u64));
    }

    /// One watch event of `resource`, `bytes` long, sent to `client`.
    pub fn record_watch_event(&self, client: &str, resource: &str, bytes: usize) {
        self.traffic_of(client, |t| {
            add(&mut t.watch_events, resource, 1);
            add(&mut t.watch_event_bytes, resource, bytes as u64);
        });
    }

    /// What the server sent each client (see [`Traffic`]).
    pub fn traffic(&self) -> BTreeMap<String, Traffic> {
        lock(&self.traffic).clone()
    }

    pub fn record(&self, verb: &str, resource: &str) {
        *lock(&self.map)
            .entry((verb.to_string(), resource.to_string()))
            .or_default() += 1;
    }

    /// [`record`](Self::record), and the same under `client`.
    pub fn record_for(&self, client: &str, verb: &str, resource: &str) {
        self.record(verb, resource);
        let mut by_client = lock(&self.by_client);
        let counts = match by_client.get_mut(client) {
            Some(c) => c,
            None => by_client.entry(client.to_string()).or_default(),
        };
        *counts
            .0
            .entry((verb.to_string(), resource.to_string()))
            .or_default() += 1;
    }

    pub fn snapshot(&self) -> RequestCounts {
        RequestCounts(lock(&self.map).clone())
    }

    /// Counts per client (see [`record_for`](Self::record_for)).
    pub fn by_client(&self) -> BTreeMap<String, RequestCounts> {
        lock(&self.by_client).clone()
    }

    pub fn reset(&self) {
        lock(&self.map).clear();
        lock(&self.by_client).clear();
        lock(&self.traffic).clear();
    }
}

fn add(map: &mut BTreeMap<String, u64>, key: &str, v: u64) {
    if let Some(n) = map.get_mut(key) {
        *n += v;
    } else {
        map.insert(key.to_string(), v);
    }
}

/// A snapshot of the request counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestCounts(pub BTreeMap<(String, String), u64>);

impl RequestCounts {
    pub fn get(&self, verb: &str, resource: &str) -> u64 {
        self.0
            .get(&(verb.to_string(), resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// All requests of one verb.
    pub fn verb(&self, verb: &str) -> u64 {
        self.0
            .iter()
            .filter(|((v, _), _)| v == verb)
            .map(|(_, n)| n)
            .sum()
    }

    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// Writes: create, update, patch, delete, deletecollection.
    pub fn writes(&self) -> u64 {
        ["create", "update", "patch", "delete", "deletecollection"]
            .iter()
            .map(|v| self.verb(v))
            .sum()
    }

    /// `{"patch nodes": 3, ...}` for the admin endpoint.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.0
                .iter()
                .map(|((v, r), n)| (format!("{v} {r}"), serde_json::json!(n)))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(verb: &'a str, resource: &'a str) -> RequestInfo<'a> {
        RequestInfo {
            verb,
            resource,
            user_agent: "kube-rs/5",
            token: "",
        }
    }

    #[test]
    fn counters_per_client_add_up_to_the_totals() {
        let c = Counters::default();
        c.record_for("configurator-0", "patch", "nodenetworkconfigs");
        c.record_for("configurator-0", "patch", "nodenetworkconfigs");
        c.record_for("agents", "patch", "nodenetworkconfigs/status");
        c.record_for("agents", "patch", "nodenetworkconfigs");
        assert_eq!(c.snapshot().get("patch", "nodenetworkconfigs"), 3);
        let by = c.by_client();
        assert_eq!(by["configurator-0"].get("patch", "nodenetworkconfigs"), 2);
        assert_eq!(by["agents"].total(), 2);
        c.reset();
        assert!(c.by_client().is_empty());
    }

    #[test]
    fn next_n_then_pass() {
        let f = Faults::default();
        f.fail_next(Match::verb("patch").resource("leases"), 2, 503);
        assert_eq!(f.decide(&req("get", "leases")), Decision::Pass);
        assert_eq!(f.decide(&req("patch", "leases")), Decision::Fail(503));
        assert_eq!(f.decide(&req("patch", "leases")), Decision::Fail(503));
        assert_eq!(f.decide(&req("patch", "leases")), Decision::Pass);
    }

    #[test]
    fn fraction_is_roughly_honoured() {
        let f = Faults::default();
        f.fail_fraction(Match::any(), 0.25, 500);
        let failed = (0..4000)
            .filter(|_| f.decide(&req("get", "nodes")) != Decision::Pass)
            .count();
        assert!((800..1200).contains(&failed), "{failed}");
    }

    #[test]
    fn partition_by_token_and_agent() {
        let f = Faults::default();
        f.partition(Partition::Token("t1".into()));
        f.partition(Partition::UserAgent("agent-n1".into()));
        assert!(f.is_refused("x", "t1"));
        assert!(f.is_refused("netwave-agent-n1/0.1", ""));
        assert!(!f.is_refused("netwave-agent-n2/0.1", "t2"));
        f.heal();
        assert!(!f.is_refused("x", "t1"));
    }
}
