//! `run --live`: the layer x expert grid drawn in the terminal while generating, in plain
//! ANSI (256-colour backgrounds), redrawn in place at most [`REFRESH`] apart. A sink of the
//! trace's `Tracer` feeds the grid; the generation loop feeds the text.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::format::trace::{Grid, LayerRouting, RoutingSink};

/// The shortest time between two frames.
pub const REFRESH: Duration = Duration::from_millis(100);

/// Grey for "never chosen", then a dark-blue-to-yellow ramp of the 256-colour palette.
const RAMP: [u8; 8] = [17, 18, 24, 30, 36, 71, 149, 226];
const NEVER: u8 = 236;

/// What the terminal shows.
pub struct LiveState {
    pub grid: Grid,
    pub title: String,
    /// The generated text so far.
    pub text: String,
    pub steps: u64,
    last_draw: Option<Instant>,
    /// Lines of the last frame (to draw over it).
    drawn: usize,
    pub width: usize,
}

/// The live view: share it between the tracer (as a sink) and the generation loop.
#[derive(Clone)]
pub struct LiveView(pub Arc<Mutex<LiveState>>);

impl LiveView {
    pub fn new(grid: Grid, title: String) -> Self {
        let width = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(100usize)
            .clamp(40, 400);
        LiveView(Arc::new(Mutex::new(LiveState {
            grid,
            title,
            text: String::new(),
            steps: 0,
            last_draw: None,
            drawn: 0,
            width,
        })))
    }

    pub fn sink(&self) -> Box<dyn RoutingSink> {
        Box::new(LiveSink(self.clone()))
    }

    /// Add generated text; redraw if the last frame is old enough.
    pub fn push_text(&self, s: &str) -> Result<()> {
        let mut st = self.lock();
        st.text.push_str(s);
        st.maybe_draw(false)
    }

