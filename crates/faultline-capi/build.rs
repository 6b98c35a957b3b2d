//! Gives the shared library its SONAME, as cargo-c would
//! (`libfaultline.so.<major>`), so a plain `cargo build` produces a
//! library that `scripts/c-install.sh` can install next to a versioned
//! file name.
fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets the version");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libfaultline.so.{major}");
    println!("cargo:rerun-if-changed=build.rs");
}
