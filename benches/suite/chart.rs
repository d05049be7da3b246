//! Minimal SVG line charts for the benchmark results (throughput, peak RSS and IO efficiency against
//! concurrency), embedded by the README.
//!
//! Hand-written rather than built on a plotting crate: no extra dependency, and the output is a pure
//! function of the input (fixed size, fixed palette, coordinates rounded to one decimal), so
//! re-running a benchmark with identical figures produces a byte-identical file and a clean diff.

use std::fmt::{self, Write as _};

const W: f64 = 720.0;
const H: f64 = 420.0;
const LEFT: f64 = 64.0;
const TOP: f64 = 44.0;
const BOTTOM: f64 = 56.0;
const RIGHT: f64 = 16.0;
/// Okabe–Ito colour-blind-friendly palette (yellow last: weakest contrast on white).
const PALETTE: [&str; 8] = [
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442",
];
const MAX_LEGEND_CHARS: usize = 24;

/// One line on a chart.
pub struct Series {
    /// Legend label.
    pub name: String,
    /// (x, y) points; drawn in ascending x order (sort them yourself, don't rely on the caller).
    pub points: Vec<(f64, f64)>,
}

/// A line chart.
pub struct Chart {
    /// Title drawn above the plot.
    pub title: String,
    /// Title of the x axis.
    pub x_label: String,
    /// Title of the y axis.
    pub y_label: String,
    /// log10 x axis (concurrency spans 5..10,000).
    pub log_x: bool,
    /// Optional horizontal reference line (e.g. a target), with its label.
    pub reference: Option<(f64, String)>,
    /// The lines, each with its own colour and legend entry.
    pub series: Vec<Series>,
}

impl Chart {
    /// The chart as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        // Drop points that cannot be placed (non-finite, or x <= 0 on a log axis), then sort by x.
        let keep = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite() && (!self.log_x || x > 0.0);
        let mut lines = Vec::with_capacity(self.series.len());
        for series in &self.series {
            let mut p: Vec<(f64, f64)> = series.points.iter().copied().filter(keep).collect();
            p.sort_by(|a, b| a.0.total_cmp(&b.0));
            lines.push(p);
        }
        let all = || lines.iter().flatten().copied();
        let reference = self.reference.as_ref().filter(|r| r.0.is_finite());

        // Y axis: 0 .. a nice number covering the data and the reference line.
        let y_max = all().map(|p| p.1).chain(reference.map(|r| r.0)).fold(0.0, f64::max);
        let (y_top, y_steps) = nice_top(y_max);

        // Legend column to the right of the plot (only if there is something to list).
        let longest = self
            .series
            .iter()
            .map(|s| s.name.chars().count().min(MAX_LEGEND_CHARS))
            .max();
        let legend_w = longest.map_or(0.0, |n| (n as f64 * 7.0 + 40.0).clamp(90.0, 220.0));
        let (pl, pt, pr, pb) = (LEFT, TOP, W - RIGHT - legend_w, H - BOTTOM);

        // X axis: ticks at the data's distinct x values (log) or ~5 nice ticks (linear).
        let t = |x: f64| if self.log_x { x.log10() } else { x };
        let mut xs: Vec<f64> = all().map(|p| p.0).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        let (x_lo, x_hi, x_ticks) = if self.log_x {
            let (lo, hi) = match (xs.first(), xs.last()) {
                (Some(&a), Some(&b)) if b > a => (a.log10(), b.log10()),
                (Some(&a), _) => (a.log10() - 0.5, a.log10() + 0.5),
                _ => (0.0, 1.0),
            };
            let ticks = if xs.is_empty() { vec![1.0, 10.0] } else { xs.clone() };
            (lo, hi, ticks)
        } else {
            linear_ticks(xs.first().copied(), xs.last().copied())
        };
        let pad = 12.0;
        let px = |x: f64| N(pl + pad + (pr - pl - 2.0 * pad) * (t(x) - x_lo) / (x_hi - x_lo));
        let y_pos = |y: f64| pb - (pb - pt) * y / y_top;
        let py = |y: f64| N(y_pos(y));
        let (l, top, r, b) = (N(pl), N(pt), N(pr), N(pb));

