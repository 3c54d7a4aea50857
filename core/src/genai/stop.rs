//! Stop strings over streamed text.
//!
//! Generated text arrives in pieces (one per token, or none while a character is incomplete).
//! [`StopText`] keeps the text, finds the first stop string in it even when it spans pieces,
//! and says which part is safe to show: everything except a tail that could still become the
//! beginning of a stop string. Shown text never contains a stop string, and the final text is
//! cut just before the first one (the stop string itself is not part of the result).

use alloc::string::String;
use alloc::vec::Vec;

/// Streamed text checked against stop strings.
#[derive(Clone, Debug, Default)]
pub struct StopText {
    stops: Vec<String>,
    longest: usize,
    text: String,
    shown: usize,
    stopped: bool,
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl StopText {
    /// Checks against `stops` (empty strings are ignored).
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(stops: I) -> StopText {
        let stops: Vec<String> = stops
            .into_iter()
            .map(Into::into)
            .filter(|s| !s.is_empty())
            .collect();
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        StopText {
            stops,
            longest,
            ..StopText::default()
        }
    }

    /// Whether a stop string has matched.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The text so far (after a match: the text before the stop string).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Appends `piece` and returns the text that can be shown now (possibly empty). Once a
    /// stop string matched, later pieces are ignored.
    pub fn push(&mut self, piece: &str) -> &str {
        if self.stopped {
            return "";
        }
        let old = self.text.len();
        self.text.push_str(piece);
        // a match that ends in the new piece starts at most `longest - 1` bytes before it
        let from = floor_boundary(
            &self.text,
            old.saturating_sub(self.longest.saturating_sub(1)),
        );
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()))
            .min();
        let start = self.shown;
        if let Some(at) = first {
            self.text.truncate(from + at);
            self.stopped = true;
            let start = start.min(self.text.len());
            self.shown = self.text.len();
            return &self.text[start..];
        }
        // hold back the longest tail that is a proper beginning of a stop string
        let (text, len) = (&self.text, self.text.len());
        let held = self
            .stops
            .iter()
            .flat_map(|s| {
                (1..s.len().min(len + 1)).filter(move |&k| {
                    s.is_char_boundary(k)
                        && text.is_char_boundary(len - k)
                        && text.as_bytes()[len - k..] == s.as_bytes()[..k]
                })
            })
            .max()
            .unwrap_or(0);
        self.shown = (len - held).max(start);
        &self.text[start..self.shown]
    }

    /// The held-back text, shown once the generation ends without a match.
    pub fn finish(&mut self) -> &str {
        let start = self.shown;
        self.shown = self.text.len();
        &self.text[start..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;
    use alloc::string::ToString;

    /// Feeds `pieces`, collecting everything shown; returns (shown, text, stopped).
    fn run(stops: &[&str], pieces: &[&str]) -> (String, String, bool) {
        let mut st = StopText::new(stops.iter().copied());
        let mut shown = String::new();
        for p in pieces {
            shown.push_str(st.push(p));
            // what is shown never contains a stop string
            for s in stops.iter().filter(|s| !s.is_empty()) {
                assert!(!shown.contains(s), "{shown:?} shows {s:?}");
            }
        }
        if !st.stopped() {
            shown.push_str(st.finish());
        }
        (shown, st.text().to_string(), st.stopped())
    }

    /// The direct rule: the text up to the first occurrence of any stop string.
    fn direct(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let all: String = pieces.concat();
        let first = stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| all.find(s))
            .min();
        match first {
            Some(i) => (all[..i].to_string(), true),
            None => (all, false),
        }
    }

    #[test]
    fn matches_the_direct_rule_on_every_split() {
        let texts = [
            "Hello world. The end.\nMore",
            "abcabcabd",
            "naïve café — ünïcödé ends",
            "no stop here at all",
            "User: hi\nAssistant: yo\nUser:",
        ];
        let stops: [&[&str]; 5] = [
            &["end"],
            &["abd", "cab"],
            &["ü", "— ü"],
            &["zzz", ""],
            &["\nUser:", "Assistant"],
        ];
        for text in texts {
            for st in stops {
                // every split into two or three pieces at character boundaries
                let cuts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
                for &a in &cuts {
                    for &b in cuts.iter().filter(|&&b| b >= a) {
                        let pieces = [&text[..a], &text[a..b], &text[b..]];
                        let (shown, kept, stopped) = run(st, &pieces);
                        let (want, want_stop) = direct(st, &pieces);
                        let ctx = format!("{text:?} / {st:?} / {pieces:?}");
                        assert_eq!(kept, want, "{ctx}");
                        assert_eq!(shown, want, "{ctx}");
                        assert_eq!(stopped, want_stop, "{ctx}");
                    }
                }
            }
        }
    }

    #[test]
    fn holds_back_only_a_possible_beginning() {
        let mut st = StopText::new(["</s>"]);
        assert_eq!(st.push("a <"), "a ");
        assert_eq!(st.push("/"), "");
        assert_eq!(st.push("x"), "</x");
        assert_eq!(st.push("</"), "");
        assert_eq!(st.push("s>tail"), "");
        assert!(st.stopped());
        assert_eq!(st.text(), "a </x");
        assert_eq!(st.push("more"), "");
    }
}