    /// Draw the final frame whatever the time.
    pub fn finish(&self) -> Result<()> {
        self.lock().maybe_draw(true)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LiveState> {
        // A panic elsewhere while holding the lock leaves a grid that is still drawable.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct LiveSink(LiveView);

impl RoutingSink for LiveSink {
    fn layer(&mut self, r: &LayerRouting<'_>) -> Result<()> {
        self.0.lock().grid.observe_routing(r);
        Ok(())
    }

    fn end_step(&mut self) -> Result<()> {
        let mut st = self.0.lock();
        st.steps += 1;
        st.maybe_draw(false)
    }
}

/// Bins of `n` items into at most `max` groups: (first, end) of each.
fn bins(n: usize, max: usize) -> Vec<(usize, usize)> {
    let per = n.div_ceil(max.max(1)).max(1);
    (0..n).step_by(per).map(|a| (a, (a + per).min(n))).collect()
}

fn shade(count: u64, max: u64) -> u8 {
    if count == 0 || max == 0 {
        return NEVER;
    }
    let i = ((count as f64 / max as f64) * (RAMP.len() - 1) as f64).round() as usize;
    RAMP[i.min(RAMP.len() - 1)]
}

impl LiveState {
    /// The frame's lines (ANSI colours included), at most `width` cells wide.
    pub fn frame(&self) -> Vec<String> {
        let g = &self.grid;
        let room = self.width.saturating_sub(8);
        let cols = bins(g.num_experts, room);
        // Few experts: wider cells, easier to read.
        let cell = (room / g.num_experts.max(1)).clamp(1, 3);
        let rows = bins(g.layers.len(), 40);
        let max = g.max_count();
        // Lines wider than the terminal would wrap and break drawing over the last frame.
        let fit = |s: String| {
            s.chars()
                .take(self.width.saturating_sub(1))
                .collect::<String>()
        };
        let mut out = vec![fit(format!(
            "step {}  tokens {}  {}",
            self.steps,
            g.tokens.first().copied().unwrap_or(0),
            self.title
        ))];
        out.push(fit(format!(
            "layer  experts 0..{} ({} per cell); colour: tokens routed (grey: never), *: on the GPU, c: computed on the CPU",
            g.num_experts.saturating_sub(1),
            cols.first().map_or(1, |c| c.1 - c.0)
        )));
        for &(r0, r1) in &rows {
            let mut line = format!("{:>5}  ", g.layers[r0]);
            for &(c0, c1) in &cols {
                let mut count = 0;
                let mut resident = false;
                let mut cpu = false;
                for r in r0..r1 {
                    for c in c0..c1 {
                        count = count.max(g.counts[r][c]);
                        resident |= g.resident[r][c];
                        cpu |= g.cpu[r][c] > 0;
                    }
                }
                let fg = if shade(count, max) >= 149 { 16 } else { 231 };
                let mark = match (resident, cpu) {
                    (true, _) => "*",
                    (false, true) => "c",
                    _ => " ",
                };
                line.push_str(&format!(
                    "\x1b[48;5;{}m\x1b[38;5;{fg}m{:^cell$}",
                    shade(count, max),
                    mark
                ));
            }
            line.push_str("\x1b[0m");
            out.push(line);
        }
        // The last line of text that fits.
        let flat: String = self.text.replace(['\n', '\r', '\t'], " ");
        let keep = self.width.saturating_sub(8);
        let tail: String = {
            let chars: Vec<char> = flat.chars().filter(|c| !c.is_control()).collect();
            chars[chars.len().saturating_sub(keep)..].iter().collect()
        };
        out.push(format!("text: {tail}"));
        out
    }

    fn maybe_draw(&mut self, force: bool) -> Result<()> {
        if !force && self.last_draw.is_some_and(|t| t.elapsed() < REFRESH) {
            return Ok(());
        }
        let frame = self.frame();
        let mut o = String::new();
        if self.drawn > 0 {
            // Back to the first line of the previous frame.
            o.push_str(&format!("\x1b[{}A\r", self.drawn));
        }
        for l in &frame {
            o.push_str("\x1b[2K");
            o.push_str(l);
            o.push('\n');
        }
        self.drawn = frame.len();
        self.last_draw = Some(Instant::now());
        let mut out = std::io::stdout().lock();
        // A closed terminal ends the view, not the run.
        let _ = out.write_all(o.as_bytes()).and_then(|_| out.flush());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frame_bins_experts_to_the_width_and_marks_residency() {
        let mut g = Grid::new(vec![0, 1], 200, true);
        g.observe(&crate::format::trace::Observed {
            layer: 0,
            ids: &[0, 150],
            hit: &[false, false],
            cpu: &[],
            evicted: &[],
            loaded: &[0, 150],
            top_k: 2,
            counted: true,
        });
        g.observe(&crate::format::trace::Observed {
            layer: 1,
            ids: &[3, 4],
            hit: &[false, false],
            cpu: &[true, true],
            evicted: &[],
            loaded: &[],
            top_k: 2,
            counted: true,
        });
        let v = LiveView::new(g, "t".into());
        let mut st = v.lock();
        st.width = 58; // 50 cells: 4 experts per cell
        st.text = "hello\nworld".into();
        let f = st.frame();
        assert_eq!(f.len(), 2 + 2 + 1);
        assert!(f[1].contains("(4 per cell)"), "{}", f[1]);
        let cells = f[2].matches("\x1b[48;5;").count();
        assert_eq!(cells, 50);
        // Experts 0 and 150: cells 0 and 37 are resident and coloured at the top of the ramp.
        assert_eq!(f[2].matches('*').count(), 2);
        assert_eq!(f[2].matches("\x1b[48;5;226m").count(), 2);
        // Layer 1: experts 3 and 4 (cell 0 and 1) computed on the CPU, never on the GPU.
        assert_eq!(f[3].matches('*').count(), 0);
        assert_eq!(f[3].matches('c').count(), 2);
        assert!(f[4].ends_with("hello world"));
        assert_eq!(bins(10, 3), vec![(0, 4), (4, 8), (8, 10)]);
        assert_eq!(shade(0, 5), NEVER);
    }
}
