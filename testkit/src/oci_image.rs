//! OCI images of guest components, for containerd (`cargo xtask
//! oci-image`) and for a registry (`crate::registry`).
//!
//! pier's containerd shim runs a component with pier's wasmtime host. It
//! takes the component from the container's root filesystem, at the path
//! the runtime spec's `process.args[0]` names, so the image is a plain one:
//! one uncompressed tar layer holding the component at `/<name>.wasm`, and
//! a config whose entrypoint is that path (with the component's arguments,
//! if any, as its command). [`image_layout`] builds the image's blobs;
//! [`write_image`] writes them as an OCI image layout in one tar archive,
//! which `ctr image import` reads as it is, and `crate::registry` serves
//! the same blobs as a registry does, for `ctr pull` and the kubelet.
//!
//! The archive is the same, byte for byte, for the same component, name,
//! reference and arguments: tar entries carry fixed times, modes and
//! owners and come in sorted order, the JSON documents are written by hand
//! in a fixed key order, and every blob is named by its sha256.
//!
//! What a reference names is an image index that lists the one manifest
//! under each of [`PLATFORMS`]: containerd keeps only the manifests of an
//! index whose platform matches the one it pulls or imports for, and who
//! asks for what differs (see [`PLATFORMS`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use sha2::{Digest as _, Sha256};

use crate::json;

/// The image's operating system, in its config: what a component needs
/// from its host is WASI 0.2, not a kernel.
pub const OS: &str = "wasip2";
/// The image's architecture, in its config.
pub const ARCHITECTURE: &str = "wasm";
/// The platforms (OS, architecture) the image index lists the manifest
/// under; a component runs the same on all of them. containerd compares
/// OS and architecture names as they are written, and each entry is
/// there for someone who asks for it:
///
/// - `wasip2/wasm` is what the component is, and what pier's own commands
///   give `ctr` ([`PLATFORM`]);
/// - `wasi/wasm` is what Docker's and runwasi's wasm tooling builds and
///   asks for (`--platform wasi/wasm`);
/// - `linux/amd64` and `linux/arm64` are what the kubelet gets: the CRI's
///   PullImage carries no platform, and containerd's CRI plugin pulls and
///   unpacks for the node's own platform (1.6 and 1.7 always, 2.x by
///   default), so an index without it fails with "no match for platform
///   in manifest", and 1.6's CRI plugin does not list such an image even
///   when it is imported. `ctr pull` and `ctr image import` without
///   `--platform` ask for the same.
///
/// `wasip1/wasm` is left out: a WASI 0.1 runtime cannot run a component.
pub const PLATFORMS: [(&str, &str); 4] =
    [(OS, ARCHITECTURE), ("wasi", "wasm"), ("linux", "amd64"), ("linux", "arm64")];
/// The platform pier's commands give `ctr` (`ctr image import`, `ctr
/// run`): the component's own. Any of [`PLATFORMS`] finds the image, and
/// so does giving none on an amd64 or arm64 host.
pub const PLATFORM: &str = "wasip2/wasm";
/// The runtime containerd finds pier's shim (`containerd-shim-pier-v1`)
/// by.
pub const RUNTIME: &str = "io.containerd.pier.v1";

/// The media types of the image's documents and its layer.
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";

/// The annotation containerd names an imported image by; with it, `ctr
/// image import` needs no `--base-name`.
const CONTAINERD_NAME: &str = "io.containerd.image.name";
/// The OCI layout's own name for the image: its tag, as containerd
/// writes it when it exports.
const OCI_REF_NAME: &str = "org.opencontainers.image.ref.name";

/// What a written image is known by, for the command's report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    /// The name containerd gives the image on import.
    pub reference: String,
    /// The digest of the image index the reference names (`sha256:...`):
    /// what a registry resolves the reference to.
    pub index_digest: String,
    /// The digest of the image's one manifest.
    pub manifest_digest: String,
    /// The archive's size in bytes.
    pub archive_size: u64,
}

