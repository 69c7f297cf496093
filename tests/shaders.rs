//! Every assembled WGSL kernel variant is validated by naga with only the capabilities it
//! declares, and translated to SPIR-V (Vulkan), HLSL (DX12: shader model 5.1 for FXC where
//! the variant needs neither f16 nor subgroups, 6.2 otherwise) and MSL 2.4 (Metal), so a
//! kernel that cannot run on one of them fails here, not on a user's machine. Each kernel's
//! Rust params struct has the WGSL struct's member names, offsets and size; the flag bits
//! agree; every shader file is used and no helper function is defined twice. llvmpipe's
//! build (parameters read from storage, `shaders::params_in_storage`) validates too.

use std::collections::{BTreeMap, BTreeSet};

use naga::valid::{Capabilities, ValidationFlags, Validator};
use wgmoe::backend::kernel::Kernel;
use wgmoe::backend::params::{flags, ParamsLayout, Step, StepUniform};
use wgmoe::backend::wgpu::shaders;

fn parse(k: Kernel) -> naga::Module {
    parse_build(k, false)
}

/// The normal build, or (`probe`) the memory-access probe build of a probed kernel.
fn parse_build(k: Kernel, probe: bool) -> naga::Module {
    let src = shaders::source_for(k, probe);
    naga::front::wgsl::parse_str(&src).unwrap_or_else(|e| panic!("{k}: {}", e.emit_to_string(&src)))
}

fn caps(k: Kernel) -> Capabilities {
    // unpack2x16float (f16 weights, scales) is core WGSL: every device has it.
    let mut c = Capabilities::SHADER_FLOAT16_IN_FLOAT32;
    if k.needs_subgroups() {
        c |= Capabilities::SUBGROUP;
    }
    if k.needs_f16() {
        c |= Capabilities::SHADER_FLOAT16;
    }
    c
}

fn validate(m: &naga::Module, c: Capabilities) -> Result<naga::valid::ModuleInfo, String> {
    Validator::new(ValidationFlags::all(), c)
        .validate(m)
        .map_err(|e| format!("{e:?}"))
}

#[test]
fn every_variant_validates_with_the_capabilities_it_declares() {
    let all = Kernel::all();
    assert!(all.len() >= 27, "{} kernels", all.len());
    for k in all {
        let m = parse(k);
        validate(&m, caps(k)).unwrap_or_else(|e| panic!("{k} does not validate: {e}"));
        let main = m
            .entry_points
            .iter()
            .find(|e| e.name == "main")
            .unwrap_or_else(|| panic!("{k}: no `main`"));
        assert_eq!(
            main.workgroup_size,
            [k.workgroup_size(), 1, 1],
            "{k}: Kernel::workgroup_size"
        );
        // The declaration is exact: without the capability the variant is invalid, so the
        // kernel plan can trust `needs_subgroups` / `needs_f16`.
        if k.needs_subgroups() {
            assert!(
                validate(&m, caps(k) - Capabilities::SUBGROUP).is_err(),
                "{k} validates without SUBGROUP"
            );
        }
        if k.needs_f16() {
            assert!(
                validate(&m, caps(k) - Capabilities::SHADER_FLOAT16).is_err(),
                "{k} validates without f16"
            );
        }
        // llvmpipe's build: parameters and step from storage (`params_in_storage`), and
        // both really moved (a kernel declaring them otherwise would keep leaking there).
        let src = shaders::params_in_storage(&shaders::source_for(k, false));
        assert!(
            !src.contains("var<uniform> p:") && !src.contains("var<uniform> step:"),
            "{k}: a uniform parameter binding is left in llvmpipe's build"
        );
        let ms = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("{k}, llvmpipe build: {}", e.emit_to_string(&src)));
        validate(&ms, caps(k))
            .unwrap_or_else(|e| panic!("{k}, llvmpipe build, does not validate: {e}"));
        // The probe build counts loads with subgroup operations.
        if k.probed() {
            let m = parse_build(k, true);
            validate(&m, caps(k) | Capabilities::SUBGROUP)
                .unwrap_or_else(|e| panic!("{k}, probe build, does not validate: {e}"));
            let src = shaders::source_for(k, false);
            let probe_calls =
                src.matches("probe(SITE_").count() + src.matches("probe_bytes(SITE_").count();
            assert!(probe_calls > 0, "{k} is probed but never calls the probe");
        }
    }
}

