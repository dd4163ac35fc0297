//! Task output of the process executor: a relay copies a task's stdout or stderr pipe into
//! `stdout.log` / `stderr.log` in its task dir, one record per line: `<unix seconds>.<9-digit nanos> <line>`;
//! `read` turns those files back into log lines (merged by time, with since, tail and follow).
//!
//! Bounds: a line longer than `MAX_LINE_BYTES` is split; files are read `READ_CHUNK` bytes at a time (a
//! reader holds about that much however long the log: `tail=all` of an 80 MB log is streamed, never read
//! whole); `follow` polls the files every `FOLLOW_POLL` from where it stopped; at most `READ_QUEUE` lines
//! wait for a slow reader. Must not depend on the session or gRPC.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::exec::{ExecutorError, LogLine, LogOptions, LogStream};

/// Longest line kept whole; longer ones are split into several records.
pub(crate) const MAX_LINE_BYTES: usize = 16 * 1024;
/// How often a followed log file is checked for new lines.
pub(crate) const FOLLOW_POLL: Duration = Duration::from_millis(100);
/// Lines read ahead of a slow consumer.
pub(crate) const READ_QUEUE: usize = 256;

/// The log file of one stream in a task dir.
pub(crate) fn log_path(task_dir: &Path, stderr: bool) -> PathBuf {
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
pub(crate) async fn relay(mut pipe: impl AsyncRead + Unpin, path: PathBuf) {
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

/// Bytes read from a log file at a time: memory per reader is about this much, however long the log.
const READ_CHUNK: usize = 64 * 1024;

/// The records of one log file, read a chunk at a time from an offset that moves past complete records.
struct RecordReader {
    path: PathBuf,
    stderr: bool,
    offset: u64,
    lines: std::collections::VecDeque<LogLine>,
}

impl RecordReader {
    /// Reads the next chunk's complete records into `lines`; false when nothing more is there yet.
    fn fill(&mut self) -> bool {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut f) = std::fs::File::open(&self.path) else { return false };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return false;
        }
        let mut buf = Vec::with_capacity(READ_CHUNK);
        if f.take(READ_CHUNK as u64).read_to_end(&mut buf).is_err() || buf.is_empty() {
            return false;
        }
        let Some(last) = buf.iter().rposition(|b| *b == b'\n') else {
            // A record is at most MAX_LINE_BYTES and its stamp, far less than a chunk: a chunk without a newline
            // is a record still being written, or a damaged file when the chunk is full (skipped, never stuck).
            if buf.len() == READ_CHUNK {
                self.offset += buf.len() as u64;
                return true;
            }
            return false;
        };
        self.offset += last as u64 + 1;
        let stderr = self.stderr;
        self.lines
            .extend(buf[..last].split(|b| *b == b'\n').filter(|l| !l.is_empty()).filter_map(|l| parse(l, stderr)));
        true
    }
}

/// Where the last `n` complete records of `path` start, and how many there are (fewer when the file has fewer):
/// read backwards a chunk at a time.
fn tail_offset(path: &Path, n: usize) -> (u64, usize) {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return (0, 0) };
    let mut pos = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut newlines = 0usize;
    let mut buf = vec![0u8; READ_CHUNK];
    while pos > 0 {
        let len = usize::try_from(pos).map_or(READ_CHUNK, |p| p.min(READ_CHUNK));
        let start = pos - len as u64;
        if f.seek(SeekFrom::Start(start)).is_err() || f.read_exact(&mut buf[..len]).is_err() {
            break;
        }
        for i in (0..len).rev() {
            if buf[i] == b'\n' {
                newlines += 1;
                // The record after the (n+1)th newline from the end is the first of the last n.
                if newlines == n + 1 {
                    return (start + i as u64 + 1, n);
                }
            }
        }
        pos = start;
    }
    (0, newlines)
}