/// One blob of an image and the media type it is served as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blob {
    pub media_type: &'static str,
    pub bytes: Vec<u8>,
}

/// An image's blobs, each named by its digest, and the image index its
/// reference names: what an OCI layout holds and a registry serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The reference the image was made for (`docker.io/pier/echo:latest`).
    pub reference: String,
    /// Its tag (`latest`), or the whole reference when it has none.
    pub tag: String,
    /// The image index's digest.
    pub index_digest: String,
    /// The one manifest's digest.
    pub manifest_digest: String,
    /// The config's digest: the image's ID to containerd's CRI plugin.
    pub config_digest: String,
    blobs: BTreeMap<String, Blob>,
}

impl Layout {
    /// The blob named `digest` (`sha256:...`).
    pub fn blob(&self, digest: &str) -> Option<&Blob> {
        self.blobs.get(digest)
    }
}

/// Writes the image of the component at `wasm` to `out` (an OCI image
/// layout in one tar archive), its folder created if missing.
///
/// `name` names the component's file in the image (`/<name>.wasm`),
/// `reference` the image (`docker.io/pier/echo:latest`); `args`, when not
/// empty, become the config's `Cmd`: the component's arguments.
pub fn write_image(
    wasm: &Path,
    name: &str,
    reference: &str,
    args: &[String],
    out: &Path,
) -> Result<ImageInfo, String> {
    let component = std::fs::read(wasm).map_err(|e| format!("reading {}: {e}", wasm.display()))?;
    let (archive, info) = image_archive(&component, name, reference, args)?;
    if let Some(dir) = out.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    std::fs::write(out, &archive).map_err(|e| format!("writing {}: {e}", out.display()))?;
    Ok(info)
}

/// The blobs of the image of `component` ([`write_image`]'s arguments
/// otherwise): one layer, its config, the manifest, and the image index
/// listing the manifest under each of [`PLATFORMS`].
pub fn image_layout(
    component: &[u8],
    name: &str,
    reference: &str,
    args: &[String],
) -> Result<Layout, String> {
    let file = component_file(name)?;
    let tag = reference_tag(reference)?;

    let mut layer = Tar::default();
    layer.file(&file, component)?;
    let layer = layer.finish();

    let mut process = format!("\"Entrypoint\":[{}]", json::string(&format!("/{file}")));
    if !args.is_empty() {
        let args: Vec<String> = args.iter().map(|a| json::string(a)).collect();
        let _ = write!(process, ",\"Cmd\":[{}]", args.join(","));
    }
    // The layer goes in uncompressed, so its digest is also its diff ID.
    let config = format!(
        "{{\"architecture\":\"{ARCHITECTURE}\",\"os\":\"{OS}\",\"config\":{{{process}}},\
         \"rootfs\":{{\"type\":\"layers\",\"diff_ids\":[\"{}\"]}}}}",
        digest(&layer)
    );
    let manifest = format!(
        "{{\"schemaVersion\":2,\"mediaType\":\"{MANIFEST_MEDIA_TYPE}\",\"config\":{},\
         \"layers\":[{}]}}",
        descriptor(CONFIG_MEDIA_TYPE, config.as_bytes(), ""),
        descriptor(LAYER_MEDIA_TYPE, &layer, ""),
    );
    let entries: Vec<String> = PLATFORMS
        .iter()
        .map(|(os, architecture)| {
            let platform =
                format!(",\"platform\":{{\"architecture\":\"{architecture}\",\"os\":\"{os}\"}}");
            descriptor(MANIFEST_MEDIA_TYPE, manifest.as_bytes(), &platform)
        })
        .collect();
    let index = format!(
        "{{\"schemaVersion\":2,\"mediaType\":\"{INDEX_MEDIA_TYPE}\",\"manifests\":[{}]}}",
        entries.join(",")
    );

    let index_digest = digest(index.as_bytes());
    let manifest_digest = digest(manifest.as_bytes());
    let config_digest = digest(config.as_bytes());
    let blobs = [
        (LAYER_MEDIA_TYPE, layer),
        (CONFIG_MEDIA_TYPE, config.into_bytes()),
        (MANIFEST_MEDIA_TYPE, manifest.into_bytes()),
        (INDEX_MEDIA_TYPE, index.into_bytes()),
    ]
    .into_iter()
    .map(|(media_type, bytes)| (digest(&bytes), Blob { media_type, bytes }))
    .collect();
    Ok(Layout {
        reference: reference.to_owned(),
        tag: tag.to_owned(),
        index_digest,
        manifest_digest,
        config_digest,
        blobs,
    })
}

