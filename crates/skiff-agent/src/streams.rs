//! The `v5.channel.k8s.io` streaming protocol for exec and attach, served
//! in front of a runtime that speaks at most v4 (containerd 1.6).
//!
//! v5 is v4 over WebSocket plus one signal: a message on channel 255
//! whose payload is a stream id closes that stream (kubectl sends it for
//! stdin when its input ends, and waits for the command to finish). v4
//! over WebSocket has no way to say that, so a client offering v5 first
//! would otherwise get v4 from the runtime and `kubectl exec -i ... <
//! file` would never end. As kube-apiserver does since 1.30, the agent
//! ends the WebSocket itself and speaks v4 over SPDY/3.1 to the runtime,
//! where every stream is its own and stdin can be half-closed.
//!
//! WebSocket channels (one byte before each binary message) map to SPDY
//! streams opened by the agent with a `streamtype` header: 0 stdin, 1
//! stdout, 2 stderr, 3 error (the final `Status`), 4 resize.
//!
//! Only what the runtime's SPDY server needs is written: SYN_STREAM with
//! an uncompressed ("stored") zlib header block, DATA with and without
//! FIN, PING answers. Headers the runtime sends back are skipped, never
//! decompressed: nothing in them is needed.

use anyhow::{anyhow, bail, Context, Result};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// The subprotocol this module answers.
pub const V5: &str = "v5.channel.k8s.io";
/// What it asks of the runtime.
const V4: &str = "v4.channel.k8s.io";

/// Channel ids (WebSocket) and stream types (SPDY).
const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
/// v5's signal channel: its payload names a stream to close.
const CLOSE: u8 = 255;

fn stream_type(channel: u8) -> &'static str {
    match channel {
        STDIN => "stdin",
        STDOUT => "stdout",
        STDERR => "stderr",
        ERROR => "error",
        _ => "resize",
    }
}

/// The streams a session has, from the request's flags.
#[derive(Debug, Clone, Copy, Default)]
pub struct Streams {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl Streams {
    /// The channels the runtime expects, in the order v4 clients open
    /// them (the error stream first).
    fn channels(&self) -> Vec<u8> {
        let mut v = vec![ERROR];
        if self.stdin {
            v.push(STDIN);
        }
        if self.stdout {
            v.push(STDOUT);
        }
        if self.stderr && !self.tty {
            v.push(STDERR);
        }
        if self.tty {
            v.push(RESIZE);
        }
        v
    }
}

/// Whether a request is a WebSocket upgrade that offers v5 (in any
/// position: a client lists what it speaks, the server picks).
pub fn offers_v5(headers: &HeaderMap) -> bool {
    let websocket = headers
        .get(http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.eq_ignore_ascii_case("websocket"))
        .unwrap_or(false);
    websocket
        && headers
            .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|p| p.trim() == V5)
}

fn plain(code: StatusCode, msg: String) -> Response {
    (code, msg).into_response()
}

/// Answers a v5 WebSocket upgrade for a session at the runtime's
/// streaming `url`: opens the runtime's SPDY v4 session first (a failure
/// there is the answer), then switches the client's connection to v5 and
/// joins the two.
pub async fn serve_v5(url: String, mut req: Request, streams: Streams) -> Response {
    let Some(key) = req
        .headers()
        .get(http::header::SEC_WEBSOCKET_KEY)
        .map(|k| k.as_bytes().to_vec())
    else {
        return plain(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key".into());
    };
    let runtime = match spdy_connect(&url).await {
        Ok(io) => io,
        Err(e) => return plain(StatusCode::BAD_GATEWAY, format!("{e:#}")),
    };
    let client_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(client) = client_upgrade.await else {
            return;
        };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(client), Role::Server, None).await;
        if let Err(e) = bridge(ws, runtime, streams).await {
            tracing::debug!(error = %e, "v5 stream session ended");
        }
    });
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(&key);
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "websocket")
        .header(http::header::SEC_WEBSOCKET_ACCEPT, accept)
        .header(http::header::SEC_WEBSOCKET_PROTOCOL, V5)
        .body(Body::empty())
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Upgrades a connection to the runtime's streaming `url` to SPDY/3.1
/// with the v4 protocol.
async fn spdy_connect(url: &str) -> Result<TokioIo<hyper::upgrade::Upgraded>> {
    let uri: http::Uri = url
        .parse()
        .with_context(|| format!("bad streaming URL {url}"))?;
    let host = uri.host().unwrap_or("127.0.0.1").to_string();
    let port = uri.port_u16().unwrap_or(80);
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .context("connecting to the runtime's streaming server")?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let req = http::Request::builder()
        .method(http::Method::POST)
        .uri(path)
        .header(http::header::HOST, format!("{host}:{port}"))
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "SPDY/3.1")
        .header("X-Stream-Protocol-Version", V4)
        .body(http_body_util::Empty::<Bytes>::new())?;
    let mut resp = sender.send_request(req).await?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let code = resp.status();
        use http_body_util::BodyExt;
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        bail!(
            "the runtime's streaming server answered {code}: {}",
            String::from_utf8_lossy(&body).trim()
        );
    }
    let agreed = resp
        .headers()
        .get("X-Stream-Protocol-Version")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if agreed != V4 {
        bail!("the runtime's streaming server chose protocol {agreed:?}, not {V4}");
    }
    let up = hyper::upgrade::on(&mut resp).await?;
    Ok(TokioIo::new(up))
}

