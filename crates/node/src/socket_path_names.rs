//! What grpc-go sends when it is dialed with a socket path, and how the SwarmKit API socket takes it. The
//! stock `swarmctl -s /abs/path/swarmd.sock` (grpc-go 1.53, as SwarmKit vendors it) uses the dial target,
//! the path, as the TLS server name (SNI) and as the HTTP/2 `:authority` of every request. A path is neither
//! a DNS name nor an authority: rustls 0.23 refuses such a ClientHello (an illegal parameter alert, with no
//! setting to ignore it) and the `h2` server resets every stream whose authority does not parse.
//!
//! So the socket looks at each connection's ClientHello first (`client_hello_sni`, without consuming it:
//! `Replay` hands the bytes on). A connection whose SNI is absent or a DNS name goes to rustls as before;
//! one whose SNI is not a DNS name is answered by OpenSSL (which, as Go's server, does not judge the name),
//! and its requests pass through `AuthorityFix`, which replaces an `:authority` that does not parse with
//! `localhost` (what grpc-go itself sends for a `unix:` target). Nothing else changes for anyone: the
//! name is not used to choose a certificate, and the socket's file mode stays the access control.
//!
//! `AuthorityFix` is a sans-IO rewriter of the client's side of an HTTP/2 connection: the preface and every
//! frame pass through untouched except header blocks (HEADERS and its CONTINUATIONs), which are decoded
//! with the client's HPACK context and encoded again with one of its own towards the server (so both
//! sides' dynamic tables stay consistent), padding dropped, priority kept. Huffman-coded strings are written
//! out first (`without_huffman`), with one decoder built once: loona-hpack builds its tables for each string.
//! Bounds: a header block of at most `MAX_HEADER_BLOCK_BYTES` (beyond it the connection is refused), frames
//! sent on of at most 16,384 bytes (HTTP/2's default `SETTINGS_MAX_FRAME_SIZE`, which the server keeps).
//!
//! Must not know what is served; only TLS records and HTTP/2 frames.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The longest header block accepted (a request's headers, all its CONTINUATIONs together).
pub(crate) const MAX_HEADER_BLOCK_BYTES: usize = 256 * 1024;
/// The frame size sent on (HTTP/2's initial `SETTINGS_MAX_FRAME_SIZE`).
const MAX_FRAME_BYTES: usize = 16_384;
/// The authority put in place of one that does not parse.
pub(crate) const REPLACEMENT_AUTHORITY: &str = "localhost";

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADERS: u8 = 0x1;
const FRAME_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;

/// What the start of a connection says about its TLS server name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Sni {
    /// More bytes are needed to tell.
    Incomplete,
    /// Not a TLS ClientHello, no server name, or one rustls takes (a DNS name): the usual path.
    Acceptable,
    /// A server name that is not a DNS name (e.g. a socket path), as bytes.
    NotADnsName(Vec<u8>),
}

/// Reads the server name of the ClientHello at the start of `bytes` (the first TLS record; a ClientHello
/// that does not fit in it is `Acceptable`: rustls judges it).
pub(crate) fn client_hello_sni(bytes: &[u8]) -> Sni {
    if bytes.len() < 5 {
        return Sni::Incomplete;
    }
    if bytes[0] != 22 {
        return Sni::Acceptable;
    }
    let record_len = u16::from_be_bytes([bytes[3], bytes[4]]) as usize;
    let Some(record) = bytes.get(5..5 + record_len) else { return Sni::Incomplete };
    match server_name(record) {
        Some(name) if rustls::pki_types::DnsName::try_from(name.as_slice()).is_err() => Sni::NotADnsName(name),
        _ => Sni::Acceptable,
    }
}

/// A cursor over a byte slice for the ClientHello's length-prefixed fields.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }

    fn len8(&mut self) -> Option<&'a [u8]> {
        let n = *self.take(1)?.first()? as usize;
        self.take(n)
    }

    fn len16(&mut self) -> Option<&'a [u8]> {
        let b = self.take(2)?;
        self.take(u16::from_be_bytes([b[0], b[1]]) as usize)
    }
}

