//! Colour for people at a terminal: problems in red, "No problem found." in green, notes in
//! yellow, the step headings in bold. Only on a terminal (or when asked), never when `NO_COLOR`
//! is set (no-color.org), and never in `-o json`: scripts and files get the plain text.

use std::io::IsTerminal as _;

use clap::ValueEnum;

/// `--color`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum When {
    /// On a terminal, unless `NO_COLOR` is set.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

impl When {
    /// Whether to paint standard output.
    pub fn paints(self) -> bool {
        match self {
            When::Always => true,
            When::Never => false,
            When::Auto => {
                std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                    && std::io::stdout().is_terminal()
            }
        }
    }
}

const RED: &str = "\x1b[31m";
const GREEN: &str = "\x1b[32m";
const YELLOW: &str = "\x1b[33m";
const BOLD: &str = "\x1b[1m";
const RESET: &str = "\x1b[0m";

/// The text report with ANSI colours, line by line; the words stay the same.
pub fn paint(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 64);
    let mut in_problems = false;
    for line in text.split_inclusive('\n') {
        let (body, end) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line, ""),
        };
        let style = if body == "Problems:" {
            in_problems = true;
            Some(BOLD.to_string() + RED)
        } else if in_problems && body.starts_with("  - ") {
            Some(RED.to_string())
        } else if body == "No problem found." {
            Some(GREEN.to_string())
        } else if body.starts_with("Note:") {
            in_problems = false;
            Some(YELLOW.to_string())
        } else if heading(body) {
            in_problems = false;
            None
        } else {
            None
        };
        match style {
            Some(style) => out.push_str(&format!("{style}{body}{RESET}{end}")),
            None if heading(body) => {
                // Bold up to the colon: "1. Pool:", "Service ns/name".
                let cut = body.find(':').map_or(body.len(), |i| i + 1);
                out.push_str(&format!(
                    "{BOLD}{}{RESET}{}{end}",
                    &body[..cut],
                    &body[cut..]
                ));
            }
            None => out.push_str(line),
        }
    }
    out
}

/// A step heading ("1. Pool: ...") or the first line ("Service ns/name", "Pools:").
fn heading(line: &str) -> bool {
    let b = line.as_bytes();
    (b.len() > 2 && b[0].is_ascii_digit() && b[1] == b'.' && b[2] == b' ')
        || line.starts_with("Service ")
        || line == "Pools:"
        || line == "Speakers:"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_are_red_and_the_words_do_not_change() {
        let text = "Service web/web\n1. Pool:         default, because x\n   Sharing key:  k\nProblems:\n  - Service web/web: bad (unknown-pool). Fix it.\nNote: ping\n";
        let painted = paint(text);
        assert!(painted.contains("\x1b[31m  - Service web/web: bad"));
        assert!(painted.contains("\x1b[1m1. Pool:\x1b[0m         default"));
        assert!(painted.contains("\x1b[33mNote: ping\x1b[0m\n"));
        // Without the escapes, the same text.
        let plain: String = painted
            .split('\x1b')
            .enumerate()
            .map(|(i, part)| {
                if i == 0 {
                    part
                } else {
                    part.split_once('m').map_or(part, |(_, rest)| rest)
                }
            })
            .collect();
        assert_eq!(plain, text);
    }

    #[test]
    fn healthy_is_green_and_never_paints_plain() {
        assert_eq!(
            paint("No problem found.\n"),
            "\x1b[32mNo problem found.\x1b[0m\n"
        );
        assert!(!When::Never.paints());
        assert!(When::Always.paints());
    }
}