#[test]
fn every_variant_translates_to_spirv_hlsl_and_msl() {
    use naga::back::{hlsl, msl, spv};
    for k in Kernel::all() {
        let m = parse(k);
        let info = validate(&m, caps(k)).unwrap_or_else(|e| panic!("{k}: {e}"));
        let spv_opts = spv::Options {
            lang_version: (1, 3),
            ..Default::default()
        };
        spv::write_vec(&m, &info, &spv_opts, None).unwrap_or_else(|e| panic!("{k} -> SPIR-V: {e}"));
        // FXC (wgpu's DX12 fallback) compiles shader model 5.x: the portable variants must
        // translate for it; f16 and wave operations need DXC and shader model 6.2.
        let sm = if k.needs_f16() || k.needs_subgroups() {
            hlsl::ShaderModel::V6_2
        } else {
            hlsl::ShaderModel::V5_1
        };
        let hlsl_opts = hlsl::Options {
            shader_model: sm,
            ..Default::default()
        };
        let mut out = String::new();
        hlsl::Writer::new(&mut out, &hlsl_opts, &hlsl::PipelineOptions::default())
            .write(&m, &info, None)
            .unwrap_or_else(|e| panic!("{k} -> HLSL {sm:?}: {e}"));
        assert!(out.contains("main"), "{k}: HLSL without an entry point");
        let msl_opts = msl::Options {
            lang_version: (2, 4),
            ..Default::default()
        };
        msl::write_string(&m, &info, &msl_opts, &msl::PipelineOptions::default())
            .unwrap_or_else(|e| panic!("{k} -> MSL 2.4: {e}"));
    }
}

/// (name, offset) of every member of the struct type of global `var`, and its size.
fn members(m: &naga::Module, var: &str) -> (Vec<(String, usize)>, usize) {
    let g = m
        .global_variables
        .iter()
        .find(|(_, g)| g.name.as_deref() == Some(var))
        .unwrap_or_else(|| panic!("no global `{var}`"))
        .1;
    match &m.types[g.ty].inner {
        naga::TypeInner::Struct { members, span } => (
            members
                .iter()
                .map(|mb| (mb.name.clone().unwrap_or_default(), mb.offset as usize))
                .collect(),
            *span as usize,
        ),
        other => panic!("`{var}` is not a struct: {other:?}"),
    }
}

#[test]
fn params_structs_match_their_wgsl_twins() {
    for k in Kernel::all() {
        let m = parse(k);
        let (fields, size) = k.params_layout();
        let (wgsl, span) = members(&m, "p");
        let rust: Vec<(String, usize)> = fields.iter().map(|(n, o)| (n.to_string(), *o)).collect();
        assert_eq!(
            rust, wgsl,
            "{k}: Rust params (left) vs WGSL Params (right): names and offsets"
        );
        assert_eq!(size, span, "{k}: params size");
        let (step, step_size) = members(&m, "step");
        let mut want: Vec<(String, usize)> = Step::FIELDS
            .iter()
            .map(|(n, o)| (n.to_string(), *o))
            .collect();
        want.push(("tok".into(), std::mem::offset_of!(StepUniform, tok)));
        assert_eq!(step, want, "{k}: Step members");
        assert_eq!(
            step_size,
            std::mem::size_of::<StepUniform>(),
            "{k}: Step size"
        );
    }
}

