//! Every WGSL file is parsed and validated by naga (so a broken shader fails CI, not a
//! user), every file is a known kernel, and each kernel's Rust `Params` struct has the
//! size naga computes for the WGSL `Params` struct.

use std::collections::BTreeSet;

use wgmoe::gpu::kernels::{Kernel, Step};

fn module(k: Kernel) -> naga::Module {
    naga::front::wgsl::parse_str(k.source())
        .unwrap_or_else(|e| panic!("{}.wgsl: {}", k.name(), e.emit_to_string(k.source())))
}

#[test]
fn every_shader_validates() {
    for k in Kernel::ALL {
        let m = module(k);
        let mut v = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        );
        v.validate(&m)
            .unwrap_or_else(|e| panic!("{}.wgsl does not validate: {e:?}", k.name()));
        assert!(
            m.entry_points.iter().any(|e| e.name == "main"),
            "{}.wgsl has no `main` entry point",
            k.name()
        );
    }
}

#[test]
fn every_shader_file_is_a_kernel() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let files: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".wgsl"))
                .map(String::from)
        })
        .collect();
    let kernels: BTreeSet<String> = Kernel::ALL.iter().map(|k| k.name().to_string()).collect();
    assert_eq!(
        files, kernels,
        "shaders/ and Kernel::ALL must list the same kernels"
    );
}

fn struct_size(m: &naga::Module, var: &str) -> u32 {
    let g = m
        .global_variables
        .iter()
        .find(|(_, g)| g.name.as_deref() == Some(var))
        .unwrap_or_else(|| panic!("no global `{var}`"))
        .1;
    match &m.types[g.ty].inner {
        naga::TypeInner::Struct { span, .. } => *span,
        other => panic!("`{var}` is not a struct: {other:?}"),
    }
}

#[test]
fn params_structs_match_wgsl_layout() {
    for k in Kernel::ALL {
        let m = module(k);
        assert_eq!(
            struct_size(&m, "p") as usize,
            k.params_size(),
            "{}: WGSL Params vs Rust params size",
            k.name()
        );
        assert_eq!(
            struct_size(&m, "step") as usize,
            std::mem::size_of::<Step>(),
            "{}: Step size",
            k.name()
        );
    }
}
