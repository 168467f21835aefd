//! The report folder of a `tps-table` run: `report.md` (the tables, as also printed), `results.csv`,
//! `hdr/*.hlog` (each row's latency histogram, HdrHistogram interval-log format) and charts as SVG and
//! PNG: `tps` (each row's TPS beside the seed's) and `latency` (percentile curves).

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use hdrhistogram::serialization::V2Serializer;
use hdrhistogram::serialization::interval_log::IntervalLogWriterBuilder;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::tps_table::{Outcome, Row, Table};

/// Where the charts find a font (plotters draws text itself; any of these will do).
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

pub fn write(out: &Path, tables: &[Table], flush: &str, brokers: usize) -> Result<()> {
    std::fs::create_dir_all(out.join("hdr")).with_context(|| format!("create {}", out.display()))?;
    let markdown = markdown(tables, flush, brokers);
    print!("{markdown}");
    std::fs::write(out.join("report.md"), &markdown)?;
    std::fs::write(out.join("results.csv"), csv(tables, flush))?;
    write_histograms(out, tables)?;
    register_font()?;
    let measured: Vec<(String, &Row, &Outcome)> = tables
        .iter()
        .flat_map(|t| t.rows.iter().enumerate().map(move |(i, (r, o))| (format!("s{}r{}", t.scenario, i + 1), r, o)))
        .filter(|(_, _, o)| o.tps().is_some())
        .collect();
    let svg = out.join("tps.svg");
    draw_tps(SVGBackend::new(&svg, (1000, 500)).into_drawing_area(), &measured)?;
    let png = out.join("tps.png");
    draw_tps(BitMapBackend::new(&png, (1000, 500)).into_drawing_area(), &measured)?;
    let svg = out.join("latency.svg");
    draw_latency(SVGBackend::new(&svg, (1000, 500)).into_drawing_area(), &measured)?;
    let png = out.join("latency.png");
    draw_latency(BitMapBackend::new(&png, (1000, 500)).into_drawing_area(), &measured)?;
    Ok(())
}

fn acks(a: i16) -> &'static str {
    match a {
        0 => "0",
        1 => "1",
        _ => "-1",
    }
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// The seed's columns for a scenario, and a row's values in them.
fn seed_columns(scenario: u8, r: &Row) -> (Vec<&'static str>, Vec<String>) {
    let min = r.min_insync.map_or("N/A".to_string(), |m| m.to_string());
    match scenario {
        1 => (
            vec!["acks", "replicas", "min.insync.replicas", "retries"],
            vec![acks(r.acks).into(), r.replicas.to_string(), min, "0".into()],
        ),
        2 => (vec!["replicas", "min.insync.replicas"], vec![r.replicas.to_string(), min]),
        3 => (vec!["replicas", "acks"], vec![r.replicas.to_string(), acks(r.acks).into()]),
        _ => (vec!["partitions"], vec![r.partitions.to_string()]),
    }
}

