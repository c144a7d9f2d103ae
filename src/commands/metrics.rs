//! A node process's operator endpoint (`--metrics ADDR`): `/healthz` answers while the node
//! runs, `/metrics` gives its counters in the Prometheus text format, the node loop's
//! ([`NodeMetrics`]) and its transport's, and the coordinator's `/status` says where the job
//! stands (`pserver status`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use pserver_core::filter::FilterSaving;
use pserver_core::{NodeId, Role};
use pserver_runtime::NodeMetrics;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

/// A transport's counters as `(name, help, value)`, read at each scrape.
pub(crate) type TransportCounters =
    Arc<dyn Fn() -> Vec<(&'static str, &'static str, u64)> + Send + Sync>;

/// What a scrape reads.
#[derive(Clone)]
pub(crate) struct Sources {
    /// The node.
    pub id: NodeId,
    /// Its role.
    pub role: Role,
    /// The node loop's counters.
    pub node: watch::Receiver<NodeMetrics>,
    /// The transport's.
    pub transport: TransportCounters,
}

/// The operator endpoint, served on a thread of its own: a coordinator's or a server's node
/// loop runs alone on the node's thread (ARCHITECTURE.md §6), and a long step of it (loading
/// a checkpoint to resume from, say) must not keep `/healthz` from answering a probe.
/// Dropping it stops the endpoint too: its thread serves until the sender is gone.
pub(crate) struct Endpoint {
    _stop: oneshot::Sender<()>,
}

impl Endpoint {
    /// Stops serving; connections still open are dropped.
    pub(crate) fn stop(self) {}
}

/// Serves `/healthz` and `/metrics` on `addr` until [`Endpoint::stop`] (or the process ends).
pub(crate) fn serve(addr: SocketAddr, sources: Sources) -> std::io::Result<Endpoint> {
    // Bound here, so that an address in use is this call's error, not the thread's.
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (stop, stopped) = oneshot::channel();
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match TcpListener::from_std(listener) {
                    Ok(listener) => listener,
                    Err(e) => {
                        tracing::warn!(%addr, error = %e, "cannot serve /healthz and /metrics");
                        return;
                    }
                };
                tokio::select! {
                    () = accept(listener, sources) => {}
                    _ = stopped => {}
                }
            });
        })?;
    tracing::info!(%addr, "serving /healthz and /metrics");
    Ok(Endpoint { _stop: stop })
}

async fn accept(listener: TcpListener, sources: Sources) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, say: it will not heal at once, so do not spin on it.
                tracing::warn!(error = %e, "accepting a metrics connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let sources = sources.clone();
        let service = service_fn(move |request: Request<hyper::body::Incoming>| {
            let response = answer(request.uri().path(), &sources);
            async move { Ok::<_, Infallible>(response) }
        });
        tokio::spawn(async move {
            let io = TokioIo::new(stream);
            if let Err(e) = http1::Builder::new().serve_connection(io, service).await {
                tracing::debug!(error = %e, "a metrics connection failed");
            }
        });
    }
}

fn answer(path: &str, sources: &Sources) -> Response<Full<Bytes>> {
    let (status, body) = match path {
        // The node loop drops its end of the metrics channel when it stops.
        "/healthz" if sources.node.has_changed().is_ok() => (StatusCode::OK, "ok\n".to_owned()),
        "/healthz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the node has stopped\n".to_owned(),
        ),
        "/metrics" => match render(sources) {
            Ok(text) => (StatusCode::OK, text),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
        },
        "/status" => match &sources.node.borrow().status {
            Some(status) => (StatusCode::OK, format!("{status}\n")),
            None => (
                StatusCode::NOT_FOUND,
                "only the coordinator answers /status\n".to_owned(),
            ),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "/healthz, /metrics or /status\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if path == "/metrics" {
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            ),
        );
    }
    response
}

