//! The fault campaign's timeline chart, as SVG and PNG (`timeline.svg`, `timeline.png`): above,
//! records acknowledged per second (acks=all producers together, and the acks=1 baseline); below, the
//! slowest acks=all acknowledgement of each second (from the record's first send, retries included, log
//! scale); the time each fault lasted shaded in its kind's colour across both.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::{plot_err, register_font};
use shardlog_bench::faults::plan::FaultKind;

/// One acknowledgement.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Since the campaign started.
    pub at: Duration,
    /// Since the record was first sent.
    pub latency: Duration,
    pub acks_all: bool,
}

/// A fault's colour (each kind its own).
fn colour(kind: FaultKind) -> RGBColor {
    match kind {
        FaultKind::Kill => RGBColor(214, 39, 40),
        FaultKind::KillAndTear => RGBColor(140, 20, 20),
        FaultKind::Pause => RGBColor(255, 127, 14),
        FaultKind::Isolate => RGBColor(148, 103, 189),
        FaultKind::Split => RGBColor(31, 119, 180),
        FaultKind::OneWayDrop => RGBColor(23, 190, 207),
        FaultKind::Latency => RGBColor(188, 189, 34),
        FaultKind::PacketLoss => RGBColor(227, 119, 194),
        FaultKind::DiskFull => RGBColor(127, 127, 127),
    }
}

/// Writes `timeline.svg` and `timeline.png` into `out`. `faults` are (start, heal, kind) from the
/// campaign's start; `end` is when the workload stopped.
pub fn write(out: &Path, samples: &[Sample], faults: &[(Duration, Duration, FaultKind)], end: Duration) -> Result<()> {
    register_font()?;
    let svg = out.join("timeline.svg");
    draw(SVGBackend::new(&svg, (1400, 800)).into_drawing_area(), samples, faults, end)?;
    let png = out.join("timeline.png");
    draw(BitMapBackend::new(&png, (1400, 800)).into_drawing_area(), samples, faults, end)?;
    Ok(())
}

