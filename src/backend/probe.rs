//! The memory-access probe: a probe build of the kernels (a [`super::DeviceRequest`] with
//! `probe`) counts, at every global load, the distinct 32-byte sectors the subgroup's
//! lanes touch and the bytes they use (`shaders/common/probe_on.wgsl`), per class of
//! buffer. On lavapipe with `LP_NATIVE_VECTOR_WIDTH=1024` a subgroup is 32 lanes in
//! lockstep, as a warp on a GPU, so useful bytes / (sectors x 32) is the sector
//! efficiency Nsight Compute reports (sectors per request). `wgmoe kernels` reads it.

use crate::error::Error;

/// The binding of the counters in a probe build.
pub const BINDING: u32 = 14;

/// What a load reads (the WGSL twins are in `shaders/common/probe_sites.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// Weight words.
    Weights = 0,
    /// Weight block scales.
    Scales = 1,
    /// Activations.
    Activations = 2,
    /// The KV cache.
    KvCache = 3,
    /// Ids, slot tables, partial sums.
    Other = 4,
}

/// Counter sites (each [requests, sectors, bytes used, lanes]).
pub const SITES: usize = 5;

impl Site {
    pub const ALL: [Site; SITES] = [
        Site::Weights,
        Site::Scales,
        Site::Activations,
        Site::KvCache,
        Site::Other,
    ];

    pub fn wgsl_name(self) -> &'static str {
        match self {
            Site::Weights => "SITE_W",
            Site::Scales => "SITE_WS",
            Site::Activations => "SITE_X",
            Site::KvCache => "SITE_KV",
            Site::Other => "SITE_OTHER",
        }
    }
}

/// What one site's loads did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Loads {
    /// Subgroup-wide load instructions.
    pub requests: u64,
    /// Distinct 32-byte sectors they touched.
    pub sectors: u64,
    /// Distinct bytes they read.
    pub bytes: u64,
    /// Active lanes over all requests (lanes / requests: the width of a request).
    pub lanes: u64,
}

impl std::ops::Add for Loads {
    type Output = Loads;
    fn add(self, o: Loads) -> Loads {
        Loads {
            requests: self.requests + o.requests,
            sectors: self.sectors + o.sectors,
            bytes: self.bytes + o.bytes,
            lanes: self.lanes + o.lanes,
        }
    }
}

impl Loads {
    /// Every counter times `f`, rounded (a weighted average of runs of different shapes).
    pub fn scaled(self, f: f64) -> Loads {
        let r = |v: u64| (v as f64 * f).round() as u64;
        Loads {
            requests: r(self.requests),
            sectors: r(self.sectors),
            bytes: r(self.bytes),
            lanes: r(self.lanes),
        }
    }

    /// Useful bytes / fetched bytes (None when nothing was read).
    pub fn sector_efficiency(self) -> Option<f64> {
        (self.sectors > 0).then(|| self.bytes as f64 / (self.sectors * 32) as f64)
    }
}

/// The counters of a probe run, by site.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts(pub [Loads; SITES]);

impl Counts {
    pub fn from_raw(raw: &[[u64; 4]]) -> Counts {
        let mut c = Counts::default();
        for (i, r) in raw.iter().take(SITES).enumerate() {
            c.0[i] = Loads {
                requests: r[0],
                sectors: r[1],
                bytes: r[2],
                lanes: 0,
            };
            c.0[i].lanes = r[3];
        }
        c
    }

    pub fn site(&self, s: Site) -> Loads {
        self.0[s as usize]
    }

    /// Weight words and scales together.
    pub fn weights(&self) -> Loads {
        self.site(Site::Weights) + self.site(Site::Scales)
    }

    pub fn add(&self, o: &Counts) -> Counts {
        let mut c = *self;
        for i in 0..SITES {
            c.0[i] = c.0[i] + o.0[i];
        }
        c
    }

    /// Every site's counters times `f`, rounded.
    pub fn scaled(&self, f: f64) -> Counts {
        let mut c = *self;
        for l in c.0.iter_mut() {
            *l = l.scaled(f);
        }
        c
    }
}

/// One dispatch of a probe run: what it was and what its loads did.
#[derive(Clone, Debug)]
pub struct ProbedOp {
    pub stage: &'static str,
    pub kernel: crate::backend::Kernel,
    pub grid: [u32; 3],
    pub counts: Counts,
}

impl ProbedOp {
    pub fn workgroups(&self) -> u64 {
        self.grid.iter().map(|&g| g as u64).product()
    }

    pub fn invocations(&self) -> u64 {
        self.workgroups() * self.kernel.workgroup_size() as u64
    }
}

pub(crate) fn not_here() -> Error {
    Error::Other("the memory-access probe runs the WGSL kernels: it needs the wgpu backend".into())
}