/// The counters in the OpenMetrics text format, each labelled with the node and its role.
fn render(sources: &Sources) -> Result<String, std::fmt::Error> {
    let m = sources.node.borrow().clone();
    let mut registry = Registry::with_prefix_and_labels(
        "pserver",
        [
            ("node".into(), sources.id.to_string().into()),
            ("role".into(), sources.role.to_string().into()),
        ]
        .into_iter(),
    );
    let counter = |v: u64| {
        let c: Counter = Counter::default();
        c.inc_by(v);
        c
    };
    let gauge = |v: u64| {
        let g: Gauge = Gauge::default();
        g.set(i64::try_from(v).unwrap_or(i64::MAX));
        g
    };
    registry.register(
        "epoch",
        "Configuration epoch the node is on",
        gauge(m.epoch),
    );
    registry.register(
        "checkpoint",
        "The iteration of the last whole-job checkpoint every server wrote (0: none)",
        gauge(u64::from(m.checkpoint)),
    );
    let counts = [
        (
            "frames_received",
            "Frames received and handed to the node",
            m.frames_received,
        ),
        ("frames_sent", "Frames the node sent", m.frames_sent),
        (
            "bytes_sent",
            "Bytes of the frames the node sent",
            m.bytes_sent,
        ),
        ("pushes", "Pushes done (workers)", m.pushes),
        ("pulls", "Pulls answered (workers)", m.pulls),
        ("iterations", "Iterations advanced (workers)", m.iterations),
        (
            "nodes_dead",
            "Nodes declared dead (the coordinator)",
            m.nodes_dead,
        ),
        (
            "ranges_lost",
            "Key ranges lost with all their holders",
            m.ranges_lost,
        ),
        (
            "send_errors",
            "Messages the transport would not send",
            m.send_errors,
        ),
        (
            "retransmissions",
            "Messages sent again because they went unanswered (workers)",
            m.retransmissions,
        ),
        (
            "recoveries",
            "Configuration changes that came while requests were open, each ended by a completed request (workers)",
            m.recoveries,
        ),
        (
            "stragglers",
            "Workers found lagging the others, each time one started to (the coordinator)",
            m.stragglers,
        ),
        (
            "skipped_iterations",
            "Iterations the worker was told to skip (workers, under skip-ahead)",
            m.skipped_iterations,
        ),
        (
            "shares_moved",
            "Shares of the work moved from slower workers to faster ones (the coordinator)",
            m.shares_moved,
        ),
    ];
    for (name, help, value) in counts {
        registry.register(name, help, counter(value));
    }
    registry.register(
        "open_requests",
        "Requests open now (workers)",
        gauge(m.open_requests),
    );
    registry.register(
        "resends_open",
        "Resends of the slices open now (workers)",
        gauge(m.resends_open),
    );
    registry.register(
        "replicas_held",
        "Replicas each key has besides its primary on the ring in force: below replicas_asked after servers were lost",
        gauge(m.replicas_held),
    );
    registry.register(
        "replicas_asked",
        "The replicas the ring asks for besides each key's primary",
        gauge(m.replicas_asked),
    );
    registry.register(
        "held_pulls",
        "Pulls held until the consistency model lets them be answered (servers)",
        gauge(m.held_pulls),
    );
    let last_recovery = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    last_recovery.set(m.last_recovery.as_secs_f64());
    let longest_recovery = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    longest_recovery.set(m.longest_recovery.as_secs_f64());
    registry.register_with_unit(
        "longest_recovery",
        "The longest recovery so far, measured as last_recovery (workers)",
        Unit::Seconds,
        longest_recovery,
    );
    registry.register_with_unit(
        "last_recovery",
        "How long the last recovery held the requests: from the last completion before the configuration changed to the first after (workers)",
        Unit::Seconds,
        last_recovery,
    );
    let refusals = Family::<Vec<(String, String)>, Counter>::default();
    let r = &m.refusals;
    for (reason, n) in [
        ("undecodable", r.undecodable),
        ("spoofed", r.spoofed),
        ("misaddressed", r.misaddressed),
        ("unknown_sender", r.unknown_sender),
        ("stale_epoch", r.stale_epoch),
        ("foreign_job", r.foreign_job),
        ("unencodable", r.unencodable),
        ("other", r.other),
    ] {
        refusals
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .inc_by(n);
    }
    registry.register("refusals", "Messages the node refused, by reason", refusals);
    if !m.filter_savings.is_empty() {
        let label = |name: &str| vec![("filter".to_owned(), name.to_owned())];
        let families: [(&str, &str, Reading); 3] = [
            (
                "filter_rows_in",
                "Rows (a key and its values) the worker's filters were given, by filter",
                |f| f.rows_in,
            ),
            (
                "filter_rows_out",
                "Rows the worker's filters passed on to be sent, by filter",
                |f| f.rows_out,
            ),
            (
                "filter_bytes_saved",
                "Bytes of keys and values the worker's filters kept from the network, by filter",
                |f| f.bytes_saved,
            ),
        ];
        for (name, help, value) in families {
            let family = Family::<Vec<(String, String)>, Counter>::default();
            for (filter, saving) in &m.filter_savings {
                family.get_or_create(&label(filter)).inc_by(value(saving));
            }
            registry.register(name, help, family);
        }
    }
    for (name, help, value) in (sources.transport)() {
        registry.register(name, help, counter(value));
    }
    let mut text = String::new();
    encode(&mut text, &registry)?;
    Ok(text)
}

