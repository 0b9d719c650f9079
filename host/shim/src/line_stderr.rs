//! A component's stderr, written a whole line at a time.
//!
//! wasmtime-wasi hands each write of a component's stderr straight to the
//! host's stderr (or to the file the host gave it), and a component's
//! `eprintln!` is several writes: its format's pieces. The host's stderr is
//! shared with pier's own messages and every other component's, so a line
//! could arrive cut by another one, and a reader that looks for it (a
//! person, a log collector, a test) would not find it. Here each component
//! gathers its stderr into lines and writes each whole line at once, under
//! the host stderr's lock, as pier's own messages are written.
//!
//! A line that has not ended yet waits for its newline, at most
//! [`LINE_MAX`] bytes of it, and is written out as it is when the
//! component ends. A component's stdout is left unbuffered: a prompt
//! without a newline must show before the component reads its answer.

use std::io::{self, Write};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

/// Most bytes of an unfinished line held back; a longer one is written in
/// pieces of this size (a pipe writes up to 4 KiB in one piece).
pub(crate) const LINE_MAX: usize = 4096;

/// Most bytes one write may carry, as wasmtime-wasi's own streams allow.
const WRITE_BUDGET: usize = 64 * 1024;

/// Where the lines go.
#[derive(Debug)]
enum Target {
    /// The host's stderr, shared with pier's own messages.
    Host,
    /// A file the host gave the component (containerd's log pipe).
    File(std::fs::File),
}

impl Target {
    fn write_all(&self, bytes: &[u8]) -> io::Result<()> {
        match self {
            // `Stderr::write_all` holds the lock `eprintln!` takes for the
            // whole of it.
            Self::Host => io::stderr().write_all(bytes),
            Self::File(file) => (&*file).write_all(bytes),
        }
    }
}

/// A component's stderr; clones (one per `get-stderr`) share one line.
#[derive(Clone, Debug)]
pub(crate) struct LineStderr {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    target: Target,
    /// The line written so far, without its newline yet.
    unfinished: Mutex<Vec<u8>>,
}

impl LineStderr {
    /// Lines to the host's stderr.
    pub(crate) fn host() -> Self {
        Self::new(Target::Host)
    }

    /// Lines to `file`.
    pub(crate) fn file(file: std::fs::File) -> Self {
        Self::new(Target::File(file))
    }

    fn new(target: Target) -> Self {
        Self { shared: Arc::new(Shared { target, unfinished: Mutex::new(Vec::new()) }) }
    }

    /// Writes every line `bytes` ends and keeps the rest for later.
    fn write(&self, bytes: &[u8]) -> io::Result<()> {
        let mut unfinished = self.shared.unfinished.lock().unwrap_or_else(|e| e.into_inner());
        let (ended, rest) = match bytes.iter().rposition(|&b| b == b'\n') {
            Some(last) => bytes.split_at(last + 1),
            None => (&[][..], bytes),
        };
        if !ended.is_empty() {
            if unfinished.is_empty() {
                self.shared.target.write_all(ended)?;
            } else {
                unfinished.extend_from_slice(ended);
                let written = self.shared.target.write_all(&unfinished);
                unfinished.clear();
                written?;
            }
        }
        unfinished.extend_from_slice(rest);
        while unfinished.len() >= LINE_MAX {
            let written = self.shared.target.write_all(&unfinished[..LINE_MAX]);
            unfinished.drain(..LINE_MAX);
            written?;
        }
        Ok(())
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let unfinished = self.unfinished.get_mut().unwrap_or_else(|e| e.into_inner());
        if !unfinished.is_empty() {
            let _ = self.target.write_all(unfinished);
        }
    }
}

impl IsTerminal for LineStderr {
    fn is_terminal(&self) -> bool {
        match &self.shared.target {
            Target::Host => io::IsTerminal::is_terminal(&io::stderr()),
            Target::File(_) => false,
        }
    }
}

impl StdoutStream for LineStderr {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for LineStderr {
    async fn ready(&mut self) {}
}

fn stream_error(e: io::Error) -> StreamError {
    if e.kind() == io::ErrorKind::BrokenPipe {
        StreamError::Closed
    } else {
        StreamError::LastOperationFailed(e.into())
    }
}

impl OutputStream for LineStderr {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        if bytes.len() > WRITE_BUDGET {
            return Err(StreamError::trap("write exceeds the permit of check-write"));
        }
        LineStderr::write(self, &bytes).map_err(stream_error)
    }

    /// A flush keeps an unfinished line: a component's `eprintln!` flushes
    /// after each of its pieces.
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_BUDGET)
    }
}

impl AsyncWrite for LineStderr {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(LineStderr::write(&self, buf).map(|()| buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// A pipe whose write end feeds a `LineStderr`.
    fn piped() -> (LineStderr, std::fs::File) {
        let (reader, writer) = std::io::pipe().unwrap();
        let reader = std::fs::File::from(std::os::fd::OwnedFd::from(reader));
        let writer = std::fs::File::from(std::os::fd::OwnedFd::from(writer));
        (LineStderr::file(writer), reader)
    }

    fn read_all(mut reader: std::fs::File) -> String {
        let mut text = String::new();
        reader.read_to_string(&mut text).unwrap();
        text
    }

    #[test]
    fn a_line_written_in_pieces_reaches_the_target_as_one_write() {
        let (stderr, reader) = piped();
        let other = match &stderr.shared.target {
            Target::File(file) => file.try_clone().unwrap(),
            Target::Host => unreachable!(),
        };
        stderr.write(b"echo: connection ").unwrap();
        stderr.write(b"2:1234").unwrap();
        // Another writer to the same target between the pieces.
        (&other).write_all(b"other line\n").unwrap();
        stderr.write(b": ended in order\nnext ").unwrap();
        stderr.write(b"line\n").unwrap();
        drop((stderr, other));
        assert_eq!(
            read_all(reader),
            "other line\necho: connection 2:1234: ended in order\nnext line\n"
        );
    }

    #[test]
    fn an_unfinished_line_is_written_when_the_component_ends() {
        let (stderr, reader) = piped();
        let copy = stderr.clone();
        stderr.write(b"no newline").unwrap();
        drop(stderr);
        copy.write(b", still").unwrap();
        drop(copy);
        assert_eq!(read_all(reader), "no newline, still");
    }

    #[test]
    fn a_line_longer_than_line_max_is_written_in_pieces_of_it() {
        let (stderr, reader) = piped();
        let long = vec![b'x'; LINE_MAX + 10];
        stderr.write(&long).unwrap();
        let early = stderr.shared.unfinished.lock().unwrap().len();
        assert_eq!(early, 10, "only the tail past LINE_MAX waits");
        drop(stderr);
        assert_eq!(read_all(reader).len(), LINE_MAX + 10);
    }
}
