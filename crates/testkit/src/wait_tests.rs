//! Tests of the wait helper (`wait.rs`), apart from it: the file is included by path into other crates'
//! tests, which should not run these again.

use std::time::Duration;

use crate::wait::{holds, wait_until, wait_until_async, wait_until_every};

/// The message of the panic `f` ends with.
fn panic_message(f: impl FnOnce() + std::panic::UnwindSafe) -> String {
    let failed = std::panic::catch_unwind(f).expect_err("the wait must fail");
    *failed.downcast::<String>().expect("a formatted panic")
}

#[test]
fn a_wait_returns_the_first_value_and_fails_with_the_last_observation_and_the_deadline() {
    let mut n = 0;
    let got = wait_until("n reaches 3", Duration::from_secs(5), || {
        n += 1;
        if n >= 3 {
            Ok(n)
        } else {
            Err(format!("n is {n}"))
        }
    });
    assert_eq!(got, 3);
    let message = panic_message(|| {
        let mut n = 0;
        wait_until_every("never", Duration::from_millis(30), Duration::from_millis(5), || {
            n += 1;
            Err::<(), _>(format!("still no, poll {n}"))
        })
    });
    assert!(
        message.starts_with("timed out after 30ms waiting for never; last observation: still no, poll "),
        "{message}"
    );
    assert!(!message.ends_with("poll 1"), "the last observation, not the first: {message}");
}

#[tokio::test]
async fn an_async_wait_returns_the_first_value_and_fails_with_the_last_observation() {
    let mut polls = 0;
    let got = wait_until_async("three polls", Duration::from_secs(5), Duration::from_millis(1), || {
        polls += 1;
        if polls == 3 {
            Ok(polls)
        } else {
            Err(format!("{polls} polls"))
        }
    })
    .await;
    assert_eq!(got, 3);
    let never = wait_until_async("never", Duration::from_millis(20), Duration::from_millis(5), holds(|| false));
    let message = tokio::spawn(never).await.expect_err("the wait must fail").into_panic();
    let message = message.downcast::<String>().expect("a formatted panic");
    assert!(message.contains("waiting for never; last observation: the condition does not hold"), "{message}");
}
