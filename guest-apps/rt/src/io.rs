//! I/O the same way on every target: `Read`, `Write`, `Error`,
//! `ErrorKind`, `Result`, `copy` and the standard streams.
//!
//! On hosted targets (WASI) these are std's own items, re-exported, so a
//! WASI app keeps using the real std types and traits and interoperates
//! with any std code. On bare metal there is no std, so this module
//! defines stand-ins with the same names, methods and error kinds: an app
//! that writes `use pier_rt::io::{self, Read, Write}` compiles unchanged
//! for both. Only the subset apps use is there; the kinds are std's
//! names, so an app matching on `ErrorKind::WouldBlock` or
//! `ErrorKind::ConnectionRefused` behaves the same on both targets.
//!
//! On bare metal, stdout and stderr are the serial console, and stdin is
//! empty (a unikernel has no terminal to read).

#[cfg(not(target_os = "none"))]
pub use std::io::{
    Error, ErrorKind, Read, Result, Stderr, Stdin, Stdout, Write, copy, stderr, stdin, stdout,
};

#[cfg(target_os = "none")]
pub use bare::*;

#[cfg(target_os = "none")]
mod bare {
    use alloc::boxed::Box;
    use alloc::vec::Vec;
    use core::fmt;

    /// Like `std::io::Result`.
    pub type Result<T> = core::result::Result<T, Error>;

    /// The kinds of failure, with std's names (the subset pier's sockets
    /// and apps produce), so matches on them port unchanged.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    #[non_exhaustive]
    pub enum ErrorKind {
        /// Like `std::io::ErrorKind::NotFound`.
        NotFound,
        /// The address or port is not allowed (EACCES).
        PermissionDenied,
        /// Nothing listens on the peer's port.
        ConnectionRefused,
        /// The peer or the transport reset the connection.
        ConnectionReset,
        /// The peer cannot be reached.
        HostUnreachable,
        /// The connection was aborted before it was accepted.
        ConnectionAborted,
        /// The call needs a connected socket.
        NotConnected,
        /// The port is taken.
        AddrInUse,
        /// The address is not this machine's, or no port is free.
        AddrNotAvailable,
        /// Writing after this side's or the peer's shutdown.
        BrokenPipe,
        /// The call would block and the socket is non-blocking.
        WouldBlock,
        /// A bad argument.
        InvalidInput,
        /// Malformed data.
        InvalidData,
        /// The peer did not answer in time.
        TimedOut,
        /// A write returned 0.
        WriteZero,
        /// The data ended early.
        UnexpectedEof,
        /// The target or the transport does not support the call.
        Unsupported,
        /// Memory ran out.
        OutOfMemory,
        /// A resource is busy (a connect already in progress).
        ResourceBusy,
        /// Anything else.
        Other,
    }

