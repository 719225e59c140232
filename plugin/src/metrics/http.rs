//! A minimal HTTP/1.x server for `GET /metrics`: one thread per connection (at most
//! [`MAX_CONNECTIONS`] at once), one request per connection, every answer built anew by
//! the caller's scrape function, so the server holds no state and can restart at any time.
//! A scraper needs nothing more, and a hand-written loop over `std::net` keeps an async
//! HTTP stack out of a binary that runtimes start for every pod. Whatever a client sends,
//! it gets a status line or a closed connection, never a crash of the server.

use std::{
    io::{Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    panic::{catch_unwind, AssertUnwindSafe},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

/// Requests larger than this (request line and headers) are refused: a scrape is a few
/// hundred bytes.
const MAX_REQUEST: usize = 16 * 1024;
/// A client has this long to send its request, however slowly it dribbles it.
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Connections served at once; more are answered 503 at once and closed.
pub const MAX_CONNECTIONS: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// What the scrape function returns: the exposition, or a reason for a 500.
pub type Scrape = dyn Fn() -> Result<String, String> + Send + Sync;

/// Binds `addr` (an error naming it when, e.g., the port is in use) and calls `ready` with
/// the bound address (port 0 picks a free one), then serves until the process ends.
pub fn serve(
    addr: SocketAddr,
    scrape: Arc<Scrape>,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let listener = TcpListener::bind(addr).map_err(|source| ServeError::Bind { addr, source })?;
    ready(listener.local_addr().unwrap_or(addr));
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                // Out of fds or a connection reset before accept: the next one may work.
                log::warn!("accepting a connection on {addr}: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::AcqRel);
            let mut stream = stream;
            let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = respond(
                &mut stream,
                503,
                "Service Unavailable",
                "text/plain",
                b"busy\n",
                false,
            );
            continue;
        }
        let (scrape, active) = (Arc::clone(&scrape), Arc::clone(&active));
        let spawned = std::thread::Builder::new()
            .name("metrics-conn".into())
            .spawn(move || {
                let _ = catch_unwind(AssertUnwindSafe(|| handle(stream, &*scrape)));
                active.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            log::warn!("starting a connection thread: {e}");
        }
    }
    Ok(())
}

/// The request head: everything up to the blank line, or `None` when the client closed,
/// went silent or sent too much.
fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, &'static str> {
    let start = Instant::now();
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(end) = find(&buf, b"\r\n\r\n").or_else(|| find(&buf, b"\n\n")) {
            buf.truncate(end);
            return Ok(buf);
        }
        if buf.len() > MAX_REQUEST {
            return Err("request head too large");
        }
        let left = REQUEST_DEADLINE.saturating_sub(start.elapsed());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Err("request too slow");
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Err("connection closed mid-request"),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => return Err("request not received"),
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn handle(mut stream: TcpStream, scrape: &Scrape) {
    let _ = stream.set_write_timeout(Some(REQUEST_DEADLINE));
    let head = match read_head(&mut stream) {
        Ok(h) => h,
        Err(why) => {
            log::debug!("metrics: {why}");
            if why == "request head too large" {
                let _ = respond(
                    &mut stream,
                    400,
                    "Bad Request",
                    "text/plain",
                    b"request head too large\n",
                    false,
                );
            }
            return;
        }
    };
    let (status, reason, body, head_only): (u16, &str, Vec<u8>, bool) = match parse(&head) {
        Err(why) => (400, "Bad Request", format!("{why}\n").into_bytes(), false),
        Ok((_, path)) if path != "/metrics" => (
            404,
            "Not Found",
            b"only /metrics is served\n".to_vec(),
            false,
        ),
        Ok((method, _)) if method != "GET" && method != "HEAD" => (
            405,
            "Method Not Allowed",
            b"only GET and HEAD\n".to_vec(),
            false,
        ),
        Ok((method, _)) => match scrape() {
            Ok(text) => (200, "OK", text.into_bytes(), method == "HEAD"),
            Err(e) => {
                log::warn!("metrics: {e}");
                (
                    500,
                    "Internal Server Error",
                    format!("{e}\n").into_bytes(),
                    false,
                )
            }
        },
    };
    let ctype = if status == 200 {
        super::CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let _ = respond(&mut stream, status, reason, ctype, &body, head_only);
}

/// `(method, path)` of an HTTP/1.x request head.
fn parse(head: &[u8]) -> Result<(&str, &str), &'static str> {
    let head = std::str::from_utf8(head).map_err(|_| "request head is not UTF-8")?;
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("malformed request line");
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return Err("not an HTTP/1.x request");
    }
    if !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err("malformed method");
    }
    Ok((method, target.split('?').next().unwrap_or(target)))
}

fn respond(
    stream: &mut TcpStream,
    status: u16,
    reason: &str,
    content_type: &str,
    body: &[u8],
    head_only: bool,
) -> std::io::Result<()> {
    let allow = if status == 405 {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    if !head_only {
        stream.write_all(body)?;
    }
    stream.flush()?;
    // Reading what the client still sends (a body we ignore) before closing keeps the
    // kernel from answering it with a reset that could discard our response.
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    while drained < 1 << 20 {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines() {
        assert_eq!(
            parse(b"GET /metrics HTTP/1.1\r\nHost: x"),
            Ok(("GET", "/metrics"))
        );
        assert_eq!(parse(b"GET /metrics?x=1 HTTP/1.0"), Ok(("GET", "/metrics")));
        assert_eq!(parse(b"POST /metrics HTTP/1.1"), Ok(("POST", "/metrics")));
        assert!(parse(b"PRI * HTTP/2.0").is_err());
        assert!(parse(b"GET /metrics").is_err());
        assert!(parse(b"\xff\xfe GET / HTTP/1.1").is_err());
        assert!(parse(b"").is_err());
        assert!(parse(b"get /metrics HTTP/1.1").is_err());
    }
}
