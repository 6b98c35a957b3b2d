//! Gives the shared library its SONAME (`libumap.so.<major>`), so
//! `scripts/c-install.sh` can install it next to a versioned file name.
fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets the version");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libumap.so.{major}");
    println!("cargo:rerun-if-changed=build.rs");
}