    impl ErrorKind {
        fn as_str(self) -> &'static str {
            match self {
                Self::NotFound => "entity not found",
                Self::PermissionDenied => "permission denied",
                Self::ConnectionRefused => "connection refused",
                Self::ConnectionReset => "connection reset",
                Self::HostUnreachable => "host unreachable",
                Self::ConnectionAborted => "connection aborted",
                Self::NotConnected => "not connected",
                Self::AddrInUse => "address in use",
                Self::AddrNotAvailable => "address not available",
                Self::BrokenPipe => "broken pipe",
                Self::WouldBlock => "operation would block",
                Self::InvalidInput => "invalid input parameter",
                Self::InvalidData => "invalid data",
                Self::TimedOut => "timed out",
                Self::WriteZero => "write zero",
                Self::UnexpectedEof => "unexpected end of file",
                Self::Unsupported => "unsupported",
                Self::OutOfMemory => "out of memory",
                Self::ResourceBusy => "resource busy",
                Self::Other => "other error",
            }
        }
    }

    impl fmt::Display for ErrorKind {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.as_str())
        }
    }

    /// Like `std::io::Error`: a kind, and optionally the error behind it.
    pub struct Error {
        kind: ErrorKind,
        inner: Option<Box<dyn core::error::Error + Send + Sync>>,
    }

    impl Error {
        /// Like `std::io::Error::new`: `error` may be a `&str`, a `String`
        /// or any error type.
        pub fn new<E>(kind: ErrorKind, error: E) -> Self
        where
            E: Into<Box<dyn core::error::Error + Send + Sync>>,
        {
            Self { kind, inner: Some(error.into()) }
        }

        /// Like `std::io::Error::other`.
        pub fn other<E>(error: E) -> Self
        where
            E: Into<Box<dyn core::error::Error + Send + Sync>>,
        {
            Self::new(ErrorKind::Other, error)
        }

        /// The kind of failure.
        pub fn kind(&self) -> ErrorKind {
            self.kind
        }

        /// The error behind this one, if it was built with one.
        pub fn get_ref(&self) -> Option<&(dyn core::error::Error + Send + Sync + 'static)> {
            self.inner.as_deref()
        }
    }

    impl From<ErrorKind> for Error {
        fn from(kind: ErrorKind) -> Self {
            Self { kind, inner: None }
        }
    }

    impl fmt::Debug for Error {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match &self.inner {
                Some(inner) => f
                    .debug_struct("Custom")
                    .field("kind", &self.kind)
                    .field("error", inner)
                    .finish(),
                None => f.debug_tuple("Kind").field(&self.kind).finish(),
            }
        }
    }

    impl fmt::Display for Error {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match &self.inner {
                Some(inner) => fmt::Display::fmt(inner, f),
                None => fmt::Display::fmt(&self.kind, f),
            }
        }
    }

    impl core::error::Error for Error {}

    /// Like `std::io::Read`.
    pub trait Read {
        /// Reads some bytes into `buf`; `Ok(0)` is end-of-file (or an
        /// empty `buf`).
        fn read(&mut self, buf: &mut [u8]) -> Result<usize>;

        /// Reads until `buf` is full; `UnexpectedEof` if the data ends
        /// first.
        fn read_exact(&mut self, mut buf: &mut [u8]) -> Result<()> {
            while !buf.is_empty() {
                match self.read(buf)? {
                    0 => return Err(Error::new(ErrorKind::UnexpectedEof, "failed to fill buffer")),
                    n => buf = &mut buf[n..],
                }
            }
            Ok(())
        }

        /// Reads to end-of-file, appending to `buf`; returns the count.
        fn read_to_end(&mut self, buf: &mut Vec<u8>) -> Result<usize> {
            let start = buf.len();
            let mut chunk = [0u8; 4096];
            loop {
                match self.read(&mut chunk)? {
                    0 => return Ok(buf.len() - start),
                    n => buf.extend_from_slice(&chunk[..n]),
                }
            }
        }
    }

    /// Like `std::io::Write`.
    pub trait Write {
        /// Writes some of `buf`; returns how much.
        fn write(&mut self, buf: &[u8]) -> Result<usize>;

        /// Pushes out anything buffered.
        fn flush(&mut self) -> Result<()>;

        /// Writes all of `buf`; `WriteZero` if a write makes no progress.
        fn write_all(&mut self, mut buf: &[u8]) -> Result<()> {
            while !buf.is_empty() {
                match self.write(buf)? {
                    0 => {
                        return Err(Error::new(
                            ErrorKind::WriteZero,
                            "failed to write whole buffer",
                        ));
                    }
                    n => buf = &buf[n..],
                }
            }
            Ok(())
        }

        /// Writes formatted text, for `write!` and `writeln!`.
        fn write_fmt(&mut self, args: fmt::Arguments<'_>) -> Result<()> {
            struct Adapter<'a, W: ?Sized> {
                inner: &'a mut W,
                error: Option<Error>,
            }
            impl<W: Write + ?Sized> fmt::Write for Adapter<'_, W> {
                fn write_str(&mut self, s: &str) -> fmt::Result {
                    self.inner.write_all(s.as_bytes()).map_err(|e| {
                        self.error = Some(e);
                        fmt::Error
                    })
                }
            }
            let mut adapter = Adapter { inner: self, error: None };
            match fmt::Write::write_fmt(&mut adapter, args) {
                Ok(()) => Ok(()),
                Err(_) => Err(adapter.error.unwrap_or_else(|| Error::other("formatter error"))),
            }
        }
    }

    impl<R: Read + ?Sized> Read for &mut R {
        fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
            (**self).read(buf)
        }
    }

    impl<W: Write + ?Sized> Write for &mut W {
        fn write(&mut self, buf: &[u8]) -> Result<usize> {
            (**self).write(buf)
        }
        fn flush(&mut self) -> Result<()> {
            (**self).flush()
        }
    }

    /// Like `std::io::copy`: reads `reader` to end-of-file, writing
    /// everything to `writer`; returns the byte count.
    pub fn copy<R, W>(reader: &mut R, writer: &mut W) -> Result<u64>
    where
        R: Read + ?Sized,
        W: Write + ?Sized,
    {
        let mut buf = [0u8; 8192];
        let mut total = 0u64;
        loop {
            match reader.read(&mut buf)? {
                0 => return Ok(total),
                n => {
                    writer.write_all(&buf[..n])?;
                    total += n as u64;
                }
            }
        }
    }

    /// The standard input: always at end-of-file on bare metal.
    #[derive(Debug)]
    pub struct Stdin;

    /// Like `std::io::stdin`.
    pub fn stdin() -> Stdin {
        Stdin
    }

    impl Stdin {
        /// Like `Stdin::lock`; there is nothing to lock.
        pub fn lock(&self) -> Stdin {
            Stdin
        }
    }

    impl Read for Stdin {
        fn read(&mut self, _buf: &mut [u8]) -> Result<usize> {
            Ok(0)
        }
    }

    /// The standard output: the serial console.
    #[derive(Debug)]
    pub struct Stdout;

    /// Like `std::io::stdout`.
    pub fn stdout() -> Stdout {
        Stdout
    }

    impl Stdout {
        /// Like `Stdout::lock`; the console needs no lock.
        pub fn lock(&self) -> Stdout {
            Stdout
        }
    }

    impl Write for Stdout {
        fn write(&mut self, buf: &[u8]) -> Result<usize> {
            crate::platform::bare::console::write_bytes(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> Result<()> {
            Ok(())
        }
    }

    /// The standard error: the serial console too.
    pub type Stderr = Stdout;

    /// Like `std::io::stderr`.
    pub fn stderr() -> Stderr {
        Stdout
    }
}
