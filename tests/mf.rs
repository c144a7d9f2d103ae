//! Matrix factorization on generated low-rank ratings reaches the noise floor.

use pserver::apps::mf::{Generated, MfConfig, train};

#[test]
fn test_rmse_comes_within_ten_percent_of_the_noise_floor() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (cfg, problem) = (MfConfig::default(), Generated::default());
    let reports = rt
        .block_on(train(&cfg, problem.data(), |_| {}))
        .expect("training runs");
    let rmse: Vec<f64> = reports.iter().map(|r| r.test_rmse).collect();
    eprintln!("noise {} test rmse by epoch {rmse:?}", problem.noise);
    let last = *rmse.last().unwrap();
    assert!(last <= 1.1 * problem.noise, "{rmse:?}");
    // It learned: far below the error of predicting the mean.
    assert!(rmse[0] > 1.2 * last, "{rmse:?}");
    assert!(last < 0.5 * reports[0].baseline_rmse, "{reports:?}");
}
