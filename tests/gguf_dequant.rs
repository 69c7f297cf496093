//! wgmoe's CPU dequantisers against the `gguf` Python package's, on the random blocks of
//! models/gguf/dequant.gguf (written by tools/make_gguf_fixtures.py with gguf 0.19.0).

use std::path::Path;

use wgmoe::gguf::{GgmlType, GgufModel};

#[test]
fn every_supported_type_dequantises_as_gguf_py_does() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gguf/dequant.gguf");
    let m = GgufModel::open(&path).unwrap();
    let mut seen = Vec::new();
    for &t in GgmlType::SUPPORTED {
        let blocks = m
            .tensor(&format!("{}.blocks", t.name().to_lowercase()))
            .unwrap();
        let expected = m
            .tensor(&format!("{}.expected", t.name().to_lowercase()))
            .unwrap();
        assert_eq!(blocks.ggml_type, t);
        assert_eq!(expected.ggml_type, GgmlType::F32);
        assert_eq!(blocks.ne, expected.ne, "{t}");
        assert_eq!(blocks.ne, &[512, 3], "{t}");
        let got = blocks.to_f32().unwrap();
        let want = expected.to_f32().unwrap();
        assert_eq!(got.len(), want.len());
        // Bit-exact: both compute each value from the same f16 scales in f32 (gguf-py in
        // numpy float32); a single wrong nibble, bit or scale index would show.
        let mut bad = 0;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let tol = 1e-6 * w.abs().max(1e-3);
            if (g - w).abs() > tol {
                if bad < 5 {
                    eprintln!("{t} element {i}: got {g}, gguf-py {w}");
                }
                bad += 1;
            }
        }
        assert_eq!(bad, 0, "{t}: {bad} of {} values differ", got.len());
        // The random blocks exercise the whole range of each type.
        assert!(want.iter().any(|&v| v != 0.0), "{t}");
        seen.push(t);
    }
    assert_eq!(seen.len(), 10);
}

/// Q4_0 and Q4_K as affine 4-bit rows (nibble, and A, B per 32 values): A q + B is gguf-py's
/// value bit for bit, and the affine INT4 matrix packed from them reads back each value
/// within the f16 rounding of its scale and offset (Q4_0 exactly: s = d, o = 0).
#[test]
fn four_bit_types_pack_into_affine_int4_as_they_are() {
    use wgmoe::blocks::quant::{Q4Kind, Q4Matrix};
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gguf/dequant.gguf");
    let m = GgufModel::open(&path).unwrap();
    for t in [GgmlType::Q4_0, GgmlType::Q4_K] {
        let name = t.name().to_lowercase();
        let blocks = m.tensor(&format!("{name}.blocks")).unwrap();
        let want = m
            .tensor(&format!("{name}.expected"))
            .unwrap()
            .to_f32()
            .unwrap();
        let a = wgmoe::gguf::dequant::affine4(t, blocks.data)
            .unwrap()
            .unwrap();
        assert_eq!(a.nibbles.len(), want.len());
        assert_eq!(a.blocks.len(), want.len() / 32);
        for (i, &w) in want.iter().enumerate() {
            let (am, bm) = a.blocks[i / 32];
            assert_eq!(am * f32::from(a.nibbles[i]) + bm, w, "{t} element {i}");
        }
        let (out, inp) = (3, 512);
        let q4 = Q4Matrix {
            out,
            inp,
            kind: Q4Kind::Affine32,
        };
        let mut q = vec![0u8; q4.q_bytes()];
        let mut s = vec![0u8; q4.scale_bytes()];
        q4.pack_affine(&a, &mut q, &mut s);
        let back = q4.dequantize(&q, &s);
        for (i, (&b, &w)) in back.iter().zip(&want).enumerate() {
            let (am, bm) = a.blocks[i / 32];
            // f16 rounding of s (relative 2^-11, times |q - 8| <= 8) and of o = B + 8A.
            let tol = (8.0 * am.abs() + (bm + 8.0 * am).abs()) * 2f32.powi(-11) * 1.01;
            if t == GgmlType::Q4_0 {
                assert_eq!(b, w, "{t} element {i}");
            } else {
                assert!(
                    (b - w).abs() <= tol,
                    "{t} element {i}: {b} vs {w} (tol {tol})"
                );
            }
        }
    }
}