// Lines are one pixel wide: plotters draws wider ones in PNG as polygons whose joins spike far out of
// the plot at the sharp turns a timeline is full of.
fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    samples: &[Sample],
    faults: &[(Duration, Duration, FaultKind)],
    end: Duration,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(plot_err)?;
    let seconds = end.as_secs() + 1;
    // Per second: acks=all records, acks=1 records, the slowest acks=all acknowledgement in ms.
    let mut per_second: BTreeMap<u64, (u64, u64, f64)> = BTreeMap::new();
    for s in samples {
        let entry = per_second.entry(s.at.as_secs()).or_default();
        if s.acks_all {
            entry.0 += 1;
            entry.2 = entry.2.max(s.latency.as_secs_f64() * 1000.0);
        } else {
            entry.1 += 1;
        }
    }
    let at = |second: u64| second as f64 + 0.5;
    let counts = |pick: fn(&(u64, u64, f64)) -> u64| -> Vec<(f64, f64)> {
        (0..seconds).map(|s| (at(s), per_second.get(&s).map_or(0, pick) as f64)).collect()
    };
    let all = counts(|e| e.0);
    let one = counts(|e| e.1);
    let slowest: Vec<(f64, f64)> =
        per_second.iter().filter(|(_, e)| e.0 > 0).map(|(&s, e)| (at(s), e.2.max(0.1))).collect();
    let x_end = seconds as f64;

    let (upper, lower) = root.split_vertically(400);
    let top = all.iter().chain(&one).map(|&(_, y)| y).fold(10.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&upper)
        .caption("Records acknowledged per second, faults shaded", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_end, 0f64..top)
        .map_err(plot_err)?;
    chart.configure_mesh().x_desc("seconds").y_desc("records/s").draw().map_err(plot_err)?;
    shade(&mut chart, faults, top, true)?;
    chart
        .draw_series(LineSeries::new(all, BLUE.stroke_width(1)))
        .map_err(plot_err)?
        .label("acks=all (idempotent and plain)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE.stroke_width(1)));
    chart
        .draw_series(LineSeries::new(one, BLACK.mix(0.5)))
        .map_err(plot_err)?
        .label("acks=1 (baseline)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.5)));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(plot_err)?;

    let highest = slowest.iter().map(|&(_, y)| y).fold(10.0, f64::max) * 2.0;
    let mut chart = ChartBuilder::on(&lower)
        .caption(
            "Slowest acks=all acknowledgement of each second (from first send, retries included)",
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_end, (0.1f64..highest).log_scale())
        .map_err(plot_err)?;
    chart.configure_mesh().x_desc("seconds").y_desc("ms").draw().map_err(plot_err)?;
    shade(&mut chart, faults, highest, false)?;
    chart.draw_series(LineSeries::new(slowest, RED.stroke_width(1))).map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}

/// Each fault's time as a band of its kind's colour; with `legend`, one legend entry per kind.
fn shade<DB: DrawingBackend, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>,
    faults: &[(Duration, Duration, FaultKind)],
    top: f64,
    legend: bool,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let bottom = chart.y_range().start;
    let mut kinds: Vec<FaultKind> = faults.iter().map(|f| f.2).collect();
    kinds.sort();
    kinds.dedup();
    for kind in kinds {
        let bands = faults.iter().filter(|f| f.2 == kind).map(|&(start, heal, _)| {
            Rectangle::new([(start.as_secs_f64(), bottom), (heal.as_secs_f64(), top)], colour(kind).mix(0.25).filled())
        });
        let series = chart.draw_series(bands).map_err(plot_err)?;
        if legend {
            series
                .label(kind.name())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 20, y + 5)], colour(kind).mix(0.5).filled()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timeline that swings between idle and busy seconds, as a campaign's does, with every kind shaded.
    #[test]
    fn the_timeline_is_drawn_as_svg_and_png() {
        let dir = tempfile::tempdir().unwrap();
        let mut samples = Vec::new();
        let mut rng = shardlog_bench::faults::plan::Rng::new(5);
        for second in 0..1400u64 {
            let busy = if rng.between(0, 2) == 0 { 0 } else { rng.between(1, 1500) };
            let slowest = 10u64.pow(rng.between(0, 4) as u32) * 1000;
            for i in 0..busy {
                let at = Duration::from_millis(second * 1000 + i * 1000 / busy);
                let latency = Duration::from_micros(200 + rng.between(0, slowest));
                samples.push(Sample { at, latency, acks_all: i % 3 != 0 });
            }
        }
        let faults: Vec<(Duration, Duration, FaultKind)> = FaultKind::ALL
            .iter()
            .enumerate()
            .map(|(i, &kind)| (Duration::from_secs(i as u64 * 150 + 5), Duration::from_secs(i as u64 * 150 + 20), kind))
            .collect();
        write(dir.path(), &samples, &faults, Duration::from_secs(1400)).unwrap();
        let svg = std::fs::read_to_string(dir.path().join("timeline.svg")).unwrap();
        assert!(svg.contains("Records acknowledged per second") && svg.contains("disk full"));
        let png = image::open(dir.path().join("timeline.png")).unwrap().to_rgb8();
        assert_eq!((png.width(), png.height()), (1400, 800));
        // Between the panels (below the upper plot's axis, above the lower one's caption) no series
        // colour: wide lines used to spike out of their plot there.
        let strays = (362..400)
            .flat_map(|y| (80..1390).map(move |x| (x, y)))
            .filter(|&(x, y)| {
                let [r, g, b] = png.get_pixel(x, y).0;
                (b > 200 && r < 60 && g < 60) || (r > 200 && g < 60 && b < 60)
            })
            .count();
        assert_eq!(strays, 0, "series drawn outside their plots");
    }
}
