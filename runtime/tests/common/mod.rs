//! What the runtime's tests share.

/// A runtime of two threads, as on the machines the tests run on.
pub(crate) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
