//! The OCI image archive of `cargo xtask dist`, read as a runtime would: skopeo copies
//! one platform to an OCI layout and umoci unpacks that into a runtime bundle.

use std::path::Path;
use std::process::Command;

use super::command::run;
use super::empty_root::dist_dir;

/// `oci-archive:<dist>/observer-image.tar`, skopeo's name for the archive.
pub fn archive_source() -> String {
    format!(
        "oci-archive:{}",
        dist_dir().join("observer-image.tar").display()
    )
}

/// `skopeo --override-arch <arch> ARGS...`: the archive's image for one platform.
pub fn skopeo(arch: &str, args: &[&str]) -> Command {
    let mut command = Command::new("skopeo");
    command.args(["--override-arch", arch]).args(args);
    command
}

/// The image configuration (`Entrypoint`, `Env`, ...) of the `arch` (OCI's name) image.
pub fn image_config(arch: &str) -> serde_json::Value {
    let source = archive_source();
    let out = run(&mut skopeo(arch, &["inspect", "--config", &source]));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Unpacks the `arch` image into the runtime bundle `bundle` (its `rootfs/` and a
/// `config.json` of umoci's making).
pub fn unpack(arch: &str, bundle: &Path) {
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("layout");
    let destination = format!("oci:{}:observer", layout.display());
    run(&mut skopeo(
        arch,
        &["copy", "--quiet", &archive_source(), &destination],
    ));
    run(Command::new("umoci")
        .arg("unpack")
        .arg("--image")
        .arg(format!("{}:observer", layout.display()))
        .arg(bundle));
}