/// The archive [`write_image`] writes, built in memory from the
/// component's bytes: the blobs of [`image_layout`], and an `index.json`
/// naming the image index by the image's reference.
pub fn image_archive(
    component: &[u8],
    name: &str,
    reference: &str,
    args: &[String],
) -> Result<(Vec<u8>, ImageInfo), String> {
    let layout = image_layout(component, name, reference, args)?;
    let index = &layout.blobs[&layout.index_digest];
    let annotations = format!(
        ",\"annotations\":{{\"{CONTAINERD_NAME}\":{},\"{OCI_REF_NAME}\":{}}}",
        json::string(reference),
        json::string(&layout.tag)
    );
    let layout_index = format!(
        "{{\"schemaVersion\":2,\"mediaType\":\"{INDEX_MEDIA_TYPE}\",\"manifests\":[{}]}}",
        descriptor(INDEX_MEDIA_TYPE, &index.bytes, &annotations),
    );

    // Sorted by path, directories as entries of their own.
    let mut entries: BTreeMap<String, Option<&[u8]>> = BTreeMap::new();
    entries.insert("oci-layout".into(), Some(b"{\"imageLayoutVersion\":\"1.0.0\"}"));
    entries.insert("index.json".into(), Some(layout_index.as_bytes()));
    entries.insert("blobs/".into(), None);
    entries.insert("blobs/sha256/".into(), None);
    for blob in layout.blobs.values() {
        entries.insert(format!("blobs/sha256/{}", hex_sha256(&blob.bytes)), Some(&blob.bytes));
    }
    let mut archive = Tar::default();
    for (path, content) in entries {
        match content {
            Some(content) => archive.file(&path, content)?,
            None => archive.dir(&path)?,
        }
    }
    let archive = archive.finish();
    let info = ImageInfo {
        reference: reference.to_owned(),
        index_digest: layout.index_digest.clone(),
        manifest_digest: layout.manifest_digest.clone(),
        archive_size: archive.len() as u64,
    };
    Ok((archive, info))
}

/// The `ctr` command that imports the archive at `archive` into
/// containerd (and unpacks it into a snapshot, which `ctr run` needs).
pub fn import_command(archive: &Path) -> String {
    format!("ctr image import --platform {PLATFORM} {}", archive.display())
}

/// The `ctr` command that runs the imported image `reference` with pier's
/// shim, as container `id`.
pub fn run_command(reference: &str, id: &str) -> String {
    format!("ctr run --rm --platform {PLATFORM} --runtime {RUNTIME} {reference} {id}")
}

/// `<name>.wasm`, once `name` is known to make one plain file name that
/// fits a tar header.
fn component_file(name: &str) -> Result<String, String> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.chars().any(|c| c == '/' || c.is_control())
    {
        return Err(format!("{name:?} cannot name a file in the image"));
    }
    let file = format!("{name}.wasm");
    if file.len() > NAME_LEN {
        return Err(format!("{file:?} is longer than a tar entry's {NAME_LEN}-byte name"));
    }
    Ok(file)
}

/// The tag of `reference` (`latest` of `docker.io/pier/echo:latest`), or
/// the whole reference when it has none, after checking that it is one
/// name containerd can store and `ctr` can be given.
fn reference_tag(reference: &str) -> Result<&str, String> {
    if reference.is_empty() || reference.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{reference:?} is not an image reference"));
    }
    let last = reference.rsplit('/').next().unwrap_or(reference);
    let named = last.split('@').next().unwrap_or(last);
    match named.split_once(':') {
        Some((_, "")) => Err(format!("{reference:?} has an empty tag")),
        Some((_, tag)) => Ok(tag),
        None => Ok(reference),
    }
}