/// The host name of a ClientHello handshake message's `server_name` extension.
fn server_name(handshake: &[u8]) -> Option<Vec<u8>> {
    let mut c = Cursor(handshake);
    if c.take(1)? != [1] {
        return None;
    }
    let len = c.take(3)?;
    let len = (len[0] as usize) << 16 | (len[1] as usize) << 8 | len[2] as usize;
    let mut hello = Cursor(c.take(len)?);
    hello.take(2 + 32)?; // version, random
    hello.len8()?; // session ID
    hello.len16()?; // cipher suites
    hello.len8()?; // compression methods
    let mut extensions = Cursor(hello.len16()?);
    while !extensions.0.is_empty() {
        let kind = extensions.take(2)?;
        let body = extensions.len16()?;
        if kind == [0, 0] {
            let mut list = Cursor(Cursor(body).len16()?);
            while !list.0.is_empty() {
                let name_type = list.take(1)?[0];
                let name = list.len16()?;
                if name_type == 0 {
                    return Some(name.to_vec());
                }
            }
        }
    }
    None
}

/// Why a connection's HTTP/2 stream could not be passed on.
#[derive(Debug, thiserror::Error)]
pub enum FixError {
    /// The header block is larger than `MAX_HEADER_BLOCK_BYTES`.
    #[error("a request's headers are larger than {MAX_HEADER_BLOCK_BYTES} bytes")]
    TooLarge,
    /// The bytes are not HTTP/2 as a client sends it.
    #[error("malformed HTTP/2 from the client: {0}")]
    Malformed(String),
}

/// What to put in place of an `:authority` (`None`: keep it).
pub(crate) type AuthorityRule = Box<dyn Fn(&[u8]) -> Option<Vec<u8>> + Send + Sync>;

/// The server's rule: an authority that does not parse becomes `REPLACEMENT_AUTHORITY`.
pub(crate) fn unparsable_to_localhost(authority: &[u8]) -> Option<Vec<u8>> {
    tonic::codegen::http::uri::Authority::try_from(authority)
        .is_err()
        .then(|| REPLACEMENT_AUTHORITY.as_bytes().to_vec())
}

/// The client-to-server side of one HTTP/2 connection, with `:authority` values rewritten by a rule (the
/// server's: `unparsable_to_localhost`; see the module doc). Feed it what the client sent; it gives what to
/// pass to the server.
pub struct AuthorityFix {
    rule: AuthorityRule,
    preface_left: usize,
    buf: Vec<u8>,
    /// Payload bytes of a passed-through frame still to come.
    passing: usize,
    /// A header block being collected: (stream, flags of its HEADERS frame, priority bytes, fragments).
    block: Option<(u32, u8, Vec<u8>, Vec<u8>)>,
    decoder: loona_hpack::Decoder<'static>,
    encoder: loona_hpack::Encoder<'static>,
}

impl std::fmt::Debug for AuthorityFix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorityFix").field("buffered", &self.buf.len()).finish_non_exhaustive()
    }
}

impl Default for AuthorityFix {
    fn default() -> Self {
        AuthorityFix::with_rule(unparsable_to_localhost)
    }
}

impl AuthorityFix {
    /// A rewriter with `rule` (tests and tools: a client that sends what grpc-go sends).
    pub fn with_rule(rule: impl Fn(&[u8]) -> Option<Vec<u8>> + Send + Sync + 'static) -> AuthorityFix {
        AuthorityFix {
            rule: Box::new(rule),
            preface_left: PREFACE.len(),
            buf: Vec::new(),
            passing: 0,
            block: None,
            decoder: loona_hpack::Decoder::new(),
            encoder: loona_hpack::Encoder::new(),
        }
    }
}

