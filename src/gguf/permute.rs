//! The Q/K row order of `llama`-arch (Mixtral) GGUF files.
//!
//! Hugging Face's Llama/Mixtral checkpoints rotate each head's dimension `i` with `i + d/2`
//! (`rotate_half`, "NeoX" order). llama.cpp's llama graph applies RoPE to adjacent pairs
//! `(2i, 2i+1)` ("normal" order), so `convert_hf_to_gguf.py` (`LlamaModel.permute`) reorders
//! the rows of `q_proj` (with `n_head`) and `k_proj` (with `n_head_kv`) per head:
//!
//! ```text
//! w.reshape(n_head, 2, d/2, cols).swapaxes(1, 2).reshape(rows, cols)
//! GGUF row h*d + 2*i + j  <-  HF row h*d + j*(d/2) + i      (i < d/2, j in {0, 1})
//! ```
//!
//! The olmoe, qwen2moe and qwen3moe converters do not permute (llama.cpp runs them with
//! NeoX RoPE). Undoing the permutation row by row gives back the HF layout for every block
//! type, since a row is whole blocks; [`unpermute_rows`] does that. The alternative, pairwise
//! RoPE on the file's order, gives the same attention scores (q·k is a sum over the same
//! pairs), but the q/k norms and biases would have to follow the permuted order too.

/// The HF row of GGUF row `r` of a permuted Q or K weight with heads of `head_dim` rows.
pub fn hf_row_of_gguf_row(r: usize, head_dim: usize) -> usize {
    let (h, w) = (r / head_dim, r % head_dim);
    let (i, j) = (w / 2, w % 2);
    h * head_dim + j * (head_dim / 2) + i
}

/// The GGUF row of HF row `r` (the converter's permutation).
pub fn gguf_row_of_hf_row(r: usize, head_dim: usize) -> usize {
    let (h, w) = (r / head_dim, r % head_dim);
    let half = head_dim / 2;
    let (j, i) = (w / half, w % half);
    h * head_dim + 2 * i + j
}

/// Rows of `data` (each `row_bytes` long, any block type) from the converter's order back
/// to Hugging Face's. Err when the bytes are not whole rows of whole heads.
pub fn unpermute_rows(data: &[u8], row_bytes: usize, head_dim: usize) -> Result<Vec<u8>, String> {
    if row_bytes == 0 || head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(format!(
            "cannot unpermute rows of {row_bytes} bytes with head_dim {head_dim}"
        ));
    }
    if !data.len().is_multiple_of(row_bytes * head_dim) {
        return Err(format!(
            "{} bytes are not whole heads of {head_dim} rows of {row_bytes} bytes",
            data.len()
        ));
    }
    let rows = data.len() / row_bytes;
    let mut out = vec![0u8; data.len()];
    for r in 0..rows {
        let hf = hf_row_of_gguf_row(r, head_dim);
        out[hf * row_bytes..(hf + 1) * row_bytes]
            .copy_from_slice(&data[r * row_bytes..(r + 1) * row_bytes]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The converter's permutation written as its numpy expression, on row indices.
    fn converter_order(rows: usize, n_head: usize) -> Vec<usize> {
        // reshape(n_head, 2, d/2).swapaxes(1, 2).reshape(rows): out[h][i][j] = in[h][j][i].
        let d = rows / n_head;
        let mut out = Vec::with_capacity(rows);
        for h in 0..n_head {
            for i in 0..d / 2 {
                for j in 0..2 {
                    out.push(h * d + j * (d / 2) + i);
                }
            }
        }
        out
    }

    #[test]
    fn inverse_of_the_converters_permutation() {
        for (n_head, d) in [(1, 2), (2, 8), (4, 16), (8, 128)] {
            let rows = n_head * d;
            let perm = converter_order(rows, n_head);
            for (gguf_row, &hf_row) in perm.iter().enumerate() {
                assert_eq!(hf_row_of_gguf_row(gguf_row, d), hf_row);
                assert_eq!(gguf_row_of_hf_row(hf_row, d), gguf_row);
            }
        }
    }

    #[test]
    fn unpermuting_bytes_restores_the_hf_rows() {
        let (n_head, d, row_bytes) = (2, 4, 3);
        let hf: Vec<u8> = (0..(n_head * d * row_bytes) as u8).collect();
        let perm = converter_order(n_head * d, n_head);
        let gguf: Vec<u8> = perm
            .iter()
            .flat_map(|&r| hf[r * row_bytes..(r + 1) * row_bytes].to_vec())
            .collect();
        assert_ne!(gguf, hf);
        assert_eq!(unpermute_rows(&gguf, row_bytes, d).unwrap(), hf);
        assert!(unpermute_rows(&gguf[1..], row_bytes, d).is_err());
        assert!(unpermute_rows(&gguf, row_bytes, 3).is_err());
    }
}
