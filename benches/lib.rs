//! Shared pieces of the wasmjobs benchmarks: the result table and where it
//! is written (`benches/results/<name>.md`).

use std::fmt::Write as _;
use std::path::PathBuf;

/// A benchmark report: rows of label → figure, printed and saved.
pub struct Report {
    name: String,
    title: String,
    rows: Vec<(String, String, String)>,
    notes: Vec<String>,
}

impl Report {
    /// A report saved as `benches/results/<name>.md`.
    pub fn new(name: &str, title: &str) -> Self {
        Self {
            name: name.to_owned(),
            title: title.to_owned(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Adds a row: what was measured, the figure, and the target (or "").
    pub fn row(&mut self, what: &str, figure: String, target: &str) {
        self.rows.push((what.to_owned(), figure, target.to_owned()));
    }

    /// Adds a line under the table.
    pub fn note(&mut self, note: String) {
        self.notes.push(note);
    }

    /// Prints the table and writes it to `benches/results/<name>.md`.
    pub fn finish(self) -> anyhow::Result<PathBuf> {
        let mut md = String::new();
        writeln!(md, "# {}\n", self.title)?;
        writeln!(
            md,
            "Measured {} on `{}` ({}, {} cores), wasmjobs {}.\n",
            date(),
            hostname(),
            cpu_model(),
            cores(),
            env!("CARGO_PKG_VERSION")
        )?;
        let width = self.rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(8);
        let fig = self.rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max(6);
        writeln!(md, "| {:width$} | {:>fig$} | target |", "measure", "figure")?;
        writeln!(md, "|{}|{}|---|", "-".repeat(width + 2), "-".repeat(fig + 2))?;
        for (what, figure, target) in &self.rows {
            writeln!(md, "| {what:width$} | {figure:>fig$} | {target} |")?;
        }
        if !self.notes.is_empty() {
            writeln!(md)?;
            for note in &self.notes {
                writeln!(md, "- {note}")?;
            }
        }
        print!("\n{md}");
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{}.md", self.name));
        std::fs::write(&path, md)?;
        println!("\nwritten to {}", path.display());
        Ok(path)
    }
}

fn date() -> String {
    command("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(|| "unknown date".into())
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

fn command(program: &str, args: &[&str]) -> Option<String> {
    let output = std::process::Command::new(program).args(args).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
