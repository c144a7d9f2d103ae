//! Matrix factorization on generated low-rank ratings reaches the noise floor.

use pserver::apps::mf::{MfConfig, train};

#[test]
fn test_rmse_comes_within_ten_percent_of_the_noise_floor() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cfg = MfConfig::default();
    let reports = rt.block_on(train(&cfg)).expect("training runs");
    let rmse: Vec<f64> = reports.iter().map(|r| r.test_rmse).collect();
    eprintln!("noise {} test rmse by epoch {rmse:?}", cfg.noise);
    let last = *rmse.last().unwrap();
    assert!(last <= 1.1 * cfg.noise, "{rmse:?}");
    // It learned: far below the error of predicting nothing.
    assert!(rmse[0] > 1.2 * last, "{rmse:?}");
}