fn frame_header(len: usize, kind: u8, flags: u8, stream: u32, out: &mut Vec<u8>) {
    // Callers cut frames to MAX_FRAME_BYTES (tests: at most MAX_HEADER_BLOCK_BYTES + 1), within 24 bits.
    debug_assert!(len < 1 << 24, "an HTTP/2 frame length has 24 bits");
    out.extend_from_slice(&u32::try_from(len).expect("frames are cut to MAX_FRAME_BYTES").to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

impl AuthorityFix {
    /// Takes bytes the client sent; returns the bytes to hand the server (possibly none yet).
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), FixError> {
        let mut input = input;
        if self.preface_left > 0 {
            let n = self.preface_left.min(input.len());
            out.extend_from_slice(&input[..n]);
            self.preface_left -= n;
            input = &input[n..];
        }
        if self.passing > 0 {
            let n = self.passing.min(input.len());
            out.extend_from_slice(&input[..n]);
            self.passing -= n;
            input = &input[n..];
        }
        self.buf.extend_from_slice(input);
        loop {
            if self.buf.len() < 9 {
                return Ok(());
            }
            let len = (self.buf[0] as usize) << 16 | (self.buf[1] as usize) << 8 | self.buf[2] as usize;
            let (kind, flags) = (self.buf[3], self.buf[4]);
            let stream = u32::from_be_bytes([self.buf[5], self.buf[6], self.buf[7], self.buf[8]]) & 0x7fff_ffff;
            let is_block = kind == FRAME_HEADERS || kind == FRAME_CONTINUATION;
            if self.block.is_some() && kind != FRAME_CONTINUATION {
                return Err(FixError::Malformed("a header block was interrupted by another frame".into()));
            }
            if !is_block {
                // Passed on as it comes: the header now, the payload as it arrives.
                let have = (self.buf.len() - 9).min(len);
                out.extend_from_slice(&self.buf[..9 + have]);
                self.passing = len - have;
                self.buf.drain(..9 + have);
                if self.passing > 0 {
                    return Ok(());
                }
                continue;
            }
            if len > MAX_HEADER_BLOCK_BYTES {
                return Err(FixError::TooLarge);
            }
            if self.buf.len() < 9 + len {
                return Ok(());
            }
            let payload: Vec<u8> = self.buf[9..9 + len].to_vec();
            self.buf.drain(..9 + len);
            self.header_frame(kind, flags, stream, &payload, out)?;
        }
    }

    fn header_frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), FixError> {
        let malformed = |m: &str| FixError::Malformed(m.to_string());
        if kind == FRAME_HEADERS {
            let mut p = payload;
            let mut pad = 0;
            if flags & FLAG_PADDED != 0 {
                pad = *p.first().ok_or_else(|| malformed("padded HEADERS without a pad length"))? as usize;
                p = &p[1..];
            }
            let mut priority = Vec::new();
            if flags & FLAG_PRIORITY != 0 {
                priority = p.get(..5).ok_or_else(|| malformed("HEADERS with a short priority"))?.to_vec();
                p = &p[5..];
            }
            let fragment = p.get(..p.len().checked_sub(pad).ok_or_else(|| malformed("padding past the frame"))?);
            self.block = Some((stream, flags, priority, fragment.unwrap_or_default().to_vec()));
        } else {
            let Some((s, _, _, fragments)) = self.block.as_mut() else {
                return Err(malformed("CONTINUATION without HEADERS"));
            };
            if *s != stream {
                return Err(malformed("CONTINUATION of another stream"));
            }
            fragments.extend_from_slice(payload);
            if fragments.len() > MAX_HEADER_BLOCK_BYTES {
                return Err(FixError::TooLarge);
            }
        }
        if flags & FLAG_END_HEADERS == 0 {
            return Ok(());
        }
        let (stream, first_flags, priority, block) = self.block.take().expect("a block is being collected");
        let block = without_huffman(&block)?;
        let mut fields =
            self.decoder.decode(&block).map_err(|e| FixError::Malformed(format!("header compression: {e:?}")))?;
        for (name, value) in fields.iter_mut() {
            if name.as_slice() == b":authority" {
                if let Some(new) = (self.rule)(value) {
                    *value = new;
                }
            }
        }
        let encoded = self.encoder.encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        // HEADERS (priority kept, padding dropped), then CONTINUATIONs, each within the frame size.
        let first_room = MAX_FRAME_BYTES - priority.len();
        let (first, mut rest) = encoded.split_at(encoded.len().min(first_room));
        let mut flags = first_flags & (FLAG_END_STREAM | FLAG_PRIORITY);
        if rest.is_empty() {
            flags |= FLAG_END_HEADERS;
        }
        frame_header(priority.len() + first.len(), FRAME_HEADERS, flags, stream, out);
        out.extend_from_slice(&priority);
        out.extend_from_slice(first);
        while !rest.is_empty() {
            let (chunk, more) = rest.split_at(rest.len().min(MAX_FRAME_BYTES));
            frame_header(
                chunk.len(),
                FRAME_CONTINUATION,
                if more.is_empty() { FLAG_END_HEADERS } else { 0 },
                stream,
                out,
            );
            out.extend_from_slice(chunk);
            rest = more;
        }
        Ok(())
    }
}

