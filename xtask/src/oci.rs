//! A scratch OCI image holding one static binary, written as an `oci-archive` (a tar of
//! an OCI image layout) without a container engine: the image spec's documents from
//! `oci-spec`, the archives from `tar`. Every timestamp is zero and every owner root, so
//! the same binary always gives the same digests.

use std::collections::HashMap;
use std::str::FromStr as _;

use anyhow::Context as _;
use oci_spec::image::{
    Arch, ConfigBuilder, Descriptor, DescriptorBuilder, Digest, HistoryBuilder,
    ImageConfigurationBuilder, ImageIndexBuilder, ImageManifestBuilder, MediaType,
    OciLayoutBuilder, Os, PlatformBuilder, RootFsBuilder, Sha256Digest,
};
use sha2::{Digest as _, Sha256};

/// The epoch, as every timestamp of the image.
const EPOCH: &str = "1970-01-01T00:00:00Z";

/// A tar archive of `entries`: (path, mode, contents; `None` for a directory), owned by
/// root, dated the epoch, in the given order.
fn tar(entries: &[(&str, u32, Option<&[u8]>)]) -> anyhow::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, mode, bytes) in entries {
        let mut header = tar::Header::new_ustar();
        header.set_mode(*mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        match bytes {
            Some(bytes) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(bytes.len() as u64);
                builder.append_data(&mut header, path, *bytes)
            }
            None => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                builder.append_data(&mut header, path, std::io::empty())
            }
        }
        .with_context(|| format!("cannot add {path} to a tar archive"))?;
    }
    builder.into_inner().context("cannot finish a tar archive")
}

/// `document` as JSON with every object's keys sorted: oci-spec keeps annotations in a
/// `HashMap`, whose order changes from run to run (serde_json's own map is ordered).
fn canonical_json(document: &impl serde::Serialize) -> anyhow::Result<Vec<u8>> {
    Ok(serde_json::to_vec(&serde_json::to_value(document)?)?)
}

/// `bytes`' SHA-256 as 64 hexadecimal digits.
fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

fn digest(bytes: &[u8]) -> anyhow::Result<Digest> {
    Ok(Sha256Digest::from_str(&sha256_hex(bytes))?.into())
}

fn descriptor(media_type: MediaType, bytes: &[u8]) -> anyhow::Result<DescriptorBuilder> {
    Ok(DescriptorBuilder::default()
        .media_type(media_type)
        .digest(digest(bytes)?)
        .size(bytes.len() as u64))
}

/// One platform's image: its manifest's descriptor and the blobs it refers to.
struct PlatformImage {
    descriptor: Descriptor,
    blobs: Vec<Vec<u8>>,
}

/// A scratch image that runs `binary` as `/observer` on `architecture` (OCI's names:
/// `amd64`, `arm64`).
fn platform_image(binary: &[u8], architecture: &str) -> anyhow::Result<PlatformImage> {
    let layer = tar(&[("observer", 0o755, Some(binary))])?;
    let (arch, variant) = match architecture {
        "amd64" => (Arch::Amd64, None),
        "arm64" => (Arch::ARM64, Some("v8")),
        other => anyhow::bail!("no OCI platform for architecture {other}"),
    };
    let config = ImageConfigurationBuilder::default()
        .created(EPOCH)
        .architecture(arch.clone())
        .os(Os::Linux)
        .config(
            ConfigBuilder::default()
                .entrypoint(vec!["/observer".to_owned()])
                .working_dir("/")
                .build()?,
        )
        .rootfs(
            RootFsBuilder::default()
                .typ("layers")
                .diff_ids(vec![format!("sha256:{}", sha256_hex(&layer))])
                .build()?,
        )
        .history(vec![
            HistoryBuilder::default()
                .created(EPOCH)
                .created_by("cargo xtask dist")
                .build()?,
        ]);
    let config = match variant {
        Some(variant) => config.variant(variant),
        None => config,
    }
    .build()?
    .to_string()?
    .into_bytes();
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(descriptor(MediaType::ImageConfig, &config)?.build()?)
        .layers(vec![descriptor(MediaType::ImageLayer, &layer)?.build()?])
        .build()?
        .to_string()?
        .into_bytes();
    let platform = PlatformBuilder::default().architecture(arch).os(Os::Linux);
    let platform = match variant {
        Some(variant) => platform.variant(variant),
        None => platform,
    }
    .build()?;
    Ok(PlatformImage {
        descriptor: descriptor(MediaType::ImageManifest, &manifest)?
            .platform(platform)
            .build()?,
        blobs: vec![layer, config, manifest],
    })
}

