//! Writing a GGUF v3 file in one pass (`wgmoe synth --format gguf`): the header (metadata,
//! then every tensor's name, shape, type and offset), then each tensor's bytes in order,
//! each starting on the alignment, streamed from a callback so no tensor need be in memory
//! whole.

use std::io::Write;

use super::meta::MetaValue;
use super::types::GgmlType;
use crate::error::{Error, Result};

/// The data alignment written (`general.alignment`'s default).
pub const ALIGNMENT: u64 = 32;

/// One tensor to write: ggml's `ne` (fastest-varying first) and its type.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub ne: Vec<u64>,
    pub ty: GgmlType,
}

impl TensorSpec {
    /// Its bytes: whole rows of whole blocks (None when a row is not whole blocks).
    pub fn bytes(&self) -> Option<u64> {
        let rows: u64 = self.ne.iter().skip(1).product();
        self.ty.row_bytes(*self.ne.first()?)?.checked_mul(rows)
    }
}

fn put_str(o: &mut Vec<u8>, s: &str) {
    o.extend((s.len() as u64).to_le_bytes());
    o.extend(s.as_bytes());
}

fn type_id(v: &MetaValue) -> u32 {
    use super::meta::value_type as t;
    match v {
        MetaValue::U8(_) => t::U8,
        MetaValue::I8(_) => t::I8,
        MetaValue::U16(_) => t::U16,
        MetaValue::I16(_) => t::I16,
        MetaValue::U32(_) => t::U32,
        MetaValue::I32(_) => t::I32,
        MetaValue::F32(_) => t::F32,
        MetaValue::Bool(_) => t::BOOL,
        MetaValue::Str(_) => t::STRING,
        MetaValue::U64(_) => t::U64,
        MetaValue::I64(_) => t::I64,
        MetaValue::F64(_) => t::F64,
        MetaValue::Array(_) => t::ARRAY,
    }
}

fn put_value(o: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => o.push(*x),
        MetaValue::I8(x) => o.push(*x as u8),
        MetaValue::U16(x) => o.extend(x.to_le_bytes()),
        MetaValue::I16(x) => o.extend(x.to_le_bytes()),
        MetaValue::U32(x) => o.extend(x.to_le_bytes()),
        MetaValue::I32(x) => o.extend(x.to_le_bytes()),
        MetaValue::F32(x) => o.extend(x.to_le_bytes()),
        MetaValue::Bool(x) => o.push(u8::from(*x)),
        MetaValue::Str(s) => put_str(o, s),
        MetaValue::U64(x) => o.extend(x.to_le_bytes()),
        MetaValue::I64(x) => o.extend(x.to_le_bytes()),
        MetaValue::F64(x) => o.extend(x.to_le_bytes()),
        MetaValue::Array(a) => {
            o.extend(a.elem_type.to_le_bytes());
            o.extend((a.items.len() as u64).to_le_bytes());
            for i in &a.items {
                put_value(o, i);
            }
        }
    }
}