/// Q4_K, Q5_K, Q6_K, Q5_0 and Q5_1 in wgmoe's K-plane kinds (nibbles and side records,
/// src/blocks/kquant.rs): every value read back from the planes, and from the matrix
/// packed from them (the bytes the kernels read), is gguf-py's value bit for bit.
#[test]
fn k_quants_and_5_bit_types_pack_into_planes_as_they_are() {
    use wgmoe::blocks::kquant;
    use wgmoe::blocks::quant::{Q4Kind, Q4Matrix};
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gguf/dequant.gguf");
    let m = GgufModel::open(&path).unwrap();
    for (t, kind) in [
        (GgmlType::Q4_K, Q4Kind::Q4K),
        (GgmlType::Q5_K, Q4Kind::Q5K),
        (GgmlType::Q6_K, Q4Kind::Q6K),
        (GgmlType::Q5_0, Q4Kind::Q5A),
        (GgmlType::Q5_1, Q4Kind::Q5A),
    ] {
        let name = t.name().to_lowercase();
        let blocks = m.tensor(&format!("{name}.blocks")).unwrap();
        let want = m
            .tensor(&format!("{name}.expected"))
            .unwrap()
            .to_f32()
            .unwrap();
        let (out, inp) = (3, 512);
        let r = wgmoe::gguf::dequant::planes(t, blocks.data, inp)
            .unwrap()
            .unwrap();
        assert_eq!(r.kind, kind);
        assert_eq!(r.side.len(), out * kquant::side_words(kind, inp), "{t}");
        let values = r.values();
        for (i, (&v, &w)) in values.iter().zip(&want).enumerate() {
            assert!(v == w, "{t} element {i}: planes {v}, gguf-py {w}");
        }
        let q4 = Q4Matrix { out, inp, kind };
        let mut q = vec![0u8; q4.q_bytes()];
        let mut s = vec![0u8; q4.scale_bytes()];
        q4.pack_planes(&r, &mut q, &mut s);
        assert_eq!(q4.dequantize(&q, &s), values, "{t} packed");
        // Bytes per value: the file's, bar Q6_K's d in a word of its own and Q5_0's offset
        // (the section's padding to 16 bytes aside).
        let file = blocks.data.len() as f64;
        let ours = (q4.q_bytes() + 4 * r.side.len()) as f64;
        assert_eq!(q4.scale_bytes(), (4 * r.side.len()).div_ceil(16) * 16);
        let extra = match t {
            GgmlType::Q6_K => 2.0 * (out * inp / 256) as f64,
            GgmlType::Q5_0 => 2.0 * (out * inp / 32) as f64,
            _ => 0.0,
        };
        assert_eq!(
            ours,
            file + extra,
            "{t}: {ours} bytes for {file} in the file"
        );
    }
}

/// A block whose scale is not finite (a corrupt or hostile file) is refused, naming it.
#[test]
fn planes_refuse_non_finite_scales() {
    let mut b = vec![0u8; 210];
    b[208..210].copy_from_slice(&half::f16::NAN.to_le_bytes());
    let e = wgmoe::gguf::dequant::planes(GgmlType::Q6_K, &b, 256).unwrap_err();
    assert!(e.contains("q6_K") && e.contains("element 0"), "{e}");
    let mut b = vec![0u8; 22];
    b[..2].copy_from_slice(&half::f16::from_f32(5000.0).to_le_bytes());
    let e = wgmoe::gguf::dequant::planes(GgmlType::Q5_0, &b, 32).unwrap_err();
    assert!(e.contains("-16 d"), "{e}");
}
