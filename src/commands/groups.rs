//! Groups of flags that several commands take, defined once so that a flag means the same
//! thing wherever it is given: what workers filter out of their traffic, and what a run does
//! about workers slower than the others. Each command flattens the group into its own
//! arguments (`#[command(flatten)]`; ARCHITECTURE.md §13).

use pserver_core::filter::{Filters, KeyCaching, Kkt, Threshold};
use pserver_core::pace::{Balance, Detection, StragglerPolicy, TauRange};

use super::values::{Factor, KktEvery, SlowWorker, key_caching, tau_range, threshold};

/// What the workers filter out of their pushes and pulls (ARCHITECTURE.md §10); all off by
/// default. Nothing is dropped: what a filter holds back goes later, and a run ends with a
/// line of what each filter saved.
#[derive(clap::Args, Debug, Clone, Default)]
#[command(next_help_heading = "Filters")]
pub(crate) struct FilterArgs {
    /// Push a key's change only once it, summed since it was last sent, exceeds THETA in
    /// absolute value (the significantly-modified filter). The rest waits on the worker and
    /// goes with a later push of the key or with the worker's last push.
    #[arg(long, value_name = "THETA", value_parser = threshold, allow_negative_numbers = true)]
    pub(crate) sigmod: Option<Threshold>,
    /// Key caching: a key list a worker sent a server before goes as its 128-bit digest, and
    /// a pull is answered without the keys it asked for. Each side keeps LISTS lists per peer
    /// (256 if none is given); a list the server no longer holds is asked for and sent again.
    #[arg(long, value_name = "LISTS", num_args = 0..=1, default_missing_value = "256", value_parser = key_caching)]
    pub(crate) key_cache: Option<KeyCaching>,
    /// With --key-cache: send the values that go without keys in the smallest exact form,
    /// without their zero rows or as an LZ4 block, where either saves bytes.
    #[arg(long, requires = "key_cache")]
    pub(crate) compress: bool,
    /// The KKT filter: a key whose pulled value is zero keeps its change on the worker while
    /// the change, summed since it was last sent, stays within a bound (in training, the L1
    /// bound --l1 under which FTRL keeps the weight at zero). It goes once it passes the
    /// bound, once the value is no longer zero, and with every EVERY-th push of a worker (500
    /// if none is given), the full check that lets a key come back.
    #[arg(long, value_name = "EVERY", num_args = 0..=1, default_missing_value = "500", allow_negative_numbers = true)]
    pub(crate) kkt: Option<KktEvery>,
}

impl FilterArgs {
    /// The filters asked for, the KKT filter's held changes bounded by `kkt_bound` (no KKT
    /// filter without one).
    pub(crate) fn filters(&self, kkt_bound: Option<Threshold>) -> Filters {
        let mut filters = self
            .sigmod
            .map_or_else(Filters::none, Filters::significantly_modified);
        filters.key_caching = self.key_cache;
        filters.compression = self.compress;
        filters.kkt = self
            .kkt
            .zip(kkt_bound)
            .and_then(|(every, bound)| Kkt::new(bound, every.get()));
        filters
    }
}

/// What a run does about workers slower than the others (ARCHITECTURE.md §9), and slowness
/// to inject to see it at work; all off by default.
#[derive(clap::Args, Debug, Clone, Default)]
#[command(next_help_heading = "Stragglers")]
pub(crate) struct StragglerArgs {
    /// Make worker W (from 0) compute F times slower than it can: a slow machine, to see what
    /// the options below do about it.
    #[arg(long, value_name = "W:F")]
    pub(crate) slow_worker: Option<SlowWorker>,
    /// At each step one worker, drawn from the seed, computes F times slower: stragglers that
    /// come and go.
    #[arg(long, value_name = "F")]
    pub(crate) straggler: Option<Factor>,
    /// Flag a worker more than N iterations behind the median of the others (on with any
    /// option below, at 1 unless given).
    #[arg(long, value_name = "N")]
    pub(crate) detect_lag: Option<u32>,
    /// Under bounded delay, move a straggler on to the others' iteration instead of holding
    /// everybody at the bound. The work it skips is not done, and is counted.
    #[arg(long)]
    pub(crate) skip_ahead: bool,
    /// Under bounded delay, let tau move within MIN:MAX, starting from the --consistency
    /// bound: up while stragglers are found, down once they clear.
    #[arg(long, value_name = "MIN:MAX", value_parser = tau_range)]
    pub(crate) adaptive_tau: Option<TauRange>,
    /// Cut the work into N shares per worker, and let the coordinator move shares from slow
    /// workers to fast ones by the speed each reports (at least one share each, at most 2N).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) shares: Option<u16>,
}

impl StragglerArgs {
    /// The policy asked for: detection whenever anything acts on it.
    pub(crate) fn policy(&self) -> StragglerPolicy {
        let mut policy = StragglerPolicy::default();
        let acts = self.skip_ahead || self.adaptive_tau.is_some() || self.shares.is_some();
        if acts || self.detect_lag.is_some() {
            policy.detect = Some(Detection::lagging(self.detect_lag.unwrap_or(1)));
        }
        policy.skip_ahead = self.skip_ahead;
        policy.adaptive_tau = self.adaptive_tau;
        policy.balance = self.shares.map(Balance::shares);
        policy
    }
}
