//! A data-plane probe: continuous UDP flows between workload namespaces, each packet carrying a sequence
//! number, so what a change does to traffic is counted rather than guessed (#31, DESIGN §6 "hitless").
//!
//! ```text
//!  sender thread (setns into `from`)            receiver thread (setns into `to`)
//!   every 1/rate s: [u64 seq] ──────────UDP──────► bind to_addr:port, record (seq, arrival)
//!   (drains the echoes)           ◄──echo──────── (as a workload answers: no host is silent)
//!
//!  Probe::window(label) ─► per flow: sent, lost (sent but never arrived), reordered (arrived after a
//!                          higher seq), longest gap (no packet arriving), over the time since the last
//!                          window
//! ```
//!
//! Sockets live in the namespace of the thread that opened them: each thread enters its namespace once
//! (`setns`, which moves only that thread) and stays there. A packet sent in one window and arriving in
//! the next counts for its sender's window; a window is closed a grace period after it ends.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// How long after a window ends its packets may still arrive.
const GRACE: Duration = Duration::from_millis(300);

/// One flow: UDP from namespace `from` to `to_addr` (held by namespace `to`).
#[derive(Clone, Debug)]
pub struct Flow {
    pub name: String,
    pub from: String,
    pub to: String,
    pub to_addr: IpAddr,
}

/// What one flow saw during one window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FlowStats {
    pub sent: u64,
    pub lost: u64,
    pub reordered: u64,
    /// The longest time without a packet arriving, in the window.
    pub longest_gap: Duration,
}

#[derive(Default)]
struct Record {
    /// Sequence numbers sent, with when.
    sent: Vec<(u64, Instant)>,
    /// Arrivals: sequence number and when.
    arrived: Vec<(u64, Instant)>,
}

/// Running flows; dropping it stops them.
pub struct Probe {
    flows: Vec<(Flow, Arc<Mutex<Record>>)>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    window_start: Instant,
}

/// Runs `f` on a new thread inside network namespace `ns` (`ip netns add` made it).
fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<JoinHandle<T>> {
    let file = std::fs::File::open(format!("/var/run/netns/{ns}"))
        .with_context(|| format!("network namespace {ns}"))?;
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let entered = nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET);
        let _ = tx.send(entered.map_err(|e| e.to_string()));
        f()
    });
    rx.recv()
        .context("probe thread")?
        .map_err(|e| anyhow::anyhow!("setns into {ns}: {e}"))?;
    Ok(handle)
}

/// How long [`Probe::start`] waits for every flow's first packet.
const FIRST_PACKET: Duration = Duration::from_secs(30);

