//! Safetensors checkpoints (single, sharded, hub and fused expert layouts) and dtype
//! conversion; every bad file fails with an error naming the file or tensor. No GPU needed.

mod common;

use std::fs;

use half::f16;
use safetensors::Dtype;
use tempfile::TempDir;

use common::st::*;
use wgmoe::format::checkpoint::{Checkpoint, DType, ExpertLayout, ExpertProj};

// Checkpoints

#[test]
fn single_file_checkpoint() {
    let dir = TempDir::new().unwrap();
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            t_f32("a", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            t_bf16("b", &[4], &[0.5, -1.0, 2.0, 1024.0]),
            t_f16_bits("c", &[0x3C00, 0xC000]),
        ],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ck.dir(), dir.path());
    assert_eq!(ck.names().collect::<Vec<_>>(), vec!["a", "b", "c"]);
    assert!(ck.contains("a") && !ck.contains("z"));
    let info = ck.info("b").unwrap();
    assert_eq!((info.dtype, info.shape.clone()), (DType::BF16, vec![4]));
    assert_eq!(info.file, dir.path().join("model.safetensors"));
    assert_eq!(
        ck.read_f32("a", &[2, 3]).unwrap(),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    assert_eq!(
        ck.read_f32("b", &[4]).unwrap(),
        vec![0.5, -1.0, 2.0, 1024.0]
    );
    assert_eq!(ck.read_f32("c", &[2]).unwrap(), vec![1.0, -2.0]);
    assert_eq!(ck.read_f16("a", &[2, 3]).unwrap()[5], f16::from_f32(6.0));
    assert_eq!(
        ck.read_rows_f32("a", &[2, 3], 1, 1).unwrap(),
        vec![4.0, 5.0, 6.0]
    );
}

