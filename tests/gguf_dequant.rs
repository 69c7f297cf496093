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