/// A descriptor of `blob` (media type, digest, size), with `extra` (more
/// fields, each after a comma) added.
fn descriptor(media_type: &str, blob: &[u8], extra: &str) -> String {
    format!(
        "{{\"mediaType\":\"{media_type}\",\"digest\":\"{}\",\"size\":{}{extra}}}",
        digest(blob),
        blob.len()
    )
}

/// `sha256:<hex>`: how OCI documents name a blob.
fn digest(blob: &[u8]) -> String {
    format!("sha256:{}", hex_sha256(blob))
}

fn hex_sha256(blob: &[u8]) -> String {
    Sha256::digest(blob).iter().fold(String::with_capacity(64), |mut hex, byte| {
        let _ = write!(hex, "{byte:02x}");
        hex
    })
}

/// A tar block: headers and contents come in whole blocks.
const BLOCK: usize = 512;
/// The longest path a ustar header holds without its prefix field, which
/// the image never needs (its longest path is a blob's, 77 bytes).
const NAME_LEN: usize = 100;

/// A ustar archive built in memory, holding only what an image needs:
/// regular files and directories with short paths. Nothing of the host
/// goes in: every entry is owned by root (0:0, no user or group names),
/// dated at the epoch, and has mode 0644 (files) or 0755 (directories).
#[derive(Debug, Default)]
struct Tar {
    bytes: Vec<u8>,
}

impl Tar {
    fn file(&mut self, path: &str, content: &[u8]) -> Result<(), String> {
        self.entry(path, b'0', 0o644, content)
    }

    /// `path` ends with `/`, as tar writes directories.
    fn dir(&mut self, path: &str) -> Result<(), String> {
        self.entry(path, b'5', 0o755, &[])
    }

    fn entry(&mut self, path: &str, kind: u8, mode: u64, content: &[u8]) -> Result<(), String> {
        if path.is_empty() || path.len() > NAME_LEN || path.contains('\0') {
            return Err(format!("{path:?} does not fit a tar header's name"));
        }
        let mut header = [0u8; BLOCK];
        header[..path.len()].copy_from_slice(path.as_bytes());
        octal(&mut header[100..108], mode)?;
        octal(&mut header[108..116], 0)?; // uid
        octal(&mut header[116..124], 0)?; // gid
        octal(&mut header[124..136], content.len() as u64)
            .map_err(|_| format!("{path}: {} bytes is too large for a tar entry", content.len()))?;
        octal(&mut header[136..148], 0)?; // mtime
        header[156] = kind;
        header[257..263].copy_from_slice(b"ustar\0");
        header[263..265].copy_from_slice(b"00");
        // The checksum is the byte sum of the header with its own field
        // read as spaces; it is written as six octal digits, NUL, space.
        header[148..156].fill(b' ');
        let sum: u64 = header.iter().map(|&b| u64::from(b)).sum();
        octal(&mut header[148..155], sum)?;
        self.bytes.extend_from_slice(&header);
        self.bytes.extend_from_slice(content);
        self.pad();
        Ok(())
    }

    /// The archive, closed by its two zero blocks.
    fn finish(mut self) -> Vec<u8> {
        self.bytes.resize(self.bytes.len() + 2 * BLOCK, 0);
        self.bytes
    }

    fn pad(&mut self) {
        let len = self.bytes.len().next_multiple_of(BLOCK);
        self.bytes.resize(len, 0);
    }
}

