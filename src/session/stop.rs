//! Stop strings (`stop` in the OpenAI API): generation ends where one appears, and the
//! text from it on is never shown. Streamed text that could still become a stop string is
//! held back until it cannot.

#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text received but not yet emitted (a possible start of a stop string).
    pending: String,
}

impl StopStrings {
    /// Empty strings are ignored (they would stop before the first token).
    pub fn new(stops: Vec<String>) -> Self {
        StopStrings {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    /// Adds `text`; returns the text safe to show and whether a stop string was found
    /// (then the text before it is returned and the rest dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.pending), false);
        }
        let first = self.stops.iter().filter_map(|s| self.pending.find(s)).min();
        if let Some(at) = first {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Hold back the longest tail that begins some stop string.
        let len = self.pending.len();
        let longest = self.stops.iter().map(|s| s.len()).max().unwrap_or(0);
        let mut hold = 0;
        for k in (1..longest.min(len + 1)).rev() {
            let cut = len - k;
            if self.pending.is_char_boundary(cut)
                && self
                    .stops
                    .iter()
                    .any(|s| s.starts_with(&self.pending[cut..]))
            {
                hold = k;
                break;
            }
        }
        let out = self.pending[..len - hold].to_string();
        self.pending.drain(..len - hold);
        (out, false)
    }

    /// The end of the generation: whatever was held back is plain text after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut s = StopStrings::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (t, stop) = s.push(p);
            out.push_str(&t);
            if stop {
                return (out, true);
            }
        }
        out.push_str(&s.finish());
        (out, false)
    }

    #[test]
    fn a_stop_string_across_pieces_is_cut_and_nothing_after_it_shows() {
        assert_eq!(
            run(&["END"], &["ab", "cE", "N", "Dxyz"]),
            ("abc".into(), true)
        );
        assert_eq!(
            run(&["\n\n", "X"], &["a\n", "b", "X"]),
            ("a\nb".into(), true)
        );
    }

    #[test]
    fn a_held_back_prefix_that_does_not_complete_is_emitted() {
        let mut s = StopStrings::new(vec!["END".into()]);
        assert_eq!(s.push("aE"), ("a".into(), false));
        assert_eq!(s.push("N"), ("".into(), false));
        assert_eq!(s.push("x"), ("ENx".into(), false));
        assert_eq!(run(&["END"], &["aEN"]), ("aEN".into(), false));
    }

    #[test]
    fn no_stops_pass_everything_and_multibyte_text_is_not_split() {
        assert_eq!(run(&[], &["é", "ü"]), ("éü".into(), false));
        assert_eq!(run(&[""], &["x"]), ("x".into(), false));
        assert_eq!(run(&["éa"], &["xé", "b"]), ("xéb".into(), false));
        assert_eq!(run(&["éa"], &["xé", "a"]), ("x".into(), true));
    }
}
