//! What `pserver bench` measures: the transports, request sizes, kinds of measure and cluster
//! shapes its options choose from.

use clap::ValueEnum;

pub(crate) use crate::commands::values::Transport;

// The choices of the options below have no help of their own (`help = None`), so that
// `--help` lists their names on one line after the option's own explanation.

/// The size of the requests of a dense measure.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DenseSize {
    /// 1K values per request.
    #[value(name = "1K", help = None)]
    K1,
    /// 64K values per request.
    #[value(name = "64K", help = None)]
    K64,
    /// 1M values per request.
    #[value(name = "1M", help = None)]
    M1,
    /// 16M values per request.
    #[value(name = "16M", help = None)]
    M16,
}

impl DenseSize {
    /// Values per request.
    pub(crate) fn values(self) -> usize {
        match self {
            DenseSize::K1 => 1 << 10,
            DenseSize::K64 => 64 << 10,
            DenseSize::M1 => 1 << 20,
            DenseSize::M16 => 16 << 20,
        }
    }
}

/// A kind of measure.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Dense push and pull: contiguous keys.
    #[value(help = None)]
    Dense,
    /// Sparse push and pull: keys drawn at random from 2^24.
    #[value(help = None)]
    Sparse,
    /// Round trips of 1-key pushes, one at a time.
    #[value(help = None)]
    Rtt,
}

/// The shape of a measured cluster.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Topology {
    /// One server and one worker.
    #[value(name = "1s1w", help = None)]
    OneEach,
    /// Two servers and two workers.
    #[value(name = "2s2w", help = None)]
    TwoEach,
}

impl Topology {
    /// Servers and workers.
    pub(super) fn shape(self) -> (usize, usize) {
        match self {
            Topology::OneEach => (1, 1),
            Topology::TwoEach => (2, 2),
        }
    }
}

/// How `choice` is spelled on the command line, which is how measure names spell it too.
pub(super) fn spelled<T: ValueEnum>(choice: T) -> String {
    choice
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}

/// What to measure.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct BenchOptions {
    /// Seconds rather than minutes: small requests only, few repetitions.
    pub quick: bool,
    /// The transports to measure, in this order.
    pub transports: Vec<Transport>,
    /// Only the dense measures of these sizes; all when empty.
    pub sizes: Vec<DenseSize>,
    /// Only these kinds of measure; all when empty.
    pub kinds: Vec<Kind>,
    /// Only these cluster shapes; both when empty.
    pub topologies: Vec<Topology>,
}

/// Whether `item` is among `only`, which stands for everything when empty.
pub(super) fn wants<T: PartialEq>(only: &[T], item: T) -> bool {
    only.is_empty() || only.contains(&item)
}

/// The sizes of the dense measures: those in `only`, or by default all of them (the two
/// smallest when `quick`).
pub(super) fn dense_sizes(quick: bool, only: &[DenseSize]) -> Vec<DenseSize> {
    let sizes = DenseSize::value_variants().iter().copied();
    if !only.is_empty() {
        sizes.filter(|s| only.contains(s)).collect()
    } else if quick {
        sizes.take(2).collect()
    } else {
        sizes.collect()
    }
}
