//! What one way of training reached, as the training benchmark compares them: pserver's
//! runs, the floor, and Vowpal Wabbit.

/// What one way of training reached.
pub(super) struct Reached {
    /// Over every epoch.
    pub(super) rows_per_sec: f64,
    /// Per epoch.
    pub(super) epochs: Vec<f64>,
    pub(super) cpu_secs_per_mrow: Option<f64>,
    pub(super) peak_rss_mb: Option<f64>,
    pub(super) auc: f64,
    /// Seconds an epoch's measurement of the model took, besides its steps.
    pub(super) measure_secs: Option<f64>,
}