#[test]
fn flag_bits_agree_with_the_wgsl_constants() {
    let m = parse(Kernel::Embed);
    let mut wgsl = BTreeMap::new();
    for (_, c) in m.constants.iter() {
        let Some(name) = &c.name else { continue };
        if let naga::Expression::Literal(naga::Literal::U32(v)) = m.global_expressions[c.init] {
            wgsl.insert(name.clone(), v);
        }
    }
    let flags_file = shaders::PIECES
        .iter()
        .find(|(n, _)| *n == "flags.wgsl")
        .unwrap()
        .1;
    let declared: BTreeSet<String> = flags_file
        .lines()
        .filter_map(|l| l.strip_prefix("const "))
        .filter_map(|l| l.split(':').next())
        .map(|s| s.trim().to_string())
        .collect();
    let rust: BTreeMap<String, u32> = flags::ALL
        .iter()
        .map(|(n, v)| (n.to_string(), *v))
        .collect();
    assert_eq!(
        declared,
        rust.keys().cloned().collect::<BTreeSet<_>>(),
        "flags.wgsl vs params::flags::ALL"
    );
    for (name, v) in &rust {
        assert_eq!(wgsl.get(name), Some(v), "flag {name}");
    }
}

fn wgsl_files(dir: &std::path::Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".wgsl"))
                .map(String::from)
        })
        .collect()
}

#[test]
fn every_shader_file_is_used_and_every_helper_defined_once() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let bodies: BTreeSet<String> = shaders::BODIES.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(
        wgsl_files(&root),
        bodies,
        "shaders/*.wgsl vs the kernel bodies"
    );
    let pieces: BTreeSet<String> = shaders::PIECES
        .iter()
        .map(|(n, _)| n.trim_end_matches(".wgsl").to_string())
        .collect();
    assert_eq!(
        wgsl_files(&root.join("common")),
        pieces,
        "shaders/common/*.wgsl vs the pieces"
    );
    let kernels = Kernel::all();
    let used_bodies: BTreeSet<String> = kernels.iter().map(|k| k.family().to_string()).collect();
    assert_eq!(used_bodies, bodies, "every body is some kernel's");
    let used_pieces: BTreeSet<String> = kernels
        .iter()
        .flat_map(|&k| {
            shaders::pieces_for(k, false)
                .into_iter()
                .chain(shaders::pieces_for(k, true))
        })
        .map(|p| p.trim_end_matches(".wgsl").to_string())
        .collect();
    assert_eq!(used_pieces, pieces, "every piece is used by some kernel");
    // One definition per helper: shared code lives in one piece, never in copies. Only
    // alternative pieces (never assembled together, e.g. lanes_1 / lanes_8) define the
    // same function, as the interface of the axis they implement.
    let mut defs: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (file, src) in shaders::BODIES.iter().chain(shaders::PIECES.iter()) {
        for line in src.lines() {
            let Some(rest) = line.strip_prefix("fn ") else {
                continue;
            };
            let name = rest.split('(').next().unwrap_or("").trim().to_string();
            if name != "main" {
                defs.entry(name).or_default().push(file);
            }
        }
    }
    for (name, files) in defs.iter().filter(|(_, f)| f.len() > 1) {
        for f in files {
            assert!(
                f.ends_with(".wgsl"),
                "fn {name} is defined in kernel body {f} and in {files:?}"
            );
        }
        for &k in &kernels {
            let p = shaders::pieces(k);
            let n = files.iter().filter(|f| p.contains(f)).count();
            assert!(
                n <= 1,
                "{k} assembles {n} definitions of fn {name} from {files:?}"
            );
        }
    }
}

/// The probe's load sites: the Rust twins (`backend::probe::Site`) have the WGSL values.
#[test]
fn probe_sites_agree_with_the_wgsl_constants() {
    let src = shaders::PIECES
        .iter()
        .find(|(n, _)| *n == "probe_sites.wgsl")
        .expect("probe_sites.wgsl")
        .1;
    for site in wgmoe::backend::probe::Site::ALL {
        let want = format!("const {}: u32 = {}u;", site.wgsl_name(), site as u32);
        assert!(src.contains(&want), "probe_sites.wgsl lacks `{want}`");
    }
    assert_eq!(
        src.matches("const SITE_").count(),
        wgmoe::backend::probe::SITES
    );
}