#[test]
fn sharded_checkpoint() {
    let dir = TempDir::new().unwrap();
    write_sharded(
        dir.path(),
        &[
            (
                "model-00001-of-00002.safetensors",
                vec![
                    t_f32("x.weight", &[2], &[1.0, 2.0]),
                    t_bf16("y.weight", &[1], &[3.0]),
                ],
            ),
            (
                "model-00002-of-00002.safetensors",
                vec![t_f32("z.weight", &[2, 2], &[4.0, 5.0, 6.0, 7.0])],
            ),
        ],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(
        ck.names().collect::<Vec<_>>(),
        vec!["x.weight", "y.weight", "z.weight"]
    );
    assert_eq!(
        ck.info("z.weight").unwrap().file,
        dir.path().join("model-00002-of-00002.safetensors")
    );
    assert_eq!(
        ck.info("y.weight").unwrap().file,
        dir.path().join("model-00001-of-00002.safetensors")
    );
    assert_eq!(ck.read_f32("x.weight", &[2]).unwrap(), vec![1.0, 2.0]);
    assert_eq!(ck.read_f32("y.weight", &[1]).unwrap(), vec![3.0]);
    assert_eq!(
        ck.read_f32("z.weight", &[2, 2]).unwrap(),
        vec![4.0, 5.0, 6.0, 7.0]
    );
    assert_eq!(ck.files().count(), 2);
}

#[test]
fn dtype_conversions_known_values() {
    let dir = TempDir::new().unwrap();
    // bf16 bit patterns and the f16 bit patterns they must become (round to nearest even).
    let cases: [(u16, u16); 8] = [
        (0x3F80, 0x3C00), // 1.0
        (0xC000, 0xC000), // -2.0
        (0x4049, 0x4248), // 3.140625 (exact in f16)
        (0x0000, 0x0000), // +0
        (0x8000, 0x8000), // -0
        (0x477F, 0x7BF8), // 65280, the largest bf16 below f16's max 65504
        (0x3380, 0x0001), // 2^-24 → smallest f16 subnormal
        (0x33C0, 0x0002), // 1.5 * 2^-24 → tie, rounds to even (2 * 2^-24)
    ];
    let mut bf: Vec<u16> = cases.iter().map(|c| c.0).collect();
    bf.push(0x3300); // 2^-25 → tie between 0 and 2^-24, rounds to even (0)
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            t_bf16_bits("bf", &bf),
            t_f32("f32", &[3], &[0.1, 65504.0, -1.0e-3]),
            t_f16_bits("f16", &[0x3555, 0x7BFF, 0x0001, 0x8001]),
            // 65536 (beyond f16), then 999424 (the issue's norm weight).
            t_bf16_bits("big", &[0x3F80, 0x4780, 0x4974]),
            t_f32("big32", &[2], &[1.0, 1.0e6]),
            t_f16_bits("inf16", &[0x3C00, 0x3C00, 0xFC00]),
            t_bf16_bits("nan", &[0x3F80, 0x7FC0]),
            t_f32("rows", &[3, 2], &[1.0, 1.0, 1.0, 1.0, 1.0, f32::INFINITY]),
        ],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    let got: Vec<u16> = ck
        .read_f16("bf", &[bf.len()])
        .unwrap()
        .iter()
        .map(|h| h.to_bits())
        .collect();
    let mut want: Vec<u16> = cases.iter().map(|c| c.1).collect();
    want.push(0x0000);
    assert_eq!(got, want);
    // bf16 → f32 is exact (the bits are the top half of the f32).
    let f = ck.read_f32("bf", &[bf.len()]).unwrap();
    assert_eq!(&f[..3], &[1.0, -2.0, 3.140625]);
    assert_eq!(f[5], 65280.0);
    assert_eq!(f[6], 2f32.powi(-24));
    // f32 → f16.
    let h: Vec<u16> = ck
        .read_f16("f32", &[3])
        .unwrap()
        .iter()
        .map(|h| h.to_bits())
        .collect();
    assert_eq!(h, vec![0x2E66, 0x7BFF, f16::from_f32(-1.0e-3).to_bits()]);
    // f16 → f32 is exact; f16 → f16 is a copy.
    let f = ck.read_f32("f16", &[4]).unwrap();
    assert_eq!(
        f,
        vec![1365.0 / 4096.0, 65504.0, 2f32.powi(-24), -(2f32.powi(-24))]
    );
    let h: Vec<u16> = ck
        .read_f16("f16", &[4])
        .unwrap()
        .iter()
        .map(|h| h.to_bits())
        .collect();
    assert_eq!(h, vec![0x3555, 0x7BFF, 0x0001, 0x8001]);
    // Values beyond the f16 range are refused as f16 (never a silent inf), naming the
    // tensor, the first bad element and its value; as f32 they are exact.
    let e = err_string(ck.read_f16("big", &[3]));
    for part in ["`big`", "element 1 ", "65536", "f16 range"] {
        assert!(e.contains(part), "{e}");
    }
    assert_eq!(ck.read_f32("big", &[3]).unwrap()[2], 999424.0);
    let e = err_string(ck.read_f16("big32", &[2]));
    assert!(e.contains("element 1 ") && e.contains("1000000"), "{e}");
    // Non-finite values are refused by every read, rows included (the index is the flat
    // index in the tensor).
    for e in [
        err_string(ck.read_f16("inf16", &[3])),
        err_string(ck.read_f32("inf16", &[3])),
        err_string(ck.read_rows_f16("inf16", &[3], 0, 1)),
    ] {
        assert!(
            e.contains("`inf16`") && e.contains("element 2 ") && e.contains("-inf"),
            "{e}"
        );
    }
    for e in [
        err_string(ck.read_rows_f32("rows", &[3, 2], 2, 1)),
        err_string(ck.read_rows_f16("rows", &[3, 2], 1, 2)),
    ] {
        assert!(e.contains("element 5 ") && e.contains("inf"), "{e}");
    }
    assert_eq!(
        ck.read_rows_f32("rows", &[3, 2], 1, 1).unwrap(),
        vec![1.0, 1.0]
    );
    let e = err_string(ck.read_f32("nan", &[2]));
    assert!(e.contains("element 1 ") && e.contains("NaN"), "{e}");
}

