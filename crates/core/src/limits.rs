//! Size limits (DESIGN.md §6, "Sizes are validated"): everything the configurator writes must fit one
//! etcd object, and that is checked here, before anything is written, instead of by a write the API
//! server refuses on every retry.
//!
//! ```text
//!  folded inputs ──check_inputs──► bytes | InputsTooLarge   (no revision is cut; the inputs' Accepted,
//!                                                             an Event and a log line say why)
//!  rendered node configs ──fleet::render_and_validate──► NodeConfigTooLarge finding
//!                                                             (the revision fails validation, no node
//!                                                              gets it; the finding names the nodes)
//! ```
//!
//! **Which limit.** etcd refuses a request larger than its `--max-request-bytes`, 1.5 MiB by default;
//! kube-apiserver then answers `500 etcdserver: request is too large` for that object on every try
//! (before this check the configurator cut the revision, then retried its NetworkConfigInputs forever
//! and reported them deleted). kube-apiserver itself takes request bodies up to 3 MiB. What we measure is
//! the part that grows with the inputs — a revision's folded inputs, a node's `spec.config` — as serde
//! writes it: compact JSON, which is how the API server stores custom resources. We hold it to
//! [`DEFAULT_MAX_OBJECT_BYTES`], 1 MiB, and leave the other half MiB for what we do not measure: the
//! object's metadata (managedFields, annotations, owner reference), the rest of a NodeNetworkConfig's
//! spec and the status its agent writes, and etcd's request framing. A cluster whose etcd was started
//! with a larger `--max-request-bytes` raises it with the configurator's `--max-object-bytes`, up to
//! [`MAX_OBJECT_BYTES_CEILING`].

use std::fmt;
use std::io;

use netwave_api::RevisionInputs;
use serde::Serialize;

use crate::render::{InputKind, InputRef};

/// Default `--max-object-bytes`: 1 MiB, a third under etcd's default 1.5 MiB request limit.
pub const DEFAULT_MAX_OBJECT_BYTES: u64 = 1 << 20;
/// The highest `--max-object-bytes` that can work: kube-apiserver refuses request bodies over 3 MiB,
/// whatever etcd takes.
pub const MAX_OBJECT_BYTES_CEILING: u64 = 3 << 20;
/// Objects named as the largest contributors in a message.
pub const LARGEST_SHOWN: usize = 3;
/// Event reason when the inputs are too large to become a revision.
pub const REASON: &str = "InputsTooLarge";

/// Bytes of `v` as compact JSON (what serde_json writes and the API server stores), without keeping
/// the bytes.
pub fn json_bytes<T: Serialize + ?Sized>(v: &T) -> u64 {
    struct Count(u64);
    impl io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    serde_json::to_writer(&mut c, v).expect("netwave API types always serialize to JSON");
    c.0
}

/// `1.76 MiB (1848399 bytes)`: readable, and exact for whoever compares it with a flag.
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        let (value, unit) = if b >= 1 << 20 {
            (b as f64 / (1u64 << 20) as f64, "MiB")
        } else {
            (b as f64 / 1024.0, "KiB")
        };
        write!(f, "{value:.2} {unit} ({b} bytes)")
    }
}

/// One input object and the bytes it takes in the folded inputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contributor {
    pub object: InputRef,
    pub bytes: u64,
}

impl fmt::Display for Contributor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:.1} KiB)", self.object, self.bytes as f64 / 1024.0)
    }
}

/// `a (1 KiB), b (2 KiB), c (3 KiB)`.
pub(crate) fn listed(largest: &[Contributor]) -> String {
    largest
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every object of `inputs` that `keep` accepts, with its folded size, largest first (ties by object,
/// so the order never depends on the input's).
pub fn contributors(inputs: &RevisionInputs, keep: impl Fn(&InputRef) -> bool) -> Vec<Contributor> {
    let vrfs = inputs
        .vrfs
        .iter()
        .map(|o| (InputRef::new(InputKind::Vrf, &o.name), json_bytes(o)));
    let l2s = inputs
        .layer2s
        .iter()
        .map(|o| (InputRef::new(InputKind::Layer2, &o.name), json_bytes(o)));
    let rts = inputs.routing_tables.iter().map(|o| {
        (
            InputRef::new(InputKind::RoutingTable, &o.name),
            json_bytes(o),
        )
    });
    let mut out: Vec<Contributor> = vrfs
        .chain(l2s)
        .chain(rts)
        .filter(|(o, _)| keep(o))
        .map(|(object, bytes)| Contributor { object, bytes })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.object.cmp(&b.object)));
    out
}

/// The folded inputs do not fit one object: no revision can hold them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct InputsTooLarge {
    pub bytes: u64,
    pub limit: u64,
    /// Input objects folded.
    pub objects: usize,
    /// The [`LARGEST_SHOWN`] largest objects, largest first.
    pub largest: Vec<Contributor>,
}

impl fmt::Display for InputsTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the inputs fold into a NetworkConfigInputs object of {}, over the limit of {} set by \
             --max-object-bytes (etcd refuses objects over 1.5 MiB by default): no revision is cut \
             from them and every node keeps what it runs; shrink or remove objects, the largest of \
             the {} are {}",
            Bytes(self.bytes),
            Bytes(self.limit),
            self.objects,
            listed(&self.largest)
        )
    }
}

impl InputsTooLarge {
    /// The largest object, which the Event is about.
    pub fn largest(&self) -> Option<&InputRef> {
        self.largest.first().map(|c| &c.object)
    }
}

/// Checks that the folded inputs fit one object of `limit` bytes; returns their size.
pub fn check_inputs(inputs: &RevisionInputs, limit: u64) -> Result<u64, InputsTooLarge> {
    let bytes = json_bytes(inputs);
    if bytes <= limit {
        return Ok(bytes);
    }
    let mut largest = contributors(inputs, |_| true);
    let objects = largest.len();
    largest.truncate(LARGEST_SHOWN);
    Err(InputsTooLarge {
        bytes,
        limit,
        objects,
        largest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_both_ways() {
        assert_eq!(Bytes(1 << 20).to_string(), "1.00 MiB (1048576 bytes)");
        assert_eq!(Bytes(1536).to_string(), "1.50 KiB (1536 bytes)");
        assert_eq!(json_bytes(&serde_json::json!({"a": [1, 2]})), 11);
    }
}
