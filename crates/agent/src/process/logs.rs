//! Task output of the process executor: a relay copies a task's stdout or stderr pipe into
//! `stdout.log` / `stderr.log` in its task dir, one record per line: `<unix seconds>.<9-digit nanos> <line>`;
//! `read` turns those files back into log lines (merged by time, with since, tail and follow).
//!
//! Bounds: a line longer than `MAX_LINE_BYTES` is split; `follow` polls the files every `FOLLOW_POLL`; at
//! most `READ_QUEUE` lines wait for a slow reader. Must not depend on the session or gRPC.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::exec::{ExecutorError, LogLine, LogOptions, LogStream};

/// Longest line kept whole; longer ones are split into several records.
pub const MAX_LINE_BYTES: usize = 16 * 1024;
/// How often a followed log file is checked for new lines.
pub const FOLLOW_POLL: Duration = Duration::from_millis(100);
/// Lines read ahead of a slow consumer.
pub const READ_QUEUE: usize = 256;

/// The log file of one stream in a task dir.
pub fn log_path(task_dir: &Path, stderr: bool) -> PathBuf {
    task_dir.join(if stderr { "stderr.log" } else { "stdout.log" })
}

fn record(ts: SystemTime, line: &[u8]) -> Vec<u8> {
    let d = ts.duration_since(UNIX_EPOCH).unwrap_or_default();
    let mut out = format!("{}.{:09} ", d.as_secs(), d.subsec_nanos()).into_bytes();
    out.extend_from_slice(line);
    out.push(b'\n');
    out
}

/// Parses one record (without its newline).
fn parse(line: &[u8], stderr: bool) -> Option<LogLine> {
    let sp = line.iter().position(|b| *b == b' ')?;
    let (secs, nanos) = std::str::from_utf8(&line[..sp]).ok()?.split_once('.')?;
    let ts = UNIX_EPOCH + Duration::new(secs.parse().ok()?, nanos.parse().ok()?);
    Some(LogLine { timestamp: ts, stderr, data: line[sp + 1..].to_vec() })
}

/// Copies `pipe` into `path` as timestamped records until the pipe closes.
pub async fn relay(mut pipe: impl AsyncRead + Unpin, path: PathBuf) {
    let mut file = match tokio::fs::OpenOptions::new().create(true).append(true).open(&path).await {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(path = %path.display(), "cannot open the task's log file: {e}");
            return;
        }
    };
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 8192];
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => 0,
            Ok(n) => n,
        };
        if n == 0 {
            break;
        }
        pending.extend_from_slice(&buf[..n]);
        let now = SystemTime::now();
        let mut out = Vec::new();
        while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=pos).collect();
            out.extend(record(now, &line[..line.len() - 1]));
        }
        while pending.len() >= MAX_LINE_BYTES {
            let part: Vec<u8> = pending.drain(..MAX_LINE_BYTES).collect();
            out.extend(record(now, &part));
        }
        if !out.is_empty() && file.write_all(&out).await.is_err() {
            return;
        }
    }
    if !pending.is_empty() {
        let _ = file.write_all(&record(SystemTime::now(), &pending)).await;
    }
    let _ = file.flush().await;
}

/// Complete records of `path` from byte `from`; returns them and the offset after the last complete one.
fn read_from(path: &Path, from: u64, stderr: bool) -> (Vec<LogLine>, u64) {
    let Ok(bytes) = std::fs::read(path) else { return (vec![], from) };
    let start = (from as usize).min(bytes.len());
    let end = bytes[start..].iter().rposition(|b| *b == b'\n').map_or(start, |p| start + p + 1);
    let lines = bytes[start..end].split(|b| *b == b'\n').filter(|l| !l.is_empty()).filter_map(|l| parse(l, stderr));
    (lines.collect(), end as u64)
}

/// The task's lines per `opts`.
pub fn read(task_dir: PathBuf, opts: &LogOptions) -> Result<LogStream, ExecutorError> {
    if !task_dir.is_dir() {
        return Err(ExecutorError::Runtime(format!("no output recorded at {}", task_dir.display())));
    }
    let both = !opts.stdout && !opts.stderr;
    let streams: Vec<bool> = [(both || opts.stdout, false), (both || opts.stderr, true)]
        .into_iter()
        .filter_map(|(on, stderr)| on.then_some(stderr))
        .collect();
    let mut offsets = vec![0u64; streams.len()];
    let mut first: Vec<LogLine> = Vec::new();
    for (i, &stderr) in streams.iter().enumerate() {
        let (lines, end) = read_from(&log_path(&task_dir, stderr), 0, stderr);
        offsets[i] = end;
        first.extend(lines);
    }
    first.sort_by_key(|l| l.timestamp);
    let since = opts.since;
    first.retain(|l| since.is_none_or(|s| l.timestamp > s));
    if let Some(n) = opts.tail {
        let skip = first.len().saturating_sub(n);
        first.drain(..skip);
    }
    let (tx, rx) = mpsc::channel(READ_QUEUE);
    let follow = opts.follow;
    tokio::spawn(async move {
        for l in first {
            if tx.send(Ok(l)).await.is_err() {
                return;
            }
        }
        if !follow {
            return;
        }
        loop {
            tokio::time::sleep(FOLLOW_POLL).await;
            if tx.is_closed() || !task_dir.is_dir() {
                return;
            }
            for (i, &stderr) in streams.iter().enumerate() {
                let (lines, end) = read_from(&log_path(&task_dir, stderr), offsets[i], stderr);
                offsets[i] = end;
                for l in lines.into_iter().filter(|l| since.is_none_or(|s| l.timestamp > s)) {
                    if tx.send(Ok(l)).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test]
    async fn relayed_lines_come_back_with_tail_since_and_streams() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        relay(&b"one\ntwo\nthree"[..], log_path(&d, false)).await;
        let before_err = SystemTime::now();
        relay(&b"oops\n"[..], log_path(&d, true)).await;
        let all = |o: LogOptions| {
            let d = d.clone();
            async move { read(d, &o).unwrap().map(|l| l.unwrap()).collect::<Vec<_>>().await }
        };
        let both = all(LogOptions { stdout: true, stderr: true, ..Default::default() }).await;
        let text: Vec<String> = both.iter().map(|l| String::from_utf8_lossy(&l.data).into_owned()).collect();
        assert_eq!(text, ["one", "two", "three", "oops"]);
        assert!(both[3].stderr && !both[0].stderr);
        let last2 = all(LogOptions { stdout: true, tail: Some(2), ..Default::default() }).await;
        assert_eq!(last2.iter().map(|l| l.data.clone()).collect::<Vec<_>>(), [b"two".to_vec(), b"three".to_vec()]);
        let since = all(LogOptions { stdout: true, stderr: true, since: Some(before_err), ..Default::default() }).await;
        assert_eq!(since.len(), 1, "{since:?}");
    }

    #[tokio::test]
    async fn long_lines_are_split_and_follow_sees_new_lines() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        let long = vec![b'x'; MAX_LINE_BYTES + 10];
        relay(&long[..], log_path(&d, false)).await;
        let mut s = read(d.clone(), &LogOptions { stdout: true, follow: true, ..Default::default() }).unwrap();
        assert_eq!(s.next().await.unwrap().unwrap().data.len(), MAX_LINE_BYTES);
        assert_eq!(s.next().await.unwrap().unwrap().data.len(), 10);
        relay(&b"later\n"[..], log_path(&d, false)).await;
        let next = tokio::time::timeout(Duration::from_secs(10), s.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(next.data, b"later");
    }
}
