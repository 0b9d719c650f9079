//! A read-only OCI registry on loopback, serving the images
//! `crate::oci_image` lays out: what `ctr pull` and containerd's CRI
//! plugin (the kubelet's PullImage) fetch from, without a registry daemon
//! to install.
//!
//! It speaks as much of the OCI distribution API as a pull needs, over
//! plain HTTP/1.1 on `127.0.0.1` at a port the system picks: `GET /v2/`
//! (the API check), `GET`/`HEAD /v2/<name>/manifests/<tag or digest>`
//! (answered with the document's media type and `Docker-Content-Digest`)
//! and `GET`/`HEAD /v2/<name>/blobs/<digest>`. Anything else is a 404 or
//! a 405 with the API's JSON error. One request per connection (the
//! answer says `Connection: close`), each connection on a thread of its
//! own: containerd fetches blobs in parallel. Every request line is kept,
//! so a test can tell that a pull went through the registry.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::oci_image::Layout;

/// What the registry serves: repositories (`pier/echo`), each with one
/// image under that image's tag.
type Repositories = Vec<(String, Layout)>;

/// A registry serving on `127.0.0.1` until dropped.
#[derive(Debug)]
pub struct Registry {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    requests: Arc<Mutex<Vec<String>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl Registry {
    /// Serves `images`: each layout as repository `name`, under its tag.
    pub fn serve(images: Vec<(String, Layout)>) -> Result<Self, String> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| format!("binding the registry's port: {e}"))?;
        let address = listener.local_addr().map_err(|e| e.to_string())?;
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let images = Arc::new(images);
        let acceptor = std::thread::spawn({
            let stop = stop.clone();
            let requests = requests.clone();
            move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    let images = images.clone();
                    let requests = requests.clone();
                    std::thread::spawn(move || {
                        let _ = answer(stream, &images, &requests);
                    });
                }
            }
        });
        Ok(Self { address, stop, requests, acceptor: Some(acceptor) })
    }

    /// `127.0.0.1:PORT`: the registry's host, as a reference names it.
    pub fn host(&self) -> String {
        self.address.to_string()
    }

    /// The reference of repository `name`'s image tagged `tag`.
    pub fn reference(&self, name: &str, tag: &str) -> String {
        format!("{}/{name}:{tag}", self.host())
    }

    /// The request lines served so far (`GET /v2/pier/echo/blobs/sha256:...`).
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the acceptor, which then sees the flag.
        let _ = TcpStream::connect(self.address);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

/// Reads one request from `stream` and answers it.
fn answer(
    stream: TcpStream,
    images: &Repositories,
    requests: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // The headers matter to nothing served here (a GET or HEAD has no
    // body); they are read to their end so closing does not reset the
    // connection under a client still writing them.
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let request_line = request_line.trim_end().to_owned();
    if let Ok(mut requests) = requests.lock() {
        requests.push(request_line.clone());
    }
    let mut parts = request_line.split(' ');
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let response = match method {
        "GET" | "HEAD" => route(path, images),
        _ => Response::error(405, "UNSUPPORTED", "the registry is read-only"),
    };
    response.write(stream, method == "HEAD")
}

