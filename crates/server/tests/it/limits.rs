//! The server's bounds (`server::Limits`): each one exceeded over raw TCP, its documented
//! answer seen, its counter on `/metrics` moved, and the server still serving others.

use std::time::{Duration, Instant};

use serde_json::json;
use server::Limits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{metric, reserve_body, As, Engine, TestServer};

/// A server with `limits` changed from the defaults by `change`.
async fn server_with(change: impl FnOnce(&mut Limits)) -> TestServer {
    TestServer::start_with(Engine::Embedded, |options| change(&mut options.limits)).await
}

fn addr(server: &TestServer) -> String {
    server.base.trim_start_matches("http://").to_string()
}

/// Reads what the server sends until it closes the connection or `within` passes; returns
/// the text and whether the connection was closed.
async fn read_until_closed(tcp: &mut TcpStream, within: Duration) -> (String, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into(), true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&got).into(), false),
        }
    }
}

/// Waits until a counter on `/metrics` reaches `at_least` (a connection's task counts what
/// closed it just after the client sees it closed).
async fn wait_metric(server: &TestServer, name: &str, at_least: u64) -> u64 {
    for _ in 0..200 {
        let value = metric(server, name).await;
        if value >= at_least {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{name} never reached {at_least}");
}

/// A request that is still sending its body: in flight until it is finished or dropped.
async fn start_slow_reserve(server: &TestServer, key: &str) -> TcpStream {
    let body = reserve_body("slow-1", json!({"tenant": "acme"}), 1).to_string();
    let mut tcp = TcpStream::connect(addr(server)).await.expect("connect");
    let head = format!(
        "POST /v1/reservations HTTP/1.1\r\nHost: x\r\nX-Cycles-API-Key: {key}\r\n\
         X-Idempotency-Key: slow-1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{}",
        body.len(),
        &body[..10]
    );
    tcp.write_all(head.as_bytes()).await.expect("write");
    tcp
}

/// Waits until the server counts `n` requests in flight (the slow ones are in the
/// middleware, waiting on their bodies).
async fn wait_in_flight(server: &TestServer, n: u64) {
    assert!(
        in_flight(server, n).await,
        "{n} requests never got in flight"
    );
}

/// Whether the server comes to count `n` requests in flight within two seconds.
async fn in_flight(server: &TestServer, n: u64) -> bool {
    for _ in 0..200 {
        // The /metrics request itself is one of them.
        if metric(server, "cycles_http_requests_in_flight").await > n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_the_maximum_is_answered_503_and_closed() {
    let server = server_with(|l| l.max_connections = 2).await;
    let _first = TcpStream::connect(addr(&server)).await.expect("first");
    let _second = TcpStream::connect(addr(&server)).await.expect("second");
    // Let the server accept both before the third arrives.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = TcpStream::connect(addr(&server)).await.expect("third");
    third
        .write_all(b"GET /v1/balances HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let (answer, closed) = read_until_closed(&mut third, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(answer.contains("\"error\":\"INTERNAL_ERROR\""), "{answer}");
    assert!(closed, "the refused connection is closed");
    // Once one closes, a new connection is served (the harness's client needs one).
    drop(_first);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(metric(&server, "cycles_connections_refused_total").await, 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_over_the_size_or_count_limit_are_answered_431() {
    let server = server_with(|l| {
        l.max_header_bytes = 8_192;
        l.max_headers = 20;
    })
    .await;
    let mut big = TcpStream::connect(addr(&server)).await.expect("connect");
    let padding = "a".repeat(10_000);
    big.write_all(
        format!("GET /v1/balances HTTP/1.1\r\nHost: x\r\nX-Pad: {padding}\r\n\r\n").as_bytes(),
    )
    .await
    .expect("write");
    let (answer, _) = read_until_closed(&mut big, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");

    let mut many = TcpStream::connect(addr(&server)).await.expect("connect");
    let headers: String = (0..30).map(|i| format!("X-H{i}: v\r\n")).collect();
    many.write_all(format!("GET /v1/balances HTTP/1.1\r\nHost: x\r\n{headers}\r\n").as_bytes())
        .await
        .expect("write");
    let (answer, _) = read_until_closed(&mut many, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");

    // Others are still served, and the refusals are counted.
    server
        .get("/v1/admin/tenants", As::Admin)
        .await
        .expect(200, None);
    assert_eq!(
        wait_metric(&server, "cycles_headers_too_large_total", 2).await,
        2
    );
    server.stop().await;
}

/// Sends `head` (and no body) on a connection of its own; answers the status line.
async fn status_of(server: &TestServer, head: &str) -> String {
    let mut tcp = TcpStream::connect(addr(server)).await.expect("connect");
    tcp.write_all(head.as_bytes()).await.expect("write");
    let (answer, _) = read_until_closed(&mut tcp, Duration::from_secs(5)).await;
    answer.lines().next().unwrap_or_default().to_string()
}

/// The default head limit (64 KiB) holds exactly: hyper's read buffer grows in steps and
/// parsed heads of up to about 112 KiB, so the server refuses them by their size. And an
/// HTTP/1.1 request names its Host once (RFC 9112 §3.2), a body declared over the limit is
/// refused from the head, and a transfer coding hyper does not undo is 501.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_is_checked_before_the_request_runs() {
    let server = server_with(|_| {}).await;
    let head = |pad: usize| {
        let padding = "a".repeat(pad);
        format!("GET /actuator/health HTTP/1.1\r\nHost: x\r\nX-Pad: {padding}\r\nConnection: close\r\n\r\n")
    };
    let fixed = head(0).len();
    assert_eq!(
        status_of(&server, &head(65_536 - fixed)).await,
        "HTTP/1.1 200 OK"
    );
    let over = status_of(&server, &head(65_536 - fixed + 1)).await;
    assert_eq!(over, "HTTP/1.1 431 Request Header Fields Too Large");
    assert_eq!(
        status_of(&server, &head(100_000)).await,
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
    assert_eq!(metric(&server, "cycles_headers_too_large_total").await, 2);
    let no_host = "GET /actuator/health HTTP/1.1\r\nConnection: close\r\n\r\n";
    assert_eq!(
        status_of(&server, no_host).await,
        "HTTP/1.1 400 Bad Request"
    );
    let two = "GET /actuator/health HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n";
    assert_eq!(status_of(&server, two).await, "HTTP/1.1 400 Bad Request");
    let old = "GET /actuator/health HTTP/1.0\r\n\r\n";
    assert_eq!(status_of(&server, old).await, "HTTP/1.0 200 OK");
    // A body declared over the limit is refused before any of it is awaited (the body
    // timeout is 30 s), as the same body read whole is.
    let started = Instant::now();
    let declared = "POST /v1/reservations HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\
                    Content-Length: 3000000\r\n\r\n";
    assert_eq!(
        status_of(&server, declared).await,
        "HTTP/1.1 400 Bad Request"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    let gzip = "POST /v1/reservations HTTP/1.1\r\nHost: x\r\n\
                Transfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
    assert_eq!(
        status_of(&server, gzip).await,
        "HTTP/1.1 501 Not Implemented"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_that_do_not_arrive_in_time_close_the_connection() {
    let server = server_with(|l| l.header_read_timeout = Duration::from_millis(300)).await;
    // A slowloris: part of a request line, then nothing.
    let mut slow = TcpStream::connect(addr(&server)).await.expect("connect");
    slow.write_all(b"GET /v1/bal").await.expect("write");
    // An idle kept-alive connection: one request answered, then nothing.
    let mut idle = TcpStream::connect(addr(&server)).await.expect("connect");
    idle.write_all(b"GET /actuator/health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let started = Instant::now();
    let (_, slow_closed) = read_until_closed(&mut slow, Duration::from_secs(5)).await;
    assert!(slow_closed, "the slow client's connection is closed");
    let (answer, idle_closed) = read_until_closed(&mut idle, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(idle_closed, "the idle connection is closed");
    assert!(started.elapsed() < Duration::from_secs(3));
    // Meanwhile, and after, others are served.
    server
        .get("/v1/admin/tenants", As::Admin)
        .await
        .expect(200, None);
    wait_metric(&server, "cycles_header_read_timeouts_total", 2).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_does_not_arrive_in_time_is_answered_408_and_changes_nothing() {
    let server = server_with(|l| l.body_read_timeout = Duration::from_millis(300)).await;
    let key = server.setup("acme", 1_000).await;
    let before = server.ledger("tenant:acme", "USD_MICROCENTS").await;
    let mut slow = start_slow_reserve(&server, &key).await;
    let (answer, _) = read_until_closed(&mut slow, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"error\":\"INVALID_REQUEST\""), "{answer}");
    assert!(answer.contains("did not arrive within 300 ms"), "{answer}");
    assert_eq!(
        server.ledger("tenant:acme", "USD_MICROCENTS").await,
        before,
        "the reservation was not made"
    );
    assert_eq!(metric(&server, "cycles_body_read_timeouts_total").await, 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_maximum_in_flight_are_shed_at_once() {
    let server = server_with(|l| l.max_in_flight = 3).await;
    let key = server.setup("acme", 1_000).await;
    let _held: Vec<TcpStream> = vec![
        start_slow_reserve(&server, &key).await,
        start_slow_reserve(&server, &key).await,
    ];
    wait_in_flight(&server, 2).await;
    // The two slow requests and this one: the third fills the server, so a fourth...
    // The third is shed if it arrives while a /metrics request of the waits is in flight
    // (counted, never shed): then it is sent again. A shed one is counted in flight for a
    // moment too, so a wait may see it there: only a third that was not shed is in flight.
    let third = loop {
        let shed = metric(&server, "cycles_requests_shed_total").await;
        let third = start_slow_reserve(&server, &key).await;
        let seen = in_flight(&server, 3).await;
        let now = metric(&server, "cycles_requests_shed_total").await;
        if seen && now == shed {
            break third;
        }
        assert!(
            now > shed,
            "the third request was neither in flight nor shed"
        );
    };
    let started = Instant::now();
    let shed = server.get("/v1/balances?tenant=acme", As::Key(&key)).await;
    shed.expect(503, Some("INTERNAL_ERROR"));
    assert_eq!(shed.header("retry-after"), Some("1"));
    assert!(started.elapsed() < Duration::from_secs(1), "shed at once");
    // The health check and the metrics are never shed.
    server
        .get("/actuator/health", As::Nobody)
        .await
        .expect(200, None);
    assert!(metric(&server, "cycles_requests_shed_total").await >= 1);
    // Once the load goes, requests are served again.
    drop(third);
    drop(_held);
    tokio::time::sleep(Duration::from_millis(100)).await;
    server
        .get("/v1/balances?tenant=acme", As::Key(&key))
        .await
        .expect(200, None);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_over_its_share_is_refused_429_while_another_is_served() {
    let server = server_with(|l| l.max_in_flight_per_key = 2).await;
    let acme = server.setup("acme", 1_000).await;
    let other = server.setup("other", 1_000).await;
    // Each key served once: a key counts as itself once accepted.
    for (key, tenant) in [(&acme, "acme"), (&other, "other")] {
        let path = format!("/v1/balances?tenant={tenant}");
        server.get(&path, As::Key(key)).await.expect(200, None);
    }
    let _held = [
        start_slow_reserve(&server, &acme).await,
        start_slow_reserve(&server, &acme).await,
    ];
    wait_in_flight(&server, 2).await;
    let refused = server.get("/v1/balances?tenant=acme", As::Key(&acme)).await;
    refused.expect(429, Some("LIMIT_EXCEEDED"));
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert!(refused.header("x-ratelimit-reset").is_some());
    server
        .get("/v1/balances?tenant=other", As::Key(&other))
        .await
        .expect(200, None);
    assert_eq!(
        metric(&server, "cycles_requests_over_key_share_total").await,
        1
    );
    drop(_held);
    tokio::time::sleep(Duration::from_millis(100)).await;
    server
        .get("/v1/balances?tenant=acme", As::Key(&acme))
        .await
        .expect(200, None);
    server.stop().await;
}

/// Keys nobody issued have no share of their own: until a key is accepted, its requests
/// count as their address's. Made-up keys with bodies that never finish once took every
/// request the server answers at once, locking out its tenants and the admin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_keys_share_their_address_and_crowd_out_nobody() {
    let server = server_with(|l| {
        l.max_in_flight = 6;
        l.max_in_flight_per_key = 3;
    })
    .await;
    let acme = server.setup("acme", 1_000).await;
    server
        .get("/v1/balances?tenant=acme", As::Key(&acme))
        .await
        .expect(200, None);
    let mut held = Vec::new();
    for i in 0..3 {
        held.push(start_slow_reserve(&server, &format!("made-up-{i}")).await);
    }
    wait_in_flight(&server, 3).await;
    // A fourth made-up key from the same address: over the address's share.
    let mut fourth = start_slow_reserve(&server, "made-up-3").await;
    let (answer, _) = read_until_closed(&mut fourth, Duration::from_millis(500)).await;
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    // The tenant and the admin are served meanwhile.
    server
        .get("/v1/balances?tenant=acme", As::Key(&acme))
        .await
        .expect(200, None);
    server
        .get("/v1/admin/tenants", As::Admin)
        .await
        .expect(200, None);
    drop(held);
    server.stop().await;
}