/// Reads one count of a filter's saving.
type Reading = fn(&FilterSaving) -> u64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scrape_gives_every_counter_labelled_with_the_node() {
        let mut m = NodeMetrics::default();
        m.frames_received = 12;
        m.refusals.undecodable = 3;
        m.held_pulls = 5;
        m.recoveries = 2;
        m.retransmissions = 9;
        m.send_errors = 4;
        m.stragglers = 6;
        m.skipped_iterations = 11;
        m.shares_moved = 13;
        m.filter_savings = vec![(
            "sigmod",
            FilterSaving {
                rows_in: 20,
                rows_out: 5,
                bytes_saved: 180,
            },
        )];
        m.last_recovery = std::time::Duration::from_millis(2_500);
        m.longest_recovery = std::time::Duration::from_millis(4_000);
        let (_tx, node) = watch::channel(m);
        let sources = Sources {
            id: NodeId(4),
            role: Role::Server,
            node,
            transport: Arc::new(|| vec![("tcp_handshakes_refused", "Handshakes refused", 7)]),
        };
        let text = render(&sources).unwrap();
        let labels = "node=\"n4\",role=\"server\"";
        for line in [
            format!("pserver_frames_received_total{{{labels}}} 12"),
            format!("pserver_refusals_total{{{labels},reason=\"undecodable\"}} 3"),
            format!("pserver_tcp_handshakes_refused_total{{{labels}}} 7"),
            format!("pserver_epoch{{{labels}}} 0"),
            format!("pserver_held_pulls{{{labels}}} 5"),
            format!("pserver_recoveries_total{{{labels}}} 2"),
            format!("pserver_retransmissions_total{{{labels}}} 9"),
            format!("pserver_send_errors_total{{{labels}}} 4"),
            format!("pserver_stragglers_total{{{labels}}} 6"),
            format!("pserver_skipped_iterations_total{{{labels}}} 11"),
            format!("pserver_shares_moved_total{{{labels}}} 13"),
            format!("pserver_filter_rows_in_total{{{labels},filter=\"sigmod\"}} 20"),
            format!("pserver_filter_rows_out_total{{{labels},filter=\"sigmod\"}} 5"),
            format!("pserver_filter_bytes_saved_total{{{labels},filter=\"sigmod\"}} 180"),
            format!("pserver_last_recovery_seconds{{{labels}}} 2.5"),
            format!("pserver_longest_recovery_seconds{{{labels}}} 4.0"),
        ] {
            assert!(text.contains(&line), "no {line} in:\n{text}");
        }
        assert_eq!(answer("/healthz", &sources).status(), StatusCode::OK);
        assert_eq!(answer("/nope", &sources).status(), StatusCode::NOT_FOUND);
        drop(_tx);
        assert_eq!(
            answer("/healthz", &sources).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        Ok(answer)
    }

    /// A node loop on a runtime of one thread can be busy for seconds (loading a checkpoint):
    /// the endpoint answers from a thread of its own, whatever the thread that started it does.
    #[test]
    fn the_endpoint_answers_while_the_thread_that_started_it_is_blocked_and_stops_when_told() {
        let (_tx, node) = watch::channel(NodeMetrics::default());
        let sources = Sources {
            id: NodeId(1),
            role: Role::Server,
            node,
            transport: Arc::new(Vec::new),
        };
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        // No runtime runs on this thread: it blocks in `get` until the answer comes.
        let endpoint = serve(addr, sources).unwrap();
        let answer = get(addr, "/healthz").unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("ok\n"), "{answer}");
        endpoint.stop();
        // Stopped: the listener is closed, so connecting fails once the thread let it go.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(addr).is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "still listening at {addr}"
            );
            std::thread::yield_now();
        }
    }
}
