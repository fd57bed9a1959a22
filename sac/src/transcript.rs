//! What a pass sent and what came back, for the caller's logs: every line
//! with the size of its answer or why there was none. Bounded to the last
//! [`TRANSCRIPT_MAX`] exchanges; answers themselves are not kept (they are
//! the guest's text, up to 64 KiB each).

use std::collections::VecDeque;
use std::fmt;

/// Exchanges kept: the last 256. A pass of spec section 10 sends at most
/// about 12 empty lines, 60 `i` and 20 lines per static NIC, so the whole
/// of an ordinary pass fits.
pub const TRANSCRIPT_MAX: usize = 256;

/// One line sent and how it was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    /// The line without its CR LF (empty for a prompt request).
    pub line: String,
    pub reply: Reply,
}

/// How a line was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// An answer ending in `SAC>`, of this many bytes.
    Answered { bytes: usize },
    /// No usable answer: the cause.
    NoAnswer { cause: String },
}

impl fmt::Display for Exchange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sent {:?}: ", self.line)?;
        match &self.reply {
            Reply::Answered { bytes } => write!(f, "answered ({bytes} bytes)"),
            Reply::NoAnswer { cause } => write!(f, "no answer ({cause})"),
        }
    }
}

/// The last [`TRANSCRIPT_MAX`] exchanges of a session, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transcript {
    entries: VecDeque<Exchange>,
    dropped: u64,
}

impl Transcript {
    /// The exchanges kept, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = &Exchange> {
        self.entries.iter()
    }

    /// How many earlier exchanges were dropped to stay within the bound.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    pub(crate) fn push(&mut self, exchange: Exchange) {
        if self.entries.len() == TRANSCRIPT_MAX {
            self.entries.pop_front();
            self.dropped += 1;
        }
        self.entries.push_back(exchange);
    }

    pub(crate) fn append(&mut self, other: Transcript) {
        self.dropped += other.dropped;
        for exchange in other.entries {
            self.push(exchange);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(line: &str) -> Exchange {
        Exchange {
            line: line.to_owned(),
            reply: Reply::Answered { bytes: 4 },
        }
    }

    #[test]
    fn keeps_the_last_entries() {
        let mut t = Transcript::default();
        for n in 0..TRANSCRIPT_MAX + 3 {
            t.push(sent(&n.to_string()));
        }
        assert_eq!(t.entries().count(), TRANSCRIPT_MAX);
        assert_eq!(t.dropped(), 3);
        assert_eq!(t.entries().next().unwrap().line, "3");
    }

    #[test]
    fn display() {
        assert_eq!(sent("i").to_string(), "sent \"i\": answered (4 bytes)");
        let none = Exchange {
            line: String::new(),
            reply: Reply::NoAnswer {
                cause: "the console closed".into(),
            },
        };
        assert_eq!(
            none.to_string(),
            "sent \"\": no answer (the console closed)"
        );
    }
}
