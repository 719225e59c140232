//! Just enough HTTP/1.1 for one GET with `Connection: close`: the request's bytes, and a
//! response read to its end, whether its body is framed by `Content-Length`, by chunks
//! (what the API server's Go HTTP stack sends for a body it did not measure first) or by
//! the end of the connection. Everything is bounded: a response over the limit is an error,
//! not an allocation.

use std::io::{self, Read};

/// One response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub reason: String,
    pub body: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("failed to read the response")]
    Io(#[source] io::Error),
    #[error("the response is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("malformed response: {what}")]
    Malformed { what: &'static str },
    #[error("the connection closed before the response was complete")]
    Truncated,
}

/// `GET <path>` with a bearer token, asking the server to close the connection after it.
pub fn get_request(host: &str, path: &str, bearer: &str) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {bearer}\r\n\
         Accept: application/json\r\nUser-Agent: ebpf-cni/{}\r\nConnection: close\r\n\r\n",
        env!("CARGO_PKG_VERSION")
    )
    .into_bytes()
}

/// How the body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

/// Reads one response from `r`, at most `limit` bytes of it in all.
pub fn read_response(r: &mut impl Read, limit: usize) -> Result<Response, HttpError> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let mut head: Option<(u16, String, Framing, usize)> = None;
    loop {
        if head.is_none() {
            if let Some(end) = find(&buf, b"\r\n\r\n") {
                let (status, reason, framing) = parse_head(&buf[..end])?;
                head = Some((status, reason, framing, end + 4));
            }
        }
        if let Some((status, reason, framing, start)) = &head {
            if let Some(body) = body_if_complete(&buf[*start..], *framing)? {
                return Ok(Response {
                    status: *status,
                    reason: reason.clone(),
                    body,
                });
            }
        }
        let n = match r.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // A TLS peer closing without close_notify: the end, where the body runs to it.
            Err(e)
                if e.kind() == io::ErrorKind::UnexpectedEof
                    && matches!(head, Some((_, _, Framing::UntilClose, _))) =>
            {
                0
            }
            Err(e) => return Err(HttpError::Io(e)),
        };
        if n == 0 {
            return match head {
                Some((status, reason, Framing::UntilClose, start)) => Ok(Response {
                    status,
                    reason,
                    body: buf[start..].to_vec(),
                }),
                _ => Err(HttpError::Truncated),
            };
        }
        if buf.len() + n > limit {
            return Err(HttpError::TooLarge { limit });
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The status line and the headers that frame the body.
fn parse_head(head: &[u8]) -> Result<(u16, String, Framing), HttpError> {
    let malformed = |what| HttpError::Malformed { what };
    let text = std::str::from_utf8(head).map_err(|_| malformed("the head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(malformed("not an HTTP/1.x status line"));
    }
    let status = parts
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|s| (100..=599).contains(s))
        .ok_or_else(|| malformed("no status code"))?;
    let reason = parts.next().unwrap_or_default().to_owned();
    let mut framing = Framing::UntilClose;
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| malformed("a header line without ':'"))?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            if value.to_ascii_lowercase().ends_with("chunked") {
                framing = Framing::Chunked;
            }
        } else if name.eq_ignore_ascii_case("content-length") && framing != Framing::Chunked {
            framing = Framing::Length(
                value
                    .parse()
                    .map_err(|_| malformed("an invalid Content-Length"))?,
            );
        }
    }
    Ok((status, reason, framing))
}

/// The body, once `data` holds all of it.
fn body_if_complete(data: &[u8], framing: Framing) -> Result<Option<Vec<u8>>, HttpError> {
    match framing {
        Framing::Length(n) => Ok((data.len() >= n).then(|| data[..n].to_vec())),
        Framing::UntilClose => Ok(None),
        Framing::Chunked => dechunk(data),
    }
}

/// Chunked transfer coding (RFC 9112 section 7.1): `<hex size>[;ext]\r\n<data>\r\n`,
/// ending with a zero-size chunk and optional trailers, then an empty line.
fn dechunk(mut data: &[u8]) -> Result<Option<Vec<u8>>, HttpError> {
    let mut body = Vec::new();
    loop {
        let Some(eol) = find(data, b"\r\n") else {
            return Ok(None);
        };
        let size_text = std::str::from_utf8(&data[..eol])
            .ok()
            .map(|l| l.split(';').next().unwrap_or_default().trim())
            .ok_or(HttpError::Malformed {
                what: "a chunk size that is not text",
            })?;
        let size = usize::from_str_radix(size_text, 16).map_err(|_| HttpError::Malformed {
            what: "an invalid chunk size",
        })?;
        data = &data[eol + 2..];
        if size == 0 {
            // Trailers, if any, then the empty line.
            let mut rest = data;
            loop {
                let Some(eol) = find(rest, b"\r\n") else {
                    return Ok(None);
                };
                if eol == 0 {
                    return Ok(Some(body));
                }
                rest = &rest[eol + 2..];
            }
        }
        if data.len() < size.saturating_add(2) {
            return Ok(None);
        }
        if &data[size..size + 2] != b"\r\n" {
            return Err(HttpError::Malformed {
                what: "a chunk not followed by CRLF",
            });
        }
        body.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out `data` a few bytes per read, as a network would.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let n = self.0.len().min(out.len()).min(3);
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    fn read(data: &[u8]) -> Result<Response, HttpError> {
        read_response(&mut Trickle(data), 1 << 16)
    }

    #[test]
    fn content_length_bodies_stop_at_their_length() {
        let r = read(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA").unwrap();
        assert_eq!((r.status, r.reason.as_str()), (200, "OK"));
        assert_eq!(r.body, b"hello");
        assert!(matches!(
            read(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhello"),
            Err(HttpError::Truncated)
        ));
    }

    #[test]
    fn chunked_bodies_are_joined() {
        let r = read(
            b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n\
              4;ext=1\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\nX-Trailer: y\r\n\r\n",
        )
        .unwrap();
        assert_eq!((r.status, r.reason.as_str()), (403, "Forbidden"));
        assert_eq!(r.body, b"{\"a\":1}");
        assert!(matches!(
            read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nab"),
            Err(HttpError::Truncated)
        ));
        assert!(matches!(
            read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
            Err(HttpError::Malformed { .. })
        ));
    }

    #[test]
    fn unframed_bodies_run_to_the_close() {
        let r = read(b"HTTP/1.0 404 Not Found\r\n\r\n{}").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (404, b"{}".as_slice()));
    }

    #[test]
    fn garbage_and_oversize_are_errors() {
        assert!(matches!(
            read(b"SSH-2.0-OpenSSH\r\n\r\n"),
            Err(HttpError::Malformed { .. })
        ));
        assert!(matches!(read(b""), Err(HttpError::Truncated)));
        let big = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n{}",
            "x".repeat(100_000)
        );
        assert!(matches!(
            read_response(&mut Trickle(big.as_bytes()), 1000),
            Err(HttpError::TooLarge { limit: 1000 })
        ));
    }

    #[test]
    fn the_request_names_host_path_and_token() {
        let req = String::from_utf8(get_request("[::1]:6443", "/api/v1/nodes/n1", "t0k")).unwrap();
        assert!(req.starts_with("GET /api/v1/nodes/n1 HTTP/1.1\r\nHost: [::1]:6443\r\n"));
        assert!(req.contains("\r\nAuthorization: Bearer t0k\r\n"));
        assert!(req.ends_with("Connection: close\r\n\r\n"));
    }
}
