//! Headless Chromium for tests of web pages, driven over the Chrome DevTools Protocol with a tiny blocking
//! WebSocket client (text frames only; enough for CDP's JSON messages): open a page, evaluate JavaScript in
//! it, wait on a condition with a deadline, save a screenshot. The browser runs as Debian's `chromium`
//! package (`.ci/run` installs it), with a profile in the target dir; dropping the `Browser` kills it and
//! removes the profile, so a failing test leaves nothing behind. Must not depend on Shoal's crates.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

/// The browser binary (Debian's package name).
pub const CHROMIUM: &str = "chromium";

/// Largest CDP message read (a full-page screenshot is a few MiB of base64).
const MAX_MESSAGE_BYTES: u64 = 64 << 20;

/// A headless Chromium with one page open.
pub struct Browser {
    child: Child,
    profile: PathBuf,
    ws: WebSocket,
    next_id: u64,
}

impl Browser {
    /// Starts Chromium on `about:blank` and attaches to its page. Panics (naming the package to install)
    /// when Chromium is missing, and when it does not come up within a minute.
    pub fn launch() -> Browser {
        let profile = crate::scratch_dir().join(format!("chromium-{}-{}", std::process::id(), unique()));
        let _ = std::fs::remove_dir_all(&profile);
        std::fs::create_dir_all(&profile).expect("chromium profile dir");
        let child = Command::new(CHROMIUM)
            .args([
                "--headless=new",
                // Tests run as root, where Chromium's sandbox cannot start.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--hide-scrollbars",
                "--window-size=1280,860",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group, so that killing it kills its renderer and helper processes too.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {CHROMIUM} ({e}): install Debian's chromium package (.ci/run does)")
            });
        let mut guard = StartGuard { child: Some(child), profile: profile.clone() };
        // Chromium writes the port it picked (and the browser's WebSocket path) here once it listens.
        let port_file = profile.join("DevToolsActivePort");
        let port: u16 = crate::wait_until("chromium's DevToolsActivePort", Duration::from_secs(60), || {
            let text = std::fs::read_to_string(&port_file).map_err(|e| e.to_string())?;
            text.lines().next().and_then(|l| l.trim().parse().ok()).ok_or_else(|| format!("not yet: {text:?}"))
        });
        let ws_url = crate::wait_until("chromium's page target", Duration::from_secs(30), || {
            let list = http_get_json(port, "/json/list")?;
            list.as_array()
                .and_then(|targets| targets.iter().find(|t| t["type"] == "page"))
                .and_then(|t| t["webSocketDebuggerUrl"].as_str().map(str::to_string))
                .ok_or_else(|| format!("no page target yet: {list}"))
        });
        let ws = WebSocket::connect(&ws_url).unwrap_or_else(|e| panic!("CDP WebSocket {ws_url}: {e}"));
        let child = guard.child.take().expect("the browser process");
        let mut b = Browser { child, profile, ws, next_id: 0 };
        b.call("Page.enable", json!({}));
        b.call("Runtime.enable", json!({}));
        b
    }

    /// Sends one CDP command and returns its `result` (panics on an error answer).
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.ws.send_text(&json!({ "id": id, "method": method, "params": params }).to_string()).expect("CDP send");
        loop {
            let text = self.ws.read_text().unwrap_or_else(|e| panic!("CDP {method}: {e}"));
            let msg: Value = serde_json::from_str(&text).expect("CDP JSON");
            if msg["id"].as_u64() != Some(id) {
                continue; // an event
            }
            if let Some(err) = msg.get("error") {
                panic!("CDP {method} failed: {err}");
            }
            return msg["result"].clone();
        }
    }

    /// Opens `url` in the page (returns once the navigation is committed; wait on the page's content with
    /// `wait_for`).
    pub fn navigate(&mut self, url: &str) {
        let r = self.call("Page.navigate", json!({ "url": url }));
        if let Some(e) = r.get("errorText") {
            panic!("navigating to {url}: {e}");
        }
    }

    /// Evaluates a JavaScript expression in the page and returns its value (JSON-serialisable values only).
    pub fn eval(&mut self, expression: &str) -> Value {
        self.try_eval(expression).unwrap_or_else(|e| panic!("evaluating {expression}: {e}"))
    }

    /// Evaluates a JavaScript expression; an exception it throws is the error.
    pub fn try_eval(&mut self, expression: &str) -> Result<Value, String> {
        let r = self.call("Runtime.evaluate", json!({ "expression": expression, "returnByValue": true }));
        match r.get("exceptionDetails") {
            Some(ex) => Err(ex["exception"]["description"].as_str().map_or_else(|| ex.to_string(), str::to_string)),
            None => Ok(r["result"]["value"].clone()),
        }
    }

    /// Waits until `expression` evaluates to something truthy in the page; returns that value. An exception
    /// (the page still loading) counts as not yet. Panics with `what` and the last value after `deadline`.
    pub fn wait_for(&mut self, what: &str, expression: &str, deadline: Duration) -> Value {
        crate::wait::wait_until_every(what, deadline, Duration::from_millis(100), || {
            let v = self.try_eval(expression).unwrap_or_else(|e| Value::String(format!("exception: {e}")));
            let truthy = match &v {
                Value::String(s) if s.starts_with("exception: ") => false,
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                Ok(v)
            } else {
                Err(format!("`{expression}` is {v}"))
            }
        })
    }

    /// Saves a PNG screenshot of the page's viewport at `path`.
    pub fn screenshot(&mut self, path: &Path) {
        use base64::Engine;
        let r = self.call("Page.captureScreenshot", json!({ "format": "png", "captureBeyondViewport": false }));
        let data = r["data"].as_str().expect("screenshot data");
        let png = base64::engine::general_purpose::STANDARD.decode(data).expect("screenshot base64");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("screenshot dir");
        }
        std::fs::write(path, png).expect("write screenshot");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        kill_group(&mut self.child);
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Kills the browser's whole process group and reaps the browser.
fn kill_group(child: &mut Child) {
    let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
    let _ = child.kill();
    let _ = child.wait();
}

