//! The metrics endpoint: `GET /metrics` (and `HEAD`) over HTTP/1.1, served by hyper (the
//! HTTP stack kube's client brings) on a tokio runtime of its own thread. Every answer is
//! built anew by the caller's scrape function, so the server holds no state and can
//! restart at any time. One request per connection; at most [`MAX_CONNECTIONS`] at once
//! (more are answered 503 and closed); a request head must arrive within
//! [`REQUEST_DEADLINE`] and fit in [`MAX_REQUEST`] bytes. Whatever a client sends, it gets a
//! status line or a closed connection, never a crash of the server.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{io::AsyncWriteExt, net::TcpListener, sync::Semaphore};

/// The largest request head served: a scrape is a few hundred bytes.
const MAX_REQUEST: usize = 16 * 1024;
/// A client has this long to send its request head, however slowly it dribbles it.
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
    let bind = |source| ServeError::Bind { addr, source };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(bind)?;
    rt.block_on(async {
        let listener = TcpListener::bind(addr).await.map_err(bind)?;
        ready(listener.local_addr().unwrap_or(addr));
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            let (mut stream, _) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of fds or a connection reset before accept: the next one may work.
                    log::warn!("accepting a connection on {addr}: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                tokio::spawn(async move {
                    let _ = stream
                        .write_all(
                            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n\
                              Content-Length: 5\r\nConnection: close\r\n\r\nbusy\n",
                        )
                        .await;
                });
                continue;
            };
            let scrape = Arc::clone(&scrape);
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let scrape = Arc::clone(&scrape);
                    async move { Ok::<_, Infallible>(answer(&req, &*scrape)) }
                });
                let served = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(REQUEST_DEADLINE)
                    .max_buf_size(MAX_REQUEST)
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                if let Err(e) = served {
                    log::debug!("metrics: {e}");
                }
                drop(slot);
            });
        }
    })
}

/// The answer to one request.
fn answer(req: &Request<Incoming>, scrape: &Scrape) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    if req.uri().path() != "/metrics" {
        return text(StatusCode::NOT_FOUND, "only /metrics is served\n");
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match scrape() {
        Ok(exposition) => {
            let mut r = Response::new(Full::new(Bytes::from(exposition)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(super::CONTENT_TYPE),
            );
            r
        }
        Err(e) => {
            log::warn!("metrics: {e}");
            let mut r = Response::new(Full::new(Bytes::from(format!("{e}\n"))));
            *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            r
        }
    }
}
