//! An SVG chart of the report: per case, p50 as a bar and p99 as a whisker on a log scale,
//! with the case's physical floor marked, so the shape is visible at a glance.

use std::fmt::Write;

use crate::report::{CaseReport, Report};
use crate::text::ms;

const LABEL_W: f64 = 230.0;
const PLOT_W: f64 = 560.0;
const ROW_H: f64 = 20.0;
const TOP: f64 = 58.0;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The decades the axis spans.
fn decades(rows: &[&CaseReport]) -> (i32, i32) {
    let values = rows.iter().flat_map(|c| {
        [
            c.p50_ms.median,
            c.p99_ms.median,
            c.floor_ms.unwrap_or(f64::NAN),
        ]
    });
    let (lo, hi) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return (-2, 2);
    }
    let lo = lo.log10().floor() as i32;
    let hi = (hi.log10().ceil() as i32).max(lo + 1);
    (lo, hi)
}

pub fn render(r: &Report) -> String {
    let rows: Vec<&CaseReport> = r.floors.iter().chain(&r.cases).collect();
    let (lo, hi) = decades(&rows);
    let x = |v: f64| {
        let v = v.max(10f64.powi(lo));
        LABEL_W + (v.log10() - f64::from(lo)) / f64::from(hi - lo) * PLOT_W
    };
    let height = TOP + ROW_H * rows.len() as f64 + 40.0;
    let width = LABEL_W + PLOT_W + 110.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">
<rect width="100%" height="100%" fill="white"/>
<text x="10" y="18" font-size="14" font-weight="bold">Cycles bench — {} — durability {} — {} trial(s), medians</text>
<text x="10" y="36" fill="#555">p50 bar, p99 whisker, red tick = the case's physical floor (HTTP health{}), log scale (ms)</text>"##,
        escape(&r.target.url),
        escape(&r.target.durability),
        r.method.trials,
        if r.target.durability == "strict" {
            " + fdatasync per write"
        } else {
            ""
        },
    );
    for d in lo..=hi {
        let gx = x(10f64.powi(d));
        let _ = writeln!(
            s,
            r##"<line x1="{gx:.1}" y1="{}" x2="{gx:.1}" y2="{}" stroke="#ddd"/><text x="{gx:.1}" y="{}" text-anchor="middle" fill="#555">{}</text>"##,
            TOP - 6.0,
            height - 30.0,
            height - 16.0,
            ms(10f64.powi(d))
        );
    }
    for (i, c) in rows.iter().enumerate() {
        let y = TOP + ROW_H * i as f64;
        let (p50, p99) = (c.p50_ms.median, c.p99_ms.median);
        let fill = if c.meta.class == crate::report::Class::Floor {
            "#999"
        } else {
            "#4a7fc1"
        };
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LABEL_W - 8.0,
            y + 13.0,
            escape(&c.meta.name)
        );
        if !p50.is_finite() {
            continue;
        }
        let _ = writeln!(
            s,
            r##"<rect x="{LABEL_W}" y="{:.1}" width="{:.1}" height="12" fill="{fill}"/>"##,
            y + 3.0,
            (x(p50) - LABEL_W).max(1.0)
        );
        if p99.is_finite() && p99 > p50 {
            let _ = writeln!(
                s,
                r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333"/><line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333"/>"##,
                x(p50),
                y + 9.0,
                x(p99),
                y + 9.0,
                x(p99),
                y + 5.0,
                x(p99),
                y + 13.0
            );
        }
        if let Some(floor) = c.floor_ms {
            let _ = writeln!(
                s,
                r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#d22" stroke-width="2"/>"##,
                x(floor),
                y + 1.0,
                x(floor),
                y + 17.0
            );
        }
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}">{} ms</text>"##,
            x(p99.max(p50)) + 6.0,
            y + 13.0,
            ms(p50)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_has_a_row_per_case_and_floor() {
        let r = crate::report::tests::report("strict", 1.0);
        let svg = render(&r);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(
            svg.matches("<rect x=").count(),
            r.floors.len() + r.cases.len()
        );
        assert!(svg.contains("Lifecycles 32 clients"));
        assert!(svg.contains("stroke=\"#d22\""));
        assert_eq!(escape("a<b&c>"), "a&lt;b&amp;c&gt;");
    }
}
