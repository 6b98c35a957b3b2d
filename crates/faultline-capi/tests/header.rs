//! The checked-in header is what cbindgen generates from the crate now.
//! On a mismatch the test writes the new header (review it with `git diff`)
//! and fails.

use std::path::Path;

#[test]
fn checked_in_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let path = dir.join("include/faultline/faultline.h");
    let current = std::fs::read(&path).unwrap_or_default();
    if current != generated {
        std::fs::write(&path, &generated).expect("write the header");
        panic!(
            "{} was stale and has been regenerated; review and commit it",
            path.display()
        );
    }
}
