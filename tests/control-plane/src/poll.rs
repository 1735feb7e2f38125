//! Waiting for a condition: the one polling loop the harnesses and the tests share.
//!
//! A test that waits polls what it waits for (a status, a metric, a kernel's state) and names it, so a
//! timeout says what was awaited and what was last seen. A negative ("nothing moved") is not proven by
//! waiting a while: wait for the component to have done its work (N reconciles, an evaluation) instead.

use std::future::Future;
use std::time::Duration;

use anyhow::{Result, bail};

/// How often [`until`] and [`eventually`] look again.
pub const EVERY: Duration = Duration::from_millis(50);

/// Polls `check` until it answers `Ok(Ok(value))`. `Ok(Err(state))` means "not yet" and says what it
/// saw; an `Err` ends the wait at once. After `timeout`, the error names `what` and the last state.
pub async fn until<T>(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Result<Result<T, String>>,
) -> Result<T> {
    let wait = Wait::new(what, timeout);
    loop {
        match check().await? {
            Ok(v) => return Ok(v),
            Err(last) => wait.again(last).await?,
        }
    }
}

/// [`until`] for a wait that must be `Send` (on a spawned task): `check` is a closure that returns a
/// future, which the compiler can prove `Send` where it cannot for an async closure.
pub async fn until_send<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Result<T, String>>>,
{
    let wait = Wait::new(what, timeout);
    loop {
        match check().await? {
            Ok(v) => return Ok(v),
            Err(last) => wait.again(last).await?,
        }
    }
}

/// One wait's deadline, shared by [`until`] and [`until_send`] (two loops only because the compiler cannot
/// prove an async closure's future `Send`).
struct Wait<'a> {
    what: &'a str,
    timeout: Duration,
    deadline: tokio::time::Instant,
}

impl<'a> Wait<'a> {
    fn new(what: &'a str, timeout: Duration) -> Self {
        Wait {
            what,
            timeout,
            deadline: tokio::time::Instant::now() + timeout,
        }
    }

    /// After a "not yet" that saw `last`: fails once the deadline has passed, else sleeps until the next
    /// look.
    async fn again(&self, last: String) -> Result<()> {
        if tokio::time::Instant::now() >= self.deadline {
            bail!(
                "timed out after {:?} waiting for {}; last seen: {last}",
                self.timeout,
                self.what
            );
        }
        tokio::time::sleep(EVERY).await;
        Ok(())
    }
}

/// [`until`] for a check whose every error means "not yet".
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    until_send(what, timeout, || {
        let answer = check();
        async move { Ok(answer.await) }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_timeout_names_what_was_awaited_and_the_last_state() {
        let mut n = 0;
        let e = until("the answer", Duration::from_secs(1), async || {
            n += 1;
            Ok(Err::<(), _>(format!("attempt {n}")))
        })
        .await
        .unwrap_err()
        .to_string();
        assert!(e.contains("waiting for the answer"), "{e}");
        assert!(e.contains("last seen: attempt 21"), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hard_error_ends_the_wait_at_once() {
        let mut n = 0;
        let e = until_send("anything", Duration::from_secs(60), || {
            n += 1;
            let n = n;
            async move {
                if n == 3 {
                    bail!("broken");
                }
                Ok(Err::<(), _>("not yet".into()))
            }
        })
        .await
        .unwrap_err();
        assert_eq!(e.to_string(), "broken");
        assert_eq!(n, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_ok_answer_is_returned() {
        let mut n = 0;
        let v = eventually("three", Duration::from_secs(5), || {
            n += 1;
            let n = n;
            async move { if n == 3 { Ok(n) } else { Err(format!("{n}")) } }
        })
        .await
        .unwrap();
        assert_eq!(v, 3);
    }
}
