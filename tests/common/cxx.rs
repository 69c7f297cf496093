//! The C++ compiler the CUDA emulation tests build with (`CXX`, default g++). Without one
//! they print "not run"; with `WGMOE_REQUIRE_CXX=1` (CI sets it) a missing compiler fails
//! instead, so CI never passes them without running them.

pub fn compiler() -> Option<String> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    if std::process::Command::new(&cxx)
        .arg("--version")
        .output()
        .is_ok()
    {
        return Some(cxx);
    }
    assert!(
        std::env::var_os("WGMOE_REQUIRE_CXX").is_none(),
        "WGMOE_REQUIRE_CXX is set and no C++ compiler `{cxx}` runs"
    );
    println!("not run: no C++ compiler `{cxx}` (set CXX)");
    None
}
