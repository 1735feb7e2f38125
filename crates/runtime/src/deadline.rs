//! A read deadline on every API request that is not a watch. kube-rs sets none by default, and its own
//! `read_timeout` would cut every quiet watch too (the watcher guards its watches with an idle timeout
//! of its own: the server's watch timeout plus a margin). Without one, a LIST, GET or write on a
//! connection that went half-open (a dead node behind a load balancer, a stuck API server) is neither
//! an answer nor an error: the caller waits for ever, a leader keeps a stale view and its Lease, an
//! agent never reports.
//!
//! ```text
//!  request ──watch=true?──yes──► as it is (the watcher's idle timeout)
//!                         no───► no response head within `idle` → error
//!                                then no body chunk within `idle` of the last → error
//! ```
//!
//! The deadline is idle time, not total time: a large LIST that keeps arriving is never cut.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Layer, Service};

/// How long a request that is not a watch may go without a byte from the API server.
pub const API_READ_IDLE: Duration = Duration::from_secs(60);

/// The layer: wrap a kube client's service stack with it (`ClientBuilder::with_layer`).
#[derive(Clone, Copy, Debug)]
pub struct ReadDeadline {
    idle: Duration,
}

impl ReadDeadline {
    pub fn new(idle: Duration) -> Self {
        Self { idle }
    }
}

impl<S> Layer<S> for ReadDeadline {
    type Service = Deadlined<S>;
    fn layer(&self, inner: S) -> Deadlined<S> {
        Deadlined {
            inner,
            idle: self.idle,
        }
    }
}

/// The service [`ReadDeadline`] builds.
#[derive(Clone, Debug)]
pub struct Deadlined<S> {
    inner: S,
    idle: Duration,
}

/// A request that got no byte from the API server for the deadline.
#[derive(Debug)]
pub struct Stalled {
    request: Arc<str>,
    idle: Duration,
}

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: no answer from the API server for {}s (connection hung; abandoned)",
            self.request,
            self.idle.as_secs_f64()
        )
    }
}

impl std::error::Error for Stalled {}

/// Whether `uri` asks for a watch (kube-rs says `watch=true`).
fn is_watch(uri: &http::Uri) -> bool {
    uri.query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
}

impl<S, ReqBody, B> Service<Request<ReqBody>> for Deadlined<S>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Response = Response<IdleBody<B>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let idle = (!is_watch(req.uri())).then_some(self.idle);
        let request: Arc<str> = format!("{} {}", req.method(), req.uri().path()).into();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let response = match idle {
                None => answer.await.map_err(Into::into)?,
                Some(idle) => tokio::time::timeout(idle, answer)
                    .await
                    .map_err(|_| Stalled {
                        request: request.clone(),
                        idle,
                    })?
                    .map_err(Into::into)?,
            };
            Ok(response.map(|inner| IdleBody {
                inner,
                deadline: idle.map(|idle| (idle, Box::pin(tokio::time::sleep(idle)))),
                request,
            }))
        })
    }
}

/// A response body that fails once no chunk arrived for the deadline (none for a watch).
pub struct IdleBody<B> {
    inner: B,
    deadline: Option<(Duration, Pin<Box<Sleep>>)>,
    request: Arc<str>,
}

impl<B> Body for IdleBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some((idle, sleep)) = &mut this.deadline {
                    sleep.as_mut().reset(Instant::now() + *idle);
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let Some((idle, sleep)) = &mut this.deadline else {
                    return Poll::Pending;
                };
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let stalled = Stalled {
                    request: this.request.clone(),
                    idle: *idle,
                };
                Poll::Ready(Some(Err(stalled.into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_watches_go_without_a_deadline() {
        let uri = |s: &str| s.parse::<http::Uri>().unwrap();
        assert!(is_watch(&uri("/api/v1/nodes?watch=true&resourceVersion=5")));
        assert!(is_watch(&uri("/api/v1/nodes?resourceVersion=5&watch=1")));
        assert!(!is_watch(&uri("/api/v1/nodes?limit=500")));
        assert!(!is_watch(&uri("/api/v1/nodes?labelSelector=watch%3Dtrue")));
        assert!(!is_watch(&uri("/api/v1/nodes")));
    }
}
