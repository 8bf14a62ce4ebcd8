//! Validates `observer check -o junit` against the JUnit schema (Jenkins' xUnit plugin's
//! `junit-10.xsd`, `data/junit/`) with xmlschema from PyPI, in the virtual environment
//! `cargo xtask setup` makes.

use std::path::Path;
use std::process::Command;

const SCHEMA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/junit/junit-10.xsd");

/// `Ok`, or xmlschema's complaint; `dir` takes the document as a file.
pub fn validate_junit(xml: &str, dir: &Path) -> Result<(), String> {
    let path = dir.join("report.xml");
    std::fs::write(&path, xml).unwrap();
    let home = std::env::var("HOME").expect("HOME");
    let out = Command::new(Path::new(&home).join(".local/share/observer-venv/bin/python"))
        .args([
            "-c",
            "import sys, xmlschema; xmlschema.XMLSchema(sys.argv[1]).validate(sys.argv[2])",
            SCHEMA,
        ])
        .arg(&path)
        .output()
        .expect("python from the venv `cargo xtask setup` makes");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}