// ---- SPDY/3 frames (the subset a v4 client writes and reads)

const SPDY_VERSION: u16 = 3;
const TYPE_SYN_STREAM: u16 = 1;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const FLAG_FIN: u8 = 0x01;

/// A frame as read.
#[derive(Debug, PartialEq)]
enum Frame {
    Data { stream: u32, fin: bool, data: Bytes },
    Control { kind: u16, payload: Bytes },
}

/// The SPDY stream id of a channel: client streams are odd, opened in
/// the order of [`Streams::channels`].
fn stream_id(order: &[u8], channel: u8) -> Option<u32> {
    order
        .iter()
        .position(|c| *c == channel)
        .map(|i| 2 * i as u32 + 1)
}

fn control(kind: u16, flags: u8, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(8 + payload.len());
    b.put_u16(0x8000 | SPDY_VERSION);
    b.put_u16(kind);
    b.put_u32(((flags as u32) << 24) | payload.len() as u32);
    b.put_slice(payload);
    b.freeze()
}

fn data(stream: u32, fin: bool, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(8 + payload.len());
    b.put_u32(stream & 0x7fff_ffff);
    b.put_u32((((fin as u32) * FLAG_FIN as u32) << 24) | payload.len() as u32);
    b.put_slice(payload);
    b.freeze()
}

/// A name/value header block as one zlib "stored" block: the receiver
/// inflates it with the same stream state as compressed ones. The first
/// block of a connection carries the zlib header (no preset dictionary
/// named, so none is needed to read it).
fn header_block(pairs: &[(&str, &str)], first: bool) -> Vec<u8> {
    let mut raw = Vec::new();
    raw.put_u32(pairs.len() as u32);
    for (k, v) in pairs {
        raw.put_u32(k.len() as u32);
        raw.put_slice(k.as_bytes());
        raw.put_u32(v.len() as u32);
        raw.put_slice(v.as_bytes());
    }
    let mut out = Vec::with_capacity(raw.len() + 7);
    if first {
        // CMF 0x78 (deflate, 32 KiB window), FLG 0x01: no dictionary,
        // (0x78 * 256 + 0x01) % 31 == 0.
        out.extend_from_slice(&[0x78, 0x01]);
    }
    // A non-final stored block: BFINAL 0, BTYPE 00, then LEN and NLEN.
    let len = raw.len() as u16;
    out.push(0x00);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&(!len).to_le_bytes());
    out.extend_from_slice(&raw);
    // Then an empty stored block, as a zlib sync flush ends with: Go's
    // inflater hands over a block's bytes only when the next block has
    // begun, and without this marker it would read past the frame, fail,
    // and keep failing for every later header block on the connection.
    out.extend_from_slice(&[0x00, 0x00, 0x00, 0xff, 0xff]);
    out
}

fn syn_stream(stream: u32, kind: &str, first: bool) -> Bytes {
    let mut p = Vec::new();
    p.put_u32(stream & 0x7fff_ffff);
    p.put_u32(0); // associated-to
    p.put_u8(0); // priority (3 bits) and unused
    p.put_u8(0); // slot
    p.extend_from_slice(&header_block(&[("streamtype", kind)], first));
    control(TYPE_SYN_STREAM, 0, &p)
}

