//! Sparse logistic regression, the paper's headline application: each worker computes the
//! gradient of the log loss on minibatches of its own shard, for the keys those examples
//! touch, and pushes it; servers apply it through their update rule (FTRL-Proximal by
//! default, whose L1 term keeps the model sparse).
//!
//! One iteration is one minibatch on every worker; an epoch is one pass over each shard, in an
//! order drawn afresh every epoch from a seed. After every epoch the worker holding the first
//! share pulls the whole model (a range pull, answered in parts) and measures it on the test
//! set.
//!
//! The model has an intercept (unless [`LrConfig::bias`] is off): the weight of a constant
//! feature of value 1 that every row holds, kept at key [`BIAS_KEY`], past every key a data
//! file can name, and exempt from regularization
//! ([`JobSpec::unregularized`](pserver_core::JobSpec::unregularized)).
//!
//! **Regularization.** FTRL-Proximal minimizes the sum of the losses it is pushed plus one
//! `l1 |w| + l2 w^2 / 2` for the whole run: the regularizer is charged once, not once per
//! push. Each push is the *sum* of a minibatch's per-row gradients, so every row counts once in
//! the data term, as in a per-row learner (VW's updates are one row each), whatever the batch
//! size; a feature's step does not shrink with the batch. The data term grows with every epoch
//! while the regularizer does not, so the regularization weakens as training goes on. The
//! tests `a_rare_features_step_does_not_shrink_with_the_batch_size` and
//! `l1_holds_a_weight_at_zero_until_its_summed_gradients_pass_it_whatever_the_batch` (in
//! [`config`]) pin this down.
//!
//! **Modules**, each one idea, in dependency order: [`config`] (how to train), [`slowdown`]
//! (slowness a measurement injects), [`metrics`] (the maths and the test measures), [`batch`]
//! (a minibatch and its gradient), [`model_file`] (the saved model), [`worker`] (the worker
//! loop), [`stream`] (rows read from a file a window at a time), [`test_rows`] (the rows a
//! model is measured on, held or read a part at a time), [`pace`] (straggler counts),
//! [`epochs`] (a run's epoch accounting) and [`local_cluster`] (a run in one process). The rest of the crate reaches them through the
//! names re-exported here.

mod batch;
mod config;
mod epochs;
mod local_cluster;
mod metrics;
mod model_file;
mod pace;
mod slowdown;
mod stream;
mod test_rows;
mod worker;

pub(crate) use config::{
    BIAS_KEY, DEFAULT_L1, DEFAULT_L2, Keep, LrConfig, Rates, Rule, Wire, ftrl,
};
pub(crate) use epochs::{EpochReport, Trained};
pub(crate) use local_cluster::{TrainRows, train_local, train_local_until};
pub(crate) use metrics::{auc, evaluate, scores};
pub(crate) use model_file::{SavedModel, base_for_init, load_model, save_model};
pub(crate) use slowdown::{SlowWorker, Slowdowns};
pub(crate) use stream::{StreamedFile, WindowReader};
pub(crate) use test_rows::{StreamedTest, TestRows};
pub(crate) use worker::{
    MeasureSpec, Rows, RowsTrained, ShareRows, WorkerRun, run_shares, whole_shares,
};

#[cfg(test)]
mod end_to_end;