/// Writes `value` into a header field as zero-padded octal digits and a
/// NUL; an error if it needs more digits than the field has.
fn octal(field: &mut [u8], value: u64) -> Result<(), String> {
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    if text.len() > digits {
        return Err(format!("{value} does not fit a {digits}-digit tar field"));
    }
    field[..digits].copy_from_slice(text.as_bytes());
    field[digits] = 0;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::Value;

    /// One entry of a tar archive read back: path, type flag, content.
    type Entry = (String, u8, Vec<u8>);

    /// Reads a ustar archive the way a strict reader would, checking every
    /// header's checksum, magic, owner and time, the padding, and the two
    /// zero blocks at the end.
    fn read_tar(bytes: &[u8]) -> Vec<Entry> {
        assert_eq!(bytes.len() % BLOCK, 0, "the archive is whole blocks");
        let field = |h: &[u8], range: std::ops::Range<usize>| -> u64 {
            let text = std::str::from_utf8(&h[range]).unwrap();
            u64::from_str_radix(text.trim_end_matches(['\0', ' ']), 8).unwrap()
        };
        let mut entries = Vec::new();
        let mut at = 0;
        loop {
            let header = &bytes[at..at + BLOCK];
            if header.iter().all(|&b| b == 0) {
                assert_eq!(bytes.len() - at, 2 * BLOCK, "two zero blocks end the archive");
                assert!(bytes[at..].iter().all(|&b| b == 0));
                return entries;
            }
            let mut blank = header.to_vec();
            blank[148..156].fill(b' ');
            let sum: u64 = blank.iter().map(|&b| u64::from(b)).sum();
            assert_eq!(field(header, 148..156), sum, "header checksum at {at}");
            assert_eq!(&header[257..265], b"ustar\x0000");
            assert_eq!(field(header, 108..116), 0, "uid");
            assert_eq!(field(header, 116..124), 0, "gid");
            assert_eq!(field(header, 136..148), 0, "mtime");
            assert!(header[265..345].iter().all(|&b| b == 0), "no user or group names");
            let end = header[..NAME_LEN].iter().position(|&b| b == 0).unwrap_or(NAME_LEN);
            let path = String::from_utf8(header[..end].to_vec()).unwrap();
            let size = field(header, 124..136) as usize;
            let content = bytes[at + BLOCK..at + BLOCK + size].to_vec();
            let next = at + BLOCK + size.next_multiple_of(BLOCK);
            assert!(bytes[at + BLOCK + size..next].iter().all(|&b| b == 0), "zero padding");
            entries.push((path, header[156], content));
            at = next;
        }
    }

    fn blob<'a>(entries: &'a [Entry], digest: &str) -> &'a [u8] {
        let hex = digest.strip_prefix("sha256:").unwrap();
        let path = format!("blobs/sha256/{hex}");
        &entries.iter().find(|(p, _, _)| *p == path).unwrap_or_else(|| panic!("no {path}")).2
    }

    fn json(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    /// A component stand-in: a Wasm header and more than a block of bytes.
    fn component() -> Vec<u8> {
        let mut bytes = b"\0asm\x0d\0\x01\0".to_vec();
        bytes.extend((0..1000u32).map(|i| (i * 7) as u8));
        bytes
    }

    #[test]
    fn the_archive_is_an_oci_layout_of_the_component() {
        let component = component();
        let reference = "docker.io/pier/echo:latest";
        let (archive, info) = image_archive(&component, "echo", reference, &[]).unwrap();
        assert_eq!(info.archive_size, archive.len() as u64);
        let entries = read_tar(&archive);

        let paths: Vec<&str> = entries.iter().map(|(p, _, _)| p.as_str()).collect();
        let mut sorted = paths.clone();
        sorted.sort();
        assert_eq!(paths, sorted);
        assert_eq!(&paths[..2], ["blobs/", "blobs/sha256/"]);
        assert_eq!(&paths[6..], ["index.json", "oci-layout"]);
        for (path, kind, content) in &entries {
            match path.strip_prefix("blobs/sha256/").filter(|hex| !hex.is_empty()) {
                Some(hex) => assert_eq!(hex, hex_sha256(content), "{path} is named by its sha256"),
                None if path.ends_with('/') => assert_eq!(*kind, b'5'),
                None => assert_eq!(*kind, b'0'),
            }
        }
        let file = |name: &str| &entries.iter().find(|(p, _, _)| p == name).unwrap().2;
        assert_eq!(json(file("oci-layout"))["imageLayoutVersion"], "1.0.0");

        // The layout names the image index by the reference and its tag.
        let layout_index = json(file("index.json"));
        assert_eq!(layout_index["schemaVersion"], 2);
        assert_eq!(layout_index["mediaType"], INDEX_MEDIA_TYPE);
        let [image] = layout_index["manifests"].as_array().unwrap().as_slice() else {
            panic!("one image")
        };
        assert_eq!(image["mediaType"], INDEX_MEDIA_TYPE);
        assert_eq!(image["digest"], info.index_digest);
        assert!(image.get("platform").is_none(), "an index has no platform of its own");
        assert_eq!(image["annotations"][CONTAINERD_NAME], reference);
        assert_eq!(image["annotations"][OCI_REF_NAME], "latest");
        let index_bytes = blob(&entries, &info.index_digest);
        assert_eq!(image["size"], index_bytes.len());

        // The image index lists the one manifest under every platform.
        let index = json(index_bytes);
        assert_eq!(index["schemaVersion"], 2);
        assert_eq!(index["mediaType"], INDEX_MEDIA_TYPE);
        let listed = index["manifests"].as_array().unwrap();
        let platforms: Vec<(&str, &str)> = listed
            .iter()
            .map(|m| {
                let platform = &m["platform"];
                (platform["os"].as_str().unwrap(), platform["architecture"].as_str().unwrap())
            })
            .collect();
        assert_eq!(platforms, PLATFORMS);
        assert!(platforms.contains(&("linux", "amd64")), "the kubelet's platform on amd64");
        assert!(platforms.contains(&("wasi", "wasm")));
        assert!(platforms.contains(&(OS, ARCHITECTURE)));
        assert_eq!(PLATFORM, format!("{OS}/{ARCHITECTURE}"));
        for entry in listed {
            assert_eq!(entry["mediaType"], MANIFEST_MEDIA_TYPE);
            assert_eq!(entry["digest"], info.manifest_digest);
        }
        let manifest_bytes = blob(&entries, &info.manifest_digest);
        assert_eq!(listed[0]["size"], manifest_bytes.len());

        let manifest = json(manifest_bytes);
        assert_eq!(manifest["schemaVersion"], 2);
        assert_eq!(manifest["mediaType"], MANIFEST_MEDIA_TYPE);
        assert_eq!(manifest["config"]["mediaType"], CONFIG_MEDIA_TYPE);
        let config_bytes = blob(&entries, manifest["config"]["digest"].as_str().unwrap());
        assert_eq!(manifest["config"]["size"], config_bytes.len());
        let [layer] = manifest["layers"].as_array().unwrap().as_slice() else {
            panic!("one layer")
        };
        assert_eq!(layer["mediaType"], LAYER_MEDIA_TYPE);
        let layer_digest = layer["digest"].as_str().unwrap();
        let layer_bytes = blob(&entries, layer_digest);
        assert_eq!(layer["size"], layer_bytes.len());

        let config = json(config_bytes);
        assert_eq!(config["os"], OS);
        assert_eq!(config["architecture"], ARCHITECTURE);
        assert_eq!(config["config"]["Entrypoint"], serde_json::json!(["/echo.wasm"]));
        assert!(config["config"].get("Cmd").is_none(), "no arguments, no Cmd");
        assert_eq!(config["rootfs"]["type"], "layers");
        assert_eq!(config["rootfs"]["diff_ids"], serde_json::json!([layer_digest]));

        let files = read_tar(layer_bytes);
        assert_eq!(files, [("echo.wasm".to_owned(), b'0', component)]);
    }

    #[test]
    fn arguments_become_the_command() {
        let args = ["--port".to_owned(), "1234".to_owned(), "say \"hi\"\\\n".to_owned()];
        let (archive, info) = image_archive(&component(), "echo", "pier/echo:v1", &args).unwrap();
        let entries = read_tar(&archive);
        let index = json(&entries.iter().find(|(p, _, _)| p == "index.json").unwrap().2);
        assert_eq!(index["manifests"][0]["annotations"][OCI_REF_NAME], "v1");
        let manifest = json(blob(&entries, &info.manifest_digest));
        let config = json(blob(&entries, manifest["config"]["digest"].as_str().unwrap()));
        assert_eq!(config["config"]["Entrypoint"], serde_json::json!(["/echo.wasm"]));
        assert_eq!(config["config"]["Cmd"], serde_json::json!(args));
    }

    #[test]
    fn the_layout_holds_the_archives_blobs_with_their_media_types() {
        let reference = "127.0.0.1:5000/pier/echo:v2";
        let layout = image_layout(&component(), "echo", reference, &[]).unwrap();
        let (archive, info) = image_archive(&component(), "echo", reference, &[]).unwrap();
        assert_eq!((layout.tag.as_str(), layout.reference.as_str()), ("v2", reference));
        assert_eq!(layout.index_digest, info.index_digest);
        assert_eq!(layout.manifest_digest, info.manifest_digest);
        let entries = read_tar(&archive);
        let in_archive: Vec<&Entry> = entries
            .iter()
            .filter(|(p, kind, _)| p.starts_with("blobs/") && *kind == b'0')
            .collect();
        assert_eq!(in_archive.len(), layout.blobs.len());
        for (path, _, content) in in_archive {
            let digest = format!("sha256:{}", path.strip_prefix("blobs/sha256/").unwrap());
            assert_eq!(layout.blob(&digest).map(|b| &b.bytes), Some(content), "{path}");
        }
        let media_type = |digest: &str| layout.blob(digest).unwrap().media_type;
        assert_eq!(media_type(&layout.index_digest), INDEX_MEDIA_TYPE);
        assert_eq!(media_type(&layout.manifest_digest), MANIFEST_MEDIA_TYPE);
        assert_eq!(media_type(&layout.config_digest), CONFIG_MEDIA_TYPE);
        assert!(layout.blob("sha256:0000").is_none());
    }

    #[test]
    fn the_same_input_writes_the_same_bytes() {
        let dir = std::env::temp_dir().join(format!("pier-oci-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let wasm = dir.join("echo.wasm");
        std::fs::write(&wasm, component()).unwrap();
        let write = |out: &str| {
            let out = dir.join("nested").join(out);
            let info = write_image(&wasm, "echo", "docker.io/pier/echo:latest", &[], &out).unwrap();
            (std::fs::read(out).unwrap(), info)
        };
        let (first, first_info) = write("a.tar");
        let (second, second_info) = write("b.tar");
        assert!(first == second, "two writes differ");
        assert_eq!(first_info, second_info);
        std::fs::write(&wasm, b"\0asm\x0d\0\x01\0").unwrap();
        let (other, other_info) = write("c.tar");
        assert_ne!(first, other);
        assert_ne!(first_info.manifest_digest, other_info.manifest_digest);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_input_is_an_error() {
        let ok = "docker.io/pier/echo:latest";
        let long = "x".repeat(NAME_LEN - 4);
        for name in ["", ".", "..", "a/b", "a\nb", long.as_str()] {
            assert!(image_archive(b"", name, ok, &[]).is_err(), "name {name:?}");
        }
        assert!(image_archive(b"", &"x".repeat(NAME_LEN - 5), ok, &[]).is_ok());
        for reference in ["", "pier/echo latest", "pier/echo:\n", "pier/echo:"] {
            assert!(image_archive(b"", "echo", reference, &[]).is_err(), "{reference:?}");
        }
        let missing = std::env::temp_dir().join("pier-oci-test-no-such-dir/echo.wasm");
        let err = write_image(&missing, "echo", ok, &[], &missing.with_extension("tar"));
        assert!(err.unwrap_err().contains("no-such-dir"));
    }
}