/// The answer to a `GET` of `path`.
fn route(path: &str, images: &Repositories) -> Response {
    if path == "/v2/" || path == "/v2" {
        return Response::ok("application/json", b"{}".to_vec(), None);
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return Response::error(404, "NOT_FOUND", "not an API path");
    };
    let (name, kind, key) = match (rest.rsplit_once("/manifests/"), rest.rsplit_once("/blobs/")) {
        (Some((name, key)), _) => (name, Kind::Manifest, key),
        (None, Some((name, key))) => (name, Kind::Blob, key),
        (None, None) => return Response::error(404, "NOT_FOUND", "not an API path"),
    };
    let Some((_, layout)) = images.iter().find(|(repository, _)| repository == name) else {
        return Response::error(404, "NAME_UNKNOWN", "no such repository");
    };
    let digest = match kind {
        Kind::Manifest if key == layout.tag => layout.index_digest.as_str(),
        _ => key,
    };
    let blob = layout.blob(digest).filter(|blob| match kind {
        Kind::Manifest => {
            blob.media_type.ends_with("manifest.v1+json")
                || blob.media_type.ends_with("index.v1+json")
        }
        Kind::Blob => true,
    });
    match (blob, kind) {
        (Some(blob), Kind::Manifest) => {
            Response::ok(blob.media_type, blob.bytes.clone(), Some(digest.to_owned()))
        }
        (Some(blob), Kind::Blob) => {
            Response::ok("application/octet-stream", blob.bytes.clone(), Some(digest.to_owned()))
        }
        (None, Kind::Manifest) => Response::error(404, "MANIFEST_UNKNOWN", "no such manifest"),
        (None, Kind::Blob) => Response::error(404, "BLOB_UNKNOWN", "no such blob"),
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Manifest,
    Blob,
}

struct Response {
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
    digest: Option<String>,
}

impl Response {
    fn ok(content_type: &'static str, body: Vec<u8>, digest: Option<String>) -> Self {
        Self { status: 200, content_type, body, digest }
    }

    /// The distribution API's error document.
    fn error(status: u16, code: &str, message: &str) -> Self {
        let body = format!("{{\"errors\":[{{\"code\":\"{code}\",\"message\":\"{message}\"}}]}}");
        Self { status, content_type: "application/json", body: body.into_bytes(), digest: None }
    }

    /// Writes the response; a `HEAD`'s has the headers of the `GET`'s and
    /// no body.
    fn write(self, mut stream: TcpStream, head_only: bool) -> std::io::Result<()> {
        let reason = match self.status {
            200 => "OK",
            404 => "Not Found",
            _ => "Method Not Allowed",
        };
        let mut head = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\n\
             Docker-Distribution-API-Version: registry/2.0\r\nConnection: close\r\n",
            self.status,
            self.content_type,
            self.body.len()
        );
        if let Some(digest) = &self.digest {
            head.push_str(&format!("Docker-Content-Digest: {digest}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes())?;
        if !head_only {
            stream.write_all(&self.body)?;
        }
        stream.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::io::Read as _;

    /// Sends one request and returns the status line, the headers
    /// (lowercased names) and the body.
    fn request(registry: &Registry, method: &str, path: &str) -> (String, Vec<String>, Vec<u8>) {
        let mut stream = TcpStream::connect(registry.address).unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAccept: */*\r\n\r\n",
            registry.host()
        )
        .unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).unwrap();
        let end = response.windows(4).position(|w| w == b"\r\n\r\n").expect("a header's end");
        let head = String::from_utf8(response[..end].to_vec()).unwrap();
        let mut lines = head.split("\r\n").map(str::to_owned);
        let status = lines.next().unwrap();
        let headers = lines.map(|l| l.to_ascii_lowercase()).collect();
        (status, headers, response[end + 4..].to_vec())
    }

    fn registry() -> (Registry, Layout) {
        let component = b"\0asm\x0d\0\x01\0component".to_vec();
        let layout =
            crate::oci_image::image_layout(&component, "echo", "pier/echo:v1", &[]).unwrap();
        (Registry::serve(vec![("pier/echo".into(), layout.clone())]).unwrap(), layout)
    }

    #[test]
    fn the_tag_names_the_image_index_and_digests_name_blobs() {
        let (registry, layout) = registry();
        assert!(registry.host().starts_with("127.0.0.1:"));
        assert_eq!(
            registry.reference("pier/echo", "v1"),
            format!("{}/pier/echo:v1", registry.host())
        );

        let (status, _, body) = request(&registry, "GET", "/v2/");
        assert_eq!((status.as_str(), body.as_slice()), ("HTTP/1.1 200 OK", &b"{}"[..]));

        let index = layout.blob(&layout.index_digest).unwrap();
        for path in [
            "/v2/pier/echo/manifests/v1",
            &format!("/v2/pier/echo/manifests/{}", layout.index_digest),
        ] {
            let (status, headers, body) = request(&registry, "GET", path);
            assert_eq!(status, "HTTP/1.1 200 OK", "{path}");
            assert_eq!(body, index.bytes, "{path}");
            let digest = format!("docker-content-digest: {}", layout.index_digest);
            assert!(headers.contains(&digest), "{path}: {headers:?}");
            assert!(
                headers.contains(&format!("content-type: {}", index.media_type)),
                "{headers:?}"
            );
        }
        let manifest = layout.blob(&layout.manifest_digest).unwrap();
        let manifest_path = format!("/v2/pier/echo/manifests/{}", layout.manifest_digest);
        let (_, headers, body) = request(&registry, "GET", &manifest_path);
        assert_eq!(body, manifest.bytes);
        assert!(headers.contains(&format!("content-type: {}", manifest.media_type)));

        // A HEAD has the GET's length and no body.
        let (status, headers, body) = request(&registry, "HEAD", &manifest_path);
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(headers.contains(&format!("content-length: {}", manifest.bytes.len())));
        assert!(body.is_empty());

        let blob_path = format!("/v2/pier/echo/blobs/{}", layout.manifest_digest);
        assert_eq!(request(&registry, "GET", &blob_path).2, manifest.bytes);
        assert!(registry.requests().contains(&format!("GET {blob_path} HTTP/1.1")));
    }

    #[test]
    fn unknown_names_and_writes_are_refused() {
        let (registry, layout) = registry();
        let config = &layout.config_digest;
        for (method, path, status, code) in [
            ("GET", "/v2/pier/other/manifests/v1".to_owned(), 404, "NAME_UNKNOWN"),
            ("GET", "/v2/pier/echo/manifests/v2".to_owned(), 404, "MANIFEST_UNKNOWN"),
            ("GET", format!("/v2/pier/echo/manifests/{config}"), 404, "MANIFEST_UNKNOWN"),
            ("GET", "/v2/pier/echo/blobs/sha256:00".to_owned(), 404, "BLOB_UNKNOWN"),
            ("GET", "/index.json".to_owned(), 404, "NOT_FOUND"),
            ("PUT", "/v2/pier/echo/manifests/v1".to_owned(), 405, "UNSUPPORTED"),
        ] {
            let (line, _, body) = request(&registry, method, &path);
            assert!(line.starts_with(&format!("HTTP/1.1 {status} ")), "{method} {path}: {line}");
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body["errors"][0]["code"], code, "{method} {path}");
        }
    }
}