/// Write a GGUF v3 file to `out`: `kv` in order, then the tensors of `tensors`, tensor i's
/// bytes produced by `data(i, sink)` (exactly `tensors[i].bytes()` of them, or an error).
/// Returns the bytes written.
pub fn write_gguf(
    out: &mut dyn Write,
    kv: &[(String, MetaValue)],
    tensors: &[TensorSpec],
    data: &mut dyn FnMut(usize, &mut dyn Write) -> Result<()>,
) -> Result<u64> {
    let io = |e: std::io::Error| Error::Other(format!("writing GGUF: {e}"));
    let mut h = Vec::new();
    h.extend(b"GGUF");
    h.extend(3u32.to_le_bytes());
    h.extend((tensors.len() as u64).to_le_bytes());
    h.extend((kv.len() as u64).to_le_bytes());
    for (k, v) in kv {
        put_str(&mut h, k);
        h.extend(type_id(v).to_le_bytes());
        put_value(&mut h, v);
    }
    let mut sizes = Vec::with_capacity(tensors.len());
    let mut off = 0u64;
    for t in tensors {
        let bytes = t.bytes().ok_or_else(|| {
            Error::Other(format!(
                "GGUF tensor {}: shape {:?} is not whole {} blocks",
                t.name, t.ne, t.ty
            ))
        })?;
        put_str(&mut h, &t.name);
        h.extend((t.ne.len() as u32).to_le_bytes());
        for d in &t.ne {
            h.extend(d.to_le_bytes());
        }
        h.extend(t.ty.id().to_le_bytes());
        h.extend(off.to_le_bytes());
        sizes.push(bytes);
        off = (off + bytes).next_multiple_of(ALIGNMENT);
    }
    h.resize((h.len() as u64).next_multiple_of(ALIGNMENT) as usize, 0);
    out.write_all(&h).map_err(io)?;
    let mut written = h.len() as u64;
    for (i, &size) in sizes.iter().enumerate() {
        let mut counted = Counted { out, n: 0 };
        data(i, &mut counted)?;
        if counted.n != size {
            return Err(Error::Other(format!(
                "internal: GGUF tensor {}: {} bytes written, {size} expected",
                tensors[i].name, counted.n
            )));
        }
        let pad = size.next_multiple_of(ALIGNMENT) - size;
        out.write_all(&vec![0u8; pad as usize]).map_err(io)?;
        written += size + pad;
    }
    Ok(written)
}

/// A writer counting what passes through it.
struct Counted<'a> {
    out: &'a mut dyn Write,
    n: u64,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.out.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::meta::MetaArray;

    /// What the writer writes, the reader reads back: metadata, shapes, types and bytes.
    #[test]
    fn a_written_file_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.gguf");
        let kv = vec![
            (
                "general.architecture".to_string(),
                MetaValue::Str("olmoe".into()),
            ),
            ("x.n".to_string(), MetaValue::U32(7)),
            (
                "x.list".to_string(),
                MetaValue::Array(MetaArray {
                    elem_type: crate::gguf::meta::value_type::STRING,
                    items: vec![MetaValue::Str("a".into()), MetaValue::Str("bc".into())],
                }),
            ),
        ];
        let tensors = vec![
            TensorSpec {
                name: "a".into(),
                ne: vec![3, 2],
                ty: GgmlType::F32,
            },
            TensorSpec {
                name: "b".into(),
                ne: vec![32, 1],
                ty: GgmlType::Q8_0,
            },
        ];
        let mut f = std::fs::File::create(&path).unwrap();
        let n = write_gguf(&mut f, &kv, &tensors, &mut |i, w| {
            let bytes: Vec<u8> = match i {
                0 => (0..6).flat_map(|k| (k as f32).to_le_bytes()).collect(),
                _ => (0..34).map(|k| k as u8).collect(),
            };
            w.write_all(&bytes).map_err(|e| Error::Other(e.to_string()))
        })
        .unwrap();
        drop(f);
        assert_eq!(n, std::fs::metadata(&path).unwrap().len());
        let m = crate::gguf::GgufModel::open(&path).unwrap();
        assert_eq!(
            m.metadata().req_str("general.architecture").unwrap(),
            "olmoe"
        );
        let a = m.tensor("a").unwrap();
        assert_eq!(a.to_f32().unwrap(), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let b = m.tensor("b").unwrap();
        assert_eq!(b.ggml_type, GgmlType::Q8_0);
        assert_eq!(b.data, &(0..34).map(|k| k as u8).collect::<Vec<_>>()[..]);
        // A tensor whose callback writes the wrong length is an error, not a bad file.
        let mut sink = Vec::new();
        assert!(write_gguf(&mut sink, &kv, &tensors, &mut |_, w| {
            w.write_all(&[0u8; 5])
                .map_err(|e| Error::Other(e.to_string()))
        })
        .is_err());
    }
}
