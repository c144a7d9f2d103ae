//! `pserver status`: asks a cluster's coordinators where its job stands.

use std::path::PathBuf;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use pserver_core::{NodeId, Role};
use pserver_transport::Address;

use super::CliError;
use super::cluster_file::ClusterFile;

/// How long the coordinator has to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// Print where a cluster's job stands, as its active coordinator sees it.
///
/// Asks `/status` of every coordinator whose `[[node]]` in the cluster file names a `metrics`
/// address (or the one --address names) and prints the active one's answer (the highest term
/// wins): `coordinator nN term T active`, `epoch E PHASE`, `replicas H of K`, one `node nN
/// ROLE STATE` per node (live, joining, leaving, silent, kept, dead, left), `lost N RANGES`,
/// `finished yes|no`, then one `peer nN active|standby term T` (or `peer nN unreachable: WHY`)
/// per other coordinator, and last `degraded yes|no`. With no active coordinator answering, a
/// standby's view is printed, first line `... standby`. Exit status 0 when the job runs as set
/// up, 1 when it is degraded (a node silent, kept or dead, a range lost, fewer replicas than
/// asked, no active coordinator answering, a coordinator unreachable), 2 when no coordinator
/// can be asked.
#[derive(clap::Args, Debug)]
pub(crate) struct StatusArgs {
    /// The cluster file: its coordinators' `metrics` addresses are asked.
    #[arg(long, value_name = "FILE", required_unless_present = "address")]
    config: Option<PathBuf>,
    /// One coordinator's metrics address (host:port), instead of the cluster file's.
    #[arg(long, value_name = "ADDR")]
    address: Option<Address>,
}

/// Runs `pserver status`.
pub(crate) fn run(args: StatusArgs) -> Result<(), CliError> {
    let targets: Vec<(Option<NodeId>, Address)> = match (&args.address, &args.config) {
        (Some(address), _) => vec![(None, address.clone())],
        (None, Some(path)) => {
            let file = ClusterFile::load(path).map_err(CliError::input)?;
            let targets: Vec<(Option<NodeId>, Address)> = file
                .roles
                .iter()
                .filter(|(_, role)| **role == Role::Coordinator)
                .filter_map(|(&id, _)| Some((Some(id), file.metrics.get(&id)?.clone())))
                .collect();
            if targets.is_empty() {
                return Err(CliError::Input(format!(
                    "{}: no coordinator's [[node]] names a metrics address to ask: add metrics = \"HOST:PORT\" to it (and run it so), or give --address",
                    path.display()
                )));
            }
            targets
        }
        (None, None) => return Err(CliError::input("give --config or --address")),
    };
    let runtime = super::runtime()?;
    let answers: Vec<Answer> = runtime.block_on(async {
        let asks: Vec<_> = targets
            .iter()
            .map(|(_, address)| {
                let address = address.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(ANSWER_WITHIN, ask(&address)).await {
                        Ok(answer) => answer,
                        Err(_) => Err(format!(
                            "did not answer within {}s",
                            ANSWER_WITHIN.as_secs()
                        )),
                    }
                })
            })
            .collect();
        let mut answers = Vec::with_capacity(asks.len());
        for ((node, address), ask) in targets.iter().zip(asks) {
            let body = ask.await.unwrap_or_else(|e| Err(e.to_string()));
            answers.push(Answer {
                node: *node,
                address: address.clone(),
                body,
            });
        }
        answers
    });
    let (text, degraded) = summarize(&answers)?;
    print!("{text}");
    if degraded {
        return Err(CliError::Found);
    }
    Ok(())
}

/// One coordinator's answer to `/status`, or why there is none.
struct Answer {
    node: Option<NodeId>,
    address: Address,
    body: Result<String, String>,
}

impl Answer {
    /// The node the cluster file names, or the address asked.
    fn name(&self) -> String {
        self.node
            .map_or_else(|| self.address.to_string(), |n| n.to_string())
    }

    /// Whether the answer says it is active, and its term, from its first line
    /// (`coordinator nN term T active|standby`).
    fn mode(&self) -> Option<(bool, u64)> {
        let first = self.body.as_ref().ok()?.lines().next()?;
        let mut words = first.split_whitespace();
        let (Some("coordinator"), Some(_), Some("term"), Some(term), mode) = (
            words.next(),
            words.next(),
            words.next(),
            words.next(),
            words.next(),
        ) else {
            return None;
        };
        Some((mode != Some("standby"), term.parse().ok()?))
    }
}