/// The task's lines per `opts`, merged by time: both files are read a chunk at a time (with `tail`, from
/// where their last lines start), so memory stays bounded however long the log is; with `follow`, what is
/// appended later is read from where the reading stopped.
pub(crate) fn read(task_dir: PathBuf, opts: &LogOptions) -> Result<LogStream, ExecutorError> {
    if !task_dir.is_dir() {
        return Err(ExecutorError::Runtime(format!("no output recorded at {}", task_dir.display())));
    }
    let both = !opts.stdout && !opts.stderr;
    let mut readers: Vec<RecordReader> = Vec::new();
    let mut counted = 0usize;
    for (on, stderr) in [(both || opts.stdout, false), (both || opts.stderr, true)] {
        if !on {
            continue;
        }
        let path = log_path(&task_dir, stderr);
        let (offset, count) = opts.tail.map_or((0, 0), |n| tail_offset(&path, n));
        counted += count;
        readers.push(RecordReader { path, stderr, offset, lines: Default::default() });
    }
    // With a tail, the last n of the merged streams: the oldest of the 2n candidates are skipped.
    let mut skip = opts.tail.map_or(0, |n| counted.saturating_sub(n));
    let since = opts.since;
    let (tx, rx) = mpsc::channel(READ_QUEUE);
    let follow = opts.follow;
    tokio::spawn(async move {
        let mut done = vec![false; readers.len()];
        loop {
            for (r, done) in readers.iter_mut().zip(done.iter_mut()) {
                if r.lines.is_empty() && !*done && !r.fill() {
                    *done = true;
                }
            }
            // The oldest line first; on a tie stdout's (the first reader).
            let next = (0..readers.len())
                .filter(|&i| !readers[i].lines.is_empty())
                .min_by_key(|&i| (readers[i].lines[0].timestamp, i));
            let Some(i) = next else { break };
            let l = readers[i].lines.pop_front().expect("not empty");
            if skip > 0 {
                skip -= 1;
                continue;
            }
            if since.is_some_and(|s| l.timestamp <= s) {
                continue;
            }
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
            for r in readers.iter_mut() {
                while r.fill() {
                    while let Some(l) = r.lines.pop_front() {
                        if since.is_none_or(|s| l.timestamp > s) && tx.send(Ok(l)).await.is_err() {
                            return;
                        }
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

    fn rss_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Issue 31 (5): 20 unread `tail=all` readers of an 80 MB log took the daemon to 1.8 GB. Here, 20 readers of
    /// a 32 MB log, each having sent its first line and then not read: the process grows by far less than one
    /// copy of the log (each reader holds a chunk and its queue, not the file).
    #[tokio::test]
    async fn unread_readers_of_a_long_log_hold_a_chunk_each_not_the_whole_log() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        {
            let line = vec![b'y'; 90];
            let mut content = Vec::with_capacity(33 << 20);
            let t0 = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
            let mut i = 0u64;
            while content.len() < 32 << 20 {
                content.extend(record(t0 + Duration::from_micros(i), &line));
                i += 1;
            }
            std::fs::write(log_path(&d, false), &content).unwrap();
        }
        let before = rss_kib();
        let mut streams = Vec::new();
        for _ in 0..20 {
            let mut s = read(d.clone(), &LogOptions { stdout: true, ..Default::default() }).unwrap();
            assert_eq!(s.next().await.unwrap().unwrap().data.len(), 90);
            streams.push(s);
        }
        let grown_mib = rss_kib().saturating_sub(before) / 1024;
        assert!(grown_mib < 32, "20 unread readers grew the process by {grown_mib} MiB");
    }

    /// Tail and merge across chunk boundaries: 3,000 records on each stream, interleaved in time; the last
    /// 1,001 merged records come back in order, and all 6,000 without a tail.
    #[tokio::test]
    async fn tail_and_merge_cross_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        let t0 = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        for stderr in [false, true] {
            let mut content = Vec::new();
            for i in 0..3000u64 {
                let at = t0 + Duration::from_millis(2 * i + stderr as u64);
                content.extend(record(at, format!("{:>60}", 2 * i + stderr as u64).as_bytes()));
            }
            std::fs::write(log_path(&d, stderr), &content).unwrap();
        }
        let numbers = |o: LogOptions| {
            let d = d.clone();
            async move {
                read(d, &o)
                    .unwrap()
                    .map(|l| String::from_utf8(l.unwrap().data).unwrap().trim().parse::<u64>().unwrap())
                    .collect::<Vec<_>>()
                    .await
            }
        };
        let all = numbers(LogOptions { stdout: true, stderr: true, ..Default::default() }).await;
        assert_eq!(all, (0..6000).collect::<Vec<_>>());
        let last = numbers(LogOptions { stdout: true, stderr: true, tail: Some(1001), ..Default::default() }).await;
        assert_eq!(last, (4999..6000).collect::<Vec<_>>());
        let none = numbers(LogOptions { stdout: true, stderr: true, tail: Some(0), ..Default::default() }).await;
        assert!(none.is_empty());
        let more = numbers(LogOptions { stderr: true, tail: Some(10_000), ..Default::default() }).await;
        assert_eq!(more.len(), 3000);
    }
}
