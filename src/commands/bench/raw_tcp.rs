//! The baselines every figure is compared with: what a raw TCP stream on loopback can do.

use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::requests::percentiles;
use super::{BenchError, Measure, runtime_err};

/// The baselines: one raw tokio TCP stream on loopback (GB/s) and an 8-byte ping-pong (p50,
/// microseconds).
pub(super) async fn raw_tcp(quick: bool) -> Result<Vec<Measure>, BenchError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let total: usize = if quick { 16 << 20 } else { 1 << 30 };
    let reader = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        while got < total {
            let want = (total - got).min(buf.len());
            let n = s.read(&mut buf[..want]).await?;
            if n == 0 {
                break;
            }
            got += n;
        }
        // Ping-pong on the same connection.
        let mut ping = [0u8; 8];
        while s.read_exact(&mut ping).await.is_ok() {
            s.write_all(&ping).await?;
        }
        Ok::<usize, std::io::Error>(got)
    });
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let chunk = vec![1u8; 1 << 20];
    let start = Instant::now();
    let mut sent = 0;
    while sent < total {
        s.write_all(&chunk).await?;
        sent += chunk.len();
    }
    s.flush().await?;
    // The reader reads the same amount before it answers pings: the first pong ends the
    // stream measure.
    let mut pong = [0u8; 8];
    s.write_all(&[0u8; 8]).await?;
    s.read_exact(&mut pong).await?;
    let stream = total as f64 / start.elapsed().as_secs_f64() / 1e9;
    let n = if quick { 200 } else { 10_000 };
    let mut times = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let start = Instant::now();
        s.write_all(&i.to_le_bytes()).await?;
        s.read_exact(&mut pong).await?;
        times.push(start.elapsed());
    }
    drop(s);
    reader.await.map_err(runtime_err)??;
    let (p50, _) = percentiles(&mut times);
    Ok(vec![
        Measure {
            name: "raw_tcp.stream".into(),
            value: stream,
            unit: "GB/s",
        },
        Measure {
            name: "raw_tcp.ping_pong.p50".into(),
            value: p50,
            unit: "us",
        },
    ])
}