/// An `oci-archive` holding one multi-platform image: `binaries` are (OCI architecture,
/// static binary). `reference` (e.g. `docker.io/library/observer:0.1.0`) is the name
/// containerd (`kind load image-archive`) gives it, its tag the layout's `ref.name`
/// (for skopeo and umoci).
pub fn image_archive(binaries: &[(&str, &[u8])], reference: &str) -> anyhow::Result<Vec<u8>> {
    let images = binaries
        .iter()
        .map(|(architecture, binary)| platform_image(binary, architecture))
        .collect::<anyhow::Result<Vec<PlatformImage>>>()?;
    let image_index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(
            images
                .iter()
                .map(|image| image.descriptor.clone())
                .collect::<Vec<_>>(),
        )
        .build()?
        .to_string()?
        .into_bytes();
    let tag = reference.rsplit_once(':').map_or("latest", |(_, tag)| tag);
    let layout_index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![
            descriptor(MediaType::ImageIndex, &image_index)?
                .annotations(HashMap::from([
                    ("io.containerd.image.name".to_owned(), reference.to_owned()),
                    (
                        "org.opencontainers.image.ref.name".to_owned(),
                        tag.to_owned(),
                    ),
                ]))
                .build()?,
        ])
        .build()?;
    let layout_index = canonical_json(&layout_index)?;
    let layout = serde_json::to_vec(
        &OciLayoutBuilder::default()
            .image_layout_version("1.0.0")
            .build()?,
    )?;
    let mut blobs: Vec<(String, &[u8])> = images
        .iter()
        .flat_map(|image| image.blobs.iter())
        .chain([&image_index])
        .map(|blob| {
            (
                format!("blobs/sha256/{}", sha256_hex(blob)),
                blob.as_slice(),
            )
        })
        .collect();
    blobs.sort();
    blobs.dedup();
    let mut entries: Vec<(&str, u32, Option<&[u8]>)> = vec![
        ("oci-layout", 0o644, Some(&layout)),
        ("index.json", 0o644, Some(&layout_index)),
        ("blobs/", 0o755, None),
        ("blobs/sha256/", 0o755, None),
    ];
    entries.extend(
        blobs
            .iter()
            .map(|(path, bytes)| (path.as_str(), 0o644, Some(*bytes))),
    );
    tar(&entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_entries_are_what_gnu_tar_reads() {
        let archive = tar(&[("observer", 0o755, Some(b"hello"))]).unwrap();
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
        let a = image_archive(&both, reference).unwrap();
        assert_eq!(a, image_archive(&both, reference).unwrap());
        assert_ne!(a, image_archive(&both[..1], reference).unwrap());
        assert_ne!(
            a,
            image_archive(&[("amd64", b"x86"), ("arm64", b"ARM")], reference).unwrap()
        );
    }

    /// The layout's documents are what the image spec says, read back by `oci-spec`.
    #[test]
    fn the_layout_names_a_two_platform_image() {
        let archive = image_archive(
            &[("amd64", b"x86"), ("arm64", b"arm")],
            "docker.io/library/observer:0.1.0",
        )
        .unwrap();
        let mut files = HashMap::new();
        for entry in tar::Archive::new(archive.as_slice()).entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
            files.insert(path, bytes);
        }
        let layout =
            oci_spec::image::ImageIndex::from_reader(files["index.json"].as_slice()).unwrap();
        let entry = &layout.manifests()[0];
        let annotations = entry.annotations().as_ref().unwrap();
        assert_eq!(annotations["org.opencontainers.image.ref.name"], "0.1.0");
        let blob = |digest: &Digest| &files[&format!("blobs/sha256/{}", digest.digest())];
        let index =
            oci_spec::image::ImageIndex::from_reader(blob(entry.digest()).as_slice()).unwrap();
        let platforms: Vec<String> = index
            .manifests()
            .iter()
            .map(|m| {
                let platform = m.platform().as_ref().unwrap();
                format!("{}/{:?}", platform.architecture(), platform.variant())
            })
            .collect();
        assert_eq!(platforms, ["amd64/None", "arm64/Some(\"v8\")"]);
    }
}