/// The integer at `block[*pos]` with a `prefix_bits`-bit prefix (RFC 7541, 5.1), at most 2^28: its value;
/// `*pos` moves past it.
fn hpack_integer(block: &[u8], pos: &mut usize, prefix_bits: u32) -> Result<usize, FixError> {
    let short = || FixError::Malformed("header compression: a cut-off integer".into());
    let mask = (1usize << prefix_bits) - 1;
    let mut value = *block.get(*pos).ok_or_else(short)? as usize & mask;
    *pos += 1;
    if value < mask {
        return Ok(value);
    }
    for shift in (0..28).step_by(7) {
        let b = *block.get(*pos).ok_or_else(short)?;
        *pos += 1;
        value += ((b & 0x7f) as usize) << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(FixError::Malformed("header compression: an integer too large".into()))
}

/// The Huffman decoder of `without_huffman`: loona-hpack builds its tables (257 codes in hash maps) for every
/// Huffman-coded string it decodes itself, most of the cost of a request's headers; built once here.
fn huffman_decoder() -> std::sync::MutexGuard<'static, loona_hpack::huffman::HuffmanDecoder> {
    static DECODER: std::sync::OnceLock<std::sync::Mutex<loona_hpack::huffman::HuffmanDecoder>> =
        std::sync::OnceLock::new();
    let m = DECODER.get_or_init(|| std::sync::Mutex::new(loona_hpack::huffman::HuffmanDecoder::new()));
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `block` with every Huffman-coded string literal written out as plain octets (RFC 7541, 5.2), the rest
/// byte for byte: the same header list, for a decoder that then does no Huffman decoding. Its size is bounded by
/// the block's: a string grows at most 8/5 (the shortest code is 5 bits), its length by a few bytes.
fn without_huffman(block: &[u8]) -> Result<Vec<u8>, FixError> {
    let malformed = |m: &str| FixError::Malformed(format!("header compression: {m}"));
    let mut out = Vec::with_capacity(block.len() * 2);
    let mut pos = 0;
    let string = |pos: &mut usize, out: &mut Vec<u8>| -> Result<(), FixError> {
        let huffman = block.get(*pos).ok_or_else(|| malformed("a cut-off string"))? & 0x80 != 0;
        let len = hpack_integer(block, pos, 7)?;
        let octets = block.get(*pos..*pos + len).ok_or_else(|| malformed("a cut-off string"))?;
        *pos += len;
        let decoded;
        let plain = if huffman {
            decoded = huffman_decoder().decode(octets).map_err(|e| malformed(&format!("{e:?}")))?;
            &decoded[..]
        } else {
            octets
        };
        // The length with a 7-bit prefix, the Huffman bit clear.
        match u8::try_from(plain.len()) {
            Ok(n @ 0..127) => out.push(n),
            _ => {
                out.push(127);
                let mut rest = plain.len() - 127;
                while rest >= 128 {
                    out.push(0x80 | u8::try_from(rest % 128).expect("below 128"));
                    rest /= 128;
                }
                out.push(u8::try_from(rest).expect("below 128"));
            }
        }
        out.extend_from_slice(plain);
        Ok(())
    };
    while pos < block.len() {
        let first = block[pos];
        let start = pos;
        // Indexed (1xxxxxxx), a table size update (001xxxxx), or a literal (01xxxxxx, 0000xxxx, 0001xxxx)
        // whose name is indexed or, with index 0, a string; then its value.
        let (prefix_bits, literal) = match first {
            f if f & 0x80 != 0 => (7, false),
            f if f & 0xc0 == 0x40 => (6, true),
            f if f & 0xe0 == 0x20 => (5, false),
            _ => (4, true),
        };
        let index = hpack_integer(block, &mut pos, prefix_bits)?;
        out.extend_from_slice(&block[start..pos]);
        if literal {
            if index == 0 {
                string(&mut pos, &mut out)?;
            }
            string(&mut pos, &mut out)?;
        }
    }
    Ok(out)
}

/// A connection whose first bytes were read to look at them, handed on with those bytes first.
#[derive(Debug)]
pub(crate) struct Replay<S> {
    head: Vec<u8>,
    inner: S,
}

impl<S> Replay<S> {
    /// `inner` with `head` (already read from it) to be read again first.
    pub(crate) fn new(head: Vec<u8>, inner: S) -> Replay<S> {
        Replay { head, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replay<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if !self.head.is_empty() {
            let n = self.head.len().min(buf.remaining());
            buf.put_slice(&self.head[..n]);
            self.head.drain(..n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replay<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A decrypted HTTP/2 connection whose client bytes go through an `AuthorityFix`: on the server, the bytes
/// read (`on_reads`); on a client, the bytes written (`on_writes`).
pub struct FixedAuthority<S> {
    inner: S,
    fix: AuthorityFix,
    reads: bool,
    /// Rewritten bytes not yet read (server) or not yet written to `inner` (client).
    ready: Vec<u8>,
    scratch: Box<[u8]>,
}

impl<S> std::fmt::Debug for FixedAuthority<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixedAuthority").field("fix", &self.fix).finish_non_exhaustive()
    }
}

impl<S> FixedAuthority<S> {
    /// A server's side of `inner`: what the client sent is rewritten by `fix` before it is read.
    pub fn on_reads(inner: S, fix: AuthorityFix) -> FixedAuthority<S> {
        FixedAuthority { inner, fix, reads: true, ready: Vec::new(), scratch: vec![0; 16 * 1024].into_boxed_slice() }
    }

    /// A client's side of `inner`: what is written is rewritten by `fix` before it is sent.
    #[cfg(any(test, feature = "test-doors"))] // the test crates' client; the daemon only serves
    pub fn on_writes(inner: S, fix: AuthorityFix) -> FixedAuthority<S> {
        FixedAuthority { inner, fix, reads: false, ready: Vec::new(), scratch: Box::new([]) }
    }
}

impl<S: AsyncWrite + Unpin> FixedAuthority<S> {
    /// Writes the rewritten bytes still held to `inner`.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while !self.ready.is_empty() {
            match Pin::new(&mut self.inner).poll_write(cx, &self.ready) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    self.ready.drain(..n);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FixedAuthority<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if !this.reads {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        while this.ready.is_empty() {
            let mut rb = ReadBuf::new(&mut this.scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) if rb.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => {
                    let filled = rb.filled().to_vec();
                    this.fix
                        .feed(&filled, &mut this.ready)
                        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
                }
            }
        }
        let n = this.ready.len().min(buf.remaining());
        buf.put_slice(&this.ready[..n]);
        this.ready.drain(..n);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FixedAuthority<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if this.reads {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        // What was rewritten before goes first; only then is more taken (so `ready` stays bounded).
        if this.drain(cx)?.is_pending() {
            return Poll::Pending;
        }
        this.fix.feed(buf, &mut this.ready).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        let _ = this.drain(cx)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.drain(cx)?.is_pending() {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.drain(cx)?.is_pending() {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello record with `sni` as its server name (or none), the shape Go's and rustls's have.
    #[expect(clippy::cast_possible_truncation, reason = "test data is small: a name and a few extensions")]
    pub(crate) fn client_hello(sni: Option<&[u8]>) -> Vec<u8> {
        let mut ext = Vec::new();
        if let Some(name) = sni {
            let mut list = vec![0u8];
            list.extend_from_slice(&(name.len() as u16).to_be_bytes());
            list.extend_from_slice(name);
            let mut body = (list.len() as u16).to_be_bytes().to_vec();
            body.extend_from_slice(&list);
            ext.extend_from_slice(&[0, 0]);
            ext.extend_from_slice(&(body.len() as u16).to_be_bytes());
            ext.extend_from_slice(&body);
        }
        ext.extend_from_slice(&[0, 43, 0, 3, 2, 3, 4]); // supported_versions: TLS 1.3
        let mut hello = vec![3, 3];
        hello.extend_from_slice(&[7; 32]);
        hello.push(0);
        hello.extend_from_slice(&[0, 2, 0x13, 0x01]);
        hello.extend_from_slice(&[1, 0]);
        hello.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        hello.extend_from_slice(&ext);
        let mut hs = vec![1];
        hs.extend_from_slice(&(hello.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&hello);
        let mut rec = vec![22, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn a_path_as_server_name_is_told_apart_from_dns_names() {
        let path = client_hello(Some(b"/tmp/x/swarmkit.sock"));
        assert_eq!(client_hello_sni(&path), Sni::NotADnsName(b"/tmp/x/swarmkit.sock".to_vec()));
        assert_eq!(client_hello_sni(&client_hello(Some(b"swarmkit.sock"))), Sni::Acceptable);
        assert_eq!(client_hello_sni(&client_hello(None)), Sni::Acceptable);
        assert_eq!(client_hello_sni(b"PRI * HTTP/2.0"), Sni::Acceptable, "not TLS: rustls refuses it");
        for cut in [0, 4, 5, 40, path.len() - 1] {
            assert_eq!(client_hello_sni(&path[..cut]), Sni::Incomplete, "cut at {cut}");
        }
        // A record that lies about its contents is left to rustls.
        for (at, value) in [(5, 2u8), (6, 0xff)] {
            let mut broken = path.clone();
            broken[at] = value;
            assert_eq!(client_hello_sni(&broken), Sni::Acceptable, "byte {at} = {value}");
        }
    }

    fn headers_frame(block: &[u8], flags: u8, stream: u32) -> Vec<u8> {
        let mut f = Vec::new();
        frame_header(block.len(), FRAME_HEADERS, flags, stream, &mut f);
        f.extend_from_slice(block);
        f
    }

    /// Decodes the HEADERS/CONTINUATION frames in `bytes` (after the preface) as a server would.
    fn server_side(bytes: &[u8], decoder: &mut loona_hpack::Decoder<'_>) -> Vec<Vec<(String, String)>> {
        let mut rest = &bytes[PREFACE.len()..];
        let mut blocks = Vec::new();
        let mut block = Vec::new();
        while !rest.is_empty() {
            let len = (rest[0] as usize) << 16 | (rest[1] as usize) << 8 | rest[2] as usize;
            let (kind, flags) = (rest[3], rest[4]);
            assert!(len <= MAX_FRAME_BYTES);
            let mut payload = &rest[9..9 + len];
            if kind == FRAME_HEADERS && flags & FLAG_PRIORITY != 0 {
                payload = &payload[5..];
            }
            if kind == FRAME_HEADERS || kind == FRAME_CONTINUATION {
                assert_eq!(flags & FLAG_PADDED, 0);
                block.extend_from_slice(payload);
                if flags & FLAG_END_HEADERS != 0 {
                    let fields = decoder.decode(&block).unwrap();
                    blocks.push(
                        fields
                            .into_iter()
                            .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
                            .collect(),
                    );
                    block.clear();
                }
            }
            rest = &rest[9 + len..];
        }
        blocks
    }

    #[test]
    fn a_path_authority_becomes_localhost_and_everything_else_passes() {
        // The client's encoder (indexing on, as grpc-go's): the second request refers to the first's entries.
        let mut client = loona_hpack::Encoder::new();
        let request = |authority: &str, path: &str| {
            vec![
                (b":method".to_vec(), b"POST".to_vec()),
                (b":scheme".to_vec(), b"https".to_vec()),
                (b":path".to_vec(), path.as_bytes().to_vec()),
                (b":authority".to_vec(), authority.as_bytes().to_vec()),
                (b"content-type".to_vec(), b"application/grpc".to_vec()),
                (b"x-big".to_vec(), vec![b'a'; 20_000]),
            ]
        };
        let mut wire = PREFACE.to_vec();
        let first = client.encode(
            request("/tmp/x/swarmkit.sock", "/docker.swarmkit.v1.Control/ListNodes")
                .iter()
                .map(|(n, v)| (&n[..], &v[..])),
        );
        // Split over HEADERS + CONTINUATION with padding and priority, as a client may.
        let (a, b) = first.split_at(100);
        let mut h = vec![3u8];
        h.extend_from_slice(&[0, 0, 0, 0, 15]);
        h.extend_from_slice(a);
        h.extend_from_slice(&[0, 0, 0]);
        wire.extend_from_slice(&headers_frame(&h, FLAG_PADDED | FLAG_PRIORITY, 1));
        let mut cont = Vec::new();
        frame_header(b.len(), FRAME_CONTINUATION, FLAG_END_HEADERS, 1, &mut cont);
        cont.extend_from_slice(b);
        wire.extend_from_slice(&cont);
        // A DATA frame passes as it is.
        let data = [0u8, 0, 3, 0, FLAG_END_STREAM, 0, 0, 0, 1, b'x', b'y', b'z'];
        wire.extend_from_slice(&data);
        let second = client.encode(
            request("swarmkit.sock", "/docker.swarmkit.v1.Control/ListTasks").iter().map(|(n, v)| (&n[..], &v[..])),
        );
        wire.extend_from_slice(&headers_frame(&second, FLAG_END_HEADERS | FLAG_END_STREAM, 3));

        // Fed in awkward pieces: one byte, then 7 at a time.
        let mut fix = AuthorityFix::default();
        let mut out = Vec::new();
        fix.feed(&wire[..1], &mut out).unwrap();
        for chunk in wire[1..].chunks(7) {
            fix.feed(chunk, &mut out).unwrap();
        }
        assert!(out.windows(data.len()).any(|w| w == data), "the DATA frame passed as it was");
        let blocks = server_side(&out, &mut loona_hpack::Decoder::new());
        assert_eq!(blocks.len(), 2);
        let get = |b: &Vec<(String, String)>, k: &str| b.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).unwrap();
        assert_eq!(get(&blocks[0], ":authority"), REPLACEMENT_AUTHORITY);
        assert_eq!(get(&blocks[0], ":path"), "/docker.swarmkit.v1.Control/ListNodes");
        assert_eq!(get(&blocks[0], "x-big").len(), 20_000);
        assert_eq!(get(&blocks[1], ":authority"), "swarmkit.sock", "a valid authority is kept");
        assert_eq!(get(&blocks[1], "content-type"), "application/grpc");
    }

    #[test]
    fn oversized_or_broken_header_blocks_are_refused() {
        let mut fix = AuthorityFix::default();
        let mut out = Vec::new();
        let mut wire = PREFACE.to_vec();
        frame_header(MAX_HEADER_BLOCK_BYTES + 1, FRAME_HEADERS, FLAG_END_HEADERS, 1, &mut wire);
        assert!(matches!(fix.feed(&wire, &mut out), Err(FixError::TooLarge)));
        let mut fix = AuthorityFix::default();
        let mut wire = PREFACE.to_vec();
        frame_header(1, FRAME_CONTINUATION, FLAG_END_HEADERS, 1, &mut wire);
        wire.push(0);
        assert!(matches!(fix.feed(&wire, &mut Vec::new()), Err(FixError::Malformed(_))));
    }

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// RFC 7541, C.4: three requests with Huffman-coded strings, each referring to the previous ones' entries.
    const RFC_HUFFMAN_REQUESTS: [&str; 3] = [
        "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        "8286 84be 5886 a8eb 1064 9cbf",
        "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
    ];

    #[test]
    fn huffman_coded_strings_are_written_out_with_the_same_meaning() {
        // The RFC's requests, then literals without indexing and never indexed with new names, one of 200
        // octets (a length past the 7-bit prefix), and a table size update.
        let mut blocks: Vec<Vec<u8>> = RFC_HUFFMAN_REQUESTS.iter().map(|b| hex(b)).collect();
        let mut long = hex("3f e1 1f 00 03");
        long.extend_from_slice(b"abc");
        long.extend_from_slice(&hex("7f 49"));
        long.extend_from_slice(&[b'v'; 200]);
        long.extend_from_slice(&hex("10 01"));
        long.push(b'n');
        long.extend_from_slice(&hex("89 25 a8 49 e9 5b b8 e8 b4 bf"));
        blocks.push(long);
        let (mut direct, mut via) = (loona_hpack::Decoder::new(), loona_hpack::Decoder::new());
        for block in &blocks {
            let plain = without_huffman(block).unwrap();
            assert_eq!(without_huffman(&plain).unwrap(), plain, "nothing is left to write out");
            assert_eq!(via.decode(&plain).unwrap(), direct.decode(block).unwrap(), "{block:02x?}");
        }
        let expected: Vec<(Vec<u8>, Vec<u8>)> = [
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ]
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect();
        let (mut direct, mut via) = (loona_hpack::Decoder::new(), loona_hpack::Decoder::new());
        let mut last = Vec::new();
        for block in &blocks[..3] {
            last = via.decode(&without_huffman(block).unwrap()).unwrap();
            assert_eq!(last, direct.decode(block).unwrap());
        }
        assert_eq!(last, expected);
        assert_eq!(without_huffman(&hex("82 86")).unwrap(), hex("82 86"), "no string: byte for byte");
    }

    #[test]
    fn huffman_coded_authorities_are_replaced_too() {
        let mut fix = AuthorityFix::with_rule(|a| (a == b"www.example.com").then(|| b"localhost".to_vec()));
        let mut wire = PREFACE.to_vec();
        for (i, block) in (0u32..).zip(RFC_HUFFMAN_REQUESTS.iter()) {
            wire.extend_from_slice(&headers_frame(&hex(block), FLAG_END_HEADERS, 1 + 2 * i));
        }
        let mut out = Vec::new();
        fix.feed(&wire, &mut out).unwrap();
        let blocks = server_side(&out, &mut loona_hpack::Decoder::new());
        assert_eq!(blocks.len(), 3);
        for b in &blocks {
            assert!(b.contains(&(":authority".into(), "localhost".into())), "{b:?}");
        }
        assert!(blocks[2].contains(&("custom-key".into(), "custom-value".into())), "{:?}", blocks[2]);
    }

    #[test]
    fn broken_huffman_or_cut_off_strings_are_refused() {
        for broken in [
            "41 8c f1e3 c2e5 f23a 6ba0 ab90 f4", // the string is cut off
            "41 81 00",                          // padding that is not EOS's leading ones
            "41 82 ff ff",                       // more than 7 bits of padding (EOS)
            "40 88 25a8 49e9 5ba9 7d7f",         // the name without its value
            "3f ff ff ff ff 7f",                 // an integer past 2^28
        ] {
            assert!(matches!(without_huffman(&hex(broken)), Err(FixError::Malformed(_))), "{broken}");
        }
    }
}
