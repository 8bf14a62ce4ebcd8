//! A scratch OCI image holding one static binary, written as an `oci-archive` (a tar of
//! an OCI image layout) without a container engine. Every timestamp is zero, so the same
//! binary always gives the same digests.

use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::dist::hex;

/// One entry of a tar archive: a directory (no bytes) or a file.
struct Entry<'a> {
    path: &'a str,
    mode: u32,
    bytes: Option<&'a [u8]>,
}

/// A POSIX ustar archive. Paths are at most 99 bytes (all of ours are).
fn tar(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for entry in entries {
        let mut header = [0u8; 512];
        let mut put = |at: usize, field: &[u8]| header[at..at + field.len()].copy_from_slice(field);
        assert!(entry.path.len() < 100, "tar path too long: {}", entry.path);
        put(0, entry.path.as_bytes());
        put(100, format!("{:07o}\0", entry.mode).as_bytes());
        put(108, b"0000000\0");
        put(116, b"0000000\0");
        let size = entry.bytes.map_or(0, <[u8]>::len);
        put(124, format!("{size:011o}\0").as_bytes());
        put(136, b"00000000000\0");
        put(148, b"        ");
        put(156, if entry.bytes.is_some() { b"0" } else { b"5" });
        put(257, b"ustar\0");
        put(263, b"00");
        let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        out.extend_from_slice(&header);
        if let Some(bytes) = entry.bytes {
            out.extend_from_slice(bytes);
            out.resize(out.len().next_multiple_of(512), 0);
        }
    }
    out.resize(out.len() + 1024, 0);
    out
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

fn descriptor(media_type: &str, bytes: &[u8]) -> serde_json::Value {
    json!({ "mediaType": media_type, "digest": digest(bytes), "size": bytes.len() })
}

/// One platform's image: its manifest and the blobs it refers to.
struct PlatformImage {
    descriptor: serde_json::Value,
    blobs: Vec<Vec<u8>>,
}

/// A scratch image that runs `binary` as `/observer` on `architecture` (OCI's names).
fn platform_image(binary: &[u8], architecture: &str) -> PlatformImage {
    let layer = tar(&[Entry {
        path: "observer",
        mode: 0o755,
        bytes: Some(binary),
    }]);
    let mut platform = json!({ "architecture": architecture, "os": "linux" });
    if architecture == "arm64" {
        platform["variant"] = json!("v8");
    }
    let mut config = platform.clone();
    config["created"] = json!("1970-01-01T00:00:00Z");
    config["config"] = json!({ "Entrypoint": ["/observer"], "WorkingDir": "/" });
    config["rootfs"] = json!({ "type": "layers", "diff_ids": [digest(&layer)] });
    config["history"] =
        json!([{ "created": "1970-01-01T00:00:00Z", "created_by": "cargo xtask dist" }]);
    let config = config.to_string().into_bytes();
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar", &layer)],
    })
    .to_string()
    .into_bytes();
    let mut descriptor = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
    descriptor["platform"] = platform;
    PlatformImage {
        descriptor,
        blobs: vec![layer, config, manifest],
    }
}

/// An `oci-archive` holding one multi-platform image: `binaries` are (OCI architecture,
/// static binary). `reference` (e.g. `docker.io/library/observer:0.1.0`) is the name
/// containerd (`kind load image-archive`) gives it, its tag the layout's `ref.name`
/// (for skopeo and umoci).
pub fn image_archive(binaries: &[(&str, &[u8])], reference: &str) -> Vec<u8> {
    let images: Vec<PlatformImage> = binaries
        .iter()
        .map(|(architecture, binary)| platform_image(binary, architecture))
        .collect();
    let image_index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": images.iter().map(|image| image.descriptor.clone()).collect::<Vec<_>>(),
    })
    .to_string()
    .into_bytes();
    let tag = reference.rsplit_once(':').map_or("latest", |(_, tag)| tag);
    let mut entry = descriptor("application/vnd.oci.image.index.v1+json", &image_index);
    entry["annotations"] = json!({
        "io.containerd.image.name": reference,
        "org.opencontainers.image.ref.name": tag,
    });
    let layout_index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [entry],
    })
    .to_string()
    .into_bytes();
    let mut blobs: Vec<(String, &[u8])> = images
        .iter()
        .flat_map(|image| image.blobs.iter())
        .chain([&image_index])
        .map(|blob| {
            let path = format!("blobs/sha256/{}", hex(&Sha256::digest(blob)));
            (path, blob.as_slice())
        })
        .collect();
    blobs.sort();
    blobs.dedup();
    let mut entries = vec![
        Entry {
            path: "oci-layout",
            mode: 0o644,
            bytes: Some(br#"{"imageLayoutVersion":"1.0.0"}"#),
        },
        Entry {
            path: "index.json",
            mode: 0o644,
            bytes: Some(&layout_index),
        },
    ];
    for path in ["blobs/", "blobs/sha256/"] {
        entries.push(Entry {
            path,
            mode: 0o755,
            bytes: None,
        });
    }
    entries.extend(blobs.iter().map(|(path, bytes)| Entry {
        path,
        mode: 0o644,
        bytes: Some(bytes),
    }));
    tar(&entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_headers_are_what_gnu_tar_reads() {
        let archive = tar(&[Entry {
            path: "observer",
            mode: 0o755,
            bytes: Some(b"hello"),
        }]);
        assert_eq!(archive.len(), 512 + 512 + 1024);
        let dir = std::env::temp_dir().join(format!("xtask-tar-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.tar");
        std::fs::write(&path, &archive).unwrap();
        let out = std::process::Command::new("tar")
            .arg("-tvf")
            .arg(&path)
            .output()
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let listing = String::from_utf8(out.stdout).unwrap();
        assert!(listing.starts_with("-rwxr-xr-x 0/0"), "{listing}");
        assert!(
            listing.trim_end().ends_with(" 5 1970-01-01 00:00 observer"),
            "{listing}"
        );
    }

    #[test]
    fn the_same_binary_gives_the_same_archive() {
        let reference = "docker.io/library/observer:0.1.0";
        let both: [(&str, &[u8]); 2] = [("amd64", b"x86"), ("arm64", b"arm")];
        let a = image_archive(&both, reference);
        assert_eq!(a, image_archive(&both, reference));
        assert_ne!(a, image_archive(&both[..1], reference));
        assert_ne!(
            a,
            image_archive(&[("amd64", b"x86"), ("arm64", b"ARM")], reference)
        );
    }
}