impl Probe {
    /// Starts every flow at `rate` packets per second, each on its own port from 40000 up, and waits
    /// until each has delivered a packet (so a window never starts on a flow that never worked).
    pub fn start(flows: Vec<Flow>, rate: u32) -> Result<Probe> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut me = Probe {
            flows: Vec::new(),
            stop: stop.clone(),
            threads: Vec::new(),
            window_start: Instant::now(),
        };
        let interval = Duration::from_secs(1) / rate.max(1);
        for (i, flow) in flows.into_iter().enumerate() {
            let port = 40000 + i as u16;
            let record = Arc::new(Mutex::new(Record::default()));
            let to = SocketAddr::new(flow.to_addr, port);
            // The receiver binds first (in `to`), so the first packets find it.
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let (r, s) = (record.clone(), stop.clone());
            me.threads.push(in_netns(&flow.to, move || {
                let sock = match UdpSocket::bind(to) {
                    Ok(sock) => sock,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("bind {to}: {e}")));
                        return;
                    }
                };
                let _ = sock.set_read_timeout(Some(Duration::from_millis(50)));
                let _ = ready_tx.send(Ok(()));
                let mut buf = [0u8; 64];
                while !s.load(Ordering::Relaxed) {
                    if let Ok((n, from)) = sock.recv_from(&mut buf)
                        && n >= 8
                    {
                        let seq = u64::from_be_bytes(buf[..8].try_into().unwrap_or_default());
                        r.lock().unwrap().arrived.push((seq, Instant::now()));
                        // Echoed, as a workload answers: a host that only ever receives is silent, and
                        // no gateway (or EVPN) learns a silent host's address; real flows go both ways.
                        let _ = sock.send_to(&buf[..n], from);
                    }
                }
            })?);
            ready_rx
                .recv()
                .context("probe receiver")?
                .map_err(|e| anyhow::anyhow!("flow {}: {e}", flow.name))?;
            let (r, s) = (record.clone(), stop.clone());
            me.threads.push(in_netns(&flow.from, move || {
                let Ok(sock) = UdpSocket::bind(("0.0.0.0", 0)) else {
                    return;
                };
                // The echoes are only drained: the figures are the forward direction's.
                let _ = sock.set_nonblocking(true);
                let mut echo = [0u8; 64];
                let start = Instant::now();
                let mut seq = 0u64;
                while !s.load(Ordering::Relaxed) {
                    // Paced against the start, so a slow send never lowers the rate.
                    let due = start + interval * (seq as u32);
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let _ = sock.send_to(&seq.to_be_bytes(), to);
                    r.lock().unwrap().sent.push((seq, Instant::now()));
                    while sock.recv(&mut echo).is_ok() {}
                    seq += 1;
                }
            })?);
            me.flows.push((flow, record));
        }
        // A routed flow's first packet waits for EVPN to carry the receiver's MAC/IP route to the
        // sender's node (its echo teaches the remote gateway): seconds alone, up to half a minute
        // while the whole test suite loads the machine (a CI run took over 10 s once).
        let deadline = Instant::now() + FIRST_PACKET;
        for (flow, record) in &me.flows {
            while record.lock().unwrap().arrived.is_empty() {
                if Instant::now() > deadline {
                    anyhow::bail!(
                        "flow {} ({} → {} {}) delivered nothing in {} s",
                        flow.name,
                        flow.from,
                        flow.to,
                        flow.to_addr,
                        FIRST_PACKET.as_secs()
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        me.window_start = Instant::now();
        Ok(me)
    }

    /// Closes the current window (waiting out the grace period for late packets) and returns each flow's
    /// figures over it; the next window starts where this one ended.
    pub fn window(&mut self) -> Vec<(String, FlowStats)> {
        let (start, end) = (self.window_start, Instant::now());
        std::thread::sleep(GRACE);
        self.window_start = end;
        self.flows
            .iter()
            .map(|(flow, record)| {
                let r = record.lock().unwrap();
                (flow.name.clone(), stats(&r, start, end))
            })
            .collect()
    }
}

/// One flow's figures for packets sent in `[start, end)`.
fn stats(r: &Record, start: Instant, end: Instant) -> FlowStats {
    let sent: BTreeSet<u64> = r
        .sent
        .iter()
        .filter(|(_, t)| *t >= start && *t < end)
        .map(|(s, _)| *s)
        .collect();
    let arrived: BTreeSet<u64> = r
        .arrived
        .iter()
        .filter(|(s, _)| sent.contains(s))
        .map(|(s, _)| *s)
        .collect();
    let mut reordered = 0;
    let mut highest = None;
    for (s, _) in r.arrived.iter().filter(|(s, _)| sent.contains(s)) {
        if highest.is_some_and(|h| *s < h) {
            reordered += 1;
        }
        highest = highest.max(Some(*s));
    }
    // Gaps between arrivals inside the window, from its start to the first and from the last to its end.
    let mut times: Vec<Instant> = r
        .arrived
        .iter()
        .map(|(_, t)| *t)
        .filter(|t| *t >= start && *t < end)
        .collect();
    times.sort();
    let mut longest = Duration::ZERO;
    let mut prev = start;
    for t in times.iter().copied().chain(std::iter::once(end)) {
        longest = longest.max(t.saturating_duration_since(prev));
        prev = t;
    }
    FlowStats {
        sent: sent.len() as u64,
        lost: (sent.len() - arrived.len()) as u64,
        reordered,
        longest_gap: longest,
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures are computed from what was sent and what arrived: a missing packet is lost, a late one
    /// reordered, and the longest silence is the gap.
    #[test]
    fn losses_reorders_and_gaps_are_counted_from_sequence_numbers() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let r = Record {
            sent: (0..10).map(|s| (s, at(s * 10))).collect(),
            // 3 and 4 lost, 6 arrives after 7, nothing arrives between 20 ms and 50 ms.
            arrived: vec![
                (0, at(1)),
                (1, at(11)),
                (2, at(21)),
                (5, at(51)),
                (7, at(71)),
                (6, at(72)),
                (8, at(81)),
                (9, at(91)),
            ],
        };
        let s = stats(&r, t0, at(100));
        assert_eq!(s.sent, 10);
        assert_eq!(s.lost, 2);
        assert_eq!(s.reordered, 1);
        assert_eq!(s.longest_gap, Duration::from_millis(30));
    }
}
