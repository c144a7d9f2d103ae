//! `pserver status`: asks a cluster's coordinator where its job stands.

use std::path::PathBuf;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use pserver_core::Role;
use pserver_transport::Address;

use super::CliError;
use super::cluster_file::ClusterFile;

/// How long the coordinator has to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// Print where a cluster's job stands, as its coordinator sees it.
///
/// Asks the coordinator's `/status` at the `metrics` address its `[[node]]` names in the
/// cluster file (or --address) and prints it: `coordinator nN term T`, `epoch E PHASE`,
/// `replicas H of K`, one `node nN ROLE STATE` per node (live, joining, leaving, silent, kept,
/// dead, left), `lost N RANGES`, `finished yes|no` and last `degraded yes|no`. Exit status 0
/// when the job runs as set up, 1 when it is degraded (a node silent, kept or dead, a range
/// lost, fewer replicas than asked), 2 when the coordinator cannot be asked.
#[derive(clap::Args, Debug)]
pub(crate) struct StatusArgs {
    /// The cluster file: its coordinator's `metrics` address is asked.
    #[arg(long, value_name = "FILE", required_unless_present = "address")]
    config: Option<PathBuf>,
    /// The coordinator's metrics address (host:port), instead of the cluster file's.
    #[arg(long, value_name = "ADDR")]
    address: Option<Address>,
}

/// Runs `pserver status`.
pub(crate) fn run(args: StatusArgs) -> Result<(), CliError> {
    let address = match (&args.address, &args.config) {
        (Some(address), _) => address.clone(),
        (None, Some(path)) => {
            let file = ClusterFile::load(path).map_err(CliError::input)?;
            let coordinator = file
                .roles
                .iter()
                .find(|(_, role)| **role == Role::Coordinator)
                .map(|(&id, _)| id);
            coordinator
                .and_then(|id| file.metrics.get(&id).cloned())
                .ok_or_else(|| {
                    CliError::Input(format!(
                        "{}: the coordinator's [[node]] names no metrics address to ask: add metrics = \"HOST:PORT\" to it (and run it so), or give --address",
                        path.display()
                    ))
                })?
        }
        (None, None) => return Err(CliError::input("give --config or --address")),
    };
    let runtime = super::runtime()?;
    let text = runtime
        .block_on(async { tokio::time::timeout(ANSWER_WITHIN, ask(&address)).await })
        .map_err(|_| {
            CliError::Input(format!(
                "the coordinator at {address} did not answer within {}s",
                ANSWER_WITHIN.as_secs()
            ))
        })?
        .map_err(|why| {
            CliError::Input(format!("cannot ask the coordinator at {address}: {why}"))
        })?;
    print!("{text}");
    if text.trim_end().ends_with("degraded yes") {
        return Err(CliError::Found);
    }
    Ok(())
}

/// `GET /status` at `address`: the body of a 200 answer.
async fn ask(address: &Address) -> Result<String, String> {
    let stream = match address.ip() {
        Some(ip) => tokio::net::TcpStream::connect(ip).await,
        None => {
            let host = address.host().unwrap_or_default();
            tokio::net::TcpStream::connect((host, address.port())).await
        }
    }
    .map_err(|e| e.to_string())?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    let driving = tokio::spawn(connection);
    let request = hyper::Request::get("/status")
        .header(hyper::header::HOST, address.to_string())
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    driving.abort();
    let text = String::from_utf8_lossy(&body).into_owned();
    if status != hyper::StatusCode::OK {
        return Err(format!("{status}: {}", text.trim()));
    }
    Ok(text)
}