/// Kills a browser whose start failed half-way (a panic while waiting for it), and removes its profile.
struct StartGuard {
    child: Option<Child>,
    profile: PathBuf,
}

impl Drop for StartGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_group(&mut child);
            let _ = std::fs::remove_dir_all(&self.profile);
        }
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn http_get_json(port: u16, path: &str) -> Result<Value, String> {
    let s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    let mut w = s.try_clone().map_err(|e| e.to_string())?;
    write!(w, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").map_err(|e| e.to_string())?;
    // Chromium keeps the connection open: read the head, then Content-Length bytes.
    let mut r = BufReader::new(s);
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).map_err(|e| e.to_string())?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().map_err(|e| format!("content-length: {e}"))?;
        }
    }
    if len as u64 > MAX_MESSAGE_BYTES {
        return Err(format!("an answer of {len} bytes"));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(|e| e.to_string())?;
    serde_json::from_slice(&body).map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&body)))
}

/// A client WebSocket (RFC 6455) over plain TCP: masked text frames out, text frames in (fragments joined,
/// pings answered).
struct WebSocket {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl WebSocket {
    fn connect(url: &str) -> Result<WebSocket, String> {
        let rest = url.strip_prefix("ws://").ok_or_else(|| format!("not a ws:// URL: {url}"))?;
        let (host, path) = rest.split_once('/').ok_or("no path")?;
        let stream = TcpStream::connect(host).map_err(|e| e.to_string())?;
        stream.set_read_timeout(Some(Duration::from_secs(60))).map_err(|e| e.to_string())?;
        let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
        // The key is any 16 bytes in base64; the answer's accept value is not checked (a test client).
        write!(
            writer,
            "GET /{path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: c2hvYWwtdGVzdGtpdC1rZXk=\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .map_err(|e| e.to_string())?;
        let mut reader = BufReader::new(stream);
        let mut status = String::new();
        reader.read_line(&mut status).map_err(|e| e.to_string())?;
        if !status.contains(" 101 ") {
            return Err(format!("WebSocket upgrade refused: {status}"));
        }
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).map_err(|e| e.to_string())?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        Ok(WebSocket { reader, writer })
    }

    fn send_frame(&mut self, opcode: u8, payload: &[u8]) -> std::io::Result<()> {
        let mut frame = vec![0x80 | opcode];
        let len = payload.len();
        if let Ok(small @ 0..126) = u8::try_from(len) {
            frame.push(0x80 | small);
        } else if let Ok(len) = u16::try_from(len) {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&len.to_be_bytes());
        } else {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&(len as u64).to_be_bytes());
        }
        let mask = [0x5a, 0x3c, 0x96, 0x0f];
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.writer.write_all(&frame)
    }

    fn send_text(&mut self, text: &str) -> std::io::Result<()> {
        self.send_frame(0x1, text.as_bytes())
    }

    fn read_text(&mut self) -> Result<String, String> {
        let mut message = Vec::new();
        loop {
            let mut head = [0u8; 2];
            self.reader.read_exact(&mut head).map_err(|e| e.to_string())?;
            let (fin, opcode) = (head[0] & 0x80 != 0, head[0] & 0x0f);
            let masked = head[1] & 0x80 != 0;
            let mut len = u64::from(head[1] & 0x7f);
            if len == 126 {
                let mut b = [0u8; 2];
                self.reader.read_exact(&mut b).map_err(|e| e.to_string())?;
                len = u64::from(u16::from_be_bytes(b));
            } else if len == 127 {
                let mut b = [0u8; 8];
                self.reader.read_exact(&mut b).map_err(|e| e.to_string())?;
                len = u64::from_be_bytes(b);
            }
            if message.len() as u64 + len > MAX_MESSAGE_BYTES {
                return Err(format!("a CDP message over {MAX_MESSAGE_BYTES} bytes"));
            }
            let mut mask = [0u8; 4];
            if masked {
                self.reader.read_exact(&mut mask).map_err(|e| e.to_string())?;
            }
            let len = usize::try_from(len).map_err(|_| format!("a CDP frame of {len} bytes"))?;
            let mut payload = vec![0u8; len];
            self.reader.read_exact(&mut payload).map_err(|e| e.to_string())?;
            if masked {
                payload.iter_mut().enumerate().for_each(|(i, b)| *b ^= mask[i % 4]);
            }
            match opcode {
                0x0..=0x2 => {
                    message.extend_from_slice(&payload);
                    if fin {
                        return String::from_utf8(message).map_err(|e| e.to_string());
                    }
                }
                0x8 => return Err("the browser closed the WebSocket".into()),
                0x9 => self.send_frame(0xA, &payload).map_err(|e| e.to_string())?,
                _ => {}
            }
        }
    }
}
