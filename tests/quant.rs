//! The INT4 quantiser, bit for bit against the reference tools/make_fixtures.py computed
//! with torch (models/goldens/*.int4_ref.safetensors), for every routed expert matrix of
//! both fixtures (OLMoE: every block partial, in = 64 / 96; Qwen: down rows of 256 + 64),
//! and through the packed layout the kernels read.

mod common;

use common::*;
use safetensors::SafeTensors;
use wgmoe::blocks::quant::{quantize_row, Q4Matrix};
use wgmoe::config::ModelConfig;
use wgmoe::format::checkpoint::{Checkpoint, ExpertProj};

fn check(name: &str) {
    let dir = fixture(name);
    let cfg = ModelConfig::from_dir(&dir).unwrap();
    let ckpt = Checkpoint::open(&dir).unwrap();
    let path = repo().join(format!("models/goldens/{name}.int4_ref.safetensors"));
    let bytes = std::fs::read(&path).unwrap();
    let (_, md) = SafeTensors::read_metadata(&bytes).unwrap();
    let packed = md
        .metadata()
        .as_ref()
        .and_then(|m| m.get("q_layout"))
        .map(String::as_str)
        == Some("packed");
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (e, h, i) = (cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate);
    let mut matrices = 0;
    for l in 0..cfg.num_layers {
        for ex in 0..e {
            for (proj, pname, out, inp) in [
                (ExpertProj::Gate, "gate_proj", i, h),
                (ExpertProj::Up, "up_proj", i, h),
                (ExpertProj::Down, "down_proj", h, i),
            ] {
                let w = ckpt.read_expert_f32(l, ex, proj, e, h, i).unwrap();
                let key = format!("layers.{l}.experts.{ex}.{pname}");
                let gq = st.tensor(&format!("{key}.q")).unwrap();
                let gs = st.tensor(&format!("{key}.scale")).unwrap();
                let gs: Vec<u16> = gs
                    .data()
                    .chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]))
                    .collect();
                let nb = inp.div_ceil(256);
                let m = Q4Matrix::sym(out, inp);
                let mut pq = vec![0u8; m.q_bytes()];
                let mut ps = vec![0u8; m.scale_bytes()];
                m.pack(&w, &mut pq, &mut ps);
                for n in 0..out {
                    let (q, s) = quantize_row(&w[n * inp..(n + 1) * inp]);
                    for (k, &qk) in q.iter().enumerate().take(inp) {
                        let golden = if packed {
                            let b = gq.data()[n * inp.div_ceil(2) + k / 2];
                            if k % 2 == 0 {
                                b & 0xF
                            } else {
                                b >> 4
                            }
                        } else {
                            gq.data()[n * inp + k]
                        };
                        assert_eq!(qk, golden, "{name} {key} row {n} col {k}: nibble");
                        assert_eq!(
                            m.nibble(&pq, n, k),
                            golden,
                            "{name} {key} row {n} col {k}: packed nibble"
                        );
                    }
                    for b in 0..nb {
                        assert_eq!(
                            s[b].to_bits(),
                            gs[n * nb + b],
                            "{name} {key} row {n} block {b}: scale"
                        );
                        assert_eq!(
                            m.scale(&ps, n, b).to_bits(),
                            gs[n * nb + b],
                            "{name} {key} row {n} block {b}: packed scale"
                        );
                    }
                }
                matrices += 1;
            }
        }
    }
    assert_eq!(matrices, cfg.num_layers * e * 3);
}

#[test]
fn olmoe_quantizer_is_bit_exact() {
    check("olmoe-tiny");
}

#[test]
fn qwen2moe_quantizer_is_bit_exact() {
    check("qwen2moe-tiny");
}

/// One expert's INT4 bytes at the published shapes (block 256, one f16 scale per block and
/// row, nibbles of a row padded to whole 32-column words): what residency and admission
/// count per slot.
#[test]
fn expert_slot_bytes_at_the_published_shapes() {
    for (name, hidden, inter, want) in [
        ("OLMoE-1B-7B", 2048, 1024, 3_194_880),
        ("Qwen1.5-MoE-A2.7B", 2048, 1408, 4_395_008), // down: 1408 inputs are 6 blocks, the last partial
        ("Qwen3-30B-A3B", 2048, 768, 2_396_160),
        ("Mixtral-8x7B", 4096, 14336, 89_456_640),
    ] {
        let l = wgmoe::blocks::quant::Q4SlotLayout::new(hidden, inter);
        assert_eq!(l.bytes, want, "{name}");
    }
}

/// `quantize`'s progress counts bytes, not tensors: it ends at the bytes of the tensors
/// written (the file without its header), never going back.
#[test]
fn quantize_progress_counts_the_bytes_written() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("converted");
    let mut seen: Vec<(u64, u64)> = Vec::new();
    wgmoe::format::convert::write_converted(&fixture("olmoe-tiny"), &out, &mut |done, total| {
        seen.push((done, total))
    })
    .unwrap();
    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let data = bytes.len() as u64 - 8 - header;
    let &(done, total) = seen.last().unwrap();
    assert_eq!((done, total), (data, data), "the end is every byte written");
    assert!(seen
        .windows(2)
        .all(|w| w[0].0 <= w[1].0 && w[0].1 == w[1].1));
}