#[test]
fn read_rows_of_3d_tensor() {
    let dir = TempDir::new().unwrap();
    let vals: Vec<f32> = (0..24).map(|v| v as f32).collect();
    write_st(
        &dir.path().join("model.safetensors"),
        &[t_bf16("t", &[2, 3, 4], &vals)],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    // 2-D view [6, 4]: rows 2..5.
    assert_eq!(
        ck.read_rows_f32("t", &[2, 3, 4], 2, 3).unwrap(),
        (8..20).map(|v| v as f32).collect::<Vec<_>>()
    );
    assert_eq!(
        ck.read_rows_f16("t", &[2, 3, 4], 5, 1).unwrap(),
        (20..24)
            .map(|v| f16::from_f32(v as f32))
            .collect::<Vec<_>>()
    );
    assert!(ck.read_rows_f32("t", &[2, 3, 4], 5, 0).unwrap().is_empty());
    assert_mentions(
        &err_string(ck.read_rows_f32("t", &[2, 3, 4], 4, 3)),
        &["`t`", "out of range"],
    );
    assert_mentions(
        &err_string(ck.read_rows_f32("t", &[6, 4], 0, 1)),
        &["`t`", "[6, 4]", "[2, 3, 4]"],
    );
}

/// Writes the same experts in hub (per-expert) and fused layouts, and checks both read back
/// identically and equal to the source matrices.
#[test]
fn hub_and_fused_expert_layouts_agree() {
    let (layers, e_n, h, i) = (2usize, 3usize, 5usize, 4usize);
    // want[l][e] = (gate [I,H], up [I,H], down [H,I])
    let want: Vec<Vec<[Vec<f32>; 3]>> = (0..layers)
        .map(|l| {
            (0..e_n)
                .map(|e| {
                    let s = (l * 10 + e) as u32 * 3;
                    [
                        pattern(i * h, s),
                        pattern(i * h, s + 1),
                        pattern(h * i, s + 2),
                    ]
                })
                .collect()
        })
        .collect();

    let hub = TempDir::new().unwrap();
    let mut hub_t = Vec::new();
    for (l, experts) in want.iter().enumerate() {
        for (e, [g, u, d]) in experts.iter().enumerate() {
            let p = format!("model.layers.{l}.mlp.experts.{e}");
            hub_t.push(t_bf16(&format!("{p}.gate_proj.weight"), &[i, h], g));
            hub_t.push(t_bf16(&format!("{p}.up_proj.weight"), &[i, h], u));
            hub_t.push(t_bf16(&format!("{p}.down_proj.weight"), &[h, i], d));
        }
    }
    write_st(&hub.path().join("model.safetensors"), &hub_t);

    let fused = TempDir::new().unwrap();
    let mut fused_t = Vec::new();
    for (l, experts) in want.iter().enumerate() {
        // [E, 2I, H]: per expert, gate rows then up rows. [E, H, I] for down.
        let gate_up: Vec<f32> = experts
            .iter()
            .flat_map(|[g, u, _]| g.iter().chain(u.iter()).copied())
            .collect();
        let down: Vec<f32> = experts
            .iter()
            .flat_map(|[_, _, d]| d.iter().copied())
            .collect();
        fused_t.push(t_f32(
            &format!("model.layers.{l}.mlp.experts.gate_up_proj"),
            &[e_n, 2 * i, h],
            &gate_up,
        ));
        fused_t.push(t_f32(
            &format!("model.layers.{l}.mlp.experts.down_proj"),
            &[e_n, h, i],
            &down,
        ));
    }
    write_st(&fused.path().join("model.safetensors"), &fused_t);

    let ck_hub = Checkpoint::open(hub.path()).unwrap();
    let ck_fused = Checkpoint::open(fused.path()).unwrap();
    for (l, experts) in want.iter().enumerate() {
        assert_eq!(ck_hub.expert_layout(l).unwrap(), ExpertLayout::PerExpert);
        assert_eq!(ck_fused.expert_layout(l).unwrap(), ExpertLayout::Fused);
        for (e, mats) in experts.iter().enumerate() {
            for (k, proj) in [ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down]
                .into_iter()
                .enumerate()
            {
                let a = ck_hub.read_expert_f32(l, e, proj, e_n, h, i).unwrap();
                let b = ck_fused.read_expert_f32(l, e, proj, e_n, h, i).unwrap();
                assert_eq!(a, mats[k], "hub layer {l} expert {e} {proj:?}");
                assert_eq!(b, mats[k], "fused layer {l} expert {e} {proj:?}");
                let a16 = ck_hub.read_expert_f16(l, e, proj, e_n, h, i).unwrap();
                let b16 = ck_fused.read_expert_f16(l, e, proj, e_n, h, i).unwrap();
                assert_eq!(a16, b16);
            }
        }
    }
    // Wrong dimensions name the tensor and both shapes; out-of-range experts and layers fail.
    assert_mentions(
        &err_string(ck_hub.read_expert_f32(0, 0, ExpertProj::Down, e_n, h, i + 1)),
        &[
            "model.layers.0.mlp.experts.0.down_proj.weight",
            "[5, 5]",
            "[5, 4]",
        ],
    );
    assert_mentions(
        &err_string(ck_fused.read_expert_f32(1, 0, ExpertProj::Gate, e_n + 1, h, i)),
        &[
            "model.layers.1.mlp.experts.gate_up_proj",
            "[4, 8, 5]",
            "[3, 8, 5]",
        ],
    );
    assert_mentions(
        &err_string(ck_fused.read_expert_f32(0, 3, ExpertProj::Up, e_n, h, i)),
        &["expert 3"],
    );
    assert_mentions(
        &err_string(ck_hub.expert_layout(2)),
        &["model.layers.2.mlp.experts"],
    );
}

#[test]
fn missing_checkpoint_files() {
    let dir = TempDir::new().unwrap();
    assert_mentions(
        &err_string(Checkpoint::open(dir.path())),
        &["model.safetensors"],
    );
}

#[test]
fn truncated_safetensors() {
    let dir = TempDir::new().unwrap();
    let bytes = serialize(&[t_f32("w", &[16], &[1.0; 16])]);
    let path = dir.path().join("model.safetensors");
    // Cut inside the data, inside the header, and inside the 8-byte length prefix.
    for keep in [bytes.len() - 4, 20, 3, 0] {
        fs::write(&path, &bytes[..keep]).unwrap();
        assert_mentions(
            &err_string(Checkpoint::open(dir.path())),
            &["model.safetensors"],
        );
    }
}

#[test]
fn corrupt_header() {
    let dir = TempDir::new().unwrap();
    let mut bytes = serialize(&[t_f32("w", &[4], &[1.0; 4])]);
    let path = dir.path().join("model.safetensors");
    // Garbage length prefix.
    bytes[..8].copy_from_slice(b"\xde\xad\xbe\xef\xde\xad\xbe\xef");
    fs::write(&path, &bytes).unwrap();
    assert_mentions(
        &err_string(Checkpoint::open(dir.path())),
        &["model.safetensors", "header"],
    );
    // Valid length, garbage JSON.
    let mut bytes = serialize(&[t_f32("w", &[4], &[1.0; 4])]);
    bytes[8] = b'#';
    fs::write(&path, &bytes).unwrap();
    assert_mentions(
        &err_string(Checkpoint::open(dir.path())),
        &["model.safetensors", "header"],
    );
}

#[test]
fn index_naming_missing_shard() {
    let dir = TempDir::new().unwrap();
    write_sharded(
        dir.path(),
        &[(
            "model-00001-of-00002.safetensors",
            vec![t_f32("a", &[1], &[1.0])],
        )],
    );
    let index = serde_json::json!({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}});
    fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    assert_mentions(
        &err_string(Checkpoint::open(dir.path())),
        &["model-00002-of-00002.safetensors", "`b`"],
    );
}