        let mut s = format!(
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="720" height="420" viewBox="0 0 720 420" font-family="-apple-system,'Segoe UI',Helvetica,Arial,sans-serif" font-size="12" fill="#333">
<rect width="720" height="420" fill="#fff"/>
<text x="360" y="26" text-anchor="middle" font-size="16" font-weight="bold">{}</text>
"##,
            esc(&self.title)
        );
        for i in 0..=y_steps {
            let v = y_top * i as f64 / y_steps as f64;
            let (y, tx, label) = (py(v), N(pl - 6.0), compact(v));
            let _ = writeln!(
                s,
                r##"<line x1="{l}" y1="{y}" x2="{r}" y2="{y}" stroke="#e5e5e5"/><text x="{tx}" y="{y}" dy="4" text-anchor="end">{label}</text>"##
            );
        }
        let (tick_end, label_y) = (N(pb + 5.0), N(pb + 18.0));
        for &x in &x_ticks {
            let (x_pos, label) = (px(x), compact(if self.log_x { x.round() } else { x }));
            let _ = writeln!(
                s,
                r##"<line x1="{x_pos}" y1="{b}" x2="{x_pos}" y2="{tick_end}" stroke="#999"/><text x="{x_pos}" y="{label_y}" text-anchor="middle">{label}</text>"##
            );
        }
        let (xc, yc, xl, yl) = (
            N((pl + pr) / 2.0),
            N((pt + pb) / 2.0),
            esc(&self.x_label),
            esc(&self.y_label),
        );
        let _ = writeln!(
            s,
            r##"<path d="M{l} {top}V{b}H{r}" fill="none" stroke="#666"/>
<text x="{xc}" y="406" text-anchor="middle" font-size="13">{xl}</text>
<text transform="translate(16 {yc}) rotate(-90)" text-anchor="middle" font-size="13">{yl}</text>"##
        );
        if let Some((v, label)) = reference {
            let (y, ly, lx, label) = (py(*v), N(y_pos(*v) - 5.0), N(pr - 4.0), esc(label));
            let _ = writeln!(
                s,
                r##"<line x1="{l}" y1="{y}" x2="{r}" y2="{y}" stroke="#888" stroke-width="1.5" stroke-dasharray="6 4"/><text x="{lx}" y="{ly}" text-anchor="end" fill="#666" font-size="11">{label}</text>"##
            );
        }
        for (i, (series, pts)) in self.series.iter().zip(&lines).enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            if !pts.is_empty() {
                let coords: Vec<String> = pts.iter().map(|&(x, y)| format!("{},{}", px(x), py(y))).collect();
                let coords = coords.join(" ");
                let _ = writeln!(
                    s,
                    r#"<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2" stroke-linejoin="round"/>"#
                );
                for &(x, y) in pts {
                    let _ = writeln!(s, r#"<circle cx="{}" cy="{}" r="3" fill="{colour}"/>"#, px(x), py(y));
                }
            }
            let (lx, y) = (pr + 14.0, pt + 8.0 + 20.0 * i as f64);
            let (x1, x2, cx, tx, ty, y, name) = (
                N(lx),
                N(lx + 20.0),
                N(lx + 10.0),
                N(lx + 26.0),
                N(y + 4.0),
                N(y),
                esc(&truncate(&series.name)),
            );
            let _ = writeln!(
                s,
                r#"<line x1="{x1}" y1="{y}" x2="{x2}" y2="{y}" stroke="{colour}" stroke-width="2"/><circle cx="{cx}" cy="{y}" r="3" fill="{colour}"/><text x="{tx}" y="{ty}">{name}</text>"#
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

/// The y-axis top (1, 2, 2.5 or 5 × 10^k, at least `max`; 1 when there is no positive data) and
/// how many intervals to divide it into so the tick labels stay round.
fn nice_top(max: f64) -> (f64, usize) {
    if !max.is_finite() || max <= 0.0 {
        return (1.0, 5);
    }
    let k = 10f64.powf(max.log10().floor());
    [(1.0, 5), (2.0, 4), (2.5, 5), (5.0, 5), (10.0, 5)]
        .into_iter()
        .map(|(m, steps)| (m * k, steps))
        .find(|&(top, _)| top >= max * (1.0 - 1e-12))
        .unwrap_or((10.0 * k, 5))
}

/// Linear x range (in data units) and ~5 nice ticks (step 1, 2 or 5 × 10^k) covering `lo..=hi`.
fn linear_ticks(lo: Option<f64>, hi: Option<f64>) -> (f64, f64, Vec<f64>) {
    let (mut lo, mut hi) = (lo.unwrap_or(0.0), hi.unwrap_or(1.0));
    if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
        let d = (lo.abs() * 0.5).max(1.0);
        (lo, hi) = (lo - d, hi + d);
    }
    let raw = (hi - lo) / 5.0;
    let k = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * k)
        .find(|&v| v >= raw)
        .unwrap_or(10.0 * k);
    let (first, last) = ((lo / step).floor(), (hi / step).ceil());
    let ticks = (0..=20)
        .map(|i| (first + f64::from(i)) * step)
        .filter(|&v| v <= last * step + step * 1e-9);
    (first * step, last * step, ticks.collect())
}

/// A coordinate, displayed with at most one decimal place ("12", "3.5"); never "NaN", "inf" or "-0".
struct N(f64);

impl fmt::Display for N {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&trim(if self.0.is_finite() { self.0 } else { 0.0 }, 1))
    }
}

/// `v` with up to `decimals` decimal places, trailing zeros removed.
fn trim(v: f64, decimals: usize) -> String {
    let s = format!("{v:.decimals$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        &s
    };
    if s == "-0" { "0".to_string() } else { s.to_string() }
}