fn markdown(tables: &[Table], flush: &str, brokers: usize) -> String {
    let mut out = format!(
        "# tps-table\n\nOne producer, 1 KiB messages, sync sends (one message per request, one request in flight per \
         partition). Cluster: {brokers} broker(s); {flush}. Seed: Kafka 0.10.1 on 4 brokers of 24 cores, no fsync.\n"
    );
    for t in tables {
        let _ = write!(out, "\n## {}\n\n", t.title);
        let Some((first, _)) = t.rows.first() else {
            out.push_str("Not run: needs a replicated cluster.\n");
            continue;
        };
        let (columns, _) = seed_columns(t.scenario, first);
        let extra = ["Kafka TPS (seed)", "shardlog TPS", "ratio", "p50 ms", "p99 ms", "p99.9 ms"];
        let header: Vec<&str> = columns.iter().copied().chain(extra).collect();
        let _ = writeln!(out, "| {} |", header.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(header.len()));
        for (r, outcome) in &t.rows {
            let (_, mut cells) = seed_columns(t.scenario, r);
            cells.push(r.seed_tps.map_or("n/a".into(), |s| format!("{s:.1}")));
            match outcome {
                Outcome::Measured { tally, .. } => {
                    let tps = outcome.tps().unwrap_or(0.0);
                    cells.push(format!("{tps:.1}"));
                    cells.push(r.seed_tps.map_or("-".into(), |s| format!("{:.2}x", tps / s)));
                    if r.acks == 0 || tally.latency_us.is_empty() {
                        cells.extend(["-".into(), "-".into(), "-".into()]);
                    } else {
                        let h = &tally.latency_us;
                        cells.extend([
                            ms(h.value_at_quantile(0.5)),
                            ms(h.value_at_quantile(0.99)),
                            ms(h.value_at_quantile(0.999)),
                        ]);
                    }
                }
                Outcome::Needs { brokers } => {
                    cells.push(format!("needs {brokers} brokers"));
                    cells.extend(["-".into(), "-".into(), "-".into(), "-".into()]);
                }
                Outcome::Failed(reason) => {
                    cells.push(format!("failed: {}", reason.replace('|', "/")));
                    cells.extend(["-".into(), "-".into(), "-".into(), "-".into()]);
                }
            }
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
    }
    out
}

fn csv(tables: &[Table], flush: &str) -> String {
    let mut out = String::from(
        "scenario,partitions,replicas,min_insync_replicas,acks,seed_tps,tps,ratio,p50_ms,p99_ms,p999_ms,max_ms,errors,status,flush\n",
    );
    for t in tables {
        for (r, outcome) in &t.rows {
            let min = r.min_insync.map_or(String::new(), |m| m.to_string());
            let seed = r.seed_tps.map_or(String::new(), |s| format!("{s:.1}"));
            let (tps, ratio, lat, errors, status) = match outcome {
                Outcome::Measured { tally, .. } => {
                    let tps = outcome.tps().unwrap_or(0.0);
                    let ratio = r.seed_tps.map_or(String::new(), |s| format!("{:.3}", tps / s));
                    let h = &tally.latency_us;
                    let lat = if h.is_empty() {
                        ",,,".to_string()
                    } else {
                        format!(
                            "{},{},{},{}",
                            ms(h.value_at_quantile(0.5)),
                            ms(h.value_at_quantile(0.99)),
                            ms(h.value_at_quantile(0.999)),
                            ms(h.max())
                        )
                    };
                    (
                        format!("{tps:.1}"),
                        ratio,
                        lat,
                        tally.errors.values().sum::<u64>().to_string(),
                        "measured".to_string(),
                    )
                }
                Outcome::Needs { brokers } => {
                    (String::new(), String::new(), ",,,".into(), String::new(), format!("needs {brokers} brokers"))
                }
                Outcome::Failed(_) => (String::new(), String::new(), ",,,".into(), String::new(), "failed".into()),
            };
            let _ = writeln!(
                out,
                "{},{},{},{min},{},{seed},{tps},{ratio},{lat},{errors},{status},{}",
                t.scenario,
                r.partitions,
                r.replicas,
                r.acks,
                if flush.contains("interval") { "interval" } else { "always" }
            );
        }
    }
    out
}

fn write_histograms(out: &Path, tables: &[Table]) -> Result<()> {
    for t in tables {
        for (i, (_, outcome)) in t.rows.iter().enumerate() {
            let Outcome::Measured { tally, elapsed } = outcome else { continue };
            if tally.latency_us.is_empty() {
                continue;
            }
            let mut file = std::fs::File::create(out.join("hdr").join(format!("s{}r{}.hlog", t.scenario, i + 1)))?;
            let mut serializer = V2Serializer::new();
            let mut log = IntervalLogWriterBuilder::new()
                .add_comment("send-to-acknowledgement latency in microseconds")
                .with_base_time(UNIX_EPOCH)
                .begin_log_with(&mut file, &mut serializer)?;
            log.write_histogram(&tally.latency_us, Duration::ZERO, *elapsed, None)
                .map_err(|e| anyhow!("write histogram log: {e:?}"))?;
        }
    }
    Ok(())
}

fn register_font() -> Result<()> {
    let Some(bytes) = FONT_PATHS.iter().find_map(|p| std::fs::read(p).ok()) else {
        bail!("no font for the charts: install fonts-dejavu-core (looked in {FONT_PATHS:?})");
    };
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow!("the font does not load"))?;
    Ok(())
}

fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("draw chart: {e:?}")
}

/// Each measured row's TPS beside the seed's.
fn draw_tps<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, rows: &[(String, &Row, &Outcome)]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(plot_err)?;
    let top = rows.iter().map(|(_, r, o)| o.tps().unwrap_or(0.0).max(r.seed_tps.unwrap_or(0.0))).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption("TPS per row: seed's Kafka (grey) and shardlog (blue)", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..rows.len().max(1) as f64, 0f64..top * 1.1)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_desc("rows: sNrM = scenario N, row M of its table")
        .y_desc("messages/s")
        .draw()
        .map_err(plot_err)?;
    for (i, (label, r, o)) in rows.iter().enumerate() {
        let x = i as f64;
        let height = o.tps().unwrap_or(0.0).max(r.seed_tps.unwrap_or(0.0));
        chart
            .draw_series([Text::new(label.clone(), (x + 0.3, height + top * 0.06), ("sans-serif", 14))])
            .map_err(plot_err)?;
        if let Some(seed) = r.seed_tps {
            chart
                .draw_series([Rectangle::new([(x + 0.1, 0.0), (x + 0.45, seed)], RGBColor(160, 160, 160).filled())])
                .map_err(plot_err)?;
        }
        let ours = o.tps().unwrap_or(0.0);
        chart.draw_series([Rectangle::new([(x + 0.5, 0.0), (x + 0.85, ours)], BLUE.filled())]).map_err(plot_err)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

/// Latency against percentile ("nines": 1 = p90, 2 = p99, 3 = p99.9 ...) for each acknowledged row.
fn draw_latency<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, rows: &[(String, &Row, &Outcome)]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(plot_err)?;
    let quantiles = [0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999];
    let curves: Vec<(String, Vec<(f64, f64)>)> = rows
        .iter()
        .filter_map(|(label, _, o)| match o {
            Outcome::Measured { tally, .. } if !tally.latency_us.is_empty() => Some((
                label.clone(),
                quantiles
                    .iter()
                    .map(|q| (-(1.0 - q as &f64).log10(), tally.latency_us.value_at_quantile(*q) as f64 / 1000.0))
                    .collect(),
            )),
            _ => None,
        })
        .collect();
    let top = curves.iter().flat_map(|(_, c)| c.iter().map(|(_, y)| *y)).fold(0.1, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption("Send-to-acknowledgement latency by percentile", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.3f64..4.0, 0f64..top * 1.1)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .x_label_formatter(&|x| {
            let p = format!("{:.2}", 100.0 - 100.0 * 10f64.powf(-x));
            format!("p{}", p.trim_end_matches('0').trim_end_matches('.'))
        })
        .y_desc("ms")
        .draw()
        .map_err(plot_err)?;
    for (i, (label, points)) in curves.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
            .map_err(plot_err)?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    if !curves.is_empty() {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(plot_err)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}