#[test]
fn index_naming_tensor_absent_from_shard() {
    let dir = TempDir::new().unwrap();
    write_sharded(
        dir.path(),
        &[(
            "model-00001-of-00001.safetensors",
            vec![t_f32("a", &[1], &[1.0])],
        )],
    );
    let index = serde_json::json!({"weight_map": {"a": "model-00001-of-00001.safetensors", "ghost": "model-00001-of-00001.safetensors"}});
    fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    assert_mentions(
        &err_string(Checkpoint::open(dir.path())),
        &["ghost", "model-00001-of-00001.safetensors"],
    );
}

#[test]
fn bad_index_files() {
    let dir = TempDir::new().unwrap();
    fs::write(dir.path().join("model.safetensors.index.json"), "{not json").unwrap();
    assert_mentions(
        &err_string(Checkpoint::open(dir.path())),
        &["model.safetensors.index.json"],
    );
    fs::write(
        dir.path().join("model.safetensors.index.json"),
        r#"{"metadata": {}}"#,
    )
    .unwrap();
    assert_mentions(
        &err_string(Checkpoint::open(dir.path())),
        &["model.safetensors.index.json", "weight_map"],
    );
    fs::write(
        dir.path().join("model.safetensors.index.json"),
        r#"{"weight_map": {"a": "../escape.safetensors"}}"#,
    )
    .unwrap();
    assert_mentions(
        &err_string(Checkpoint::open(dir.path())),
        &["model.safetensors.index.json", "weight_map.a"],
    );
}

#[test]
fn missing_tensor_wrong_shape_unsupported_dtype() {
    let dir = TempDir::new().unwrap();
    let ints: Vec<u8> = [1i32, 2, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            t_f32("w", &[2, 2], &[1.0; 4]),
            T {
                name: "ids".into(),
                dtype: Dtype::I32,
                shape: vec![3],
                bytes: ints,
            },
        ],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    let msg = err_string(ck.read_f32("nope.weight", &[1]));
    assert_mentions(&msg, &["nope.weight", "not found"]);
    assert_mentions(&err_string(ck.info("nope.weight")), &["nope.weight"]);
    let msg = err_string(ck.read_f16("w", &[4, 1]));
    assert_mentions(&msg, &["`w`", "model.safetensors", "[4, 1]", "[2, 2]"]);
    assert!(ck.contains("ids"));
    for msg in [
        err_string(ck.read_f32("ids", &[3])),
        err_string(ck.read_f16("ids", &[3])),
        err_string(ck.info("ids")),
    ] {
        assert_mentions(&msg, &["`ids`", "model.safetensors", "I32"]);
    }
}

#[test]
fn expert_layout_both_is_error() {
    let dir = TempDir::new().unwrap();
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            t_f32(
                "model.layers.0.mlp.experts.0.gate_proj.weight",
                &[1],
                &[0.0],
            ),
            t_f32("model.layers.0.mlp.experts.gate_up_proj", &[1], &[0.0]),
        ],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_mentions(
        &err_string(ck.expert_layout(0)),
        &["layer 0", "gate_up_proj"],
    );
}

// ---------------------------------------------------------------------------------------------
