//! The client of `xfn start`'s protocol, generated from xfn's own
//! `proto/v1alpha1.proto`: the kit speaks to the daemon from the wire
//! contract, as Crossplane does, and never links xfn's library (which would
//! make xfn's unit tests, whose dev-dependency this crate is, build xfn twice
//! and see two copies of its types).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "../proto/v1alpha1.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    let descriptors = protox::compile([PROTO], ["../proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(descriptors)?;
    Ok(())
}
