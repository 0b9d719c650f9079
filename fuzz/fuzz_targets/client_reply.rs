//! Fuzz target: what pier-client makes of a backend's answer to `CONNECT
//! <port>` (`HybridStream::connect`: the answer read up to its newline
//! without reading past it, then `pier_hybrid::parse_ok`), the bytes a
//! hostile or broken backend sends first.
//!
//! A backend thread listens on a Unix socket; for each input it accepts
//! one connection, reads the request, writes the input in two writes (split
//! where the first byte says, so the client's peeks can see part of a
//! line) and closes.
//!
//! Invariants, besides never panicking or hanging:
//! - the connect succeeds exactly when the input starts with a line of at
//!   most `MAX_OK_LINE` bytes, newline included, that is `OK`, whitespace
//!   and plain digits (and an optional `\r`), and then reports that port;
//! - what follows the newline is left in the socket for the caller, byte
//!   for byte;
//! - an empty answer is a refusal (`ConnectionRefused`), any other failed
//!   answer `InvalidData`.
#![no_main]

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use pier_client::HybridStream;
use pier_hybrid::MAX_OK_LINE;

/// The backend: its socket's path, and the answers it is to send.
struct Backend {
    path: PathBuf,
    answers: Mutex<SyncSender<Vec<u8>>>,
}

fn backend() -> &'static Backend {
    static BACKEND: OnceLock<Backend> = OnceLock::new();
    BACKEND.get_or_init(|| {
        // SAFETY: setting a signal's disposition to SIG_IGN at start-up,
        // before any thread of ours could be writing to a socket.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        let path =
            std::env::temp_dir().join(format!("pier-fuzz-reply-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("binding the backend's socket");
        let (answers, next) = sync_channel::<Vec<u8>>(1);
        std::thread::spawn(move || {
            for answer in next {
                let (mut conn, _) = listener.accept().expect("accepting the client");
                let mut request = Vec::new();
                let mut byte = [0u8; 1];
                while !request.ends_with(b"\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                    request.push(byte[0]);
                }
                assert_eq!(request, b"CONNECT 7\n", "the client's request");
                let split = usize::from(answer.first().copied().unwrap_or(0)).min(answer.len());
                // The client may have given up already: a failed write is its
                // business, the assertions are on its side.
                let _ = conn
                    .write_all(&answer[..split])
                    .and_then(|()| conn.write_all(&answer[split..]));
            }
        });
        Backend { path, answers: Mutex::new(answers) }
    })
}

/// The port an answer line (its newline included) names, by the protocol's
/// rule, written out independently of `parse_ok`.
fn expected_port(line: &[u8]) -> Option<u32> {
    let line = line.strip_suffix(b"\n")?;
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = std::str::from_utf8(line).ok()?;
    let fields: Vec<&str> = text.split_ascii_whitespace().collect();
    match fields[..] {
        ["OK", digits] if digits.bytes().all(|b| b.is_ascii_digit()) => digits.parse().ok(),
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let backend = backend();
    backend.answers.lock().unwrap().send(data.to_vec()).unwrap();
    let outcome = HybridStream::connect(&backend.path, 7);
    let end = data.iter().position(|&b| b == b'\n').map(|i| i + 1).filter(|&n| n <= MAX_OK_LINE);
    let expected = end.and_then(|n| expected_port(&data[..n]));
    match (outcome, expected) {
        (Ok(stream), Some(port)) => {
            assert_eq!(stream.local_port(), port);
            let mut rest = Vec::new();
            stream.into_inner().read_to_end(&mut rest).expect("reading what follows the answer");
            assert_eq!(rest, data[end.unwrap()..], "the bytes after the answer are the caller's");
        }
        (Err(e), None) if data.is_empty() => {
            assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}")
        }
        (Err(e), None) => assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}"),
        (Ok(stream), None) => panic!("accepted {data:?} as port {}", stream.local_port()),
        (Err(e), Some(port)) => panic!("refused an answer naming port {port}: {e}"),
    }
});
