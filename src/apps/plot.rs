//! Test loss and AUC against time, one curve per run (the shape of the paper's Figure 13).

use std::path::Path;

use plotters::prelude::*;

use super::lr::EpochReport;

/// One training run to draw: its name (the consistency model) and its reports.
pub(crate) struct Curve<'a> {
    /// The legend entry.
    pub name: String,
    /// Its measurements, in time order.
    pub reports: &'a [EpochReport],
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

/// Writes an SVG with two panels, test log loss and test AUC against seconds, to `path`.
pub(crate) fn write_svg(path: &Path, curves: &[Curve<'_>]) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("{}: cannot draw the plot: {e}", path.display());
    let all = || curves.iter().flat_map(|c| c.reports.iter());
    let secs = all().map(|r| r.secs).fold(0.0f64, f64::max).max(1e-3);
    let (loss_lo, loss_hi) = all().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), r| {
        (lo.min(r.test_logloss), hi.max(r.test_logloss))
    });
    let (auc_lo, auc_hi) = all().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), r| {
        (lo.min(r.test_auc), hi.max(r.test_auc))
    });
    if !loss_lo.is_finite() {
        return Err(format!("{}: nothing to plot", path.display()));
    }
    let pad = |lo: f64, hi: f64| {
        let m = ((hi - lo) * 0.05).max(1e-3);
        (lo - m)..(hi + m)
    };
    let root = SVGBackend::new(path, (1000, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let panels = root.split_evenly((1, 2));
    let series = [
        ("test log loss", pad(loss_lo, loss_hi), true),
        ("test AUC", pad(auc_lo, auc_hi), false),
    ];
    for (area, (title, range, is_loss)) in panels.iter().zip(series) {
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..secs * 1.02, range)
            .map_err(|e| fail(&e))?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .draw()
            .map_err(|e| fail(&e))?;
        for (i, curve) in curves.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let points = curve.reports.iter().map(|r| {
                let y = if is_loss { r.test_logloss } else { r.test_auc };
                (r.secs, y)
            });
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(|e| fail(&e))?
                .label(curve.name.clone())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| fail(&e))?;
    }
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(shift: f64) -> Vec<EpochReport> {
        (1..=5)
            .map(|e| EpochReport {
                epoch: e,
                train_logloss: 0.5 / f64::from(e),
                test_logloss: 0.5 / f64::from(e) + shift,
                validation_logloss: None,
                test_auc: 0.8 + 0.02 * f64::from(e) - shift,
                nnz: 10 * e as usize,
                rows: 100,
                skipped_rows: 0,
                skipped_ahead_rows: 0,
                repeated_rows: 0,
                pulled_ahead: 0,
                train_secs: 0.1,
                epoch_secs: 0.1,
                secs: 0.1 * f64::from(e) + shift,
                bytes_sent: 0,
            })
            .collect()
    }

    #[test]
    fn the_plot_is_an_svg_with_one_line_per_run_in_each_panel() {
        let (a, b) = (run(0.0), run(0.05));
        let curves = [
            Curve {
                name: "sequential".into(),
                reports: &a,
            },
            Curve {
                name: "bounded:4".into(),
                reports: &b,
            },
        ];
        let path = std::env::temp_dir().join(format!("pserver-plot-{}.svg", std::process::id()));
        write_svg(&path, &curves).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("sequential") && svg.contains("bounded:4"));
        // Each run draws a polyline of all its points in both panels, in its own colour.
        for color in ["#1F77B4", "#D62728"] {
            let lines = svg
                .split("<polyline")
                .skip(1)
                .filter(|p| p.contains(&format!("stroke=\"{color}\"")))
                .filter(|p| {
                    let points = p.split("points=\"").nth(1).unwrap_or("");
                    let points = points.split('"').next().unwrap_or("");
                    points.split_whitespace().count() == 5
                })
                .count();
            assert_eq!(lines, 2, "colour {color}");
        }
        assert!(write_svg(&path, &[]).is_err());
    }
}
