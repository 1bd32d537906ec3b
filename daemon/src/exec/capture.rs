//! Bounded capture of one output stream: keeps the first and the last bytes up
//! to a cap and counts what was dropped in between, so memory stays bounded
//! however much a program writes.

use std::collections::VecDeque;

#[derive(Debug)]
pub struct Capture {
    head_cap: usize,
    tail_cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
    /// Bytes left in the stream when reading stopped early, and why it stopped.
    unread: Option<(u64, String)>,
}

/// A finished capture.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Captured {
    /// The kept text (lossily decoded), with a marker where bytes were dropped.
    pub text: String,
    /// Bytes the program wrote to this stream.
    pub total_bytes: u64,
    /// Bytes not included in `text`.
    pub dropped_bytes: u64,
    /// Why the stream could not be read to its end, when it could not (its
    /// unread bytes are counted in `total_bytes` and `dropped_bytes`).
    pub incomplete: Option<String>,
}

impl Capture {
    /// Keeps at most `cap` bytes: half from the start, half from the end.
    pub fn new(cap: usize) -> Capture {
        let head_cap = cap / 2;
        Capture {
            head_cap,
            tail_cap: cap - head_cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
            unread: None,
        }
    }

    /// Records that reading stopped with `bytes` still in the stream, and why.
    pub fn mark_incomplete(&mut self, bytes: u64, why: &str) {
        self.unread = Some((bytes, why.to_string()));
    }

    pub fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        if self.head.len() < self.head_cap {
            let n = (self.head_cap - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        if data.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&data[data.len() - self.tail_cap..]);
        } else {
            let excess = (self.tail.len() + data.len()).saturating_sub(self.tail_cap);
            self.tail.drain(..excess);
            self.tail.extend(data);
        }
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn finish(self) -> Captured {
        let (unread, incomplete) = match self.unread {
            Some((bytes, why)) => (bytes, Some(why)),
            None => (0, None),
        };
        let mut head = self.head;
        let mut tail: Vec<u8> = self.tail.into();
        let kept = (head.len() + tail.len()) as u64;
        if kept == self.total {
            head.extend_from_slice(&tail);
            return Captured {
                text: String::from_utf8_lossy(&head).into_owned(),
                total_bytes: self.total + unread,
                dropped_bytes: unread,
                incomplete,
            };
        }
        // Cut at character boundaries so the edges decode cleanly.
        head.truncate(utf8_prefix_len(&head));
        let skip = tail
            .iter()
            .take(3)
            .take_while(|b| (**b & 0xC0) == 0x80)
            .count();
        tail.drain(..skip);
        let dropped = self.total - (head.len() + tail.len()) as u64;
        let mut text = String::from_utf8_lossy(&head).into_owned();
        text.push_str(&format!("\n[... {dropped} bytes omitted ...]\n"));
        text.push_str(&String::from_utf8_lossy(&tail));
        Captured {
            text,
            total_bytes: self.total + unread,
            dropped_bytes: dropped + unread,
            incomplete,
        }
    }
}

/// Length of `b` without a trailing incomplete UTF-8 sequence.
fn utf8_prefix_len(b: &[u8]) -> usize {
    let start = b.len().saturating_sub(3);
    for i in (start..b.len()).rev() {
        let byte = b[i];
        if byte & 0xC0 == 0x80 {
            continue;
        }
        let need = match byte {
            0x00..=0x7F => 1,
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            _ => 4,
        };
        return if b.len() - i >= need { b.len() } else { i };
    }
    b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_output_is_kept_whole() {
        let mut c = Capture::new(100);
        c.push(b"hello ");
        c.push(b"world");
        let r = c.finish();
        assert_eq!(r.text, "hello world");
        assert_eq!(r.dropped_bytes, 0);
        assert_eq!(r.total_bytes, 11);
    }

    #[test]
    fn exactly_cap_is_kept_whole() {
        let mut c = Capture::new(10);
        for b in b"0123456789" {
            c.push(&[*b]);
        }
        assert_eq!(c.finish().text, "0123456789");
    }

    #[test]
    fn large_output_keeps_head_and_tail_with_marker() {
        let mut c = Capture::new(10);
        c.push(b"HEADxxxxxxxxxxxxxxxxxxxxxxxx");
        c.push(b"yyyyyyyyyyyyyyyyyyyyyyyyTAIL!");
        let r = c.finish();
        assert!(r.text.starts_with("HEADx"), "{}", r.text);
        assert!(r.text.ends_with("TAIL!"), "{}", r.text);
        assert_eq!(r.total_bytes, 57);
        assert_eq!(r.dropped_bytes, 47);
        assert!(r.text.contains("[... 47 bytes omitted ...]"));
    }

    #[test]
    fn memory_stays_bounded_under_a_flood() {
        let mut c = Capture::new(1000);
        let chunk = vec![b'a'; 65536];
        for _ in 0..1000 {
            c.push(&chunk);
        }
        assert!(c.head.len() + c.tail.len() <= 1000);
        assert!(c.tail.capacity() < 70_000);
        assert_eq!(c.total(), 65_536_000);
    }

    #[test]
    fn an_incomplete_stream_keeps_what_was_read_and_counts_the_rest() {
        let mut c = Capture::new(100);
        c.push(b"read so far");
        c.mark_incomplete(4096, "still open");
        let r = c.finish();
        assert_eq!(r.text, "read so far");
        assert_eq!((r.total_bytes, r.dropped_bytes), (11 + 4096, 4096));
        assert_eq!(r.incomplete.as_deref(), Some("still open"));
    }

    #[test]
    fn invalid_utf8_is_lossy_not_an_error() {
        let mut c = Capture::new(100);
        c.push(&[0xff, b'a', 0xfe]);
        assert_eq!(c.finish().text, "\u{fffd}a\u{fffd}");
    }

    #[test]
    fn truncation_respects_character_boundaries() {
        let mut c = Capture::new(8);
        c.push("ééééééééééééé".as_bytes());
        let r = c.finish();
        assert!(!r.text.contains('\u{fffd}'), "{}", r.text);
        assert!(r.text.starts_with("éé"));
        assert!(r.text.ends_with("éé"));
    }
}
