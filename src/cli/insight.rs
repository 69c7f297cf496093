//! `wgmoe simulate` and `wgmoe heatmap`: what a routing trace says.

use wgmoe::error::Result;
use wgmoe::format::trace::{read_trace, Grid};
use wgmoe::insight::simulate::{render, simulate as run_simulation, SimulateOptions};

use crate::SimulateArgs;

pub fn simulate(a: SimulateArgs) -> Result<()> {
    let trace = read_trace(&a.trace)?;
    let h = &trace.header;
    let capacities = if a.capacity.is_empty() {
        let (e, k) = (h.num_experts, h.top_k);
        let mut c = vec![h.resident_experts_per_layer];
        c.extend([e / 4, e / 2, 3 * e / 4].map(|x| x.clamp(k, e)));
        c.sort_unstable();
        c.dedup();
        c
    } else {
        a.capacity.clone()
    };
    let report = run_simulation(
        &trace,
        &SimulateOptions {
            capacities,
            decays: a.decay.clone(),
            fit_fraction: a.fit,
            prefetch: a.prefetch,
        },
    )?;
    super::print_report(a.json, &report, render)
}

pub fn heatmap(trace: &std::path::Path, out: &std::path::Path) -> Result<()> {
    wgmoe::format::render::format_of("--out", out)?;
    super::check_output_file("--out", out)?;
    let t = read_trace(trace)?;
    let g = Grid::of_trace(&t);
    let labels = wgmoe::insight::heatmap::HeatmapLabels::of_trace(&t, &g);
    let svg = wgmoe::insight::heatmap::heatmap_svg(&g, &labels);
    super::write_atomic(
        out,
        &wgmoe::format::render::image_bytes("--out", out, &svg)?,
    )?;
    eprintln!("wrote {}", out.display());
    Ok(())
}