/// Tick label: 12000 → "12k", 1500000 → "1.5M", 0.2 → "0.2".
fn compact(v: f64) -> String {
    let a = v.abs();
    let (scaled, suffix) = match a {
        _ if !a.is_finite() => (0.0, ""),
        _ if a >= 1e9 => (v / 1e9, "G"),
        _ if a >= 1e6 => (v / 1e6, "M"),
        _ if a >= 1e3 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    format!("{}{suffix}", trim(scaled, 2))
}

/// Legend names longer than the legend column are cut with an ellipsis.
fn truncate(name: &str) -> String {
    let mut out: String = name.chars().take(MAX_LEGEND_CHARS).collect();
    if name.chars().count() > MAX_LEGEND_CHARS {
        out.pop();
        out.push('…');
    }
    out
}

/// XML-escapes text content and attribute values.
fn esc(text: &str) -> String {
    let out = text.replace('&', "&amp;").replace('<', "&lt;");
    out.replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(log_x: bool, series: Vec<Series>) -> Chart {
        Chart {
            title: "Throughput".into(),
            x_label: "concurrency".into(),
            y_label: "jobs/s".into(),
            log_x,
            reference: None,
            series,
        }
    }

    fn series(name: &str, points: &[(f64, f64)]) -> Series {
        Series {
            name: name.into(),
            points: points.to_vec(),
        }
    }

    fn assert_finite(svg: &str) {
        let lower = svg.to_lowercase();
        assert!(
            !lower.contains("nan") && !lower.contains("inf"),
            "non-finite number in:\n{svg}"
        );
    }

    #[test]
    fn escapes_text() {
        let mut c = chart(false, vec![series("a<b>&\"c\"", &[(1.0, 1.0)])]);
        c.title = "x & y < z".into();
        c.reference = Some((0.5, "\"target\" > 0".into()));
        let svg = c.to_svg();
        assert!(svg.contains("x &amp; y &lt; z"));
        assert!(svg.contains("a&lt;b&gt;&amp;&quot;c&quot;"));
        assert!(svg.contains("&quot;target&quot; &gt; 0"));
        assert!(!svg.contains("a<b>"));
    }

    #[test]
    fn degenerate_inputs_stay_finite() {
        for log_x in [false, true] {
            assert_finite(&chart(log_x, vec![]).to_svg());
            assert_finite(&chart(log_x, vec![series("empty", &[])]).to_svg());
            assert_finite(&chart(log_x, vec![series("one", &[(10.0, 5.0)])]).to_svg());
            assert_finite(&chart(log_x, vec![series("zeros", &[(0.0, 0.0), (5.0, 0.0), (10.0, 0.0)])]).to_svg());
            assert_finite(&chart(log_x, vec![series("bad", &[(f64::NAN, 1.0), (1.0, f64::INFINITY)])]).to_svg());
            let mut c = chart(log_x, vec![series("same x", &[(7.0, 0.0), (7.0, 0.0)])]);
            c.reference = Some((0.0, "zero".into()));
            assert_finite(&c.to_svg());
        }
    }

    #[test]
    fn one_polyline_per_non_empty_series() {
        let c = chart(
            true,
            vec![
                series("a", &[(10.0, 1.0), (5.0, 2.0)]),
                series("empty", &[]),
                series("b", &[(100.0, 3.0)]),
            ],
        );
        let svg = c.to_svg();
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 3 + 3, "3 markers + 3 legend swatches");
        // Drawn in ascending x although given in descending order.
        let first = svg.split("points=\"").nth(1).unwrap_or_default();
        let xs: Vec<f64> = first
            .split([' ', ','])
            .step_by(2)
            .take(2)
            .filter_map(|v| v.parse().ok())
            .collect();
        assert!(xs.len() == 2 && xs[0] < xs[1], "{xs:?}");
    }

    #[test]
    fn log_x_ticks_at_data_values() {
        let xs = [5.0, 10.0, 15.0, 50.0, 100.0, 1000.0, 10000.0];
        let pts: Vec<(f64, f64)> = xs.iter().map(|&x| (x, x * 2.0)).collect();
        let svg = chart(true, vec![series("a", &pts)]).to_svg();
        for label in ["5", "10", "15", "50", "100", "1k", "10k"] {
            assert!(
                svg.contains(&format!("text-anchor=\"middle\">{label}</text>")),
                "missing x tick {label}"
            );
        }
        assert!(svg.contains(">20k</text>"), "y top should be 20k");
    }

    #[test]
    fn nice_numbers() {
        assert_eq!(nice_top(0.0), (1.0, 5));
        assert_eq!(nice_top(0.93), (1.0, 5));
        assert_eq!(nice_top(1.2), (2.0, 4));
        assert_eq!(nice_top(2.1), (2.5, 5));
        assert_eq!(nice_top(3.0), (5.0, 5));
        assert_eq!(nice_top(1000.0), (1000.0, 5));
        assert_eq!(nice_top(12345.0), (20000.0, 4));
        assert_eq!(compact(12000.0), "12k");
        assert_eq!(compact(1_500_000.0), "1.5M");
        assert_eq!(compact(0.4), "0.4");
        assert_eq!(N(-0.01).to_string(), "0");
        assert_eq!(N(12.349).to_string(), "12.3");
        let (lo, hi, ticks) = linear_ticks(Some(0.0), Some(97.0));
        assert_eq!((lo, hi, ticks.len()), (0.0, 100.0, 6));
    }
}
