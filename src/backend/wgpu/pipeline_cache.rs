//! Compiled pipelines kept on disk across runs (wgpu's `PipelineCache`, Vulkan drivers
//! with `PIPELINE_CACHE`): one file per adapter (wgpu's key: vendor and device; the driver
//! checks its own version inside) and wgmoe version, under the cache directory. The file
//! is wgpu's data behind a header of ours (magic, length, FNV-1a hash), so a truncated or
//! damaged file is never handed to the driver: it is ignored with a note and rewritten.

use std::path::PathBuf;

const MAGIC: &[u8; 8] = b"WGMOEPC1";
const HEADER: usize = 24;

/// What became of the cache at device creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheState {
    /// `--no-pipeline-cache`.
    Off,
    /// The adapter has no pipeline cache (not Vulkan, or no `PIPELINE_CACHE`), or no cache
    /// directory is known.
    Unsupported,
    /// No file yet: one is written after loading.
    Created,
    /// The driver took the file's pipelines.
    Loaded,
    /// The file was damaged or refused (the reason): ignored, and rewritten after loading.
    Replaced(String),
}

impl CacheState {
    pub fn name(&self) -> &'static str {
        match self {
            CacheState::Off => "off",
            CacheState::Unsupported => "unsupported",
            CacheState::Created => "created",
            CacheState::Loaded => "loaded",
            CacheState::Replaced(_) => "replaced",
        }
    }
}

pub struct DiskCache {
    pub cache: ::wgpu::PipelineCache,
    pub path: PathBuf,
}

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// wgpu's data inside our header.
pub fn wrap(data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER + data.len());
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&(data.len() as u64).to_le_bytes());
    v.extend_from_slice(&fnv1a(data).to_le_bytes());
    v.extend_from_slice(data);
    v
}

/// wgpu's data out of a file, or why the file cannot be used.
pub fn unwrap(file: &[u8]) -> Result<&[u8], String> {
    if file.len() < HEADER || &file[..8] != MAGIC {
        return Err("not a wgmoe pipeline cache".into());
    }
    let word = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&file[i..i + 8]);
        u64::from_le_bytes(b)
    };
    let data = &file[HEADER..];
    if word(8) != data.len() as u64 {
        return Err(format!("truncated: {} bytes of {}", data.len(), word(8)));
    }
    if word(16) != fnv1a(data) {
        return Err("its checksum does not match (damaged)".into());
    }
    Ok(data)
}

/// Open the cache of this adapter: its file's pipelines where the file is sound and the
/// driver takes them, else an empty cache.
pub fn open(
    device: &::wgpu::Device,
    info: &::wgpu::AdapterInfo,
    features: ::wgpu::Features,
    disabled: bool,
) -> (Option<DiskCache>, CacheState) {
    if disabled {
        return (None, CacheState::Off);
    }
    let key = ::wgpu::util::pipeline_cache_key(info)
        .filter(|_| features.contains(::wgpu::Features::PIPELINE_CACHE));
    let (Some(key), Some(dir)) = (key, crate::cache_dir::cache_dir()) else {
        return (None, CacheState::Unsupported);
    };
    let path = dir
        .join("pipelines")
        .join(format!("{key}_wgmoe-{}.bin", env!("CARGO_PKG_VERSION")));
    let make = |data: Option<&[u8]>| {
        let scope = device.push_error_scope(::wgpu::ErrorFilter::Validation);
        // SAFETY: `data` is what `PipelineCache::get_data` returned for an adapter of this
        // key (our header's hash proves the bytes are those written), and wgpu and the
        // driver check its own headers before using it.
        let cache = unsafe {
            device.create_pipeline_cache(&::wgpu::PipelineCacheDescriptor {
                label: Some("wgmoe pipelines"),
                data,
                fallback: false,
            })
        };
        (cache, pollster::block_on(scope.pop()))
    };
    let state = match std::fs::read(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => CacheState::Created,
        Err(e) => CacheState::Replaced(format!("unreadable: {e}")),
        Ok(file) => match unwrap(&file) {
            Err(why) => CacheState::Replaced(why),
            Ok(data) => match make(Some(data)) {
                (cache, None) => return (Some(DiskCache { cache, path }), CacheState::Loaded),
                (_, Some(e)) => CacheState::Replaced(format!("the driver refused it: {e}")),
            },
        },
    };
    match make(None) {
        (cache, None) => (Some(DiskCache { cache, path }), state),
        (_, Some(_)) => (None, CacheState::Unsupported),
    }
}

/// Write the cache's current data to its file (through a temporary file and a rename, so
/// a reader never sees half of it).
pub fn save(c: &DiskCache) -> std::io::Result<()> {
    let Some(data) = c.cache.get_data() else {
        return Ok(());
    };
    if let Some(dir) = c.path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Unique per process and per device: engines of one process may save at once.
    static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = c
        .path
        .with_extension(format!("tmp{}-{n}", std::process::id()));
    std::fs::write(&tmp, wrap(&data))?;
    std::fs::rename(&tmp, &c.path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_tells_a_sound_file_from_a_damaged_one() {
        let data = b"pipelines of a driver".to_vec();
        let f = wrap(&data);
        assert_eq!(unwrap(&f).unwrap(), &data[..]);
        assert!(unwrap(&f[..f.len() - 1]).unwrap_err().contains("truncated"));
        let mut bad = f.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(unwrap(&bad).unwrap_err().contains("checksum"));
        assert!(unwrap(b"garbage").is_err());
        assert!(unwrap(&[]).is_err());
    }
}