/// Reads one frame (`None` at a clean end of the connection).
async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>> {
    let mut head = [0u8; 8];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let mut h = &head[..];
    let first = h.get_u32();
    let word = h.get_u32();
    let flags = (word >> 24) as u8;
    let len = (word & 0x00ff_ffff) as usize;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    let payload = Bytes::from(payload);
    Ok(Some(if first & 0x8000_0000 != 0 {
        Frame::Control {
            kind: (first & 0xffff) as u16,
            payload,
        }
    } else {
        Frame::Data {
            stream: first & 0x7fff_ffff,
            fin: flags & FLAG_FIN != 0,
            data: payload,
        }
    }))
}

/// Joins the client's v5 WebSocket and the runtime's SPDY v4 session until
/// the runtime has finished every stream it writes (or either side goes).
async fn bridge<W, S>(ws: WebSocketStream<W>, spdy: S, streams: Streams) -> Result<()>
where
    W: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let order = streams.channels();
    let (mut ws_tx, mut ws_rx) = ws.split();
    let (mut sp_rx, sp_tx) = tokio::io::split(spdy);
    // One writer to the runtime: the client's input and PING answers.
    let (to_runtime, mut outbox) = tokio::sync::mpsc::channel::<Bytes>(64);
    let writer = tokio::spawn(async move {
        let mut sp_tx = sp_tx;
        while let Some(frame) = outbox.recv().await {
            if sp_tx.write_all(&frame).await.is_err() {
                break;
            }
        }
        let _ = sp_tx.shutdown().await;
    });
    for (i, ch) in order.iter().enumerate() {
        let sid = 2 * i as u32 + 1;
        to_runtime
            .send(syn_stream(sid, stream_type(*ch), i == 0))
            .await
            .map_err(|_| anyhow!("the runtime's connection closed"))?;
    }

    // Client → runtime.
    let input_order = order.clone();
    let input_tx = to_runtime.clone();
    let mut input = tokio::spawn(async move {
        let mut stdin_closed = false;
        while let Some(msg) = ws_rx.next().await {
            let Ok(msg) = msg else { break };
            let bytes = match msg {
                Message::Binary(b) => b,
                Message::Close(_) => break,
                _ => continue,
            };
            let Some((&ch, rest)) = bytes.split_first() else {
                continue;
            };
            match ch {
                // v5: the payload names the stream to close; only stdin
                // is the client's to close.
                CLOSE if rest.first() == Some(&STDIN) && !stdin_closed => {
                    if let Some(sid) = stream_id(&input_order, STDIN) {
                        stdin_closed = true;
                        let _ = input_tx.send(data(sid, true, &[])).await;
                    }
                }
                STDIN if stdin_closed => {}
                STDIN | RESIZE => {
                    if let Some(sid) = stream_id(&input_order, ch) {
                        for chunk in rest.chunks(0x00ff_ffff) {
                            if input_tx.send(data(sid, false, chunk)).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                _ => {}
            }
        }
    });

    // Runtime → client, until every stream the runtime writes is done.
    let mut open: Vec<u8> = order
        .iter()
        .copied()
        .filter(|c| matches!(*c, STDOUT | STDERR | ERROR))
        .collect();
    let channel_of = |sid: u32| -> Option<u8> {
        let i = sid.checked_sub(1)? / 2;
        (sid % 2 == 1).then(|| order.get(i as usize).copied())?
    };
    let result: Result<()> = async {
        while !open.is_empty() {
            let frame = tokio::select! {
                f = read_frame(&mut sp_rx) => f?,
                // The client went away: so does the session.
                _ = &mut input => break,
            };
            let Some(frame) = frame else {
                break;
            };
            match frame {
                Frame::Data { stream, fin, data } => {
                    let Some(ch) = channel_of(stream) else {
                        continue;
                    };
                    if !data.is_empty() && matches!(ch, STDOUT | STDERR | ERROR) {
                        let mut m = BytesMut::with_capacity(data.len() + 1);
                        m.put_u8(ch);
                        m.put_slice(&data);
                        ws_tx.send(Message::Binary(m.freeze())).await?;
                    }
                    if fin {
                        open.retain(|c| *c != ch);
                    }
                }
                Frame::Control { kind, payload, .. } => match kind {
                    TYPE_PING => {
                        let _ = to_runtime.send(control(TYPE_PING, 0, &payload)).await;
                    }
                    TYPE_RST_STREAM if payload.len() >= 4 => {
                        let sid = (&payload[..4]).get_u32() & 0x7fff_ffff;
                        if let Some(ch) = channel_of(sid) {
                            open.retain(|c| *c != ch);
                        }
                    }
                    TYPE_GOAWAY => break,
                    // SYN_REPLY, HEADERS, SETTINGS, WINDOW_UPDATE: nothing to do.
                    _ => {}
                },
            }
        }
        Ok(())
    }
    .await;
    // A close frame must carry 1000 (normal closure): client-go's reader
    // treats any other code, the empty one (1005) included, as an error
    // and reports it instead of the exit status already sent.
    let _ = ws_tx
        .send(Message::Close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        })))
        .await;
    let _ = ws_tx.close().await;
    input.abort();
    drop(to_runtime);
    let _ = writer.await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_follow_the_flags_and_map_to_odd_stream_ids() {
        let s = Streams {
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
        };
        let order = s.channels();
        assert_eq!(order, [ERROR, STDIN, STDOUT, STDERR]);
        assert_eq!(stream_id(&order, ERROR), Some(1));
        assert_eq!(stream_id(&order, STDERR), Some(7));
        assert_eq!(stream_id(&order, RESIZE), None);
        let tty = Streams { tty: true, ..s };
        assert_eq!(tty.channels(), [ERROR, STDIN, STDOUT, RESIZE]);
    }

    #[test]
    fn frames_are_laid_out_as_spdy_3_says() {
        assert_eq!(
            &data(5, true, b"hi")[..],
            &[0, 0, 0, 5, 1, 0, 0, 2, b'h', b'i']
        );
        assert_eq!(
            &control(TYPE_PING, 0, &[0, 0, 0, 7])[..],
            &[0x80, 3, 0, 6, 0, 0, 0, 4, 0, 0, 0, 7]
        );
        // A header block is a zlib stream of stored blocks: the first has
        // the zlib header, each has LEN and its complement.
        let b = header_block(&[("streamtype", "error")], true);
        assert_eq!(&b[..3], &[0x78, 0x01, 0x00]);
        let len = u16::from_le_bytes([b[3], b[4]]);
        assert_eq!(!len, u16::from_le_bytes([b[5], b[6]]));
        assert_eq!(len as usize, b.len() - 7 - 5);
        assert_eq!(&b[b.len() - 5..], &[0, 0, 0, 0xff, 0xff]);
        assert_eq!(
            &b[7..b.len() - 5],
            &[
                0, 0, 0, 1, 0, 0, 0, 10, b's', b't', b'r', b'e', b'a', b'm', b't', b'y', b'p',
                b'e', 0, 0, 0, 5, b'e', b'r', b'r', b'o', b'r'
            ]
        );
        assert_eq!(header_block(&[], false)[..1], [0x00]);
    }

    #[tokio::test]
    async fn frames_read_back_as_written() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&data(3, false, b"abc"));
        wire.extend_from_slice(&control(TYPE_RST_STREAM, 0, &[0, 0, 0, 3, 0, 0, 0, 5]));
        let mut r = &wire[..];
        assert_eq!(
            read_frame(&mut r).await.unwrap(),
            Some(Frame::Data {
                stream: 3,
                fin: false,
                data: Bytes::from_static(b"abc")
            })
        );
        assert!(matches!(
            read_frame(&mut r).await.unwrap(),
            Some(Frame::Control {
                kind: TYPE_RST_STREAM,
                ..
            })
        ));
        assert_eq!(read_frame(&mut r).await.unwrap(), None);
    }

    #[test]
    fn only_websocket_upgrades_offering_v5_are_taken() {
        let mut h = HeaderMap::new();
        h.insert(http::header::UPGRADE, "websocket".parse().unwrap());
        h.insert(
            http::header::SEC_WEBSOCKET_PROTOCOL,
            "v5.channel.k8s.io, v4.channel.k8s.io".parse().unwrap(),
        );
        assert!(offers_v5(&h));
        h.insert(
            http::header::SEC_WEBSOCKET_PROTOCOL,
            "v4.channel.k8s.io".parse().unwrap(),
        );
        assert!(!offers_v5(&h));
        h.insert(http::header::UPGRADE, "SPDY/3.1".parse().unwrap());
        assert!(!offers_v5(&h));
    }
}