/// The text to print and whether the job is degraded: the active coordinator's answer with the
/// highest term (a standby's where none is active), a line for every other coordinator, and
/// the verdict last.
fn summarize(answers: &[Answer]) -> Result<(String, bool), CliError> {
    let chosen = answers
        .iter()
        .enumerate()
        .filter_map(|(i, a)| Some((a.mode()?, i)))
        .max()
        .map(|(_, i)| i);
    let Some(chosen) = chosen else {
        let why: Vec<String> = answers
            .iter()
            .map(|a| match &a.body {
                Err(why) => format!("cannot ask the coordinator at {}: {why}", a.address),
                Ok(body) => format!(
                    "the coordinator at {} answered what is not a status: {}",
                    a.address,
                    body.lines().next().unwrap_or_default()
                ),
            })
            .collect();
        return Err(CliError::Input(why.join("; ")));
    };
    let body = answers[chosen].body.as_deref().unwrap_or_default();
    let (facts, verdict) = body.trim_end().rsplit_once('\n').unwrap_or(("", body));
    let mut degraded = verdict.trim() == "degraded yes";
    let mut text = format!("{facts}\n");
    if answers[chosen].mode().is_some_and(|(active, _)| !active) {
        degraded = true;
    }
    for (i, a) in answers.iter().enumerate() {
        if i == chosen {
            continue;
        }
        let line = match (a.mode(), &a.body) {
            (Some((active, term)), _) => {
                let mode = if active { "active" } else { "standby" };
                format!("peer {} {mode} term {term}", a.name())
            }
            (None, Err(why)) => {
                degraded = true;
                format!("peer {} unreachable: {}: {why}", a.name(), a.address)
            }
            (None, Ok(_)) => {
                degraded = true;
                format!("peer {} unreachable: {}: no status", a.name(), a.address)
            }
        };
        text += &line;
        text.push('\n');
    }
    text += if degraded {
        "degraded yes\n"
    } else {
        "degraded no\n"
    };
    Ok((text, degraded))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(node: u32, body: Result<&str, &str>) -> Answer {
        Answer {
            node: Some(NodeId(node)),
            address: format!("127.0.0.1:{}", 9100 + node)
                .parse()
                .expect("an address"),
            body: body.map(str::to_owned).map_err(str::to_owned),
        }
    }

    const ACTIVE: &str =
        "coordinator n5 term 1 active\nepoch 1000000001 running\nfinished no\ndegraded no\n";
    const STALE: &str =
        "coordinator n0 term 0 standby\nepoch 7 running\nfinished no\ndegraded no\n";

    #[test]
    fn the_active_coordinator_with_the_highest_term_is_printed_and_the_others_listed() {
        let (text, degraded) =
            summarize(&[answer(0, Ok(STALE)), answer(5, Ok(ACTIVE))]).expect("a status");
        assert_eq!(
            text,
            "coordinator n5 term 1 active\nepoch 1000000001 running\nfinished no\npeer n0 standby term 0\ndegraded no\n"
        );
        assert!(!degraded);
    }

    #[test]
    fn an_unreachable_coordinator_or_none_active_is_degraded() {
        let (text, degraded) =
            summarize(&[answer(0, Err("connection refused")), answer(5, Ok(ACTIVE))])
                .expect("a status");
        assert!(degraded);
        assert!(text.contains("peer n0 unreachable: 127.0.0.1:9100: connection refused\n"));
        assert!(text.ends_with("degraded yes\n"), "{text}");

        let (text, degraded) = summarize(&[answer(0, Ok(STALE))]).expect("a status");
        assert!(degraded, "a standby's view with no active coordinator");
        assert!(text.starts_with("coordinator n0 term 0 standby\n"));
        assert!(text.ends_with("degraded yes\n"), "{text}");
    }

    #[test]
    fn no_coordinator_answering_is_an_error_naming_each() {
        let Err(CliError::Input(why)) = summarize(&[
            answer(0, Err("connection refused")),
            answer(5, Ok("only the coordinator answers /status")),
        ]) else {
            panic!("an input error");
        };
        assert!(why.contains("cannot ask the coordinator at 127.0.0.1:9100: connection refused"));
        assert!(why.contains("127.0.0.1:9105 answered what is not a status"));
    }
}
